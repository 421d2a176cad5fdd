"""The planner against real runs of code/pretrain_gpt.py (torchrun, gloo, megatron-core).

* Parameter counts per (TP, PP) rank: every `` > number of parameters on (tensor, pipeline)
  model parallel rank (T, P): N`` line the engine prints equals ``param_counts(cfg)[(T, P)]``,
  exactly (TP and PP splits, GQA, SwiGLU, an ffn size that is not 4h, untied embeddings).
* Fits / OOM outcomes on CPU: the engine caps each process's address space at
  ``memory_limit_gb`` (RLIMIT_AS, a real out-of-memory beyond it). A budget of half what the
  planner requires must end in an out-of-memory; 1.5 x what it requires must train. The margin
  between is deliberate: on CPU the planner's ``CPU_CAP_OVERHEAD_GB`` is calibrated on two
  measured runs (see labkit/planner/memory.py), so the test asks for clear-cut outcomes only.
"""

from __future__ import annotations

import re

import pytest

from labkit.config import RunConfig
from labkit.planner import param_counts, plan

pytestmark = pytest.mark.engine

PARAMS_RE = re.compile(r"number of parameters on \(tensor, pipeline\) model parallel rank "
                       r"\((\d+), (\d+)\): (\d+)")


def _check_param_lines(run_dir) -> None:
    cfg = RunConfig.from_json(run_dir / "config.json")
    printed = {(int(t), int(p)): int(n)
               for t, p, n in PARAMS_RE.findall((run_dir / "log.txt").read_text())}
    assert printed, "no parameter lines in log.txt"
    expected = param_counts(cfg)
    assert set(printed) <= set(expected)
    for key, n in printed.items():
        assert n == expected[key], f"rank {key}: engine printed {n}, planner says {expected[key]}"
    assert {p for _, p in printed} == set(range(cfg.pp))  # every pipeline stage reported


def test_param_counts_equal_what_the_engine_prints(tmp_path):
    from engine_runs import train  # tests/engine_runs.py

    run_dir = train(tmp_path, "params", train_iters=2, log_interval=1, lr_warmup_iters=1,
                    tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                    num_attention_heads=4, num_query_groups=2, swiglu=True, ffn_hidden_size=96,
                    untie_embeddings_and_output_weights=True)
    _check_param_lines(run_dir)


# PP = 2 on 2 processes, 4 microbatches of 64 x 128 tokens: activations dominate.
FITS_CASE = dict(pipeline_model_parallel_size=2, micro_batch_size=64, global_batch_size=256,
                 hidden_size=128, num_attention_heads=8, seq_length=128,
                 max_position_embeddings=128, untie_embeddings_and_output_weights=True,
                 train_iters=3, log_interval=1, lr_warmup_iters=1)


def test_fits_and_oom_outcomes_match_the_plan(tmp_path):
    from engine_runs import SMALL, train

    probe = RunConfig(**{**SMALL, **FITS_CASE}, nodes=1, gpus_per_node=2, memory_limit_gb=1.0)
    need = plan(probe).required_gb

    small = round(0.5 * need, 3)
    assert not plan(probe.replace(memory_limit_gb=small)).fits
    run_dir = train(tmp_path, "oom", check=False, memory_limit_gb=small, **FITS_CASE)
    log = (run_dir / "log.txt").read_text()
    assert "[labkit] out of memory on rank" in log, log[-2000:]
    assert int((run_dir / "exit_code").read_text()) != 0

    large = round(1.5 * need, 3)
    assert plan(probe.replace(memory_limit_gb=large)).fits
    run_dir = train(tmp_path, "fits", memory_limit_gb=large, **FITS_CASE)
    assert (run_dir / "exit_code").read_text().strip() == "0"
    assert "out of memory" not in (run_dir / "log.txt").read_text()
    _check_param_lines(run_dir)  # PP = 2 with untied embeddings, a second layout
