"""A small real torchrun program for the job tests: a gloo all-reduce across every rank.

Launched like the engine (``torchrun ... allreduce_job.py --config RUN_DIR/config.json``), it
prints Megatron's world-size line and one iteration line per step, so the job tests see real
distributed start-up without training a model. ``extra.fail=true`` in the config makes rank 0
raise after the all-reduce; ``extra.sleep`` (seconds) keeps it running for cancel/timeout tests.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    cfg = json.load(open(ap.parse_args().config))
    extra = cfg.get("extra", {})
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tp, pp = cfg["tensor_model_parallel_size"], cfg["pipeline_model_parallel_size"]
    if rank == 0:
        print(f"using world size: {world}, data-parallel size: {world // (tp * pp)}, "
              f"context-parallel size: 1, tensor-model-parallel size: {tp}, "
              f"pipeline-model-parallel size: {pp}", flush=True)
    t = torch.ones(4) * (rank + 1)
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    assert t[0].item() == expected, (t, expected)
    iters = int(extra.get("iters", 3))
    for it in range(1, iters + 1):
        time.sleep(float(extra.get("sleep", 0)) / iters)
        dist.barrier()
        if rank == 0:
            print(f" [{time.strftime('%Y-%m-%d %H:%M:%S')}] iteration {it:>8}/{iters:>8} | "
                  f"consumed samples: {it * cfg['global_batch_size']:>12} | "
                  f"elapsed time per iteration (ms): 1.0 | lm loss: {1.0 / it:.6E} |", flush=True)
    if extra.get("fail") and rank == 0:
        raise RuntimeError(f"allreduce_job: failing on purpose (rank {rank} of {world})")
    print(f"rank {rank} on {os.uname().nodename}: all-reduce ok ({t[0].item():.0f})", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "code"))
    from engine_stop import end_process

    end_process(main())  # not the interpreter's teardown: code/engine_stop.py says why
