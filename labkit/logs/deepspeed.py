"""DeepSpeed engine and launcher lines.

Engine (``[INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=0, lr=[0.0001], mom=[...]``)
and its throughput timer (``epoch=0/micro_step=10/global_step=10, RunningAvgSamplesPerSec=12.3,
CurrSamplesPerSec=12.5, MemAllocated=1.23GB, MaxMemAllocated=4.56GB``); the launcher prints the
hostfile's world (``WORLD INFO DICT: {'worker-0': [0, 1, 2, 3], ...}``) and
``dist_world_size=8``.
"""

from __future__ import annotations

import ast
import re
from typing import Any

_STEP = re.compile(r"(?:\[Rank (\d{1,6})\] )?step=(\d{1,12}), skipped=(\d{1,12}), lr=\[([^\]]{0,400})\]")
_TIMER = re.compile(r"global_step=(\d{1,12}), RunningAvgSamplesPerSec=([0-9.eE+-]{1,30}), "
                    r"CurrSamplesPerSec=([0-9.eE+-]{1,30})")
# DeepSpeed <= 0.4: "0/10, SamplesPerSec=12.3"; 0.5 - 0.7: "0/10, RunningAvgSamplesPerSec=12.3,
# CurrSamplesPerSec=12.5" (epoch / global step), both with or without MemAllocated=.
_OLD_TIMER = re.compile(r"\] \d{1,9}/(\d{1,12}), (?:SamplesPerSec=([0-9.eE+-]{1,30})"
                        r"|RunningAvgSamplesPerSec=[0-9.eE+-]{1,30}, CurrSamplesPerSec=([0-9.eE+-]{1,30}))")
# The flops profiler's summary: "world size:      128", "data parallel size:      16"
_PROFILER = re.compile(r"^(world|data parallel) size:\s{1,80}(\d{1,9})\s{0,8}$")
_MEM = re.compile(r"MemAllocated=([0-9.]{1,20})GB, MaxMemAllocated=([0-9.]{1,20})GB")
_WORLD_INFO = re.compile(r"WORLD INFO DICT: (\{.{0,20000}\})")
_DIST_WS = re.compile(r"dist_world_size=(\d{1,9})")
_NNODES = re.compile(r"nnodes=(\d{1,6}), num_local_procs=(\d{1,6}), node_rank=(\d{1,6})")


def _f(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_step(text: str) -> dict[str, Any] | None:
    """``step=10, skipped=0, lr=[...]`` -> iteration record (iteration, skipped, lr)."""
    if "step=" not in text and "SamplesPerSec=" not in text:
        return None
    m = _STEP.search(text)
    if m:
        first = m.group(4).split(",")[0]
        rec: dict[str, Any] = {"iteration": int(m.group(2)), "skipped": int(m.group(3)),
                               "lr": _f(first)}
        if m.group(1) is not None:
            rec["rank"] = int(m.group(1))
        return rec
    m = _TIMER.search(text)
    if m:
        rec = {"iteration": int(m.group(1)), "samples_per_sec": _f(m.group(3))}
    else:
        m = _OLD_TIMER.search(text)
        if m is None:
            return None
        rec = {"iteration": int(m.group(1)), "samples_per_sec": _f(m.group(2) or m.group(3))}
    mm = _MEM.search(text, m.end())
    a, b = (_f(mm.group(1)), _f(mm.group(2))) if mm else (None, None)
    if a is not None and b is not None:  # DeepSpeed's GB are GiB; our MB are MiB, as Megatron's
        rec["allocated_mb"] = a * 1024
        rec["max_allocated_mb"] = b * 1024
    return rec


def parse_launcher(text: str) -> dict[str, Any] | None:
    """Launcher world: ``{"world_size": n, "nodes": k}`` from whichever line says it."""
    if "WORLD INFO DICT" in text:
        m = _WORLD_INFO.search(text)
        if m:
            try:
                info = ast.literal_eval(m.group(1))
                slots = [s for v in info.values() for s in v]
                return {"world_size": len(slots), "nodes": len(info)}
            except (ValueError, SyntaxError, TypeError, AttributeError, MemoryError, RecursionError):
                return None
    if "dist_world_size=" in text:
        m = _DIST_WS.search(text)
        if m:
            return {"world_size": int(m.group(1))}
    if "nnodes=" in text:
        m = _NNODES.search(text)
        if m:
            return {"nodes": int(m.group(1)), "procs_per_node": int(m.group(2))}
    if " size:" in text:
        m = _PROFILER.match(text)
        if m:
            return {"world_size" if m.group(1) == "world" else "dp": int(m.group(2))}
    return None
