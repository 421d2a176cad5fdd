"""Engine speed on this machine: launch -> first iteration, iterations per minute, peak RSS.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_engine_cpu.py            # tiny, TP=2 x PP=2
    .venv/bin/python benchmarks/bench_engine_cpu.py --tp 1 --pp 1 --dp 2 --iters 30

Runs code/pretrain_gpt.py for real under torchrun (CPU, gloo) on the `tiny` preset and prints
numbers; it asserts nothing. Peak RSS is sampled from /proc every 50 ms for each worker (its
RANK read from the process environment). Record results in benchmarks/README.md.

The same script takes ``--device cuda --preset gpt2-124m --precision bf16 --nproc 1`` for a
GPU figure (not yet measured: no GPU was lent to the session that wrote it).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from labkit.config import RunConfig  # noqa: E402

ITER_RE = re.compile(r"iteration\s+(\d+)/\s*(\d+) \|.*elapsed time per iteration \(ms\): ([\d.]+)"
                     r".*throughput per GPU \(TFLOP/s/GPU\): ([\d.]+)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--micro-batch-size", type=int, default=2)
    ap.add_argument("--global-batch-size", type=int, default=8)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--precision", default="fp32")
    a = ap.parse_args()

    world = a.tp * a.pp * a.dp
    tmp = Path(tempfile.mkdtemp(prefix="bench_engine_"))
    cfg = RunConfig.from_preset(
        a.preset, name="bench", nodes=1, gpus_per_node=world, device=a.device,
        precision=a.precision, tensor_model_parallel_size=a.tp, pipeline_model_parallel_size=a.pp,
        micro_batch_size=a.micro_batch_size, global_batch_size=a.global_batch_size,
        train_iters=a.iters, log_interval=1, lr_warmup_iters=min(3, a.iters))
    run_dir = tmp / "bench"
    run_dir.mkdir()
    cfg.to_json(run_dir / "config.json")
    if not (REPO / "data" / "corpus_text_document.idx").is_file():
        subprocess.run([sys.executable, str(REPO / "code" / "prepare_data.py")], check=True)

    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           str(world), str(REPO / "code" / "pretrain_gpt.py"), "--config",
           str(run_dir / "config.json"), "--no-resume"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    peak: dict[int, int] = {}
    first_at = last_at = None
    rows: list[tuple[int, float, float]] = []
    log = run_dir / "log.txt"
    seen = 0
    while True:
        done = proc.poll() is not None
        text = log.read_text() if log.exists() else ""
        for line in text[seen:].splitlines(keepends=True):
            if not line.endswith("\n"):
                break  # a line still being written
            seen += len(line)
            m = ITER_RE.search(line)
            if m:
                now = time.perf_counter() - t0
                first_at = first_at if first_at is not None else now
                last_at = now
                rows.append((int(m.group(1)), float(m.group(3)), float(m.group(4))))
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        for child in children:
            try:
                rank = int(child.environ().get("RANK", "-1"))
                if rank >= 0:
                    peak[rank] = max(peak.get(rank, 0), child.memory_info().rss)
            except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
                pass
        if done:
            break
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not rows:
        print(f"training failed (exit {proc.returncode}); see {run_dir}/log.txt")
        return 1

    import torch

    steady = [ms for it, ms, _ in rows if it > 1]
    per_min = 60.0 / ((last_at - first_at) / (len(rows) - 1)) if len(rows) > 1 else float("nan")
    print(f"engine benchmark: preset {a.preset}, TP={a.tp} x PP={a.pp} x DP={a.dp} = {world} "
          f"process(es), device {a.device}, {a.precision}, micro batch {a.micro_batch_size}, "
          f"global batch {a.global_batch_size}, seq {cfg.seq_length}, {a.iters} iterations")
    print(f"versions: python {sys.version.split()[0]}, torch {torch.__version__}, "
          f"megatron-core {_version('megatron-core')}; {os.cpu_count()} CPU cores; "
          f"load average {os.getloadavg()[0]:.1f}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"seconds from launch to first iteration: {first_at:.1f}")
    print(f"iterations per minute (wall clock, after the first): {per_min:.1f}")
    print(f"median elapsed time per iteration (ms, engine's own timer): "
          f"{sorted(steady)[len(steady) // 2] if steady else float('nan'):.1f}")
    print(f"tokens per second: {cfg.tokens_per_iteration * per_min / 60.0:,.0f}")
    sys.path.insert(0, str(REPO / "code"))
    from engine_log import model_flops_per_iteration

    tflops = model_flops_per_iteration(cfg) * per_min / 60.0 / world / 1e12
    print(f"model TFLOP/s per process: {tflops:.4f}")
    for rank in sorted(peak):
        print(f"peak RSS rank {rank}: {peak[rank] / 2**20:.0f} MiB")
    print(f"total wall time: {wall:.1f} s (run dir {run_dir})")
    return 0


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


if __name__ == "__main__":
    sys.exit(main())
