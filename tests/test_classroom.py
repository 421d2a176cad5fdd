"""A class on one machine, as one user: the site's {user} run root, labkit check --cluster,
cancel --all / clean on real local jobs, the class view, and Job.wait's interrupt.

The multi-user proof on the Slurm mini-cluster (real Unix users, real training) is
tests/test_classroom_slurm.py.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from test_slurm_fake import FakeSlurm

from labkit import classroom, slurmcli
from labkit.cli import main
from labkit.config import RunConfig
from labkit.errors import ConfigError, SubmissionError
from labkit.jobs import JobSpec, JobState, submit
from labkit.site import ClusterProfile, current_user, load_cluster

PROGRAM = Path(__file__).parent / "programs" / "ckpt_job.py"


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("LABKIT_CLUSTER", raising=False)


def _job(name: str, *, sleep: float = 0.0, nbytes: int = 300_000):
    return submit(JobSpec(name), program=PROGRAM,
                  program_args=["--run-dir", "{run_dir}", "--bytes", str(nbytes),
                                "--sleep", str(sleep)])


# --- the site profile ---------------------------------------------------------------------------
def test_user_placeholder_fills_the_callers_name(tmp_path):
    site = ClusterProfile(run_root=str(tmp_path / "class" / "{user}" / "runs"))
    assert site.run_root_path() == tmp_path / "class" / current_user() / "runs"
    assert site.run_root_path("alice") == tmp_path / "class" / "alice" / "runs"
    assert ClusterProfile().run_root_path() is None


@pytest.mark.parametrize("root, word", [("/s/{usr}/runs", "{usr}"), ("/s/{user/runs", "{user"),
                                        ("/s/{}/runs", "{}")])
def test_other_placeholders_are_refused_with_the_fix(root, word):
    with pytest.raises(ConfigError) as e:
        ClusterProfile(run_root=root)
    assert word in str(e.value) and "{user}" in str(e.value)


def test_gpu_memory_belongs_to_the_site():
    assert ClusterProfile(gpu_memory_gb=80).gpu_memory_gb == 80
    for bad in ("80", -1, True):
        with pytest.raises(ConfigError, match="gpu_memory_gb"):
            ClusterProfile(gpu_memory_gb=bad)


def test_check_cluster_names_every_wrong_field(tmp_path, capsys):
    bad = tmp_path / "site.yaml"
    bad.write_text("name: class\npartition: two words\nrun_root: /x/{usr}/runs\n"
                   "gpu_memory_gb: lots\ntime_limit: soon\n")
    assert main(["check", "--cluster", str(bad), "--json"]) == 2
    errors = json.loads(capsys.readouterr().out)["errors"]
    assert len(errors) == 4
    for field in ("partition", "run_root", "gpu_memory_gb", "time_limit"):
        assert any(field in e for e in errors), field
    good = tmp_path / "good.yaml"
    good.write_text(f"name: class\npartition: lab\nrun_root: {tmp_path}/{{user}}/runs\n"
                    f"gpu_memory_gb: 80\n")
    assert main(["check", "--cluster", str(good)]) == 0
    out = capsys.readouterr().out
    assert f"{tmp_path}/{current_user()}/runs" in out and "gpu_memory_gb 80" in out
    assert main(["check"]) == 2


# --- launch: render, submit and reuse use one run directory -------------------------------------
def test_run_dir_of_is_the_sites_per_user_root_for_slurm(tmp_path, run_root):
    from labkit.lab import run_dir_of

    site = ClusterProfile(run_root=str(tmp_path / "{user}" / "runs"))
    cfg = RunConfig.for_profile("cpu", name="nb01_dp", backend="slurm")
    assert run_dir_of(cfg, cluster=site) == tmp_path / current_user() / "runs" / "nb01_dp"
    assert run_dir_of(cfg.replace(backend="local"), cluster=site) == run_root / "nb01_dp"
    site_file = tmp_path / "site.yaml"
    site_file.write_text(f"run_root: {tmp_path}/{{user}}/r\n")
    assert run_dir_of(cfg, cluster=str(site_file)).parent == tmp_path / current_user() / "r"


def test_a_running_jobs_directory_is_never_moved_aside(run_root):
    from labkit.lab import launch

    job = _job("held", sleep=60)
    try:
        assert _wait_for(lambda: job.state() is JobState.RUNNING), job.state()
        cfg = RunConfig.for_profile("cpu", name="held")
        with pytest.raises(SubmissionError) as e:
            launch(cfg, wait=False)
        msg = str(e.value)
        assert job.job_id in msg and "labkit cancel" in msg and "RUNNING" in msg
        assert sorted(p.name for p in run_root.iterdir()) == ["held"]  # nothing moved
    finally:
        job.cancel()


# --- cancel --all, clean, the interrupt ---------------------------------------------------------
def _wait_for(pred, timeout=60.0):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.3)
    return False


def test_cancel_all_and_clean_act_on_the_callers_runs_only(run_root, capsys):
    done1, done2 = _job("done1"), _job("done2", nbytes=500_000)
    for j in (done1, done2):
        assert j.wait(timeout=120, progress=False) is JobState.COMPLETED
    live = _job("live", sleep=120)
    try:
        assert _wait_for(lambda: (live.run_dir / "checkpoints").exists())
        # dry run: lists, removes nothing; never the running one
        assert main(["clean", "--dry-run", "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert {Path(r["path"]).parent.name for r in doc["removed"]} == {"done1", "done2"}
        assert doc["freed_bytes"] >= 800_000 and (done1.run_dir / "checkpoints").exists()
        # --keep-last 1 leaves the newest finished run
        assert main(["clean", "--keep-last", "1"]) == 0
        assert "freed" in capsys.readouterr().out
        assert not (done1.run_dir / "checkpoints").exists()
        assert (done2.run_dir / "checkpoints").exists() and (live.run_dir / "checkpoints").exists()
        assert (done1.run_dir / "job.json").exists()  # the run itself stays
        # cancel --all: the live one, nothing else
        assert main(["cancel", "--all", "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)
        assert [r["name"] for r in rows] == ["live"]
        assert _wait_for(lambda: live.state().finished)
        assert live.state() is JobState.CANCELLED
        assert done2.state() is JobState.COMPLETED
        assert main(["cancel"]) == 2
    finally:
        live.cancel()


def test_interrupting_wait_cancels_the_job_unless_told_not_to(run_root):
    def interrupt(job, state):
        if state is JobState.RUNNING:
            raise KeyboardInterrupt

    keep = _job("keep", sleep=120)
    try:
        with pytest.raises(KeyboardInterrupt):
            keep.wait(timeout=60, progress=False, on_poll=interrupt, cancel_on_interrupt=False)
        assert keep.state() is JobState.RUNNING
    finally:
        keep.cancel()
    stop = _job("stop", sleep=120)
    with pytest.raises(KeyboardInterrupt):
        stop.wait(timeout=60, progress=False, on_poll=interrupt)
    assert _wait_for(lambda: stop.state().finished)
    assert stop.state() is JobState.CANCELLED


# --- the class view (one user: root's own runs under the {user} pattern) ------------------------
def test_class_status_lists_each_users_runs(tmp_path, run_root, monkeypatch, capsys):
    site = tmp_path / "site.yaml"
    site.write_text(f"name: class\nrun_root: {tmp_path}/class/{{user}}/runs\n")
    monkeypatch.setenv("LABKIT_RUN_ROOT", str(load_cluster(site).run_root_path()))
    job = _job("nb01_dp")
    assert job.wait(timeout=120, progress=False) is JobState.COMPLETED
    os.makedirs(tmp_path / "class" / "nobody-yet" / "runs")
    # The view also lists the hub's servers from the site's Slurm, here the machine's default
    # one: the mini-cluster while another test runs it, with that test's hub users in its queue.
    # This class has no Slurm: its queue answers empty, at the process boundary.
    monkeypatch.setattr(slurmcli, "run", slurm := FakeSlurm(squeue_out=""))
    assert main(["class", "status", "--cluster", str(site), "--json"]) == 0
    assert [c[0] for c in slurm.calls] == ["squeue"]
    rows = {r["user"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {current_user(), "nobody-yet"}
    me = rows[current_user()]
    assert me["jobs"]["finished"] == 1 and me["last_notebook"] == "01"
    assert [r["name"] for r in me["runs"]] == ["nb01_dp"] and me["last_failure"] is None
    assert rows["nobody-yet"]["jobs"] == {"PENDING": 0, "RUNNING": 0, "finished": 0}
    assert main(["class", "status", "--cluster", str(site)]) == 0
    assert current_user() in capsys.readouterr().out
    assert classroom.class_clean(str(site), dry_run=True)[0].user == current_user()
