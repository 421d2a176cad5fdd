"""Submit a RunConfig and watch the job: ``submit(cfg) -> Job``, the same for both backends.

``local`` (the embedded default) runs the simulated nodes as processes on this machine;
``slurm`` submits ``job.sh`` with sbatch. Either way the run directory holds ``config.json``,
``job.sh``, ``plan.json``, ``log.txt``, ``exit_code`` and ``job.json``, the record that makes a
job labkit's own: ``list_jobs``, ``labkit status`` and ``labkit cancel`` see only those.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from labkit._logging import log
from labkit.backends.job import (
    FINISHED,
    JOB_FILE,
    WATCHERS,
    Job,
    JobState,
    add_watcher,
    backend_module,
    remove_watcher,
)
from labkit.config import RunConfig
from labkit.errors import ConfigError, LabkitError, SubmissionError
from labkit.paths import run_dir as _run_dir
from labkit.paths import run_root
from labkit.rundir import prepare_run_dir
from labkit.site import ClusterProfile, resolve_profile

__all__ = ["FINISHED", "WATCHERS", "Job", "JobState", "add_watcher", "remove_watcher", "submit",
           "list_jobs", "get_job", "cli_submit", "cli_status", "cli_cancel", "cli_logs"]


def _write_plan(cfg: RunConfig, d: Path) -> None:
    try:
        from labkit.planner import plan
    except ImportError:
        return
    try:
        (d / "plan.json").write_text(json.dumps(plan(cfg).to_dict(), indent=2) + "\n")
    except Exception as e:  # the plan is a convenience; never block a submission on it
        log.warning(f"plan.json not written ({type(e).__name__}: {e})")


def submit(cfg: RunConfig, *, backend: str | None = None,
           profile: ClusterProfile | str | None = None, overwrite: bool = False,
           resume: bool = False, program: str | Path | None = None) -> Job:
    """Write the run directory and start the job.

    Args:
        cfg: the run; ``cfg.backend`` unless ``backend`` says otherwise.
        backend: ``local`` or ``slurm``.
        profile: a ClusterProfile, a profile name/YAML path, or None (the mini-cluster when it
            is up, else generic defaults). Slurm only.
        overwrite: move an existing run directory aside (never deleted) and start afresh.
        resume: continue a run in its directory (checkpoints kept; the log is appended to).
        program: the training script (default ``code/pretrain_gpt.py``), run with
            ``--config RUN_DIR/config.json``.
    """
    backend = backend or cfg.backend
    if backend not in ("local", "slurm"):
        raise ConfigError(f"backend={backend!r} is not one of ['local', 'slurm']")
    mod = backend_module(backend)
    if program is not None:
        program = Path(program).resolve()  # the job runs in the run directory
    prof = resolve_profile(profile) if backend == "slurm" else None
    if prof is not None:
        mod.preflight(prof)
    root = Path(prof.run_root) if prof is not None and prof.run_root else None
    target = _run_dir(cfg.name, root)
    if resume and (target / JOB_FILE).exists():
        old = Job.load(target)
        if not old.state().finished:
            raise SubmissionError(f"run {cfg.name!r} still has job {old.job_id} "
                                  f"({old.state()}); cancel it first (labkit cancel "
                                  f"{old.job_id}) or wait for it")
    fresh = not target.exists() or not any(target.iterdir())
    d = prepare_run_dir(cfg, root=root, overwrite=overwrite, resume=resume).resolve()
    _write_plan(cfg, d)
    try:
        job = mod.submit(cfg, d, prof, program=program) if prof else mod.submit(
            cfg, d, program=program)
    except BaseException:
        if fresh:  # nothing in it but what this call wrote
            shutil.rmtree(d, ignore_errors=True)
        raise
    job.save()
    log.info(f"Submitted {cfg.name} as {backend} job {job.job_id} -> {d} (log: {job.log_path})")
    return job


def list_jobs(root: str | Path | None = None) -> list[Job]:
    """labkit's own jobs: every ``<root>/*/job.json``, oldest first."""
    base = Path(root) if root is not None else run_root()
    jobs = []
    for f in sorted(base.glob(f"*/{JOB_FILE}")):
        try:
            jobs.append(Job.load(f.parent))
        except LabkitError:
            continue
    return sorted(jobs, key=lambda j: j.submitted_at)


def job_states(jobs: list[Job]) -> dict[str, JobState]:
    """States of many jobs with one poll per backend."""
    out: dict[str, JobState] = {}
    for name in ("local", "slurm"):
        mine = [j for j in jobs if j.backend == name]
        if mine:
            out.update(backend_module(name).states(mine))
    return out


def get_job(ref: str, root: str | Path | None = None) -> Job:
    """One of labkit's jobs by job id, run name or run directory."""
    p = Path(ref)
    if (p / JOB_FILE).exists():
        return Job.load(p)
    for j in list_jobs(root):
        if ref in (j.job_id, j.name):
            return j
    raise LabkitError(f"no labkit job {ref!r} under {Path(root) if root else run_root()}: labkit "
                      f"only acts on jobs it submitted (see `labkit status`); a job submitted "
                      f"some other way is left alone (use scancel yourself if you mean it)")


# --- CLI ---------------------------------------------------------------------------------------
def cli_submit(args: argparse.Namespace) -> int:
    cfg = RunConfig.from_json(args.config)
    job = submit(cfg, backend=args.backend, profile=args.profile, overwrite=args.overwrite,
                 resume=args.resume)
    state = job.wait(timeout=args.timeout, progress=True) if args.wait else job.state()
    if args.json:
        print(json.dumps(job.to_dict(state), indent=2))
    else:
        print(f"Submitted {job.name} as {job.backend} job {job.job_id} -> {job.run_dir} "
              f"(log: {job.log_path}): {state}")
    if args.wait and state is not JobState.COMPLETED:
        if not args.json:
            print(job.failure_error(state), file=sys.stderr)
        return 1
    return 0


def cli_status(args: argparse.Namespace) -> int:
    jobs = [get_job(args.job)] if args.job else list_jobs()
    st = job_states(jobs)
    rows = [j.to_dict(st[j.job_id]) for j in jobs]
    if args.json:
        print(json.dumps(rows[0] if args.job else rows, indent=2))
        return 0
    print(f"{'JOBID':>14} {'BACKEND':7} {'STATE':13} {'SUBMITTED':19} NAME (RUN_DIR)")
    for j, r in zip(jobs, rows, strict=True):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(j.submitted_at))
        print(f"{r['job_id']:>14} {r['backend']:7} {r['state']:13} {when:19} "
              f"{r['name']} ({r['run_dir']})")
    if not jobs:
        print(f"(no labkit jobs under {run_root()})")
    return 0


def cli_cancel(args: argparse.Namespace) -> int:
    job = get_job(args.job)
    job.cancel()
    print(f"cancelled {job.backend} job {job.job_id} ({job.name}): {job.state()}")
    return 0


def cli_logs(args: argparse.Namespace) -> int:
    job = get_job(args.job)
    offset = 0
    while True:
        try:
            with open(job.log_path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
        except OSError:
            chunk = b""
        offset += len(chunk)
        sys.stdout.write(chunk.decode(errors="replace"))
        sys.stdout.flush()
        if not args.follow or job.state().finished:
            if args.follow:  # what was written between the last read and the end
                with open(job.log_path, "rb") as f:
                    f.seek(offset)
                    sys.stdout.write(f.read().decode(errors="replace"))
            return 0
        time.sleep(1.0)
