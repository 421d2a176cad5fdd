"""The iteration table and the layout of a parsed log, from what the collector (parse.py) gathered."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pandas as pd

from labkit.logs.stated import launcher_flags

ITER_COLUMNS = ["iteration", "train_iters", "elapsed_ms", "lm_loss", "lr", "global_batch_size",
                "consumed_samples", "loss_scale", "grad_norm", "skipped", "nan", "tflops_per_gpu",
                "samples_per_sec", "tokens_per_sec", "tokens_per_gpu_per_sec", "mfu", "timestamp"]
LAYOUT_KEYS = ("world_size", "tp", "pp", "dp", "cp")
# (an argument dump's model_parallel_size is TP: Megatron v1's, gpt-neox's beside its pipe_parallel_size;
# Megatron 2 on prints it None; gpt-neox's global_num_gpus is its world)
_ARG_LAYOUT = {"world_size": "world_size", "global_num_gpus": "world_size",
               "tensor_model_parallel_size": "tp", "model_parallel_size": "tp",
               "pipeline_model_parallel_size": "pp", "pipe_parallel_size": "pp",  # Megatron-DeepSpeed
               "data_parallel_size": "dp", "context_parallel_size": "cp"}

def layout_of(col: Any, head: Callable[[], Iterable[Any]] | None = None) -> dict[str, int | None]:
    """The layout the log states: its ``using world size`` line, else the argument block, the
    DeepSpeed launcher's world, and Megatron's flags on a command line in ``head()`` (the log's
    lines, read only when the world size, TP or PP is still unknown)."""
    lay: dict[str, int | None] = dict(col.layout)
    v1 = lay.pop("v1", None)  # Megatron v1's "using world size: N and model-parallel size: M"
    for arg, key in _ARG_LAYOUT.items():
        if lay.get(key) is None and arg in col.args and col.args[arg].isdecimal():
            lay[key] = int(col.args[arg]) or 1  # gpt-neox's pipe_parallel_size 0: no pipeline
    for key in ("world_size", "dp"):  # DeepSpeed's launcher and flops profiler
        if lay.get(key) is None and key in col.launcher:
            lay[key] = col.launcher[key]
    if head is not None and (lay.get("tp") is None or lay.get("pp") is None or lay.get("world_size") is None):
        for key, v in launcher_flags(head()).items():
            if key == "v1":  # its ``initializing model parallel with size N`` line
                v1 = v1 or v
            elif lay.get(key) is None:
                lay[key] = v
    if v1 and lay.get("pp") is None:  # Megatron v1 had no pipeline: PP 1 where nothing states one
        lay["pp"] = 1
    ws, tp, pp, dp, cp = (lay.get(k) for k in LAYOUT_KEYS)
    if ws is None and dp and tp and pp:  # the world, from every size the log stated
        lay["world_size"] = dp * tp * pp * (cp or 1)
    elif ws and [tp, pp, dp].count(None) == 1:  # the one size left, from the world and the others
        key = ("tp", "pp", "dp")[[tp, pp, dp].index(None)]  # (PiPPy's ``World size: 5, DP group size:
        rest = (tp or 1) * (pp or 1) * (dp or 1) * (cp or 1)  # 1, PP group size: 5``: TP 1)
        if ws % rest == 0:
            lay[key] = ws // rest  # derived from what the log said, not guessed
    return {k: lay.get(k) for k in LAYOUT_KEYS}


def _seq_length(col: Any) -> int | None:
    v = col.args.get("seq_length")
    return int(v) if v and v.isdecimal() else None


def iterations_frame(col: Any, layout: dict[str, int | None]) -> pd.DataFrame:
    df = col.iterations()
    df = df.reindex(columns=ITER_COLUMNS + [c for c in df.columns if c not in ITER_COLUMNS])
    if df.empty:
        return df
    sps = df["global_batch_size"] / (df["elapsed_ms"] / 1000.0)
    df["samples_per_sec"] = df["samples_per_sec"].astype("float64").fillna(sps)
    seq = _seq_length(col)
    if seq is not None:
        df["tokens_per_sec"] = df["tokens_per_sec"].astype("float64").fillna(df["samples_per_sec"] * seq)
    elif "seq_length" in df:
        df["tokens_per_sec"] = df["tokens_per_sec"].astype("float64").fillna(
            df["samples_per_sec"] * df["seq_length"])
    if "tokens_per_gpu_per_sec" in df and layout.get("world_size"):
        df["tokens_per_sec"] = df["tokens_per_sec"].astype("float64").fillna(
            df["tokens_per_gpu_per_sec"] * layout["world_size"])
    df["timestamp"] = pd.to_datetime(df["timestamp"], errors="coerce")
    for c in ("iteration", "train_iters", "global_batch_size", "consumed_samples", "skipped", "nan"):
        v = pd.to_numeric(df[c], errors="coerce").astype("float64")
        finite = v.dropna()
        if (finite.abs() < 2**53).all() and (finite == finite.round()).all():  # else: keep floats
            df[c] = v.astype("Int64") if v.isna().any() else v.astype("int64")
        else:
            df[c] = v
    return df.reset_index(drop=True)


def plain_records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as dicts of Python values, null for a missing or infinite one (_clean, column-wise)."""
    if len(df) == 0:
        return []
    gone = df.isna()
    for c in df.select_dtypes("floating").columns:
        gone[c] |= np.isinf(df[c].to_numpy())
    return df.astype(object).mask(gone, None).to_dict("records")


def frame_of_rows(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Records -> a compact frame (timestamps as datetime64, not one string object per row). A
    column none of the records gives a value is float NaN, as it is where those records share a
    chunk with records that give one: how records are chunked changes no column's type."""
    df = pd.DataFrame(rows)
    empty = [c for c in df.columns if df[c].dtype == object and df[c].isna().all()]
    if empty:
        df[empty] = df[empty].astype("float64")
    return frame_of_columns(df)


def frame_of_columns(data: dict[str, list] | pd.DataFrame) -> pd.DataFrame:
    df = pd.DataFrame(data)
    if "timestamp" in df.columns:
        df["timestamp"] = pd.to_datetime(df["timestamp"], errors="coerce", format="mixed")
    return df
