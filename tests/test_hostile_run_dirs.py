"""Hostile run directories: links planted in a class's run roots, records and logs that are not
files, racing submissions, a run root someone else made, run names that lead out of the root.

Each attack here once moved, removed, cancelled, hid or hung something; each now gets a clear
error or warning, and nothing outside the owner's own run root is touched.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labkit.errors import ConfigError, LabkitError, SubmissionError

REPO = Path(__file__).resolve().parents[1]
PROGRAM = Path(__file__).parent / "programs" / "ckpt_job.py"
DEAD_PID = 4_000_000  # above Linux's pid_max: no process has it


def _record(d: Path, name: str, *, exit_code: int | None = 0) -> Path:
    """A finished local job's record as labkit writes it (its launcher long gone)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "job.json").write_text(json.dumps({
        "job_id": f"local-{DEAD_PID}", "name": name, "run_dir": str(d), "backend": "local",
        "submitted_at": time.time(), "info": {"pid": DEAD_PID, "pgid": DEAD_PID}}))
    if exit_code is not None:
        (d / "exit_code").write_text(f"{exit_code}\n")
    return d


def _class(tmp_path: Path) -> tuple[Path, Path]:
    site = tmp_path / "site.yaml"
    site.write_text(f"name: class\nrun_root: {tmp_path}/class/{{user}}/runs\n")
    return site, tmp_path / "class"


def _job(name: str, sleep: float = 0.0):
    from labkit.jobs import JobSpec, submit

    return submit(JobSpec(name), program=PROGRAM,
                  program_args=["--run-dir", "{run_dir}", "--bytes", "1000", "--sleep", str(sleep)])


# ---- the instructor's class commands never follow a student's link ----------------------------

def test_class_clean_never_follows_a_students_link_into_another_run(tmp_path, monkeypatch):
    from labkit import classroom

    monkeypatch.delenv("LABKIT_CLUSTER", raising=False)
    site, base = _class(tmp_path)
    a2 = _record(base / "alice" / "runs" / "a2", "a2")
    (a2 / "checkpoints").mkdir()
    (a2 / "checkpoints" / "iter_1.pt").write_text("alice's newest")
    outside = _record(tmp_path / "elsewhere" / "x", "x")
    (outside / "checkpoints").mkdir()
    (base / "mallory" / "runs").mkdir(parents=True)
    (base / "mallory" / "runs" / "evil").symlink_to(a2)
    (base / "mallory" / "runs" / "out").symlink_to(outside)

    listed = classroom.class_clean(str(site), dry_run=True, whole_runs=True)
    assert {(f.user, f.path) for f in listed} == {("alice", str(a2))}  # no link followed
    freed = classroom.class_clean(str(site), keep_last=1)
    assert freed == [] and (a2 / "checkpoints" / "iter_1.pt").exists()
    rows = {r["user"]: r for r in classroom.class_status(str(site))}
    assert [r["name"] for r in rows["alice"]["runs"]] == ["a2"] and rows["mallory"]["runs"] == []


def test_root_acts_only_on_a_job_inside_its_own_students_run_root(tmp_path):
    """The second line of defence: a job listed under mallory whose directory is alice's."""
    from labkit.backends.job import Job
    from labkit.backends.ownership import NotOwnedError
    from labkit.classroom import _need_rights

    _, base = _class(tmp_path)
    a2 = _record(base / "alice" / "runs" / "a2", "a2")
    (base / "mallory" / "runs").mkdir(parents=True)
    job = Job.load(a2)
    roots = {"alice": base / "alice" / "runs", "mallory": base / "mallory" / "runs"}
    with pytest.raises(NotOwnedError, match="not inside your run root"):
        _need_rights([("mallory", job)], "cleaning", roots)
    _need_rights([("alice", job)], "cleaning", roots)  # where it belongs: allowed


# ---- a symlinked run directory: never run in, never followed ---------------------------------

def test_a_run_directory_that_is_a_link_is_refused_and_never_listed(run_root, tmp_path, capsys):
    from labkit.jobs import get_job, list_jobs

    scratch = tmp_path / "scratch" / "x"
    scratch.mkdir(parents=True)
    (run_root / "x").symlink_to(scratch)
    with pytest.raises(SubmissionError, match="is a symbolic link"):
        _job("x")
    assert not any(scratch.iterdir())  # nothing written through it
    _record(scratch, "x")
    assert list_jobs(run_root) == []
    assert "is a symbolic link" in capsys.readouterr().err
    with pytest.raises(LabkitError, match="no labkit job 'x'"):
        get_job("x", run_root)


# ---- records and logs that are not files -------------------------------------------------------

def test_the_reading_door_refuses_fifos_devices_links_and_size(tmp_path):
    from labkit.validate import NotAFileError, read_file_tail, read_small_file, regular_file

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    link.symlink_to("/dev/zero")
    big = tmp_path / "big"
    big.write_bytes(b"x" * 2000)
    for path, why in [(fifo, "not a regular file"), ("/dev/zero", "not a regular file"),
                      (link, "symbolic link"), (tmp_path, "a directory")]:
        with pytest.raises(NotAFileError, match=why):
            read_small_file(path, follow=False)
        assert not regular_file(path)
    with pytest.raises(NotAFileError, match="more than 1,000 bytes"):
        read_small_file(big, 1000)
    assert read_small_file(big, 2000) == b"x" * 2000
    assert read_file_tail(big, 10) == b"x" * 10 and regular_file(big)


def _bounded(argv: list[str], **kw) -> subprocess.CompletedProcess:
    """Run with 2 GB of address space and 60 s: a reader that hangs or floods fails, not the
    machine."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    return subprocess.run(argv, capture_output=True, text=True, timeout=60, preexec_fn=limit,
                          **kw)


@pytest.mark.parametrize("plant", ["record_fifo", "record_zero", "log_zero", "log_fifo"])
def test_special_files_in_a_students_run_neither_hang_nor_flood_the_class_view(tmp_path, plant):
    site, base = _class(tmp_path)
    d = _record(base / "mallory" / "runs" / "r", "r", exit_code=1)
    if plant == "record_fifo":
        (d / "job.json").unlink()
        os.mkfifo(d / "job.json")
    elif plant == "record_zero":
        (d / "job.json").unlink()
        (d / "job.json").symlink_to("/dev/zero")
    elif plant == "log_zero":
        (d / "log.txt").symlink_to("/dev/zero")
    else:
        os.mkfifo(d / "log.txt")
    env = {k: v for k, v in os.environ.items() if k != "LABKIT_CLUSTER"}
    cmds = [["class", "status", "--json"]] + ([["class", "clean", "--dry-run"]]
                                              if plant.startswith("record") else [])
    for cmd in cmds:
        p = _bounded([sys.executable, "-m", "labkit", *cmd, "--cluster", str(site)], env=env,
                     cwd=REPO)
        assert p.returncode == 0, p.stderr[-2000:]
        if plant.startswith("record"):
            assert "cannot tell" in p.stderr and "unreadable labkit job record" in p.stderr
        else:
            row = {r["user"]: r for r in json.loads(p.stdout)}["mallory"]
            assert row["runs"][0]["iteration"] is None and row["last_failure"]["state"] == "FAILED"


def test_a_log_that_is_a_device_gives_an_empty_tail(tmp_path):
    d = _record(tmp_path / "r", "r")
    (d / "log.txt").symlink_to("/dev/zero")
    code = "import sys; from labkit.backends.job import Job; print(repr(Job.load(sys.argv[1]).tail(20)))"
    p = _bounded([sys.executable, "-c", code, str(d)], cwd=REPO)
    assert p.returncode == 0 and p.stdout.strip() == "''", p.stderr[-500:]


# ---- an unreadable record of a live job: "cannot tell", never "nothing there" -----------------

def test_a_live_job_with_an_unreadable_record_is_neither_hidden_nor_moved(run_root, monkeypatch,
                                                                          capsys):
    from labkit.jobs import JobState, list_jobs, submit

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    job = _job("live", sleep=120)
    record = (job.run_dir / "job.json").read_bytes()
    try:
        (job.run_dir / "job.json").write_text("{edited")
        assert list_jobs(run_root) == []
        assert "cannot tell: unreadable labkit job record" in capsys.readouterr().err
        from labkit.jobs import JobSpec

        with pytest.raises(SubmissionError, match="will not move it aside.*unreadable"):
            submit(JobSpec("live"), program=PROGRAM, program_args=["--run-dir", "{run_dir}"],
                   overwrite=True)
        assert (job.run_dir / "job.json").read_text() == "{edited"  # still where it was
        assert not list(run_root.glob("live.old-*"))
    finally:
        (job.run_dir / "job.json").write_bytes(record)
        job.cancel()
    assert job.wait(timeout=60, progress=False) is JobState.CANCELLED


# ---- one claim of a run directory ------------------------------------------------------------

def test_a_run_directory_being_claimed_is_refused_to_a_second_submission(run_root):
    from labkit.run import JobSpec
    from labkit.rundir import CLAIM_FILE, claim_run_dir

    claim = claim_run_dir(JobSpec("race"))  # a submission in progress, in this process
    try:
        with pytest.raises(SubmissionError, match="being claimed by another submission"):
            _job("race")
    finally:
        claim.rollback()
    assert not (run_root / "race").exists()
    # a mark whose process is gone is stale: the next submission takes the directory over
    (run_root / "race").mkdir()
    (run_root / "race" / CLAIM_FILE).write_text(f"{DEAD_PID}\n")
    job = _job("race", sleep=60)
    assert not (job.run_dir / CLAIM_FILE).exists()  # released once the job started
    job.cancel()


RACER = """
import sys, time
from pathlib import Path
from labkit.jobs import JobSpec, submit
go = Path(sys.argv[1])
Path(sys.argv[3]).touch()  # imported: ready to race
while not go.exists():
    time.sleep(0.001)
try:
    job = submit(JobSpec("same"), program=sys.argv[2],
                 program_args=["--run-dir", "{run_dir}", "--bytes", "10", "--sleep", "60"])
except Exception as e:
    print(type(e).__name__, e)
    sys.exit(3)
print(job.job_id)
"""


def test_two_submissions_at_one_moment_one_wins(run_root, tmp_path):
    go = tmp_path / "go"
    env = {**os.environ, "LABKIT_RUN_ROOT": str(run_root), "OMP_NUM_THREADS": "1"}
    ready = [tmp_path / f"ready{i}" for i in range(2)]
    racers = [subprocess.Popen([sys.executable, "-c", RACER, str(go), str(PROGRAM), str(r)],
                               env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True) for r in ready]
    while not all(r.exists() for r in ready) and all(p.poll() is None for p in racers):
        time.sleep(0.01)
    go.touch()  # both start at once (had one started late, the race would only be sequential)
    outs = [(p.wait(timeout=120), p.stdout.read()) for p in racers]
    assert sorted(rc for rc, _ in outs) == [0, 3], outs
    loser = next(out for rc, out in outs if rc == 3)
    assert "SubmissionError" in loser and ("being claimed" in loser or "holds a run" in loser)
    assert len(list(run_root.glob("same*"))) == 1
    from labkit.jobs import get_job

    get_job("same", run_root).cancel()


# ---- a run root someone else made; a run name that leads out of the root -------------------

def test_a_run_root_made_by_another_user_is_refused(tmp_path, monkeypatch):
    root = tmp_path / "alice" / "runs"
    root.mkdir(parents=True)
    os.chown(root, 65534, 65534)  # made by someone else ("nobody"), e.g. in a 1777 parent
    monkeypatch.setenv("LABKIT_RUN_ROOT", str(root))
    with pytest.raises(SubmissionError, match=r"run root .* belongs to .*uid 65534.*not to you"):
        _job("x")
    assert not any(root.iterdir())


@pytest.mark.parametrize("name", ["../escape", "/etc/x", "a/b", "..", ".hidden"])
def test_record_refuses_a_run_name_that_leads_out_of_the_run_root(run_root, monkeypatch, name):
    from labkit.record import record

    monkeypatch.delenv("LABKIT_METRICS_FILE", raising=False)
    with pytest.raises(ConfigError, match="run name"):
        record("x", 1.0, run_name=name)
    assert not (run_root.parent / "escape").exists() and not any(run_root.iterdir())
