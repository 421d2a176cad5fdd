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
    UNKNOWN = "UNKNOWN"

    @property
    def finished(self) -> bool:
        return self in FINISHED


FINISHED = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT,
                      JobState.OUT_OF_MEMORY, JobState.NODE_FAIL})


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
