"""Run directories: ``runs/<name>/`` with ``config.json``, ``job.sh``, ``log.txt``, ``tb/``,
``checkpoints/``, ``profile/``, ``exit_code`` and ``plan.json``.

A run never takes over another run's directory silently: an existing directory with anything
in it is refused unless ``overwrite=True`` (which moves the old one aside, never deletes it) or
``resume=True`` (which keeps checkpoints so the engine continues from them). A directory whose
job is still PENDING or RUNNING is never moved aside (``labkit.jobs.guard_not_live``).

One submission at a time: the claim is taken create-exclusive, so of two submissions of
one run at the same moment one wins and the other is refused; a run directory that is a
symbolic link, or a run root that belongs to another user, is refused.

A submission either happens or leaves everything as it was: ``claim_run_dir`` returns a
``Claim`` whose ``rollback()`` puts back what it changed (the directory it made is removed,
the run it moved aside is moved back, the small files it replaced get their old bytes).
"""

from __future__ import annotations

import errno
import os
import pwd
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from labkit.config import FIELD_NAMES, RunConfig
from labkit.errors import ConfigError, SubmissionError
from labkit.paths import run_dir as _run_dir
from labkit.run.record import point_record_at
from labkit.run.spec import JobSpec

# Taken create-exclusive by one submission while it starts (``_take``); gone once it started.
CLAIM_FILE = ".claim"
# The files a (re)submission writes into an existing directory; a rollback restores them.
SUBMISSION_FILES = ("config.json", "job.sh", "plan.json", "job.json", "exit_code", "cancelled",
                    "node_link.json")


@dataclass
class Claim:
    """A run directory taken for one submission, and how to give it back."""

    dir: Path
    created: bool = False
    """The directory did not exist (or was empty) before: a rollback removes it."""
    aside: Path | None = None
    """Where the earlier run was moved (overwrite): a rollback moves it back."""
    saved: dict[str, bytes | None] = field(default_factory=dict)
    """The submission files as they were (None: absent), restored by a rollback."""
    taken: bool = False
    """This submission holds the directory's claim mark (``CLAIM_FILE``)."""

    def release(self) -> None:
        """Give the claim mark back (the submission is done: its record now holds the run)."""
        if self.taken:
            (self.dir / CLAIM_FILE).unlink(missing_ok=True)
            self.taken = False

    def rollback(self) -> None:
        """Leave everything as it was before the claim (best effort, never raises)."""
        try:
            self.release()
            if self.created or self.aside is not None:
                shutil.rmtree(self.dir, ignore_errors=True)
                if self.aside is not None and self.aside.exists() and not self.dir.exists():
                    self.aside.rename(self.dir)
                    point_record_at(self.dir)
                return
            for name, old in self.saved.items():
                f = self.dir / name
                if old is None:
                    f.unlink(missing_ok=True)
                else:
                    f.write_bytes(old)
        except OSError:
            pass


def claim_run_dir(cfg: RunConfig | JobSpec, *, root: str | Path | None = None,
                  overwrite: bool = False, resume: bool = False) -> Claim:
    """Take ``<root>/<cfg.name>/`` for a submission and write a RunConfig's ``config.json``.

    Raises SubmissionError if the directory already holds a run and neither ``overwrite`` nor
    ``resume`` is given, if it is a symbolic link, if the run root belongs to another user,
    if another submission holds it right now, or if it cannot be written (the message names
    the path and errno). The claim holds the directory (``CLAIM_FILE``, create-exclusive)
    until ``release()``, once the job's record is written, or ``rollback()``. The caller
    checks first that no live job holds the directory (``labkit.jobs.guard_not_live``).
    """
    d = _run_dir(cfg.name, root)
    check_run_root(d.parent)
    try:
        claim = _claim(d, cfg, overwrite=overwrite, resume=resume)
    except OSError as e:
        raise unwritable(d, e) from None
    try:
        _take(claim)  # SubmissionError: another submission has it; nothing of ours to undo
        if isinstance(cfg, RunConfig):
            cfg.to_json(d / "config.json")
    except OSError as e:
        claim.rollback()
        raise unwritable(d, e) from None
    return claim


def prepare_run_dir(cfg: RunConfig | JobSpec, *, root: str | Path | None = None,
                    overwrite: bool = False, resume: bool = False) -> Path:
    """``claim_run_dir(...).dir``: create the run directory (see there)."""
    claim = claim_run_dir(cfg, root=root, overwrite=overwrite, resume=resume)
    claim.release()
    return claim.dir


def check_run_root(root: Path) -> None:
    """Refuse a run root that exists and belongs to another user: whoever owns it can swap the
    runs in it (a config with a million iterations, another job's record)."""
    try:
        st = os.stat(root)
    except OSError:
        return  # not there yet: it is made by the caller, as the caller
    me = os.geteuid()
    if st.st_uid != me:
        who = _user(st.st_uid)
        raise SubmissionError(
            f"run root {root} belongs to {who} (uid {st.st_uid}), not to you ({_user(me)}, uid "
            f"{me}): {who} could change or swap your runs there. Remove it (or ask {who} to) and "
            f"submit again, so that labkit makes it as yours, or set LABKIT_RUN_ROOT (the "
            f"cluster profile's run_root) to a folder of your own")


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"user {uid}"


def _take(claim: Claim) -> None:
    """Mark the directory as taken by this submission, atomically (create-exclusive): of two
    submissions of one run at the same moment, one wins and the other is refused. A mark left
    by a process that is gone (killed mid-submission) is stale and taken over."""
    f = claim.dir / CLAIM_FILE
    tmp = claim.dir / f".{CLAIM_FILE}.{os.getpid()}"
    tmp.write_text(f"{os.getpid()}\n")
    try:
        for _ in range(2):
            try:  # a hard link is made whole or not at all: a mark is never seen half written
                os.link(tmp, f)
                break
            except FileExistsError:
                holder = _holder(f)
                if holder is None:  # stale: its process is gone
                    f.unlink(missing_ok=True)
                    continue
                raise _claimed(claim.dir, holder) from None
        else:
            raise _claimed(claim.dir, _holder(f) or 0)
    finally:
        tmp.unlink(missing_ok=True)
    claim.taken = True
    if claim.aside is None and claim.saved.get("job.json") is None \
            and os.path.lexists(claim.dir / "job.json"):  # a run started since we looked
        claim.release()
        raise SubmissionError(f"run directory {claim.dir} now holds a run another submission "
                              f"just started; pick another name, or pass resume=True or "
                              f"overwrite=True")


def _claimed(d: Path, holder: int) -> SubmissionError:
    return SubmissionError(
        f"run directory {d} is being claimed by another submission right now (process "
        f"{holder}); this one is not started. Wait for it (labkit status), or pick another "
        f"name. If no submission runs, remove {d / CLAIM_FILE}")


def _holder(f: Path) -> int | None:
    """The live process that holds a claim mark, None when the mark is stale."""
    try:
        pid = int(f.read_text().strip() or "0")
    except (OSError, ValueError):
        return None
    if pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return pid


def unwritable(d: Path, e: OSError) -> SubmissionError:
    """The error for a run directory that cannot be written, naming the cause."""
    why = {errno.ENOSPC: "the disk is full (ENOSPC): free space there or use another run root",
           errno.EDQUOT: "the disk quota is exceeded (EDQUOT): free space or use another root",
           errno.EROFS: "the file system is read-only (EROFS): use another run root",
           errno.EACCES: "permission denied (EACCES): use a run root you can write",
           errno.ENOTDIR: "a part of the path is a file, not a folder (ENOTDIR)",
           errno.EEXIST: "a file of that name is in the way (EEXIST)"}.get(
        e.errno, f"{e.strerror or e} (errno {e.errno})")
    return SubmissionError(f"cannot write run directory {d}: {why}. Set LABKIT_RUN_ROOT (or the "
                           f"cluster profile's run_root) to a writable folder; nothing was "
                           f"submitted and no earlier run was changed")


def _claim(d: Path, cfg: RunConfig | JobSpec, *, overwrite: bool, resume: bool) -> Claim:
    if d.is_symlink():
        raise SubmissionError(f"{d} is a symbolic link (to {os.readlink(d)}), not a run "
                              f"directory: labkit runs, lists and cancels jobs only in real "
                              f"folders under the run root. Remove the link and set "
                              f"LABKIT_RUN_ROOT (or the profile's run_root) to the folder it "
                              f"points into instead")
    if d.exists() and not d.is_dir():
        raise SubmissionError(f"{d} is a file, not a run directory; move it away or pick "
                              f"another name")
    if os.path.lexists(d / CLAIM_FILE):
        if (holder := _holder(d / CLAIM_FILE)) is not None:
            raise _claimed(d, holder)
        (d / CLAIM_FILE).unlink(missing_ok=True)  # stale: its submission's process is gone
    if not d.exists() or not any(d.iterdir()):
        existed = d.exists()
        d.mkdir(parents=True, exist_ok=True)
        return Claim(d, created=not existed)
    if _only_this_config(d, cfg):
        return Claim(d, saved=_save(d))
    if overwrite:
        aside = d.with_name(f"{d.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
        n = 1
        while aside.exists():
            aside, n = aside.with_name(f"{d.name}.old-{time.strftime('%Y%m%d-%H%M%S')}-{n}"), n + 1
        d.rename(aside)
        point_record_at(aside)
        try:
            d.mkdir()
        except OSError:
            aside.rename(d)
            point_record_at(d)
            raise
        return Claim(d, aside=aside)
    if resume:
        old = d / "config.json"
        if old.exists() and isinstance(cfg, RunConfig):
            try:
                prev = RunConfig.from_json(old)
            except ConfigError as e:
                raise SubmissionError(f"cannot resume run {cfg.name!r} in {d}: its config.json "
                                      f"cannot be read ({e}); use a new name, or "
                                      f"overwrite=True to move the old run aside") from None
            diff = config_differences(prev, cfg)
            if diff:
                raise SubmissionError(
                    f"cannot resume run {cfg.name!r} in {d}: its config.json differs from this "
                    f"config in {'; '.join(diff)} (only train_iters may change on resume). "
                    f"Use the same values, a new name, or overwrite=True to move the old run "
                    f"aside.")
        claim = Claim(d, saved=_save(d))
        for stale in ("exit_code",):
            (d / stale).unlink(missing_ok=True)
        return claim
    held = ", ".join(sorted(p.name for p in d.iterdir())[:6])
    raise SubmissionError(
        f"run directory {d} already holds a run ({held}). "
        f"Pick another name, pass resume=True to continue from its checkpoint, or "
        f"overwrite=True to move it aside (nothing is deleted).")


def config_differences(prev: RunConfig, cfg: RunConfig) -> list[str]:
    """``field: old -> new`` for every field but train_iters and extra that differs."""
    a, b = prev.to_dict(), cfg.to_dict()
    return [f"{n}: {a[n]!r} -> {b[n]!r}" for n in FIELD_NAMES
            if n not in ("train_iters", "extra") and a[n] != b[n]]


def _save(d: Path) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for name in SUBMISSION_FILES:
        f = d / name
        try:
            out[name] = f.read_bytes() if f.is_file() else None
        except OSError:
            out[name] = None
    return out


def _only_this_config(d: Path, cfg: RunConfig | JobSpec) -> bool:
    """A directory that holds only this run's own config.json (as ``labkit new`` writes it) is
    not a run yet: submitting that config starts it there."""
    if not isinstance(cfg, RunConfig) or [p.name for p in d.iterdir()] != ["config.json"]:
        return False
    try:
        return RunConfig.from_json(d / "config.json") == cfg
    except ConfigError:
        return False
