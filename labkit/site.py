"""ClusterProfile: everything site-specific about a Slurm cluster, kept out of the templates.

A cluster profile is a small YAML file (examples in ``code/clusters/``): partition, account, qos,
time limit, how GPUs are requested, modules to load, an optional container wrapper, environment
variables for NCCL / gloo, and the shared run root. ``render_sbatch`` reads it; nothing about a
particular site is hard-coded anywhere else.

``load_cluster(path_or_name)`` reads one; ``resolve_cluster(cluster)`` is what every ``cluster=``
keyword goes through: an object, a YAML path or a name in ``code/clusters/``, or None for the
default ($LABKIT_CLUSTER, else the mini-cluster while ``labkit cluster up`` has it running, else
``ClusterProfile()``).
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from labkit.errors import ConfigError
from labkit.paths import CODE_DIR, MINICLUSTER_SITE

CLUSTER_DIR = CODE_DIR / "clusters"
CLUSTER_ENV = "LABKIT_CLUSTER"
GPU_REQUESTS = ("gres", "gpus-per-node", "none")
CONTAINER_RUNTIMES = ("apptainer", "singularity", "pyxis")
MASTER_ADDR_FROM = ("hostname", "nodeaddr")
_TIME_RE = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$|^\d+$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class ClusterProfile:
    """How to run on one Slurm cluster. Build it with keywords or ``load_cluster(path)``."""

    name: str = "generic"
    """A label for messages and the script header."""
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: str = "00:30:00"
    """Slurm ``--time`` (``MM``, ``HH:MM:SS`` or ``D-HH:MM:SS``)."""
    gpu_request: str = "gres"
    """How GPUs are asked for: ``gres`` (``--gres=gpu:N``), ``gpus-per-node`` or ``none``."""
    cpus_per_task: int | None = None
    """CPUs for the one task per node; None: one per training process."""
    mem: str | None = None
    """Slurm ``--mem`` per node, e.g. ``200G``; None: the partition's default."""
    exclusive: bool = False
    modules: tuple[str, ...] = ()
    """``module load`` lines run before the launch (e.g. ``cuda/12.4``, ``nccl``)."""
    setup: tuple[str, ...] = ()
    """Extra shell lines run before the launch (e.g. ``source /shared/venv/bin/activate``)."""
    container: dict[str, Any] | None = None
    """``{runtime: apptainer|singularity|pyxis, image: ..., mounts: [...]}`` or None."""
    env: dict[str, str] = field(default_factory=dict)
    """Exported in the job: NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, NCCL_IB_HCA, ..."""
    torchrun: str = "torchrun"
    """The torchrun command on the compute nodes (a path when it is not on PATH)."""
    code_dir: str | None = None
    """Where ``pretrain_gpt.py`` lives on the nodes; None: this checkout's ``code/``."""
    run_root: str | None = None
    """Shared run root seen by every node; None: ``labkit.paths.run_root()``."""
    master_addr_from: str = "hostname"
    """``hostname``: the head node's name; ``nodeaddr``: its Slurm NodeAddr (the mini-cluster,
    whose nodes share one hostname)."""
    slurm_conf: str | None = None
    """SLURM_CONF for labkit's own sbatch/squeue calls (the mini-cluster); None: the default."""
    sbatch_extra: tuple[str, ...] = ()
    """More ``#SBATCH`` options, verbatim, e.g. ``--constraint=h100``."""

    def __post_init__(self) -> None:
        for n in ("modules", "setup", "sbatch_extra"):
            v = getattr(self, n)
            if isinstance(v, (list, str)):
                object.__setattr__(self, n, (v,) if isinstance(v, str) else tuple(v))
        problems = _check(self)
        if problems:
            raise ConfigError([f"cluster profile {self.name!r}: {p}" for p in problems])

    def replace(self, **changes: Any) -> ClusterProfile:
        """A copy with some fields changed (validated again), e.g. ``time_limit="00:01:00"``."""
        _reject_unknown(changes)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for n in ("modules", "setup", "sbatch_extra"):
            d[n] = list(d[n])
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClusterProfile:
        _reject_unknown(data)
        return cls(**data)


FIELD_NAMES = tuple(f.name for f in fields(ClusterProfile))


def _reject_unknown(data: dict[str, Any]) -> None:
    unknown = sorted(set(data) - set(FIELD_NAMES))
    if unknown:
        raise ConfigError(f"unknown cluster profile key(s): {unknown}. "
                          f"Valid keys are: {', '.join(FIELD_NAMES)}")


def _check(p: ClusterProfile) -> list[str]:
    out = []
    if p.gpu_request not in GPU_REQUESTS:
        out.append(f"gpu_request={p.gpu_request!r} is not one of {list(GPU_REQUESTS)}")
    if p.master_addr_from not in MASTER_ADDR_FROM:
        out.append(f"master_addr_from={p.master_addr_from!r} is not one of "
                   f"{list(MASTER_ADDR_FROM)}")
    if not isinstance(p.time_limit, str) or not _TIME_RE.match(p.time_limit):
        out.append(f"time_limit={p.time_limit!r} is not a Slurm time; use e.g. '00:30:00', "
                   f"'90' (minutes) or '1-00:00:00'")
    if p.cpus_per_task is not None and (not isinstance(p.cpus_per_task, int)
                                        or p.cpus_per_task <= 0):
        out.append(f"cpus_per_task={p.cpus_per_task!r} must be a positive integer or null")
    if not isinstance(p.env, dict):
        out.append(f"env must be a mapping NAME: value, got {type(p.env).__name__}")
    else:
        bad = [k for k in p.env if not isinstance(k, str) or not _ENV_RE.match(k)]
        if bad:
            out.append(f"env names {bad} are not valid shell variable names")
    if p.container is not None:
        c = p.container
        if not isinstance(c, dict) or c.get("runtime") not in CONTAINER_RUNTIMES or not c.get(
                "image"):
            out.append(f"container={c!r} needs runtime (one of {list(CONTAINER_RUNTIMES)}) and "
                       f"image, e.g. {{runtime: pyxis, image: nvcr.io/nvidia/pytorch:24.05-py3}}")
        elif set(c) - {"runtime", "image", "mounts"}:
            out.append(f"container has unknown keys {sorted(set(c) - {'runtime', 'image', 'mounts'})}"
                       f"; valid: runtime, image, mounts")
    for n in ("partition", "account", "qos", "mem"):
        v = getattr(p, n)
        if v is not None and (not isinstance(v, str) or not v or any(ch.isspace() for ch in v)):
            out.append(f"{n}={v!r} must be a non-empty word without spaces")
    return out


def load_cluster(path_or_name: str | Path) -> ClusterProfile:
    """A cluster profile from a YAML file, or by name from ``code/clusters/<name>.yaml``."""
    p = Path(path_or_name)
    if not p.suffix and not p.exists():
        p = CLUSTER_DIR / f"{path_or_name}.yaml"
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as e:
        known = sorted(q.stem for q in CLUSTER_DIR.glob("*.yaml"))
        raise ConfigError(f"cannot read cluster profile {path_or_name} ({p}): {e.strerror}. "
                          f"Cluster profiles shipped in {CLUSTER_DIR}: {known}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"cluster profile {p} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"cluster profile {p} must be a YAML mapping of keys to values")
    data.setdefault("name", p.stem)
    try:
        return ClusterProfile.from_dict(data)
    except ConfigError as e:
        raise ConfigError([f"{p}: {v}" for v in e.violations]) from None


def resolve_cluster(cluster: ClusterProfile | str | Path | None) -> ClusterProfile:
    """The cluster profile for a ``cluster=`` value.

    A ClusterProfile is returned as is; a path or name is loaded (``load_cluster``). None means,
    in order: ``$LABKIT_CLUSTER`` (a YAML path or a name in ``code/clusters/``) when it is set;
    the mini-cluster's profile while it is up (the file ``labkit cluster up`` writes to
    ``labkit.paths.MINICLUSTER_SITE`` and ``labkit cluster down`` removes); else
    ``ClusterProfile()``, the generic defaults.
    """
    if isinstance(cluster, ClusterProfile):
        return cluster
    if cluster is not None:
        return load_cluster(cluster)
    env = os.environ.get(CLUSTER_ENV, "").strip()
    if env:
        try:
            return load_cluster(env)
        except ConfigError as e:
            raise ConfigError([f"${CLUSTER_ENV}={env}: {v}" for v in e.violations]
                              + [f"fix ${CLUSTER_ENV} (a cluster profile YAML path or a name in "
                                 f"{CLUSTER_DIR}) or unset it"]) from None
    if MINICLUSTER_SITE.is_file():
        return load_cluster(MINICLUSTER_SITE)
    return ClusterProfile()
