"""The local backend with real processes: torchrun agents per simulated node, gloo, exit codes.

The job program is tests/programs/allreduce_job.py (a real gloo all-reduce over every rank);
the engine's own end-to-end runs are in the engine and slurm tiers.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from labkit.backends import local as local_backend
from labkit.config import RunConfig
from labkit.errors import JobFailedError, LabkitError, SubmissionError
from labkit.jobs import Job, JobState, get_job, list_jobs, submit

PROGRAM = Path(__file__).parent / "programs" / "allreduce_job.py"


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _cfg(name: str, **kw) -> RunConfig:
    base = dict(name=name, nodes=2, gpus_per_node=1, train_iters=3)
    return RunConfig(**{**base, **kw})


def test_two_nodes_two_processes_complete(run_root):
    cfg = _cfg("tp2pp2", gpus_per_node=2, tensor_model_parallel_size=2,
               pipeline_model_parallel_size=2)
    job = submit(cfg, program=PROGRAM)
    polls = []
    assert job.wait(timeout=240, progress=True, on_poll=lambda j, s: polls.append(s)) \
        is JobState.COMPLETED, job.tail(40)
    assert polls and polls[-1] is JobState.COMPLETED
    log = job.log_path.read_text()
    assert "using world size: 4," in log
    assert log.count("all-reduce ok (10)") == 4  # 1+2+3+4 on every rank
    assert job.exit_code() == 0
    d = run_root / "tp2pp2"
    for f in ("config.json", "job.sh", "job.json", "log.txt", "exit_code", "plan.json"):
        assert (d / f).exists(), f
    assert json.loads((d / "plan.json").read_text())["layout"]["world_size"] == 4
    again = Job.load(d)
    assert again.job_id == job.job_id and again.state() is JobState.COMPLETED
    assert [j.job_id for j in list_jobs()] == [job.job_id]
    assert set(job.to_dict()) == {"job_id", "name", "run_dir", "backend", "state"}
    assert get_job("tp2pp2").job_id == job.job_id
    # Nothing a user made is overwritten: the same name again is refused.
    with pytest.raises(SubmissionError, match="already holds a run"):
        submit(cfg, program=PROGRAM)


def test_failing_job_ends_failed_with_log_tail(run_root):
    job = submit(_cfg("boom", extra={"fail": True}), program=PROGRAM)
    with pytest.raises(JobFailedError) as e:
        job.wait(timeout=240, progress=False, raise_on_failure=True)
    assert e.value.state == "FAILED" and job.state() is JobState.FAILED
    assert "failing on purpose" in str(e.value)
    assert str(job.log_path) in str(e.value)
    assert job.exit_code() not in (None, 0)


def test_cancel_kills_exactly_its_processes(run_root):
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        job = submit(_cfg("long", extra={"sleep": 300, "iters": 300}), program=PROGRAM)
        # Wait until the workers exist (torchrun starts them in sessions of their own).
        deadline = time.time() + 240
        while _workers(job) < 2:
            assert job.state() is JobState.RUNNING, job.tail(30)
            assert time.time() < deadline, "workers did not start"
            time.sleep(0.5)
        tree = local_backend._descendants(job.info["pid"])
        assert len(tree) >= 4  # 2 agents + 2 workers at least
        job.cancel()
        assert job.state() is JobState.CANCELLED
        alive = [p for p, s in tree if local_backend._alive(p, s)]
        assert not alive, f"still alive after cancel: {alive}"
        assert bystander.poll() is None, "cancel touched a process that is not the job's"
        assert Job.load(job.run_dir).state() is JobState.CANCELLED
    finally:
        bystander.kill()


def _workers(job: Job) -> int:
    n = 0
    for p, _ in local_backend._descendants(job.info["pid"]):
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes()
        except OSError:
            continue
        n += b"allreduce_job.py" in cmd and b"torchrun" not in cmd
    return n


def test_unknown_job_is_refused(run_root):
    with pytest.raises(LabkitError, match="only acts on jobs it submitted"):
        get_job("12345")


def test_local_launcher_stops_other_nodes_when_one_fails(run_root, tmp_path):
    """A node that fails makes the launcher stop the others (no hang on a dead rendezvous)."""
    prog = tmp_path / "crash.py"
    prog.write_text("import os, sys, time\n"
                    "sys.exit(3) if os.environ['GROUP_RANK'] == '1' else time.sleep(300)\n")
    job = submit(_cfg("crash"), program=prog)
    assert job.wait(timeout=120, progress=False) is JobState.FAILED
    assert job.exit_code() != 0
    assert os.path.exists(job.run_dir / "exit_code")


@pytest.mark.engine
def test_cli_submit_wait_status_logs_with_the_engine(run_root, tmp_path, capsys):
    from labkit.cli import main as cli

    cfg_path = tmp_path / "cfg.json"
    RunConfig(name="cli_engine", nodes=2, gpus_per_node=1, train_iters=3).to_json(cfg_path)
    assert cli(["submit", str(cfg_path), "--wait", "--json", "--timeout", "400"]) == 0
    out = json.loads(capsys.readouterr().out)  # stdout holds only the JSON document
    assert out["state"] == "COMPLETED" and out["backend"] == "local", out
    assert out["run_dir"] == str(run_root / "cli_engine")
    assert cli(["status", "--json"]) == 0
    assert [r["job_id"] for r in json.loads(capsys.readouterr().out)] == [out["job_id"]]
    assert cli(["status"]) == 0 and "COMPLETED" in capsys.readouterr().out
    assert cli(["logs", "cli_engine"]) == 0
    log = capsys.readouterr().out
    assert "using world size: 2," in log and "iteration        2/" in log
    assert cli(["cancel", "cli_engine"]) == 0  # finished: nothing to kill, state stays
    assert "COMPLETED" in capsys.readouterr().out


def test_hostile_run_root_runs_and_stays_inert(tmp_path, monkeypatch):
    root = tmp_path / "runs 1" / "a'b \"c\" $(touch PWNED); `touch PWNED2`; x"
    root.mkdir(parents=True)
    monkeypatch.setenv("LABKIT_RUN_ROOT", str(root))
    job = submit(_cfg("hostile"), program=PROGRAM)
    assert job.wait(timeout=240, progress=False) is JobState.COMPLETED, job.tail(30)
    assert "using world size: 2," in (root / "hostile" / "log.txt").read_text()
    assert (root / "hostile" / "exit_code").read_text().strip() == "0"
    assert not list(tmp_path.rglob("PWNED*")) and not list(Path("/work/main").glob("PWNED*"))


def _launch_sleeper(run_dir: Path) -> Job:
    run_dir.mkdir(parents=True)
    (run_dir / "job.sh").write_text('sleep 1\necho 0 > "$PWD/exit_code"\n')
    return local_backend.start_launcher("sleeper", run_dir, "local")


def test_a_job_is_running_from_its_first_poll(tmp_path):
    """Popen returns while the launcher may still be inside execve, where /proc/PID/environ
    reads empty (about half the launches on this machine under load); a state read then must
    not be FAILED (Job.state() keeps a finished state for good). Whether a poll lands in that
    window depends on the machine's load; the next test holds the window open."""
    jobs, first = [], []
    for i in range(20):
        jobs.append(_launch_sleeper(tmp_path / f"j{i}"))
        first.append(local_backend.states(jobs[-1:])[jobs[-1].job_id])
    assert first == [JobState.RUNNING] * len(jobs)
    assert [j.wait(timeout=120, progress=False) for j in jobs] == [JobState.COMPLETED] * len(jobs)


def test_a_launcher_inside_exec_is_running_but_never_signalled(tmp_path, monkeypatch):
    job = _launch_sleeper(tmp_path / "j")
    real_read = Path.read_bytes
    environ = f"/proc/{job.info['pid']}/environ"
    in_exec = {"environ": b""}  # what execve shows for a moment

    def read_bytes(self):
        return in_exec["environ"] if str(self) == environ else real_read(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    # (the launcher alone: its child `sleep` carries the token and counts as running anyway)
    assert local_backend.launcher_alive(job)
    assert local_backend._launcher(job) is None  # cancel needs the token: nothing signalled
    # An environment that reads but lacks the token is another program's: not this job.
    in_exec["environ"] = b"PATH=/usr/bin\0"
    assert not local_backend.launcher_alive(job)
    monkeypatch.undo()
    assert job.wait(timeout=120, progress=False) is JobState.COMPLETED


def test_rendezvous_port_is_outside_the_ephemeral_range():
    """torchrun binds the port seconds after it is chosen; a port from the kernel's ephemeral
    range could meanwhile go to any outgoing connection, so it never comes from there."""
    import socket

    low, high = local_backend._ephemeral_range()
    for _ in range(200):
        port = local_backend.free_port()
        assert not low <= port <= high and 1024 <= port <= 65535, (port, low, high)
    with socket.socket() as s:  # and nothing listens on it
        s.bind(("127.0.0.1", local_backend.free_port()))


def test_rendezvous_port_held_by_a_listener_is_never_chosen(monkeypatch):
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        # Leave the held port as the only candidate: free_port must refuse, not return it.
        monkeypatch.setattr(local_backend, "_ephemeral_range", lambda: (10000, 65535))
        monkeypatch.setattr(local_backend, "_PORT_FLOOR", port)
        with pytest.raises(OSError, match="no free TCP port"):
            local_backend.free_port()
