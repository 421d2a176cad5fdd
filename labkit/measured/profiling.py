"""PyTorch profiler Chrome traces -> a per-rank step-time breakdown.

Each rank's step time is split into four parts that add up to it:
    communication  collectives: gloo / NCCL ops on CPU (``gloo:all_reduce``, ``c10d::allreduce_``,
                   ``record_param_comms``) or NCCL kernels on the GPU (``ncclDevKernel_*``)
    memcpy         copies: ``aten::copy_`` / ``aten::to`` on CPU, ``gpu_memcpy`` / ``gpu_memset``
    compute        every other operator (CPU trace) or kernel (CUDA trace)
    idle           the rest of the step: waiting, Python, launch gaps
Overlap is resolved by priority (communication > memcpy > compute): a copy inside an all-reduce
counts once, as communication. A CPU trace (gloo) is read on the CPU timeline of all the
process's threads (gloo runs collectives on its own thread); a CUDA trace on the GPU timeline.
The step window is the union of ``ProfilerStep#N`` annotations when there are any.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pandas as pd

from labkit.errors import LabkitError

CATEGORIES = ("communication", "memcpy", "compute")  # priority order
COLUMNS = ["rank", "device", "steps", "total_ms", "compute_ms", "communication_ms", "memcpy_ms", "idle_ms"]
_COMM = re.compile(r"^(?:gloo:|nccl:|c10d::|record_param_comms)|nccl(?:Dev)?Kernel|ncclKernel", re.I)
_COPY_OPS = ("aten::copy_", "aten::to", "aten::_to_copy", "aten::contiguous", "Memcpy", "Memset")
_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d{1,6})", re.I)


def load_trace(path: str | Path) -> dict[str, Any]:
    """A Chrome trace (``.json`` or ``.json.gz``) as a dict with ``traceEvents``."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    try:
        with opener(p, "rt") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError, EOFError) as e:
        raise LabkitError(f"cannot read profiler trace {p}: {e}. Is the file complete? torch.profiler "
                          f"writes it when the profiled steps end.") from e
    if isinstance(data, list):  # the bare-array form of the Trace Event Format
        data = {"traceEvents": data}
    if "traceEvents" not in data:
        raise LabkitError(f"{p} is not a Chrome trace (no traceEvents)")
    return data


def classify(event: dict[str, Any], *, cuda: bool) -> str | None:
    """The category of one complete ('X') event, or None when it is not counted."""
    cat, name = event.get("cat", ""), event.get("name", "")
    if cuda:
        if cat not in _GPU_CATS:
            return None
        if cat in ("gpu_memcpy", "gpu_memset"):
            return "memcpy"
        return "communication" if _COMM.search(name) else "compute"
    if cat == "user_annotation":
        return "communication" if _COMM.search(name) else None  # gloo:all_reduce is an annotation
    if cat != "cpu_op":
        return None
    if _COMM.search(name):
        return "communication"
    if name.startswith(_COPY_OPS):
        return "memcpy"
    return "compute"


def _exclusive(intervals: list[tuple[float, float, int]], windows: list[tuple[float, float]]) -> list[float]:
    """Time per category (by priority index) inside ``windows``, overlaps counted once."""
    points: list[tuple[float, int, int]] = []
    for lo, hi in windows:
        points += [(lo, 0, -1), (hi, 1, -1)]  # -1 marks window edges
    for s, e, c in intervals:
        if e > s:
            points += [(s, 0, c), (e, 1, c)]
    points.sort(key=lambda p: (p[0], p[1]))
    active = [0] * len(CATEGORIES)
    in_window = 0
    out = [0.0] * len(CATEGORIES)
    last = None
    for t, end, c in points:
        if last is not None and in_window > 0 and t > last:
            for i, n in enumerate(active):
                if n:
                    out[i] += t - last
                    break
        delta = -1 if end else 1
        if c < 0:
            in_window += delta
        else:
            active[c] += delta
        last = t
    return out


def _merge(windows: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for lo, hi in sorted(windows):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def trace_breakdown(trace: dict[str, Any], *, rank: int | None = None) -> dict[str, Any]:
    """One trace -> ``{rank, device, steps, total_ms, compute_ms, communication_ms, memcpy_ms, idle_ms}``."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e and "ts" in e]
    cuda = any(e.get("cat") == "kernel" for e in events)
    if rank is None:
        rank = (trace.get("distributedInfo") or {}).get("rank")
    intervals = []
    for e in events:
        c = classify(e, cuda=cuda)
        if c is not None:
            ts, dur = float(e["ts"]), float(e["dur"])
            intervals.append((ts, ts + dur, CATEGORIES.index(c)))
    steps = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
             if str(e.get("name", "")).startswith("ProfilerStep#")]
    if cuda or not steps:  # the GPU runs behind the CPU's step markers: use its own span
        if not intervals:
            raise LabkitError("the trace has no operator or kernel events to break down; was the "
                              "profiler active during a training step?")
        windows = [(min(i[0] for i in intervals), max(i[1] for i in intervals))]
    else:
        windows = _merge(steps)
    total = sum(hi - lo for lo, hi in windows)
    comm, copy, compute = _exclusive(intervals, windows)
    ms = 1e-3  # trace times are microseconds
    return {"rank": rank, "device": "cuda" if cuda else "cpu", "steps": len(steps) or None,
            "total_ms": total * ms, "compute_ms": compute * ms, "communication_ms": comm * ms,
            "memcpy_ms": copy * ms, "idle_ms": max(0.0, total - comm - copy - compute) * ms}


def _trace_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz")))
    if not files:
        raise LabkitError(f"no profiler trace (*.json, *.json.gz) under {path}. Run with "
                          f"torch_profiler=True; traces land in RUN_DIR/profile/.")
    return files


def profile_breakdown(path: str | Path) -> pd.DataFrame:
    """A trace file, or a folder of them (one per rank), -> one breakdown row per trace.

    The rank comes from the trace's ``distributedInfo``, else from a ``rank<N>`` in the file name.
    """
    p = Path(path)
    if not p.exists():
        raise LabkitError(f"no such profiler trace or folder: {p}")
    rows = []
    for f in _trace_files(p):
        m = _RANK_IN_NAME.search(f.name)
        row = trace_breakdown(load_trace(f))
        if row["rank"] is None and m:
            row["rank"] = int(m.group(1))
        row["file"] = str(f)
        rows.append(row)
    df = pd.DataFrame(rows, columns=COLUMNS + ["file"])
    return df.sort_values("rank", kind="stable").reset_index(drop=True)


# --- memory over one step ----------------------------------------------------------------------
_PHASE = re.compile(r"^labkit (forward|backward) chunk (\d+) microbatch (\d+)")


def memory_timeline(run_dir: str | Path, *, rank: int = 0) -> pd.DataFrame:
    """Bytes allocated over the profiled steps of ``rank``, from a ``torch_profiler_memory`` run.

    torch.profiler with ``profile_memory=True`` writes every allocation and free as a
    ``[memory]`` event carrying the bytes allocated since the profiler started; the engine's
    microbatches are ``labkit forward|backward ...`` annotations and the optimizer's step an
    ``Optimizer.step#...`` one. One row per event: ``time_ms`` (from the first event),
    ``allocated_mb`` (MB = 1e6 bytes; plus ``baseline_mb``: the weights and gradients that
    existed before profiling, from ``memory/rank_N.json`` when the run wrote it), ``phase``
    (forward, backward, optimizer, or "" between them) and ``step`` (1, 2, ...).
    """
    run_dir = Path(run_dir)
    path = run_dir / "profile" / f"rank{rank}.json"
    if not path.exists() and path.with_suffix(".json.gz").exists():
        path = path.with_suffix(".json.gz")
    if not path.exists():
        raise LabkitError(f"no profiler trace of rank {rank} at {path}. Run with "
                          f"torch_profiler=True, torch_profiler_memory=True, "
                          f"torch_profiler_ranks=[{rank}].")
    events = load_trace(path)["traceEvents"]
    mem = sorted((float(e["ts"]), float(e["args"]["Total Allocated"])) for e in events
                 if e.get("name") == "[memory]" and "Total Allocated" in e.get("args", {})
                 and e["args"].get("Device Type", 0) == 0)
    if not mem:
        raise LabkitError(f"{path} has no CPU [memory] events: it was recorded without "
                          f"torch_profiler_memory=True")
    spans: list[tuple[float, float, str]] = []
    steps: list[tuple[float, float]] = []
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        name, lo = str(e.get("name", "")), float(e["ts"])
        m = _PHASE.match(name)
        if m:
            spans.append((lo, lo + float(e["dur"]), m.group(1)))
        elif name.startswith("Optimizer.step#"):
            spans.append((lo, lo + float(e["dur"]), "optimizer"))
        elif name.startswith("ProfilerStep#"):
            steps.append((lo, lo + float(e["dur"])))
    spans.sort()
    steps.sort()
    baseline = 0.0
    mfile = run_dir / "memory" / f"rank_{rank}.json"
    if mfile.exists():
        static = json.loads(mfile.read_text()).get("static", {})
        baseline = (static.get("weights", 0) + static.get("gradients", 0)) / 1e6
    t0 = mem[0][0]
    rows = []
    for ts, total in mem:
        phase = next((p for lo, hi, p in spans if lo <= ts <= hi), "")
        step = next((i + 1 for i, (lo, hi) in enumerate(steps) if lo <= ts <= hi), None)
        rows.append({"time_ms": (ts - t0) / 1e3, "allocated_mb": baseline + total / 1e6,
                     "baseline_mb": baseline, "phase": phase, "step": step})
    return pd.DataFrame(rows)
