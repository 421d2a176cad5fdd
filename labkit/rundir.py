"""Run directories: ``runs/<name>/`` with ``config.json``, ``job.sh``, ``log.txt``, ``tb/``,
``checkpoints/``, ``profile/``, ``exit_code`` and ``plan.json``.

A run never takes over another run's directory silently: an existing directory with anything
in it is refused unless ``overwrite=True`` (which moves the old one aside, never deletes it) or
``resume=True`` (which keeps checkpoints so the engine continues from them).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from labkit.config import RunConfig
from labkit.errors import ConfigError, SubmissionError
from labkit.paths import run_dir as _run_dir

if TYPE_CHECKING:
    from labkit.backends.spec import JobSpec


def prepare_run_dir(cfg: RunConfig | JobSpec, *, root: str | Path | None = None,
                    overwrite: bool = False, resume: bool = False) -> Path:
    """Create ``<root>/<cfg.name>/`` and write a RunConfig's ``config.json`` (a JobSpec for
    another program has none); returns the directory.

    Raises SubmissionError if the directory already holds a run and neither ``overwrite`` nor
    ``resume`` is given.
    """
    d = _run_dir(cfg.name, root)
    if d.exists() and any(d.iterdir()) and not _only_this_config(d, cfg):
        if overwrite:
            aside = d.with_name(f"{d.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
            d.rename(aside)
        elif resume:
            old = d / "config.json"
            if old.exists() and isinstance(cfg, RunConfig):
                prev = RunConfig.from_json(old)
                if prev.replace(train_iters=cfg.train_iters) != cfg.replace(
                        train_iters=cfg.train_iters, extra=prev.extra):
                    raise SubmissionError(
                        f"cannot resume run {cfg.name!r} in {d}: its config.json differs from "
                        f"this config (beyond train_iters). Use a new name, or overwrite=True "
                        f"to move the old run aside.")
            for stale in ("exit_code",):
                (d / stale).unlink(missing_ok=True)
        else:
            held = ", ".join(sorted(p.name for p in d.iterdir())[:6])
            raise SubmissionError(
                f"run directory {d} already holds a run ({held}). "
                f"Pick another name, pass resume=True to continue from its checkpoint, or "
                f"overwrite=True to move it aside (nothing is deleted).")
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(cfg, RunConfig):
        cfg.to_json(d / "config.json")
    return d


def _only_this_config(d: Path, cfg: RunConfig | JobSpec) -> bool:
    """A directory that holds only this run's own config.json (as ``labkit new`` writes it) is
    not a run yet: submitting that config starts it there."""
    if not isinstance(cfg, RunConfig) or [p.name for p in d.iterdir()] != ["config.json"]:
        return False
    try:
        return RunConfig.from_json(d / "config.json") == cfg
    except ConfigError:
        return False
