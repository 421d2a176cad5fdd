"""How many students' jobs a partition runs at once: pure arithmetic, and reading the partition.

A job of the series takes ``nodes`` distinct nodes, on each ``cpus`` CPUs (the one task's
``--cpus-per-task``) and ``gpus`` GPUs. A node holds ``slots`` such tasks side by side: as many
as its CPUs and GPUs allow (one with ``--exclusive``). ``J`` jobs run at once exactly when their
``J x nodes`` tasks can be placed with no job twice on one node, i.e. when
``sum(min(slots_i, J)) >= J x nodes`` (each node gives at most one task to each job).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from labkit import slurmcli
from labkit.slurmcli import SlurmError

_GPU_GRES = re.compile(r"(?:^|,)gpu(?::[A-Za-z0-9_.-]+)?:(\d+)")


@dataclass(frozen=True)
class NodeInfo:
    name: str
    cpus: int
    gpus: int
    state: str


def gres_gpus(gres: str) -> int:
    """GPUs in a node's GRES string: ``gpu:8``, ``gpu:a100:4(S:0-1)``, ``(null)`` -> 8, 4, 0."""
    return sum(int(m.group(1)) for m in _GPU_GRES.finditer(re.sub(r"\([^)]*\)", "", gres)))


def node_slots(node: NodeInfo, cpus: int, gpus: int, exclusive: bool = False) -> int:
    """Tasks of ``cpus`` CPUs and ``gpus`` GPUs one node holds at once (0 when down/drained)."""
    if node.state.rstrip("*~#!%$@^-").lower() in ("down", "drain", "drained", "draining", "fail",
                                                  "failing", "maint", "inval", "unknown"):
        return 0
    n = node.cpus // max(1, cpus)
    if gpus:
        n = min(n, node.gpus // gpus)
    return min(n, 1) if exclusive else n


def jobs_at_once(slots: list[int], nodes_per_job: int) -> int:
    """The most jobs of ``nodes_per_job`` distinct nodes that run side by side on nodes holding
    ``slots[i]`` tasks each."""
    if nodes_per_job <= 0:
        raise ValueError(f"nodes_per_job={nodes_per_job} must be positive")
    best, j = 0, 1
    while j <= sum(slots) // nodes_per_job:
        if sum(min(s, j) for s in slots) >= j * nodes_per_job:
            best = j
        j += 1
    return best


@dataclass(frozen=True)
class Fit:
    """The answer for one class: jobs at once, and whether ``students`` of them fit."""

    students: int | None
    at_once: int
    nodes_per_job: int
    cpus: int
    gpus: int
    usable_nodes: int

    @property
    def fits(self) -> bool:
        return self.at_once >= (self.students or 1)


def class_fit(nodes: list[NodeInfo], students: int | None, nodes_per_job: int, cpus: int,
              gpus: int, exclusive: bool = False) -> Fit:
    slots = [node_slots(n, cpus, gpus, exclusive) for n in nodes]
    return Fit(students, jobs_at_once(slots, nodes_per_job), nodes_per_job, cpus, gpus,
               sum(s > 0 for s in slots))


def partition_nodes(partition: str | None, slurm_conf: str | None) -> tuple[list[NodeInfo], str]:
    """The partition's nodes from ``sinfo -N`` (name, CPUs, GRES, state), and its settings line
    from ``scontrol show partition`` (empty when it cannot be read)."""
    try:
        rows = slurmcli.nodes(slurm_conf, partition)
    except SlurmError:
        return [], ""
    try:
        show = slurmcli.partition_settings(slurm_conf, partition)
    except SlurmError:
        show = ""
    found: dict[str, NodeInfo] = {}
    for name, cpus, gres, state, part in rows:
        if partition is None and not part.endswith("*"):
            continue  # no partition named: the default one, as sbatch would pick
        found[name] = NodeInfo(name, cpus, gres_gpus(gres), state)
    return list(found.values()), show
