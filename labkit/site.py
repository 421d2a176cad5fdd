"""ClusterProfile: everything site-specific about a Slurm cluster, kept out of the templates.

A cluster profile is a small YAML file (examples in ``code/clusters/``): partition, account, qos,
time limit, how GPUs are requested, modules to load, an optional container wrapper, environment
variables for NCCL / gloo, and the shared run root. ``render_sbatch`` reads it; nothing about a
particular site is hard-coded anywhere else. A site without Slurm lists its ``hosts`` (name,
address, slots) or points at an existing DeepSpeed ``hostfile``, and picks a ``launcher``
(``pdsh`` or ``deepspeed``) for the hostfile backend (``labkit.hosts`` reads either).

``load_cluster(path_or_name)`` reads one. The entry points (the CLI, ``labkit.lab``, regress,
the doctor) resolve the site once with ``resolve_cluster(cluster)``: an object, a YAML path or
a name in ``code/clusters/``, or None for the default ($LABKIT_CLUSTER, else the mini-cluster
while ``labkit cluster up`` has it running, else ``ClusterProfile()``); everything below takes
the resolved ClusterProfile (``as_profile``: as given, never the environment).
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from labkit.errors import ConfigError
from labkit.hosts import check_hosts
from labkit.nodenet import link_problems
from labkit.paths import CODE_DIR, MINICLUSTER_SITE, check_slurm_dir
from labkit.validate import loads_yaml, read_input, text_problem

CLUSTER_DIR = CODE_DIR / "clusters"
CLUSTER_ENV = "LABKIT_CLUSTER"
GPU_REQUESTS = ("gres", "gpus-per-node", "none")
CONTAINER_RUNTIMES = ("apptainer", "singularity", "pyxis")
MASTER_ADDR_FROM = ("hostname", "nodeaddr")
_TIME_RE = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$|^\d+$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PLACEHOLDER = re.compile(r"\{[^}]*\}?|\}")


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
    requeue: bool | None = None
    """Slurm ``--requeue``: a job whose node fails, that is preempted, or that saved on the
    warning signal goes back to the queue and its next attempt resumes from the last checkpoint
    (the log is appended to); ``false``: ``--no-requeue``; None: the site's ``JobRequeue``."""
    warning_s: int | None = 120
    """Seconds before the time limit at which Slurm sends SIGUSR1 to the job script
    (``--signal=B:USR1@S``; also at a preemption where the site sets
    ``preempt_send_user_signal``): the training saves a checkpoint at the next iteration and
    stops (exit code 75). Slurm may send it up to 60 s earlier. 0 or None: no warning."""
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
    """Where labkit's ``code/`` lives on the nodes (``pretrain_gpt.py``, the all-reduce
    benchmark, the doctor's probe; ``data/`` beside it); None: this checkout's ``code/``."""
    program: str | None = None
    """The training program on the nodes, e.g. an upstream Megatron-LM ``pretrain_gpt.py``
    (the job script passes it the run as Megatron-LM flags); None: ``pretrain_gpt.py`` in
    ``code_dir``. labkit's other programs stay in ``code_dir``."""
    run_root: str | None = None
    """Shared run root seen by every node; None: ``labkit.paths.run_root()``. ``{user}`` in it
    is the Unix user running labkit (``/shared/labkit/{user}/runs``: one root per student)."""
    gpu_memory_gb: float | None = None
    """Memory of one GPU of the site in GB (e.g. 80 for an H100 80GB); the planner's budget
    under the ``gpu`` profile. None: the profile's default."""
    gpus_per_node: int | None = None
    """GPUs of one node of the site (e.g. 8); the ``gpu`` profile's GPUs per node when a run
    does not give its own. None: the profile's default."""
    master_addr_from: str = "hostname"
    """``hostname``: the head node's name; ``nodeaddr``: its Slurm NodeAddr (the mini-cluster,
    whose nodes share one hostname)."""
    slurm_conf: str | None = None
    """SLURM_CONF for labkit's own sbatch/squeue calls (the mini-cluster); None: the default."""
    sbatch_extra: tuple[str, ...] = ()
    """More ``#SBATCH`` options, verbatim, e.g. ``--constraint=h100``."""
    hosts: tuple[dict[str, Any], ...] = ()
    """The hostfile backend's hosts in order, the first one the head (MASTER_ADDR):
    ``{name, address, slots}``; ``address`` (what the rendezvous dials) defaults to the name,
    ``slots`` is processes (GPUs) on that host. Slot counts may differ between hosts."""
    hostfile: str | None = None
    """Instead of ``hosts``: an existing DeepSpeed hostfile (``name slots=N`` lines)."""
    launcher: str = "pdsh"
    """The hostfile backend's launcher: ``pdsh`` (``pdsh -R ssh`` runs torchrun on every host)
    or ``deepspeed`` (the DeepSpeed launcher; ``pip install -e .[deepspeed]``)."""
    local_link: dict[str, str] | None = None
    """The local backend's link between a multi-node job's nodes (each a network namespace on
    this machine, ``labkit.nodenet``): ``{rate: 1gbit, latency: 50ms}``, tc units (rate in
    bits per second, e.g. ``200mbit``, or ``off``: not shaped; latency: tbf's queueing limit).
    None: 1gbit, 50ms. ``$LABKIT_LINK_RATE`` / ``$LABKIT_LINK_LATENCY``, where set, win."""

    def __post_init__(self) -> None:
        for n in ("modules", "setup", "sbatch_extra"):
            v = getattr(self, n)
            if isinstance(v, (list, str)):
                object.__setattr__(self, n, (v,) if isinstance(v, str) else tuple(v))
            elif v is None:
                object.__setattr__(self, n, ())
        if type(self.time_limit) is int:  # YAML's `time_limit: 30` (minutes)
            object.__setattr__(self, "time_limit", str(self.time_limit))
        if isinstance(self.hosts, list):
            object.__setattr__(self, "hosts", tuple(self.hosts))
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
        d["hosts"] = [dict(h) for h in self.hosts]
        return d

    def gpu_defaults(self) -> dict[str, Any]:
        """What the site says about its GPUs, for a run on them (``RunConfig.for_profile``):
        ``gpu_memory_gb`` and ``gpus_per_node`` where the profile sets them."""
        out: dict[str, Any] = {}
        if self.gpu_memory_gb is not None:
            out["gpu_memory_gb"] = float(self.gpu_memory_gb)
        if self.gpus_per_node is not None:
            out["gpus_per_node"] = self.gpus_per_node
        return out

    def run_root_path(self, user: str | None = None) -> Path | None:
        """``run_root`` with ``{user}`` filled in (default: the Unix user running this process,
        from its uid, not from $USER); None when the profile sets no run root."""
        if not self.run_root:
            return None
        return Path(self.run_root.replace("{user}", user or current_user()))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClusterProfile:
        _reject_unknown(data)
        return cls(**data)


FIELD_NAMES = tuple(f.name for f in fields(ClusterProfile))


def _reject_unknown(data: dict[str, Any]) -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"a cluster profile is a mapping of keys to values, not "
                          f"{type(data).__name__}")
    unknown = sorted(str(k)[:40] for k in set(data) - set(FIELD_NAMES))
    if unknown:
        raise ConfigError(f"unknown cluster profile key(s): {unknown}. "
                          f"Valid keys are: {', '.join(FIELD_NAMES)}")


def _check(p: ClusterProfile) -> list[str]:
    """Every broken rule of a profile. Each value that reaches the job script or an ``#SBATCH``
    line is one line of text: a newline there would end the directive and run the rest as a
    shell command, so it is refused here, never rendered."""
    out: list[str] = []
    for n in ("name", "time_limit", "torchrun", "gpu_request", "master_addr_from"):
        why = text_problem(n, getattr(p, n))
        if why:
            out.append(why)
    for n in ("code_dir", "program", "run_root", "slurm_conf"):
        v = getattr(p, n)
        why = None if v is None else text_problem(n, v)
        if why:
            out.append(why)
    if out:
        return out
    if p.run_root is not None and (bad := _PLACEHOLDER.findall(p.run_root.replace("{user}", ""))):
        out.append(f"run_root={p.run_root!r}: {bad} is not a placeholder labkit fills; only "
                   f"{{user}} is, e.g. /shared/labkit/{{user}}/runs")
    g = p.gpu_memory_gb
    if g is not None and (isinstance(g, bool) or not isinstance(g, (int, float))
                          or not 0 < g <= 100_000):
        out.append(f"gpu_memory_gb={g!r:.40} must be a positive number of GB (e.g. 80) or null")
    n = p.gpus_per_node
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= 1024):
        out.append(f"gpus_per_node={n!r:.40} must be a positive whole number (e.g. 8) or null")
    if p.gpu_request not in GPU_REQUESTS:
        out.append(f"gpu_request={p.gpu_request!r} is not one of {list(GPU_REQUESTS)}")
    if p.master_addr_from not in MASTER_ADDR_FROM:
        out.append(f"master_addr_from={p.master_addr_from!r} is not one of "
                   f"{list(MASTER_ADDR_FROM)}")
    if not _TIME_RE.match(p.time_limit):
        out.append(f"time_limit={p.time_limit!r} is not a Slurm time; use e.g. '00:30:00', "
                   f"'90' (minutes) or '1-00:00:00' (quote it in YAML)")
    if p.cpus_per_task is not None and (isinstance(p.cpus_per_task, bool)
                                        or not isinstance(p.cpus_per_task, int)
                                        or not 0 < p.cpus_per_task <= 100_000):
        out.append(f"cpus_per_task={p.cpus_per_task!r:.40} must be a positive integer or null")
    if not isinstance(p.exclusive, bool):
        out.append(f"exclusive={p.exclusive!r:.40} must be true or false")
    if p.requeue is not None and not isinstance(p.requeue, bool):
        out.append(f"requeue={p.requeue!r:.40} must be true, false or null (the site's default)")
    w = p.warning_s
    if w is not None and (isinstance(w, bool) or not isinstance(w, int) or not 0 <= w <= 65_535):
        out.append(f"warning_s={w!r:.40} must be whole seconds before the time limit, 0-65535 "
                   f"(e.g. 120), or 0/null for no warning signal")
    for n in ("modules", "setup", "sbatch_extra"):
        v = getattr(p, n)
        if not isinstance(v, tuple):
            out.append(f"{n} must be a list of strings, got {type(v).__name__}")
            continue
        out += [w for i, x in enumerate(v) if (w := text_problem(f"{n}[{i}]", x))]
    if isinstance(p.sbatch_extra, tuple) and all(isinstance(x, str) for x in p.sbatch_extra):
        bad = [x for x in p.sbatch_extra if not x.startswith("--")]
        if bad:
            out.append(f"sbatch_extra {bad} must be sbatch options, e.g. '--constraint=h100'")
    out += _check_env(p.env)
    if p.container is not None:
        out += _check_container(p.container)
    for n in ("partition", "account", "qos", "mem"):
        v = getattr(p, n)
        if v is not None and (text_problem(n, v) or any(ch.isspace() for ch in v)):
            out.append(f"{n}={v!r:.60} must be a non-empty word without spaces")
    return out + check_hosts(p) + _check_local_link(p.local_link)


def _check_local_link(v: Any) -> list[str]:
    if v is None:
        return []
    if not isinstance(v, dict) or set(map(str, v)) - {"rate", "latency"}:
        return [f"local_link={v!r:.80} must be a mapping with rate and/or latency, e.g. "
                f"{{rate: 1gbit, latency: 50ms}} (rate off: no shaping)"]
    return link_problems(str(v.get("rate", "1gbit")), str(v.get("latency", "50ms")), "local_link")


def _check_env(env: Any) -> list[str]:
    if not isinstance(env, dict):
        return [f"env must be a mapping NAME: value, got {type(env).__name__}"]
    out = []
    bad = [k for k in env if not isinstance(k, str) or not _ENV_RE.match(k)]
    if bad:
        out.append(f"env names {bad[:5]!r:.200} are not valid shell variable names")
    for k, v in env.items():
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            out.append(f"env {k!r:.40}: {v!r:.40} must be a string (quote it in YAML)")
        elif why := text_problem(f"env {k!r:.40}", str(v), allow_empty=True):
            out.append(why)
    return out


def _check_container(c: Any) -> list[str]:
    if not isinstance(c, dict) or c.get("runtime") not in CONTAINER_RUNTIMES or not c.get(
            "image"):
        return [f"container={c!r:.120} needs runtime (one of {list(CONTAINER_RUNTIMES)}) and "
                f"image, e.g. {{runtime: pyxis, image: nvcr.io/nvidia/pytorch:24.05-py3}}"]
    extra = [str(k) for k in c if k not in ("runtime", "image", "mounts")]
    if extra:
        return [f"container has unknown keys {sorted(extra)}; valid: runtime, image, mounts"]
    out = [w for w in [text_problem("container image", c["image"])] if w]
    mounts = c.get("mounts") or []
    if not isinstance(mounts, list):
        return out + [f"container mounts must be a list of SRC:DST strings, got {mounts!r:.60}"]
    for i, m in enumerate(mounts):
        why = text_problem(f"container mounts[{i}]", m)
        if why:
            out.append(why)
        elif any(ch.isspace() for ch in m):
            out.append(f"container mounts[{i}]={m!r} holds a space; a bind mount is SRC:DST")
    return out


def current_user() -> str:
    """The Unix user this process runs as (by uid: $USER can say anything)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid without a passwd entry (some containers)
        return str(os.getuid())


def slurm_job_name(run: str, user: str | None = None) -> str:
    """The Slurm job name of run ``run``: ``labkit-<user>-<run>``, so that ``squeue`` says whose
    labkit job it is (default: the Unix user running this process)."""
    return f"labkit-{user or current_user()}-{run}"


def load_cluster(path_or_name: str | Path) -> ClusterProfile:
    """A cluster profile from a YAML file, or by name from ``code/clusters/<name>.yaml``."""
    p = Path(path_or_name)
    if not p.suffix and not p.exists():
        p = CLUSTER_DIR / f"{path_or_name}.yaml"
    try:
        data = loads_yaml(read_input(p, "cluster profile"), f"cluster profile {p}")
    except ConfigError as e:
        known = sorted(q.stem for q in CLUSTER_DIR.glob("*.yaml"))
        more = f". Cluster profiles shipped in {CLUSTER_DIR}: {known}" if not p.exists() else ""
        raise ConfigError(f"{e.violations[0]}{more}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"cluster profile {p} must be a YAML mapping of keys to values")
    data.setdefault("name", p.stem)
    try:
        return ClusterProfile.from_dict(data)
    except ConfigError as e:
        raise ConfigError([f"{p}: {v}" for v in e.violations]) from None


def as_profile(cluster: ClusterProfile | str | Path | None) -> ClusterProfile | None:
    """A ``cluster=`` value as given: a ClusterProfile as is, a YAML path or a name loaded
    (``load_cluster``), None as None. It never looks at the environment: code below the
    entry points takes the site they resolved (``resolve_cluster``) and passes it down."""
    if cluster is None or isinstance(cluster, ClusterProfile):
        return cluster
    return load_cluster(cluster)


def named_cluster(cluster: ClusterProfile | str | Path | None) -> ClusterProfile | None:
    """The site the caller named: ``cluster`` when given, else ``$LABKIT_CLUSTER`` (a YAML
    path or a name in ``code/clusters/``) when it is set, else None. For entry points only."""
    if cluster is not None:
        return as_profile(cluster)
    raw = os.environ.get(CLUSTER_ENV)
    if raw is None:
        return None
    env = raw.strip()
    if not env:
        raise ConfigError(f"${CLUSTER_ENV} is set but empty; unset it for the default site, or "
                          f"set it to a cluster profile (a YAML path or a name in {CLUSTER_DIR})")
    try:
        return load_cluster(env)
    except ConfigError as e:
        raise ConfigError([f"${CLUSTER_ENV}={env}: {v}" for v in e.violations]
                          + [f"fix ${CLUSTER_ENV} (a cluster profile YAML path or a name in "
                             f"{CLUSTER_DIR}) or unset it"]) from None


def resolve_cluster(cluster: ClusterProfile | str | Path | None) -> ClusterProfile:
    """The site of an entry point (the CLI, ``lab.launch``, regress, the doctor), resolved
    once there and passed down.

    A ClusterProfile is returned as is; a path or name is loaded (``load_cluster``). None means,
    in order: ``$LABKIT_CLUSTER`` (a YAML path or a name in ``code/clusters/``) when it is set;
    the mini-cluster's profile while it is up (the file ``labkit cluster up`` writes to
    ``labkit.paths.MINICLUSTER_SITE`` and ``labkit cluster down`` removes); else
    ``ClusterProfile()``, the generic defaults.
    """
    named = named_cluster(cluster)
    if named is not None:
        return named
    check_slurm_dir()  # an empty $LABKIT_SLURM_DIR would find a site.yaml in this folder
    if MINICLUSTER_SITE.is_file():
        return load_cluster(MINICLUSTER_SITE)
    return ClusterProfile()
