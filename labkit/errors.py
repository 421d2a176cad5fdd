"""The exceptions labkit raises.

Every message follows one template: what happened, the values involved, where to look, what to
try. Catch ``LabkitError`` to catch them all.
"""

from __future__ import annotations


class LabkitError(Exception):
    """Base class of every error labkit raises on purpose."""


class ConfigError(LabkitError, ValueError):
    """A RunConfig (or cluster profile) breaks one or more rules; raised before any submission.

    ``violations`` holds one line per broken rule, each with its numbers and a fix.
    """

    def __init__(self, violations: list[str] | str, *, name: str | None = None):
        self.violations = [violations] if isinstance(violations, str) else list(violations)
        head = f"invalid run config{f' {name!r}' if name else ''}"
        if len(self.violations) == 1:
            msg = f"{head}: {self.violations[0]}"
        else:
            lines = "\n".join(f"  - {v}" for v in self.violations)
            msg = f"{head}: {len(self.violations)} problems\n{lines}"
        super().__init__(msg)


class SubmissionError(LabkitError, RuntimeError):
    """A job could not be submitted (sbatch refused, no sbatch on PATH, run dir taken, ...)."""


class JobFailedError(LabkitError, RuntimeError):
    """A job ended in a state other than COMPLETED; carries its id, state and the log's tail."""

    def __init__(self, message: str, *, job_id: str | None = None, state: str | None = None,
                 log_tail: str = ""):
        self.job_id, self.state, self.log_tail = job_id, state, log_tail
        super().__init__(message)
