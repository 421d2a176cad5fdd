"""A real torchrun job made to hang, for the hang watchdog tests.

Every rank joins a gloo process group and runs steps of one all-reduce each; rank 0 prints a
Megatron-format iteration line per step (what the watchdog watches), every rank prints a
``[rankN]:`` progress line (how a log names the rank, as torch's own logging does).
With ``extra.hang_at = K`` in the config, rank ``extra.hang_rank`` (default 1) sleeps instead
of joining step K's all-reduce: the other ranks then wait inside the collective, exactly like a
rank that is stuck or lost in a real job. Without ``hang_at`` it finishes normally.

    torchrun --nproc_per_node=2 tests/programs/hang_job.py --config RUN_DIR/config.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def stuck_rank_sleeps(seconds: float) -> None:
    # A named frame, so a stack dump shows exactly where the stuck rank is.
    time.sleep(seconds)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    cfg = json.load(open(ap.parse_args().config))
    extra = cfg.get("extra", {})
    hang_at, hang_rank = extra.get("hang_at"), int(extra.get("hang_rank", 1))
    iters = int(extra.get("iters", 5))
    # A bounded process-group timeout: a stuck job still ends on its own after a while.
    dist.init_process_group("gloo", timeout=timedelta(seconds=float(extra.get("pg_timeout", 600))))
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"[rank{rank}]: joined the process group ({world} ranks)", flush=True)
    x = torch.ones(1024)
    for it in range(1, iters + 1):
        t0 = time.perf_counter()
        if it == hang_at and rank == hang_rank:
            print(f"[rank{rank}]: step {it}: sleeping instead of joining the all-reduce",
                  flush=True)
            stuck_rank_sleeps(3600)
        dist.all_reduce(x)
        time.sleep(float(extra.get("step_s", 0.2)))
        print(f"[rank{rank}]: step {it} done", flush=True)
        if rank == 0:
            ms = (time.perf_counter() - t0) * 1e3
            print(f" [{time.strftime('%Y-%m-%d %H:%M:%S')}] iteration {it:>8}/{iters:>8} | "
                  f"elapsed time per iteration (ms): {ms:.1f} |", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "code"))
    from engine_stop import end_process

    end_process(main())  # not the interpreter's teardown: code/engine_stop.py says why
