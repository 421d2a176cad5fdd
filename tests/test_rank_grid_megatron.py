"""The planner against megatron-core itself: real process groups and real GPTModels on CPU/gloo.

tests/megatron_layout_probe.py spawns gloo processes, calls megatron-core's
``initialize_model_parallel`` and builds its ``GPTModel`` on every rank. Each rank's TP / DP / PP
group and parameter count must equal what ``labkit.planner`` computes, exactly.
Two probe runs: 8 ranks (TP=2 x PP=2 x DP=2, interleaved with 2 virtual stages) and 1 rank.
Larger grids are compared with megatron-core's ``RankGenerator`` (the rank arithmetic
``initialize_model_parallel`` uses), which needs no processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from labkit.config import RunConfig
from labkit.planner import param_counts, rank_grid

PROBE = Path(__file__).with_name("megatron_layout_probe.py")

# Small models that still exercise every rule: tied/untied embeddings, GQA, SwiGLU, an ffn size
# that is not 4h, and vocabulary padding (1000 -> 1024 at TP=2 with make_vocab... = 128).
MODELS = [
    dict(num_layers=4, hidden_size=64, num_attention_heads=4, vocab_size=1000,
         seq_length=32, max_position_embeddings=32),
    dict(num_layers=8, hidden_size=64, num_attention_heads=8, num_query_groups=2,
         ffn_hidden_size=96, swiglu=True, untie_embeddings_and_output_weights=True,
         vocab_size=700, seq_length=16, max_position_embeddings=48),
]


def _probe(tmp_path: Path, world: int, tp: int, pp: int, vpp: int, cfgs: list[RunConfig]):
    models = [{**{k: getattr(c, k) for k in ("num_layers", "hidden_size", "num_attention_heads",
                                             "num_query_groups", "swiglu",
                                             "untie_embeddings_and_output_weights",
                                             "max_position_embeddings")},
               "ffn_hidden_size": c.ffn_size, "padded_vocab_size": c.padded_vocab_size}
              for c in cfgs]
    out = tmp_path / f"probe_w{world}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, str(PROBE), "--world", str(world), "--tp", str(tp), "--pp", str(pp),
         "--vpp", str(vpp), "--models", json.dumps(models), "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, f"probe failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def _cfg(model: dict, world: int, tp: int, pp: int, vpp: int) -> RunConfig:
    vs = model["num_layers"] // (pp * vpp) if vpp > 1 else None
    dp = world // (tp * pp)
    return RunConfig(**model, nodes=1, gpus_per_node=world, tensor_model_parallel_size=tp,
                     pipeline_model_parallel_size=pp, num_layers_per_virtual_pipeline_stage=vs,
                     micro_batch_size=1, global_batch_size=dp * pp * 2)


def test_groups_and_param_counts_tp2_pp2_dp2_interleaved(tmp_path):
    world, tp, pp, vpp = 8, 2, 2, 2
    cfgs = [_cfg(m, world, tp, pp, vpp) for m in MODELS]
    ranks = _probe(tmp_path, world, tp, pp, vpp, cfgs)
    grid = rank_grid(world, tp=tp, pp=pp, gpus_per_node=4)
    for r in ranks:
        rank = r["rank"]
        c = grid.coords(rank)
        assert (r["tp_rank"], r["dp_rank"], r["pp_rank"]) == (c["tp"], c["dp"], c["pp"]), rank
        for axis, groups in (("tp", grid.tp_groups), ("dp", grid.dp_groups),
                             ("pp", grid.pp_groups)):
            mine = next(g for g in groups if rank in g)
            assert r["groups"][axis] == mine, (rank, axis)
        for cfg, measured in zip(cfgs, r["params"], strict=True):
            assert param_counts(cfg)[(r["tp_rank"], r["pp_rank"])] == measured, (rank, cfg)


def test_param_counts_single_rank(tmp_path):
    # PP = 1: tied embeddings need no output weight; untied ones do.
    cfgs = [_cfg(m, 1, 1, 1, 1) for m in MODELS]
    (r,) = _probe(tmp_path, 1, 1, 1, 1, cfgs)
    assert r["params"] == [param_counts(c)[(0, 0)] for c in cfgs]


def test_groups_equal_megatron_rank_generator_for_many_sizes():
    from megatron.core.parallel_state import RankGenerator

    for world in (1, 2, 4, 6, 8, 12, 16, 24, 32, 64):
        for tp in (1, 2, 4, 8):
            for pp in (1, 2, 3, 4):
                for cp in (1, 2):
                    if world % (tp * pp * cp):
                        continue
                    dp = world // (tp * pp * cp)
                    gen = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order="tp-cp-ep-dp-pp")
                    grid = rank_grid(world, tp=tp, pp=pp, gpus_per_node=8, cp=cp)
                    for axis in ("tp", "cp", "dp", "pp"):
                        assert sorted(gen.get_ranks(axis)) == grid.groups()[axis], \
                            (world, tp, pp, cp, axis)
