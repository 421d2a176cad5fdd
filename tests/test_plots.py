"""Plots take a frame and an optional ax, return the ax, and draw what the frame says."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from labkit.errors import LabkitError  # noqa: E402
from labkit.measured import plots  # noqa: E402


@pytest.fixture
def runs():
    rows = []
    for tp, pp, mbs in ((1, 1, 1), (2, 1, 1), (1, 2, 2), (2, 2, 2)):
        for it in range(1, 6):
            rows.append({"name": f"tp{tp}pp{pp}", "tp": tp, "pp": pp, "micro_batch_size": mbs,
                         "world_size": tp * pp, "iteration": it, "lm_loss": 8.0 - it * 0.1 * tp,
                         "elapsed_ms": 100.0 * pp, "tflops_per_gpu": 1.0 * tp,
                         "tokens_per_sec": 1000.0 * tp * pp * 0.9})
    return pd.DataFrame(rows)


def teardown_function():
    plt.close("all")


def test_line_plots_one_line_per_group(runs):
    fig, ax = plt.subplots()
    assert plots.plot_loss(runs, by="name", ax=ax) is ax
    assert len(ax.get_lines()) == 4 and ax.get_ylabel() == "lm loss (nats per token)"
    assert len(plots.plot_iteration_time(runs, by="name").get_lines()) == 4
    ax = plots.plot_throughput(runs, y="tokens_per_sec", by="tp")
    assert len(ax.get_lines()) == 2 and ax.get_ylabel() == "tokens/s"
    val = pd.DataFrame({"iteration": [5], "lm_loss": [7.0]})
    assert len(plots.plot_loss(runs[runs["name"] == "tp1pp1"], validation=val).get_lines()) == 2


def test_memory_per_rank_and_limit():
    mem = pd.DataFrame({"rank": [0, 1, 0, 1], "iteration": [1, 1, 2, 2],
                        "max_allocated_mb": [10.0, 12.0, 11.0, 15.0]})
    ax = plots.plot_memory(mem, limit_mb=500)
    assert [p.get_height() for p in ax.patches] == [11.0, 15.0]


def test_scaling_has_the_ideal_line(runs):
    ax = plots.plot_scaling(runs)
    measured, ideal = ax.get_lines()
    assert list(ideal.get_ydata()) == pytest.approx([900.0, 1800.0, 3600.0])
    assert list(measured.get_xdata()) == [1, 2, 4]


def test_micro_batch_grid_and_profile(runs):
    assert len(plots.plot_throughput_vs_micro_batch(runs, by="tp").get_lines()) == 2
    ax = plots.plot_layout_grid(runs)
    assert ax.images[0].get_array().shape == (2, 2) and len(ax.texts) == 4
    prof = pd.DataFrame({"rank": [0, 1], "compute_ms": [5.0, 4.0], "communication_ms": [3.0, 4.0],
                         "memcpy_ms": [1.0, 1.0], "idle_ms": [1.0, 1.0]})
    ax = plots.plot_profile_breakdown(prof, normalize=True)
    assert len(ax.patches) == 8 and sum(p.get_height() for p in ax.patches[:2]) == pytest.approx(0.9)


def test_missing_column_is_a_clear_error(runs):
    with pytest.raises(LabkitError, match=r"needs column\(s\) \['lm_loss'\]"):
        plots.plot_loss(runs.drop(columns="lm_loss"))


def _ticks_are_whole(locs):
    return all(float(v).is_integer() for v in locs)


def test_every_axis_names_its_unit(runs):
    ax = plots.plot_iteration_time(runs, by="name")
    assert ax.get_ylabel() == "time per iteration (ms)"
    assert plots.plot_throughput(runs).get_ylabel() == "TFLOP/s per GPU"
    assert "(samples)" in plots.plot_throughput_vs_micro_batch(runs).get_xlabel()
    prof = pd.DataFrame({"rank": [0], "compute_ms": [5.0], "communication_ms": [3.0],
                         "memcpy_ms": [1.0], "idle_ms": [1.0]})
    assert plots.plot_profile_breakdown(prof).get_ylabel().endswith("(ms)")
    tb = pd.DataFrame({"tag": ["iteration-time"] * 3, "step": [1, 2, 3], "value": [0.2, 0.1, 0.1]})
    assert plots.plot_scalars(tb, "iteration-time").get_ylabel() == "time per iteration (s)"
    with pytest.raises(LabkitError, match="no scalar 'lm-loss'.*iteration-time"):
        plots.plot_scalars(tb, "lm-loss")


def test_heatmap_labels_are_readable_numbers_with_units(runs):
    ax = plots.plot_layout_grid(runs.assign(tokens_per_sec=6260.4))
    texts = {t.get_text() for t in ax.texts}
    assert texts == {"6,260 tok/s"}, texts
    ax = plots.plot_layout_grid(runs, value="elapsed_ms")
    assert {t.get_text() for t in ax.texts} == {"100 ms", "200 ms"}
    assert "e+" not in "".join(t.get_text() for t in ax.texts)
    assert plots.format_value(0.413, "mfu") == "41%"
    assert plots.format_value(float("nan"), "tokens_per_sec") == "-"


def test_integer_axes_have_integer_ticks(runs):
    few = runs[runs["iteration"] <= 3]  # 3 iterations: matplotlib would put ticks at 1.5, 2.5
    fig, ax = plt.subplots()
    plots.plot_loss(few, ax=ax)
    fig.canvas.draw()
    assert _ticks_are_whole(ax.get_xticks())
    ax = plots.plot_throughput_vs_micro_batch(runs)
    assert list(ax.get_xticks()) == [1, 2]
    ax = plots.plot_scaling(runs)
    assert list(ax.get_xticks()) == [1, 2, 4]


# --- memory and pipeline pictures, from real runs (tests/fixtures/pipeline_runs) --------------
RUNS = Path(__file__).parent / "fixtures" / "pipeline_runs"


def test_memory_components_side_by_side_stacked():
    from labkit.config import RunConfig
    from labkit.measured.memory import COMPONENTS, compare_memory, load_memory

    cfg = RunConfig.from_json(RUNS / "pp2" / "config.json")
    cmp = compare_memory(cfg, load_memory(RUNS / "pp2"))
    fig, ax = plt.subplots()
    assert plots.plot_memory_components(cmp, ax=ax) is ax
    bars = ax.patches
    assert len(bars) == 2 * cfg.pp * len(COMPONENTS)  # per stage: predicted + measured stacks
    hatched = [b for b in bars if b.get_hatch()]
    assert len(hatched) == cfg.pp * len(COMPONENTS)  # the predicted ones
    tops = sorted(b.get_y() + b.get_height() for b in bars)
    assert tops[-1] == pytest.approx(cmp["total_mb"].max())
    assert "MB" in ax.get_ylabel()


def test_pipeline_timeline_draws_every_microbatch_and_the_idle_background():
    from labkit.measured.timeline import load_timeline

    df = load_timeline(RUNS / "vpp")
    fig, ax = plt.subplots()
    assert plots.plot_pipeline_timeline(df, ax=ax) is ax
    last = df[(df["iteration"] == df["iteration"].max())]
    idle = [b for b in ax.patches if b.get_hatch() == ".."]
    assert len(idle) == 2  # one grey background per stage
    assert len(ax.patches) - len(idle) == len(last)  # one bar per forward / backward
    labels = ax.get_legend_handles_labels()[1]
    assert {"idle", "forward chunk 0", "forward chunk 1", "backward chunk 1"} <= set(labels)
    with pytest.raises(LabkitError, match="no events for iteration 99"):
        plots.plot_pipeline_timeline(df, iteration=99)


def test_memory_timeline_and_memory_over_iterations():
    from labkit.measured.memory import memory_iterations
    from labkit.measured.profiling import memory_timeline

    mt = memory_timeline(RUNS / "pp2")
    ax = plots.plot_memory_timeline(mt)
    line = [ln for ln in ax.get_lines() if ln.get_label() == "allocated"][0]
    assert max(line.get_ydata()) == pytest.approx(mt["allocated_mb"].max())
    assert {"forward", "backward", "optimizer"} <= set(ax.get_legend_handles_labels()[1])
    it = memory_iterations(RUNS / "pp2")
    ax = plots.plot_memory(it, y="rss_mb", x="iteration")
    assert len(ax.get_lines()) == 2 and ax.get_xlabel() == "iteration"
    assert ax.get_ylabel() == "resident memory, RSS (MB)"
    ax = plots.plot_memory(it, y="tensors_mb")  # bars: the peak per rank
    assert len(ax.patches) == 2
