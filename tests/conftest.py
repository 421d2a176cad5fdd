"""Shared fixtures. Slow tiers are marked (engine, slurm, notebooks) and always run in CI."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_addoption(parser):
    parser.addoption("--shuffle", type=int, metavar="SEED", default=None,
                     help="run the collected tests in an order shuffled with SEED (order "
                          "dependence shows up as a failure; benchmarks/repeat_tests.py uses it)")


# The tiers `make test` runs after the others (Makefile, SLOW_TIERS), in two processes side by
# side, each one test after another: the machine's (MACHINE_TIERS there) and the engine tier's
# other trainings. The others run in parallel pytest-xdist workers, so a test there must not take
# a machine-wide fixture.
SLOW_TIERS = ("slurm", "engine", "notebooks", "browser", "users", "gpu")
MACHINE_WIDE = {"slurm_cluster", "cpu_oom_run"}


def pytest_collection_modifyitems(config, items):
    loose = [i.nodeid for i in items if MACHINE_WIDE & set(getattr(i, "fixturenames", ()))
             and not any(i.get_closest_marker(t) for t in SLOW_TIERS)]
    if loose:
        raise pytest.UsageError(f"{loose} use {sorted(MACHINE_WIDE)} without a marker of "
                                f"{SLOW_TIERS}: mark them (tests/conftest.py)")
    seed = config.getoption("--shuffle")
    if seed is not None:
        import random

        random.Random(seed).shuffle(items)


def pytest_report_header(config):
    seed = config.getoption("--shuffle")
    return None if seed is None else f"test order shuffled with seed {seed} (--shuffle {seed})"


@pytest.fixture
def run_root(tmp_path, monkeypatch) -> Path:
    """A private run root (LABKIT_RUN_ROOT) so tests never touch the repo's runs/."""
    root = tmp_path / "runs"
    root.mkdir()
    monkeypatch.setenv("LABKIT_RUN_ROOT", str(root))
    return root


def skip_or_fail(reason: str) -> None:
    """Skip outside CI; in CI a missing prerequisite is a failure, never a silent skip."""
    if IN_CI:
        pytest.fail(f"CI must run this test, but: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def python() -> str:
    return sys.executable


@pytest.fixture(scope="session")
def slurm_cluster():
    """The real Slurm mini-cluster (`labkit cluster up`: 2 nodes x 2 CPUs), started once per
    session and stopped at the end if this session started it; yields its ClusterProfile."""
    if os.geteuid() != 0:
        skip_or_fail("the Slurm mini-cluster needs root (labkit cluster up); use backend='local'")
    from labkit import minicluster

    was_up = minicluster.is_up()
    try:
        cluster = minicluster.cluster_up()
    except Exception as e:  # noqa: BLE001 - any start-up failure is reported the same way
        skip_or_fail(f"labkit cluster up failed: {e}")
    yield cluster
    if not was_up:
        minicluster.cluster_down()


@pytest.fixture(scope="session")
def cpu_oom_run(tmp_path_factory) -> Path:
    """One real out-of-memory on CPU, trained once per session: TP=2, micro batch 256 of 128
    tokens under ``memory_limit_gb=0.2``. The engine's OOM line (test_engine.py) and the parser's
    diagnosis of it (test_logs_engine.py) are both tested on this run."""
    from engine_runs import train

    return train(tmp_path_factory.mktemp("cpu_oom"), "oom", check=False,
                 tensor_model_parallel_size=2, micro_batch_size=256, global_batch_size=256,
                 seq_length=128, max_position_embeddings=128, memory_limit_gb=0.2, train_iters=4)


@pytest.fixture(autouse=True)
def _cpu_timeout(request):
    """``@pytest.mark.cpu_timeout(S)``: the test fails once it has used S CPU seconds of its own
    process (a catastrophic-backtracking regex, a parser loop that never ends). CPU time, not the
    wall clock: other processes loading the machine cannot make the test fail."""
    import signal

    mark = request.node.get_closest_marker("cpu_timeout")
    if mark is None:
        yield
        return
    seconds = float(mark.args[0])

    def over(signum, frame):
        pytest.fail(f"{request.node.nodeid} used more than {seconds:.0f} CPU seconds")

    old = signal.signal(signal.SIGPROF, over)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)


GOLDEN_DIR = REPO / "tests" / "golden"
REGEN_GOLDEN = os.environ.get("LABKIT_REGEN_GOLDEN") == "1"


@pytest.fixture
def assert_golden():
    """``assert_golden(name, text)``: ``text`` must equal ``tests/golden/<name>``.

    A missing golden file is a failure (never silently written); accept an intended change with
    ``LABKIT_REGEN_GOLDEN=1 .venv/bin/python -m pytest TEST_FILE``, then review and commit it.
    """
    import difflib

    def check(name: str, text: str) -> None:
        path = GOLDEN_DIR / name
        if REGEN_GOLDEN:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return
        if not path.exists():
            pytest.fail(f"golden file tests/golden/{name} is missing. Write it with "
                        f"LABKIT_REGEN_GOLDEN=1 .venv/bin/python -m pytest <this test>, review "
                        f"it and commit it.")
        expected = path.read_text()
        if text != expected:
            diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True),
                                                f"golden/{name}", "now"))
            pytest.fail(f"output differs from tests/golden/{name}:\n{diff}\nIf intended: "
                        f"LABKIT_REGEN_GOLDEN=1 .venv/bin/python -m pytest <this test>")

    return check
