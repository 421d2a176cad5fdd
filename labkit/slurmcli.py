"""The one door to Slurm's commands: every sbatch, squeue, scontrol, sinfo, scancel and sacct
process labkit runs starts in ``run`` here, and each command's output is read here into plain
values (job ids, states, names, rows). The Slurm backend, the job monitor's queue line, the
class view and the doctor ask these functions; none of them runs a Slurm command itself.

Tests replace ``run`` with a fake that answers with the text Slurm prints, and
``controller_down`` (a TCP connect, no process). A command that fails raises ``SlurmError``
with its exit code and message; a command that is not installed fails with exit 127, one that
does not answer in time with 124.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

from labkit.errors import LabkitError

_JOB_ID = re.compile(r"\d+(_\d+)?")


class SlurmError(LabkitError):
    """A Slurm command failed: its name, exit code (127: not installed, 124: no answer) and
    what it said."""

    def __init__(self, command: str, returncode: int, message: str):
        self.command, self.returncode, self.message = command, returncode, message
        super().__init__(f"{command} failed (exit {returncode}): {message}")

    @property
    def first_line(self) -> str:
        return (self.message.splitlines() or [""])[0]

    @property
    def last_line(self) -> str:
        return (self.message.splitlines() or [""])[-1]


def run(cmd: list[str], *, slurm_conf: str | None = None, cwd: str | Path | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess:
    """Run one Slurm command (with ``SLURM_CONF=slurm_conf`` when given); a missing command
    answers exit 127 and a silent one exit 124 instead of raising."""
    env = dict(os.environ)
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    try:
        return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd,
                              timeout=timeout)
    except FileNotFoundError:
        return subprocess.CompletedProcess(cmd, 127, "", f"{cmd[0]}: command not found")
    except OSError as e:
        return subprocess.CompletedProcess(cmd, 126, "", f"{cmd[0]}: {e.strerror or e}")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"{cmd[0]}: no answer in {timeout:g} s")


def why(p: subprocess.CompletedProcess) -> str:
    """What a command said about its failure (stderr, else stdout)."""
    return (p.stderr or p.stdout or "").strip() or "(no output)"


def _out(cmd: list[str], conf: str | None, timeout: float = 60, cwd: str | Path | None = None) -> str:
    p = run(cmd, slurm_conf=conf, cwd=cwd, timeout=timeout)
    if p.returncode:
        raise SlurmError(cmd[0], p.returncode, why(p))
    return p.stdout


def _rows(text: str, width: int) -> list[list[str]]:
    """``|``-separated lines of ``width`` fields (the last one keeps any further ``|``)."""
    rows = [line.strip().split("|", width - 1) for line in text.splitlines()]
    return [r for r in rows if len(r) == width]


# --- submit and cancel ---------------------------------------------------------------------
def has_sbatch(conf: str | None) -> bool:
    """Whether there is an sbatch to submit with (``sbatch --version`` runs)."""
    return run(["sbatch", "--version"], slurm_conf=conf).returncode != 127


def sbatch(options: list[str], script: Path, conf: str | None, cwd: Path) -> str:
    """``sbatch --parsable OPTIONS SCRIPT``: the new job's id. SlurmError when sbatch refuses,
    or (exit 0) when its answer is not a job id."""
    out = _out(["sbatch", "--parsable", *options, str(script)], conf, cwd=cwd)
    job_id = out.strip().split(";")[0]
    if not _JOB_ID.fullmatch(job_id):
        raise SlurmError("sbatch", 0, f"sbatch answered {out.strip()!r}, not a job id")
    return job_id


def scancel(conf: str | None, job_id: str) -> None:
    """``scancel JOBID``: that one job, nothing else."""
    _out(["scancel", job_id], conf)


# --- jobs ----------------------------------------------------------------------------------
def my_jobs(conf: str | None, user: str) -> dict[str, tuple[str, str]]:
    """{job id: (Slurm state, job name)} of ``user``'s jobs, finished ones Slurm still lists
    included (``squeue -u USER -t all``)."""
    out = _out(["squeue", "--noheader", "-u", user, "-t", "all", "-o", "%i|%T|%j"], conf)
    return {r[0]: (r[1], r[2]) for r in _rows(out, 3)}


def all_jobs(conf: str | None) -> dict[str, tuple[str, str, int]]:
    """{job id: (Slurm state, job name, owner's uid)} of every user's jobs (``squeue -t all``)."""
    out = _out(["squeue", "--noheader", "-t", "all", "-o", "%i|%T|%U|%j"], conf)
    return {r[0]: (r[1], r[3], int(r[2])) for r in _rows(out, 4) if r[2].isdigit()}


def job_record(conf: str | None, job_id: str) -> tuple[str, str, int | None] | None:
    """(state, name, owner's uid or None) of a job ``scontrol show job`` still knows; None when
    it does not (or scontrol fails)."""
    p = run(["scontrol", "-o", "show", "job", job_id], slurm_conf=conf)
    if p.returncode:
        return None
    st = re.search(r"\bJobState=(\S+)", p.stdout)
    name = re.search(r"\bJobName=(.*?) (?:UserId|\w+=)", p.stdout)
    uid = re.search(r"\bUserId=[^(\s]*\((\d+)\)", p.stdout)
    if not st:
        return None
    return st.group(1), name.group(1) if name else "", int(uid.group(1)) if uid else None


_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z:/]*)=")


def job_fields(conf: str | None, job_id: str) -> dict[str, str] | None:
    """``scontrol -o show job ID`` as {field: value} (JobState, Reason, Restarts, Requeue,
    NodeList, BatchHost, ExitCode, StartTime, EndTime, Partition, ...); None when scontrol does
    not know the job (or fails). A value runs to the next `` Field=`` (names may hold spaces)."""
    p = run(["scontrol", "-o", "show", "job", job_id], slurm_conf=conf)
    if p.returncode or "JobState=" not in p.stdout:
        return None
    line = p.stdout.strip().splitlines()[0]
    marks = list(_FIELD.finditer(line))
    return {m.group(1): line[m.end():marks[i + 1].start() if i + 1 < len(marks) else None].strip()
            for i, m in enumerate(marks)}


def out_of_service(conf: str | None) -> dict[str, tuple[str, str]]:
    """{node: (state, reason)} of the nodes Slurm holds out of service (down, drained, failing:
    ``sinfo -R -N``), with the reason an admin or Slurm gave; {} when sinfo fails."""
    p = run(["sinfo", "-R", "-N", "-h", "-o", "%N|%T|%E"], slurm_conf=conf, timeout=20)
    return {n: (t, e) for n, t, e in _rows(p.stdout, 3)} if p.returncode == 0 else {}


def hostnames(conf: str | None, nodelist: str) -> list[str]:
    """``node[1-2]`` -> ``["node1", "node2"]`` (``scontrol show hostnames``); [] for none."""
    if not nodelist or nodelist == "(null)":
        return []
    return _out(["scontrol", "show", "hostnames", nodelist], conf).split()


def set_node_state(conf: str | None, node: str, state: str, reason: str | None = None) -> None:
    """``scontrol update nodename=NODE state=STATE [reason=...]`` (an administrator's command:
    ``down`` needs a reason, ``resume`` brings the node back)."""
    _out(["scontrol", "update", f"nodename={node}", f"state={state}",
          *([f"reason={reason}"] if reason else [])], conf)


def kill_wait(conf: str | None) -> int:
    """Slurm's KillWait (``scontrol show config``): seconds between a job's SIGTERM and its
    SIGKILL when it is ended; 30 (Slurm's default) where it cannot be read."""
    m = re.search(r"^KillWait\s*=\s*(\d+)", _out(["scontrol", "show", "config"], conf), re.M)
    return int(m.group(1)) if m else 30


def start_now(conf: str | None, job_id: str) -> None:
    """``scontrol update jobid=ID StartTime=now``: a pending job may start at once (an
    administrator's command; a requeued job otherwise waits about 2 minutes)."""
    _out(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], conf)


def accounted_state(conf: str | None, job_id: str) -> str | None:
    """The job's state in Slurm's accounting (``sacct``); None without accounting."""
    p = run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], slurm_conf=conf)
    if p.returncode or not p.stdout.strip():
        return None  # e.g. "Slurm accounting storage is disabled"
    return p.stdout.split()[0]


def queued_job(conf: str | None, job_id: str, timeout: float = 20) -> tuple[str, str, str] | None:
    """(state, queue reason, partition) of one job (``squeue -j ID -t all``); None when squeue
    no longer lists it. SlurmError when squeue fails."""
    p = run(["squeue", "--noheader", "-j", job_id, "-t", "all", "-o", "%T|%r|%P"],
            slurm_conf=conf, timeout=timeout)
    if p.returncode:
        if "invalid job id" in (p.stderr + p.stdout).lower():
            return None  # finished and forgotten
        raise SlurmError("squeue", p.returncode, why(p))
    rows = _rows(p.stdout, 3)
    return (rows[0][0].strip(), rows[0][1].strip(), rows[0][2].strip()) if rows else None


def pending_ids(conf: str | None, partition: str) -> list[str]:
    """Ids of the partition's pending jobs, highest priority first, as the scheduler takes them."""
    out = _out(["squeue", "--noheader", "-t", "PENDING", "-p", partition, "--sort=-p,i",
                "-o", "%i"], conf, timeout=20)
    return [i.strip() for i in out.splitlines() if i.strip()]


# --- partitions and nodes ------------------------------------------------------------------
def partitions(conf: str | None, timeout: float = 15) -> list[tuple[str, str, int, str, str]]:
    """(partition, availability, node count, node state, GRES) rows of ``sinfo``; the default
    partition's name ends in ``*``."""
    out = _out(["sinfo", "-h", "-o", "%P|%a|%D|%T|%G"], conf, timeout=timeout)
    return [(p, a, int(d) if d.isdigit() else 0, t, g) for p, a, d, t, g in _rows(out, 5)]


def nodes(conf: str | None, partition: str | None) -> list[tuple[str, int, str, str, str]]:
    """(node, CPUs, GRES, state, partition) of ``sinfo -N`` (one partition's, or all)."""
    cmd = ["sinfo", "-N", "-h", "-o", "%N|%c|%G|%t|%P", *(["-p", partition] if partition else [])]
    return [(n, int(c), g, t, p) for n, c, g, t, p in _rows(_out(cmd, conf, timeout=20), 5)
            if c.isdigit()]


def node_addresses(conf: str | None) -> list[tuple[str, str, str, int | None]]:
    """(node, address, state, CPUs) of every node, once (``sinfo -N`` lists a node once per
    partition it is in); [] when sinfo fails."""
    p = run(["sinfo", "-N", "-h", "-o", "%N|%o|%t|%c"], slurm_conf=conf)
    rows = _rows(p.stdout, 4) if p.returncode == 0 else []
    first = {n: (n, a, t, int(c) if c.isdigit() else None) for n, a, t, c in reversed(rows)}
    return [first[n] for n in dict.fromkeys(n for n, *_ in rows)]


def partition_settings(conf: str | None, partition: str | None) -> str:
    """The partition's line of ``scontrol show partition`` (the first one when none is named)."""
    out = _out(["scontrol", "-o", "show", "partition", *([partition] if partition else [])],
               conf, timeout=20)
    return out.strip().splitlines()[0] if out.strip() else ""


def check_accounting(conf: str | None, timeout: float = 15) -> None:
    """Ask accounting for the last hour's jobs; SlurmError when it does not answer."""
    _out(["sacct", "-n", "-X", "-o", "JobID", "-S", "now-1hour"], conf, timeout=timeout)


# --- the controller ------------------------------------------------------------------------
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
    squeue, which waits about 9 s on a dead controller."""
    tried = controllers(conf)
    for host, port in tried:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            return None
        except OSError:
            continue
    return ", ".join(f"{h}:{p}" for h, p in tried) or None
