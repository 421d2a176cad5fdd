"""The FIXME exercise checks: hints carry the numbers, right answers confirm, outcomes recorded."""

from __future__ import annotations

import json

import pytest

from labkit import exercises as ex
from labkit.exercises import FIXME, ExerciseError


@pytest.fixture(autouse=True)
def _lenient(monkeypatch, tmp_path):
    monkeypatch.delenv(ex.STRICT_ENV, raising=False)
    monkeypatch.setenv("LABKIT_METRICS_FILE", str(tmp_path / "m.json"))


def test_layout_hint_carries_every_number():
    r = ex.check_layout(2, 1, 1, world_size=4)
    assert not r
    assert "TP x PP x DP = 2 x 1 x 1 = 2, but the job has 4 ranks" in r.message
    assert "DP = 4 / (2 x 1) = 2" in r.message


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
    with pytest.raises(ExerciseError, match=r"global 8 / \(micro 2 x DP 2\) = 8 / 4 = 2"):
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
    assert r and "TP=2 x PP=2 x DP=1 = 4 ranks; 4 microbatches" in r.message


def test_bubble_scaling_and_max_micro_batch():
    assert ex.check_bubble(0.25, pp=2, num_microbatches=4)
    assert "= 0.250" in ex.check_bubble(0.5, pp=2, num_microbatches=4).message
    assert ex.check_scaling_efficiency(0.8, time_1=80.0, time_n=100.0)
    assert not ex.check_scaling_efficiency(0.4, time_1=80.0, time_n=100.0)
    peaks = {1: 0.5, 2: 0.9, 4: 1.7}
    assert ex.check_max_micro_batch(2, peak_gb_by_micro_batch=peaks, limit_gb=1.0)
    r = ex.check_max_micro_batch(4, peak_gb_by_micro_batch=peaks, limit_gb=1.0)
    assert not r and "4: 1.70 GB" in r.message and "give 2" in r.message
    assert ex.check_world_size(4, nodes=2, gpus_per_node=2)


def test_outcomes_are_recorded_for_regress(tmp_path):
    ex.check_layout(2, 2, 1, world_size=4)
    ex.check_layout(2, 1, 1, world_size=4)
    data = json.loads((tmp_path / "m.json").read_text())
    assert data["exercise.layout"] is False  # the last outcome of a check wins
    assert ex.summary()["checks"] >= 2
