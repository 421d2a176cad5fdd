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

from labkit.config import RunConfig
from labkit.errors import LabkitError
from labkit.measured.hardware import PEAK_TFLOPS, peak_tflops
from labkit.planner.flops import flops_per_iteration

__all__ = ["PEAK_TFLOPS", "peak_tflops", "model_flops_per_iteration", "tflops_per_gpu", "mfu",
           "add_throughput", "add_mfu", "scaling_efficiency"]

def model_flops_per_iteration(cfg: Any) -> float:
    """Model FLOPs of one iteration of ``cfg`` (the planner's ``flops_per_iteration``)."""
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
