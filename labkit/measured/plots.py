"""matplotlib plots of parsed runs. Each takes a DataFrame and an optional ``ax``, returns the ``ax``.

No ``plt.show()`` or ``savefig`` here: the notebook decides. Frames come from
``labkit.logs.parse_run / load_runs`` (iterations, memory), ``labkit.measured.metrics`` (throughput,
scaling) and ``labkit.measured.profiling`` (breakdown); axis labels carry the column's unit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from labkit.errors import LabkitError

if TYPE_CHECKING:
    from matplotlib.axes import Axes

LABELS = {"iteration": "iteration", "lm_loss": "lm loss (nats per token)",
          "elapsed_ms": "time per iteration (ms)", "tflops_per_gpu": "TFLOP/s per GPU",
          "tokens_per_sec": "tokens/s", "tokens_per_sec_per_device": "tokens/s per device",
          "samples_per_sec": "samples/s", "max_allocated_mb": "max allocated (MB)",
          "allocated_mb": "allocated (MB)", "max_reserved_mb": "max reserved (MB)",
          "micro_batch_size": "micro batch size (samples)", "world_size": "ranks (world size)",
          "nodes": "nodes", "mfu": "MFU (fraction of peak)", "tp": "tensor parallel size (TP)",
          "pp": "pipeline parallel size (PP)", "rank": "rank"}
# Columns whose values are whole numbers: their axes get integer ticks only.
INTEGER_COLUMNS = {"iteration", "micro_batch_size", "world_size", "nodes", "tp", "pp", "dp", "rank"}
# TensorBoard tags the training script writes (Megatron-LM's names) and their units.
TB_LABELS = {"lm-loss": "lm loss (nats per token)", "iteration-time": "time per iteration (s)",
             "throughput": "TFLOP/s per GPU", "learning-rate": "learning rate",
             "grad-norm": "gradient norm", "batch-size": "global batch (samples)",
             "loss-scale": "loss scale"}


def format_value(value: float, column: str) -> str:
    """A measured value as a reader wants it on a plot: ``6,260 tok/s``, ``151 ms``, ``41 %``."""
    if value != value:  # NaN
        return "-"
    if column.startswith("tokens_per_sec"):
        return f"{value:,.0f} tok/s"
    if column == "samples_per_sec":
        return f"{value:,.1f} samples/s"
    if column.endswith("_ms"):
        return f"{value:,.0f} ms" if abs(value) >= 10 else f"{value:,.2f} ms"
    if column.endswith("_mb"):
        return f"{value:,.0f} MB"
    if column == "tflops_per_gpu":
        return f"{value:,.2f} TFLOP/s"
    if column == "mfu":
        return f"{value:.0%}"
    return f"{value:,.4g}"


def _integer_ticks(ax: Axes, *axes_columns: tuple[str, str]) -> None:
    """Integer tick marks on the ``x``/``y`` axis whose column holds whole numbers."""
    # matplotlib: only when a figure is drawn
    from matplotlib.ticker import MaxNLocator

    for which, column in axes_columns:
        if column in INTEGER_COLUMNS:
            axis = ax.xaxis if which == "x" else ax.yaxis
            axis.set_major_locator(MaxNLocator(integer=True))


def _ax(ax: Axes | None, figsize: tuple[float, float] = (6, 4)) -> Axes:
    if ax is not None:
        return ax
    # matplotlib: only when a figure is drawn
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=figsize)[1]


def _need(df: pd.DataFrame, *cols: str, what: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise LabkitError(f"{what} needs column(s) {missing}; the frame has {list(df.columns)}. "
                          f"Build it with labkit.logs.load_runs / labkit.measured.metrics.add_throughput.")


def _lines(df: pd.DataFrame, x: str, y: str, by: str | None, ax: Axes, what: str, **kw) -> Axes:
    _need(df, x, y, *([by] if by else []), what=what)
    groups = df.groupby(by, sort=True) if by else [(None, df)]
    for key, g in groups:
        g = g.dropna(subset=[y]).sort_values(x)
        ax.plot(g[x], g[y], label=None if key is None else str(key), **kw)
    ax.set(xlabel=LABELS.get(x, x), ylabel=LABELS.get(y, y))
    _integer_ticks(ax, ("x", x), ("y", y))
    if by:
        ax.legend(title=LABELS.get(by, by))
    return ax


def plot_loss(df: pd.DataFrame, *, by: str | None = None, validation: pd.DataFrame | None = None,
              ax: Axes | None = None) -> Axes:
    """Training lm loss per iteration (one line per ``by`` group); validation points if given."""
    ax = _lines(df, "iteration", "lm_loss", by, _ax(ax), "plot_loss")
    if validation is not None and not validation.empty:
        v = validation.dropna(subset=["iteration", "lm_loss"])
        ax.plot(v["iteration"], v["lm_loss"], "o", color="black", label="validation")
        ax.legend(title=by)
    ax.set_title("loss")
    return ax


def plot_iteration_time(df: pd.DataFrame, *, by: str | None = None, ax: Axes | None = None) -> Axes:
    """Time per iteration (ms); the first iterations are usually slow (warm-up)."""
    ax = _lines(df, "iteration", "elapsed_ms", by, _ax(ax), "plot_iteration_time", marker=".")
    ax.set_title("time per iteration")
    return ax


def plot_throughput(df: pd.DataFrame, *, y: str = "tflops_per_gpu", by: str | None = None,
                    ax: Axes | None = None) -> Axes:
    """Throughput per iteration: TFLOP/s per GPU (default), tokens/s or samples/s."""
    ax = _lines(df, "iteration", y, by, _ax(ax), "plot_throughput", marker=".")
    ax.set_title("throughput")
    return ax


def plot_memory(df: pd.DataFrame, *, y: str = "max_allocated_mb", limit_mb: float | None = None,
                x: str | None = None, ax: Axes | None = None) -> Axes:
    """Peak memory per rank (bars, the max over iterations) from a ``.memory`` frame; with
    ``x="iteration"`` one line per rank over iterations (e.g.
    ``labkit.measured.memory.memory_iterations``)."""
    _need(df, "rank", y, what="plot_memory")
    ax = _ax(ax)
    if x is not None:
        _lines(df.dropna(subset=["rank"]), x, y, "rank", ax, "plot_memory", marker=".")
    else:
        per_rank = df.dropna(subset=["rank"]).groupby("rank")[y].max().sort_index()
        ax.bar([str(int(r)) for r in per_rank.index], per_rank.values, color="tab:blue")
        ax.set(xlabel="rank")
    if limit_mb is not None:
        ax.axhline(limit_mb, color="tab:red", linestyle="--", label=f"limit {limit_mb:g} MB")
        ax.legend()
    ax.set(ylabel=LABELS.get(y, y), title="memory per rank")
    return ax


def plot_scalars(df: pd.DataFrame, tag: str, *, ax: Axes | None = None) -> Axes:
    """One TensorBoard scalar (``labkit.measured.tb.read_scalars``'s frame) against the iteration."""
    _need(df, "tag", "step", "value", what="plot_scalars")
    d = df[df["tag"] == tag].sort_values("step")
    if d.empty:
        raise LabkitError(f"plot_scalars: no scalar {tag!r}; the frame has tags "
                          f"{sorted(df['tag'].unique())}")
    ax = _ax(ax)
    ax.plot(d["step"], d["value"], marker="o")
    ax.set(title=tag, xlabel="iteration", ylabel=TB_LABELS.get(tag, tag))
    _integer_ticks(ax, ("x", "iteration"))
    return ax


def plot_throughput_vs_micro_batch(df: pd.DataFrame, *, y: str = "tokens_per_sec", by: str | None = None,
                                   ax: Axes | None = None) -> Axes:
    """Median throughput per micro batch size (one line per ``by`` group, e.g. "tp")."""
    _need(df, "micro_batch_size", y, *([by] if by else []), what="plot_throughput_vs_micro_batch")
    keys = ["micro_batch_size"] + ([by] if by else [])
    med = df.groupby(keys)[y].median().reset_index()
    ax = _lines(med, "micro_batch_size", y, by, _ax(ax), "plot_throughput_vs_micro_batch", marker="o")
    sizes = sorted(int(m) for m in med["micro_batch_size"].unique())
    ax.set_xticks(sizes, [str(m) for m in sizes])  # the sizes that ran, nothing in between
    ax.set_title("throughput vs micro batch size")
    return ax


def plot_scaling(df: pd.DataFrame, *, x: str = "world_size", y: str = "tokens_per_sec",
                 ax: Axes | None = None) -> Axes:
    """Median ``y`` per ``x`` (GPUs or nodes) with the ideal linear-scaling line from the smallest."""
    _need(df, x, y, what="plot_scaling")
    med = df.groupby(x)[y].median().sort_index()
    if med.empty:
        raise LabkitError("plot_scaling: no rows to plot")
    ax = _ax(ax)
    ax.plot(med.index, med.values, "o-", label="measured")
    ideal = med.iloc[0] * np.asarray(med.index, dtype=float) / float(med.index[0])
    ax.plot(med.index, ideal, "--", color="gray", label="ideal (linear)")
    ax.set(xlabel=LABELS.get(x, x), ylabel=LABELS.get(y, y), title="scaling")
    if x in INTEGER_COLUMNS:
        ax.set_xticks(list(med.index), [str(int(v)) for v in med.index])
    ax.legend()
    return ax


def plot_layout_grid(df: pd.DataFrame, *, value: str = "tokens_per_sec", ax: Axes | None = None) -> Axes:
    """A TP x PP grid of a layout sweep: the median ``value`` per (tp, pp); blank = not run."""
    _need(df, "tp", "pp", value, what="plot_layout_grid")
    grid = df.groupby(["pp", "tp"])[value].median().unstack("tp").sort_index().sort_index(axis=1)
    ax = _ax(ax)
    data = grid.to_numpy(dtype=float)
    im = ax.imshow(np.ma.masked_invalid(data), origin="lower", cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(grid.columns)), [str(c) for c in grid.columns])
    ax.set_yticks(range(len(grid.index)), [str(i) for i in grid.index])
    for (i, j), v in np.ndenumerate(data):
        if np.isfinite(v):  # dark text on the bright end of the colour map, light on the dark
            ax.text(j, i, format_value(v, value), ha="center", va="center", fontsize=9,
                    color="black" if im.norm(v) > 0.6 else "white", fontweight="bold")
    bar = ax.figure.colorbar(im, ax=ax, label=LABELS.get(value, value))
    if np.nanmax(np.abs(data)) >= 1000:
        # matplotlib: only when a figure is drawn
        from matplotlib.ticker import StrMethodFormatter

        bar.formatter = StrMethodFormatter("{x:,.0f}")  # 6,000 rather than 6e+03
        bar.update_ticks()
    ax.set(xlabel=LABELS["tp"], ylabel=LABELS["pp"],
           title=f"{LABELS.get(value, value)} by layout (median)")
    return ax


def plot_profile_breakdown(df: pd.DataFrame, *, normalize: bool = False, ax: Axes | None = None) -> Axes:
    """Stacked bars per rank: compute, communication, memcpy, idle (ms, or fractions)."""
    parts = ["compute_ms", "communication_ms", "memcpy_ms", "idle_ms"]
    _need(df, "rank", *parts, what="plot_profile_breakdown")
    ax = _ax(ax)
    d = df.set_index("rank")[parts].astype(float)
    if normalize:
        d = d.div(d.sum(axis=1), axis=0)
    bottom = np.zeros(len(d))
    labels = [str(r) for r in d.index]
    for col, color in zip(parts, ("tab:blue", "tab:orange", "tab:green", "lightgray"), strict=True):
        ax.bar(labels, d[col].values, bottom=bottom, label=col.removesuffix("_ms"), color=color)
        bottom += d[col].values
    ax.set(xlabel="rank", ylabel="fraction of step" if normalize else "time per profiled window (ms)",
           title="step time breakdown")
    ax.legend()
    return ax


# --- memory and pipeline pictures -------------------------------------------------------------
LABELS.update({"tensors_mb": "tensor memory (MB)", "rss_mb": "resident memory, RSS (MB)",
               "activations_mb": "activations (MB)", "allocated_mb": "allocated (MB)"})
COMPONENT_COLORS = {"weights": "tab:green", "gradients": "tab:blue", "optimizer": "goldenrod",
                    "activations": "tab:red", "other": "tab:gray"}


def plot_memory_components(df: pd.DataFrame, *, ax: Axes | None = None) -> Axes:
    """Predicted and measured tensor memory per stage, stacked by component, side by side.

    ``df``: ``labkit.measured.memory.compare_memory`` (one row per stage and source, components
    in MB). Predicted bars are hatched; the total is written above each bar.
    """
    comps = [c for c in COMPONENT_COLORS if f"{c}_mb" in df.columns]
    _need(df, "pp_rank", "source", *[f"{c}_mb" for c in comps], what="plot_memory_components")
    ax = _ax(ax, (7, 4))
    stages = sorted(df["pp_rank"].unique())
    width = 0.38
    for i, stage in enumerate(stages):
        for j, source in enumerate(("predicted", "measured")):
            row = df[(df["pp_rank"] == stage) & (df["source"] == source)]
            if row.empty:
                continue
            x, bottom = i + (j - 0.5) * width, 0.0
            for c in comps:
                v = float(row[f"{c}_mb"].iloc[0])
                ax.bar(x, v, width * 0.95, bottom=bottom, color=COMPONENT_COLORS[c],
                       hatch="//" if source == "predicted" else None, edgecolor="white",
                       label=c if (i, j) == (0, 1) else None)
                bottom += v
            ax.text(x, bottom, f"{bottom:.2f}\n{source[:4]}.", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(stages)), [f"stage {s}" for s in stages])
    ax.set(ylabel="tensor memory per rank (MB)", xlabel="pipeline stage (left: predicted, hatched)",
           title="memory by component: predicted vs measured")
    ax.margins(y=0.15)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax


def plot_pipeline_timeline(df: pd.DataFrame, *, iteration: int | None = None,
                           ax: Axes | None = None) -> Axes:
    """A Gantt chart of one iteration: forward and backward of every microbatch per stage.

    ``df``: ``labkit.measured.timeline.load_timeline`` (tensor rank 0 of replica 0 is drawn). Forward is
    blue, backward orange, darker for later model chunks; each bar carries its microbatch; the
    grey behind the bars is the stage's idle time. ``iteration``: default the last one.
    """
    _need(df, "iteration", "pp_rank", "chunk", "microbatch", "phase", "start_ms", "end_ms",
          what="plot_pipeline_timeline")
    d = df[(df["tp_rank"] == 0) & (df["dp_rank"] == 0)] if "tp_rank" in df.columns else df
    it = int(d["iteration"].max()) if iteration is None else iteration
    d = d[d["iteration"] == it]
    if d.empty:
        raise LabkitError(f"plot_pipeline_timeline: no events for iteration {it}; the timeline "
                          f"has iterations {sorted(df['iteration'].unique())}")
    ax = _ax(ax, (10, 1.2 + 0.7 * d["pp_rank"].nunique()))
    # matplotlib: only when a figure is drawn
    import matplotlib.colors as mcolors

    lo, hi = d["start_ms"].min(), d["end_ms"].max()
    chunks = max(1, int(d["chunk"].max()) + 1)
    base = {"forward": "tab:blue", "backward": "tab:orange"}
    for stage in sorted(d["pp_rank"].unique()):
        ax.barh(stage, hi - lo, left=lo, height=0.8, color="0.88", hatch="..", edgecolor="0.7",
                linewidth=0, label="idle" if stage == d["pp_rank"].min() else None)
    for (phase, chunk), g in d.groupby(["phase", "chunk"]):
        rgb = mcolors.to_rgb(base.get(phase, "tab:gray"))
        shade = 1.0 - 0.45 * (chunk / max(1, chunks - 1)) if chunks > 1 else 1.0
        color = tuple(c * shade for c in rgb)
        label = phase if chunks == 1 else f"{phase} chunk {chunk}"
        ax.barh(g["pp_rank"], g["end_ms"] - g["start_ms"], left=g["start_ms"], height=0.8,
                color=color, edgecolor="white", linewidth=0.5, label=label)
        for _, r in g.iterrows():
            if r["end_ms"] - r["start_ms"] > (hi - lo) / 80:
                ax.text((r["start_ms"] + r["end_ms"]) / 2, r["pp_rank"], str(int(r["microbatch"])),
                        ha="center", va="center", fontsize=7, color="white")
    stages = sorted(d["pp_rank"].unique())
    ax.set_yticks(stages, [f"stage {s}" for s in stages])
    ax.invert_yaxis()
    ax.set(xlabel="time since the iteration's first forward (ms)",
           title=f"pipeline timeline, iteration {it} (numbers: microbatch; grey: idle)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax


def plot_memory_timeline(df: pd.DataFrame, *, ax: Axes | None = None) -> Axes:
    """Bytes allocated over the profiled steps, with forward, backward and optimizer shaded.

    ``df``: ``labkit.measured.profiling.memory_timeline``. The optimizer state appears in the first
    step's optimizer phase; activations pile up in forward and drain in backward.
    """
    _need(df, "time_ms", "allocated_mb", "phase", what="plot_memory_timeline")
    ax = _ax(ax, (10, 3.5))
    d = df.sort_values("time_ms")
    colors = {"forward": "tab:blue", "backward": "tab:orange", "optimizer": "goldenrod"}
    run = (d["phase"] != d["phase"].shift()).cumsum()
    seen: set[str] = set()
    for _, g in d.groupby(run):
        phase = g["phase"].iloc[0]
        if phase in colors:
            ax.axvspan(g["time_ms"].iloc[0], g["time_ms"].iloc[-1], color=colors[phase], alpha=0.18,
                       linewidth=0, label=None if phase in seen else phase)
            seen.add(phase)
    ax.step(d["time_ms"], d["allocated_mb"], where="post", color="black", linewidth=1,
            label="allocated")
    if "baseline_mb" in d.columns and d["baseline_mb"].max() > 0:
        ax.axhline(d["baseline_mb"].iloc[0], color="tab:green", linestyle=":",
                   label="weights + gradients before the step")
    ax.set(xlabel="time (ms)", ylabel="allocated tensors (MB)", title="memory over the first steps")
    ax.legend(fontsize=8, loc="upper left")
    return ax


_CATEGORY_COLORS = {"parameter": "darkgreen", "optimizer_state": "goldenrod", "input": "black",
                    "temporary": "mediumpurple", "activation": "tab:red", "gradient": "tab:blue",
                    "autograd_detail": "royalblue", "unknown": "0.6"}


def plot_memory_categories(df: pd.DataFrame, *, ax: Axes | None = None) -> Axes:
    """Memory of training steps by category, stacked, with each step's start marked.

    ``df``: ``labkit.measured.step_memory.profile_training_steps`` (``time_ms``, ``step``, ``phase`` and a
    ``<category>_mb`` column per torch.profiler category). Categories that stay zero are left out.
    """
    _need(df, "time_ms", "step", "phase", what="plot_memory_categories")
    cols = [c for c in df.columns if c.endswith("_mb") and df[c].max() > 0]
    if not cols:
        raise LabkitError("plot_memory_categories: no <category>_mb column above zero")
    ax = _ax(ax, (10, 3.5))
    d = df.sort_values("time_ms", kind="stable")
    names = [c[:-3] for c in cols]
    ax.stackplot(d["time_ms"], *[d[c] for c in cols], step="post", linewidth=0,
                 labels=[n.replace("_", " ") for n in names],
                 colors=[_CATEGORY_COLORS.get(n, "0.4") for n in names])
    run = (d["phase"] != d["phase"].shift()).cumsum()
    for _, g in d.groupby(run):
        if g["phase"].iloc[0]:
            ax.text(g["time_ms"].iloc[0], 1.0, f"{g['phase'].iloc[0][0].upper()}{g['step'].iloc[0]}",
                    transform=ax.get_xaxis_transform(), fontsize=7, va="bottom")
            ax.axvline(g["time_ms"].iloc[0], color="0.3", linewidth=0.5, linestyle=":")
    ax.set(xlabel="time (ms)", ylabel="tensor memory (MB)",
           title="memory by category over the steps (F forward, B backward, O optimizer)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax
