"""The local backend (the embedded default): a job's simulated nodes as real processes here.

``submit`` renders ``job.sh`` (one torchrun agent per simulated node, rendezvous on 127.0.0.1
at a free port) and starts it in its own session, so the launcher and its agents form one
process group with stdout/stderr in ``log.txt``. The launcher writes ``exit_code``. ``cancel``
signals exactly that group plus the workers torchrun started in sessions of their own (found
by walking the process tree down from the launcher), and nothing else.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from labkit.backends.job import Job, JobState
from labkit.backends.spec import JobSpec, as_spec
from labkit.config import RunConfig
from labkit.render import render_local
from labkit.site import ClusterProfile

CANCELLED_MARK = "cancelled"
# Popen objects of jobs this process started: polling them reaps the launcher (no zombies).
_CHILDREN: dict[int, subprocess.Popen] = {}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the rendezvous port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgrp, start time in clock ticks) of a live process, else None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[2]), int(fields[19])


def _alive(pid: int, start: int | None) -> bool:
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        return False
    st = _stat(pid)
    return st is not None and st[0] != "Z" and (start is None or st[3] == start)


def submit(spec: JobSpec | RunConfig, run_dir: Path, *, cluster: ClusterProfile | None = None,
           program: str | Path | None = None, program_args: Sequence[str] | None = None) -> Job:
    """Start the job on this machine (``cluster`` is not read: the local backend has no site)."""
    spec = as_spec(spec)
    (run_dir / CANCELLED_MARK).unlink(missing_ok=True)  # a resumed run starts afresh
    script = run_dir / "job.sh"
    script.write_text(render_local(spec, run_dir, program=program, program_args=program_args))
    script.chmod(0o755)
    port = free_port()
    env = {**os.environ, "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
    with open(run_dir / "log.txt", "ab") as log:
        p = subprocess.Popen(["bash", str(script)], stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, cwd=run_dir, env=env,
                             start_new_session=True)
    _CHILDREN[p.pid] = p
    st = _stat(p.pid)
    info = {"pid": p.pid, "pgid": p.pid, "start_ticks": st[3] if st else None, "port": port,
            "host": socket.gethostname()}
    return Job(job_id=f"local-{p.pid}", name=spec.name, run_dir=run_dir, backend="local",
               info=info)


def _state(job: Job) -> JobState:
    pid, start = job.info.get("pid"), job.info.get("start_ticks")
    if pid and job.info.get("host", socket.gethostname()) != socket.gethostname():
        return JobState.UNKNOWN  # started on another machine: its processes are not visible
    if pid and _alive(pid, start):
        return JobState.RUNNING
    if (job.run_dir / CANCELLED_MARK).exists():
        return JobState.CANCELLED
    code = job.exit_code()
    if code == 0:
        return JobState.COMPLETED
    # A non-zero exit, or a launcher that died before it could write exit_code.
    return JobState.FAILED


def states(jobs: list[Job]) -> dict[str, JobState]:
    return {j.job_id: _state(j) for j in jobs}


def _descendants(root: int) -> list[tuple[int, int]]:
    """(pid, start ticks) of every process below ``root`` (torchrun's workers included)."""
    children: dict[int, list[tuple[int, int]]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _stat(int(d))
            if st:
                children.setdefault(st[1], []).append((int(d), st[3]))
    out, todo = [], [root]
    while todo:
        for pid, start in children.get(todo.pop(), []):
            out.append((pid, start))
            todo.append(pid)
    return out


def cancel(job: Job, grace: float = 10.0) -> None:
    """SIGTERM the job's process group (torchrun stops its workers), SIGKILL what is left."""
    pid, start = job.info["pid"], job.info.get("start_ticks")
    if not _alive(pid, start):
        return
    (job.run_dir / CANCELLED_MARK).write_text(f"{time.time():.0f}\n")
    tree = _descendants(pid)
    try:
        os.killpg(job.info["pgid"], signal.SIGTERM)
    except ProcessLookupError:
        pass
    end = time.time() + grace
    while time.time() < end and (_alive(pid, start) or any(_alive(p, s) for p, s in tree)):
        time.sleep(0.1)
    for p, s in [(pid, start), *tree]:
        if _alive(p, s):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
    child = _CHILDREN.get(pid)
    if child is not None:
        child.wait(timeout=5)
