"""What a student sees while a job waits: Slurm's own reason and the job's place in the queue,
from the real mini-cluster (marked ``slurm``, session fixture ``slurm_cluster``).

Both nodes are filled with a plain ``sleep`` job (not labkit's), then two labkit jobs are
submitted behind it: they are PENDING for a real reason that the scheduler gives, and the job
monitor's line (``Job.status_line``, the monitor's frame ``job_snapshot``) must say it.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from labkit import slurmcli
from labkit.config import RunConfig
from labkit.jobs import JobState, submit
from labkit.widgets import job_snapshot

pytestmark = pytest.mark.slurm
PROGRAM = Path(__file__).parent / "programs" / "allreduce_job.py"
PLACE = re.compile(r"^PENDING \((?P<reason>[^,]+), (?P<n>\d+)(st|nd|rd|th) of (?P<of>\d+) pending "
                   r"in partition (?P<part>\S+)\)$")


def _squeue(conf: str, *args: str) -> str:
    p = slurmcli.run(["squeue", "--noheader", *args], slurm_conf=conf)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def _until(check, timeout: float = 120.0):
    end = time.time() + timeout
    while time.time() < end:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    return check()


def test_a_pending_job_shows_slurms_reason_and_its_place_in_the_queue(slurm_cluster, run_root):
    conf = slurm_cluster.slurm_conf
    p = slurmcli.run(["sbatch", "--parsable", "-J", "fill_both_nodes", "-N", "2",
                               "--exclusive", "-o", "/dev/null", "--wrap", "sleep 300"],
                              slurm_conf=conf)
    assert p.returncode == 0, p.stderr
    filler = p.stdout.strip().split(";")[0]
    jobs = []
    try:
        # Other users of the cluster may hold nodes too; the filler runs once it has both.
        assert _until(lambda: _squeue(conf, "-j", filler, "-o", "%T") == "RUNNING", 300), \
            _squeue(conf, "-o", "%i %T %r %j")
        cfg = dict(nodes=1, gpus_per_node=1, train_iters=3)
        for name in ("queued_first", "queued_second"):
            jobs.append(submit(RunConfig(name=name, **cfg), backend="slurm", cluster=slurm_cluster,
                               program=PROGRAM))
        # The scheduler gives a pending job its reason on its next pass ("None" until then).
        reasons = _until(lambda: [r for r in (_squeue(conf, "-j", j.job_id, "-o", "%r")
                                              for j in jobs) if r != "None"], 60)
        assert len(reasons) == 2, reasons
        seen = []
        for job, reason in zip(jobs, reasons, strict=True):
            assert job.state() is JobState.PENDING
            line = job.status_line()
            m = PLACE.match(line)
            assert m, line
            # Slurm's own words, as squeue prints them for this job (Resources: waiting for
            # the nodes the sleep job holds; Priority: behind another pending job).
            assert m["reason"] == reason and reason in ("Resources", "Priority"), (line, reason)
            assert m["part"] == _squeue(conf, "-j", job.job_id, "-o", "%P")
            assert 1 <= int(m["n"]) <= int(m["of"]) and int(m["of"]) >= 2, line
            seen.append(int(m["n"]))
            assert f"[{line}]" in job_snapshot(job)  # the monitor's frame carries the line
        # Same priority: Slurm takes them in submission order, so the first is ahead.
        assert seen[0] < seen[1], seen
    finally:
        for job in jobs:
            job.cancel()
        subprocess.run(["scancel", filler], env={"SLURM_CONF": conf, "PATH": "/usr/bin:/bin"},
                       check=False)
    for job in jobs:
        assert job.wait(timeout=60, progress=False) is JobState.CANCELLED
    # A job that left the queue has no reason to show.
    assert jobs[0].status_line() == "CANCELLED"
