"""FLOPs, pipeline bubble, communication volume and an iteration-time estimate of a layout.

FLOPs count a multiply-add as 2 and only the matrix multiplications, as published MFU numbers
do. Per token, one layer's forward pass costs

    QKV 2·h·(h + 2·kv) + scores and attention over values 2·2·s·h + projection 2·h²
    + MLP 2·h·f1 + 2·f·h,

and the output layer 2·h·V (V padded). Backward costs twice the forward.

* ``flops_per_iteration`` (model FLOPs): 3 x forward. For the classic GPT (kv = h, f = 4h, no
  SwiGLU) this is Korthikanti et al. 2022, eq. 7: ``72·B·s·L·h²·(1 + s/6h + V/12Lh)``.
* ``hardware_flops_per_iteration`` adds what recompute runs again. Full recompute: one more
  forward of every layer (not of the logits): Narayanan et al. 2021, eq. 3,
  ``96·B·s·L·h²·(1 + s/6h + V/16Lh)``. Selective recompute (Korthikanti, section 5): one more
  forward of the attention-score matmuls, + 4·B·s²·h·L.
* ``bubble_fraction`` = (p - 1) / (v·m): idle time relative to the ideal compute time
  (Narayanan et al. 2021, section 2.2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from labkit.measured.hardware import PEAK_TFLOPS
from labkit.planner.grid import rank_grid
from labkit.planner.memory import element_bytes, stage_params

if TYPE_CHECKING:
    from labkit.config import RunConfig


def _layer_forward_flops_per_token(cfg: RunConfig) -> tuple[float, float]:
    """(dense-matmul FLOPs, attention-score FLOPs) of one layer's forward pass, per token."""
    h, s = cfg.hidden_size, cfg.seq_length
    kv = cfg.query_groups * (h // cfg.num_attention_heads)
    f = cfg.ffn_size
    f1 = 2 * f if cfg.swiglu else f
    dense = 2 * h * (h + 2 * kv) + 2 * h * h + 2 * h * f1 + 2 * f * h
    scores = 2 * 2 * s * h  # Q·K^T and softmax·V over the full s x s square
    return float(dense), float(scores)


def flops_per_iteration(cfg: RunConfig) -> float:
    """Model FLOPs of one iteration (global batch), the MFU convention (no recompute)."""
    dense, scores = _layer_forward_flops_per_token(cfg)
    tokens = cfg.global_batch_size * cfg.seq_length
    logits = 2 * cfg.hidden_size * cfg.padded_vocab_size
    return 3.0 * tokens * (cfg.num_layers * (dense + scores) + logits)


def hardware_flops_per_iteration(cfg: RunConfig) -> float:
    """FLOPs the hardware runs in one iteration, recompute included (the HFU convention)."""
    dense, scores = _layer_forward_flops_per_token(cfg)
    tokens = cfg.global_batch_size * cfg.seq_length
    extra = 0.0
    if cfg.recompute_granularity == "full":
        extra = tokens * cfg.num_layers * (dense + scores)
    elif cfg.recompute_granularity == "selective":
        extra = tokens * cfg.num_layers * scores
    return flops_per_iteration(cfg) + extra


def bubble_fraction(cfg: RunConfig) -> float:
    """Pipeline bubble relative to ideal compute: (p - 1) / (v·m)."""
    return (cfg.pp - 1) / (cfg.vpp * cfg.num_microbatches)


# --- communication ---------------------------------------------------------------------------
def comm_volume(cfg: RunConfig) -> dict[str, dict[str, Any]]:
    """Bytes each rank sends per iteration, per parallel group (the busiest rank of the group).

    Ring collectives: an all-reduce of N bytes over n ranks sends 2·(n-1)/n·N per rank; a
    reduce-scatter or an all-gather (n-1)/n·N.

    * tp: 4 all-reduces of s·b·h activations per layer and microbatch (2 forward, 2 backward),
      or with sequence parallel the same volume as all-gathers + reduce-scatters; full
      recompute runs the 2 forward ones again.
    * pp: one activation forward and one gradient backward per microbatch and model chunk.
    * dp: the stage's fp32 gradients all-reduced once per iteration; with the distributed
      optimizer a reduce-scatter of the gradients and an all-gather of the updated weights.
    """
    grid = rank_grid(cfg.world_size, cfg.tp, cfg.pp, cfg.gpus_per_node)
    crossing = {axis: grid.crosses_nodes(axis) for axis in ("tp", "dp", "pp")}
    e = element_bytes(cfg.precision)
    t, p, d, v, m = cfg.tp, cfg.pp, cfg.dp, cfg.vpp, cfg.num_microbatches
    sbh = cfg.seq_length * cfg.micro_batch_size * cfg.hidden_size * e
    layers = cfg.num_layers // p
    per_layer = 4 + (2 if cfg.recompute_granularity == "full" else 0)
    tp_ops = per_layer * layers * m
    tp_bytes = tp_ops * 2 * (t - 1) / t * sbh
    pp_msg = sbh / (t if cfg.sequence_parallel else 1)
    pp_sends = 0 if p == 1 else m * v * (2 if (p > 2 or v > 1) else 1)
    params = max(stage_params(cfg, r) for r in range(p))
    if cfg.use_distributed_optimizer:
        dp_bytes = (d - 1) / d * params * (4 + e)
        dp_kind = "reduce-scatter (fp32 grads) + all-gather (weights)"
    else:
        dp_bytes = 2 * (d - 1) / d * params * 4
        dp_kind = "all-reduce (fp32 grads)"
    return {
        "tp": {"size": t, "collective": "all-gather + reduce-scatter" if cfg.sequence_parallel
               else "all-reduce", "ops": tp_ops if t > 1 else 0, "bytes_per_rank": tp_bytes,
               "crosses_nodes": crossing["tp"]},
        "pp": {"size": p, "collective": "send/recv", "ops": pp_sends,
               "bytes_per_rank": pp_sends * pp_msg, "crosses_nodes": crossing["pp"]},
        "dp": {"size": d, "collective": dp_kind, "ops": 1 if d > 1 else 0,
               "bytes_per_rank": dp_bytes, "crosses_nodes": crossing["dp"]},
    }


@dataclass(frozen=True)
class Hardware:
    """What an iteration-time estimate needs to know about the machines.

    The figures of ``HARDWARE`` are typical ones (datasheets, the lab's field notes): an
    estimate made with them is *uncalibrated*. ``labkit.planner.calibration`` builds a
    Hardware from what this machine or cluster measured (the compute speed of a training run,
    the all-reduce bus bandwidth and latency of the benchmark); ``calibrated_from`` then names
    those measurements.
    """

    name: str
    peak_tflops: float
    """Dense peak of one GPU (or process) in the run's precision, TFLOP/s; calibrated: the
    speed one rank measured, TFLOP/s (with ``efficiency`` 1)."""
    intra_node_gbps: float
    """Bus bandwidth of a collective inside a node, GB/s (1e9 bytes)."""
    inter_node_gbps: float
    """Bus bandwidth of a collective across nodes, GB/s."""
    efficiency: float = 0.5
    """Fraction of the peak that the matmuls reach (large models on GPUs: 0.4-0.6)."""
    intra_node_latency_s: float = 0.0
    """Fixed cost of one collective or send inside a node, s (the benchmark's small messages)."""
    inter_node_latency_s: float = 0.0
    """Fixed cost of one collective or send across nodes, s."""
    cores_per_host: int | None = None
    """CPU cores of one machine when the ranks are CPU processes (None on GPUs): more ranks than
    cores on a machine share them, and each rank computes that much slower."""
    measured_ranks_per_host: int | None = None
    """Ranks that shared one machine while ``peak_tflops`` was measured."""
    layer_microbatch_s: float | None = None
    """Set (by a calibration on CPU processes): the time one rank spends on one layer for one
    microbatch, s, and it replaces the FLOPs model. On CPU the tiny model's matmuls are so
    small that each operator's fixed overhead dominates: splitting them over TP ranks does not
    shorten a rank's time, fewer layers (PP) or fewer microbatches (DP) do."""
    calibrated_from: tuple[str, ...] = ()
    """The measurements behind these figures ("compute: runs/nb01_dp", ...); empty: typical
    figures, not measured here."""

    @property
    def calibrated(self) -> bool:
        return bool(self.calibrated_from)


HARDWARE = {
    # Dense bf16 peaks from labkit.measured.hardware's one table; bus bandwidths of typical NVLink /
    # 4x200 Gbit/s InfiniBand.
    "a100-80gb": Hardware("a100-80gb", PEAK_TFLOPS["A100"]["bf16"], 230.0, 90.0),
    "h100-80gb": Hardware("h100-80gb", PEAK_TFLOPS["H100"]["bf16"], 360.0, 180.0),
    # This lab's CPU cluster (FIELD_NOTES): gloo ~12 Gbit/s in a node, ~0.89 Gbit/s across the
    # 1 Gbit/s shaped link; a CPU core does a few fp32 GFLOP/s in these small matmuls.
    "cpu-lab": Hardware("cpu-lab", 0.01, 1.5, 0.11, efficiency=1.0),
}


def ranks_per_host(cfg: RunConfig) -> int:
    """Ranks that share one machine: all of them on the local backend (every "node" is a group
    of processes on this machine), else one node's."""
    return cfg.world_size if cfg.backend == "local" else cfg.gpus_per_node


def _contention(cfg: RunConfig, hw: Hardware) -> float:
    """How much slower one rank computes than where ``hw`` was measured (1 = as fast)."""
    if not hw.cores_per_host:
        return 1.0
    share = min(1.0, hw.cores_per_host / ranks_per_host(cfg))
    measured = min(1.0, hw.cores_per_host / (hw.measured_ranks_per_host or 1))
    return measured / share


def estimate_iteration_time(cfg: RunConfig, hw: Hardware | str | dict[str, Any]) -> dict[str, Any]:
    """An ESTIMATE of one iteration's time: compute (hardware FLOPs at ``efficiency`` x peak),
    stretched by the bubble, plus communication not overlapped (TP, PP, DP) at the group's link:
    per collective a fixed latency plus its bytes over the bus bandwidth.

    An upper-bound style estimate for comparing layouts, not a prediction; real runs overlap DP
    communication with backward and reach a different efficiency. ``calibrated`` says whether
    the figures were measured on this machine or cluster (``labkit.planner.calibration``).
    """
    if isinstance(hw, str):
        hw = HARDWARE[hw]
    elif isinstance(hw, dict):
        hw = Hardware(**{"name": "custom", **hw})
    if hw.layer_microbatch_s:
        recompute = hardware_flops_per_iteration(cfg) / flops_per_iteration(cfg)
        units = cfg.num_microbatches * cfg.num_layers / cfg.pp * recompute
        compute_s = units * hw.layer_microbatch_s * _contention(cfg, hw)
    else:
        per_rank_flops = hardware_flops_per_iteration(cfg) / cfg.world_size
        compute_s = per_rank_flops / (hw.peak_tflops * 1e12 * hw.efficiency) * _contention(cfg, hw)
    bubble_s = compute_s * bubble_fraction(cfg)
    comm = comm_volume(cfg)
    comm_s = {}
    for group, c in comm.items():
        inter = c["crosses_nodes"]
        bw = hw.inter_node_gbps if inter else hw.intra_node_gbps
        latency = hw.inter_node_latency_s if inter else hw.intra_node_latency_s
        comm_s[group] = c["ops"] * latency + c["bytes_per_rank"] / (bw * 1e9)
    total = compute_s + bubble_s + sum(comm_s.values())
    if hw.calibrated:
        note = f"estimate calibrated from {', '.join(hw.calibrated_from)}; no overlap of " \
               "communication with compute"
    else:
        note = f"UNCALIBRATED estimate (typical figures of {hw.name}: {hw.efficiency:.0%} of " \
               f"{hw.peak_tflops} TFLOP/s, {hw.intra_node_gbps:g}/{hw.inter_node_gbps:g} GB/s " \
               "intra/inter); no overlap of communication with compute"
    return {
        "estimate": True,
        "hardware": hw.name,
        "calibrated": hw.calibrated,
        "compute_s": compute_s,
        "bubble_s": bubble_s,
        "comm_s": comm_s,
        "iteration_s": total,
        "tokens_per_s": cfg.tokens_per_iteration / total,
        # MFU is against a datasheet peak; a calibrated speed is a measurement, not a peak
        "mfu": None if hw.calibrated else
        flops_per_iteration(cfg) / (total * cfg.world_size * hw.peak_tflops * 1e12),
        "note": note,
    }
