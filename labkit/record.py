"""What a notebook measured, for ``labkit regress``: ``record``, ``record_run``, ``recorded``.

Every notebook imports these. A metric goes to ``$LABKIT_METRICS_FILE`` when ``labkit regress``
runs the notebook (``labkit.regress`` reads it back and compares it with a baseline), else to
``runs/<run_name>/metrics.json`` when a run name is given; it is always kept in memory.
"""

from __future__ import annotations

import json
import math
from typing import Any

from labkit.paths import run_dir
from labkit.validate import env_path

METRICS_ENV = "LABKIT_METRICS_FILE"
_memory: dict[str, Any] = {}


def record(name: str, value: Any, *, run_name: str | None = None) -> Any:
    """Record one metric of the running notebook; returns ``value`` so a cell can show it.

    Written to ``$LABKIT_METRICS_FILE`` when ``labkit regress`` runs the notebook, else to
    ``runs/<run_name>/metrics.json`` when ``run_name`` is given; always kept in memory.
    """
    if hasattr(value, "item"):  # numpy / torch scalars -> plain JSON numbers
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        value = None
    _memory[name] = value
    target = env_path(METRICS_ENV)  # set but empty: refused, not the current directory
    path = target if target else (run_dir(run_name) / "metrics.json" if run_name else None)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.loads(path.read_text()) if path.exists() else {}
        data[name] = value
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return value


def recorded() -> dict[str, Any]:
    """Everything recorded in this process so far."""
    return dict(_memory)


def record_run(prefix: str, iterations: Any, memory: Any = None, *, skip_warmup: int = 1,
               run_name: str | None = None) -> dict[str, Any]:
    """Record the standard metrics of one run from its parsed DataFrames.

    ``iterations`` has the contract's columns (``elapsed_ms``, ``lm_loss``,
    ``tokens_per_sec``); ``memory`` optionally ``max_allocated_mb``. The first ``skip_warmup``
    iterations are left out of the timings (start-up costs, not steady state).
    """
    out: dict[str, Any] = {}
    df = iterations
    steady = df.iloc[skip_warmup:] if len(df) > skip_warmup else df
    if "elapsed_ms" in df and steady["elapsed_ms"].notna().any():
        out[f"{prefix}.iteration_time_ms"] = float(steady["elapsed_ms"].median())
    if "lm_loss" in df and df["lm_loss"].notna().any():
        out[f"{prefix}.final_loss"] = float(df["lm_loss"].dropna().iloc[-1])
    if "tokens_per_sec" in df and steady["tokens_per_sec"].notna().any():
        out[f"{prefix}.tokens_per_sec"] = float(steady["tokens_per_sec"].median())
    if memory is not None and len(memory) and "max_allocated_mb" in memory:
        peak = memory["max_allocated_mb"].max()
        if peak == peak:  # not NaN
            out[f"{prefix}.peak_memory_mb"] = float(peak)
    for k, v in out.items():
        record(k, v, run_name=run_name)
    return out
