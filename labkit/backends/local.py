"""The local backend (the embedded default): a job's simulated nodes as real processes here.

``submit`` renders ``job.sh`` (one torchrun agent per simulated node, rendezvous at a free port)
and starts it in its own session, so the launcher and its agents form one process group with
stdout/stderr in ``log.txt``. The launcher writes ``exit_code``. A job of more than one node
gets each node as a rootless network namespace with a shaped link (``labkit.nodenet``, its
``node_link.json`` in the run directory): the script then runs as PID 1 of the job's own
namespaces, so when it ends or its launcher is killed every process of the job ends too. Where
that is refused, or for one node, every node talks over 127.0.0.1.

Every process of the job carries a random token in its environment (``LABKIT_JOB_TOKEN``,
inherited by torchrun's agents and by the workers it starts in sessions of their own), so the
job's processes are found even after the launcher or an agent died with ``kill -9`` and left
orphans behind: while any of them lives the job is RUNNING, and ``cancel`` ends them all. Only
processes of the caller's own user that carry the token (and a launcher whose start time,
process group and token match the record) are ever signalled.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from labkit import nodenet
from labkit.backends.job import Job
from labkit.render import render_local
from labkit.run.spec import JobSpec
from labkit.run.state import JobState
from labkit.site import ClusterProfile

CANCELLED_MARK = "cancelled"
TOKEN_ENV = "LABKIT_JOB_TOKEN"
_TOKEN_RE = re.compile(r"[0-9a-f]{32}\Z")
# Popen objects of jobs this process started: polling them reaps the launcher (no zombies).
_CHILDREN: dict[int, subprocess.Popen] = {}


_PORT_FLOOR = 10000  # rendezvous ports come from [_PORT_FLOOR, 65535] less the ephemeral range


def _ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out to outgoing connections (and to ``bind(port 0)``)."""
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    return low, high


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the rendezvous port).

    The port is chosen outside the kernel's ephemeral range: torchrun binds it seconds later, and
    a port from that range can meanwhile be given to any outgoing connection (gloo opens many),
    which made the rendezvous fail by chance with "address already in use"."""
    low, high = _ephemeral_range()
    candidates = [p for p in range(_PORT_FLOOR, 65536) if not low <= p <= high] or [_PORT_FLOOR]
    rng = secrets.SystemRandom()
    for _ in range(200):
        port = rng.choice(candidates)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError(f"no free TCP port on 127.0.0.1 outside the ephemeral range {low}-{high}")


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


def submit(spec: JobSpec, run_dir: Path, *, cluster: ClusterProfile | None = None,
           program: str | Path | None = None, program_args: Sequence[str] | None = None) -> Job:
    """Start the job on this machine (of ``cluster``, the site, only ``local_link`` is read)."""
    (run_dir / CANCELLED_MARK).unlink(missing_ok=True)  # a resumed run starts afresh
    script = run_dir / "job.sh"
    text, link, why_not = job_script(spec, run_dir, cluster=cluster, program=program,
                                     program_args=program_args)
    nodenet.write_record(run_dir, spec.nodes, link, why_not)
    script.write_text(text)
    script.chmod(0o755)
    return start_launcher(spec.name, run_dir, "local", env={"OMP_NUM_THREADS": "1"})


def job_script(spec: JobSpec, run_dir: Path, *, cluster: ClusterProfile | None = None,
               program: str | Path | None = None, program_args: Sequence[str] | None = None,
               quiet: bool = False) -> tuple[str, nodenet.Link | None, str | None]:
    """(the job script ``submit`` runs for ``spec``, the nodes' link, why there is none). More
    than one node: each node a rootless network namespace with a shaped link where this user
    may build one (``labkit.nodenet``; ``cluster.local_link`` and the environment set it); else
    all nodes on this machine's loopback. ``quiet``: a refusal is not logged (rendering)."""
    link, why_not = nodenet.local_link(spec.nodes, cluster.local_link if cluster else None,
                                       quiet=quiet)
    net = nodenet.shell_parts(spec.nodes, link) if link else None
    return (render_local(spec, run_dir, program=program, program_args=program_args,
                         nodes_net=net), link, why_not)


def start_launcher(name: str, run_dir: Path, backend: str, *, env: dict[str, str] | None = None,
                   info: dict | None = None) -> Job:
    """Start ``run_dir/job.sh`` here, in a session of its own (the launcher and what it starts
    form one process group), stdout/stderr appended to ``log.txt``, with ``env`` and a fresh
    rendezvous port (``MASTER_PORT``, ``free_port``) and job token (``LABKIT_JOB_TOKEN``) in its
    environment. The Job (id ``BACKEND-PID``) records the launcher's pid, process group, start
    time, port, host and token, and ``info``. What the local and hostfile backends share."""
    port = free_port()
    token = secrets.token_hex(16)
    full_env = {**os.environ, **(env or {}), "MASTER_PORT": str(port), TOKEN_ENV: token}
    with open(run_dir / "log.txt", "ab") as log:
        p = subprocess.Popen(["bash", str(run_dir / "job.sh")], stdout=log,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=run_dir,
                             env=full_env, start_new_session=True)
    _CHILDREN[p.pid] = p
    # Popen returns while the kernel may still be inside execve, where /proc/PID/environ reads
    # empty (half the time here under load): wait until the token shows, so the first status
    # or cancel can verify the launcher.
    end = time.time() + 10
    while _env_token(p.pid) is None and p.poll() is None and time.time() < end:
        time.sleep(0.005)
    st = _stat(p.pid)
    record = {"pid": p.pid, "pgid": p.pid, "start_ticks": st[3] if st else None, "port": port,
              "host": socket.gethostname(), "token": token, **(info or {})}
    return Job(job_id=f"{backend}-{p.pid}", name=name, run_dir=run_dir, backend=backend,
               info=record)


def launcher_alive(job: Job) -> bool:
    """True while the job's launcher (``start_launcher``) runs: verifiably the job's own
    (``_launcher``), or the recorded process still inside ``execve``, where
    ``/proc/PID/environ`` reads empty for a moment (on a loaded machine the first poll can
    land there). What decides a job's state; only ``_launcher`` lets a process be signalled."""
    return _launcher(job) is not None or _launcher(job, in_exec=True) is not None


def _token(job: Job) -> bytes | None:
    t = job.info.get("token")
    return t.encode() if isinstance(t, str) and _TOKEN_RE.fullmatch(t) else None


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 1 < v < 2**31 else None


def _env_token(pid: int) -> bytes | None:
    """The job token in the environment of ``pid`` when it is the caller's process."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.geteuid():
            return None
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    m = re.search(rb"(?:^|\0)" + TOKEN_ENV.encode() + rb"=([0-9a-f]{32})(?:\0|$)", env)
    return m.group(1) if m else None


def _launcher(job: Job, in_exec: bool = False) -> tuple[int, int] | None:
    """(pid, start ticks) of the job's launcher when it lives and is verifiably the job's:
    the recorded start time, the recorded process group (the one it leads), the caller's user
    and the job's token. A record without a start time or a token is never trusted.
    ``in_exec``: the same checks, but an environment that still reads empty stands in for
    the token (what ``launcher_alive`` accepts; never enough to signal)."""
    pid, start, pgid = (_int(job.info.get("pid")), job.info.get("start_ticks"),
                        _int(job.info.get("pgid")))
    if pid is None or pgid != pid or isinstance(start, bool) or not isinstance(start, int) \
            or _token(job) is None or not _alive(pid, start):
        return None
    st = _stat(pid)
    if st is None or st[2] != pgid:
        return None
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.geteuid():
            return None
    except OSError:
        return None
    if in_exec:
        try:
            return None if Path(f"/proc/{pid}/environ").read_bytes() else (pid, start)
        except OSError:
            return None
    if _env_token(pid) != _token(job):
        return None
    return pid, start


def _scan() -> dict[bytes, list[tuple[int, int]]]:
    """{job token: [(pid, start ticks)]} of the caller's live processes that carry one."""
    out: dict[bytes, list[tuple[int, int]]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != os.getpid():
            token = _env_token(int(d))
            st = _stat(int(d)) if token else None
            if token and st and st[0] != "Z":
                out.setdefault(token, []).append((int(d), st[3]))
    return out


def _members(job: Job, scan: dict[bytes, list[tuple[int, int]]] | None = None
             ) -> list[tuple[int, int]]:
    """(pid, start ticks) of every live process of the job: those of the caller's user that
    carry its token (the launcher, the agents, and workers orphaned or not)."""
    token = _token(job)
    if token is None:
        return []
    return (scan if scan is not None else _scan()).get(token, [])


def _state(job: Job, scan: dict[bytes, list[tuple[int, int]]] | None = None) -> JobState:
    if job.info.get("host", socket.gethostname()) != socket.gethostname():
        return JobState.UNKNOWN  # started on another machine: its processes are not visible
    if launcher_alive(job) or _members(job, scan):
        return JobState.RUNNING  # orphans of a killed launcher or agent count: they still run
    if (job.run_dir / CANCELLED_MARK).exists():
        return JobState.CANCELLED
    code = job.exit_code()
    if code == 0:
        return JobState.COMPLETED
    # A non-zero exit, or a launcher that died before it could write exit_code.
    return JobState.FAILED


def states(jobs: list[Job]) -> dict[str, JobState]:
    scan = _scan() if any(_token(j) for j in jobs) else {}
    return {j.job_id: _state(j, scan) for j in jobs}


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


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def _signal(pid: int, start: int, sig: int) -> None:
    if _alive(pid, start):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def cancel(job: Job, grace: float = 10.0) -> None:
    """SIGTERM the job's process group (torchrun stops its workers) and every other process
    carrying the job's token (orphans); SIGKILL what is left after ``grace`` seconds."""
    launcher = _launcher(job)
    members = _members(job)
    if launcher is None and not members:
        return
    (job.run_dir / CANCELLED_MARK).write_text(f"{time.time():.0f}\n")
    if launcher is not None:
        try:
            os.killpg(launcher[0], signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    for pid, start in members:  # one SIGTERM each: a second one strikes torchrun's handler of the first
        if launcher is None or _pgid(pid) != launcher[0]:
            _signal(pid, start, signal.SIGTERM)
    procs = ([launcher] if launcher else []) + members
    end = time.time() + grace
    while time.time() < end and any(_alive(p, s) for p, s in procs):
        time.sleep(0.1)
    procs += _members(job)
    for pid, start in procs:
        _signal(pid, start, signal.SIGKILL)
    end = time.time() + 10  # SIGKILL is delivered asynchronously: wait until they are gone
    while time.time() < end and any(_alive(p, s) for p, s in procs):
        time.sleep(0.05)
    reap(job)


def reap(job: Job) -> None:
    """Collect the exit of the job's launcher when this process started it (no zombie)."""
    child = _CHILDREN.get(job.info.get("pid", -1))
    if child is not None:
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def failure_hint(job: Job, state: JobState) -> str | None:
    """For a job whose node was killed (exit code 137 = 128 + SIGKILL: a node's processes died
    at once, as when a machine fails, or the kernel's OOM killer struck): what happened and the
    checkpoint to go on from (read by ``labkit.backends.diagnosis``); None otherwise."""
    if state is not JobState.FAILED or job.exit_code() != 128 + signal.SIGKILL:
        return None
    try:
        ckpt = (job.run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text()
    except OSError:
        ckpt = ""
    go_on = (f"its last complete checkpoint is iteration {ckpt.strip()}: launch(cfg, "
             f"resume=True) (`labkit submit CONFIG --resume`) goes on from there"
             if ckpt.strip().isdigit() else "it saved no checkpoint: run it again")
    return (f"a node's processes were killed (SIGKILL: exit code 137): a node that died, or the "
            f"kernel's OOM killer (dmesg says which); the job script then stopped the other "
            f"nodes, whose torchrun reports 'got signal: 15' (that stop, not the cause); {go_on}")
