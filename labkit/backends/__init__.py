"""The backends: where a job runs. ``local`` (the embedded default) runs the simulated nodes
as processes on this machine; ``slurm`` submits ``job.sh`` with sbatch; ``hostfile`` starts
the nodes over ssh from a site's host list.

A backend is a module with three functions, as in submitit's executors::

    submit(spec, run_dir, *, cluster, program=None, program_args=None) -> Job
    states(jobs) -> {job_id: JobState}      # one poll for many jobs
    cancel(job) -> None                     # this job only; labkit's own jobs only

``spec`` is a ``labkit.run.JobSpec`` (never a RunConfig: the run became its JobSpec where it
entered, in ``labkit.jobs.submit``). ``run_dir`` exists, holds ``config.json`` for a training
run, and is the job's working directory; the backend writes ``job.sh`` (``labkit.render``) and
``log.txt``, the job writes ``exit_code``. ``cluster`` is the site (ClusterProfile); the local
backend runs on this machine and reads nothing from it. ``program`` defaults to
``pretrain_gpt.py``; ``program_args`` reach it verbatim (shell-quoted), and default to the
run's Megatron-LM flags (the rule: ``labkit.render``).

Each backend maps its states to ``labkit.run.JobState`` and returns a ``labkit.backends.job.Job``.
Putting a submission together (the run directory, config.json, plan.json, the record) is
``labkit.jobs``'s, above this package; nothing here imports it.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from labkit.errors import LabkitError
from labkit.run.spec import JobSpec
from labkit.run.state import JobState

if TYPE_CHECKING:
    from labkit.backends.job import Job
    from labkit.site import ClusterProfile

BACKENDS = ("local", "slurm", "hostfile")


def backend_module(name: str) -> Any:
    """The module of backend ``name`` (LabkitError for a backend labkit lacks)."""
    if name not in BACKENDS:
        raise LabkitError(f"unknown backend {name!r}; use 'local', 'slurm' or 'hostfile'")
    return importlib.import_module(f"labkit.backends.{name}")


class Backend(Protocol):
    """The three functions of a backend module (see the module docstring)."""

    def submit(self, spec: JobSpec, run_dir: Path, *, cluster: ClusterProfile,
               program: str | Path | None = None,
               program_args: Sequence[str] | None = None) -> Job: ...

    def states(self, jobs: list[Job]) -> dict[str, JobState]: ...

    def cancel(self, job: Job) -> None: ...
