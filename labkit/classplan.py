"""``labkit class plan``: what a class of N students will ask of the site, from a rehearsal.

The instructor runs the series once on the site (``labkit regress --cluster SITE``, or ``make
lab`` on this machine); every run it made is a notebook's own run config (``config.json``: the
nodes, processes per node, iterations) with its job record (``job.json``: when it was
submitted) and its end (``exit_code``, written when it ended). From those, per notebook: node-
hours per student (nodes x the run's wall time, queue wait included, so an upper bound), the
most nodes one run holds, and the disk a student's runs take (checkpoints apart); for the class:
N times those, and the peak of nodes if everyone runs the same notebook at once.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.errors import LabkitError
from labkit.paths import run_root
from labkit.site import ClusterProfile

_RUN = re.compile(r"^nb(\d\d)_")
CHECKPOINTS = "checkpoints"


@dataclass
class NotebookPlan:
    """One notebook's runs in the rehearsal, for one student."""

    notebook: str
    runs: int = 0
    node_hours: float = 0.0
    max_nodes: int = 0
    disk_bytes: int = 0
    checkpoint_bytes: int = 0
    unfinished: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"notebook": self.notebook, "runs": self.runs,
                "node_hours": round(self.node_hours, 4), "max_nodes": self.max_nodes,
                "disk_bytes": self.disk_bytes, "checkpoint_bytes": self.checkpoint_bytes,
                "unfinished": self.unfinished}


def _size(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):  # never follows a symlinked folder
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                continue
    return total


def _run(run_dir: Path) -> tuple[int, float | None]:
    """(nodes, wall seconds from submission to exit_code, None while it has not ended)."""
    cfg = json.loads((run_dir / "config.json").read_text())
    nodes = int(cfg.get("nodes") or 1)
    try:
        submitted = float(json.loads((run_dir / "job.json").read_text())["submitted_at"])
        ended = (run_dir / "exit_code").stat().st_mtime
    except (OSError, ValueError, KeyError, TypeError):
        return nodes, None
    return nodes, max(0.0, ended - submitted)


def rehearsal_root(site: ClusterProfile | None, given: str | Path | None) -> Path:
    """Where the rehearsal's runs are: ``given``, else the caller's run root on the site."""
    if given is not None:
        return Path(given)
    mine = site.run_root_path() if site is not None else None
    return mine if mine is not None and mine.is_dir() else run_root()


def class_plan(students: int, site: ClusterProfile | None = None,
               runs: str | Path | None = None) -> dict[str, Any]:
    """The plan for ``students`` students (see the module doc)."""
    if isinstance(students, bool) or not isinstance(students, int) or students < 1:
        raise LabkitError(f"students={students!r} must be a whole number >= 1")
    root = rehearsal_root(site, runs)
    per: dict[str, NotebookPlan] = {}
    for d in sorted(root.glob("nb[0-9][0-9]_*")) if root.is_dir() else []:
        m = _RUN.match(d.name)
        if not m or d.is_symlink() or not (d / "config.json").is_file():
            continue
        plan = per.setdefault(m.group(1), NotebookPlan(m.group(1)))
        try:
            nodes, wall = _run(d)
        except (OSError, ValueError) as e:
            raise LabkitError(f"{d}/config.json cannot be read ({e}); remove the run or give "
                              f"--runs another rehearsal") from None
        plan.runs += 1
        plan.max_nodes = max(plan.max_nodes, nodes)
        if wall is None:
            plan.unfinished.append(d.name)
        else:
            plan.node_hours += nodes * wall / 3600
        plan.disk_bytes += _size(d)
        if (d / CHECKPOINTS).is_dir() and not (d / CHECKPOINTS).is_symlink():
            plan.checkpoint_bytes += _size(d / CHECKPOINTS)
    if not per:
        raise LabkitError(f"no notebook runs (nbNN_*) in {root}: rehearse the series on the "
                          f"site first (labkit regress --cluster SITE.yaml; make lab here), or "
                          f"give --runs DIR where a rehearsal's runs are")
    rows = [per[k] for k in sorted(per)]
    peak = max(rows, key=lambda r: r.max_nodes)
    each = sum(r.node_hours for r in rows)
    disk = sum(r.disk_bytes for r in rows)
    ckpt = sum(r.checkpoint_bytes for r in rows)
    return {
        "students": students, "runs_from": str(root),
        "site": site.name if site is not None else None,
        "partition": site.partition if site is not None else None,
        "exclusive": bool(site.exclusive) if site is not None else False,
        "notebooks": [r.to_dict() for r in rows],
        "node_hours_per_student": round(each, 4),
        "node_hours_class": round(each * students, 4),
        "peak_nodes": peak.max_nodes * students, "peak_notebook": peak.notebook,
        "server_jobs": students,
        "disk_bytes_per_student": disk, "checkpoint_bytes_per_student": ckpt,
        "disk_bytes_class": disk * students,
    }


__all__ = ["NotebookPlan", "class_plan", "rehearsal_root"]
