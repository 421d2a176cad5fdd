"""A submission put together, and the caller's jobs found again: ``submit(cfg) -> Job``.

``submit`` is the one place a run is started from, whatever the backend: it turns a RunConfig
into its JobSpec (``JobSpec.from_config``, the one conversion), claims the run directory
(``labkit.rundir``: made, or taken over by ``overwrite``/``resume``, atomically), writes
``config.json`` and ``plan.json`` there, and hands the JobSpec to the backend
(``labkit.backends``), which renders ``job.sh``, starts the job and returns its Job; the Job's
record (``job.json``, ``labkit.run.record``) is written last. A submission happens or leaves
everything as it was. ``list_jobs``, ``get_job`` and ``job_states`` find the caller's own jobs
again (``labkit.backends.ownership``): only those labkit submitted.

The command line, the notebooks' ``labkit.lab`` and the benchmarks call this module; the
backends and ``labkit.render`` never import it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from labkit._logging import log, warn_once
from labkit.backends import backend_module
from labkit.backends.job import Job
from labkit.backends.ownership import allowed_roots, owned, refuse_if_live, verify_owned
from labkit.config import RunConfig
from labkit.errors import ConfigError, LabkitError, SubmissionError
from labkit.paths import run_dir as _run_dir
from labkit.paths import run_root
from labkit.planner import plan
from labkit.run.record import JOB_FILE, BadRecord, NoRecord
from labkit.run.spec import JobSpec
from labkit.run.state import FINISHED, JobState
from labkit.rundir import claim_run_dir, unwritable
from labkit.site import ClusterProfile, as_profile

__all__ = ["FINISHED", "Job", "JobSpec", "JobState", "submit", "list_jobs", "get_job",
           "job_states", "guard_not_live", "verify_owned"]


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
        program_args: its arguments. None: a run's arguments by ``labkit.render``'s rule (a
            JobSpec without flags: none). ``{run_dir}`` in an argument becomes the run
            directory.
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
        claim.release()
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
    ``ownership.verify_owned`` (others' and forged records are left out), oldest first. Run
    directories that are symbolic links are never followed (``run_dirs``); a record that cannot
    be read is named in a warning (its job may still run), not listed."""
    base = Path(root) if root is not None else run_root()
    roots = allowed_roots(base)
    jobs = []
    for d in run_dirs(base):
        try:
            job = Job.load(d)
        except NoRecord:
            continue
        except BadRecord as e:  # its job may still run: say so, never drop it silently
            warn_once(f"cannot tell: {e}")
            continue
        if owned(job, roots):
            job._verified = True
            jobs.append(job)
    return sorted(jobs, key=lambda j: j.submitted_at)


def run_dirs(base: Path) -> list[Path]:
    """The run directories in a run root that hold a record: real folders only. A symbolic
    link is named in a warning and never followed (it may lead into another user's runs)."""
    out = []
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return []
    for e in entries:
        if e.is_symlink():
            if os.path.lexists(e / JOB_FILE):
                warn_once(f"{e} is a symbolic link (to {os.readlink(e)}), not a run directory: "
                          f"labkit does not follow it (neither lists, cancels nor cleans it)")
            continue
        if e.is_dir() and os.path.lexists(e / JOB_FILE):
            out.append(e)
    return out


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


def guard_not_live(run_dir: str | Path, doing: str = "move it aside") -> None:
    """Raise SubmissionError when a PENDING or RUNNING job holds ``run_dir`` (its record there
    says which), or when its record cannot be read (then nobody can tell); a directory
    without a record holds nothing."""
    d = Path(run_dir)
    try:
        job = Job.load(d)
    except NoRecord:
        return
    except BadRecord as e:  # cannot tell whether its job still runs: it may
        raise SubmissionError(f"labkit will not {doing}: {e}. Find out whether that job still "
                              f"runs (ps, squeue) and move {d} away yourself once it does not") from None
    refuse_if_live(job, d, doing)
