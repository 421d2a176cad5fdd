"""JobSpec: the shape of a job, all a backend is given and all a job script is rendered from.

A JobSpec holds the job's shape (name, nodes, processes per node, device), not its training
hyper-parameters. A training run's spec is made from its RunConfig once, where the run enters
(``JobSpec.from_config``, called by ``labkit.jobs.submit`` and by the commands and notebooks
that render a script); the all-reduce benchmark builds one directly, so a program that is not
the training script needs no training config. Everything below that edge (``labkit.render``,
the backends) takes a JobSpec only.

Every text field reaches the job script; ``labkit.validate.script_text_problems`` is the one
door it goes through.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.config import RunConfig
from labkit.errors import ConfigError
from labkit.megatron_args import flag_groups
from labkit.rules import DEVICES, NAME_RE
from labkit.validate import script_text_problems


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

