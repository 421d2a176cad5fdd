"""The attempts of a job that Slurm ran more than once, read from its own log.

A job with ``--requeue`` that loses a node, is preempted or saves on the warning signal runs its
job script again, and the script appends to the same log (``--open-mode=append``). Each attempt
says where it starts and ends (labkit's sbatch script):

    [job] attempt 2 of job 4242 starts 2026-11-26 17:46:34 on node[1-2]
    [job] attempt 2 of job 4242 ends 2026-11-26 17:49:02: exit code 0

An attempt Slurm ended itself has no end line of its own; Slurm's step daemon wrote why:

    slurmstepd-node1: error: *** JOB 4242 ON node1 CANCELLED AT 2026-11-26T17:47:45 DUE TO NODE
    FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***

and the training itself says where it stopped and where the next attempt resumed
(``[labkit] stopped on SIGUSR1 at iteration 46 ...``, ``[labkit] resumed from ... at iteration
46``). ``attempts(text)`` turns that into one ``Attempt`` per start, in order.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

_START = re.compile(r"^\[job\] attempt (\d+) of job (\S+) starts (\S+ \S+)(?: on (\S+))?")
_END = re.compile(r"^\[job\] attempt (\d+) of job \S+ ends (\S+ \S+): exit code (\d+)")
_SLURM = re.compile(r"\*\*\* JOB \S+ ON (\S+) CANCELLED AT (\S+)(?: DUE TO ([A-Z_ ]+?))?"
                    r"(?:,| \*\*\*)")
_STOPPED = re.compile(r"^\[labkit\] stopped on (SIG\w+) at iteration (\d+) of \d+")
_RESUMED = re.compile(r"^\[labkit\] resumed from \S.* at iteration (\d+)")
_ITERATION = re.compile(r"\biteration\s+(\d+)/\s*\d+ \|")
_REQUEUE = re.compile(r"^\[job\] requeueing job ")
_WARNED = re.compile(r"^\[job\] SIGUSR1 from Slurm at \S+ \S+: the (time limit is near|job is being "
                     r"preempted)")


@dataclass
class Attempt:
    """One run of a job's script: when, where, how far it got and why it ended."""

    number: int
    """1 for the first start, 2 after the first requeue, ..."""
    job_id: str
    started: str
    """``YYYY-MM-DD HH:MM:SS`` on the nodes' clock."""
    nodes: str | None
    """Slurm's node list of this attempt, e.g. ``node[1-2]``."""
    ended: str | None = None
    """When it ended (its script's end line, or Slurm's ``CANCELLED AT``); None: still running,
    or killed without a word."""
    exit_code: int | None = None
    """The job script's exit code (75: saved on the warning signal and stopped)."""
    reason: str | None = None
    """Why it ended: ``node failure``, ``preemption``, ``time limit``, ``cancelled`` (Slurm's
    words), ``saved on SIGUSR1 (preemption) at iteration N`` (the training's), ``completed``, ``exit code
    N``; None: not known."""
    resumed_from: int | None = None
    """The checkpoint iteration this attempt started from (None: from the start)."""
    last_iteration: int | None = None
    """The last iteration it logged (None: none)."""
    requeued: bool = False
    """The script asked Slurm to requeue the job (after a save on the warning signal)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def attempts(text: str) -> list[Attempt]:
    """The attempts in a job's log (``[]`` for a log without attempt lines: a job script from
    before they were written, or a backend other than Slurm)."""
    out: list[Attempt] = []
    stopped: str | None = None
    warned: str | None = None  # what the job script said the warning was for
    for line in text.splitlines():
        m = _START.match(line)
        if m:
            out.append(Attempt(int(m.group(1)), m.group(2), m.group(3), m.group(4)))
            stopped = warned = None
            continue
        if not out:
            continue
        a = out[-1]
        if m := _ITERATION.search(line):
            a.last_iteration = int(m.group(1))
        elif m := _RESUMED.match(line):
            a.resumed_from = int(m.group(1))
        elif m := _WARNED.match(line):
            warned = "time limit" if m.group(1).startswith("time") else "preemption"
        elif m := _STOPPED.match(line):
            why = f" ({warned})" if warned else ""
            stopped = f"saved on {m.group(1)}{why} at iteration {m.group(2)}"
        elif m := _END.match(line):
            a.ended, a.exit_code = m.group(2), int(m.group(3))
            a.reason = stopped or ("completed" if a.exit_code == 0 else f"exit code {a.exit_code}")
        elif _REQUEUE.match(line):
            a.requeued = True
        elif (m := _SLURM.search(line)) and m.group(3) != "JOB REQUEUE":
            # Slurm ended it (no reason given: scancel): its word wins over an exit code the
            # script wrote while dying.
            a.ended = a.ended or m.group(2).replace("T", " ")
            a.reason = (m.group(3) or "cancelled").lower()
    return out


def summary(runs: list[Attempt]) -> str:
    """One line per attempt, e.g. ``attempt 1 (node[1-2]) 17:47:08-17:47:45: node failure at
    iteration 15``; '' without attempts."""
    lines = []
    for a in runs:
        span = f"{a.started}-{a.ended.split()[-1]}" if a.ended else f"{a.started}-"
        start = f" from iteration {a.resumed_from}" if a.resumed_from is not None else ""
        last = f", last iteration {a.last_iteration}" if a.last_iteration is not None else ""
        why = a.reason or ("running, or ended without a word from Slurm" if a.ended is None
                           else "ended")
        lines.append(f"attempt {a.number} of job {a.job_id} on {a.nodes or '?'}, {span}"
                     f"{start}: {why}{last}" + (" (requeued itself)" if a.requeued else ""))
    return "\n".join(lines)
