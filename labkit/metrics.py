"""Throughput, TFLOP/s per GPU, MFU and scaling efficiency, with an explicit peak-FLOPs table.

MFU (model FLOPs utilisation) = achieved model FLOP/s per GPU / the GPU's dense peak for the
precision trained in. Model FLOPs come from the planner (forward + backward, no recompute: the
PaLM / Megatron convention). Peaks are dense (no 2:4 sparsity) datasheet numbers; an unknown
device is an error that asks for its peak, never a silent default, and an MFU above 100% is an
error too (it means a wrong peak, a wrong FLOPs count or a wrong time).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from labkit.errors import LabkitError

# Dense peak TFLOP/s per GPU by precision. Sources: NVIDIA / AMD product datasheets; the
# datasheets quote tensor-core numbers "with sparsity", which are halved here.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # Tesla V100 SXM2 datasheet: 125 TFLOPS tensor (fp16), 15.7 fp32. No bf16.
    "V100": {"fp16": 125.0, "fp32": 15.7},
    # V100 PCIe: 112 tensor, 14 fp32.
    "V100 PCIE": {"fp16": 112.0, "fp32": 14.0},
    # A100 (SXM4 and PCIe) datasheet: bf16/fp16 312 (624 sparse), tf32 156 (312 sparse), fp32 19.5.
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    # A10 datasheet: bf16/fp16 125 (250 sparse), tf32 62.5 (125 sparse), fp32 31.2.
    "A10": {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},
    # RTX A6000 datasheet: tensor 309.7 sparse -> 154.8 dense, fp32 38.7.
    "A6000": {"bf16": 154.8, "fp16": 154.8, "fp32": 38.7},
    # L4 datasheet: bf16/fp16 121 (242 sparse), fp8 242.5 (485 sparse), fp32 30.3.
    "L4": {"bf16": 121.0, "fp16": 121.0, "fp8": 242.5, "fp32": 30.3},
    # L40S datasheet: bf16/fp16 362.05 (733 sparse), fp8 733 (1466 sparse), tf32 183, fp32 91.6.
    "L40S": {"bf16": 362.05, "fp16": 362.05, "fp8": 733.0, "tf32": 183.0, "fp32": 91.6},
    # H100 SXM5 datasheet: bf16/fp16 989.4 (1979 sparse), fp8 1978.9, tf32 494.7, fp32 66.9.
    "H100": {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9},
    # H100 PCIe datasheet: bf16/fp16 756.5 (1513 sparse), fp8 1513, tf32 378, fp32 51.2.
    "H100 PCIE": {"bf16": 756.5, "fp16": 756.5, "fp8": 1513.0, "tf32": 378.0, "fp32": 51.2},
    # H200 SXM datasheet: the H100 SXM compute (bf16 989, fp8 1979, fp32 67) with more memory.
    "H200": {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9},
    # GH200 datasheet: the same Hopper GPU, bf16 989 dense.
    "GH200": {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9},
    # HGX B200 datasheet (per GPU): bf16/fp16 4.5 PF sparse -> 2.25 dense, fp8 9 PF sparse -> 4.5.
    "B200": {"bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0},
    # AMD Instinct MI250X datasheet: bf16/fp16 383, fp32 matrix 95.7.
    "MI250X": {"bf16": 383.0, "fp16": 383.0, "fp32": 95.7},
    # AMD Instinct MI300X datasheet: bf16/fp16 1307.4 dense, fp8 2614.9, fp32 matrix 163.4.
    "MI300X": {"bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9, "fp32": 163.4},
}


def _device_key(device: str) -> str | None:
    name = " ".join(device.upper().replace("NVIDIA", "").replace("-", " ").replace("_", " ").split())
    if name in PEAK_TFLOPS:
        return name
    # the longest table key contained in the name: "H100 PCIE" before "H100", "A100 SXM4 80GB" -> A100
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):
        words = key.split()
        if all(w in name.split() for w in words):
            return key
    return None


def peak_tflops(device: str, precision: str) -> float:
    """The dense peak TFLOP/s of one ``device`` (e.g. "H100", "NVIDIA A100-SXM4-80GB") in ``precision``.

    Raises LabkitError for a device or precision missing from ``PEAK_TFLOPS``.
    """
    key = _device_key(device)
    if key is None:
        raise LabkitError(
            f"unknown device {device!r}: no peak FLOPs for it in labkit.metrics.PEAK_TFLOPS "
            f"(known: {', '.join(PEAK_TFLOPS)}). Pass peak_tflops=<dense TFLOP/s per device from its "
            f"datasheet, without sparsity>; CPUs have no entry, MFU is a GPU figure.")
    table = PEAK_TFLOPS[key]
    if precision not in table:
        raise LabkitError(f"no {precision} peak for {key} in PEAK_TFLOPS (it lists {', '.join(table)}). "
                          f"Pass peak_tflops=<dense TFLOP/s from the datasheet> or pick one of those.")
    return table[precision]


def model_flops_per_iteration(cfg: Any) -> float:
    """Model FLOPs of one iteration of ``cfg`` (the planner's ``flops_per_iteration``)."""
    try:
        from labkit.planner import flops_per_iteration
    except ImportError as e:
        raise LabkitError(f"labkit.planner.flops_per_iteration is not available ({e}); TFLOP/s and MFU "
                          f"need it. Pass tflops_per_gpu measured elsewhere, or update labkit.") from e
    return float(flops_per_iteration(cfg))


def tflops_per_gpu(elapsed_ms: float, flops_per_iteration: float, world_size: int) -> float:
    """Achieved model TFLOP/s per GPU for one iteration."""
    if elapsed_ms <= 0 or world_size <= 0:
        raise LabkitError(f"tflops_per_gpu needs elapsed_ms > 0 and world_size > 0, got {elapsed_ms} and "
                          f"{world_size}")
    return flops_per_iteration / (elapsed_ms / 1e3) / world_size / 1e12


def mfu(achieved_tflops_per_gpu: float, *, device: str | None = None, precision: str = "bf16",
        peak_tflops: float | None = None) -> float:
    """Model FLOPs utilisation as a fraction (0.45 = 45 %); raises above 100 %."""
    if peak_tflops is None:
        if device is None:
            raise LabkitError("mfu needs device= (e.g. 'H100') or peak_tflops= (dense TFLOP/s per GPU)")
        peak_tflops = globals()["peak_tflops"](device, precision)
    if peak_tflops <= 0:
        raise LabkitError(f"peak_tflops must be > 0, got {peak_tflops}")
    value = achieved_tflops_per_gpu / peak_tflops
    if value > 1.0:
        raise LabkitError(
            f"MFU {value:.0%} > 100%: {achieved_tflops_per_gpu:.1f} TFLOP/s per GPU against a peak of "
            f"{peak_tflops:g} ({device or 'given'}, {precision}). Check the device/precision (the peak), "
            f"the FLOPs per iteration (recompute counts are hardware FLOPs, not model FLOPs) and that "
            f"elapsed time is per iteration, not per micro-batch.")
    return value


def add_throughput(df: pd.DataFrame, cfg: Any = None) -> pd.DataFrame:
    """Copy of an iterations frame with samples_per_sec, tokens_per_sec and model tflops_per_gpu.

    ``cfg`` is the run's RunConfig; without it each row's ``run_dir`` column (from ``load_runs``)
    says where its config.json is. Values the log printed are kept; only gaps are filled.
    """
    out = df.copy()
    if cfg is None:
        if "run_dir" not in out.columns:
            raise LabkitError("add_throughput needs cfg=RunConfig or a 'run_dir' column (use load_runs)")
        from labkit.config import RunConfig

        parts = []
        for run_dir, g in out.groupby("run_dir", sort=False):
            parts.append(add_throughput(g, RunConfig.from_json(f"{run_dir}/config.json")))
        return pd.concat(parts).loc[out.index]
    sps = cfg.global_batch_size / (out["elapsed_ms"] / 1e3)
    out["samples_per_sec"] = out.get("samples_per_sec", sps).astype("float64").fillna(sps)
    out["tokens_per_sec"] = out.get("tokens_per_sec", out["samples_per_sec"] * cfg.seq_length)
    out["tokens_per_sec"] = out["tokens_per_sec"].astype("float64").fillna(out["samples_per_sec"]
                                                                            * cfg.seq_length)
    flops = model_flops_per_iteration(cfg)
    model_tflops = flops / (out["elapsed_ms"] / 1e3) / cfg.world_size / 1e12
    # the log's own TFLOP/s is kept when it says something; CPU runs print 0.0
    logged = out.get("tflops_per_gpu")
    if logged is None:
        out["tflops_per_gpu"] = model_tflops
    else:
        logged = logged.astype("float64")
        out["tflops_per_gpu"] = logged.where(logged > 0, model_tflops)
    return out


def add_mfu(df: pd.DataFrame, *, device: str | None = None, precision: str = "bf16",
            peak_tflops: float | None = None) -> pd.DataFrame:
    """Copy of ``df`` with an ``mfu`` column (fraction) from its ``tflops_per_gpu``."""
    peak = peak_tflops if peak_tflops is not None else globals()["peak_tflops"](device or "", precision)
    out = df.copy()
    worst = out["tflops_per_gpu"].max()
    mfu(float(worst), device=device, precision=precision, peak_tflops=peak)  # raises above 100 %
    out["mfu"] = out["tflops_per_gpu"] / peak
    return out


def scaling_efficiency(df: pd.DataFrame, *, by: str = "world_size", metric: str = "tokens_per_sec",
                       skip_first: int = 1) -> pd.DataFrame:
    """Speed-up and efficiency of ``metric`` across runs that differ in ``by`` (GPUs, nodes).

    One row per value of ``by`` (the median of ``metric`` over iterations, after ``skip_first``
    warm-up iterations of each run): ``speedup`` against the smallest, ``ideal`` = ratio of
    ``by``, ``efficiency = speedup / ideal`` (1.0 is perfect linear scaling).
    """
    for col in (by, metric):
        if col not in df.columns:
            raise LabkitError(f"scaling_efficiency needs a {col!r} column; the frame has "
                              f"{', '.join(map(str, df.columns))}. Use load_runs(...) and add_throughput.")
    d = df
    if skip_first and "iteration" in d.columns:
        key = "run_dir" if "run_dir" in d.columns else by
        d = d[d.groupby(key)["iteration"].rank(method="first") > skip_first]
    agg = d.groupby(by)[metric].median().sort_index().reset_index()
    if agg.empty:
        raise LabkitError(f"no rows left to compare after skipping {skip_first} warm-up iterations per run")
    base_n, base_v = agg[by].iloc[0], agg[metric].iloc[0]
    agg["speedup"] = agg[metric] / base_v
    agg["ideal"] = agg[by] / base_n
    agg["efficiency"] = agg["speedup"] / agg["ideal"]
    return agg
