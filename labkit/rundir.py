"""Run directories: ``runs/<name>/`` with ``config.json``, ``job.sh``, ``log.txt``, ``tb/``,
``checkpoints/``, ``profile/``, ``exit_code`` and ``plan.json``.

A run never takes over another run's directory silently: an existing directory with anything
in it is refused unless ``overwrite=True`` (which moves the old one aside, never deletes it) or
``resume=True`` (which keeps checkpoints so the engine continues from them). A directory whose
job is still PENDING or RUNNING is never moved aside (``labkit.jobs.guard_not_live``).

A submission either happens or leaves everything as it was: ``claim_run_dir`` returns a
``Claim`` whose ``rollback()`` puts back what it changed (the directory it made is removed,
the run it moved aside is moved back, the small files it replaced get their old bytes).
"""

from __future__ import annotations

import errno
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from labkit.config import FIELD_NAMES, RunConfig
from labkit.errors import ConfigError, SubmissionError
from labkit.paths import run_dir as _run_dir
from labkit.run.record import point_record_at
from labkit.run.spec import JobSpec

# The files a (re)submission writes into an existing directory; a rollback restores them.
SUBMISSION_FILES = ("config.json", "job.sh", "plan.json", "job.json", "exit_code", "cancelled")


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

    def rollback(self) -> None:
        """Leave everything as it was before the claim (best effort, never raises)."""
        try:
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
    ``resume`` is given, or if it cannot be written (the message names the path and errno).
    The caller checks first that no live job holds the directory
    (``labkit.jobs.guard_not_live``).
    """
    d = _run_dir(cfg.name, root)
    try:
        claim = _claim(d, cfg, overwrite=overwrite, resume=resume)
    except OSError as e:
        raise unwritable(d, e) from None
    try:
        if isinstance(cfg, RunConfig):
            cfg.to_json(d / "config.json")
    except OSError as e:
        claim.rollback()
        raise unwritable(d, e) from None
    return claim


def prepare_run_dir(cfg: RunConfig | JobSpec, *, root: str | Path | None = None,
                    overwrite: bool = False, resume: bool = False) -> Path:
    """``claim_run_dir(...).dir``: create the run directory (see there)."""
    return claim_run_dir(cfg, root=root, overwrite=overwrite, resume=resume).dir


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
    if d.exists() and not d.is_dir():
        raise SubmissionError(f"{d} is a file, not a run directory; move it away or pick "
                              f"another name")
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
