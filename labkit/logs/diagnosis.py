"""Why did a job fail, and is a running job stuck? The entry points the job backends call.

``diagnose`` adds what the scheduler knows (exit code, final Slurm state) to what the log says;
``detect_hang`` looks at the time of the last iteration line while the job still runs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from labkit.logs.exceptions import TERMINATED
from labkit.logs.failures import HINTS, Failure
from labkit.logs.megatron import _TIMESTAMP, parse_iteration
from labkit.logs.parse import parse_lines, parse_log
from labkit.logs.ranking import rank_failures

# Slurm's final state -> the failure kind it implies when the log itself is silent.
_STATE_KIND = {"TIMEOUT": "time_limit", "OUT_OF_MEMORY": "host_oom", "NODE_FAIL": "node_failure",
               "PREEMPTED": "preempted", "CANCELLED": "cancelled", "BOOT_FAIL": "node_failure",
               "DEADLINE": "time_limit"}
_TAIL_BYTES = 4 << 20  # detect_hang reads at most the last 4 MiB
_ENDED_BY_SCHEDULER = ("cancelled", "time_limit", "preempted")


def diagnose(log: str | Path | Iterable[str], *, exit_code: int | None = None,
             job_state: str | None = None) -> list[Failure]:
    """Failures of a finished job, most likely root cause first.

    Args:
        log: the job's log file (a str or Path; one that does not exist yet means the job wrote
            none, and only the state and exit code count), or its lines (any other iterable).
        exit_code: the job's exit code, if known (``-9``/``137`` mean SIGKILL).
        job_state: the final scheduler state (``TIMEOUT``, ``OUT_OF_MEMORY``, ``NODE_FAIL``, ...).
    Returns:
        A list of :class:`Failure`; empty when nothing points at a failure.
    """
    if isinstance(log, (str, Path)):
        found = list(parse_log(log).failure_records) if Path(log).is_file() else []
    else:
        found = list(parse_lines(log).failure_records)
    kinds = {f.kind for f in found}
    # "TIMEOUT", "CANCELLED by 0", "JobState.TIMEOUT" all name the same state
    state = (job_state or "").upper().split(" ")[0].rsplit(".", 1)[-1]
    kind = _STATE_KIND.get(state)
    if kind and kind not in kinds:
        hint = HINTS["host_oom"] if kind == "host_oom" else HINTS[kind]
        found.append(Failure(kind, None, None, f"the scheduler reports the job as {state}", hint,
                             evidence="state"))
    if exit_code in (-9, 137) and not found:
        found.append(Failure("host_oom", None, None, f"the job exited with {exit_code} (SIGKILL) and the "
                             "log names no other cause", HINTS["sigkill"], evidence="signal"))
    ranked = rank_failures(found)
    if any(f.kind in _ENDED_BY_SCHEDULER for f in ranked):
        # the scheduler's end comes before the signal exceptions it caused (a stable sort)
        ranked.sort(key=lambda f: f.kind == "python_exception" and bool(TERMINATED.search(f.message)))
    return ranked


def _tail_lines(path: Path) -> list[bytes]:
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - _TAIL_BYTES))
        data = f.read()
    lines = data.splitlines()
    return lines[1:] if size > _TAIL_BYTES else lines  # the first one may be cut


def last_progress(log_path: str | Path) -> tuple[float, int | None]:
    """(epoch seconds of the last progress, last iteration or None).

    The last iteration line's own timestamp when it has one; otherwise the log's modification
    time (Megatron prints timestamps from 2023 on; older lines carry none).
    """
    path = Path(log_path)
    mtime = path.stat().st_mtime
    for raw in reversed(_tail_lines(path)):
        if b"iteration" not in raw:
            continue
        text = raw.decode("utf-8", errors="replace")
        rec = parse_iteration(text)
        if rec is None:
            continue
        ts = _TIMESTAMP.search(text)
        if ts:
            try:  # Megatron writes local wall-clock time without a zone
                t = datetime.fromisoformat(ts.group(1).replace(",", ".")[:26]).timestamp()
                return min(t, mtime), rec["iteration"]
            except ValueError:
                pass
        return mtime, rec["iteration"]
    return mtime, None


def detect_hang(log_path: str | Path, *, timeout_s: float, now: float | None = None) -> Failure | None:
    """A ``hang`` Failure if no new iteration was logged for more than ``timeout_s`` seconds.

    Call it while the job runs (``now`` defaults to the current time). A log that does not exist
    yet is not a hang: the job may still be queued.
    """
    path = Path(log_path)
    if not path.exists():
        return None
    now = time.time() if now is None else now
    t, it = last_progress(path)
    quiet = now - t
    if quiet <= timeout_s:
        return None
    where = f"after iteration {it}" if it is not None else "before the first iteration"
    return Failure("hang", None, None, f"no new iteration for {quiet:.0f} s (> timeout {timeout_s:g} s) "
                   f"{where}; log {path}", HINTS["hang"], key="hang")
