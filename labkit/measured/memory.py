"""Tensor memory measured per rank and component, next to the planner's prediction.

``code/pretrain_gpt.py`` writes ``RUN_DIR/memory/rank_N.json`` (``code/engine_timing.py``):
the bytes of weights, gradients, optimizer state and other static buffers counted from the
model and optimizer objects, the peak of what autograd saved for backward (activations), every
live tensor at the end (the check that the components account for it), and per iteration the
process's RSS. This is the memory the planner predicts (tensors), which RSS on CPU hides under
the interpreter's and libraries' few hundred MB.

Sizes here are MB = 1e6 bytes, so that 1000 MB is the planner's 1 GB.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from labkit.errors import LabkitError
from labkit.planner.memory import stage_memory

if TYPE_CHECKING:
    from labkit.config import RunConfig

MB = 1e6
COMPONENTS = ("weights", "gradients", "optimizer", "activations", "other")
"""The parts of a rank's tensor memory, in the order they are stacked in plots."""


def _files(run_dir: Path) -> list[Path]:
    files = sorted((run_dir / "memory").glob("rank_*.json"))
    if not files:
        raise LabkitError(f"no measured memory in {run_dir / 'memory'} (rank_N.json). "
                          f"code/pretrain_gpt.py writes it when training ends; did the run finish?")
    return files


def _read(f: Path) -> dict:
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise LabkitError(f"cannot read measured memory {f}: {e}") from None


def load_memory(run_dir: str | Path) -> pd.DataFrame:
    """One row per rank: ``rank, tp_rank, pp_rank, dp_rank``, the components in MB
    (``weights_mb`` ... ``other_mb``; activations at their peak), ``tensors_mb`` (their sum),
    ``live_tensors_mb`` (every live tensor at the end of training) and ``rss_mb`` (last)."""
    rows = []
    for f in _files(Path(run_dir)):
        d = _read(f)
        static = d.get("static", {})
        row = {k: d.get(k) for k in ("rank", "tp_rank", "pp_rank", "dp_rank")}
        for c in COMPONENTS:
            row[f"{c}_mb"] = (d.get("activations_peak", 0) if c == "activations"
                              else static.get(c, 0)) / MB
        row["tensors_mb"] = sum(row[f"{c}_mb"] for c in COMPONENTS)
        row["live_tensors_mb"] = d.get("live_tensors", 0) / MB
        its = d.get("iterations") or [{}]
        row["rss_mb"] = its[-1].get("rss", float("nan")) / MB
        rows.append(row)
    return pd.DataFrame(rows).sort_values("rank").reset_index(drop=True)


def memory_iterations(run_dir: str | Path) -> pd.DataFrame:
    """One row per rank and iteration: ``tensors_mb`` (static tensors after the iteration +
    its activation peak), ``activations_mb``, ``rss_mb`` and ``max_allocated_mb`` (= tensors_mb,
    the name ``labkit.measured.plots.plot_memory`` reads)."""
    rows = []
    for f in _files(Path(run_dir)):
        d = _read(f)
        for it in d.get("iterations", []):
            static = sum(it.get(c, 0) for c in COMPONENTS if c != "activations")
            tensors = (static + it.get("activations_peak", 0)) / MB
            rows.append({"rank": d.get("rank"), "pp_rank": d.get("pp_rank"),
                         "iteration": it.get("iteration"), "tensors_mb": tensors,
                         "activations_mb": it.get("activations_peak", 0) / MB,
                         "rss_mb": it.get("rss", float("nan")) / MB, "max_allocated_mb": tensors})
    return pd.DataFrame(rows).sort_values(["rank", "iteration"]).reset_index(drop=True)


def predicted_memory(cfg: RunConfig) -> pd.DataFrame:
    """The planner's components per pipeline stage, in MB (activations with the logits: the
    engine's count of saved tensors includes the cross entropy's; ``other`` = start-up)."""
    rows = []
    for r in range(cfg.pp):
        st = stage_memory(cfg, r)
        rows.append({"pp_rank": r, "weights_mb": st.weights * 1e3, "gradients_mb": st.gradients * 1e3,
                     "optimizer_mb": st.optimizer * 1e3,
                     "activations_mb": (st.activations + st.logits) * 1e3,
                     "other_mb": st.startup * 1e3})
    return pd.DataFrame(rows)


def compare_memory(cfg: RunConfig, measured: pd.DataFrame) -> pd.DataFrame:
    """Predicted and measured components side by side, per stage (tensor rank 0, replica 0).

    Rows: one per ``(pp_rank, source)`` with ``source`` "predicted" or "measured"; columns the
    components in MB and ``total_mb``. ``measured`` is ``load_memory``'s frame.
    """
    cols = [f"{c}_mb" for c in COMPONENTS]
    missing = [c for c in ["pp_rank", "tp_rank", "dp_rank", *cols] if c not in measured.columns]
    if missing:
        raise LabkitError(f"compare_memory needs load_memory's frame; missing {missing}")
    m = measured[(measured["tp_rank"] == 0) & (measured["dp_rank"] == 0)][["pp_rank", *cols]]
    if sorted(m["pp_rank"]) != list(range(cfg.pp)):
        raise LabkitError(f"the measured ranks' stages {sorted(m['pp_rank'])} do not match the "
                          f"config's PP={cfg.pp}; compare a run with its own config")
    p = predicted_memory(cfg)
    out = pd.concat([p.assign(source="predicted"), m.assign(source="measured")], ignore_index=True)
    out["total_mb"] = out[cols].sum(axis=1)
    return out[["pp_rank", "source", *cols, "total_mb"]].sort_values(
        ["pp_rank", "source"], ascending=[True, False], kind="stable").reset_index(drop=True)
