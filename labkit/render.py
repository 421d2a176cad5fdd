"""Job scripts from a RunConfig: pure, deterministic text that students can ``cat``.

``render_sbatch`` (Slurm), ``render_local`` (the local backend's launch script) and
``render_hostfile`` (DeepSpeed style) take values and return text: same input, byte-identical
output, nothing read from the environment. The scripts' shape lives in ``code/templates/``; this
module only fills in the blanks. Every value that reaches the shell goes through
``shlex.quote`` (paths may hold spaces, quotes, ``$(...)`` or ``;``), and the per-node values
(``$SLURM_NODEID``) are read from exported variables, never spliced into a quoted string.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path

from labkit.config import RunConfig
from labkit.paths import CODE_DIR
from labkit.paths import run_dir as default_run_dir
from labkit.site import ClusterProfile, resolve_profile

TEMPLATE_DIR = CODE_DIR / "templates"
_SLOT = re.compile(r"\{\{(\w+)\}\}")
_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def fill(template: str, values: dict[str, str]) -> str:
    """Replace each ``{{name}}``; a slot without a value (or a value without a slot) is a bug."""
    slots = set(_SLOT.findall(template))
    if slots != set(values):
        raise KeyError(f"template slots {sorted(slots)} != values {sorted(values)}")
    return _SLOT.sub(lambda m: values[m.group(1)], template)


def _template(name: str) -> str:
    return (TEMPLATE_DIR / name).read_text()


def _q(value: str | Path) -> str:
    return shlex.quote(str(value))


def _header(cfg: RunConfig, what: str) -> tuple[str, str]:
    unit = "GPU(s)" if cfg.device == "cuda" else "process(es)"
    title = f"labkit {what} for run {cfg.name}"
    summary = (f"{cfg.nodes} node(s) x {cfg.gpus_per_node} {unit} = world size "
               f"{cfg.world_size} | TP={cfg.tp} x PP={cfg.pp} x DP={cfg.dp} | {cfg.device}")
    return title, summary


def _sbatch_value(value: str) -> str:
    # #SBATCH lines are read by sbatch, not by the shell: quote only what needs it.
    return value if _SAFE.match(value) else '"' + value.replace('"', '\\"') + '"'


def default_program(profile: ClusterProfile | None = None) -> str:
    """``pretrain_gpt.py`` in the profile's code_dir (or this checkout's ``code/``)."""
    base = profile.code_dir if profile is not None and profile.code_dir else str(CODE_DIR)
    return str(Path(base) / "pretrain_gpt.py")


def sbatch_options(cfg: RunConfig, profile: ClusterProfile, run_dir: Path) -> list[str]:
    """The ``--option=value`` list of the job (also given to sbatch on its command line)."""
    cpus = profile.cpus_per_task or cfg.gpus_per_node
    opts = [f"--job-name={cfg.name}", f"--nodes={cfg.nodes}", "--ntasks-per-node=1",
            f"--cpus-per-task={cpus}"]
    if cfg.device == "cuda":
        if profile.gpu_request == "gres":
            opts.append(f"--gres=gpu:{cfg.gpus_per_node}")
        elif profile.gpu_request == "gpus-per-node":
            opts.append(f"--gpus-per-node={cfg.gpus_per_node}")
    opts.append(f"--time={profile.time_limit}")
    for n in ("partition", "account", "qos", "mem"):
        if getattr(profile, n):
            opts.append(f"--{n}={getattr(profile, n)}")
    if profile.exclusive:
        opts.append("--exclusive")
    # '%' would be a Slurm filename pattern (%j, %N); '%%' is a literal percent sign.
    opts.append(f"--output={str(Path(run_dir) / 'log.txt').replace('%', '%%')}")
    opts.append("--open-mode=append")
    opts.extend(profile.sbatch_extra)
    return opts


def _container(cfg: RunConfig, profile: ClusterProfile) -> tuple[str, str, list[str]]:
    """(srun options, wrapper before torchrun inside bash -c, setup lines)."""
    c = profile.container
    if not c:
        return "", "", []
    mounts = list(c.get("mounts") or [])
    if c["runtime"] == "pyxis":
        srun = f"--container-image={_q(c['image'])} "
        if mounts:
            srun += f"--container-mounts={_q(','.join(mounts))} "
        return srun, "", []
    gpu = "--nv " if cfg.device == "cuda" else ""
    setup = [f"export CONTAINER_IMAGE={_q(c['image'])}"]
    binds = "".join(f"--bind {m} " for m in mounts)  # mounts live in the profile, quoted below
    setup.append(f"export CONTAINER_BINDS={_q(binds.strip())}")
    wrapper = f'{c["runtime"]} exec {gpu}$CONTAINER_BINDS "$CONTAINER_IMAGE" '
    return "", wrapper, setup


def _env_lines(cfg: RunConfig, env: dict[str, str]) -> list[str]:
    env = dict(env)
    if cfg.device == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")  # the processes of a node share its cores
    if cfg.nccl_debug:
        env["NCCL_DEBUG"] = "INFO"  # transport/channel lines in log.txt (labkit parse reads them)
    return [f"export {k}={_q(v)}" for k, v in sorted(env.items())]


def render_sbatch(cfg: RunConfig, profile: ClusterProfile, run_dir: Path, *,
                  program: str | Path | None = None) -> str:
    """The sbatch script of a run.

    Args:
        cfg: the run (nodes, processes per node, layout, ``nccl_debug``).
        profile: the site (partition, account, time limit, modules, container, env).
        run_dir: the run's directory as the compute nodes see it.
        program: the training script; default ``pretrain_gpt.py`` of the profile's code_dir.
    """
    run_dir = Path(run_dir)
    title, summary = _header(cfg, "sbatch script")
    srun_extra, wrapper, container_setup = _container(cfg, profile)
    setup = [f"module load {_q(m)}" for m in profile.modules] + list(profile.setup)
    setup += container_setup
    if profile.master_addr_from == "nodeaddr":
        master = ("HEAD_NODE=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\n"
                  "# The nodes share one hostname here, so use the head node's own address.\n"
                  "export MASTER_ADDR=$(scontrol show node \"$HEAD_NODE\" | "
                  "grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)")
    else:
        master = "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)"
    sbatch = []
    for opt in sbatch_options(cfg, profile, run_dir):
        key, eq, val = opt.partition("=")
        sbatch.append(f"#SBATCH {key}{eq}{_sbatch_value(val) if eq else ''}")
    values = {
        "title": title, "summary": summary, "profile": repr(profile.name),
        "sbatch": "\n".join(sbatch),
        "run_dir": _q(run_dir), "program": _q(program or default_program(profile)),
        "torchrun": _q(profile.torchrun),
        "setup": "\n".join(setup) if setup else "# (no modules or setup lines in the profile)",
        "env": "\n".join(_env_lines(cfg, profile.env)),
        "master_addr": master, "nproc": str(cfg.gpus_per_node),
        "srun_extra": srun_extra, "wrapper": wrapper,
    }
    return fill(_template("sbatch.sh.tmpl"), values)


def default_torchrun() -> str:
    """The torchrun next to this Python (a venv's), else ``torchrun`` from PATH."""
    exe = Path(sys.executable).parent / "torchrun"
    return str(exe) if exe.exists() else "torchrun"


def render_local(cfg: RunConfig, run_dir: Path, *, program: str | Path | None = None,
                 torchrun: str | None = None, env: dict[str, str] | None = None) -> str:
    """The local backend's launch script: one torchrun agent per simulated node."""
    title, summary = _header(cfg, "local launch script")
    values = {
        "title": title, "summary": summary, "run_dir": _q(Path(run_dir)),
        "program": _q(program or default_program()),
        "torchrun": _q(torchrun or default_torchrun()),
        # Every rank is on this machine: gloo talks over loopback whatever the hostname says.
        "env": "\n".join(_env_lines(cfg, {"GLOO_SOCKET_IFNAME": "lo", **(env or {})})),
        "nodes": str(cfg.nodes), "nproc": str(cfg.gpus_per_node),
    }
    return fill(_template("local.sh.tmpl"), values)


def render_hostfile(hosts: list[str], slots: int) -> str:
    """A DeepSpeed-style hostfile: one ``host slots=N`` line per node."""
    if slots <= 0 or not hosts:
        raise ValueError(f"a hostfile needs at least one host and slots > 0 (got {hosts}, {slots})")
    return "".join(f"{h} slots={slots}\n" for h in hosts)


def cli_render(args: argparse.Namespace) -> int:
    """``labkit render CONFIG.json [--backend local|slurm] [--profile P] [--hostfile]``."""
    cfg = RunConfig.from_json(args.config)
    backend = args.backend or cfg.backend
    if args.hostfile:
        hosts = [f"node{i + 1}" for i in range(cfg.nodes)]
        sys.stdout.write(render_hostfile(hosts, cfg.gpus_per_node))
        return 0
    run_dir = default_run_dir(cfg.name)
    if backend == "slurm":
        profile = resolve_profile(args.profile)
        if profile.run_root:
            run_dir = Path(profile.run_root) / cfg.name
        sys.stdout.write(render_sbatch(cfg, profile, run_dir))
    else:
        sys.stdout.write(render_local(cfg, run_dir))
    return 0
