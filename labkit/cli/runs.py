"""Commands about one run's config: ``new``, ``check``, ``plan``, ``render``."""

from __future__ import annotations

import argparse
import sys

from labkit.backends.local import job_script
from labkit.cli.common import add_backend, add_cluster, add_json, positive_int, say, show_json, warn
from labkit.config import PRESETS, PROFILES, RunConfig
from labkit.errors import ConfigError, LabkitError
from labkit.hosts import cluster_hosts
from labkit.paths import run_dir, run_root
from labkit.planner.calibration import calibrated_hardware, describe
from labkit.planner.plan import base_config, format_layouts, plan, plan_layouts
from labkit.render import (
    job_hosts,
    render_hostfile,
    render_hostfile_launch,
    render_sbatch,
    render_site_hostfile,
)
from labkit.run import JobSpec
from labkit.site import load_cluster, resolve_cluster


def _presets() -> list[str]:
    return list(PRESETS)


def _profiles() -> list[str]:
    return list(PROFILES)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    presets = _presets()
    p = sub.add_parser("new", help="write runs/NAME/config.json from a preset, show its summary",
                       description="Write a run config (runs/NAME/config.json, or under the "
                                   "cluster's run_root) from a model preset, with the device, "
                                   "precision and batch of a notebook profile.")
    p.add_argument("name", metavar="NAME", help="the run's name: its folder runs/NAME/")
    p.add_argument("--preset", choices=presets, default="tiny", metavar="PRESET",
                   help=f"model preset, one of: {', '.join(presets)} (default: tiny)")
    p.add_argument("--profile", choices=_profiles(),
                   help="device, precision, node shape and batch: cpu (fp32 processes) or gpu "
                        "(bf16 on CUDA) (default: cpu for tiny, gpu for the GPT presets)")
    p.add_argument("--tp", type=positive_int, default=1, metavar="N",
                   help="tensor parallel size (default: 1)")
    p.add_argument("--pp", type=positive_int, default=1, metavar="N",
                   help="pipeline parallel size (default: 1)")
    p.add_argument("--nodes", type=positive_int, metavar="N",
                   help="nodes (default: the profile's, 2)")
    p.add_argument("--gpus-per-node", type=positive_int, metavar="N",
                   help="GPUs per node; on CPU, processes per node (default: the profile's)")
    add_cluster(p, "a Slurm run; the run is then a slurm run in the cluster's run_root")
    p.add_argument("--force", action="store_true",
                   help="replace an existing config.json of that name")
    p.set_defaults(func=cmd_new)

    p = sub.add_parser("check", help="validate a run config or a site profile (2: invalid)",
                       description="Validate a run config: its summary when valid (exit 0), "
                                   "every broken rule with its numbers and a fix when not (exit 2). "
                                   "With --cluster SITE.yaml, the site profile is checked too, "
                                   "and a GPU config against the site's GPUs (GPUs per node, "
                                   "memory).")
    p.add_argument("config", nargs="?", metavar="CONFIG.json", help="the run config to check")
    p.add_argument("--cluster", metavar="SITE.yaml|NAME",
                   help="a site profile to check (e.g. the one $LABKIT_CLUSTER names): every "
                        "wrong field with the fix, and the run root it gives this user")
    add_json(p, '{"valid": ..., "errors": [...]}')
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("plan", help="memory, FLOPs, bubble of a config, or every layout",
                       description="With CONFIG.json alone: memory per pipeline stage, FLOPs, "
                                   "bubble and whether it fits. With a cluster shape "
                                   "(--world-size, --nodes, --gpus-per-node): every TP x PP x DP "
                                   "(x VPP) layout of the config or preset, fitting ones first. "
                                   "The first line says what was assumed.")
    p.add_argument("config", nargs="?", metavar="CONFIG.json",
                   help="a run config (default: the --preset with a notebook profile's settings)")
    p.add_argument("--preset", choices=presets, metavar="PRESET",
                   help=f"model preset to sweep, one of: {', '.join(presets)} (default: tiny)")
    p.add_argument("--profile", choices=_profiles(),
                   help="device, precision and batch of a preset: cpu (fp32) or gpu (bf16 on "
                        "CUDA) (default: gpu when --gpu-memory-gb is given or for the GPT "
                        "presets, else cpu)")
    p.add_argument("--world-size", type=positive_int, metavar="N",
                   help="ranks in all (split into nodes of 8 GPUs on gpu, 2 processes on cpu, "
                        "where it divides)")
    p.add_argument("--nodes", type=positive_int, metavar="N", help="nodes of the cluster shape")
    p.add_argument("--gpus-per-node", type=positive_int, metavar="N",
                   help="GPUs (on CPU: processes) per node of the cluster shape")
    p.add_argument("--gpu-memory-gb", type=float, metavar="GB",
                   help="memory of one GPU in GB (implies a GPU for a preset; default: the "
                        "site's gpu_memory_gb for a GPU run, else the config's)")
    add_cluster(p, "a GPU run's memory budget (its gpu_memory_gb)")
    add_json(p, "the plan (a list of valid layouts when sweeping)")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("render", help="print the job script (sbatch, local or hostfile) of a config",
                       description="Print the job script labkit would submit for a config, "
                                   "without submitting anything.")
    p.add_argument("config", metavar="CONFIG.json", help="the run config")
    add_backend(p)
    add_cluster(p)
    p.add_argument("--hostfile", action="store_true",
                   help="print a DeepSpeed-style hostfile instead (node1 slots=N, ...; with "
                        "--backend hostfile: the profile's hosts)")
    p.set_defaults(func=cmd_render)


# --- handlers ----------------------------------------------------------------------------------
def cmd_check(args: argparse.Namespace) -> int:
    if not args.config and not args.cluster:
        warn("labkit check: give CONFIG.json, or --cluster SITE.yaml to check a site profile")
        return 2
    if args.cluster and not (args.json and args.config):  # with both: one JSON answer below
        code = _check_cluster(args.cluster, as_json=args.json)
        if code or not args.config:
            return code
    try:
        cfg = RunConfig.from_json(args.config)
        if args.cluster:
            _check_on_site(cfg, args.cluster)
    except ConfigError as e:
        if not args.json:
            raise
        show_json({"valid": False, "errors": e.violations})
        return 2
    if args.json:
        show_json({"valid": True, "errors": []})
    else:
        say(cfg.summary())
    return 0


def _site_memory(cfg: RunConfig, cluster: str | None, given: float | None) -> RunConfig:
    """``cfg`` with a GPU run's memory budget from ``--gpu-memory-gb``, else the site's
    ``gpu_memory_gb`` (``--cluster``, else $LABKIT_CLUSTER...), else as it is."""
    if given is not None:
        return cfg.replace(gpu_memory_gb=given)
    if cfg.device != "cuda":
        return cfg

    site = resolve_cluster(cluster)
    if site.gpu_memory_gb is None or float(site.gpu_memory_gb) == cfg.gpu_memory_gb:
        return cfg
    warn(f"GPU memory {site.gpu_memory_gb:g} GB per GPU: site profile {site.name}'s "
         f"gpu_memory_gb (the config says {cfg.gpu_memory_gb:g})")
    return cfg.replace(gpu_memory_gb=float(site.gpu_memory_gb))


def _check_on_site(cfg: RunConfig, cluster: str) -> None:
    """ConfigError naming what a GPU config asks of the site's GPUs that they do not have."""
    site = load_cluster(cluster)
    if cfg.device != "cuda":
        return
    problems = []
    if site.gpus_per_node is not None and cfg.gpus_per_node > site.gpus_per_node:
        problems.append(f"gpus_per_node={cfg.gpus_per_node} but the nodes of site {site.name} "
                        f"have {site.gpus_per_node} GPUs (gpus_per_node in {cluster}): use at "
                        f"most {site.gpus_per_node} per node, and more nodes")
    if site.gpu_memory_gb is not None:
        p = plan(cfg.replace(gpu_memory_gb=float(site.gpu_memory_gb)))
        if not p.fits:
            problems.append(f"run {cfg.name!r} needs {p.required_gb:.1f} GB per GPU, the GPUs "
                            f"of site {site.name} have {site.gpu_memory_gb:g} GB (gpu_memory_gb "
                            f"in {cluster}): lower micro_batch_size, or raise tensor/pipeline "
                            f"parallelism, recompute or the distributed optimizer "
                            f"(labkit plan CONFIG --cluster {cluster})")
    if problems:
        raise ConfigError(problems, name=cfg.name)


def _check_cluster(path: str, *, as_json: bool) -> int:
    try:
        site = load_cluster(path)
        cluster_hosts(site)  # a hostfile's host names too
    except ConfigError as e:
        if not as_json:
            raise
        show_json({"valid": False, "errors": e.violations})
        return 2
    if as_json:
        show_json({"valid": True, "errors": [], "cluster": site.to_dict(),
                   "run_root": str(site.run_root_path()) if site.run_root else None})
        return 0
    say(f"site profile {site.name}: valid")
    say(f"  partition {site.partition or '(the default)'}, account {site.account or '-'}, "
        f"time limit {site.time_limit}, GPUs by {site.gpu_request}, "
        f"gpu_memory_gb {site.gpu_memory_gb if site.gpu_memory_gb is not None else '-'}")
    say(f"  run root for you: {site.run_root_path() or '(labkit.paths.run_root(): not shared)'}")
    if site.container:
        say(f"  container: {site.container.get('runtime')} {site.container.get('image')}")
    return 0


def cmd_new(args: argparse.Namespace) -> int:
    base = base_config(args.preset, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                       profile=args.profile)
    base = _site_memory(base, args.cluster, None)
    cfg = base.replace(name=args.name, tensor_model_parallel_size=args.tp,
                       pipeline_model_parallel_size=args.pp,
                       backend="slurm" if args.cluster else base.backend)
    root = run_root()
    if args.cluster:
        cluster = resolve_cluster(args.cluster)
        root = cluster.run_root_path() or root
    d = run_dir(cfg.name, root)
    path = d / "config.json"
    if d.exists() and not d.is_dir():
        raise LabkitError(f"{d} is a file, not a run directory; pick another NAME (nothing was "
                          f"written)")
    others = sorted(p.name for p in d.iterdir() if p.name != "config.json") if d.is_dir() else []
    if others:
        raise LabkitError(f"{d} already holds a run ({', '.join(others[:6])}); pick another NAME "
                          f"(nothing was written)")
    if path.exists() and not args.force:
        raise LabkitError(f"{path} exists; pick another NAME, or pass --force to replace it "
                          f"(nothing was written)")
    try:
        d.mkdir(parents=True, exist_ok=True)
        cfg.to_json(path)
    except OSError as e:
        raise LabkitError(f"cannot write {path}: {e.strerror or e}; set LABKIT_RUN_ROOT (or the "
                          f"cluster profile's run_root) to a folder you can write") from None
    say(f"wrote {path}")
    say(cfg.summary())
    cluster_flag = f" --cluster {args.cluster}" if args.cluster else ""
    say(f"next: labkit plan {path}  |  labkit submit {path}{cluster_flag} --wait")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    sweep = any(v is not None for v in (args.world_size, args.nodes, args.gpus_per_node))
    if args.config and args.preset:
        raise ConfigError(f"labkit plan takes CONFIG.json or --preset, not both (got "
                          f"{args.config} and --preset {args.preset})")
    if args.config and not sweep:
        cfg = _site_memory(RunConfig.from_json(args.config), args.cluster, args.gpu_memory_gb)
        p = plan(cfg)
        if args.json:
            show_json(p.to_dict())
        else:
            say(p.summary())
        return 0
    if not sweep:
        raise ConfigError("labkit plan needs CONFIG.json, or a cluster shape to list every layout: "
                          "--world-size N, or --nodes N --gpus-per-node G")
    model = RunConfig.from_json(args.config) if args.config else (args.preset or "tiny")
    base = base_config(model, world_size=args.world_size, nodes=args.nodes,
                       gpus_per_node=args.gpus_per_node, gpu_memory_gb=args.gpu_memory_gb,
                       profile=args.profile)
    base = _site_memory(base, args.cluster, args.gpu_memory_gb)

    hw = calibrated_hardware(base)  # this machine's or cluster's measurements, where stored
    layouts = plan_layouts(nodes=base.nodes, gpus_per_node=base.gpus_per_node, model=base,
                           micro_batch_size=base.micro_batch_size, hardware=hw)
    what = args.config or model
    unit = "GPU(s)" if base.device == "cuda" else "process(es)"
    head = (f"{what} on {base.nodes} node(s) x {base.gpus_per_node} {unit} = "
            f"{base.world_size} ranks; device {base.device}, precision {base.precision}, "
            f"global batch {base.global_batch_size}, micro batch {base.micro_batch_size}, "
            f"{base.gpu_memory_gb:g} GB per {'GPU' if base.device == 'cuda' else 'rank'}: "
            f"{sum(lp.valid for lp in layouts)} valid layouts, "
            f"{sum(lp.fits for lp in layouts)} fit; {describe(hw)}")
    if args.json:
        warn(head)
        show_json([lp.to_dict() for lp in layouts if lp.valid])
    else:
        say(head)
        say(format_layouts(layouts))
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    cfg = RunConfig.from_json(args.config)
    spec = JobSpec.from_config(cfg)  # where the run enters: the renderer takes its JobSpec
    backend = args.backend or cfg.backend
    if backend == "hostfile":  # the site's hosts: their hostfile, or the launch script

        cluster = resolve_cluster(args.cluster)
        if args.hostfile:
            sys.stdout.write(render_site_hostfile(job_hosts(spec, cluster)))
            return 0
        d = (cluster.run_root_path() if cluster.run_root else run_dir(cfg.name).parent) / cfg.name
        sys.stdout.write(render_hostfile_launch(spec, cluster, d))
        return 0
    if args.hostfile:
        sys.stdout.write(render_hostfile([f"node{i + 1}" for i in range(cfg.nodes)],
                                         cfg.gpus_per_node))
        return 0
    d = run_dir(cfg.name)
    if backend == "slurm":
        cluster = resolve_cluster(args.cluster)
        if cluster.run_root:
            d = cluster.run_root_path() / cfg.name
        sys.stdout.write(render_sbatch(spec, cluster, d))
    else:  # what submit would run: a multi-node job's nodes as network namespaces where it can
        site = resolve_cluster(args.cluster) if args.cluster else None  # as `labkit submit`
        sys.stdout.write(job_script(spec, d, cluster=site)[0])
    return 0
