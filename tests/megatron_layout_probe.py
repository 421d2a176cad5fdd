"""Ask megatron-core itself: its process groups and per-rank GPTModel parameter counts.

Spawns ``--world`` gloo processes on 127.0.0.1, calls megatron-core's real
``parallel_state.initialize_model_parallel(tp, pp)``, records each rank's TP / DP / PP group
ranks and, for every model given, builds megatron-core's ``GPTModel`` for that rank (local layer
spec, learned absolute positions, as code/pretrain_gpt.py builds it) and counts its parameters.
Writes ``rank<N>.json`` per rank to ``--out``. Used by tests/test_rank_grid_megatron.py.

    python tests/megatron_layout_probe.py --world 4 --tp 2 --pp 2 --out /tmp/probe \\
        --models '[{"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, ...}]'
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _count_params(m: dict, tp: int, pp: int, vpp: int) -> int:
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    tcfg = TransformerConfig(
        num_layers=m["num_layers"], hidden_size=m["hidden_size"],
        num_attention_heads=m["num_attention_heads"], num_query_groups=m.get("num_query_groups"),
        ffn_hidden_size=m["ffn_hidden_size"], gated_linear_unit=m.get("swiglu", False),
        activation_func=(torch.nn.functional.silu if m.get("swiglu")
                         else torch.nn.functional.gelu),
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
        use_cpu_initialization=True, perform_initialization=False,
        pipeline_dtype=torch.float32, params_dtype=torch.float32,
        bias_activation_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
        bias_dropout_fusion=False, gradient_accumulation_fusion=False,
    )
    total = 0
    for vp_stage in range(vpp):
        stage = vp_stage if vpp > 1 else None
        model = GPTModel(
            config=tcfg, transformer_layer_spec=get_gpt_layer_local_spec(),
            vocab_size=m["padded_vocab_size"], max_sequence_length=m["max_position_embeddings"],
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage),
            share_embeddings_and_output_weights=not m.get("untie_embeddings_and_output_weights"),
            position_embedding_type="learned_absolute", vp_stage=stage,
        )
        total += sum(p.numel() for p in model.parameters())
    return total


def worker(rank: int, world: int, port: int, tp: int, pp: int, vpp: int, models: list[dict],
           out: str) -> None:
    import sys

    import torch
    import torch.distributed as dist

    # megatron-core moves tied output weights with .cuda(); the engine's CPU redirect handles it.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "code"))
    import cpu_compat
    from megatron.core import parallel_state as ps

    cpu_compat.apply()
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                 virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None)
    groups = {
        "tp": dist.get_process_group_ranks(ps.get_tensor_model_parallel_group()),
        "dp": dist.get_process_group_ranks(ps.get_data_parallel_group()),
        "pp": dist.get_process_group_ranks(ps.get_pipeline_model_parallel_group()),
    }
    params = [_count_params(m, tp, pp, vpp) for m in models]
    result = {"rank": rank, "tp_rank": ps.get_tensor_model_parallel_rank(),
              "pp_rank": ps.get_pipeline_model_parallel_rank(),
              "dp_rank": ps.get_data_parallel_rank(), "groups": groups, "params": params}
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    from engine_stop import end_process

    end_process(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--vpp", type=int, default=1)
    ap.add_argument("--models", default="[]", help="JSON list of model dicts")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import torch.distributed as dist
    import torch.multiprocessing as mp

    Path(a.out).mkdir(parents=True, exist_ok=True)
    # The store is served from here, on a port the OS gives and held until the workers are done:
    # a port looked up, released and bound again later could be taken in between.
    store = dist.TCPStore("127.0.0.1", 0, a.world, is_master=True, wait_for_workers=False)
    mp.spawn(worker, args=(a.world, store.port, a.tp, a.pp, a.vpp, json.loads(a.models), a.out),
             nprocs=a.world, join=True)


if __name__ == "__main__":
    main()
