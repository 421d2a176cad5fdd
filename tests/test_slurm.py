"""The Slurm backend on the real mini-cluster (2 nodes x 2 CPUs, network namespaces, sbatch).

Marked ``slurm``; they use the session fixture ``slurm_cluster`` (root). Jobs that need one
node ask for one, so two of them can run side by side and the suite stays within minutes.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from labkit import slurmcli
from labkit.backends import slurm as slurm_backend
from labkit.cli import main as cli
from labkit.config import RunConfig
from labkit.errors import JobFailedError, LabkitError
from labkit.jobs import JobState, get_job, list_jobs, submit

pytestmark = pytest.mark.slurm
PROGRAM = Path(__file__).parent / "programs" / "allreduce_job.py"


def _cfg(name: str, **kw) -> RunConfig:
    return RunConfig(**{**dict(name=name, nodes=1, gpus_per_node=2, train_iters=3), **kw})


def _wait_for(job, states: set[JobState], timeout: float = 120) -> JobState:
    end = time.time() + timeout
    while time.time() < end:
        st = job.state()
        if st in states or st.finished:
            return st
        time.sleep(0.5)
    return job.state()


def test_engine_tp2_pp2_on_two_nodes(slurm_cluster, run_root):
    cfg = RunConfig(name="engine_tp2pp2", nodes=2, gpus_per_node=2, train_iters=5,
                    tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    job = submit(cfg, backend="slurm", cluster=slurm_cluster)
    assert job.backend == "slurm" and job.job_id.isdigit()
    st = job.wait(timeout=420, progress=False)
    log = job.log_path.read_text()
    assert st is JobState.COMPLETED, job.tail(60)
    assert "using world size: 4," in log
    assert job.exit_code() == 0
    # Really two nodes: the rendezvous ran at the head node's own address on the bridge.
    assert "rendezvous at 10.77.0.1" in log
    try:
        from labkit.logs import parse_log
    except ImportError:
        return
    parsed = parse_log(job.log_path).to_dict()
    assert parsed["layout"]["world_size"] == 4 and parsed["iterations"], parsed["layout"]


def test_failing_job_is_failed_with_log_tail(slurm_cluster, run_root):
    job = submit(_cfg("sl_boom", extra={"fail": True}), backend="slurm", cluster=slurm_cluster,
                 program=PROGRAM)
    with pytest.raises(JobFailedError) as e:
        job.wait(timeout=180, progress=False, raise_on_failure=True)
    assert e.value.state == "FAILED"
    assert "failing on purpose" in str(e.value) and e.value.job_id == job.job_id


def test_cancelled(slurm_cluster, run_root):
    # The time limit's end (TIMEOUT) is in test_slurm_faults.py, beside the warning it follows.
    doomed = submit(_cfg("sl_cancel", extra={"sleep": 600, "iters": 600}), backend="slurm",
                    cluster=slurm_cluster, program=PROGRAM)
    assert _wait_for(doomed, {JobState.RUNNING}) is JobState.RUNNING
    doomed.cancel()
    assert doomed.wait(timeout=60, progress=False) is JobState.CANCELLED


def test_jobs_that_do_not_fit_together_queue(slurm_cluster, run_root):
    # Each takes both nodes' CPUs, so the second waits for the first.
    first = submit(_cfg("sl_first", nodes=2, gpus_per_node=1, extra={"sleep": 6}),
                   backend="slurm", cluster=slurm_cluster.replace(cpus_per_task=2),
                   program=PROGRAM)
    second = submit(_cfg("sl_second", nodes=2, gpus_per_node=1),
                    backend="slurm", cluster=slurm_cluster.replace(cpus_per_task=2),
                    program=PROGRAM)
    assert _wait_for(first, {JobState.RUNNING}) is JobState.RUNNING
    seen = []
    while not second.state().finished:
        seen.append((first.state(), second.state()))
        time.sleep(0.5)
    assert (JobState.RUNNING, JobState.PENDING) in seen, seen
    assert first.state() is JobState.COMPLETED and second.state() is JobState.COMPLETED
    assert any(s is JobState.RUNNING for _, s in seen) or second.exit_code() == 0


def test_foreign_job_is_left_alone(slurm_cluster, run_root, capsys):
    conf = slurm_cluster.slurm_conf
    p = slurmcli.run(["sbatch", "--parsable", "-J", "not_labkit", "-N", "1",
                               "--cpus-per-task=1", "-o", "/dev/null", "--wrap", "sleep 120"],
                              slurm_conf=conf)
    assert p.returncode == 0, p.stderr
    foreign = p.stdout.strip().split(";")[0]
    try:
        ours = submit(_cfg("sl_ours"), backend="slurm", cluster=slurm_cluster, program=PROGRAM)
        assert foreign not in [j.job_id for j in list_jobs()]
        with pytest.raises(LabkitError, match="only acts on jobs it submitted"):
            get_job(foreign)
        assert cli(["cancel", foreign]) == 1
        assert cli(["status", "--json"]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert [r["job_id"] for r in listed] == [ours.job_id]
        # A run directory whose record names the foreign id is refused too (name differs).
        forged = get_job("sl_ours")
        forged.job_id = foreign
        with pytest.raises(LabkitError, match="left it alone"):
            slurm_backend.cancel(forged)
        assert ours.wait(timeout=180, progress=False) is JobState.COMPLETED
        q = slurmcli.run(["squeue", "--noheader", "-j", foreign, "-o", "%T"],
                                  slurm_conf=conf)
        assert q.stdout.strip() in ("RUNNING", "PENDING"), q
    finally:
        subprocess.run(["scancel", foreign], env={"SLURM_CONF": conf, "PATH": "/usr/bin:/bin"})


def test_hostile_run_root_through_sbatch(slurm_cluster, tmp_path, monkeypatch):
    root = tmp_path / "runs 1" / "a'b \"c\" $(touch PWNED); `touch PWNED2`; x"
    root.mkdir(parents=True)
    monkeypatch.setenv("LABKIT_RUN_ROOT", str(root))
    job = submit(_cfg("hostile", nodes=2, gpus_per_node=1), backend="slurm",
                 cluster=slurm_cluster, program=PROGRAM)
    assert job.wait(timeout=180, progress=False) is JobState.COMPLETED, job.tail(30)
    assert "using world size: 2," in (root / "hostile" / "log.txt").read_text()
    assert not list(tmp_path.rglob("PWNED*")) and not list(Path("/").glob("PWNED*"))
