"""Hang watchdog: while labkit waits on a job, no new iteration line for too long is a ``hang``.

A hung multi-node job prints nothing and burns its allocation until the time limit. The
watchdog rides on ``Job.wait``'s poll hook and, once the log has been quiet longer than
``timeout_s`` (``labkit.logs.last_progress`` finds the last iteration, with the log parser's
own iteration-line recognition), it builds a diagnosis:

- which ranks stopped printing and the last line of each (ranks named by the log's
  ``[rankN]:`` / ``[defaultN]:`` / srun ``N:`` prefixes, read with ``labkit.logs``),
- a py-spy stack dump of every rank's process (when py-spy is installed and the processes are
  visible from here: the local backend, or the mini-cluster), marking the ranks that wait
  inside a collective and the odd ones that do not (usually the culprit),
- a hint that names the usual causes.

    job.wait(hang_timeout=120)                   # raises HangError after cancelling the job
    watch(job, hang_timeout_s=120)               # the same, with a separate start-up allowance
    job.wait(on_poll=HangWatchdog(timeout_s=120, cancel=False))   # diagnose, leave it running

The job is taken as it is given (``job_id``, ``name``, ``backend``, ``info``, ``run_dir``,
``log_path``, ``state()``, ``cancel()``, ``wait()``): this module imports nothing from
``labkit.backends``, which imports it when ``Job.wait(hang_timeout=...)`` asks.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from labkit._logging import log
from labkit.errors import JobFailedError
from labkit.logs import Failure, clean_line, last_progress
from labkit.run.state import JobLike, JobState

HANG_HINT = (
    "usual causes: (1) the network interface or a firewall: peers cannot connect, so set "
    "NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME to the inter-node interface and open the ports; "
    "(2) a wrong MASTER_ADDR / MASTER_PORT (the head's address on the inter-node network, a port "
    "nobody else uses); (3) a rank that died or is stuck (see the ranks not inside a collective "
    "and the first error in the log); (4) mismatched collectives: ranks calling different "
    "collectives or different tensor shapes (a rank-dependent `if` around a collective). Run "
    "`labkit doctor` to test the first two, and rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL.")
# Frames inside torch.distributed mean "waiting in a collective (or the rendezvous)".
_IN_COLLECTIVE = re.compile(r"torch/distributed/|distributed_c10d|ProcessGroup")
_FRAME = re.compile(r"^\s{2,}(?P<func>\S.*?) \((?P<where>[^()]+)\)\s*$")


@dataclass
class RankStack:
    """One rank's process and its stack as py-spy saw it."""

    rank: int | None
    pid: int
    host: str
    top: str = ""
    in_collective: bool = False
    dump: str = ""
    error: str = ""


@dataclass
class HangReport:
    """Everything the watchdog found about a hang; ``str()`` is the readable version."""

    job_id: str
    name: str
    log_path: str
    quiet_s: float
    last_iteration: int | None
    ranks: list[dict[str, Any]] = field(default_factory=list)
    """Per rank (as the log names them): rank, lineno, last_line, seen_s_ago (None if unknown)."""
    stacks: list[RankStack] = field(default_factory=list)
    suspects: list[int] = field(default_factory=list)
    """Ranks not inside a collective while others are: the likely cause."""
    note: str = ""
    hint: str = HANG_HINT

    @property
    def message(self) -> str:
        where = (f"after iteration {self.last_iteration}" if self.last_iteration is not None
                 else "before the first iteration")
        return (f"job {self.job_id} ({self.name}) looks hung: no new iteration for "
                f"{self.quiet_s:.0f} s {where}")

    def to_failure(self) -> Failure:
        """The hang as a ``labkit.logs`` Failure (kind ``hang``), for tables and JSON."""
        rank = self.suspects[0] if self.suspects else None
        line = next((r["lineno"] for r in self.ranks if r["rank"] == rank), None)
        return Failure("hang", rank, line, self.message, self.hint, key="hang")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["message"] = self.message
        return d

    def __str__(self) -> str:
        out = [self.message + f". Log: {self.log_path}"]
        if self.ranks:
            out.append("Last line of each rank (first to go quiet first):")
            for r in self.ranks:
                ago = f", {r['seen_s_ago']:.0f} s ago" if r.get("seen_s_ago") is not None else ""
                who = f"rank {r['rank']}" if r["rank"] is not None else "unlabelled"
                out.append(f"  {who} (line {r['lineno']}{ago}): {r['last_line']}")
        if self.stacks:
            out.append("Stacks (py-spy):")
            for s in self.stacks:
                state = "in a collective" if s.in_collective else "NOT in a collective"
                out.append(f"  rank {s.rank} pid {s.pid} on {s.host}: {state}; top frame: "
                           f"{s.top or s.error}")
        if self.suspects:
            out.append(f"Suspect rank(s) {self.suspects}: not inside a collective while the "
                       f"others wait in one.")
        if self.note:
            out.append(self.note)
        out.append("Hint: " + self.hint)
        return "\n".join(out)


class HangError(JobFailedError):
    """Raised by the watchdog to stop ``Job.wait``; ``.report`` is the HangReport."""

    def __init__(self, report: HangReport, state: str):
        self.report = report
        super().__init__(str(report), job_id=report.job_id, state=state,
                         log_tail="\n".join(r["last_line"] for r in report.ranks))


# --- reading the log -------------------------------------------------------------------------
class _LogFollower:
    """Reads new whole lines of a log at each poll; remembers each rank's last line and when
    this process first saw it (so "who went quiet first" has real times, not guesses)."""

    def __init__(self) -> None:
        self.offset, self.lineno = 0, 0
        self.last: dict[int | None, dict[str, Any]] = {}

    def poll(self, path: Path, now: float | None = None) -> None:
        now = time.time() if now is None else now
        try:
            with open(path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return
        cut = chunk.rfind(b"\n") + 1
        self.offset += cut
        for raw in chunk[:cut].splitlines():
            self.lineno += 1
            line = clean_line(raw, self.lineno)
            if line.text.strip():
                self.last[line.rank] = {"rank": line.rank, "lineno": line.lineno,
                                        "last_line": line.text.strip()[:300], "seen_at": now}

    def ranks(self, now: float) -> list[dict[str, Any]]:
        rows = sorted(self.last.values(), key=lambda r: (r["seen_at"], r["lineno"]))
        return [{"rank": r["rank"], "lineno": r["lineno"], "last_line": r["last_line"],
                 "seen_s_ago": round(now - r["seen_at"], 1)} for r in rows]


# --- the ranks' processes and their stacks ---------------------------------------------------
def rank_processes(job: JobLike) -> list[tuple[int | None, int]]:
    """(rank, pid) of the job's worker processes visible from here (env RANK set by torchrun)."""
    # psutil: only for a hang report
    import psutil

    if job.backend == "local":
        try:
            procs = psutil.Process(int(job.info["pid"])).children(recursive=True)
        except (KeyError, psutil.Error):
            return []
    else:  # Slurm: workers on this machine (the mini-cluster, or a watchdog on a node)
        procs = list(psutil.process_iter())
    found = []
    for p in procs:
        try:
            env = p.environ()
        except psutil.Error:
            continue
        if "RANK" not in env or "LOCAL_RANK" not in env:
            continue  # not a torchrun worker (the agent, bash, srun)
        if job.backend != "local" and env.get("SLURM_JOB_ID") != str(job.job_id):
            continue
        found.append((int(env["RANK"]) if env["RANK"].isdigit() else None, p.pid))
    return sorted(found, key=lambda rp: (rp[0] is None, rp[0] or 0, rp[1]))


def py_spy() -> str | None:
    exe = Path(sys.executable).with_name("py-spy")
    return str(exe) if exe.exists() else shutil.which("py-spy")


def dump_stack(pid: int, rank: int | None, exe: str, timeout_s: float = 20.0) -> RankStack:
    """``py-spy dump`` of one process; the top frame and whether it waits in a collective."""
    s = RankStack(rank=rank, pid=pid, host=os.uname().nodename)
    try:
        r = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True,
                           timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        s.error = f"py-spy failed: {e}"
        return s
    if r.returncode != 0:
        s.error = f"py-spy exit {r.returncode}: {(r.stderr or r.stdout).strip()[-300:]}"
        return s
    s.dump = r.stdout
    s.top, s.in_collective = parse_stack(r.stdout)
    return s


def parse_stack(dump: str) -> tuple[str, bool]:
    """A ``py-spy dump`` -> (the main thread's top frame, whether it waits in torch.distributed)."""
    frames = [m for m in (_FRAME.match(ln) for ln in _main_thread(dump)) if m]
    if not frames:
        return "", False
    top = f"{frames[0]['func']} ({frames[0]['where']})"
    return top, any(_IN_COLLECTIVE.search(m["where"]) for m in frames)


def _main_thread(dump: str) -> list[str]:
    """The lines of the main thread's stack (py-spy lists threads one after another)."""
    lines, keep = [], False
    for ln in dump.splitlines():
        if ln.startswith("Thread "):
            keep = '"MainThread"' in ln
            continue
        if keep:
            lines.append(ln)
    return lines or dump.splitlines()


def diagnose_hang(job: JobLike, *, quiet_s: float, last_iteration: int | None,
                  follower: _LogFollower | None = None, stacks: bool = True) -> HangReport:
    """The hang report of a running job (see the module docstring)."""
    now = time.time()
    standalone = follower is None
    if follower is None:  # called on its own: read the whole log once
        follower = _LogFollower()
        follower.poll(job.log_path, now=now)
    ranks = follower.ranks(now)
    if standalone:
        for r in ranks:
            r["seen_s_ago"] = None  # read in one go: only the line order is known
    report = HangReport(job.job_id, job.name, str(job.log_path), quiet_s, last_iteration,
                        ranks=ranks)
    if not stacks:
        return report
    exe = py_spy()
    procs = rank_processes(job)
    if exe is None:
        report.note = "No stack dumps: py-spy is not installed (pip install py-spy)."
    elif not procs:
        report.note = (f"No stack dumps: no worker process of job {job.job_id} is visible from "
                       f"this machine; on the node run: py-spy dump --pid <pid of each rank>")
    else:
        report.stacks = [dump_stack(pid, rank, exe) for rank, pid in procs]
        ok = [s for s in report.stacks if not s.error]
        waiting = [s for s in ok if s.in_collective]
        if waiting and len(waiting) < len(ok):
            report.suspects = [s.rank for s in ok if not s.in_collective and s.rank is not None]
    return report


class HangWatchdog:
    """A ``Job.wait`` watcher: raises HangError when the log shows no progress for too long.

    Args:
        timeout_s: seconds without a new iteration line (after the first one) that count as a
            hang.
        startup_timeout_s: the same before the first iteration line (imports, rendezvous, data
            loading take a while); default: ``timeout_s``.
        stacks: dump every rank's stack with py-spy when it fires.
        cancel: cancel the job after the diagnosis (its allocation is wasted otherwise).
        save: write the report to ``<run_dir>/hang-<time>.txt`` (never over an older one).
    """

    def __init__(self, timeout_s: float = 300.0, *, startup_timeout_s: float | None = None,
                 stacks: bool = True, cancel: bool = False, save: bool = True):
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s if startup_timeout_s is not None else timeout_s
        self.stacks, self.cancel, self.save = stacks, cancel, save
        self.follower = _LogFollower()
        self.report: HangReport | None = None
        self.since: float | None = None

    def __call__(self, job: JobLike, state: JobState) -> None:
        now = time.time()
        if self.since is None:
            self.since = now
        self.follower.poll(job.log_path)
        if str(state) != "RUNNING" or not job.log_path.exists():
            return
        t, it = last_progress(job.log_path)
        if it is not None and t >= self.since:  # training: only a new iteration is progress
            quiet, limit = now - t, self.timeout_s
        else:
            # Start-up (or only a previous attempt's iterations, as in a resumed run's log):
            # any new log line is progress, and nothing before watching began is blamed.
            quiet = now - max(job.log_path.stat().st_mtime, self.since)
            limit = self.startup_timeout_s
        if quiet <= limit:
            return
        report = diagnose_hang(job, quiet_s=quiet, last_iteration=it,
                               follower=self.follower, stacks=self.stacks)
        self.report = report
        if self.save:
            self._save(job, report)
        log.warning(report.message + (f"; suspect rank(s) {report.suspects}"
                                      if report.suspects else ""))
        if self.cancel:
            job.cancel()
        raise HangError(report, str(job.state()))

    @staticmethod
    def _save(job: JobLike, report: HangReport) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = job.run_dir / f"hang-{stamp}.txt"
        n = 1
        while path.exists():
            path, n = job.run_dir / f"hang-{stamp}-{n}.txt", n + 1
        body = [str(report), ""] + [f"--- rank {s.rank} (pid {s.pid}) ---\n{s.dump or s.error}"
                                    for s in report.stacks]
        path.write_text("\n".join(body) + "\n")
        (path.with_suffix(".json")).write_text(json.dumps(report.to_dict(), indent=1,
                                                          default=str))


def watch(job: JobLike, hang_timeout_s: float = 300.0, *, cancel: bool = True,
          **wait_kwargs: Any) -> JobState:
    """``job.wait(...)`` with a HangWatchdog: raises HangError (after cancelling the job, by
    default) instead of waiting out a hang. ``startup_timeout_s`` in ``wait_kwargs`` allows
    longer before the first iteration line; the rest go to ``job.wait``."""
    wd = HangWatchdog(hang_timeout_s, cancel=cancel,
                      startup_timeout_s=wait_kwargs.pop("startup_timeout_s", None))
    return job.wait(on_poll=wd, **wait_kwargs)
