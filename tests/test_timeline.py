"""The pipeline timeline, the measured bubble, tensor memory by component and the job monitor's
line, read from real runs of code/pretrain_gpt.py (tests/fixtures/pipeline_runs, README there)
and, in the engine test, from a run made here."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from labkit.backends.queue import describe, latest_iteration
from labkit.config import RunConfig
from labkit.errors import LabkitError
from labkit.measured.memory import COMPONENTS, compare_memory, load_memory, memory_iterations
from labkit.measured.profiling import memory_timeline
from labkit.measured.timeline import bubble_line, load_timeline, measured_bubble, predicted_bubble, stage_idle

RUNS = Path(__file__).parent / "fixtures" / "pipeline_runs"


def _config(run: Path) -> RunConfig:
    return RunConfig.from_json(run / "config.json")


# --- timeline ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["pp2", "vpp"])
def test_every_microbatch_has_one_forward_and_one_backward_per_chunk(name):
    cfg = _config(RUNS / name)
    df = load_timeline(RUNS / name)
    per_rank_iter = df.groupby(["iteration", "rank", "phase"]).size()
    assert set(per_rank_iter) == {cfg.num_microbatches * cfg.vpp}
    assert sorted(df["pp_rank"].unique()) == list(range(cfg.pp))
    assert sorted(df["chunk"].unique()) == list(range(cfg.vpp))
    assert (df["end"] >= df["start"]).all() and (df["start_ms"] >= 0).all()
    # On every rank the backward of a microbatch (of a chunk) starts after its forward ended.
    for key, g in df.groupby(["iteration", "rank", "chunk", "microbatch"]):
        f, b = g[g["phase"] == "forward"], g[g["phase"] == "backward"]
        assert len(f) == len(b) == 1 and b["start"].iloc[0] >= f["end"].iloc[0], key


def test_1f1b_order_on_each_stage():
    """Stage 0 of PP=2 with 4 microbatches: 2 warm-up forwards, then 1F1B, then the cool-down."""
    df = load_timeline(RUNS / "pp2")
    first = df[(df["iteration"] == 1) & (df["pp_rank"] == 0)].sort_values("start")
    order = [f"{p[0].upper()}{m}" for p, m in zip(first["phase"], first["microbatch"], strict=True)]
    assert order == ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"]
    last = df[(df["iteration"] == 1) & (df["pp_rank"] == 1)].sort_values("start")
    order = [f"{p[0].upper()}{m}" for p, m in zip(last["phase"], last["microbatch"], strict=True)]
    assert order == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]


def _ideal_1f1b(p: int, m: int, f: float = 1.0, b: float = 2.0) -> pd.DataFrame:
    """Events of a 1F1B pipeline computed with equal stage times (the schedule's own rule)."""
    done: dict[tuple[str, int, int], float] = {}
    rows = []
    for s in range(p):
        warm = min(m, p - s - 1)
        ops = [("forward", i) for i in range(warm)]
        fi, bi = warm, 0
        while bi < m:
            if fi < m:
                ops.append(("forward", fi))
                fi += 1
            ops.append(("backward", bi))
            bi += 1
        rows.append(ops)
    # Event times: an op starts when its stage is free and its input has arrived.
    free = [0.0] * p
    pending = [list(r) for r in rows]
    out = []
    while any(pending):
        progressed = False
        for s in range(p):
            if not pending[s]:
                continue
            phase, mb = pending[s][0]
            dep = (("forward", s - 1, mb) if phase == "forward" and s > 0 else
                   ("backward", s + 1, mb) if phase == "backward" and s < p - 1 else None)
            if dep is not None and dep not in done:
                continue
            start = max(free[s], done.get(dep, 0.0) if dep else 0.0)
            end = start + (f if phase == "forward" else b)
            done[(phase, s, mb)], free[s] = end, end
            out.append({"iteration": 1, "rank": s, "tp_rank": 0, "pp_rank": s, "dp_rank": 0,
                        "chunk": 0, "microbatch": mb, "phase": phase, "start": start, "end": end})
            pending[s].pop(0)
            progressed = True
        assert progressed
    df = pd.DataFrame(out)
    df["duration_ms"] = (df["end"] - df["start"]) * 1e3
    return df


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (3, 3)])
def test_an_ideal_1f1b_pipeline_measures_exactly_p_minus_1_over_m(p, m):
    df = _ideal_1f1b(p, m)
    b = measured_bubble(df, skip=0)
    assert (b["p"], b["v"], b["m"]) == (p, 1, m)
    assert b["bubble"] == pytest.approx((p - 1) / m) == pytest.approx(b["predicted"])
    per = stage_idle(df)
    assert per["bubble"].to_numpy() == pytest.approx([(p - 1) / m] * p)


def test_measured_bubble_of_real_runs_is_a_fraction_and_printed_with_the_formula():
    for name, v in (("pp2", 1), ("vpp", 2)):
        b = measured_bubble(load_timeline(RUNS / name))
        assert 0 < b["bubble"] and 0 < b["idle_fraction"] < 1
        assert b["predicted"] == predicted_bubble(2, v, 4) == 1 / (v * 4)
        assert b["iterations"] == 3  # 4 iterations, the first left out
    line = bubble_line(load_timeline(RUNS / "vpp"))
    assert "(2-1)/(2*4) = 0.12" in line


def test_timeline_errors_name_the_folder(tmp_path):
    with pytest.raises(LabkitError, match="no pipeline timeline in .*timeline"):
        load_timeline(tmp_path)
    (tmp_path / "timeline").mkdir()
    (tmp_path / "timeline" / "rank_0.jsonl").write_text("not json\n{}\n")
    with pytest.raises(LabkitError, match="rank_0.jsonl:1 is not a timeline line"):
        load_timeline(tmp_path)
    with pytest.raises(LabkitError, match="p=2, v=0"):
        predicted_bubble(2, 0, 4)


# --- memory -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["pp2", "vpp"])
def test_measured_components_match_the_planner_and_account_for_the_live_tensors(name):
    cfg = _config(RUNS / name)
    measured = load_memory(RUNS / name)
    raw = json.loads((RUNS / name / "memory" / "rank_0.json").read_text())
    assert measured.loc[0, "weights_mb"] == raw["static"]["weights"] / 1e6  # read, not made up
    # What the components count is nearly all that is alive at the end (the rest: a few
    # batches and pipeline buffers, ~0.1 MB here).
    static = measured[["weights_mb", "gradients_mb", "optimizer_mb", "other_mb"]].sum(axis=1)
    assert (static <= measured["live_tensors_mb"]).all()
    assert (abs(static - measured["live_tensors_mb"]) / measured["live_tensors_mb"] < 0.05).all()
    cmp = compare_memory(cfg, measured)
    assert list(cmp["source"][:2]) == ["predicted", "measured"]
    for stage in range(cfg.pp):
        p = cmp[(cmp["pp_rank"] == stage) & (cmp["source"] == "predicted")].iloc[0]
        m = cmp[(cmp["pp_rank"] == stage) & (cmp["source"] == "measured")].iloc[0]
        for c in COMPONENTS:
            assert m[f"{c}_mb"] == pytest.approx(p[f"{c}_mb"], rel=0.05), (stage, c)
    # RSS hides it: hundreds of MB of interpreter and libraries around ~10 MB of tensors.
    assert (measured["rss_mb"] > 20 * measured["tensors_mb"]).all()


def test_memory_per_iteration_and_errors(tmp_path):
    it = memory_iterations(RUNS / "pp2")
    assert sorted(it["iteration"].unique()) == [1, 2, 3, 4] and set(it["rank"]) == {0, 1}
    assert (it["tensors_mb"] > it["activations_mb"]).all() and (it["rss_mb"] > 100).all()
    with pytest.raises(LabkitError, match="no measured memory"):
        load_memory(tmp_path)
    with pytest.raises(LabkitError, match="PP=4"):
        compare_memory(_config(RUNS / "pp2").replace(pipeline_model_parallel_size=4,
                                                     gpus_per_node=4),
                       load_memory(RUNS / "pp2"))


def test_memory_timeline_shows_the_optimizer_state_appear_in_the_first_step():
    df = memory_timeline(RUNS / "pp2")
    assert set(df["phase"]) >= {"forward", "backward", "optimizer"} and set(df["step"].dropna()) == {1, 2}
    raw = json.loads((RUNS / "pp2" / "memory" / "rank_0.json").read_text())["static"]
    opt = raw["optimizer"] / 1e6
    step1, step2 = df[df["step"] == 1], df[df["step"] == 2]
    # Before the first optimizer step only weights + gradients (+ activations) exist; after it
    # Adam's moments stay: step 2 never drops back below baseline + optimizer state.
    assert step1["allocated_mb"].iloc[0] < df["baseline_mb"].iloc[0] + opt
    assert step2["allocated_mb"].min() >= df["baseline_mb"].iloc[0] + 0.99 * opt
    # Activations pile up during forward: the peak is above the start of the step.
    assert step2["allocated_mb"].max() > step2["allocated_mb"].iloc[0]


def test_memory_timeline_without_memory_events(tmp_path):
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "rank0.json").write_text(json.dumps({"traceEvents": [
        {"ph": "X", "name": "aten::mm", "ts": 1, "dur": 2}]}))
    with pytest.raises(LabkitError, match="torch_profiler_memory=True"):
        memory_timeline(tmp_path)
    with pytest.raises(LabkitError, match="no profiler trace of rank 3"):
        memory_timeline(tmp_path, rank=3)


# --- job monitor's line -----------------------------------------------------------------------
def test_running_line_from_a_real_log_of_the_engine():
    log = (Path(__file__).parent / "fixtures" / "logs")
    text = next(p for p in sorted(log.rglob("*.txt")) if b"lm loss" in p.read_bytes()).read_bytes()
    last = [ln for ln in text.splitlines() if b"iteration" in ln and b"lm loss" in ln][-1]
    got = latest_iteration(text)
    assert str(got["iteration"]).encode() in last and got["loss"] is not None
    line = describe("RUNNING", backend="local", job_id="1", info={}, latest=got)
    assert line.startswith(f"RUNNING: iteration {got['iteration']}/") and "lm loss" in line
    assert describe("PENDING", backend="local", job_id="1", info={}, latest=None) == "PENDING"


# --- a real run -------------------------------------------------------------------------------
@pytest.mark.engine
def test_a_pp2_run_writes_its_timeline_and_memory(tmp_path):
    from engine_runs import train

    run = train(tmp_path, name="pp2", pipeline_model_parallel_size=2, train_iters=3)
    df = load_timeline(run)
    assert set(df["rank"]) == {0, 1} and sorted(df["iteration"].unique()) == [1, 2, 3]
    b = measured_bubble(df)
    # Each stage of a pipeline waits for the other at least once (causality), so the bubble is
    # above 0; it has no upper bound: idle / busy of the busiest stage grows past 1 when the
    # machine's load stretches the other stage's work (1.04 seen in a loaded CI run). The idle
    # fraction (idle / the pipeline's span) stays under 1 by construction.
    assert 0 < b["bubble"] and 0 < b["idle_fraction"] < 1 and b["predicted"] == 0.25
    mem = load_memory(run)
    assert (mem["weights_mb"] > 0).all() and (mem["optimizer_mb"] > mem["weights_mb"]).all()
    assert (mem["activations_mb"] > 0).all()
