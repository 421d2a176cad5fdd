"""A class on a shared cluster: the caller's own jobs, their clean-up, and the instructor's view.

A student sees and acts on their own labkit jobs only (``my_jobs``, ``cancel_all``, ``clean``):
the runs under ``labkit.paths.run_root()`` and under the cluster profile's ``run_root`` with
``{user}`` filled in, whose record (``job.json``) the caller owns. The instructor, with read
access to the shared root, sees every student (``class_status``); ending or cleaning their runs
(``class_cancel_all``, ``class_clean``) needs the rights to do so (root) and is refused before
anything is touched otherwise. Only labkit's own jobs are touched, never other Slurm jobs.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit import slurmcli
from labkit._logging import warn_once
from labkit.backends.job import Job
from labkit.backends.ownership import verify_owned
from labkit.backends.slurm import SLURM_STATES, job_name
from labkit.errors import ConfigError, LabkitError
from labkit.jobs import get_job, job_states, list_jobs, run_dirs
from labkit.paths import run_root
from labkit.run.record import JOB_FILE, BadRecord
from labkit.run.state import JobState
from labkit.site import ClusterProfile, as_profile, current_user
from labkit.slurmcli import SlurmError
from labkit.validate import loads_json, read_file_tail, read_input, regular_file

_ITER_RE = re.compile(rb"iteration\s+(\d+)\s*/\s*(\d+)")
_NOTEBOOK_RE = re.compile(r"^nb(\d\d)_")
CHECKPOINT_DIRS = ("checkpoints",)


def my_roots(cluster: ClusterProfile | str | Path | None = None) -> list[Path]:
    """Where the caller's runs live: ``run_root()`` and the cluster's per-user run root."""
    roots = [run_root()]
    site = _site_or_none(cluster)
    if site is not None and (r := site.run_root_path()) is not None:
        roots.append(r)
    return list(dict.fromkeys(Path(os.path.abspath(r)) for r in roots))


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def owner(run_dir: Path) -> str | None:
    """The user owning a run directory's job record; None if it is gone."""
    try:
        return user_name((Path(run_dir) / JOB_FILE).stat().st_uid)
    except OSError:
        return None


def my_jobs(cluster: ClusterProfile | str | Path | None = None) -> list[Job]:
    """The caller's own labkit jobs (``labkit.backends.ownership``), oldest first."""
    seen: dict[Path, Job] = {}
    for root in my_roots(cluster):
        for j in list_jobs(root):
            seen.setdefault(j.run_dir, j)
    return sorted(seen.values(), key=lambda j: j.submitted_at)


def find_job(ref: str, cluster: ClusterProfile | str | Path | None = None) -> Job:
    """One of the caller's jobs by job id, run name or run directory; another user's job is
    refused (``labkit.backends.ownership.verify_owned``), however it was named."""
    roots = my_roots(cluster)
    if "/" not in ref:
        for root in reversed(roots):  # the site's root first: that is where Slurm runs are
            try:
                return get_job(ref, root)
            except LabkitError:
                continue
    return get_job(ref, next((r for r in roots if Path(ref).resolve().is_relative_to(r)),
                             roots[-1]))


def cancel_all(cluster: ClusterProfile | str | Path | None = None) -> list[dict[str, Any]]:
    """Cancel every PENDING or RUNNING job of the caller's; returns what was cancelled."""
    jobs = my_jobs(cluster)
    return _cancel_live(jobs, job_states(jobs))


def _cancel_live(jobs: list[Job], states: dict[str, JobState], *, as_instructor: bool = False
                 ) -> list[dict[str, Any]]:
    out = []
    for j in jobs:
        st = states.get(j.job_id, JobState.UNKNOWN)
        if st.finished or st is JobState.UNKNOWN:
            continue
        if as_instructor:
            _class_cancel(j)
        else:
            j.cancel()
        out.append({**j.to_dict(st), "user": owner(j.run_dir)})
    return out


@dataclass(frozen=True)
class Freed:
    """One thing ``clean`` removed (or would remove with ``dry_run``)."""

    path: str
    bytes: int
    run: str
    user: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "bytes": self.bytes, "run": self.run, "user": self.user}


def clean(cluster: ClusterProfile | str | Path | None = None, *, dry_run: bool = False,
          keep_last: int = 0, whole_runs: bool = False) -> list[Freed]:
    """Remove the checkpoints (``whole_runs``: the whole run directories) of the caller's
    finished runs, keeping the newest ``keep_last`` runs as they are. A run whose job is not
    finished (or whose state is unknown) is never touched."""
    jobs = my_jobs(cluster)
    return _clean(jobs, job_states(jobs), dry_run=dry_run, keep_last=keep_last,
                  whole_runs=whole_runs)


def _clean(jobs: list[Job], states: dict[str, JobState], *, dry_run: bool, keep_last: int,
           whole_runs: bool) -> list[Freed]:
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0:
        raise LabkitError(f"keep_last={keep_last!r} must be a whole number >= 0")
    done = [j for j in jobs if states.get(j.job_id, JobState.UNKNOWN).finished]
    done.sort(key=lambda j: j.submitted_at)
    drop = done[:len(done) - keep_last] if keep_last else done
    out = []
    for j in drop:
        who = owner(j.run_dir)
        targets = [j.run_dir] if whole_runs else [j.run_dir / n for n in CHECKPOINT_DIRS]
        for t in targets:
            if t.is_symlink() or (t.exists() and not t.is_dir()):  # never followed, never a file
                warn_once(f"not removed: {t} is a {'symlink' if t.is_symlink() else 'file'}, not a "
                          f"folder; look at it and remove it by hand if it is yours")
            if t.is_symlink() or not t.is_dir():
                continue
            size = _size(t)
            if not dry_run:
                shutil.rmtree(t)
            out.append(Freed(str(t), size, j.name, who))
    return out


def _size(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                continue
    return total


# --- the instructor's view ---------------------------------------------------------------------
def _site_or_none(cluster: ClusterProfile | str | Path | None) -> ClusterProfile | None:
    site = as_profile(cluster)  # the site the entry point resolved (labkit.site.resolve_cluster)
    return site if site is not None and site.run_root else None


def student_roots(cluster: ClusterProfile | str | Path | None = None) -> dict[str, Path]:
    """{user: run root} of every student under the cluster profile's ``run_root``.

    With ``{user}`` in it, every existing directory matching the pattern is one student's; a
    run root without ``{user}`` is shared by all, and its runs are told apart by owner."""
    site = _site_or_none(cluster)
    if site is None:
        raise LabkitError("the class view needs a cluster profile with a shared run_root, e.g. "
                          "run_root: /shared/labkit/{user}/runs (give --cluster SITE.yaml or set "
                          "$LABKIT_CLUSTER)")
    pattern = site.run_root
    if "{user}" not in pattern:
        return {"*": Path(pattern)}
    head, _, tail = pattern.partition("{user}")
    base = Path(head) if head.endswith("/") else Path(head).parent
    prefix = "" if head.endswith("/") else Path(head).name
    if not base.is_dir():
        raise LabkitError(f"the class run root {base} does not exist (yet): no student has run "
                          f"anything, or run_root {pattern!r} is not this cluster's")
    try:
        entries = sorted(base.iterdir())
    except PermissionError:
        raise LabkitError(f"cannot list {base}: the class view needs read access to the "
                          f"shared run root (run it as the instructor, or root)") from None
    out = {}
    for e in entries:
        if e.is_dir() and e.name.startswith(prefix):
            user = e.name[len(prefix):]
            root = Path(pattern.replace("{user}", user))
            if user and root.is_dir():
                out[user] = root
    return out


def _class_states(jobs: list[Job]) -> dict[str, JobState]:
    """States of every student's jobs. The backends answer for the caller's own jobs only, so
    Slurm jobs are read here from one ``squeue`` of all users: a job counts as the record's
    only when Slurm's job of that id has the record's job name (``labkit-<user>-<run>``) and
    belongs to the record's owner."""
    slurm = [j for j in jobs if j.backend == "slurm"]
    out = job_states([j for j in jobs if j.backend != "slurm"])
    tables = {conf: _squeue_all(conf) for conf in {j.info.get("slurm_conf") for j in slurm}}
    for j in slurm:
        table = tables[j.info.get("slurm_conf")]
        rec = table.get(j.job_id) if table is not None else None
        uid = _owner_uid(j.run_dir)
        if rec is not None and rec[1] == job_name(j) and rec[2] == uid:
            out[j.job_id] = _slurm_map(rec[0])
        elif (code := j.exit_code()) is not None:
            out[j.job_id] = JobState.COMPLETED if code == 0 else JobState.FAILED
        else:
            out[j.job_id] = JobState.UNKNOWN
    return out


def _squeue_all(conf: str | None) -> dict[str, tuple[str, str, int]] | None:
    """Every user's jobs; None (and a warning) when squeue fails: exit_code files then tell."""
    try:
        return slurmcli.all_jobs(conf)
    except SlurmError as e:
        warn_once(f"Slurm does not answer (squeue exit {e.returncode}: {e.first_line}); showing "
                  f"what the runs' own exit_code files say, UNKNOWN where there is none")
        return None


def _slurm_map(state: str) -> JobState:
    return SLURM_STATES.get(state.split()[0].rstrip("+"), JobState.UNKNOWN)


def _owner_uid(run_dir: Path) -> int | None:
    try:
        return (Path(run_dir) / JOB_FILE).stat().st_uid
    except OSError:
        return None


def _class_cancel(job: Job) -> None:
    """Cancel a student's job as root: Slurm's job of that id must still have the record's job
    name and the record owner's uid (checked again right before ``scancel``)."""
    if job.backend != "slurm":
        job.cancel()
        return

    conf = job.info.get("slurm_conf")
    try:
        rec = slurmcli.all_jobs(conf).get(job.job_id)
    except SlurmError as e:
        raise LabkitError(f"cannot cancel Slurm job {job.job_id} (run {job.name!r} of "
                          f"{owner(job.run_dir)}): squeue does not answer (exit {e.returncode}: "
                          f"{e.first_line}); try again when `squeue` answers") from None
    if rec is None or rec[1] != job_name(job) or rec[2] != _owner_uid(job.run_dir):
        raise LabkitError(f"Slurm job {job.job_id} is not run {job.name!r} of "
                          f"{owner(job.run_dir)} any more; left alone")
    try:
        slurmcli.scancel(conf, job.job_id)
    except SlurmError as e:
        raise LabkitError(f"scancel {job.job_id} failed (exit {e.returncode}): "
                          f"{e.message}") from None


def _all_jobs(cluster: ClusterProfile | str | Path | None) -> list[tuple[str, Job]]:
    """(user, job) of every student's labkit job record, read-only: acting on one goes
    through ``verify_owned`` (root only)."""
    out = []
    for user, root in student_roots(cluster).items():
        for d in run_dirs(root):  # real folders only: a link is never followed
            try:
                j = Job.load(d)
            except LabkitError as e:  # a record that cannot be read: its job may still run
                if isinstance(e, BadRecord):
                    warn_once(f"cannot tell ({user}): {e}")
                continue
            out.append((user if user != "*" else (owner(j.run_dir) or "?"), j))
    return out


def _progress(job: Job) -> tuple[int | None, int | None]:
    try:  # a student's file: a regular one only (not a FIFO, /dev/zero, a link), its end only
        found = _ITER_RE.findall(read_file_tail(job.log_path, 65536))
    except OSError:
        return None, None
    return (int(found[-1][0]), int(found[-1][1])) if found else (None, None)


def _diagnosis(job: Job, st: JobState) -> str | None:
    if not regular_file(job.log_path):  # a FIFO or a device would hang or flood the parser
        return None
    try:
        # labkit.logs brings pandas: off the CLI's start-up
        from labkit.logs import diagnose

        failures = diagnose(job.log_path, exit_code=job.exit_code(), job_state=str(st))
    except Exception:  # a parser problem must not hide the rest of the class view
        return None
    return next((f"{f.kind}: {f.message}" for f in failures), None)


def _exercises(root: Path) -> dict[str, int] | None:
    passed = total = 0
    for m in root.glob("*/metrics.json"):
        try:  # a student's file: a regular file of at most 1 MB, strict JSON, maybe not a dict
            data = loads_json(read_input(m, "metrics file"), str(m))
        except ConfigError:
            continue
        for k, v in data.items() if isinstance(data, dict) else ():
            if k.startswith("exercise."):
                total += 1
                passed += bool(v)
    return {"passed": passed, "total": total} if total else None


def class_status(cluster: ClusterProfile | str | Path | None = None) -> list[dict[str, Any]]:
    """One entry per student: job counts by state, each job with its progress (iteration of
    train_iters), the last notebook reached (from the ``nbNN_`` run names), exercise checks
    recorded in the runs' ``metrics.json``, and the newest failure's diagnosis."""
    pairs = _all_jobs(cluster)
    states = _class_states([j for _, j in pairs])
    roots = student_roots(cluster)
    by_user: dict[str, list[Job]] = {u: [] for u in roots if u != "*"}
    for user, j in pairs:
        by_user.setdefault(user, []).append(j)
    out = []
    for user in sorted(by_user):
        jobs = sorted(by_user[user], key=lambda j: j.submitted_at)
        counts = {"PENDING": 0, "RUNNING": 0, "finished": 0}
        rows, last_nb, failure = [], None, None
        for j in jobs:
            st = states.get(j.job_id, JobState.UNKNOWN)
            key = "finished" if st.finished else str(st)
            counts[key] = counts.get(key, 0) + 1
            it, total = _progress(j)
            rows.append({**j.to_dict(st), "iteration": it, "train_iters": total})
            if m := _NOTEBOOK_RE.match(j.name):
                last_nb = m.group(1)
            if st.finished and st is not JobState.COMPLETED:
                failure = {"job_id": j.job_id, "name": j.name, "state": str(st),
                           "diagnosis": _diagnosis(j, st)}
        root = roots.get(user, roots.get("*"))
        out.append({"user": user, "run_root": str(root), "jobs": counts, "runs": rows,
                    "last_notebook": last_nb,
                    "exercises": _exercises(root) if root else None, "last_failure": failure})
    return out


def _need_rights(pairs: list[tuple[str, Job]], doing: str, roots: dict[str, Path]) -> None:
    """Root: each job inside its own student's run root (no link out of it); else own runs."""
    if os.geteuid() == 0:
        for u, j in pairs:
            verify_owned(j, [r.resolve() for r in [roots.get(u, roots.get("*"))] if r], allow_root=True)
            j._verified = True
        return
    others = sorted({u for u, j in pairs if owner(j.run_dir) != current_user()})
    if others:
        raise LabkitError(f"{doing} other users' runs ({', '.join(others[:8])}) needs the "
                          f"rights to do so: run it as root (the instructor's account with "
                          f"sudo). You ({current_user()}) may use `labkit cancel --all` and "
                          f"`labkit clean` for your own runs")


def class_cancel_all(cluster: ClusterProfile | str | Path | None = None) -> list[dict[str, Any]]:
    """Cancel every student's PENDING or RUNNING labkit job (root only)."""
    pairs = _all_jobs(cluster)
    jobs = [j for _, j in pairs]
    states = _class_states(jobs)
    _need_rights([(u, j) for u, j in pairs if not states.get(j.job_id, JobState.UNKNOWN)
                  .finished], "cancelling", student_roots(cluster))
    return _cancel_live(jobs, states, as_instructor=os.geteuid() == 0)


def class_clean(cluster: ClusterProfile | str | Path | None = None, *, dry_run: bool = False,
                keep_last: int = 0, whole_runs: bool = False) -> list[Freed]:
    """``clean`` for every student's finished runs (root only, unless ``dry_run``)."""
    pairs = _all_jobs(cluster)
    if not dry_run:
        _need_rights(pairs, "cleaning", student_roots(cluster))
    out: list[Freed] = []
    by_user: dict[str, list[Job]] = {}
    for u, j in pairs:
        by_user.setdefault(u, []).append(j)
    states = _class_states([j for _, j in pairs])
    for u in sorted(by_user):
        freed = _clean(by_user[u], states, dry_run=dry_run, keep_last=keep_last,
                       whole_runs=whole_runs)
        out += [Freed(f.path, f.bytes, f.run, u) for f in freed]
    return out


__all__ = ["Freed", "cancel_all", "class_cancel_all", "class_clean", "class_status", "clean",
           "my_jobs", "my_roots", "student_roots", "user_name"]
