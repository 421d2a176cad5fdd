"""One RunConfig's plan (``plan``) and the sweep over every layout of a cluster (``plan_layouts``)."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

from labkit.config import PROFILES, RunConfig, require_config
from labkit.errors import ConfigError
from labkit.planner.flops import (
    Hardware,
    bubble_fraction,
    estimate_iteration_time,
    flops_per_iteration,
    hardware_flops_per_iteration,
)
from labkit.planner.grid import rank_grid
from labkit.planner.memory import (
    ALLOCATOR_FACTOR,
    CONTEXT_GB,
    CPU_CAP_OVERHEAD_GB,
    StageMemory,
    memory_limit_gb,
    required_gb,
    stage_memory,
)
from labkit.rules import divisors

__all__ = ["LayoutPlan", "Plan", "base_config", "format_layouts", "plan", "plan_layouts"]


@dataclass(frozen=True)
class Plan:
    """Memory, FLOPs and bubble of one RunConfig."""

    config: RunConfig
    first_stage: StageMemory
    last_stage: StageMemory
    gpu_memory_gb: float
    required_gb: float
    fits: bool
    flops_per_iteration: float
    hardware_flops_per_iteration: float
    bubble_fraction: float

    @property
    def peak_gb(self) -> float:
        return max(self.first_stage.total, self.last_stage.total)

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        return {
            "layout": {"world_size": c.world_size, "tp": c.tp, "pp": c.pp, "dp": c.dp,
                       "vpp": c.vpp},
            "num_microbatches": c.num_microbatches,
            "memory_gb": {"first_stage": self.first_stage.to_dict(),
                          "last_stage": self.last_stage.to_dict(), "peak": self.peak_gb},
            "gpu_memory_gb": self.gpu_memory_gb,
            "fits": self.fits,
            "flops_per_iteration": self.flops_per_iteration,
            "hardware_flops_per_iteration": self.hardware_flops_per_iteration,
            "bubble_fraction": self.bubble_fraction,
            "required_gb": self.required_gb,
        }

    def summary(self) -> str:
        """A few lines with units, for notebooks: each total with the parts it adds up."""
        c, f, la = self.config, self.first_stage, self.last_stage
        verdict = "fits" if self.fits else "does NOT fit"
        return "\n".join([
            f"layout TP={c.tp} PP={c.pp} DP={c.dp} VPP={c.vpp}, {c.num_microbatches} "
            f"microbatch(es), bubble {self.bubble_fraction:.1%}",
            f"first stage {_parts(f)}",
            f"last stage  {_parts(la)}",
            f"needs {self.required_gb:.3f} GB = {_need_terms(c, f, la)}; {_limit_text(c, self)}: "
            f"{verdict}",
            f"{self.flops_per_iteration / 1e12:,.3f} TFLOP per iteration (model), "
            f"{self.hardware_flops_per_iteration / 1e12:,.3f} with recompute",
        ])


def _parts(st: StageMemory) -> str:
    return (f"{st.total:.3f} GB = weights {st.weights:.3f} + grads {st.gradients:.3f} + optimizer "
            f"{st.optimizer:.3f} + start-up {st.startup:.3f} + activations {st.activations:.3f} + "
            f"logits {st.logits:.3f}")


def _need_terms(c: RunConfig, *stages: StageMemory) -> str:
    """The terms of ``required_gb``, as it adds them up."""
    if c.device == "cpu" and c.memory_limit_gb is not None:
        later = max(st.optimizer + st.startup + st.activations + st.logits for st in stages)
        return (f"(optimizer + start-up + activations + logits {later:.3f}) x allocator "
                f"{ALLOCATOR_FACTOR:.2f} + process overhead {CPU_CAP_OVERHEAD_GB:.2f} (the cap "
                f"counts from the built model on)")
    peak = max(st.total for st in stages)
    terms = f"largest stage {peak:.3f} x allocator {ALLOCATOR_FACTOR:.2f}"
    if c.device == "cuda" and c.memory_limit_gb is not None and c.memory_limit_gb < c.gpu_memory_gb:
        return terms
    return f"{terms} + {'CUDA context' if c.device == 'cuda' else 'runtime'} {CONTEXT_GB[c.device]:.2f}"


def _limit_text(c: RunConfig, p: Plan) -> str:
    if c.memory_limit_gb is not None:
        return f"the run's memory limit (memory_limit_gb) {p.gpu_memory_gb:g} GB"
    if c.device == "cpu":
        return f"no memory limit (memory_limit_gb unset; compared with gpu_memory_gb {p.gpu_memory_gb:g} GB)"
    return f"GPU memory {p.gpu_memory_gb:g} GB"


def plan(cfg: RunConfig) -> Plan:
    """Memory per stage, FLOPs, bubble and fits of a (validated) RunConfig."""
    cfg = require_config(cfg, "plan()")
    first = stage_memory(cfg, 0)
    last = stage_memory(cfg, cfg.pp - 1)
    need = required_gb(cfg, first, last)
    limit = memory_limit_gb(cfg)
    return Plan(config=cfg, first_stage=first, last_stage=last, gpu_memory_gb=limit,
                required_gb=need, fits=need <= limit,
                flops_per_iteration=flops_per_iteration(cfg),
                hardware_flops_per_iteration=hardware_flops_per_iteration(cfg),
                bubble_fraction=bubble_fraction(cfg))


# --- all layouts of a cluster shape ----------------------------------------------------------
@dataclass(frozen=True)
class LayoutPlan:
    """One candidate (TP, PP, DP, VPP): valid with its plan, or invalid with the reasons."""

    tp: int
    pp: int
    dp: int
    vpp: int
    reasons: list[str] = field(default_factory=list)
    plan: Plan | None = None
    tp_crosses_nodes: bool = False
    est_iteration_s: float | None = None
    """``estimate_iteration_time`` on the sweep's hardware profile (an estimate, for ordering)."""

    @property
    def valid(self) -> bool:
        return self.plan is not None

    @property
    def fits(self) -> bool:
        return self.plan is not None and self.plan.fits

    def to_dict(self) -> dict[str, Any]:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "vpp": self.vpp,
                "valid": self.valid, "fits": self.fits, "tp_crosses_nodes": self.tp_crosses_nodes,
                "est_iteration_s": self.est_iteration_s, "reasons": list(self.reasons),
                "plan": self.plan.to_dict() if self.plan else None}


def plan_layouts(*, nodes: int, gpus_per_node: int, model: str | RunConfig = "tiny",
                 gpu_memory_gb: float | None = None, micro_batch_size: int = 1,
                 global_batch_size: int | None = None, interleaved: bool = True,
                 hardware: Hardware | str | None = None, **overrides: Any) -> list[LayoutPlan]:
    """Every (TP, PP, DP, VPP) of ``nodes x gpus_per_node`` ranks for a model, fitting first.

    Args:
        nodes, gpus_per_node: the cluster shape (world size = their product).
        model: a preset name (``tiny``, ``gpt2-124m``, ...) or a RunConfig whose model and
            run fields are kept (its layout fields are replaced).
        gpu_memory_gb: memory per GPU; default the RunConfig's.
        micro_batch_size: per rank; ``global_batch_size`` default the RunConfig's.
        interleaved: also try the interleaved schedule (every valid layers-per-virtual-stage).
        hardware: profile for the iteration-time estimate that orders fitting layouts
            (default ``h100-80gb`` on cuda, ``cpu-lab`` on cpu); see ``HARDWARE``.
        overrides: other RunConfig fields (``recompute_granularity``, ``precision``, ...).

    Returns:
        Valid and fitting layouts first (TP inside a node first, then by estimated iteration
        time, which weighs the bubble and the communication of each group),
        then valid ones that do not fit, then invalid ones with ``reasons`` (RunConfig's rules,
        e.g. "num_layers 12 is not divisible by PP 5").
    """
    for key, value in (("nodes", nodes), ("gpus_per_node", gpus_per_node),
                       ("micro_batch_size", micro_batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"plan_layouts: {key}={value!r} must be a positive integer")
    base = (model.to_dict() if isinstance(model, RunConfig)
            else RunConfig.from_preset(model).to_dict())
    base.update(nodes=nodes, gpus_per_node=gpus_per_node, micro_batch_size=micro_batch_size,
                torch_profiler_ranks=[0], **overrides)
    if gpu_memory_gb is not None:
        base["gpu_memory_gb"] = gpu_memory_gb
    if global_batch_size is not None:
        base["global_batch_size"] = global_batch_size
    if hardware is None:
        hardware = "h100-80gb" if base.get("device") == "cuda" else "cpu-lab"
    world = nodes * gpus_per_node
    out: list[LayoutPlan] = []
    for tp in divisors(world):
        for pp in divisors(world // tp):
            vs_options: list[int | None] = [None]
            if interleaved and pp > 1:
                vs_options += [vs for vs in divisors(base["num_layers"])
                               if base["num_layers"] % (pp * vs) == 0
                               and base["num_layers"] // (pp * vs) >= 2]
            for vs in vs_options:
                out.append(_one_layout(base, tp, pp, vs, world, gpus_per_node, hardware))
    return sorted(out, key=_rank_key)


def _one_layout(base: dict[str, Any], tp: int, pp: int, vs: int | None, world: int,
                gpus_per_node: int, hardware: Hardware | str) -> LayoutPlan:
    dp = world // (tp * pp)
    vpp = base["num_layers"] // (pp * vs) if vs else 1
    # e.g. TP=2 on 3 GPUs per node: some TP pairs straddle two nodes even though 2 <= 3.
    crosses = rank_grid(world, tp, pp, gpus_per_node).crosses_nodes("tp")
    fields_ = {**base, "tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
               "num_layers_per_virtual_pipeline_stage": vs}
    if tp == 1:
        fields_["sequence_parallel"] = False  # sequence parallel is only asked for where TP > 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TP across nodes is flagged below instead
            cfg = RunConfig.from_dict(fields_)
    except ConfigError as e:
        return LayoutPlan(tp, pp, dp, vpp, reasons=e.violations, tp_crosses_nodes=crosses)
    est = estimate_iteration_time(cfg, hardware)["iteration_s"]
    return LayoutPlan(tp, pp, dp, vpp, plan=plan(cfg), tp_crosses_nodes=crosses,
                      est_iteration_s=est)


def _rank_key(lp: LayoutPlan) -> tuple:
    if lp.plan is None:
        return (2, 0, 0, 0.0, lp.tp, lp.pp, lp.vpp)
    return (0 if lp.fits else 1, lp.tp_crosses_nodes, lp.est_iteration_s or 0.0,
            round(lp.plan.required_gb, 6), lp.tp, lp.pp, lp.vpp)


def format_layouts(layouts: list[LayoutPlan], *, show_invalid: bool = True) -> str:
    """A text table, one row per layout, in the order given (fitting ones first)."""
    head = (f"{'TP':>4} {'PP':>4} {'DP':>5} {'VPP':>4} {'microbatches':>12} {'first GB':>9} "
            f"{'last GB':>9} {'need GB':>9} {'fits':>5} {'bubble':>7} {'est s/it':>9}  note")
    rows = [head, "-" * len(head)]
    for lp in layouts:
        if lp.plan is None:
            if show_invalid:
                rows.append(f"{lp.tp:>4} {lp.pp:>4} {lp.dp:>5} {lp.vpp:>4} {'-':>12} {'-':>9} "
                            f"{'-':>9} {'-':>9} {'-':>5} {'-':>7} {'-':>9}  invalid: "
                            + "; ".join(lp.reasons))
            continue
        p = lp.plan
        note = "TP crosses nodes" if lp.tp_crosses_nodes else ""
        rows.append(f"{lp.tp:>4} {lp.pp:>4} {lp.dp:>5} {lp.vpp:>4} "
                    f"{p.config.num_microbatches:>12} {p.first_stage.total:>9.3f} "
                    f"{p.last_stage.total:>9.3f} {p.required_gb:>9.3f} "
                    f"{'yes' if p.fits else 'NO':>5} {p.bubble_fraction:>7.1%} "
                    f"{lp.est_iteration_s or 0.0:>9.3g}  {note}".rstrip())
    return "\n".join(rows)


# --- the starting point of a sweep ------------------------------------------------------------
def base_config(model: str | RunConfig = "tiny", *, world_size: int | None = None,
               nodes: int | None = None, gpus_per_node: int | None = None,
               gpu_memory_gb: float | None = None, profile: str | None = None) -> RunConfig:
    """The RunConfig a layout sweep or a new run starts from, with what was not given filled in.

    Args:
        model: a RunConfig (its model, device, precision, batch and layout are kept, on the
            new shape) or a preset name (TP = PP = 1).
            A preset takes device, precision and batch from a notebook profile (``PROFILES``):
            ``profile`` if given, else ``gpu`` when ``gpu_memory_gb`` is given (a GPU memory size
            means a GPU) or the preset is not the cpu profile's, else ``cpu``.
        world_size, nodes, gpus_per_node: the cluster shape; any one or two of them, or all
            three when they agree. A world size alone is split into nodes of the profile's
            GPUs per node where it divides (16 on the gpu profile: 2 x 8).
        gpu_memory_gb: memory per GPU; default the RunConfig's or the profile's.

    The global batch of a preset is the profile's, raised to a multiple of micro batch x world
    size so that every data-parallel size of the sweep divides it.
    """
    if isinstance(model, RunConfig):
        base = model.to_dict()
        pdef = {"nodes": model.nodes, "gpus_per_node": model.gpus_per_node}
    else:
        if profile is None:
            cpu_preset = PROFILES["cpu"]["preset"]
            profile = "gpu" if gpu_memory_gb is not None or model != cpu_preset else "cpu"
        if profile not in PROFILES:
            raise ConfigError(f"unknown profile {profile!r}; profiles are: {', '.join(PROFILES)}")
        pdef = {k: v for k, v in PROFILES[profile].items() if k != "preset"}
        base = RunConfig.from_preset(model, **pdef).to_dict()
    bad = {k: v for k, v in (("world size", world_size), ("nodes", nodes),
                             ("GPUs per node", gpus_per_node)) if v is not None and v < 1}
    if bad:
        raise ConfigError([f"{k} must be at least 1 (got {v})" for k, v in bad.items()])
    if world_size is not None:
        if nodes is None and gpus_per_node is None:
            gpus_per_node = math.gcd(world_size, pdef["gpus_per_node"])
        if nodes is None:
            nodes = world_size // gpus_per_node
        if gpus_per_node is None:
            gpus_per_node = world_size // nodes
        if nodes * gpus_per_node != world_size:
            raise ConfigError(f"world size {world_size} is not nodes {nodes} x GPUs per node "
                              f"{gpus_per_node}; give matching values, or the world size and "
                              f"only one of the other two")
    nodes = nodes or (1 if gpus_per_node else pdef["nodes"])
    gpus_per_node = gpus_per_node or pdef["gpus_per_node"]
    world = nodes * gpus_per_node
    if not isinstance(model, RunConfig):
        step = base["micro_batch_size"] * world
        base["global_batch_size"] = step * max(1, -(-base["global_batch_size"] // step))
    base.update(nodes=nodes, gpus_per_node=gpus_per_node)
    if not isinstance(model, RunConfig):
        base.update(tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                    num_layers_per_virtual_pipeline_stage=None, sequence_parallel=False)
    if gpu_memory_gb is not None:
        base["gpu_memory_gb"] = gpu_memory_gb
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return RunConfig.from_dict(base)
