"""Parameter counts per (TP, PP) rank: the planner vs what code/pretrain_gpt.py prints (exact).

Real short trainings (torchrun, gloo, megatron-core): every rank that prints
`` > number of parameters on (tensor, pipeline) model parallel rank (T, P): N`` must print the
planner's ``param_counts(cfg)[(T, P)]``. Two layouts cover TP and PP splits, GQA, SwiGLU, an
ffn size that is not 4h, untied and tied embeddings (the last stage's copy) and interleaving.
"""

from __future__ import annotations

import re

import pytest

from labkit.config import RunConfig
from labkit.planner import param_counts

pytestmark = pytest.mark.engine

PARAMS_RE = re.compile(r"number of parameters on \(tensor, pipeline\) model parallel rank "
                       r"\((\d+), (\d+)\): (\d+)")


@pytest.mark.parametrize("overrides", [
    dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, num_attention_heads=4,
         num_query_groups=2, swiglu=True, ffn_hidden_size=96,
         untie_embeddings_and_output_weights=True),
    dict(pipeline_model_parallel_size=2, dp=2, num_layers_per_virtual_pipeline_stage=1,
         global_batch_size=8, micro_batch_size=1),
], ids=["tp2_pp2_gqa_swiglu_untied", "pp2_dp2_interleaved_tied"])
def test_param_counts_equal_what_the_engine_prints(tmp_path, overrides):
    from engine_runs import train  # tests/engine_runs.py (imports nothing heavy)

    run_dir = train(tmp_path, "params", train_iters=2, log_interval=1, lr_warmup_iters=1,
                    **overrides)
    cfg = RunConfig.from_json(run_dir / "config.json")
    printed = {(int(t), int(p)): int(n)
               for t, p, n in PARAMS_RE.findall((run_dir / "log.txt").read_text())}
    assert printed, "no parameter lines in log.txt"
    expected = param_counts(cfg)
    assert set(printed) <= set(expected)
    for key, n in printed.items():
        assert n == expected[key], f"rank {key}: engine printed {n}, planner says {expected[key]}"
    # Every pipeline rank reported (the line comes from each stage).
    assert {p for _, p in printed} == set(range(cfg.pp))
