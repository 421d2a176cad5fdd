"""What a job is waiting for and what it is doing, in one line for the job monitor.

PENDING on Slurm: ``squeue``'s reason (``Resources``, ``Priority``, ``QOSMaxJobsPerUserLimit``,
...) and the job's place among the pending jobs of its partition, highest priority first, as
Slurm's scheduler takes them. RUNNING: the latest iteration line of the log (iteration, lm
loss, time per iteration). A job Slurm requeued (``Restarts`` > 0: a node failed, it was
preempted, it saved on the warning signal) says which attempt it is, how the last one ended
(the job's own log: ``labkit.run.attempts``) and which nodes Slurm holds out of service, with
their reason. Slurm is asked through ``labkit.slurmcli``; no imports from the rest of
``labkit.backends``: the job module calls this one.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from labkit import slurmcli
from labkit.run.attempts import attempts
from labkit.slurmcli import SlurmError

_ITERATION = re.compile(rb"iteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)")
_LOSS = re.compile(rb"lm loss: ([0-9.]+E[+-]\d+|[0-9.]+|nan|inf)", re.I)
_MS = re.compile(rb"elapsed time per iteration \(ms\): ([0-9.]+)")


def latest_iteration(text: bytes) -> dict[str, Any] | None:
    """``{"iteration", "train_iters", "loss", "ms"}`` of the last iteration line in ``text``."""
    for line in reversed(text.splitlines()):
        m = _ITERATION.search(line)
        if m:
            loss, ms = _LOSS.search(m.group(3)), _MS.search(m.group(3))
            return {"iteration": int(m.group(1)), "train_iters": int(m.group(2)),
                    "loss": float(loss.group(1)) if loss else None,
                    "ms": float(ms.group(1)) if ms else None}
    return None


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def pending_reason(job_id: str, slurm_conf: str | None = None) -> str | None:
    """``"Resources, 2nd of 3 pending in partition debug"`` for a pending Slurm job, or None
    when squeue cannot say (the job left the queue, squeue failed)."""
    try:
        rec = slurmcli.queued_job(slurm_conf, str(job_id))
    except SlurmError:
        return None
    if rec is None or rec[0] != "PENDING":
        return None
    _, reason, partition = rec
    text = reason or "no reason given"
    try:
        ids = slurmcli.pending_ids(slurm_conf, partition) if partition else []
    except SlurmError:
        ids = []
    if str(job_id) in ids:
        text += (f", {_ordinal(ids.index(str(job_id)) + 1)} of {len(ids)} pending in partition "
                 f"{partition}")
    return text


def requeued(job_id: str, slurm_conf: str | None, log_path: Path | None) -> str | None:
    """``"attempt 2; attempt 1 ended: node failure, last iteration 10; node2 down: ..."`` for
    a Slurm job that Slurm started more than once, else None."""
    fields = slurmcli.job_fields(slurm_conf, str(job_id)) or {}
    restarts = fields.get("Restarts", "0")
    if not restarts.isdigit() or int(restarts) == 0:
        return None
    text = f"attempt {int(restarts) + 1}"
    try:
        runs = attempts(log_path.read_text(errors="replace")) if log_path else []
    except OSError:
        runs = []
    ended = [a for a in runs if a.number <= int(restarts)]
    if ended:
        a = ended[-1]
        last = f", last iteration {a.last_iteration}" if a.last_iteration is not None else ""
        text += f"; attempt {a.number} ended: {a.reason or 'killed without a word'}{last}"
    if runs and runs[-1].number == int(restarts) + 1 and runs[-1].resumed_from is not None:
        text += f"; resumed from iteration {runs[-1].resumed_from}"
    out = slurmcli.out_of_service(slurm_conf)
    if out:
        text += "; " + ", ".join(f"{n} {st}: {why}" for n, (st, why) in sorted(out.items()))
    return text


def describe(state: str, *, backend: str, job_id: str, info: dict[str, Any],
             latest: dict[str, Any] | None, log_path: Path | None = None) -> str:
    """The monitor's line: the state, and why it waits or how far it got (and, for a job
    Slurm requeued, which attempt and how the last one ended: ``requeued``)."""
    again = (requeued(job_id, info.get("slurm_conf"), log_path)
             if backend == "slurm" and state in ("PENDING", "RUNNING", "REQUEUED") else None)
    if state in ("PENDING", "REQUEUED") and backend == "slurm":
        why = pending_reason(job_id, info.get("slurm_conf"))
        why = "; ".join(w for w in (f"requeued, {again}" if again else None, why) if w)
        return f"{state} ({why})" if why else state
    if state == "RUNNING" and latest:
        parts = [again] if again else []
        parts.append(f"iteration {latest['iteration']}/{latest['train_iters']}")
        if latest.get("loss") is not None:
            parts.append(f"lm loss {latest['loss']:.3f}")
        if latest.get("ms") is not None:
            parts.append(f"{latest['ms']:.0f} ms/iteration")
        return "RUNNING: " + ", ".join(parts)
    return state
