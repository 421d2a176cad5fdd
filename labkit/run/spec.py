"""The backend protocol and the one thing every backend is given: a JobSpec.

A backend (``labkit.backends.local``, ``labkit.backends.slurm``) is a module with three
functions, as in submitit's executors:

    submit(spec, run_dir, *, cluster, program=None, program_args=None) -> Job
    states(jobs) -> {job_id: JobState}      # one poll for many jobs
    cancel(job) -> None                     # this job only; labkit's own jobs only

``spec`` is a :class:`JobSpec`: the shape of the job (name, nodes, processes per node, device),
not its training hyper-parameters. A training run's spec comes from its RunConfig
(``JobSpec.from_config``); the all-reduce benchmark builds one directly, so a program that is
not the training script needs no training config. ``run_dir`` exists and is the job's working
directory. ``cluster`` is the site (ClusterProfile); the local backend runs on this machine and
reads nothing from it. ``program`` defaults to ``pretrain_gpt.py``; ``program_args``, passed to
it verbatim (shell-quoted), default to the run's Megatron-LM flags (``labkit.render`` says the
rule).

``labkit.backends.submit`` is the entry point that writes the run directory and picks the
backend; these functions are what it calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from labkit.errors import ConfigError
from labkit.megatron_args import flag_groups
from labkit.rules import DEVICES, NAME_RE
from labkit.validate import script_text_problems

if TYPE_CHECKING:
    from labkit.backends.job import Job, JobState
    from labkit.config import RunConfig
    from labkit.site import ClusterProfile


@dataclass(frozen=True)
class JobSpec:
    """What a backend needs to start a job, and all a job script is rendered from."""

    name: str
    """The run's name: its folder under the run root and the Slurm job name."""
    nodes: int = 1
    """Nodes (simulated nodes, one torchrun agent each, on the local backend)."""
    gpus_per_node: int = 1
    """Processes per node: one per GPU with ``device='cuda'``, CPU processes otherwise."""
    device: str = "cpu"
    """``cuda`` asks the scheduler for GPUs; ``cpu`` does not."""
    nccl_debug: bool = False
    """Export ``NCCL_DEBUG=INFO`` (transport and channel lines in log.txt)."""
    layout: str = ""
    """One line for the job script's header, e.g. ``TP=2 x PP=2 x DP=1``."""
    megatron_flags: tuple[tuple[str, tuple[tuple[str, ...], ...]], ...] = ()
    """A training run's Megatron-LM flags by group (``labkit.megatron_args.flag_groups``), the
    training script's arguments; empty for another program."""

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.name, str) or not NAME_RE.fullmatch(self.name):
            problems.append(f"name={self.name!r} must be 1-64 letters, digits, '.', '_' or '-' "
                            f"(it names the folder runs/<name>/ and the Slurm job)")
        for n in ("nodes", "gpus_per_node"):
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                problems.append(f"{n}={v!r} must be a positive integer")
        if self.device not in DEVICES:
            problems.append(f"device={self.device!r} is not one of {list(DEVICES)}")
        problems += script_text_problems(self.layout, self.megatron_flags)
        if problems:
            raise ConfigError("; ".join(problems))

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @classmethod
    def from_config(cls, cfg: RunConfig) -> JobSpec:
        """The job shape of a training run, with its Megatron-LM flags."""
        return cls(name=cfg.name, nodes=cfg.nodes, gpus_per_node=cfg.gpus_per_node,
                   device=cfg.device, nccl_debug=bool(cfg.nccl_debug),
                   layout=f"TP={cfg.tp} x PP={cfg.pp} x DP={cfg.dp}",
                   megatron_flags=flag_groups(cfg))


def as_spec(run: JobSpec | RunConfig) -> JobSpec:
    """A JobSpec as it is, a RunConfig as its JobSpec."""
    return run if isinstance(run, JobSpec) else JobSpec.from_config(run)


class Backend(Protocol):
    """The three functions of a backend module (see the module docstring)."""

    def submit(self, spec: JobSpec, run_dir: Path, *, cluster: ClusterProfile,
               program: str | Path | None = None,
               program_args: Sequence[str] | None = None) -> Job: ...

    def states(self, jobs: list[Job]) -> dict[str, JobState]: ...

    def cancel(self, job: Job) -> None: ...
