"""The FIXME exercise checks: hints carry the numbers, right answers confirm, outcomes recorded."""

from __future__ import annotations

import json

import pytest

from labkit import exercises as ex
from labkit import exercises_reading as xr
from labkit.exercises import FIXME, ExerciseError


@pytest.fixture(autouse=True)
def _lenient(monkeypatch, tmp_path):
    monkeypatch.delenv(ex.STRICT_ENV, raising=False)
    monkeypatch.setenv("LABKIT_METRICS_FILE", str(tmp_path / "m.json"))


def test_layout_hint_carries_every_number():
    r = ex.check_layout(2, 1, 1, world_size=4)
    assert not r
    assert "TP x PP x DP = 2 x 1 x 1 = 2, but the job has 4 ranks" in r.message
    assert "DP is how many replicas" in r.message and "/ (2 x 1)" not in r.message


def test_layout_right_answer_confirms():
    r = ex.check_layout(2, 1, 2, world_size=4)
    assert r and "= 4 ranks" in r.message


def test_fixme_left_in_place_is_named():
    r = ex.check_layout(FIXME, 1, 2, world_size=4)
    assert not r and "tp still FIXME" in r.message
    assert repr(FIXME) == "FIXME"


def test_fixme_in_arithmetic_stays_fixme_and_the_check_names_it():
    import numpy as np

    t1, t2 = 80.0, 100.0
    assert FIXME * 2 is FIXME and t1 / FIXME is FIXME and (FIXME - 1) / t2 is FIXME
    assert np.float64(3.0) * FIXME is FIXME and round(FIXME, 2) is FIXME
    assert f"{FIXME:.3f} ms" == "FIXME ms"
    r = ex.check_scaling_efficiency(t1 / FIXME, time_1=t1, time_n=t2)
    assert not r and "efficiency still FIXME: replace FIXME" in r.message
    for use in (bool, int, float, lambda v: v < 1, lambda v: range(v)):
        with pytest.raises(ExerciseError, match="still FIXME"):
            use(FIXME)


def test_fixme_inside_a_list_is_named_not_graded():
    r = ex.check_value("crossing_axis", [FIXME], ["pp"], hint="which groups span two nodes?")
    assert not r and "crossing_axis still FIXME" in r.message and "pp" not in r.message


def test_value_is_the_answer_once_right_else_a_correct_one():
    assert ex.check_world_size(4, nodes=2, gpus_per_node=2).value == 4
    assert ex.check_world_size(FIXME, nodes=2, gpus_per_node=3).value == 6
    assert ex.check_world_size(5, nodes=2, gpus_per_node=2).value == 4
    kw = dict(nodes=2, gpus_per_node=2, num_layers=4, num_attention_heads=4, want_tp=2, want_pp=2)
    assert ex.check_hybrid(2, 2, 2, 8, **kw).value == (2, 2, 2, 8)
    for args in ((FIXME,) * 4, (2, 2, 4, 4), (1, 2, 2, 8)):
        tp, pp, mbs, gbs = ex.check_hybrid(*args, **kw).value
        assert ex.check_hybrid(tp, pp, mbs, gbs, **kw), (args, (tp, pp, mbs, gbs))
    free = ex.check_hybrid(FIXME, 1, 1, 1, nodes=2, gpus_per_node=2, num_layers=3,
                           num_attention_heads=2).value
    assert ex.check_hybrid(*free, nodes=2, gpus_per_node=2, num_layers=3, num_attention_heads=2)


def test_strict_mode_raises_on_a_wrong_answer(monkeypatch):
    monkeypatch.setenv(ex.STRICT_ENV, "1")
    with pytest.raises(ExerciseError, match=r"each of the 2 data-parallel rank\(s\) takes 2 "):
        ex.check_num_microbatches(4, global_batch_size=8, micro_batch_size=2, dp=2)
    assert ex.check_num_microbatches(2, global_batch_size=8, micro_batch_size=2, dp=2)


@pytest.mark.parametrize("args,needle", [
    ((4, 1, 2, 8), "TP=4 > 2 GPUs per node"),
    ((2, 3, 2, 8), "TP x PP = 2 x 3 = 6 does not divide the 4 ranks"),
    ((2, 2, 4, 6), "global batch 6 is not divisible by micro 4 x DP 1 = 4"),
    ((2, 2, 4, 4), "only 1 microbatch(es) for PP=2"),
    ((1, 2, 2, 8), "the exercise asks for TP=2"),
])
def test_hybrid_rules(args, needle):
    r = ex.check_hybrid(*args, nodes=2, gpus_per_node=2, num_layers=4, num_attention_heads=4,
                        want_tp=2, want_pp=2)
    assert not r and needle in r.message


def test_hybrid_right_answer():
    r = ex.check_hybrid(2, 2, 2, 8, nodes=2, gpus_per_node=2, num_layers=4,
                        num_attention_heads=4, want_tp=2, want_pp=2)
    assert r and "TP=2 x PP=2 x DP=1 = 4 ranks, micro batch 2, global batch 8" in r.message
    assert "bubble" not in r.message  # the next exercise asks for it
    flat = ex.check_hybrid(2, 1, 2, 4, nodes=2, gpus_per_node=2, num_layers=4,
                           num_attention_heads=4, min_pp=2)
    assert not flat and "at least 2 stages" in flat.message
    assert ex.check_hybrid(1, 4, 1, 8, nodes=2, gpus_per_node=2, num_layers=4,
                           num_attention_heads=4, min_pp=2)


def test_bubble_scaling_and_max_micro_batch():
    assert ex.check_bubble(0.25, pp=2, num_microbatches=4)
    wrong = ex.check_bubble(0.5, pp=2, num_microbatches=4).message
    assert "2 pipeline stages" in wrong and "4 microbatch slot(s)" in wrong
    assert "0.25" not in wrong and "(PP - 1)" not in wrong
    assert ex.check_scaling_efficiency(0.8, time_1=80.0, time_n=100.0)
    assert not ex.check_scaling_efficiency(0.4, time_1=80.0, time_n=100.0)
    peaks = {1: 0.5, 2: 0.9, 4: 1.7}
    assert ex.check_max_micro_batch(2, peak_gb_by_micro_batch=peaks, limit_gb=1.0)
    r = ex.check_max_micro_batch(4, peak_gb_by_micro_batch=peaks, limit_gb=1.0)
    assert not r and "needs 1.700 GB" in r.message and "does not fit" in r.message
    assert "fits, but it is not the largest" in ex.check_max_micro_batch(
        1, peak_gb_by_micro_batch=peaks, limit_gb=1.0).message
    assert ex.check_world_size(4, nodes=2, gpus_per_node=2)


def test_outcomes_are_recorded_for_regress(tmp_path):
    ex.check_layout(2, 2, 1, world_size=4)
    ex.check_layout(2, 1, 1, world_size=4)
    data = json.loads((tmp_path / "m.json").read_text())
    assert data["exercise.layout"] is False  # the last outcome of a check wins
    assert ex.summary()["checks"] >= 2


# --- a wrong answer gets the numbers and the rule, never the answer ------------------------------
def test_wrong_answers_teach_without_giving_the_answer():
    m = ex.check_world_size(3, nodes=2, gpus_per_node=2).message
    assert "2 node(s) with 2 GPU(s)" in m and "4" not in m
    m = ex.check_num_microbatches(4, global_batch_size=8, micro_batch_size=2, dp=2).message
    assert "global batch of 8" in m and " 2." not in m and "= 2" not in m
    m = ex.check_scaling_efficiency(1.25, time_1=80.0, time_n=100.0).message
    assert "80.0 ms" in m and "100.0 ms" in m and "0.8" not in m and "t1 / t2" not in m
    assert "which time belongs on top" in m
    m = ex.check_scaling_efficiency(0.9, time_1=80.0, time_n=50.0, weak=False).message
    assert "divided by 2" in m and "0.8" not in m


def test_crossing_axis_teaches_with_the_rank_numbers():
    kw = dict(tp=2, pp=2, nodes=2, gpus_per_node=2)
    assert xr.check_crossing_axis("pp", **kw) and xr.check_crossing_axis(["pp"], **kw)
    r = xr.check_crossing_axis("tp", **kw)
    assert not r and "TP group [0, 1]: rank 0 on node 0, rank 1 on node 0" in r.message
    assert "r // 2" in r.message and "PP" not in r.message and r.value == "pp"
    assert "answer with" in xr.check_crossing_axis("ep", **kw).message
    assert not xr.check_crossing_axis(FIXME, **kw) and xr.check_crossing_axis(FIXME, **kw).value == "pp"
    # TP=1 x PP=1 on 2 x 2: DP spans both nodes
    assert xr.check_crossing_axis("dp", tp=1, pp=1, nodes=2, gpus_per_node=2)


def _breakdown(**ms):
    import pandas as pd

    return pd.DataFrame([{"rank": 0, **{f"{k}_ms": v for k, v in ms.items()}}])


def test_profile_reading_uses_the_students_own_breakdown():
    comm_bound = _breakdown(compute=30.0, communication=55.0, memcpy=1.0, idle=14.0)
    assert xr.check_profile_reading("communication", "overlap", breakdown=comm_bound)
    r = xr.check_profile_reading("compute", "more_ranks", breakdown=comm_bound)
    assert not r and "30.0 ms, 30%" in r.message and "55" not in r.message
    r = xr.check_profile_reading("communication", "more_microbatches", breakdown=comm_bound)
    assert not r and "shortens idle, not communication" in r.message
    compute_bound = _breakdown(compute=80.0, communication=10.0, memcpy=0.0, idle=10.0)
    assert xr.check_profile_reading("compute", "more_ranks", breakdown=compute_bound)
    assert xr.check_profile_reading(FIXME, FIXME, breakdown=compute_bound).value[0] == "compute"


def test_fits_budget_names_the_components_not_the_option():
    peaks = {"bf16": 0.030, "recompute": 0.036, "distributed_optimizer": 0.024}
    base = {"weights": 0.005, "optimizer": 0.010, "activations": 0.002}
    assert xr.check_fits_budget("distributed_optimizer", peak_gb=peaks, budget_gb=0.027)
    r = xr.check_fits_budget("bf16", peak_gb=peaks, budget_gb=0.027, baseline=base)
    assert not r and "30.00 MB" in r.message and "optimizer 10.00 MB" in r.message
    assert "distributed_optimizer" not in r.message and r.value == "distributed_optimizer"
    assert "answer with one of" in xr.check_fits_budget("fp8", peak_gb=peaks, budget_gb=0.027).message


def test_diagnosis_from_a_real_log(tmp_path):
    from pathlib import Path

    from labkit.logs import diagnose

    log = Path(__file__).parent / "fixtures" / "logs" / "labkit_hang_job_2026.txt"
    failures = diagnose(log, job_state="CANCELLED")
    assert xr.check_diagnosis("cancelled", failures=failures)
    r = xr.check_diagnosis("gpu_oom", failures=failures)
    assert not r and "CUDA out of memory" in r.message and r.value == "cancelled"
    assert "answer with one of" in xr.check_diagnosis("crash", failures=failures).message


def test_diagnosis_names_the_first_failure_as_root_cause_and_the_others_as_stopped_by_it():
    """torchrun's table lists the other failed ranks under "Failures:" and the first one under
    "Root Cause": only that one is the cause (mmsegmentation issue 3106, a posted log)."""
    from pathlib import Path

    from labkit.logs import diagnose

    log = Path(__file__).parent / "fixtures/logs/real/torchrun_sigabrt_table_mmsegmentation3106.txt"
    child = next(f for f in diagnose(log) if f.kind == "child_failed")
    assert child.rank == 0
    assert "rank 1 (local_rank: 1) stopped by the root cause" in child.message
    assert child.message.count("root cause rank") == 1 and "root cause rank 0" in child.message


def test_each_check_writes_the_value_it_checked_for_the_notebook_tests(tmp_path, monkeypatch):
    from labkit.exercises_audit import read_answers

    log = tmp_path / "answers.jsonl"
    monkeypatch.setenv(ex.ANSWERS_ENV, str(log))
    ex.check_bubble(FIXME, pp=2, num_microbatches=8)
    ex.check_num_microbatches(2, global_batch_size=8, micro_batch_size=2, dp=2)
    assert read_answers(log) == [{"name": "bubble", "value": 0.125},
                                 {"name": "num_microbatches", "value": 2}]


def test_save_interval_by_youngs_rule():
    # sqrt(2 x 60 s x 28800 s) = 1859 s of 2 s iterations: about 930 iterations.
    facts = dict(checkpoint_s=60, mtbf_s=8 * 3600, iteration_s=2)
    assert ex.check_save_interval(930, **facts)
    wrong = ex.check_save_interval(1859, **facts)  # forgot to divide by the iteration time
    assert not wrong and "too high" in wrong.message and "929" not in wrong.message
    assert not ex.check_save_interval(FIXME, **facts)
