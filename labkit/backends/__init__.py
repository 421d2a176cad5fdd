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
from collections.abc import Sequence
from pathlib import Path

from labkit._logging import log
from labkit.backends.job import FINISHED, JOB_FILE, Job, JobState, backend_module, guard_not_live
from labkit.backends.ownership import allowed_roots, owned, verify_owned
from labkit.backends.spec import JobSpec
from labkit.config import RunConfig
from labkit.errors import ConfigError, LabkitError
from labkit.paths import run_dir as _run_dir
from labkit.paths import run_root
from labkit.planner import plan
from labkit.rundir import claim_run_dir, unwritable
from labkit.site import ClusterProfile, as_profile

__all__ = ["FINISHED", "Job", "JobSpec", "JobState", "submit",
           "list_jobs", "get_job", "guard_not_live", "verify_owned"]


def _write_plan(cfg: RunConfig, d: Path) -> None:
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
        cluster: the site (a ClusterProfile, a profile name or YAML path), as the entry point
            resolved it (``labkit.site.resolve_cluster``); None: generic defaults. Slurm and
            the hostfile backend read it; the local backend runs here.
        overwrite: move an existing run directory aside (never deleted) and start afresh.
        resume: continue a run in its directory (checkpoints kept; the log is appended to).
        program: the program torchrun starts on every rank (default ``code/pretrain_gpt.py``).
        program_args: its arguments. None: for a RunConfig, the run's Megatron-LM flags when
            the program is ``pretrain_gpt.py`` (config.json named in ``$LABKIT_CONFIG``), else
            ``--config RUN_DIR/config.json`` (the rule: ``labkit.render``); for a JobSpec
            none. ``{run_dir}`` in an argument becomes the run directory.
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
    if backend not in ("local", "slurm", "hostfile"):
        raise ConfigError(f"backend={backend!r} is not one of ['local', 'slurm', 'hostfile']")
    if isinstance(program_args, (str, bytes)):
        raise ConfigError(f"program_args={program_args!r} must be a list of arguments, e.g. "
                          f"['--iters', '10'], not one string")
    mod = backend_module(backend)
    if program is not None:
        program = Path(program).resolve()  # the job runs in the run directory
    site = as_profile(cluster) or ClusterProfile()
    root = None
    if backend != "local":  # slurm, hostfile: the site's shared run root
        if backend == "slurm":
            mod.preflight(site)
        root = site.run_root_path()  # {user} filled in: one root per user on a shared site
    target = _run_dir(spec.name, root)
    if overwrite or resume:  # a live job's directory is never moved aside nor reused
        guard_not_live(target, "move it aside" if overwrite else "resume into it")
    claim = claim_run_dir(cfg, root=root, overwrite=overwrite, resume=resume)
    d = claim.dir.resolve()
    job = None
    try:
        if isinstance(cfg, RunConfig):
            _write_plan(cfg, d)
        if program_args is not None:
            program_args = [str(a).replace("{run_dir}", str(d)) for a in program_args]
        job = mod.submit(spec, d, cluster=site, program=program, program_args=program_args)
        if program is not None:
            job.info["program"] = str(program)
        if program_args is not None:
            job.info["program_args"] = program_args
        job.save()
    except BaseException as e:  # a submission happens or leaves everything as it was
        if job is not None:
            try:
                mod.cancel(job)
            except Exception:  # noqa: BLE001 - the original error is the one to report
                pass
        claim.rollback()
        if isinstance(e, OSError):
            raise unwritable(d, e) from None
        raise
    log.info(f"Submitted {spec.name} as {backend} job {job.job_id} -> {d} (log: {job.log_path})")
    return job


def list_jobs(root: str | Path | None = None) -> list[Job]:
    """The caller's own labkit jobs: every ``<root>/*/job.json`` that is well-formed and passes
    ``ownership.verify_owned`` (others' and forged records are left out), oldest first."""
    base = Path(root) if root is not None else run_root()
    roots = allowed_roots(base)
    jobs = []
    try:
        found = sorted(base.glob(f"*/{JOB_FILE}"))
    except OSError:
        found = []
    for f in found:
        try:
            job = Job.load(f.parent)
        except LabkitError:
            continue
        if owned(job, roots):
            job._verified = True
            jobs.append(job)
    return sorted(jobs, key=lambda j: j.submitted_at)


def job_states(jobs: list[Job]) -> dict[str, JobState]:
    """States of many jobs with one poll per backend (UNKNOWN for a backend labkit lacks)."""
    out: dict[str, JobState] = {}
    for name in dict.fromkeys(j.backend for j in jobs):
        mine = [j for j in jobs if j.backend == name]
        try:
            out.update(backend_module(name).states(mine))
        except LabkitError:
            out.update({j.job_id: JobState.UNKNOWN for j in mine})
    return out


def get_job(ref: str, root: str | Path | None = None) -> Job:
    """One of the caller's labkit jobs by job id, run name or run directory.

    A run name means the job in ``<root>/<name>/``; when several records carry the name (runs
    moved aside by overwrite), a live one comes first, then the newest.
    """
    base = Path(root) if root is not None else run_root()
    p = Path(ref)
    if "/" in ref or ref in (".", ".."):
        if (p / JOB_FILE).exists():
            job = Job.load(p)
            verify_owned(job, allowed_roots(base))
            job._verified = True
            return job
    else:
        jobs = list_jobs(base)
        by_id = [j for j in jobs if j.job_id == ref]
        if by_id:
            return by_id[-1]
        by_name = [j for j in jobs if j.name == ref]
        if by_name:
            here = [j for j in by_name if j.run_dir == (base / ref).resolve()]
            states = job_states(by_name)
            live = [j for j in by_name if not states[j.job_id].finished]
            return (live or here or by_name)[-1]
    raise LabkitError(f"no labkit job {ref!r} under {base}: labkit only acts on jobs it "
                      f"submitted (see `labkit status`); a job submitted some other way is left "
                      f"alone (use scancel yourself if you mean it)")
