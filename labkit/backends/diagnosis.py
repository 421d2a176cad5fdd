"""Why a job failed: the message of the JobFailedError that ``Job.wait(raise_on_failure=True)``,
``labkit submit --wait`` and the notebooks' ``launch`` raise.

The likely cause comes from the backend's own ``failure_hint(job, state)`` where it has one
(the hostfile backend: hosts lost under the job), else from the log parser's diagnosis
(``labkit.logs.diagnose``), else from what the state itself means. The job is taken as it is
given (``labkit.run.state.JobLike``).
"""

from __future__ import annotations

import time

from labkit.backends import backend_module
from labkit.errors import JobFailedError
from labkit.run.state import JobLike, JobState


def failure_error(job: JobLike, st: JobState) -> JobFailedError:
    """The error for a job that ended ``st``: how long it ran, its exit code, the likely cause
    (the backend's own hint, else the log parser's diagnosis, else what the state means), the
    log's last lines and where the full log is."""
    end = time.time()
    for f in (job.run_dir / "exit_code", job.log_path):  # when it really ended
        if f.exists():
            end = f.stat().st_mtime
            break
    elapsed = time.strftime("%H:%M:%S", time.gmtime(max(0, end - job.submitted_at)))
    tail = job.tail(20)
    backend_hint = getattr(backend_module(job.backend), "failure_hint", None)
    hint = ((backend_hint(job, st) if backend_hint else None) or _diagnosis(job, st)
            or _STATE_HINTS.get(st, ""))
    msg = (f"job {job.job_id} ({job.name}) ended {st} after {elapsed} "
           f"(exit code {job.exit_code()})."
           + (f"\nLikely cause: {hint}" if hint else "")
           + f"\nLast log lines:\n{tail or '(log is empty)'}\nFull log: {job.log_path}")
    return JobFailedError(msg, job_id=job.job_id, state=str(st), log_tail=tail)


_STATE_HINTS = {
    JobState.TIMEOUT: "the job hit its time limit: raise time_limit in the cluster profile or "
                      "lower train_iters",
    JobState.CANCELLED: "the job was cancelled (by labkit cancel, scancel or an administrator)",
    JobState.OUT_OF_MEMORY: "a process ran out of memory: lower micro_batch_size, use more "
                            "TP/PP, or recompute_granularity='selective'",
    JobState.NODE_FAIL: "a node failed under the job: resubmit; if it repeats, tell the admins",
}


def _diagnosis(job: JobLike, st: JobState) -> str | None:
    """The log parser's hint for the most likely root cause (``labkit.logs.diagnose``)."""
    try:
        # labkit.logs brings pandas: off the CLI's start-up
        from labkit.logs import diagnose

        failures = diagnose(job.log_path, exit_code=job.exit_code(), job_state=str(st))
    except Exception:  # a parser problem must never hide the job's own error
        return None
    for f in failures:
        if getattr(f, "hint", None):
            where = f" (rank {f.rank}, log line {f.line})" if f.rank is not None else ""
            return f"{f.kind}{where}: {f.message}. {f.hint}"
    return None
