"""benchmarks/repeat_tests.py (make test-repeat) and --shuffle: a test that fails in any run is
named with the seeds of the runs it failed in, and a shuffled order really changes the order."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "repeat_tests.py"


def _repeat(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "out"), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=600)


def test_a_test_that_fails_once_is_named_with_its_seed(tmp_path):
    # Fails only when it runs before its neighbour: order dependence, as a shuffle finds it.
    probe = REPO / "tests" / "fixtures" / "repeat" / "order_probe.py"
    p = _repeat(tmp_path, "--runs", "6", "--", str(probe))
    assert p.returncode == 1, p.stdout + p.stderr
    assert "6 shuffled runs" in p.stdout and "1 test(s) failed at least once" in p.stdout
    named = [ln for ln in p.stdout.splitlines() if "test_b" in ln and "failed in" in ln]
    assert len(named) == 1 and "rerun: --shuffle SEED" in named[0], p.stdout


def test_passing_runs_exit_0(tmp_path):
    p = _repeat(tmp_path, "--runs", "2", "--", str(REPO / "tests" / "test_stub_commands.py"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "0 test(s) failed at least once" in p.stdout
    assert sorted(q.name for q in (tmp_path / "out").iterdir()) == ["run-1.xml", "run-2.xml"]


def test_bad_arguments_are_refused(tmp_path):
    p = _repeat(tmp_path, "--runs", "0")
    assert p.returncode == 2 and "--runs must be >= 1" in p.stderr


def test_cpu_timeout_counts_cpu_seconds_not_the_wall_clock():
    probe = REPO / "tests" / "fixtures" / "repeat" / "cpu_probe.py"
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(probe)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert "1 failed, 1 passed" in p.stdout, p.stdout
    assert "test_spins used more than 1 CPU seconds" in p.stdout, p.stdout
