"""Job: one submitted run, whatever backend runs it (its ``JobState``: ``labkit.jobstate``).

A Job is recorded in its run directory (``job.json``: id, backend, when), so another process (a
restarted notebook kernel, ``labkit status``) can load it, and so labkit only ever touches jobs
it submitted itself. The backend modules (``local``, ``slurm``) answer ``states`` and ``cancel``.

Watching a job: ``wait(hang_timeout=S)`` runs the hang watchdog (``labkit.watchdog``), and
``wait(on_poll=fn)`` calls ``fn(job, state)`` after every poll (it may raise to stop waiting).
The dependency goes one way: this module imports the watchdog when asked to, and the watchdog
takes the job as it is given, importing nothing from ``labkit.backends``.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit._logging import log
from labkit.backends.ownership import refuse_if_live, verify_owned
from labkit.backends.queue import describe, latest_iteration
from labkit.errors import ConfigError, JobFailedError, LabkitError
from labkit.jobstate import FINISHED, JobState
from labkit.paths import run_root
from labkit.rules import NAME_RE

__all__ = ["FINISHED", "JOB_FILE", "Job", "JobState", "Watcher", "backend_module"]


JOB_FILE = "job.json"
Watcher = Callable[["Job", JobState], None]
_ITER_RE = re.compile(rb"iteration\s+(\d+)\s*/\s*(\d+)")


def backend_module(name: str) -> Any:
    if name not in ("local", "slurm", "hostfile"):
        raise LabkitError(f"unknown backend {name!r}; use 'local', 'slurm' or 'hostfile'")
    return importlib.import_module(f"labkit.backends.{name}")


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
        d = {"job_id": self.job_id, "name": self.name, "run_dir": str(self.run_dir),
             "backend": self.backend, "submitted_at": self.submitted_at, "info": self.info}
        (self.run_dir / JOB_FILE).write_text(json.dumps(d, indent=2) + "\n")

    @classmethod
    def load(cls, run_dir: str | Path) -> Job:
        """The job recorded in ``run_dir/job.json`` (a run name is looked up in the run root).

        The record is checked field by field (a malformed or forged one raises LabkitError,
        never another exception), and the job's directory is the one the record is in,
        whatever the record says: a run moved aside keeps its own log and exit code. A loaded
        job is acted on (cancelled) only after ``ownership.verify_owned``.
        """
        p = Path(run_dir)
        if not (p / JOB_FILE).exists() and not p.is_absolute() and len(p.parts) == 1:
            p = run_root() / p
        f = p / JOB_FILE
        try:
            if f.stat().st_size > 1_000_000:
                raise ValueError(f"{f.stat().st_size:,} bytes is not a job record")
            d = json.loads(f.read_bytes().decode("utf-8"))
        except (OSError, ValueError, RecursionError) as e:
            raise LabkitError(f"no labkit job recorded in {f} ({e}); labkit only knows the "
                              f"jobs it submitted (labkit status lists them)") from None
        job = cls(run_dir=p.resolve(), _verified=False, **_record_fields(d, f))
        return job

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
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - 200 * n - 4096))
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def status_line(self, state: JobState | None = None) -> str:
        """The state, with Slurm's reason and place in the queue while PENDING, or the latest
        iteration, lm loss and time per iteration while RUNNING (``labkit.backends.queue``)."""
        st = state or self.state()
        return describe(str(st), backend=self.backend, job_id=self.job_id, info=self.info,
                        latest=latest_iteration(self.tail(40).encode()))

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
        bar = _Progress(self) if progress else None
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
                time.sleep(max(0.05, min(delay, left if left is not None else delay)))
                delay = min(max_interval, delay * 1.6)
        except KeyboardInterrupt:
            self._interrupted(cancel_on_interrupt)
            raise
        finally:
            if bar:
                bar.close()
        if raise_on_failure and st.finished and st is not JobState.COMPLETED:
            raise self.failure_error(st)
        return st

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

    def failure_error(self, st: JobState) -> JobFailedError:
        end = time.time()
        for f in (self.run_dir / "exit_code", self.log_path):  # when it really ended
            if f.exists():
                end = f.stat().st_mtime
                break
        elapsed = time.strftime("%H:%M:%S", time.gmtime(max(0, end - self.submitted_at)))
        tail = self.tail(20)
        backend_hint = getattr(backend_module(self.backend), "failure_hint", None)
        hint = ((backend_hint(self, st) if backend_hint else None) or _diagnosis(self, st)
                or _STATE_HINTS.get(st, ""))
        msg = (f"job {self.job_id} ({self.name}) ended {st} after {elapsed} "
               f"(exit code {self.exit_code()})."
               + (f"\nLikely cause: {hint}" if hint else "")
               + f"\nLast log lines:\n{tail or '(log is empty)'}\nFull log: {self.log_path}")
        return JobFailedError(msg, job_id=self.job_id, state=str(st), log_tail=tail)


def guard_not_live(run_dir: str | Path, doing: str = "move it aside") -> None:
    """Raise SubmissionError when a PENDING or RUNNING job holds ``run_dir`` (its record there
    says which); a directory without a readable record holds nothing."""
    d = Path(run_dir)
    if not (d / JOB_FILE).exists():
        return
    try:
        job = Job.load(d)
    except LabkitError:
        return
    refuse_if_live(job, d, doing)


_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")


def _record_fields(d: Any, f: Path) -> dict[str, Any]:
    """The fields of a job record, checked; LabkitError naming the first bad one."""
    def bad(what: str) -> LabkitError:
        return LabkitError(f"malformed labkit job record {f}: {what}; labkit leaves it alone "
                           f"(move it away, or resubmit the run)")

    if not isinstance(d, dict):
        raise bad(f"a JSON object is expected, not {type(d).__name__}")
    job_id, name, backend = d.get("job_id"), d.get("name"), d.get("backend")
    if isinstance(job_id, int) and not isinstance(job_id, bool):
        job_id = str(job_id)
    if not isinstance(job_id, str) or not _ID_RE.fullmatch(job_id):
        raise bad(f"job_id={job_id!r:.60} is not a job id")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise bad(f"name={name!r:.60} is not a run name")
    if not isinstance(backend, str) or not re.fullmatch(r"[a-z]{1,20}", backend):
        raise bad(f"backend={backend!r:.60} is not a backend")
    when = d.get("submitted_at", 0.0)
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not 0 <= when < 1e11:
        raise bad(f"submitted_at={when!r:.60} is not a time")
    info = d.get("info", {})
    if not isinstance(info, dict):
        raise bad(f"info={info!r:.60} is not a mapping")
    return {"job_id": job_id, "name": name, "backend": backend, "submitted_at": float(when),
            "info": info}


_STATE_HINTS = {
    JobState.TIMEOUT: "the job hit its time limit: raise time_limit in the cluster profile or "
                      "lower train_iters",
    JobState.CANCELLED: "the job was cancelled (by labkit cancel, scancel or an administrator)",
    JobState.OUT_OF_MEMORY: "a process ran out of memory: lower micro_batch_size, use more "
                            "TP/PP, or recompute_granularity='selective'",
    JobState.NODE_FAIL: "a node failed under the job: resubmit; if it repeats, tell the admins",
}


def _diagnosis(job: Job, st: JobState) -> str | None:
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


class _Progress:
    """A tqdm bar over training iterations, fed by reading the log's new bytes."""

    def __init__(self, job: Job):
        # tqdm: only while a progress bar is shown
        from tqdm.auto import tqdm

        self.job, self.offset, self.done, self.latest = job, 0, 0, None
        total = None
        try:
            total = json.loads((job.run_dir / "config.json").read_text()).get("train_iters")
        except (OSError, ValueError):
            pass
        self.bar = tqdm(total=total, desc=job.name, unit="it", file=sys.stderr, leave=True)

    def update(self, st: JobState) -> None:
        try:
            with open(self.job.log_path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            chunk = b""
        cut = chunk.rfind(b"\n") + 1  # only whole lines; the rest is read next time
        self.offset += cut
        its = [int(m.group(1)) for m in _ITER_RE.finditer(chunk[:cut])]
        if its and max(its) > self.done:
            self.bar.update(max(its) - self.done)
            self.done = max(its)

        self.latest = latest_iteration(chunk[:cut]) or self.latest
        self.bar.set_postfix_str(describe(str(st), backend=self.job.backend, job_id=self.job.job_id,
                                          info=self.job.info, latest=self.latest), refresh=True)

    def close(self) -> None:
        self.bar.close()
