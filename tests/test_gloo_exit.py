"""How a process that joined a gloo group ends: through code/engine_stop.py's ``end_process``,
not the interpreter's teardown, which can abort a finished rank under load (its docstring says
why; found as a SIGABRT in tests/test_profiling.py's 2-rank fixture, 3 of 74 runs beside a CI run).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOINS = re.compile(r"\binit_process_group\(")
ENDS = re.compile(r"\bend_process\(")


def _joins_without_ending(paths: list[Path]) -> list[str]:
    texts = {p: p.read_text() for p in paths}
    return [str(p) for p, text in texts.items() if JOINS.search(text) and not ENDS.search(text)]


def _programs() -> list[Path]:
    """Every Python file of the project that may start a gloo group: code/, tests/ (scripts
    written from a test's strings included), benchmarks/; not the log fixtures."""
    out = list((REPO / "code").rglob("*.py")) + list((REPO / "benchmarks").rglob("*.py"))
    out += [p for p in (REPO / "tests").rglob("*.py") if "fixtures" not in p.parts]
    return [p for p in out if p.name != "test_gloo_exit.py"]


def test_every_program_that_joins_a_gloo_group_ends_through_end_process():
    assert _programs(), "no program found: the scan looks in the wrong place"
    assert _joins_without_ending(_programs()) == [], (
        "these join a process group but end through the interpreter's teardown, which can abort "
        "a finished rank: end them with code/engine_stop.py's end_process, whose docstring says why")


def test_the_scan_finds_a_program_that_does_not_end_through_end_process(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('import torch.distributed as dist\ndist.init_process_group("gloo")\n'
                   'dist.destroy_process_group()\n')
    good = tmp_path / "good.py"
    good.write_text(bad.read_text() + "end_process(0)\n")
    assert _joins_without_ending([bad, good]) == [str(bad)]


def _end(code: int) -> subprocess.CompletedProcess:
    script = (f"import atexit, sys; sys.path.insert(0, {str(REPO / 'code')!r})\n"
              "from engine_stop import end_process\n"
              "atexit.register(lambda: print('teardown ran', flush=True))\n"
              "print('done', flush=True)\n"
              f"end_process({code})\n")
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)


def test_a_finished_rank_ends_without_the_interpreters_teardown_and_keeps_its_output():
    r = _end(0)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "done\n"            # flushed, and no teardown (the atexit hook never ran)


def test_a_failing_rank_exits_normally_with_its_code():
    r = _end(1)
    assert r.returncode == 1, r.stderr
    assert r.stdout == "done\nteardown ran\n"
