"""Job: one submitted run, whatever backend runs it: ``state()``, ``cancel()``, ``wait()``.

A Job is what a backend's ``submit`` returns and what its record (``labkit.run.record``,
``job.json``) loads back; its ``JobState`` is ``labkit.run.state``'s. The backend modules
(``local``, ``slurm``, ``hostfile``) answer ``states`` and ``cancel``; a record read from disk
is acted on only once ``labkit.backends.ownership.verify_owned`` passed.

Beside it, not inside it: the progress bar (``labkit.backends.progress``), the hang watchdog
(``labkit.watchdog``: ``wait(hang_timeout=S)``), and the diagnosis of a failed job
(``labkit.backends.diagnosis.failure_error``). ``wait(on_poll=fn)`` calls ``fn(job, state)``
after every poll (it may raise to stop waiting).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit._logging import log
from labkit.backends import backend_module
from labkit.backends.diagnosis import failure_error
from labkit.backends.ownership import verify_owned
from labkit.backends.progress import Progress
from labkit.backends.queue import describe, latest_iteration
from labkit.errors import ConfigError, LabkitError
from labkit.paths import run_root
from labkit.run.record import JOB_FILE, read_record, write_record
from labkit.run.state import FINISHED, JobState
from labkit.validate import read_file_tail

__all__ = ["FINISHED", "JOB_FILE", "Job", "JobState", "Watcher"]


Watcher = Callable[["Job", JobState], None]


@dataclass
class Job:
    """A submitted run: ``state()``, ``wait()``, ``cancel()``, ``tail()``, ``log_path``."""

    job_id: str
    name: str
    run_dir: Path
    backend: str
    submitted_at: float = field(default_factory=time.time)
    info: dict[str, Any] = field(default_factory=dict)
    """Backend details: local process group and start time; Slurm's SLURM_CONF."""
    _final: JobState | None = field(default=None, repr=False, compare=False)
    _verified: bool = field(default=True, repr=False, compare=False)
    """False for a job read from a record on disk until ``ownership.verify_owned`` passed."""

    # --- record ---------------------------------------------------------------------------
    @property
    def log_path(self) -> Path:
        return self.run_dir / "log.txt"

    def save(self) -> None:
        """Write the job's record (``labkit.run.record``)."""
        write_record(self.run_dir, {"job_id": self.job_id, "name": self.name,
                                    "run_dir": str(self.run_dir), "backend": self.backend,
                                    "submitted_at": self.submitted_at, "info": self.info})

    @classmethod
    def load(cls, run_dir: str | Path) -> Job:
        """The job recorded in ``run_dir/job.json`` (a run name is looked up in the run root).

        The record is read and checked by ``labkit.run.record.read_record`` (NoRecord,
        BadRecord: LabkitError), and the job's directory is the one the record is in,
        whatever the record says. A loaded job is acted on (cancelled) only after
        ``ownership.verify_owned``.
        """
        p = Path(run_dir)
        if not (p / JOB_FILE).exists() and not p.is_absolute() and len(p.parts) == 1:
            p = run_root() / p
        return cls(run_dir=p.resolve(), _verified=False, **read_record(p))

    def to_dict(self, state: JobState | None = None) -> dict[str, Any]:
        """DESIGN section 5: ``{"job_id", "name", "run_dir", "backend", "state"}``."""
        return {"job_id": self.job_id, "name": self.name, "run_dir": str(self.run_dir),
                "backend": self.backend, "state": str(state or self.state())}

    # --- state ----------------------------------------------------------------------------
    def state(self) -> JobState:
        if self._final is not None:
            return self._final
        st = backend_module(self.backend).states([self])[self.job_id]
        if st.finished:
            self._final = st  # finished states never change again
        return st

    def cancel(self) -> bool:
        """Cancel this job (and only it); True when something was cancelled. A finished job is
        left as it is (False). A job read from disk is checked to be the caller's own first
        (``ownership.verify_owned``: NotOwnedError otherwise)."""
        if not self._verified:
            verify_owned(self)
            self._verified = True
        if self.state().finished:
            return False
        backend_module(self.backend).cancel(self)
        self._final = None
        return True

    def tail(self, n: int = 20) -> str:
        """The last ``n`` lines of the log ('' before the job wrote anything)."""
        try:  # a regular file only, its end only (not a FIFO, /dev/zero or a link)
            lines = read_file_tail(self.log_path, 200 * n + 4096).decode(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def status_line(self, state: JobState | None = None) -> str:
        """The state, with Slurm's reason and place in the queue while PENDING, or the latest
        iteration, lm loss and time per iteration while RUNNING, and for a job Slurm requeued
        its attempt and how the last one ended (``labkit.backends.queue``)."""
        st = state or self.state()
        return describe(str(st), backend=self.backend, job_id=self.job_id, info=self.info,
                        latest=latest_iteration(self.tail(40).encode()), log_path=self.log_path)

    def exit_code(self) -> int | None:
        try:
            return int((self.run_dir / "exit_code").read_text().strip())
        except (OSError, ValueError):
            return None

    # --- waiting --------------------------------------------------------------------------
    def wait(self, timeout: float | None = None, progress: bool = True,
             raise_on_failure: bool = False, on_poll: Watcher | None = None,
             max_interval: float = 5.0, hang_timeout: float | None = None,
             cancel_on_interrupt: bool = True) -> JobState:
        """Poll until the job finishes (or ``timeout`` seconds pass); returns the last state.

        Polls back off from 0.5 s to ``max_interval``. ``progress`` shows a tqdm bar (terminal
        or Jupyter, on stderr) of the training iterations found in the log. With
        ``raise_on_failure`` a finished state other than COMPLETED raises JobFailedError with
        the log's tail and a hint. ``on_poll(job, state)`` runs after every poll.

        ``hang_timeout``: seconds without a new log line before the first iteration, or without
        a new iteration after it, that count as a hang. The hang watchdog then writes its
        diagnosis (each rank's last line, py-spy stacks, suspect ranks) to
        ``hang-*.txt`` in the run directory, cancels the job and raises
        ``labkit.watchdog.HangError`` (a JobFailedError) with the report.

        Interrupted (Ctrl-C, a notebook's stop button: KeyboardInterrupt) while the job is not
        finished, the job is cancelled and the interrupt goes on; ``cancel_on_interrupt=False``
        leaves it running (``labkit cancel`` stops it later).
        """
        watchers = [on_poll] if on_poll else []
        if hang_timeout is not None:
            if isinstance(hang_timeout, bool) or not isinstance(hang_timeout, (int, float)) \
                    or not hang_timeout > 0:
                raise ConfigError(f"hang_timeout={hang_timeout!r} must be a number of seconds "
                                  f"> 0 (e.g. 300), or None for no hang watchdog")
            # the watchdog reads logs with pandas: only with a hang timeout
            from labkit.watchdog import HangWatchdog

            watchers.append(HangWatchdog(hang_timeout, cancel=True))
        start, delay = time.time(), 0.5
        bar = Progress(self) if progress else None
        ended = self._exit_code_stamp()
        try:
            while True:
                st = self.state()
                if bar:
                    bar.update(st)
                for fn in watchers:
                    fn(self, st)
                if st.finished or (timeout is not None and time.time() - start >= timeout):
                    break
                left = None if timeout is None else timeout - (time.time() - start)
                if (stamp := self._exit_code_stamp()) != ended:  # ranks done: the state follows
                    ended, delay = stamp, 0.5
                self._sleep_unless_ended(max(0.05, min(delay, left if left is not None else delay)),
                                         ended)
                delay = min(max_interval, delay * 1.6)
        except KeyboardInterrupt:
            self._interrupted(cancel_on_interrupt)
            raise
        finally:
            if bar:
                bar.close()
        if raise_on_failure and st.finished and st is not JobState.COMPLETED:
            raise failure_error(self, st)
        return st

    def _exit_code_stamp(self) -> int | None:
        try:
            return (self.run_dir / "exit_code").stat().st_mtime_ns
        except OSError:
            return None

    def _sleep_unless_ended(self, seconds: float, stamp: int | None) -> None:
        """Sleep ``seconds``, waking early when the run writes its exit code: a stat of a file is
        free where a poll of the scheduler (squeue) is not, so a finished run is not waited for
        up to ``max_interval`` seconds more."""
        until = time.monotonic() + seconds
        while (now := time.monotonic()) < until:
            time.sleep(min(0.25, until - now))
            if self._exit_code_stamp() != stamp:
                return

    def _interrupted(self, cancel: bool) -> None:
        try:
            if self.state().finished:
                return
            if not cancel:
                log.warning(f"interrupted: job {self.job_id} ({self.name}) keeps running; "
                            f"stop it with `labkit cancel {self.job_id}`")
                return
            self.cancel()
        except LabkitError as e:
            log.warning(f"interrupted: job {self.job_id} ({self.name}) could not be cancelled "
                        f"({e}); stop it with `labkit cancel {self.job_id}`")
            return
        log.warning(f"interrupted: cancelled job {self.job_id} ({self.name}); pass "
                    f"cancel_on_interrupt=False to wait() to leave a job running")
