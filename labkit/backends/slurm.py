"""The Slurm backend: ``sbatch --parsable`` to submit; state from squeue, scontrol, the run's
``exit_code`` file and sacct, in that order; ``scancel JOBID`` for labkit's own jobs only.

Every Slurm command goes through ``run_cmd``, the one door tests replace with a FakeSlurm for
what a real Slurm cannot produce on demand (sbatch refusing, squeue unreachable).

Why this order: squeue lists live jobs (and, with ``-t all``, finished ones for MinJobAge);
``scontrol show job`` keeps a finished job a little longer; ``exit_code`` is written by the job
script itself, so a COMPLETED/FAILED answer never depends on accounting; sacct comes last
because a cluster without slurmdbd (like the mini-cluster) answers "accounting storage is
disabled". Jobs are named ``labkit-<user>-<run>`` (``labkit.site.slurm_job_name``), so that
``squeue`` says whose they are; the record keeps the name sbatch was given. A Slurm job whose
name is not that name is not ours: a job id can be reused by a restarted controller, and labkit
must never act on someone else's job.
"""

from __future__ import annotations

import getpass
import os
import re
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from labkit._logging import warn_once
from labkit.backends.job import Job, JobState
from labkit.backends.spec import JobSpec, as_spec
from labkit.config import RunConfig
from labkit.errors import LabkitError, SubmissionError
from labkit.render import render_sbatch, sbatch_options
from labkit.site import ClusterProfile

# Slurm's job states -> ours. Transitional ones count as the state they lead to.
SLURM_STATES = {
    "PENDING": JobState.PENDING, "CONFIGURING": JobState.PENDING, "REQUEUED": JobState.PENDING,
    "REQUEUE_HOLD": JobState.PENDING, "REQUEUE_FED": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING,
    "RUNNING": JobState.RUNNING, "COMPLETING": JobState.RUNNING, "SUSPENDED": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING, "SIGNALING": JobState.RUNNING, "RESIZING": JobState.RUNNING,
    "STOPPED": JobState.RUNNING,
    "COMPLETED": JobState.COMPLETED, "FAILED": JobState.FAILED, "CANCELLED": JobState.CANCELLED,
    "TIMEOUT": JobState.TIMEOUT, "DEADLINE": JobState.TIMEOUT,
    "OUT_OF_MEMORY": JobState.OUT_OF_MEMORY, "NODE_FAIL": JobState.NODE_FAIL,
    "BOOT_FAIL": JobState.NODE_FAIL, "PREEMPTED": JobState.FAILED,
    "SPECIAL_EXIT": JobState.FAILED, "REVOKED": JobState.CANCELLED,
}
_SBATCH_HINTS = [
    ("Requested node configuration is not available",
     "no partition has that many nodes/CPUs/GPUs: compare nodes x gpus_per_node and the "
     "profile's cpus_per_task with `sinfo -N -l`"),
    ("Invalid account", "set `account:` in the cluster profile (`sacctmgr show assoc user=$USER`)"),
    ("invalid partition", "set `partition:` in the cluster profile (`sinfo -s` lists them)"),
    ("Invalid qos", "set or remove `qos:` in the cluster profile"),
    ("time limit", "lower time_limit in the cluster profile (`sinfo -o '%P %l'` shows maxima)"),
    ("Unable to contact slurm controller",
     "slurmctld is not answering: on this machine `sudo labkit cluster up`; on a site, ask its "
     "admins"),
]
POLL_TTL = 1.0  # seconds: jobs polled within this window share one squeue call
_poll_cache: dict[str | None, tuple[float, dict[str, tuple[str, str]] | None]] = {}


def run_cmd(cmd: list[str], *, slurm_conf: str | None = None, cwd: str | Path | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess:
    """Run one Slurm command; a missing command answers exit 127 instead of raising."""
    env = dict(os.environ)
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    try:
        return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd,
                              timeout=timeout)
    except FileNotFoundError:
        return subprocess.CompletedProcess(cmd, 127, "", f"{cmd[0]}: command not found")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"{cmd[0]}: no answer in {timeout} s")


def _why(p: subprocess.CompletedProcess) -> str:
    return (p.stderr or p.stdout or "").strip() or "(no output)"


def preflight(cluster: ClusterProfile) -> None:
    """Fail before anything is written when there is no Slurm to submit to."""
    p = run_cmd(["sbatch", "--version"], slurm_conf=cluster.slurm_conf)
    if p.returncode == 127:
        raise SubmissionError("no sbatch on PATH: use backend='local' or run `labkit cluster up` "
                              "(a real Slurm mini-cluster on this machine, as root)")


def submit(spec: JobSpec | RunConfig, run_dir: Path, *, cluster: ClusterProfile,
           program: str | Path | None = None, program_args: Sequence[str] | None = None) -> Job:
    """Render ``job.sh`` for ``cluster`` and ``sbatch`` it; SubmissionError with a fix if refused."""
    spec = as_spec(spec)
    script = run_dir / "job.sh"
    script.write_text(render_sbatch(spec, cluster, run_dir, program=program,
                                    program_args=program_args))
    script.chmod(0o755)
    # --output and --job-name again on the command line: they win over the #SBATCH lines.
    opts = [o for o in sbatch_options(spec, cluster, run_dir)
            if o.startswith(("--output=", "--job-name="))]
    p = run_cmd(["sbatch", "--parsable", *opts, str(script)], slurm_conf=cluster.slurm_conf,
                cwd=run_dir)
    if p.returncode:
        err = _why(p)
        hint = next((h for k, h in _SBATCH_HINTS if k.lower() in err.lower()),
                    f"check the #SBATCH lines of {script} against `sinfo`")
        if p.returncode == 127:
            hint = "use backend='local' or run `labkit cluster up`"
        raise SubmissionError(f"sbatch refused run {spec.name!r} (exit {p.returncode}): {err}\n"
                              f"Try: {hint}")
    job_id = p.stdout.strip().split(";")[0]
    if not re.fullmatch(r"\d+(_\d+)?", job_id):
        raise SubmissionError(f"sbatch answered {p.stdout.strip()!r}, not a job id; "
                              f"stderr: {p.stderr.strip()}")
    name = next(o.split("=", 1)[1] for o in opts if o.startswith("--job-name="))
    return Job(job_id=job_id, name=spec.name, run_dir=run_dir, backend="slurm",
               info={"slurm_conf": cluster.slurm_conf, "cluster": cluster.name,
                     "slurm_job_name": name})


def job_name(job: Job) -> str:
    """The Slurm job name of a labkit job: the one sbatch was given, as its record keeps it
    (``labkit-<user>-<run>``); for a record without it (labkit named jobs by the run's name
    alone before), the run's name."""
    name = job.info.get("slurm_job_name")
    return name if isinstance(name, str) and name else job.name


# --- the controller ----------------------------------------------------------------------------
def controllers(conf: str | None) -> list[tuple[str, int]]:
    """(address, port) of each controller the slurm.conf in use names (``conf``, else
    $SLURM_CONF, else /etc/slurm/slurm.conf); [] when that file cannot be read or names none
    (a configless site: then only squeue can tell)."""
    path = conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return []
    keys: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, sep, value = line.split("#", 1)[0].strip().partition("=")
        if sep and value.strip():
            keys.setdefault(key.strip().lower(), []).append(value.strip().split()[0])
    port = (keys.get("slurmctldport") or ["6817"])[-1].split("-")[0]
    # SlurmctldHost=name(address); the older ControlMachine/ControlAddr pair names one.
    hosts = [m.group(2) or m.group(1) for h in keys.get("slurmctldhost", [])
             if (m := re.fullmatch(r"([^(]+)(?:\((.+)\))?", h))]
    if not hosts and (keys.get("controladdr") or keys.get("controlmachine")):
        hosts = (keys.get("controladdr") or keys["controlmachine"])[-1:]
    return [(h, int(port)) for h in hosts] if port.isdigit() else []


def controller_down(conf: str | None, timeout: float = 1.0) -> str | None:
    """``"HOST:PORT"`` when no controller of the slurm.conf in use accepts a TCP connection
    within ``timeout`` seconds; None when one does, or when the file names none. Asked before
    squeue, which waits about 9 s on a dead controller (tests replace this function)."""
    tried = controllers(conf)
    for host, port in tried:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            return None
        except OSError:
            continue
    return ", ".join(f"{h}:{p}" for h, p in tried) or None


def _down_hint(where: str) -> str:
    return (f"the Slurm controller at {where} is not answering (fix: on this machine `sudo labkit "
            f"cluster up`; on a site, `scontrol ping` and ask its admins)")


# --- state -------------------------------------------------------------------------------------
def _squeue(conf: str | None) -> dict[str, tuple[str, str]] | None:
    """{job id: (Slurm state, job name)} for this user's jobs, or None if squeue failed (or
    the controller does not accept a connection: then squeue is not asked)."""
    now = time.time()
    hit = _poll_cache.get(conf)
    if hit and now - hit[0] < POLL_TTL:
        return hit[1]
    down = controller_down(conf)
    if down:
        warn_once(f"{_down_hint(down)}; showing what the runs' own exit_code files say, UNKNOWN "
                  f"where there is none")
        _poll_cache[conf] = (now, None)
        return None
    p = run_cmd(["squeue", "--noheader", "-u", getpass.getuser(), "-t", "all", "-o", "%i|%T|%j"],
                slurm_conf=conf)
    if p.returncode:
        first = _why(p).splitlines()[0]
        warn_once(f"Slurm does not answer (squeue exit {p.returncode}: {first}); showing what "
                  f"the runs' own exit_code files say, UNKNOWN where there is none")
        out = None
    else:
        out = {}
        for line in p.stdout.splitlines():
            parts = line.strip().split("|", 2)
            if len(parts) == 3:
                out[parts[0]] = (parts[1], parts[2])
    _poll_cache[conf] = (now, out)
    return out


def _scontrol(conf: str | None, job_id: str) -> tuple[str, str] | None:
    """(state, name) of a job of this user that scontrol still knows; another user's job of
    that id answers None (it is not ours, whatever its name)."""
    p = run_cmd(["scontrol", "-o", "show", "job", job_id], slurm_conf=conf)
    if p.returncode:
        return None
    st = re.search(r"\bJobState=(\S+)", p.stdout)
    name = re.search(r"\bJobName=(.*?) (?:UserId|\w+=)", p.stdout)
    uid = re.search(r"\bUserId=[^(\s]*\((\d+)\)", p.stdout)
    if uid and int(uid.group(1)) != os.geteuid():
        return None
    return (st.group(1), name.group(1) if name else "") if st else None


def _sacct(conf: str | None, job_id: str) -> str | None:
    p = run_cmd(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], slurm_conf=conf)
    if p.returncode or not p.stdout.strip():
        return None  # e.g. "Slurm accounting storage is disabled"
    return p.stdout.split()[0]


def _map(slurm_state: str) -> JobState:
    # "CANCELLED by 0" -> CANCELLED
    return SLURM_STATES.get(slurm_state.split()[0].rstrip("+"), JobState.UNKNOWN)


def states(jobs: list[Job]) -> dict[str, JobState]:
    """One squeue call per cluster for all the jobs; fall-backs only for the ones it lacks."""
    out: dict[str, JobState] = {}
    for j in jobs:
        conf = j.info.get("slurm_conf")
        live = _squeue(conf)
        rec = live.get(j.job_id) if live is not None else None
        if rec is None and live is not None:  # squeue failing means scontrol would wait too
            rec = _scontrol(conf, j.job_id)
        if rec is not None and rec[1] == job_name(j):
            out[j.job_id] = _map(rec[0])
            continue
        code = j.exit_code()
        if code is not None:  # Slurm forgot the job; its own script recorded how it ended
            out[j.job_id] = JobState.COMPLETED if code == 0 else JobState.FAILED
            continue
        acct = _sacct(conf, j.job_id) if live is not None else None
        out[j.job_id] = _map(acct) if acct else JobState.UNKNOWN
    return out


def cancel(job: Job) -> None:
    """``scancel JOBID`` after checking that Slurm's job of that id is this run's job."""
    conf = job.info.get("slurm_conf")
    down = controller_down(conf)
    if down:
        raise LabkitError(f"cannot cancel Slurm job {job.job_id} (run {job.name!r}): "
                          f"{_down_hint(down)}")
    rec = (_squeue(conf) or {}).get(job.job_id) or _scontrol(conf, job.job_id)
    if rec is None:
        raise LabkitError(f"Slurm does not know job {job.job_id} (run {job.name!r}) any more; "
                          f"nothing to cancel")
    if rec[1] != job_name(job):
        raise LabkitError(f"Slurm job {job.job_id} is named {rec[1]!r}, not {job_name(job)!r} "
                          f"(run {job.name!r}): it is not the job labkit submitted, so labkit "
                          f"left it alone")
    p = run_cmd(["scancel", job.job_id], slurm_conf=conf)
    _poll_cache.clear()
    if p.returncode:
        raise LabkitError(f"scancel {job.job_id} failed (exit {p.returncode}): {_why(p)}")
