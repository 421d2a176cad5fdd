"""Submit a RunConfig and watch the job: ``submit(cfg) -> Job``, the same for both backends.

``local`` (the embedded default) runs the simulated nodes as processes on this machine;
``slurm`` submits ``job.sh`` with sbatch. Either way the run directory holds ``config.json``,
``job.sh``, ``plan.json``, ``log.txt``, ``exit_code`` and ``job.json``, the record that makes a
job labkit's own: ``list_jobs``, ``labkit status`` and ``labkit cancel`` see only those.

Both backends implement one protocol (``labkit.backends.spec``): ``submit(spec, run_dir, *,
cluster, program, program_args) -> Job``, ``states(jobs)``, ``cancel(job)``. A program that is
not the training script (the all-reduce benchmark) is submitted as a JobSpec with its program
and arguments: ``submit(JobSpec(name, nodes=2, gpus_per_node=2), program=..., program_args=[...])``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from labkit._logging import log
from labkit.backends.job import FINISHED, JOB_FILE, Job, JobState, backend_module
from labkit.backends.spec import JobSpec
from labkit.config import RunConfig
from labkit.errors import ConfigError, LabkitError, SubmissionError
from labkit.paths import run_dir as _run_dir
from labkit.paths import run_root
from labkit.rundir import prepare_run_dir
from labkit.site import ClusterProfile, resolve_cluster

__all__ = ["FINISHED", "Job", "JobSpec", "JobState", "submit",
           "list_jobs", "get_job"]


def _write_plan(cfg: RunConfig, d: Path) -> None:
    from labkit.planner import plan

    try:
        (d / "plan.json").write_text(json.dumps(plan(cfg).to_dict(), indent=2) + "\n")
    except Exception as e:  # the plan is a convenience; never block a submission on it
        log.warning(f"plan.json not written ({type(e).__name__}: {e})")


def submit(cfg: RunConfig | JobSpec, *, backend: str | None = None,
           cluster: ClusterProfile | str | Path | None = None, overwrite: bool = False,
           resume: bool = False, program: str | Path | None = None,
           program_args: Sequence[str] | None = None) -> Job:
    """Write the run directory and start the job.

    Args:
        cfg: a training run (RunConfig: ``config.json`` and ``plan.json`` are written, and
            ``cfg.backend`` is the default backend), or a JobSpec for another program (then
            ``program`` is required and the backend defaults to ``local``).
        backend: ``local`` or ``slurm``.
        cluster: a ClusterProfile, a profile name/YAML path, or None (the mini-cluster when it
            is up, else generic defaults). Slurm reads it; the local backend runs here.
        overwrite: move an existing run directory aside (never deleted) and start afresh.
        resume: continue a run in its directory (checkpoints kept; the log is appended to).
        program: the program torchrun starts on every rank (default ``code/pretrain_gpt.py``).
        program_args: its arguments. None: ``--config RUN_DIR/config.json`` for a RunConfig,
            no arguments for a JobSpec. ``{run_dir}`` in an argument becomes the run directory.
    """
    if isinstance(cfg, RunConfig):
        spec = JobSpec.from_config(cfg)
        backend = backend or cfg.backend
    elif isinstance(cfg, JobSpec):
        spec = cfg
        backend = backend or "local"
        if program is None:
            raise ConfigError(f"job {spec.name!r} is a JobSpec without a training config: give "
                              f"program= (the script torchrun runs), or submit a RunConfig")
        program_args = () if program_args is None else program_args
    else:
        raise ConfigError(f"submit() takes a RunConfig or a JobSpec, not "
                          f"{type(cfg).__name__} ({cfg!r:.60}); e.g. RunConfig.from_json(path)")
    if backend not in ("local", "slurm"):
        raise ConfigError(f"backend={backend!r} is not one of ['local', 'slurm']")
    if isinstance(program_args, (str, bytes)):
        raise ConfigError(f"program_args={program_args!r} must be a list of arguments, e.g. "
                          f"['--iters', '10'], not one string")
    mod = backend_module(backend)
    if program is not None:
        program = Path(program).resolve()  # the job runs in the run directory
    if backend == "slurm" or cluster is not None:
        site = resolve_cluster(cluster)
    else:
        site = ClusterProfile()
    root = None
    if backend == "slurm":
        mod.preflight(site)
        root = Path(site.run_root) if site.run_root else None
    target = _run_dir(spec.name, root)
    if resume and (target / JOB_FILE).exists():
        old = Job.load(target)
        if not old.state().finished:
            raise SubmissionError(f"run {spec.name!r} still has job {old.job_id} "
                                  f"({old.state()}); cancel it first (labkit cancel "
                                  f"{old.job_id}) or wait for it")
    fresh = not target.exists() or not any(target.iterdir())
    d = prepare_run_dir(cfg, root=root, overwrite=overwrite, resume=resume).resolve()
    if isinstance(cfg, RunConfig):
        _write_plan(cfg, d)
    if program_args is not None:
        program_args = [str(a).replace("{run_dir}", str(d)) for a in program_args]
    try:
        job = mod.submit(spec, d, cluster=site, program=program, program_args=program_args)
    except BaseException:
        if fresh:  # nothing in it but what this call wrote
            shutil.rmtree(d, ignore_errors=True)
        raise
    if program is not None:
        job.info["program"] = str(program)
    if program_args is not None:
        job.info["program_args"] = program_args
    job.save()
    log.info(f"Submitted {spec.name} as {backend} job {job.job_id} -> {d} (log: {job.log_path})")
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
