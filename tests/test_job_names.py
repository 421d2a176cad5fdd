"""Slurm job names carry the user (``labkit-<user>-<run>``), so that ``squeue`` on a shared
cluster says whose labkit job it is, and labkit's own lookups (status, cancel, the instructor's
view) match the name its record keeps."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from labkit import classroom, slurmcli
from labkit.backends import slurm as slurm_backend
from labkit.config import RunConfig
from labkit.errors import LabkitError
from labkit.jobs import JobState, get_job, submit
from labkit.site import ClusterProfile, current_user, slurm_job_name

PROGRAM = Path(__file__).parent / "programs" / "allreduce_job.py"
SITE = ClusterProfile(name="fake", partition="lab")


def test_the_name_says_whose_run_it_is():
    assert slurm_job_name("nb01_dp", "ada") == "labkit-ada-nb01_dp"
    assert slurm_job_name("nb01_dp") == f"labkit-{current_user()}-nb01_dp"


class _Sbatch:
    """Slurm's side for the error-free path: sbatch answers an id, squeue lists what it is given
    (the subprocess boundary only; what labkit sends is what is checked)."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.queue = ""

    def __call__(self, cmd, *, slurm_conf=None, cwd=None, timeout=60):
        self.calls.append(list(cmd))
        out = {"sbatch": "77\n", "squeue": self.queue}.get(cmd[0], "")
        if cmd[:2] == ["sbatch", "--version"]:
            out = "slurm 22.05.8\n"
        rc = 0 if cmd[0] in ("sbatch", "squeue", "scancel") else 1
        return subprocess.CompletedProcess(cmd, rc, out, "")


@pytest.fixture
def sbatch(monkeypatch):
    fake = _Sbatch()
    monkeypatch.setattr(slurmcli, "run", fake)
    monkeypatch.setattr(slurmcli, "controller_down", lambda conf, timeout=1.0: None)
    slurm_backend._poll_cache.clear()
    yield fake
    slurm_backend._poll_cache.clear()


def test_sbatch_gets_the_users_name_and_the_record_keeps_it(sbatch, run_root):
    job = submit(RunConfig(name="mine"), backend="slurm", cluster=SITE)
    want = f"labkit-{current_user()}-mine"
    cmd = next(c for c in sbatch.calls if c[:2] == ["sbatch", "--parsable"])
    assert f"--job-name={want}" in cmd
    assert f"#SBATCH --job-name={want}\n" in (job.run_dir / "job.sh").read_text()
    assert json.loads((job.run_dir / "job.json").read_text())["info"]["slurm_job_name"] == want
    sbatch.queue = f"77|RUNNING|{want}\n"
    assert get_job("mine").state() is JobState.RUNNING
    sbatch.queue = "77|RUNNING|mine\n"  # the bare run name is not the job labkit submitted
    slurm_backend._poll_cache.clear()
    with pytest.raises(LabkitError, match="left it alone"):
        get_job("mine").cancel()
    assert not any(c[0] == "scancel" for c in sbatch.calls)


def test_a_record_from_before_user_names_still_matches_its_bare_name(sbatch, run_root):
    job = submit(RunConfig(name="old"), backend="slurm", cluster=SITE)
    rec = json.loads((job.run_dir / "job.json").read_text())
    del rec["info"]["slurm_job_name"]
    (job.run_dir / "job.json").write_text(json.dumps(rec))
    sbatch.queue = "77|PENDING|old\n"
    assert get_job("old").state() is JobState.PENDING


def test_the_instructors_view_matches_the_records_name_and_owner(sbatch, run_root):
    job = submit(RunConfig(name="nb01_dp"), backend="slurm", cluster=SITE)
    uid = job.run_dir.stat().st_uid
    sbatch.queue = f"77|RUNNING|{uid}|{slurm_job_name('nb01_dp')}\n"  # squeue -o %i|%T|%U|%j
    assert classroom._class_states([job])["77"] is JobState.RUNNING
    sbatch.queue = f"77|RUNNING|{uid}|nb01_dp\n"
    assert classroom._class_states([job])["77"] is JobState.UNKNOWN
    sbatch.queue = f"77|RUNNING|{uid + 1}|{slurm_job_name('nb01_dp')}\n"  # another user's job
    assert classroom._class_states([job])["77"] is JobState.UNKNOWN


@pytest.mark.slurm
def test_squeue_shows_whose_job_and_labkit_still_finds_and_cancels_it(slurm_cluster, run_root):
    cfg = RunConfig(name="jn_sleep", nodes=1, gpus_per_node=1, train_iters=3,
                    extra={"sleep": 300, "iters": 300})
    job = submit(cfg, backend="slurm", cluster=slurm_cluster, program=PROGRAM)
    try:
        q = slurmcli.run(["squeue", "--noheader", "-j", job.job_id, "-o", "%j|%u"],
                                  slurm_conf=slurm_cluster.slurm_conf)
        assert q.stdout.strip() == f"labkit-{current_user()}-jn_sleep|{current_user()}", q
        end = time.time() + 120
        while get_job("jn_sleep").state() is JobState.PENDING and time.time() < end:
            time.sleep(0.5)
        assert get_job("jn_sleep").state() is JobState.RUNNING
        assert get_job("jn_sleep").cancel()
        assert job.wait(timeout=60, progress=False) is JobState.CANCELLED
    finally:
        slurmcli.run(["scancel", job.job_id], slurm_conf=slurm_cluster.slurm_conf)
