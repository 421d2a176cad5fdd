"""Hang watchdog: a real torchrun job made to hang (tests/programs/hang_job.py), on the local
backend and on the mini-cluster, plus the log/stack readers on output captured from such runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labkit import jobs
from labkit.backends.job import Job
from labkit.config import RunConfig
from labkit.errors import ConfigError
from labkit.logs import detect_hang
from labkit.run import JobState
from labkit.watchdog import HANG_HINT, HangError, HangWatchdog, _LogFollower, parse_stack, py_spy

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


class _SeenJob:
    """What the watchdog reads of a job (it takes any object with these)."""

    def __init__(self, run_dir: Path):
        self.job_id, self.name, self.backend, self.info = "local-0", "seen", "local", {}
        self.run_dir, self.log_path = run_dir, run_dir / "log.txt"

    def state(self) -> str:
        return "RUNNING"


def test_quiet_time_counts_from_when_watching_began(tmp_path):
    """A log that ends with an earlier attempt's iteration (a resumed run) is not a hang when
    watching starts; the same log quiet for longer than the timeout since then is one."""
    job = _SeenJob(tmp_path)
    shutil.copy(FIX / "logs" / "labkit_hang_job_2026.txt", job.log_path)
    wd = HangWatchdog(timeout_s=5, stacks=False, cancel=False, save=False)
    wd(job, JobState.RUNNING)  # the last iteration line may be days old: not blamed
    wd(job, JobState.PENDING)
    now = time.time()
    wd.since = now - 100  # as if this wait began 100 s ago, and the log last grew 50 s ago
    os.utime(job.log_path, (now - 50, now - 50))
    with pytest.raises(HangError) as e:
        wd(job, JobState.RUNNING)
    assert e.value.report.quiet_s >= 50 and e.value.report.last_iteration == 2
    assert e.value.state == "RUNNING" and wd.report is e.value.report


def test_watchdog_imports_nothing_from_backends():
    code = "import sys, labkit.watchdog; print(sorted(m for m in sys.modules if 'backends' in m))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0 and r.stdout.strip() == "[]", (r.stdout, r.stderr)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), "60", True])
def test_wait_refuses_a_nonsense_hang_timeout(tmp_path, bad):
    job = Job(job_id="local-1", name="r", run_dir=tmp_path, backend="local")
    with pytest.raises(ConfigError, match="hang_timeout"):
        job.wait(hang_timeout=bad, progress=False)


def _submit(name: str, **extra) -> jobs.Job:
    cfg = RunConfig(name=name, nodes=1, gpus_per_node=2, extra=extra)
    return jobs.submit(cfg, backend="local", program=HANG_JOB)


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
    assert job.wait(timeout=240, progress=False, hang_timeout=60) is JobState.COMPLETED
    assert not list(job.run_dir.glob("hang-*"))


@pytest.mark.engine
def test_wait_with_hang_timeout_diagnoses_and_cancels(run_root, monkeypatch):
    """``job.wait(hang_timeout=...)``, what notebooks and ``labkit watch`` use."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    job = _submit("hang-wait", hang_at=2, hang_rank=0, pg_timeout=300, step_s=0.5)
    try:
        with pytest.raises(HangError) as e:
            # 30 s: the two ranks start (torch import, gloo) in a few seconds, printing as they go;
            # make test runs this beside the machine's tests, whose trainings may halve its CPU share
            job.wait(timeout=240, progress=False, hang_timeout=30)
    finally:
        if not job.state().finished:
            job.cancel()
    assert e.value.report.last_iteration == 1
    assert job.wait(timeout=60, progress=False) is JobState.CANCELLED
    assert len(list(job.run_dir.glob("hang-*.txt"))) == 1


@pytest.mark.slurm
def test_real_hang_on_minicluster(slurm_cluster, run_root, monkeypatch):
    """The same stuck rank, two nodes of the Slurm mini-cluster, one rank per node."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cfg = RunConfig(name="hang-slurm", nodes=2, gpus_per_node=1, backend="slurm",
                    extra={"hang_at": 2, "hang_rank": 1, "pg_timeout": 300})
    job = jobs.submit(cfg, backend="slurm", program=HANG_JOB,
                          cluster=slurm_cluster)
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
