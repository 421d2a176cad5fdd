"""Faults on the real mini-cluster: a node goes DOWN, the time limit comes, a job is preempted.

Marked ``slurm``; session fixture ``slurm_cluster`` (its profile asks for ``requeue: true``
and the warning signal 120 s before the time limit). Each run is a tiny 2-node GPT (one process
per node, 2 layers of width 64, a checkpoint every 5 iterations). A requeued job waits about 2
minutes before Slurm starts it again (its BeginTime); the tests move that to now, as an
administrator can (``scontrol update jobid=ID StartTime=now``), to keep the suite short.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from labkit import slurmcli
from labkit.backends.diagnosis import failure_error
from labkit.config import RunConfig
from labkit.faults import restore_node
from labkit.jobs import JobState, submit
from labkit.logs import parse_log
from labkit.run.attempts import attempts

pytestmark = pytest.mark.slurm
TINY = dict(nodes=2, gpus_per_node=1, num_layers=2, hidden_size=64, num_attention_heads=4,
            seq_length=64, max_position_embeddings=64, micro_batch_size=2, global_batch_size=4,
            log_interval=1, save_interval=5, lr_warmup_iters=2)
ALLREDUCE_JOB = Path(__file__).parent / "programs" / "allreduce_job.py"
ITERATION = re.compile(r"\biteration\s+(\d+)/\s*\d+ \|")


def _until(check, timeout: float, what: str):
    end = time.time() + timeout
    while time.time() < end:
        got = check()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"no {what} after {timeout:.0f} s")


def _scontrol(conf: str, *args: str) -> None:
    p = slurmcli.run(["scontrol", *args], slurm_conf=conf)
    assert p.returncode == 0, (args, p.stderr)


def _checkpoint(job) -> int:
    f = job.run_dir / "checkpoints" / "latest_checkpointed_iteration.txt"
    return int(f.read_text()) if f.exists() and f.read_text().strip().isdigit() else 0


def _restarted(job) -> bool:
    fields = slurmcli.job_fields(job.info["slurm_conf"], job.job_id) or {}
    return fields.get("Restarts", "0") != "0" and fields.get("JobState") == "PENDING"


def _every_iteration(job, train_iters: int) -> None:
    logged = {int(m.group(1)) for m in ITERATION.finditer(job.log_path.read_text())}
    assert logged == set(range(1, train_iters + 1)), sorted(set(range(1, train_iters + 1)) - logged)


def test_node_down_mid_run_is_requeued_resumes_from_its_checkpoint_and_completes(
        slurm_cluster, run_root):
    conf = slurm_cluster.slurm_conf
    assert slurm_cluster.requeue is True
    job = submit(RunConfig(name="node_down", train_iters=60, **TINY), backend="slurm",
                 cluster=slurm_cluster)
    try:
        _until(lambda: _checkpoint(job) >= 5, 300, "checkpoint at iteration 5")
        _scontrol(conf, "update", "nodename=node2", "state=down", "reason=labkit test: node2 pulled")
        try:
            _until(lambda: _restarted(job), 120, "requeue")
            # What the student sees while the job waits: the attempt, why the last one ended,
            # and the node that is down with the reason its admin gave.
            line = job.status_line()
            assert line.startswith("PENDING (requeued, attempt 2; attempt 1 ended: node failure, "
                                   "last iteration "), line
            assert "node2 down: labkit test: node2 pulled" in line, line
        finally:
            restore_node(job, "node2")  # and StartTime once node2 has surely ended the old attempt
        assert job.wait(timeout=420, progress=False) is JobState.COMPLETED, job.tail(40)
    finally:
        if not job.state().finished:
            job.cancel()
    first, second = attempts(job.log_path.read_text())
    assert first.reason == "node failure" and second.reason == "completed", (first, second)
    # It lost at most save_interval iterations: it went on from the last complete checkpoint.
    assert 5 <= second.resumed_from <= first.last_iteration < second.resumed_from + 5 + 1
    _every_iteration(job, 60)
    kinds = {f["kind"]: f["message"] for f in parse_log(job.log_path).to_dict()["failures"]}
    assert "node2" in kinds.get("node_failure", ""), kinds  # srun: error: Node failure on node2


def test_a_one_minute_time_limit_saves_on_the_warning_or_ends_the_job(slurm_cluster, run_root):
    """The training saves on Slurm's warning and stops (exit code 75); a program that does not
    stop is ended by Slurm at the limit: TIMEOUT. Side by side: each waits out the same minute."""
    # Slurm sends the warning at its first check less than warning_s + 30 s before the end:
    # here 29-59 s into the minute; the kill comes at a later check, 30 s after it or more.
    short = slurm_cluster.replace(time_limit="1", warning_s=1, requeue=False)
    job = submit(RunConfig(name="one_minute", train_iters=100_000, **TINY), backend="slurm",
                 cluster=short)
    # one process on the CPU each node has left beside the training's one
    late = submit(RunConfig(name="timeout", nodes=1, gpus_per_node=1, train_iters=3,
                            extra={"sleep": 600, "iters": 600}),
                  backend="slurm", cluster=slurm_cluster.replace(time_limit="1"),
                  program=ALLREDUCE_JOB)
    try:
        st = job.wait(timeout=240, progress=False)
        assert late.wait(timeout=240, progress=False) is JobState.TIMEOUT, late.tail(20)
    finally:
        for j in (job, late):
            if not j.state().finished:
                j.cancel()
    log = job.log_path.read_text()
    assert st is JobState.FAILED and job.exit_code() == 75, (st, job.tail(30))
    assert re.search(r"\[job\] SIGUSR1 from Slurm at \S+ \S+: the time limit is near", log), log
    stop = re.search(r"\[labkit\] stopped on SIGUSR1 at iteration (\d+) of 100000 .*: saved "
                     r"checkpoint (\S+), exit code 75", log)
    assert stop, job.tail(30)
    assert _checkpoint(job) == int(stop.group(1)) >= 1
    (only,) = attempts(log)
    assert only.reason == f"saved on SIGUSR1 (time limit) at iteration {stop.group(1)}"
    assert not only.requeued  # requeue is off: it ends, and says how to go on
    msg = str(failure_error(job, st))
    assert ("the training saved a checkpoint on Slurm's warning signal (time limit or preemption) "
            "and stopped (exit code 75)") in msg and f"checkpoint is iteration {stop.group(1)}" in msg


def test_a_preempted_run_saves_is_requeued_resumes_and_completes(slurm_cluster, run_root):
    conf = slurm_cluster.slurm_conf
    job = submit(RunConfig(name="preempted", train_iters=60, **TINY), backend="slurm",
                 cluster=slurm_cluster)
    urgent = None
    try:
        _until(lambda: _checkpoint(job) >= 5, 300, "checkpoint at iteration 5")
        # A job of partition urgent that needs both nodes whole preempts it (mini-cluster).
        p = slurmcli.run(["sbatch", "--parsable", "-J", "urgent_job", "-p", "urgent", "-N", "2",
                          "--cpus-per-task=2", "-o", "/dev/null", "--wrap", "sleep 3"],
                         slurm_conf=conf)
        assert p.returncode == 0, p.stderr
        urgent = p.stdout.strip().split(";")[0]
        _until(lambda: _restarted(job), 180, "requeue after the preemption")
        assert "attempt 1 ended: saved on SIGUSR1 (preemption) at iteration" in job.status_line()
        _until(lambda: slurmcli.queued_job(conf, urgent) in (None,) or
               slurmcli.queued_job(conf, urgent)[0] not in ("PENDING", "RUNNING"), 120,
               "the urgent job's end")
        _scontrol(conf, "update", f"jobid={job.job_id}", "StartTime=now")
        assert job.wait(timeout=420, progress=False) is JobState.COMPLETED, job.tail(40)
    finally:
        if not job.state().finished:
            job.cancel()
        if urgent:
            slurmcli.run(["scancel", urgent], slurm_conf=conf)
    first, second = attempts(job.log_path.read_text())
    saved = int(re.search(r"iteration (\d+)", first.reason).group(1))
    assert first.reason.startswith("saved on SIGUSR1 (preemption)") and first.requeued
    assert second.resumed_from == saved and second.reason == "completed"
    _every_iteration(job, 60)
