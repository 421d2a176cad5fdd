"""Hang watchdog: a real torchrun job made to hang (tests/programs/hang_job.py), on the local
backend and on the mini-cluster, plus the log/stack readers on output captured from such runs.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from labkit import backends
from labkit.backends.job import WATCHERS, JobState
from labkit.config import RunConfig
from labkit.logs import detect_hang
from labkit.watchdog import (
    HANG_HINT,
    HangError,
    HangWatchdog,
    _LogFollower,
    disable,
    enable,
    parse_stack,
    py_spy,
)

REPO = Path(__file__).resolve().parents[1]
HANG_JOB = REPO / "tests" / "programs" / "hang_job.py"
FIX = REPO / "tests" / "fixtures"


def test_stack_reader_on_captured_py_spy_dumps():
    # py-spy 0.4.3 dumps of hang_job.py: rank 0 waits in all_reduce, rank 1 sleeps.
    top, waiting = parse_stack((FIX / "stacks" / "py-spy-0.4.3_rank0_in_allreduce.txt").read_text())
    assert waiting and top.startswith("all_reduce (torch/distributed/distributed_c10d.py")
    top, waiting = parse_stack((FIX / "stacks" / "py-spy-0.4.3_rank1_sleeping.txt").read_text())
    assert not waiting and top == "stuck_rank_sleeps (hang_job.py:26)"
    assert parse_stack("") == ("", False)


def test_log_follower_names_each_ranks_last_line():
    # Captured from a real hang_job.py run on the local backend (2 ranks, rank 1 hangs at 3).
    log = FIX / "logs" / "labkit_hang_job_2026.txt"
    f = _LogFollower()
    f.poll(log, now=100.0)
    ranks = {r["rank"]: r for r in f.ranks(now=110.0)}
    assert ranks[1]["last_line"] == "step 3: sleeping instead of joining the all-reduce"
    assert ranks[0]["last_line"] == "step 2 done"
    assert ranks[1]["seen_s_ago"] == 10.0
    # The log parser's hang test agrees: last iteration 2, quiet long after its timestamp.
    hang = detect_hang(log, timeout_s=60, now=time.time() + 3600)
    assert hang is not None and hang.kind == "hang" and "after iteration 2" in hang.message


def _submit(name: str, **extra) -> backends.Job:
    cfg = RunConfig(name=name, nodes=1, gpus_per_node=2, extra=extra)
    return backends.submit(cfg, backend="local", program=HANG_JOB)


@pytest.mark.engine
def test_real_hang_is_diagnosed_with_stacks_and_cancelled(run_root, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    job = _submit("hang", hang_at=3, hang_rank=1, pg_timeout=300)
    wd = HangWatchdog(timeout_s=6, startup_timeout_s=120, cancel=True)
    try:
        with pytest.raises(HangError) as e:
            job.wait(timeout=240, progress=False, on_poll=wd)
    finally:
        if not job.state().finished:
            job.cancel()
    rep = e.value.report
    assert rep.last_iteration == 2 and rep.quiet_s > 6
    last = {r["rank"]: r["last_line"] for r in rep.ranks}
    assert last[1].startswith("step 3: sleeping")
    assert "kind" not in rep.to_dict() and rep.to_failure().kind == "hang"
    for cause in ("SOCKET_IFNAME", "MASTER_ADDR", "died", "mismatched"):
        assert cause in rep.hint
    if py_spy() is None:
        pytest.fail("py-spy (a pinned dev dependency) is not installed: run make setup")
    by_rank = {s.rank: s for s in rep.stacks}
    assert set(by_rank) == {0, 1}
    assert by_rank[0].in_collective and "all_reduce" in by_rank[0].top
    assert not by_rank[1].in_collective and "stuck_rank_sleeps" in by_rank[1].top
    assert rep.suspects == [1]
    assert rep.to_failure().rank == 1
    assert "Suspect rank(s) [1]" in str(e.value)
    saved = list(job.run_dir.glob("hang-*.txt"))
    assert len(saved) == 1 and "stuck_rank_sleeps" in saved[0].read_text()
    assert job.wait(timeout=60, progress=False) is JobState.CANCELLED


@pytest.mark.engine
def test_job_that_keeps_printing_is_not_a_hang(run_root, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    job = _submit("nohang", iters=3, step_s=0.5)
    watcher = enable(hang_timeout_s=30, startup_timeout_s=120)  # the registered-watcher path
    try:
        assert watcher in WATCHERS
        assert job.wait(timeout=240, progress=False) is JobState.COMPLETED
    finally:
        disable(watcher)
    assert watcher not in WATCHERS
    assert not list(job.run_dir.glob("hang-*"))


@pytest.mark.slurm
def test_real_hang_on_minicluster(slurm_cluster, run_root, monkeypatch):
    """The same stuck rank, two nodes of the Slurm mini-cluster, one rank per node."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cfg = RunConfig(name="hang-slurm", nodes=2, gpus_per_node=1, backend="slurm",
                    extra={"hang_at": 2, "hang_rank": 1, "pg_timeout": 300})
    job = backends.submit(cfg, backend="slurm", program=HANG_JOB,
                          profile=slurm_cluster)
    try:
        with pytest.raises(HangError) as e:
            job.wait(timeout=300, progress=False,
                     on_poll=HangWatchdog(timeout_s=8, startup_timeout_s=180, cancel=True))
    finally:
        if not job.state().finished:
            job.cancel()
    rep = e.value.report
    assert rep.last_iteration == 1
    assert {s.rank for s in rep.stacks} == {0, 1}
    assert rep.suspects == [1]
    assert HANG_HINT == rep.hint
