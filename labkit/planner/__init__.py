"""The planner: is a layout valid, does it fit, what does an iteration cost? Pure arithmetic.

Before anyone waits in a queue: ``plan(cfg)`` gives memory per pipeline stage, FLOPs, the
bubble and ``fits`` for one RunConfig; ``plan_layouts(nodes=, gpus_per_node=, model=)`` tries
every (TP, PP, DP, virtual PP) of a cluster shape and says why the invalid ones are invalid;
``rank_grid(...)`` shows which ranks talk to which, and which groups cross nodes.

``Plan.to_dict()`` is the JSON of ``labkit plan CONFIG.json --json`` (DESIGN.md section 5):
``layout {world_size, tp, pp, dp, vpp}``, ``num_microbatches``, ``memory_gb {first_stage,
last_stage, peak}`` (each stage ``weights, gradients, optimizer, startup, activations, logits, total``,
GB = 1e9 bytes), ``gpu_memory_gb``, ``fits``, ``flops_per_iteration``,
``hardware_flops_per_iteration``, ``bubble_fraction``, and one documented extra key:
``required_gb``, the peak plus the margin ``fits`` is judged with (see ``memory``).

The arithmetic lives in ``grid`` (rank grid), ``memory`` (parameters, memory) and ``flops``
(FLOPs, bubble, communication, time estimate); ``plan`` joins them.
No torch import: every layout of a 175B model on 4096 GPUs is evaluated in about 0.1 s
(benchmarks/bench_planner.py).
"""

from labkit.planner.flops import (
    HARDWARE,
    Hardware,
    bubble_fraction,
    comm_volume,
    estimate_iteration_time,
    flops_per_iteration,
    hardware_flops_per_iteration,
)
from labkit.planner.grid import ORDER, RankGrid, rank_grid
from labkit.planner.memory import (
    StageMemory,
    activation_bytes_per_layer,
    layer_params,
    memory_limit_gb,
    param_counts,
    required_gb,
    stage_memory,
    stage_params,
    total_params,
)
from labkit.planner.plan import LayoutPlan, Plan, base_config, format_layouts, plan, plan_layouts

__all__ = [
    "HARDWARE", "ORDER", "Hardware", "LayoutPlan", "Plan", "RankGrid", "StageMemory",
    "activation_bytes_per_layer", "base_config", "bubble_fraction", "comm_volume",
    "estimate_iteration_time", "flops_per_iteration", "format_layouts",
    "hardware_flops_per_iteration", "layer_params", "memory_limit_gb", "param_counts", "plan",
    "plan_layouts", "rank_grid", "required_gb", "stage_memory", "stage_params", "total_params",
]
