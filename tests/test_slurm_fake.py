"""What a real Slurm cannot produce on demand: sbatch refusing, squeue unreachable, no sbatch.

``FakeSlurm`` replaces ``labkit.backends.slurm.run_cmd``, the one door to Slurm's commands; it
answers with the text Slurm 22.05 prints and rejects any command it does not know.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from labkit.backends import Job, JobSpec, JobState, submit
from labkit.backends import slurm as slurm_backend
from labkit.backends.slurm import SLURM_STATES, _map
from labkit.config import RunConfig
from labkit.errors import ConfigError, LabkitError, SubmissionError
from labkit.site import ClusterProfile, slurm_job_name

PROFILE = ClusterProfile(name="fake", partition="lab", time_limit="00:05:00")


def queued(run: str, state: str = "RUNNING") -> str:
    """squeue's line (%i|%T|%j) for this user's labkit job of run ``run``."""
    return f"4242|{state}|{slurm_job_name(run)}\n"


class FakeSlurm:
    def __init__(self, *, sbatch_rc: int = 0, sbatch_err: str = "", squeue_rc: int = 0,
                 squeue_out: str = "", scontrol_rc: int = 1, scontrol_out: str = "",
                 version_rc: int = 0):
        self.calls: list[list[str]] = []
        self.sbatch_rc, self.sbatch_err, self.version_rc = sbatch_rc, sbatch_err, version_rc
        self.squeue_rc, self.squeue_out = squeue_rc, squeue_out
        self.scontrol_rc, self.scontrol_out = scontrol_rc, scontrol_out

    def __call__(self, cmd, *, slurm_conf=None, cwd=None, timeout=60):
        self.calls.append(list(cmd))
        ok = lambda out="", rc=0, err="": subprocess.CompletedProcess(cmd, rc, out, err)  # noqa: E731
        if cmd[:2] == ["sbatch", "--version"]:
            if self.version_rc == 127:
                return ok("", 127, "sbatch: command not found")
            return ok("slurm-wlm 22.05.8\n")
        if cmd[:2] == ["sbatch", "--parsable"]:
            return ok("4242\n") if not self.sbatch_rc else ok("", self.sbatch_rc, self.sbatch_err)
        if cmd[0] == "squeue":
            if self.squeue_rc:
                return ok("", self.squeue_rc, "slurm_load_jobs error: Unable to contact slurm "
                                              "controller (connect failure)\n")
            return ok(self.squeue_out)
        if cmd[0] == "scontrol":
            if self.scontrol_rc:
                return ok("", self.scontrol_rc, "slurm_load_jobs error: Invalid job id specified\n")
            return ok(self.scontrol_out)
        if cmd[0] == "sacct":
            return ok("", 1, "Slurm accounting storage is disabled\n")
        if cmd[0] == "scancel":
            return ok()
        raise ValueError(f'Unknown command to fake "{cmd}"')


@pytest.fixture
def fake(monkeypatch):
    """Install a FakeSlurm; the controller probe (a TCP connect) answers "up" unless
    ``controller_down="HOST:PORT"`` is given."""

    def install(*, controller_down: str | None = None, **kw) -> FakeSlurm:
        f = FakeSlurm(**kw)
        monkeypatch.setattr(slurm_backend, "run_cmd", f)
        monkeypatch.setattr(slurm_backend, "controller_down", lambda conf, timeout=1.0: controller_down)
        slurm_backend._poll_cache.clear()
        return f

    return install


def test_sbatch_refusal_is_quoted_with_a_fix(fake, run_root):
    fake(sbatch_rc=1, sbatch_err="sbatch: error: Batch job submission failed: Requested node "
                                 "configuration is not available\n")
    with pytest.raises(SubmissionError) as e:
        submit(RunConfig(name="big", nodes=2), backend="slurm", cluster=PROFILE)
    msg = str(e.value)
    assert "Requested node configuration is not available" in msg and "(exit 1)" in msg
    assert "sinfo" in msg
    assert not (run_root / "big").exists()  # nothing half-made is left behind


def test_no_sbatch_on_path(fake, run_root):
    fake(version_rc=127)
    with pytest.raises(SubmissionError, match=r"no sbatch on PATH: use backend='local' or run "
                                              r"`labkit cluster up`"):
        submit(RunConfig(name="nosl"), backend="slurm", cluster=PROFILE)
    assert not (run_root / "nosl").exists()


def test_submit_records_the_job(fake, run_root):
    f = fake(squeue_out=queued("rec", "PENDING"))
    job = submit(RunConfig(name="rec"), backend="slurm", cluster=PROFILE)
    assert job.job_id == "4242" and job.state() is JobState.PENDING
    sb = next(c for c in f.calls if c[:2] == ["sbatch", "--parsable"])
    assert sb[-1] == str(run_root / "rec" / "job.sh")
    assert Job.load(run_root / "rec").job_id == "4242"


def test_squeue_unreachable_degrades(fake, run_root, caplog):
    fake(squeue_out=queued("down"))
    job = submit(RunConfig(name="down"), backend="slurm", cluster=PROFILE)
    f = fake(squeue_rc=1)
    assert job.state() is JobState.UNKNOWN  # never guessed
    # A controller that does not answer squeue does not answer scontrol or sacct either: asking
    # them would only make `labkit status` wait once more per job.
    assert [c[0] for c in f.calls] == ["squeue"]
    (job.run_dir / "exit_code").write_text("0\n")  # the job script's own record
    assert job.state() is JobState.COMPLETED


def test_status_with_slurm_down_answers_from_the_records(fake, run_root, capsys):
    from labkit.cli import main

    fake(squeue_out=queued("gone"))
    submit(RunConfig(name="gone"), backend="slurm", cluster=PROFILE)
    f = fake(squeue_rc=1)
    assert main(["status", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["name"], r["state"]) for r in rows] == [("gone", "UNKNOWN")]
    assert [c[0] for c in f.calls] == ["squeue"]  # one question to a controller that is down


def test_a_dead_controller_is_named_and_squeue_never_asked(fake, run_root, capsys):
    from labkit.cli import main

    fake(squeue_out=queued("dead"))
    job = submit(RunConfig(name="dead"), backend="slurm", cluster=PROFILE)
    f = fake(controller_down="10.9.9.9:6817")
    with pytest.raises(LabkitError, match="cannot cancel Slurm job 4242.*10.9.9.9:6817 is not"):
        job.cancel()
    (run_root / "dead" / "exit_code").write_text("1\n")  # the job script's own record
    assert main(["status", "--json"]) == 0
    out = capsys.readouterr()
    assert [(r["name"], r["state"]) for r in json.loads(out.out)] == [("dead", "FAILED")]
    assert "the Slurm controller at 10.9.9.9:6817 is not answering" in out.err
    assert "labkit cluster up" in out.err and f.calls == []  # no squeue, scontrol or sacct wait


def test_exit_code_tells_failed(fake, run_root):
    fake(squeue_out=queued("ec"))
    job = submit(RunConfig(name="ec"), backend="slurm", cluster=PROFILE)
    fake(squeue_out="")  # Slurm forgot it (MinJobAge passed)
    (job.run_dir / "exit_code").write_text("1\n")
    assert job.state() is JobState.FAILED


def test_same_id_other_name_is_not_ours(fake, run_root):
    fake(squeue_out=queued("mine"))
    job = submit(RunConfig(name="mine"), backend="slurm", cluster=PROFILE)
    f = fake(squeue_out="4242|RUNNING|someone_else\n",
             scontrol_rc=0, scontrol_out="JobId=4242 JobName=someone_else UserId=bob(1000) "
                                         "JobState=RUNNING Reason=None\n")
    assert job.state() is JobState.UNKNOWN
    with pytest.raises(LabkitError, match="left it alone"):
        job.cancel()
    assert not any(c[0] == "scancel" for c in f.calls)


def test_scontrol_fallback_and_cancel_calls_only_that_id(fake, run_root):
    fake(squeue_out=queued("sc"))
    job = submit(RunConfig(name="sc"), backend="slurm", cluster=PROFILE)
    f = fake(squeue_out="", scontrol_rc=0,
             scontrol_out=f"JobId=4242 JobName={slurm_job_name('sc')} UserId=root(0) GroupId=root(0) "
                          "JobState=TIMEOUT Reason=TimeLimit\n")
    assert job.state() is JobState.TIMEOUT
    f = fake(squeue_out=queued("sc"))
    job._final = None
    job.cancel()
    assert ["scancel", "4242"] in f.calls
    assert not any("-u" in c for c in f.calls if c[0] == "scancel")


def test_a_program_with_arguments_is_submitted_as_a_jobspec(fake, run_root, tmp_path):
    f = fake(squeue_out=queued("bw", "PENDING"))
    prog = tmp_path / "bench.py"
    job = submit(JobSpec("bw", nodes=2, gpus_per_node=2), backend="slurm", cluster=PROFILE,
                 program=prog, program_args=["-b", "1K", "--json-out", "{run_dir}/out.jsonl"])
    d = run_root / "bw"
    assert sorted(p.name for p in d.iterdir()) == ["job.json", "job.sh"]  # no training config
    script = (d / "job.sh").read_text()
    assert f"export PROGRAM={prog}" in script
    assert f"\"$PROGRAM\" \"$@\"' program -b 1K --json-out {d}/out.jsonl\n" in script
    assert "#SBATCH --nodes=2" in script and f"#SBATCH --job-name={slurm_job_name('bw')}" in script
    assert Job.load(d).info["program_args"] == ["-b", "1K", "--json-out", f"{d}/out.jsonl"]
    assert job.state() is JobState.PENDING and any(c[0] == "sbatch" for c in f.calls)


def test_submit_refuses_what_is_not_a_run(fake, run_root):
    fake()
    with pytest.raises(ConfigError, match="give program="):
        submit(JobSpec("noprog"), backend="slurm", cluster=PROFILE)
    with pytest.raises(ConfigError, match="RunConfig or a JobSpec, not dict"):
        submit({"name": "x"}, cluster=PROFILE)
    with pytest.raises(ConfigError, match="list of arguments"):
        submit(RunConfig(name="s"), backend="slurm", cluster=PROFILE, program_args="-b 1K")
    assert not list(run_root.iterdir())


@pytest.mark.parametrize("slurm,ours", [
    ("PENDING", "PENDING"), ("CONFIGURING", "PENDING"), ("RUNNING", "RUNNING"),
    ("COMPLETING", "RUNNING"), ("COMPLETED", "COMPLETED"), ("FAILED", "FAILED"),
    ("CANCELLED by 0", "CANCELLED"), ("CANCELLED+", "CANCELLED"), ("TIMEOUT", "TIMEOUT"),
    ("OUT_OF_MEMORY", "OUT_OF_MEMORY"), ("NODE_FAIL", "NODE_FAIL"), ("BOOT_FAIL", "NODE_FAIL"),
    ("DEADLINE", "TIMEOUT"), ("WHATEVER", "UNKNOWN"),
])
def test_state_mapping(slurm, ours):
    assert _map(slurm) == JobState(ours)


def test_every_mapped_state_is_a_jobstate():
    assert set(SLURM_STATES.values()) <= set(JobState)
