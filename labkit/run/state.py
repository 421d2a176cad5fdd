"""A job's state, and the face of a job that the modules watching or guarding it read.

``JobState`` is labkit's state of a job on any backend (each backend maps its own states to
these). ``JobLike`` is the face of ``labkit.backends.job.Job`` that the hang watchdog, the
failure diagnosis and the ownership checks use: they take a job as it is given and import
nothing from ``labkit.backends``.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol


class JobState(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    NODE_FAIL = "NODE_FAIL"
    """A node of the job failed and Slurm ended the job (with ``--requeue`` it goes back to
    the queue instead: REQUEUED, then PENDING)."""
    PREEMPTED = "PREEMPTED"
    """A higher-priority job took the nodes and Slurm ended this one (preempted with requeue,
    it goes back to the queue instead)."""
    BOOT_FAIL = "BOOT_FAIL"
    """A node failed to start (boot) for the job; it never ran."""
    DEADLINE = "DEADLINE"
    """The job's ``--deadline`` passed before it could finish."""
    REQUEUED = "REQUEUED"
    """Going back to the queue after an attempt ended (node failure, preemption, the warning
    signal): its next attempt resumes from the last checkpoint."""
    REQUEUE_HOLD = "REQUEUE_HOLD"
    """Requeued and held: it waits until ``scontrol release JOBID``."""
    UNKNOWN = "UNKNOWN"

    @property
    def finished(self) -> bool:
        return self in FINISHED


FINISHED = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT,
                      JobState.OUT_OF_MEMORY, JobState.NODE_FAIL, JobState.PREEMPTED,
                      JobState.BOOT_FAIL, JobState.DEADLINE})


class JobLike(Protocol):
    """A labkit job: its record's fields, its log, and the three things one does with it."""

    job_id: str
    name: str
    run_dir: Path
    backend: str
    submitted_at: float
    info: dict[str, Any]

    @property
    def log_path(self) -> Path: ...

    def state(self) -> JobState: ...

    def tail(self, n: int = 20) -> str: ...

    def exit_code(self) -> int | None: ...

    def cancel(self) -> bool: ...

    def wait(self, timeout: float | None = None, progress: bool = True,
             **kwargs: Any) -> JobState: ...
