"""Round nine's loop rules, each on real lines of the held-out sets 4r, 4t, 4u and 4v (the sources
named at each test; the whole logs are in tests/fixtures/logs/heldout4r/ to 4v/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.logs import parse_lines

HELD = Path(__file__).parent / "fixtures" / "logs"


def _lines(folder: str, stem: str) -> list[bytes]:
    (path,) = (HELD / folder).glob(f"*{stem}.txt")
    return path.read_bytes().split(b"\n")


def test_a_logger_table_between_rules_is_one_record():
    """guided-diffusion's logger (OpenAI baselines'): ``| loss | 1.01 |`` rows between dashes, the
    step printed ``%g`` (``| step | 1.72e+03 |``): harryyuh/CausalDiffAE, job.10377083.out at ac4cc16."""
    p = parse_lines(_lines("heldout4r", "causaldiffae"))
    its = p.iterations
    assert len(its) == 173 and its["iteration"].iloc[[0, -1]].tolist() == [0, 1720]
    assert its["lm_loss"].iloc[0] == 1.01 and its["grad_norm"].iloc[0] == 9.63


def test_one_pair_a_line_is_one_record_where_a_counter_is_among_them():
    """verl's console, ``step:2 `` then a metric a line (https://github.com/verl-project/verl/issues/2535);
    the same lines without their counter are no record."""
    lines = _lines("heldout4t", "verl2535")
    p = parse_lines(lines)
    assert p.iterations[["iteration", "lr", "grad_norm"]].values.tolist() == [[2, 5e-08, 127.3]]
    counterless = [ln for ln in lines if not ln.startswith((b"step:", b"training/global_step"))]
    assert parse_lines(counterless).iterations.empty


def test_tab_indented_pairs_under_a_counter_go_on_with_its_record():
    """PaddlePaddle Knover: ``[train][1] progress: 1/1 step: 10, ...`` over ``<TAB>current lr: ...`` and
    ``<TAB>lm_loss: 9.0761, ...`` (PaddlePaddle/PaddleFleetX, examples/moe/log/workerlog.0 at 56ec0d1)."""
    p = parse_lines(_lines("heldout4r", "fleetx"))
    its = p.iterations
    assert its["iteration"].tolist() == list(range(10, 140, 10))
    assert its[["lm_loss", "lr", "loss_scale"]].iloc[0].tolist() == [9.0761, 1.2e-06, 32768.0]


def test_a_table_of_named_columns_gives_a_record_a_row():
    """tf_cnn_benchmarks under Horovod: ``Step<TAB>Img/sec<TAB>total_loss`` over sixteen ranks' rows
    (https://github.com/horovod/horovod/issues/466)."""
    p = parse_lines(_lines("heldout4v", "horovod466"))
    assert p.iterations["iteration"].tolist() == [1, 10]
    assert p.iterations["lm_loss"].notna().all()


def test_a_megatron_record_wrapped_right_after_a_bar_goes_on():
    """Megatron-Bridge's iteration lines wrapped at 86 columns, the first piece ending in ``|``
    (https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/841)."""
    p = parse_lines(_lines("heldout4t", "mbridge841"))
    its = p.iterations
    assert its[["iteration", "lm_loss", "elapsed_ms", "global_batch_size"]].values.tolist() == [
        [10, 4.474437, 13212.7, 512], [20, 0.08797448, 14260.3, 512]]
    assert len(p.memory) == 1


def test_memory_reports_of_two_ranks_glued_on_one_line_are_two():
    """``... max reserved: 56362.0[Rank 34] (after 1 iterations) memory (MB) | ...``: 64 ranks' reports
    on fewer lines (ZhangDY-6483/Megatron-LM, nohup.out at 2a88e19)."""
    p = parse_lines(_lines("heldout4r", "zhangdy"))
    assert len(p.memory) == 64 and p.memory["rank"].nunique() == 64


@pytest.mark.parametrize("stem, column, first", [
    ("paddleseg792", "elapsed_ms", 891.3),  # ``batch_cost=0.8913``: PaddlePaddle's seconds a batch
    ("internlm_30b_demo", "grad_norm", 44.66850557859531),  # ``grad_norm={'0_default': 44.66...}``
])
def test_names_of_other_suites(stem, column, first):
    """https://github.com/PaddlePaddle/PaddleSeg/pull/792; InternLM/InternLM,
    doc/code-docs/source/example/30B_demo.rst at 483b4ea."""
    p = parse_lines(_lines("heldout4u", stem))
    assert p.iterations[column].iloc[0] == pytest.approx(first)


def test_a_name_again_begins_the_next_records_run_of_pairs():
    """The same guided-diffusion tables with their rules of dashes left out (a logger that prints its
    pairs with no separator): a name printed again begins the next step's record, none is merged."""
    lines = [ln for ln in _lines("heldout4r", "causaldiffae") if not ln.startswith(b"-----")]
    its = parse_lines(lines).iterations
    assert len(its) == 173 and its["iteration"].iloc[[0, -1]].tolist() == [0, 1720]
