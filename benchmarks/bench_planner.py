"""How fast is the planner? Enumerate and evaluate every layout of a 175B-class GPT on 4096 GPUs.

    .venv/bin/python benchmarks/bench_planner.py [--repeats 5]

The model is GPT-3 175B as in Narayanan et al. 2021 (96 layers, hidden 12288, 96 heads,
seq 2048, V 51200), bf16, selective recompute, distributed optimizer, global batch 1536, on
512 nodes x 8 GPUs of 80 GB. Every (TP, PP, DP, virtual PP) is tried: validation, memory per
stage, FLOPs, bubble, communication and the iteration-time estimate that orders them.
Prints figures; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

from labkit.config import RunConfig
from labkit.planner import format_layouts, plan_layouts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=512)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    args = ap.parse_args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = RunConfig(num_layers=96, hidden_size=12288, num_attention_heads=96,
                          seq_length=2048, max_position_embeddings=2048, vocab_size=51200,
                          device="cuda", precision="bf16", gpu_memory_gb=80.0,
                          recompute_granularity="selective", use_distributed_optimizer=True,
                          micro_batch_size=1, global_batch_size=1536)
    times = []
    layouts = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        layouts = plan_layouts(nodes=args.nodes, gpus_per_node=args.gpus_per_node, model=model,
                               micro_batch_size=1, global_batch_size=1536)
        times.append(time.perf_counter() - t0)
    world = args.nodes * args.gpus_per_node
    valid = sum(lp.valid for lp in layouts)
    fits = sum(lp.fits for lp in layouts)
    print(f"175B-class GPT on {world} GPUs: {len(layouts)} candidate layouts, {valid} valid, "
          f"{fits} fit in 80 GB")
    print(f"time to enumerate + evaluate all: median {statistics.median(times) * 1e3:.1f} ms, "
          f"min {min(times) * 1e3:.1f} ms over {args.repeats} runs "
          f"({statistics.median(times) / len(layouts) * 1e6:.0f} us per layout)")
    print("best 5 (by estimated iteration time, an estimate):")
    print(format_layouts(layouts[:5], show_invalid=False))


if __name__ == "__main__":
    main()
