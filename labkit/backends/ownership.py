"""Which jobs are the caller's own, and which run directories are still in use.

A ``job.json`` is a record on disk, and on a shared cluster anyone who can write a folder can
write one. labkit acts (status, cancel, clean) only on records that pass ``verify_owned``: the
record file belongs to the caller, sits in a run directory inside the caller's run root (or
the site profile's), and names that directory. The backends add their own checks before they
signal anything (the local backend: the process's start time, owner, process group and job
token; Slurm: the job's name and user).

``refuse_if_live(job)`` (and ``labkit.jobs.guard_not_live(run_dir)``, which loads the
directory's record first) is the rule that a PENDING or RUNNING job's directory is never moved
aside, reused or cleaned: it raises with the job's id and the command that cancels it. This
module takes jobs as they are given and imports nothing from ``labkit.backends``.
"""

from __future__ import annotations

import os
from pathlib import Path

from labkit.errors import LabkitError, SubmissionError
from labkit.paths import run_root
from labkit.run.state import JobLike


class NotOwnedError(LabkitError):
    """A job record that is not the caller's own labkit job: labkit does not act on it."""


def allowed_roots(extra: Path | str | None = None) -> list[Path]:
    """The caller's run roots: ``labkit.paths.run_root()`` and ``extra`` (a root the caller
    named: the site's run root, as the entry point resolved the site)."""
    roots = [run_root()]
    if extra is not None:
        roots.append(Path(extra).resolve())
    return roots


def _inside(d: Path, root: Path) -> bool:
    try:
        d.relative_to(root)
    except ValueError:
        return False
    return d != root


def verify_owned(job: JobLike, roots: list[Path] | None = None, *, allow_root: bool = False) -> None:
    """Raise NotOwnedError unless ``job`` is the caller's own labkit job (see the module).
    ``allow_root``: root may act on any user's record (an instructor's class-wide commands);
    the run-root check still applies."""
    d = Path(job.run_dir).resolve()
    record = d / "job.json"
    try:
        st = record.stat()
        dst = d.stat()
    except OSError as e:
        raise NotOwnedError(f"job {job.job_id} ({job.name}): no job record in {d} "
                            f"({e.strerror}); labkit only acts on jobs it submitted") from None
    me = os.geteuid()
    if (st.st_uid != me or dst.st_uid != me) and not (allow_root and me == 0):
        raise NotOwnedError(f"job {job.job_id} ({job.name}) in {d} belongs to user id "
                            f"{st.st_uid}, not to you ({me}); labkit only acts on your own jobs")
    roots = roots if roots is not None else allowed_roots()
    if not any(_inside(d, r) for r in roots):
        raise NotOwnedError(f"job {job.job_id} ({job.name}): its directory {d} is not inside your "
                            f"run root ({', '.join(map(str, roots))}); labkit only acts on jobs "
                            f"under it (set LABKIT_RUN_ROOT if you moved it)")


def owned(job: JobLike, roots: list[Path] | None = None) -> bool:
    """``verify_owned`` as a yes/no (for listings that leave other records out)."""
    try:
        verify_owned(job, roots)
    except NotOwnedError:
        return False
    return True


def live_state(job: JobLike) -> str | None:
    """The job's state when it is PENDING or RUNNING, else None (finished, or unknown)."""
    try:
        st = str(job.state())
    except LabkitError:
        return None  # an unreadable record starts nothing and holds nothing
    return st if st in ("PENDING", "RUNNING") else None


def refuse_if_live(job: JobLike, run_dir: str | Path | None = None, doing: str = "move it aside") -> None:
    """Raise SubmissionError when ``job`` (the one holding ``run_dir``) is PENDING or RUNNING:
    the message names the job and how to wait for it or cancel it."""
    st = live_state(job)
    if st is not None:
        raise SubmissionError(
            f"run {job.name!r} in {Path(run_dir or job.run_dir)} is still {st} as {job.backend} "
            f"job {job.job_id}; labkit will not {doing} while it runs. Wait for it (labkit watch "
            f"{job.job_id}) or cancel it first (labkit cancel {job.job_id}).")
