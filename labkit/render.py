"""Job scripts from a JobSpec: pure, deterministic text that students can ``cat``.

``render_sbatch`` (Slurm), ``render_local`` (the local backend's launch script) and
``render_hostfile`` (DeepSpeed style), and for the hostfile backend ``render_site_hostfile`` and
``render_hostfile_launch`` (pdsh or the DeepSpeed launcher) take values and return text: same
input, byte-identical output, nothing read from the environment. The script functions take what
the backends take: a JobSpec (``labkit.run.JobSpec``; a RunConfig becomes one where it enters,
``JobSpec.from_config``), the cluster profile, the run directory, and the program with its
arguments. The scripts' shape lives in ``code/templates/``; this module fills in the blanks.
Every value that reaches the shell goes through ``shlex.quote`` (paths may hold spaces, quotes,
``$(...)`` or ``;``), and the per-node values (``$SLURM_NODEID``) are read from exported
variables, never spliced into a quoted string.

The training script's arguments, one rule for every backend: the job script passes a run to
``pretrain_gpt.py`` as Megatron-LM flags only, the flags the Megatron-LM and DLI lab scripts
show, in arrays grouped as Megatron-LM's examples group them (parallelism, model, batch,
training, data, logging; one flag per line, ``labkit.megatron_args``), so that an upstream
Megatron-LM ``pretrain_gpt.py`` (a site whose profile sets ``program:`` to it) runs the same
script unchanged. The data flags are always there (Megatron-LM needs them): paths in labkit's
data folder are written ``"$DATA_DIR"/...``, set in the script to ``data/`` beside the site's
``code_dir`` (beside the folder of a ``program`` given to the function), where labkit's
``pretrain_gpt.py`` reads its default corpus and tokenizer. The fields that have no
Megatron-LM flag (name, nodes, gpus_per_node, device, memory_limit_gb, the profiler's ranks,
...) travel in ``RUN_DIR/config.json``, which the script names in the environment
(``LABKIT_CONFIG``), not on the command line: Megatron-LM refuses flags it does not know, and
ignores the variable. labkit's
``pretrain_gpt.py`` reads both, and stops before training when a flag and config.json disagree
(change the RunConfig and render again, not the job script). ``--config RUN_DIR/config.json``
stays for any other program given a run (it is what a program other than ``pretrain_gpt.py``,
or a JobSpec without flags, gets when ``program_args`` is None) and for running by hand.
Explicit ``program_args`` always reach the program verbatim.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from labkit.errors import ConfigError
from labkit.hosts import Host, cluster_hosts
from labkit.megatron_args import DATA_DIR_REF
from labkit.paths import CODE_DIR, DATA_DIR, default_torchrun
from labkit.run.spec import JobSpec
from labkit.site import ClusterProfile, slurm_job_name

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


def _spec(spec: JobSpec) -> JobSpec:
    """The JobSpec a script is rendered from; a RunConfig is refused with the fix."""
    if not isinstance(spec, JobSpec):
        raise ConfigError(f"job scripts are rendered from a JobSpec, not {type(spec).__name__} "
                          f"({spec!r:.60}); for a RunConfig pass JobSpec.from_config(cfg) "
                          f"(labkit.run.JobSpec)")
    return spec


def _q(value: str | Path) -> str:
    return shlex.quote(str(value))


def _header(spec: JobSpec, what: str) -> tuple[str, str]:
    unit = "GPU(s)" if spec.device == "cuda" else "process(es)"
    title = f"labkit {what} for run {spec.name}"
    layout = f" | {spec.layout}" if spec.layout else ""
    summary = (f"{spec.nodes} node(s) x {spec.gpus_per_node} {unit} = world size "
               f"{spec.world_size}{layout} | {spec.device}")
    return title, summary


def program_words(program_args: Sequence[str] | None) -> str:
    """The program's arguments as shell words; None: the run's config file."""
    if program_args is None:
        return '--config "$RUN_DIR/config.json"'
    if isinstance(program_args, (str, bytes)):
        raise ConfigError(f"program_args={program_args!r} must be a list of arguments, e.g. "
                          f"['--iters', '10'], not one string")
    return " ".join(_q(a) for a in program_args)


CHECKPOINTS = '"$RUN_DIR/checkpoints"'


def _flag_word(word: str) -> str:
    ref = DATA_DIR_REF + "/"
    return f'"{DATA_DIR_REF}"/' + _q(word[len(ref):]) if word.startswith(ref) else _q(word)


def data_dir(cluster: ClusterProfile | None = None) -> Path:
    """labkit's data folder on the nodes: ``data/`` beside the cluster's code_dir (or this
    checkout's ``data/``)."""
    return Path(cluster.code_dir).parent / "data" if cluster and cluster.code_dir else DATA_DIR


def megatron_block(spec: JobSpec, data: Path = DATA_DIR) -> str:
    """The run's Megatron-LM flags as bash arrays, one flag per line, by group, then
    ``MEGATRON_ARGS`` (all of them) and ``LABKIT_CONFIG`` (the fields without a flag);
    ``DATA_DIR`` is ``data``, labkit's data folder."""
    lines = ["", "", "# ---- The run as Megatron-LM flags (pretrain_gpt.py: labkit's or "
             "Megatron-LM's) ----------------",
             "# labkit's own fields without a Megatron-LM flag (name, nodes, device, memory "
             "cap, ...) are in",
             "# config.json, named here in the environment: Megatron-LM refuses flags it "
             "does not know.",
             'export LABKIT_CONFIG="$RUN_DIR/config.json"']
    words = [w for _, items in spec.megatron_flags for it in items for w in it]
    if any(w.startswith(DATA_DIR_REF + "/") for w in words):
        lines += ["# labkit's data folder (`make data`): the corpus and tokenizer of a run "
                  "without data_path.", f"DATA_DIR={_q(data)}"]
    names = []
    for group, items in spec.megatron_flags:
        name = f"{group.upper()}_ARGS"
        names.append(name)
        body = ["    " + " ".join(_flag_word(w) for w in it) for it in items]
        if group == "logging":
            body += [f"    --save {CHECKPOINTS}", f"    --load {CHECKPOINTS}"]
        lines += [f"{name}=(", *body, ")"]
    refs = [f'"${{{n}[@]}}"' for n in names]
    rows = [" ".join(refs[i:i + 3]) for i in range(0, len(refs), 3)]
    lines.append("MEGATRON_ARGS=(" + "\n               ".join(rows) + ")")
    return "\n".join(lines)


def _arguments(spec: JobSpec, program: str | Path | None, program_args: Sequence[str] | None,
               cluster: ClusterProfile | None = None) -> tuple[str, str, str]:
    """(the program, lines before the command, its arguments on it): the module docstring's
    rule; no ``program``: the site's training program (``default_program``)."""
    training = program is None or Path(program).name == "pretrain_gpt.py"
    # labkit's pretrain_gpt.py reads data/ beside its own folder; the site's program (maybe
    # Megatron-LM's) gets the data beside the site's code_dir.
    data = Path(program).parent.parent / "data" if program else data_dir(cluster)
    program = program or default_program(cluster)
    if program_args is None and spec.megatron_flags and training:
        return str(program), megatron_block(spec, data), '"${MEGATRON_ARGS[@]}"'
    return str(program), "", program_words(program_args)


def _sbatch_value(value: str) -> str:
    # #SBATCH lines are read by sbatch, not by the shell: quote only what needs it.
    return value if _SAFE.match(value) else '"' + value.replace('"', '\\"') + '"'


def default_program(cluster: ClusterProfile | None = None) -> str:
    """The training program: the cluster's ``program``, else ``pretrain_gpt.py`` in its
    code_dir (or this checkout's ``code/``)."""
    if cluster is not None and cluster.program:
        return cluster.program
    base = cluster.code_dir if cluster is not None and cluster.code_dir else str(CODE_DIR)
    return str(Path(base) / "pretrain_gpt.py")


def sbatch_options(spec: JobSpec, cluster: ClusterProfile, run_dir: Path) -> list[str]:
    """The ``--option=value`` list of the job (also given to sbatch on its command line)."""
    spec = _spec(spec)
    cpus = cluster.cpus_per_task or spec.gpus_per_node
    opts = [f"--job-name={slurm_job_name(spec.name)}", f"--nodes={spec.nodes}", "--ntasks-per-node=1",
            f"--cpus-per-task={cpus}"]
    if spec.device == "cuda":
        if cluster.gpu_request == "gres":
            opts.append(f"--gres=gpu:{spec.gpus_per_node}")
        elif cluster.gpu_request == "gpus-per-node":
            opts.append(f"--gpus-per-node={spec.gpus_per_node}")
    opts.append(f"--time={cluster.time_limit}")
    for n in ("partition", "account", "qos", "mem"):
        if getattr(cluster, n):
            opts.append(f"--{n}={getattr(cluster, n)}")
    if cluster.exclusive:
        opts.append("--exclusive")
    if cluster.requeue is not None:
        opts.append("--requeue" if cluster.requeue else "--no-requeue")
    if cluster.warning_s:
        # To the batch script only (B:), which forwards it to the training (job script).
        opts.append(f"--signal=B:USR1@{cluster.warning_s}")
    # '%' would be a Slurm filename pattern (%j, %N); '%%' is a literal percent sign.
    opts.append(f"--output={str(Path(run_dir) / 'log.txt').replace('%', '%%')}")
    opts.append("--open-mode=append")
    opts.extend(cluster.sbatch_extra)
    return opts


def _container(spec: JobSpec, cluster: ClusterProfile) -> tuple[str, str, list[str]]:
    """(srun options, wrapper before torchrun inside bash -c, setup lines)."""
    c = cluster.container
    if not c:
        return "", "", []
    mounts = list(c.get("mounts") or [])
    if c["runtime"] == "pyxis":
        srun = f"--container-image={_q(c['image'])} "
        if mounts:
            srun += f"--container-mounts={_q(','.join(mounts))} "
        return srun, "", []
    gpu = "--nv " if spec.device == "cuda" else ""
    setup = [f"export CONTAINER_IMAGE={_q(c['image'])}"]
    binds = "".join(f"--bind {m} " for m in mounts)  # mounts live in the profile, quoted below
    setup.append(f"export CONTAINER_BINDS={_q(binds.strip())}")
    wrapper = f'{c["runtime"]} exec {gpu}$CONTAINER_BINDS "$CONTAINER_IMAGE" '
    return "", wrapper, setup


def _env_lines(spec: JobSpec, env: dict[str, str]) -> list[str]:
    env = dict(env)
    if spec.device == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")  # the processes of a node share its cores
    if spec.nccl_debug:
        env["NCCL_DEBUG"] = "INFO"  # transport/channel lines in log.txt (labkit parse reads them)
    return [f"export {k}={_q(v)}" for k, v in sorted(env.items())]


def render_sbatch(spec: JobSpec, cluster: ClusterProfile, run_dir: Path, *,
                  program: str | Path | None = None,
                  program_args: Sequence[str] | None = None) -> str:
    """The sbatch script of a run.

    Args:
        spec: the job's shape (nodes, processes per node, device, ``nccl_debug``).
        cluster: the site (partition, account, time limit, modules, container, env).
        run_dir: the run's directory as the compute nodes see it.
        program: the program; default the cluster's training program (``default_program``).
        program_args: its arguments; default: the run's Megatron-LM flags for
            ``pretrain_gpt.py``, else ``--config "$RUN_DIR/config.json"`` (module docstring).
    """
    spec, run_dir = _spec(spec), Path(run_dir)
    title, summary = _header(spec, "sbatch script")
    srun_extra, wrapper, container_setup = _container(spec, cluster)
    setup = [f"module load {_q(m)}" for m in cluster.modules] + list(cluster.setup)
    setup += container_setup
    if cluster.master_addr_from == "nodeaddr":
        master = ("HEAD_NODE=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\n"
                  "# The nodes share one hostname here, so use the head node's own address.\n"
                  "export MASTER_ADDR=$(scontrol show node \"$HEAD_NODE\" | "
                  "grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)")
    else:
        master = "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)"
    sbatch = []
    for opt in sbatch_options(spec, cluster, run_dir):
        key, eq, val = opt.partition("=")
        sbatch.append(f"#SBATCH {key}{eq}{_sbatch_value(val) if eq else ''}")
    program, block, words = _arguments(spec, program, program_args, cluster)
    values = {
        "title": title, "summary": summary, "cluster": repr(cluster.name),
        "sbatch": "\n".join(sbatch),
        "run_dir": _q(run_dir), "program": _q(program),
        "program_args": words, "program_setup": block,
        "torchrun": _q(cluster.torchrun),
        "setup": "\n".join(setup) if setup else "# (no modules or setup lines in the profile)",
        "env": "\n".join(_env_lines(spec, cluster.env)),
        "master_addr": master, "nproc": str(spec.gpus_per_node),
        "srun_extra": srun_extra, "wrapper": wrapper,
    }
    return fill(_template("sbatch.sh.tmpl"), values)


def render_local(spec: JobSpec, run_dir: Path, *, program: str | Path | None = None,
                 program_args: Sequence[str] | None = None, torchrun: str | None = None,
                 env: dict[str, str] | None = None, nodes_net: dict | None = None) -> str:
    """The local backend's launch script: one torchrun agent per simulated node (the other
    arguments as in ``render_sbatch``). ``nodes_net``: ``labkit.nodenet.shell_parts``, when
    every node is a network namespace of its own; None: all nodes on this machine's loopback."""
    spec = _spec(spec)
    title, summary = _header(spec, "local launch script")
    program, block, words = _arguments(spec, program, program_args)
    # Without namespaces every rank is on this machine: gloo talks over loopback whatever the
    # hostname says.
    net = nodes_net or {"reexec": "", "node_net": "", "node_enter": "",
                        "master_addr": "127.0.0.1", "env": {"GLOO_SOCKET_IFNAME": "lo"}}
    values = {
        "title": title, "summary": summary, "run_dir": _q(Path(run_dir)),
        "program": _q(program), "program_args": words, "program_setup": block,
        "torchrun": _q(torchrun or default_torchrun()),
        "env": "\n".join(_env_lines(spec, {**net["env"], **(env or {})})),
        "nodes": str(spec.nodes), "nproc": str(spec.gpus_per_node),
        **{k: net[k] for k in ("reexec", "node_net", "node_enter", "master_addr")},
    }
    return fill(_template("local.sh.tmpl"), values)


def render_hostfile(hosts: list[str], slots: int) -> str:
    """A DeepSpeed-style hostfile: one ``host slots=N`` line per node."""
    if slots <= 0 or not hosts:
        raise ValueError(f"a hostfile needs at least one host and slots > 0 (got {hosts}, {slots})")
    return "".join(f"{h} slots={slots}\n" for h in hosts)


# --- the hostfile backend: pdsh or the DeepSpeed launcher ----------------------------------------
def render_site_hostfile(hosts: Sequence[Host]) -> str:
    """A DeepSpeed hostfile of real hosts: ``name slots=N`` per host (slot counts may differ)."""
    if not hosts:
        raise ConfigError("a hostfile needs at least one host")
    lines = ["# DeepSpeed hostfile rendered by labkit: one `host slots=N` line per host; "
             "the first is the head"]
    lines += [f"{h.name} slots={h.slots}" + (f"  # {h.address}" if h.address != h.name else "")
              for h in hosts]
    return "\n".join(lines) + "\n"


def job_hosts(spec: JobSpec, cluster: ClusterProfile) -> list[Host]:
    """The hosts a job runs on: the profile's first ``nodes`` hosts, each with ``gpus_per_node``
    slots or more. ConfigError naming the hosts, slots and the fix when the job does not fit."""
    spec = _spec(spec)
    hosts = cluster_hosts(cluster)
    if not hosts:
        raise ConfigError(f"cluster profile {cluster.name!r} lists no hosts: the hostfile backend "
                          f"needs `hosts: [{{name, address, slots}}, ...]` or `hostfile: PATH` "
                          f"(on this machine: `labkit cluster status --json` names the "
                          f"mini-cluster's hostfile profile)")
    listed = ", ".join(f"{h.name} slots={h.slots}" for h in hosts)
    want = (f"world size {spec.world_size} (nodes {spec.nodes} x gpus_per_node "
            f"{spec.gpus_per_node})")
    if spec.nodes > len(hosts):
        raise ConfigError(f"{want} needs {spec.nodes} hosts, but the hostfile of {cluster.name!r} "
                          f"has {len(hosts)} ({listed}); use nodes <= {len(hosts)} or add hosts")
    used = hosts[:spec.nodes]
    short = [h for h in used if h.slots < spec.gpus_per_node]
    if short:
        fit = min(h.slots for h in used)
        raise ConfigError(f"{want} does not fit the hostfile of {cluster.name!r}: "
                          + ", ".join(f"{h.name} has slots={h.slots} < {spec.gpus_per_node}"
                                      for h in short)
                          + f" (hosts: {listed}); use gpus_per_node <= {fit}, or give those "
                            f"hosts more slots")
    return used


def render_hostfile_launch(spec: JobSpec, cluster: ClusterProfile, run_dir: Path, *,
                           program: str | Path | None = None,
                           program_args: Sequence[str] | None = None) -> str:
    """The hostfile backend's ``job.sh`` for the profile's ``launcher``: ``pdsh`` (pdsh -R ssh
    runs one torchrun agent per host) or ``deepspeed`` (the DeepSpeed launcher with the
    rendered ``hostfile`` beside it). Arguments as in ``render_sbatch``."""
    spec, run_dir = _spec(spec), Path(run_dir)
    hosts = job_hosts(spec, cluster)
    title, summary = _header(spec, f"{cluster.launcher} launch script")
    setup = [f"module load {_q(m)}" for m in cluster.modules] + list(cluster.setup)
    env_lines = _env_lines(spec, dict(cluster.env))
    program, block, words = _arguments(spec, program, program_args, cluster)
    values = {
        "title": title, "summary": summary + f" | hosts {','.join(h.name for h in hosts)}",
        "cluster": repr(cluster.name), "run_dir": _q(run_dir),
        "program": _q(program), "program_args": words, "program_setup": block,
        "setup": "\n".join(setup) if setup else "# (no modules or setup lines in the profile)",
        "env": "\n".join(env_lines) if env_lines else "# (no environment in the profile)",
        "hosts": _q(",".join(h.name for h in hosts)), "master_addr": _q(hosts[0].address),
        "nodes": str(spec.nodes), "nproc": str(spec.gpus_per_node),
    }
    if cluster.launcher == "deepspeed":
        tr = cluster.torchrun
        values["deepspeed"] = _q(str(Path(tr).with_name("deepspeed")) if "/" in tr else "deepspeed")
        names = sorted({line.split("=", 1)[0][len("export "):] for line in env_lines})
        names += ["LABKIT_CONFIG"] if block else []
        values["env_names"] = " ".join(["LABKIT_LOG_CAPTURED", *names])
        return fill(_template("deepspeed.sh.tmpl"), values)
    values["torchrun"] = _q(cluster.torchrun)
    return fill(_template("pdsh.sh.tmpl"), values)
