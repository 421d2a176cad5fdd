"""Job records and run directories under attack: forged and malformed job.json files, a
running job's directory, a failed submission, a full disk, kill -9 of each process of a job.

The jobs are real (tests/programs/allreduce_job.py under torchrun on the local backend); the
only fake is Slurm's ``sbatch`` refusing (no controller), at the subprocess boundary.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import skip_or_fail

from labkit import slurmcli
from labkit.backends import local as local_backend
from labkit.backends.ownership import NotOwnedError
from labkit.cli import main as cli
from labkit.config import RunConfig
from labkit.errors import ConfigError, LabkitError, SubmissionError
from labkit.jobs import Job, JobState, get_job, list_jobs, submit
from labkit.rundir import claim_run_dir, prepare_run_dir
from labkit.site import ClusterProfile

PROGRAM = Path(__file__).parent / "programs" / "allreduce_job.py"


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _cfg(name: str, **kw) -> RunConfig:
    return RunConfig(**{**dict(name=name, nodes=1, gpus_per_node=2, train_iters=3), **kw})


def _finished_run(name: str, code: str = "0") -> Path:
    """A run directory as a finished submission leaves it (record, log, exit code)."""
    d = prepare_run_dir(_cfg(name))
    (d / "log.txt").write_text("earlier run's log\n")
    (d / "exit_code").write_text(code + "\n")
    Job(job_id="local-1", name=name, run_dir=d, backend="local",
        info={"pid": 1, "pgid": 1, "start_ticks": 1, "token": "0" * 32}).save()
    return d


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>"
            for p in sorted(root.rglob("*"))}


# --- records -----------------------------------------------------------------------------------
MALFORMED = [b"", b"not json", b"[]", b"{}", b'{"job_id": 1}', b"\xff\xfe\x00garbage",
             b'{"job_id": "1", "name": "x\\n", "backend": "local"}',
             b'{"job_id": "$(id)", "name": "a", "backend": "local"}',
             b'{"job_id": "1", "name": "a", "backend": "local", "info": 5}',
             b'{"job_id": "1", "name": "a", "backend": "local", "submitted_at": "x"}',
             b'{"job_id": "1", "name": "a", "backend": "../../x"}',
             b"[" * 100_000]


def test_malformed_records_never_break_status(run_root, capsys):
    good = _finished_run("good")
    for i, raw in enumerate(MALFORMED):
        d = run_root / f"bad{i}"
        d.mkdir()
        (d / "job.json").write_bytes(raw)
        with pytest.raises(LabkitError):
            Job.load(d)
    d = run_root / "otherbackend"
    d.mkdir()
    (d / "job.json").write_text('{"job_id": "1", "name": "a", "backend": "nosuch"}')
    assert cli(["status", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["run_dir"] for r in rows if r["name"] == "good"] == [str(good)]
    assert cli(["status"]) == 0
    assert cli(["cancel", str(run_root / "bad1")]) == 1
    assert "labkit cancel:" in capsys.readouterr().err


def test_forged_record_signals_nothing(run_root, tmp_path, capsys):
    """A record naming a process labkit did not start (no start time, or the wrong one, or no
    token) is never signalled, whatever it claims."""
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        start = local_backend._stat(bystander.pid)[3]
        for i, info in enumerate([
                {"pid": bystander.pid, "pgid": bystander.pid},  # no start time
                {"pid": bystander.pid, "pgid": bystander.pid, "start_ticks": start},  # no token
                {"pid": bystander.pid, "pgid": bystander.pid, "start_ticks": start + 1,
                 "token": "a" * 32},
                {"pid": bystander.pid, "pgid": 1, "start_ticks": start, "token": "b" * 32}]):
            d = run_root / f"forged{i}"
            d.mkdir()
            Job(job_id=f"local-{bystander.pid}", name=f"forged{i}", run_dir=d, backend="local",
                info=info).save()
            job = Job.load(d)
            assert job.state() is JobState.FAILED
            assert job.cancel() is False
            assert cli(["cancel", str(d)]) == 0 and "nothing to cancel" in capsys.readouterr().out
            assert bystander.poll() is None, info
        # A record outside the caller's run root is refused, even by path.
        out = tmp_path / "elsewhere" / "x"
        out.mkdir(parents=True)
        Job(job_id="local-7", name="x", run_dir=out, backend="local",
            info={"pid": bystander.pid, "pgid": bystander.pid, "start_ticks": start}).save()
        with pytest.raises(NotOwnedError, match="not inside your run root"):
            get_job(str(out))
        assert cli(["cancel", str(out)]) == 1
        assert bystander.poll() is None
    finally:
        bystander.kill()


def test_records_of_other_users_are_not_listed(run_root):
    if os.geteuid() != 0:
        skip_or_fail("chown to another user needs root")
    mine = _finished_run("mine")
    theirs = _finished_run("theirs")
    os.chown(theirs / "job.json", 65534, 65534)
    os.chown(theirs, 65534, 65534)
    assert [j.run_dir for j in list_jobs()] == [mine]
    with pytest.raises(NotOwnedError, match="belongs to user id 65534"):
        get_job(str(theirs))


# --- run directories ---------------------------------------------------------------------------
def test_moved_aside_record_points_at_its_own_directory(run_root):
    d = _finished_run("again", code="1")
    claim = claim_run_dir(_cfg("again", seed=7), overwrite=True)
    assert claim.aside is not None and claim.dir == d
    rec = json.loads((claim.aside / "job.json").read_text())
    assert rec["run_dir"] == str(claim.aside)
    old = Job.load(claim.aside)
    assert old.run_dir == claim.aside.resolve() and old.exit_code() == 1


def test_failed_submission_leaves_everything_as_it_was(run_root, monkeypatch):
    d = _finished_run("nb05")
    before = _snapshot(run_root)

    def no_controller(cmd, **kw):
        if cmd[:2] == ["sbatch", "--version"]:
            return subprocess.CompletedProcess(cmd, 0, "slurm 23.11.4\n", "")
        return subprocess.CompletedProcess(cmd, 1, "", "sbatch: error: Batch job submission "
                                           "failed: Unable to contact slurm controller")

    monkeypatch.setattr(slurmcli, "run", no_controller)
    site = ClusterProfile()
    for kw in ({"overwrite": True}, {"resume": True}):
        with pytest.raises(SubmissionError, match="slurmctld is not answering"):
            submit(_cfg("nb05"), backend="slurm", cluster=site, **kw)
        assert _snapshot(run_root) == before, kw
    with pytest.raises(SubmissionError):
        submit(_cfg("fresh"), backend="slurm", cluster=site)
    assert not (run_root / "fresh").exists()
    assert Job.load(d).log_path.read_text() == "earlier run's log\n"


def test_resume_refusal_names_the_field(run_root, capsys, tmp_path):
    _finished_run("res")
    cfg = _cfg("res", micro_batch_size=1)
    with pytest.raises(SubmissionError, match=r"micro_batch_size: 2 -> 1"):
        claim_run_dir(cfg, resume=True)
    path = tmp_path / "c.json"
    cfg.to_json(path)
    assert cli(["submit", str(path), "--resume"]) == 1
    err = capsys.readouterr().err
    assert "micro_batch_size" in err and "--overwrite" in err and "=True" not in err


def test_unwritable_run_roots_are_one_line(tmp_path, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for root in (afile, afile / "sub"):
        monkeypatch.setenv("LABKIT_RUN_ROOT", str(root))
        # A run root that is a file is refused where the run root is read (ConfigError); one
        # below a file, where the run directory is made (SubmissionError): one line either way.
        with pytest.raises((ConfigError, SubmissionError),
                           match="cannot write run directory|is a file"):
            submit(_cfg("r"), program=PROGRAM)
    monkeypatch.setenv("LABKIT_RUN_ROOT", "")
    assert cli(["status"]) == 2


@pytest.fixture
def tiny_tmpfs(tmp_path):
    if os.geteuid() != 0:
        skip_or_fail("mounting a tmpfs needs root")
    mnt = tmp_path / "full"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if p.returncode:
        skip_or_fail(f"mount -t tmpfs failed: {p.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_is_named_and_changes_nothing(tiny_tmpfs, monkeypatch):
    root = tiny_tmpfs / "runs"
    root.mkdir()
    monkeypatch.setenv("LABKIT_RUN_ROOT", str(root))
    d = _finished_run("full")
    fd = os.open(tiny_tmpfs / "filler", os.O_WRONLY | os.O_CREAT)
    try:  # fill the disk to the last block
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    before = _snapshot(root)
    for kw in ({"overwrite": True}, {"resume": True}, {}):
        name = "full" if kw else "other"
        with pytest.raises(SubmissionError, match="ENOSPC"):
            submit(_cfg(name), program=PROGRAM, **kw)
        assert _snapshot(root) == before, kw
    assert Job.load(d).exit_code() == 0


# --- kill -9 of each process of a job ----------------------------------------------------------
def _procs(job: Job) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {"launcher": [job.info["pid"]], "agent": [], "worker": []}
    for pid, _ in local_backend._members(job):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if pid == job.info["pid"]:
            continue
        if b"torchrun" in cmd:
            out["agent"].append(pid)
        elif b"allreduce_job.py" in cmd:
            out["worker"].append(pid)
    return out


def _wait_for(pred, timeout: float, what: str) -> None:
    end = time.time() + timeout
    while not pred():
        assert time.time() < end, what
        time.sleep(0.3)


@pytest.mark.parametrize("victim", ["launcher", "agent", "worker"])
def test_kill_9_of_each_process(run_root, victim, capsys):
    job = submit(_cfg(f"k9{victim}", extra={"sleep": 300, "iters": 300}), program=PROGRAM)
    try:
        _wait_for(lambda: len(_procs(job)["worker"]) == 2, 240, "workers did not start")
        # The directory of a running job is never moved aside.
        with pytest.raises(SubmissionError, match=f"labkit cancel {job.job_id}"):
            submit(_cfg(f"k9{victim}"), program=PROGRAM, overwrite=True)
        assert (run_root / f"k9{victim}" / "job.json").exists()
        os.kill(_procs(job)[victim][0], signal.SIGKILL)
        loaded = get_job(job.name)
        if victim == "worker":  # torchrun notices, stops the other worker; the launcher records it
            _wait_for(lambda: Job.load(job.run_dir).state().finished, 120, "job did not end")
            assert Job.load(job.run_dir).state() is JobState.FAILED
            assert not local_backend._members(job)
            assert loaded.cancel() is False
            return
        time.sleep(2)  # what is left keeps running: status must say so, cancel must end it
        assert loaded.state() is JobState.RUNNING, _procs(job)
        assert cli(["status", job.name, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["state"] == "RUNNING"
        assert cli(["cancel", job.name]) == 0
        assert "CANCELLED" in capsys.readouterr().out
        assert not local_backend._members(job)
        assert Job.load(job.run_dir).state() is JobState.CANCELLED
    finally:
        local_backend.cancel(job, grace=2)
