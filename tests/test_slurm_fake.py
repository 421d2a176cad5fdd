"""What a real Slurm cannot produce on demand: sbatch refusing, squeue unreachable, no sbatch.

``FakeSlurm`` replaces ``labkit.slurmcli.run``, the one door to Slurm's commands, for every
caller: the Slurm backend, the job monitor's queue line, the class view and the doctor. It
answers with the text Slurm 22.05 prints and rejects any command it does not know.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from labkit import slurmcli
from labkit.backends import slurm as slurm_backend
from labkit.backends.slurm import SLURM_STATES, _map
from labkit.config import RunConfig
from labkit.errors import ConfigError, LabkitError, SubmissionError
from labkit.jobs import Job, JobSpec, JobState, submit
from labkit.site import ClusterProfile, slurm_job_name

PROFILE = ClusterProfile(name="fake", partition="lab", time_limit="00:05:00")


def queued(run: str, state: str = "RUNNING") -> str:
    """squeue's line (%i|%T|%j) for this user's labkit job of run ``run``."""
    return f"4242|{state}|{slurm_job_name(run)}\n"


UNREACHABLE = "Unable to contact slurm controller (connect failure)\n"


class FakeSlurm:
    """Slurm's commands as labkit calls them. ``squeue_out`` is squeue's text, or a dict of
    texts by output format (``-o``); ``sinfo_out`` is ``sinfo -o %P|%a|%D|%T|%G``'s,
    ``nodes_out`` ``sinfo -N``'s, ``partition_out`` ``scontrol -o show partition``'s. An exit
    code other than 0 answers with what Slurm says when its controller is unreachable (or
    ``squeue_err``; 127: the command is not installed)."""

    def __init__(self, *, sbatch_rc: int = 0, sbatch_err: str = "", squeue_rc: int = 0,
                 squeue_out: str | dict[str, str] = "", squeue_err: str = "", scontrol_rc: int = 1,
                 scontrol_out: str = "", version_rc: int = 0, sinfo_rc: int = 0,
                 sinfo_out: str = "", nodes_out: str = "", partition_out: str = "",
                 sacct_rc: int = 1, scancel_rc: int = 0, reasons_out: str = ""):
        self.calls: list[list[str]] = []
        self.sbatch_rc, self.sbatch_err, self.version_rc = sbatch_rc, sbatch_err, version_rc
        self.squeue_rc, self.squeue_out, self.squeue_err = squeue_rc, squeue_out, squeue_err
        self.scontrol_rc, self.scontrol_out = scontrol_rc, scontrol_out
        self.sinfo_rc, self.sinfo_out, self.nodes_out = sinfo_rc, sinfo_out, nodes_out
        self.partition_out, self.sacct_rc, self.scancel_rc = partition_out, sacct_rc, scancel_rc
        self.reasons_out = reasons_out  # sinfo -R -N -h -o %N|%T|%E: nodes out of service

    def __call__(self, cmd, *, slurm_conf=None, cwd=None, timeout=60):
        self.calls.append(list(cmd))
        ok = lambda out="", rc=0, err="": subprocess.CompletedProcess(cmd, rc, out, err)  # noqa: E731
        missing = ok("", 127, f"{cmd[0]}: command not found")
        if cmd[:2] == ["sbatch", "--version"]:
            return missing if self.version_rc == 127 else ok("slurm-wlm 22.05.8\n")
        if cmd[:2] == ["sbatch", "--parsable"]:
            return ok("4242\n") if not self.sbatch_rc else ok("", self.sbatch_rc, self.sbatch_err)
        if cmd[0] == "squeue":
            if self.squeue_rc:
                return ok("", self.squeue_rc, self.squeue_err or "slurm_load_jobs error: " + UNREACHABLE)
            if isinstance(self.squeue_out, dict):
                return ok(self.squeue_out.get(cmd[cmd.index("-o") + 1], ""))
            return ok(self.squeue_out)
        if cmd[:4] == ["scontrol", "-o", "show", "job"]:
            if self.scontrol_rc:
                return ok("", self.scontrol_rc, "slurm_load_jobs error: Invalid job id specified\n")
            return ok(self.scontrol_out)
        if cmd[:4] == ["scontrol", "-o", "show", "partition"]:
            return ok(self.partition_out)
        if cmd[0] == "sinfo":
            if self.sinfo_rc:
                return missing if self.sinfo_rc == 127 else ok(
                    "", self.sinfo_rc, "slurm_load_partitions: " + UNREACHABLE)
            if "-R" in cmd:
                return ok(self.reasons_out)
            return ok(self.nodes_out if "-N" in cmd else self.sinfo_out)
        if cmd[0] == "sacct":
            if self.sacct_rc == 127:
                return missing
            return ok("", 1, "sacct: error: Slurm accounting storage is disabled\n") \
                if self.sacct_rc else ok("4242\n")
        if cmd[0] == "scancel":
            return ok() if not self.scancel_rc else ok(
                "", self.scancel_rc, "scancel: error: Kill job error on job id 4242: Access/"
                                     "permission denied\n")
        raise ValueError(f'Unknown command to fake "{cmd}"')


@pytest.fixture
def fake(monkeypatch):
    """Install a FakeSlurm; the controller probe (a TCP connect) answers "up" unless
    ``controller_down="HOST:PORT"`` is given."""

    def install(*, controller_down: str | None = None, **kw) -> FakeSlurm:
        f = FakeSlurm(**kw)
        monkeypatch.setattr(slurmcli, "run", f)
        monkeypatch.setattr(slurmcli, "controller_down", lambda conf, timeout=1.0: controller_down)
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
    assert f"\"$PROGRAM\" \"$@\"' program -b 1K --json-out {d}/out.jsonl &\n" in script
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
    ("OUT_OF_MEMORY", "OUT_OF_MEMORY"), ("NODE_FAIL", "NODE_FAIL"), ("BOOT_FAIL", "BOOT_FAIL"),
    ("DEADLINE", "DEADLINE"), ("PREEMPTED", "PREEMPTED"), ("REQUEUED", "REQUEUED"),
    ("REQUEUE_HOLD", "REQUEUE_HOLD"), ("REQUEUE_FED", "REQUEUED"), ("WHATEVER", "UNKNOWN"),
])
def test_state_mapping(slurm, ours):
    assert _map(slurm) == JobState(ours)
    # A requeued job is coming back; the others of these ended for good.
    assert _map(slurm).finished == (ours in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                             "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL",
                                             "DEADLINE", "PREEMPTED"))


def test_every_mapped_state_is_a_jobstate():
    assert set(SLURM_STATES.values()) <= set(JobState)


# --- the doctor's Slurm checks, through the same door -----------------------------------------
SINFO = "lab*|up|2|idle|(null)\n"  # sinfo -h -o %P|%a|%D|%T|%G
NODES = "node1|2|(null)|idle|lab*\nnode2|2|(null)|idle|lab*\n"  # sinfo -N -h -o %N|%c|%G|%t|%P
PARTITION = ("PartitionName=lab AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL "
             "Default=YES QoS=N/A DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO "
             "GraceTime=0 Hidden=NO MaxNodes=UNLIMITED MaxTime=UNLIMITED MinNodes=0 LLN=NO "
             "MaxCPUsPerNode=UNLIMITED Nodes=node[1-2] PriorityJobFactor=1 PriorityTier=1 "
             "RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=OFF "
             "State={state} TotalCPUs=4 TotalNodes=2 SelectTypeParameters=NONE\n")


def _ctx(**kw):
    from labkit.doctor import Context

    return Context(profile=PROFILE.replace(gpu_request="none"), wants_slurm=True, **kw)


def test_doctor_slurm_check_reads_sinfo(fake):
    from labkit.doctor import Context
    from labkit.doctor.checks import check_slurm

    fake(sinfo_out=SINFO)
    r = check_slurm(_ctx())
    assert r.status == "PASS" and r.detail == "reachable: lab* (up, 2 nodes idle, GRES (null))"
    fake(sinfo_out="debug*|up|2|idle|(null)\n")
    r = check_slurm(_ctx())
    assert r.status == "FAIL" and "partition 'lab' of the profile is not in sinfo" in r.detail
    assert "['debug']" in r.fix
    fake(sinfo_out=SINFO)
    r = check_slurm(Context(profile=PROFILE, wants_slurm=True))  # a GPU site
    assert r.status == "WARN" and "no partition offers GRES" in r.detail


def test_doctor_slurm_check_when_sinfo_fails_or_is_missing(fake):
    from labkit.doctor.checks import check_slurm

    fake(sinfo_rc=1)
    r = check_slurm(_ctx())
    assert r.status == "FAIL" and r.detail == ("sinfo does not answer: slurm_load_partitions: "
                                               "Unable to contact slurm controller (connect "
                                               "failure)")
    assert "labkit cluster up" in r.fix
    fake(sinfo_rc=127)
    r = check_slurm(_ctx())
    assert r.status == "WARN" and "no Slurm client (sinfo) on PATH" in r.detail
    from labkit.doctor import Context

    assert check_slurm(Context()).status == "PASS"  # a site without Slurm: nothing missing


def test_doctor_mode_and_accounting(fake):
    from labkit.doctor.checks import check_accounting

    fake(sinfo_rc=1)
    assert _ctx().mode == "local"
    assert check_accounting(_ctx()).status == "SKIP"
    f = fake(sinfo_out=SINFO)
    assert _ctx().mode == "slurm"
    r = check_accounting(_ctx())
    assert r.status == "WARN" and "sacct does not answer (sacct: error: Slurm accounting storage " \
                                  "is disabled); labkit copes" in r.detail
    assert ["sacct", "-n", "-X", "-o", "JobID", "-S", "now-1hour"] in f.calls
    fake(sinfo_out=SINFO, sacct_rc=127)
    assert "no sacct on PATH" in check_accounting(_ctx()).detail
    fake(sinfo_out=SINFO, sacct_rc=0)
    assert check_accounting(_ctx()).status == "PASS"


def test_doctor_class_fit_reads_the_partition(fake):
    from labkit.doctor.sitechecks import check_class_fit

    fake(sinfo_out=SINFO, nodes_out=NODES, partition_out=PARTITION.format(state="UP"))
    r = check_class_fit(_ctx(students=1))
    assert r.status == "PASS", r
    fake(sinfo_out=SINFO, nodes_out=NODES, partition_out=PARTITION.format(state="DOWN"))
    r = check_class_fit(_ctx(students=1))
    assert r.status == "FAIL" and r.detail.startswith("partition lab is DOWN (node1 2 CPUs idle")
    assert "scontrol update PartitionName=lab State=UP" in r.fix
    fake(sinfo_out=SINFO, nodes_out="")
    r = check_class_fit(_ctx(students=1))
    assert r.status == "FAIL" and "partition lab lists no nodes (sinfo -N)" in r.detail


def test_doctor_probe_state_when_squeue_fails_or_forgot_the_job(fake):
    from labkit.doctor.probe import job_state

    fake(squeue_out={"%T|%r|%P": "PENDING|Resources|lab\n"})
    assert job_state("4242", None) == ("PENDING", "Resources")
    fake(squeue_rc=1)
    state, why = job_state("4242", None)
    assert state == "UNKNOWN" and why.startswith("squeue does not answer: slurm_load_jobs error: "
                                                 "Unable to contact slurm controller")
    fake(squeue_out="")
    assert job_state("4242", None) == (None, "")
    # squeue -j of a job the controller has forgotten (MinJobAge passed) fails, with this text
    fake(squeue_rc=1, squeue_err="slurm_load_jobs error: Invalid job id specified\n")
    assert job_state("4242", None) == (None, "")


# --- the job monitor's queue line -------------------------------------------------------------
def test_pending_reason_names_the_place_in_the_queue(fake):
    from labkit.backends.queue import pending_reason

    f = fake(squeue_out={"%T|%r|%P": "PENDING|Resources|lab\n", "%i": "4240\n4242\n4243\n"})
    assert pending_reason("4242") == "Resources, 2nd of 3 pending in partition lab"
    assert ["squeue", "--noheader", "-t", "PENDING", "-p", "lab", "--sort=-p,i", "-o", "%i"] \
        in f.calls
    fake(squeue_out={"%T|%r|%P": "RUNNING|None|lab\n"})
    assert pending_reason("4242") is None
    fake(squeue_rc=1)
    assert pending_reason("4242") is None


# --- the class view ---------------------------------------------------------------------------
def _class_job(fake, run_root):
    fake(squeue_out=queued("nb01"))
    job = submit(RunConfig(name="nb01"), backend="slurm", cluster=PROFILE)
    uid = job.run_dir.stat().st_uid
    return job, {"%i|%T|%U|%j": f"4242|RUNNING|{uid}|{slurm_job_name('nb01')}\n"}


def test_class_view_when_squeue_fails(fake, run_root, caplog):
    from labkit import classroom

    job, table = _class_job(fake, run_root)
    fake(squeue_out=table)
    assert classroom._class_states([job]) == {"4242": JobState.RUNNING}
    fake(squeue_rc=1)
    assert classroom._class_states([job]) == {"4242": JobState.UNKNOWN}
    (job.run_dir / "exit_code").write_text("0\n")
    assert classroom._class_states([job]) == {"4242": JobState.COMPLETED}


def test_class_cancel_error_paths(fake, run_root):
    from labkit import classroom

    job, table = _class_job(fake, run_root)
    f = fake(squeue_rc=1)
    with pytest.raises(LabkitError, match=r"cannot cancel Slurm job 4242 .*squeue does not "
                                          r"answer \(exit 1: slurm_load_jobs error"):
        classroom._class_cancel(job)
    f = fake(squeue_out={"%i|%T|%U|%j": "4242|RUNNING|0|someone_else\n"})
    with pytest.raises(LabkitError, match="is not run 'nb01' of .* any more; left alone"):
        classroom._class_cancel(job)
    assert not any(c[0] == "scancel" for c in f.calls)
    fake(squeue_out=table, scancel_rc=1)
    with pytest.raises(LabkitError, match=r"scancel 4242 failed \(exit 1\): scancel: error: "
                                          r"Kill job error"):
        classroom._class_cancel(job)
    f = fake(squeue_out=table)
    classroom._class_cancel(job)
    assert f.calls[-1] == ["scancel", "4242"]


# --- requeued jobs: which attempt, how the last one ended, what comes next ---------------------
FAULTS = Path(__file__).parent / "fixtures" / "attempts"
NODE2_DOWN = "node2|down|pulled for a test\nnode2|down|pulled for a test\n"  # real sinfo -R -N


def _log_until(name: str, stop: str) -> str:
    """A real log of the mini-cluster (fixtures/attempts) as it was when ``stop`` was written."""
    text = (FAULTS / name).read_text()
    return text[:text.index(stop)]


def test_a_requeued_job_says_its_attempt_how_the_last_ended_and_which_node_is_down(fake, run_root):
    fake(scontrol_rc=0, scontrol_out=(FAULTS / "scontrol_pending_requeued.txt").read_text(),
         squeue_out={"%T|%r|%P": "PENDING|BeginTime|lab\n", "%i": "59572551\n"},
         reasons_out=NODE2_DOWN)
    run_dir = run_root / "nf2"
    run_dir.mkdir()
    (run_dir / "log.txt").write_text(_log_until("minicluster_node_failure_requeued.txt",
                                                "[job] attempt 2 "))
    job = Job(job_id="59572551", name="nf2", run_dir=run_dir, backend="slurm",
              info={"slurm_conf": None})
    assert job.status_line(JobState.PENDING) == (
        "PENDING (requeued, attempt 2; attempt 1 ended: node failure, last iteration 10; node2 "
        "down: pulled for a test; BeginTime, 1st of 1 pending in partition lab)")


def test_a_node_failure_names_the_node_the_attempt_and_the_checkpoint_to_resume(fake, run_root):
    from labkit.backends.diagnosis import failure_error

    fake(reasons_out=NODE2_DOWN)
    run_dir = run_root / "nf2"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("5\n")
    (run_dir / "log.txt").write_text(_log_until("minicluster_node_failure_requeued.txt",
                                                "[job] attempt 2 "))
    job = Job(job_id="59572551", name="nf2", run_dir=run_dir, backend="slurm", info={})
    msg = str(failure_error(job, JobState.NODE_FAIL))
    assert ("Likely cause: Slurm ended job 59572551: a node of the job failed (NODE_FAIL); "
            "attempt 1 ended: node failure at iteration 10; out of service: node2 down (pulled "
            "for a test); its last checkpoint is iteration 5: `labkit submit CONFIG --resume` "
            "goes on from there") in msg


def test_a_save_on_the_warning_signal_without_requeue_says_so(fake, run_root):
    from labkit.backends.diagnosis import failure_error

    fake()
    run_dir = run_root / "tl"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("210\n")
    (run_dir / "exit_code").write_text("75\n")
    (run_dir / "log.txt").write_text(_log_until("minicluster_time_limit_warning_requeued.txt",
                                                "[job] requeueing"))
    job = Job(job_id="59572550", name="tl", run_dir=run_dir, backend="slurm", info={})
    msg = str(failure_error(job, JobState.FAILED))
    assert ("the training saved a checkpoint on Slurm's warning signal (time limit or "
            "preemption) and stopped (exit code 75); attempt 1 ended: saved on SIGUSR1 at "
            "iteration 210; its last checkpoint is iteration 210") in msg


def test_a_node_in_two_partitions_is_listed_once(fake):
    """`sinfo -N` prints a node once per partition (the mini-cluster's lab and urgent)."""
    fake(nodes_out="node1|10.77.0.11|idle|2\nnode1|10.77.0.11|idle|2\n"
                   "node2|10.77.0.12|alloc|2\nnode2|10.77.0.12|alloc|2\n")
    assert slurmcli.node_addresses(None) == [("node1", "10.77.0.11", "idle", 2),
                                             ("node2", "10.77.0.12", "alloc", 2)]
