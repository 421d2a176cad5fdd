"""The pipeline as it ran: forward and backward of every microbatch on every stage, and the
bubble measured from them.

``code/pretrain_gpt.py`` writes ``RUN_DIR/timeline/rank_N.jsonl`` (``code/engine_timing.py``):
one line per forward or backward of one microbatch of one model chunk, with wall-clock start
and end. A stage waits for its neighbours between those (activations from the previous stage,
gradients from the next): that is the idle time, the bubble.

The measured bubble of one iteration and stage is idle / busy, where busy is the sum of its
forward and backward times and idle what is left of the pipeline's span (the first forward
anywhere to the last backward anywhere). With equal work per microbatch that is exactly
(p - 1) / (v x m) for p stages, v virtual chunks per stage and m microbatches (Narayanan et
al. 2021, section 2.2): every stage idles (p - 1) microbatch-times of its 1/v chunks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from labkit.errors import LabkitError

COLUMNS = ["iteration", "rank", "tp_rank", "pp_rank", "dp_rank", "chunk", "microbatch", "phase",
           "start", "end"]


def load_timeline(run_dir: str | Path) -> pd.DataFrame:
    """Every rank's forward/backward events of a run, one row each.

    Columns: those of the files (``COLUMNS``; ``start``/``end`` in wall-clock seconds) plus
    ``start_ms``/``end_ms`` from the iteration's first forward on any rank and ``duration_ms``.
    """
    folder = Path(run_dir) / "timeline"
    files = sorted(folder.glob("rank_*.jsonl"))
    if not files:
        raise LabkitError(f"no pipeline timeline in {folder} (rank_N.jsonl). code/pretrain_gpt.py "
                          f"writes one per rank while it trains; did the run start training?")
    rows = []
    for f in files:
        lines = f.read_text().splitlines()
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError:
                if n == len(lines):  # the last line of a rank that stopped while writing it
                    continue
                raise LabkitError(f"{f}:{n} is not a timeline line (JSON): {line[:80]!r}") from None
    df = pd.DataFrame(rows)
    missing = [c for c in COLUMNS if c not in df.columns]
    if df.empty or missing:
        raise LabkitError(f"the timeline in {folder} has no events or lacks {missing}")
    df = df[COLUMNS].copy()
    t0 = df.groupby("iteration")["start"].transform("min")
    df["start_ms"] = (df["start"] - t0) * 1e3
    df["end_ms"] = (df["end"] - t0) * 1e3
    df["duration_ms"] = (df["end"] - df["start"]) * 1e3
    return df.sort_values(["iteration", "pp_rank", "start"], kind="stable").reset_index(drop=True)


def _one_pipeline(df: pd.DataFrame) -> pd.DataFrame:
    """The ranks of one pipeline: tensor rank 0 of data-parallel replica 0."""
    return df[(df["tp_rank"] == 0) & (df["dp_rank"] == 0)]


def pipeline_shape(df: pd.DataFrame) -> dict[str, int]:
    """``{"p", "v", "m"}``: stages, model chunks per stage, microbatches, as the events show."""
    d = _one_pipeline(df)
    return {"p": int(d["pp_rank"].nunique()), "v": int(d["chunk"].nunique()),
            "m": int(d["microbatch"].nunique())}


def predicted_bubble(p: int, v: int, m: int) -> float:
    """The schedule's bubble, (p - 1) / (v x m) of the ideal compute time."""
    if min(p, v, m) < 1:
        raise LabkitError(f"predicted_bubble needs p, v, m >= 1; got p={p}, v={v}, m={m}")
    return (p - 1) / (v * m)


def stage_idle(df: pd.DataFrame) -> pd.DataFrame:
    """Per iteration and stage: ``span_ms``, ``busy_ms``, ``idle_ms``, ``bubble`` (idle / busy)
    and ``idle_fraction`` (idle / span), for the pipeline of tensor rank 0 and replica 0."""
    d = _one_pipeline(df)
    if d.empty:
        raise LabkitError("stage_idle: no events of tensor rank 0 / data-parallel rank 0")
    span = d.groupby("iteration").agg(first=("start", "min"), last=("end", "max"))
    busy = d.groupby(["iteration", "pp_rank"])["duration_ms"].sum().rename("busy_ms").reset_index()
    out = busy.merge(span, left_on="iteration", right_index=True)
    out["span_ms"] = (out["last"] - out["first"]) * 1e3
    out["idle_ms"] = (out["span_ms"] - out["busy_ms"]).clip(lower=0.0)
    out["bubble"] = out["idle_ms"] / out["busy_ms"]
    out["idle_fraction"] = out["idle_ms"] / out["span_ms"]
    return out[["iteration", "pp_rank", "span_ms", "busy_ms", "idle_ms", "bubble", "idle_fraction"]]


def measured_bubble(df: pd.DataFrame, *, skip: int = 1) -> dict[str, float | int]:
    """The run's bubble, measured and predicted.

    ``bubble``: idle / busy of the busiest stage (the one that sets the pipeline's pace; the
    others also wait for it, which is imbalance, not the schedule's bubble), the median over
    iterations with the first ``skip`` left out (warm-up); ``predicted`` = (p - 1) / (v x m)
    from the events' own shape; ``idle_fraction``: the median of the stages' mean idle / span
    (all idle time, imbalance included); and ``p``, ``v``, ``m``, ``iterations`` (how many).
    """
    per = stage_idle(df)
    its = sorted(per["iteration"].unique())
    keep = its[skip:] or its[-1:]
    per = per[per["iteration"].isin(keep)]
    busiest = per.loc[per.groupby("iteration")["busy_ms"].idxmax()]
    shape = pipeline_shape(df)
    return {"bubble": float(busiest["bubble"].median()),
            "idle_fraction": float(per.groupby("iteration")["idle_fraction"].mean().median()),
            "predicted": predicted_bubble(shape["p"], shape["v"], shape["m"]),
            **shape, "iterations": len(keep)}


def bubble_line(df: pd.DataFrame, *, skip: int = 1) -> str:
    """One line to print: measured bubble next to (p - 1) / (v x m)."""
    b = measured_bubble(df, skip=skip)
    return (f"bubble measured {b['bubble']:.2f} (idle / busy of the busiest stage, median of "
            f"{b['iterations']} iterations) vs predicted (p-1)/(v*m) = ({b['p']}-1)/"
            f"({b['v']}*{b['m']}) = {b['predicted']:.2f}; all stages idle "
            f"{b['idle_fraction']:.0%} of the pipeline's span")
