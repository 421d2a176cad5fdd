"""The GPU check's figures: speed, MFU and memory of code/pretrain_gpt.py on one GPU (or more).

    make gpu-check                                  # the gpu tests, then this script
    .venv/bin/python benchmarks/bench_gpu.py        # this script alone (about 5 minutes on an H100)
    .venv/bin/python benchmarks/bench_gpu.py --require-cuda   # only: is there a CUDA GPU?

Every figure comes from a real run of code/pretrain_gpt.py under torchrun (NCCL, bf16, SDPA
attention) and its own log; nothing is asserted except that the runs happened. It prints:

* GPT-2 124M and a 350M-class GPT (24 layers, hidden 1024) at sequence 1024: tokens/s,
  model TFLOP/s per GPU (labkit.planner's FLOPs formula) and MFU (labkit.hardware's peak table),
  the median over the iterations after the warm-up;
* the planner's peak and static memory against the engine's measured ``max allocated``
  (``torch.cuda.max_memory_allocated``) and its static-memory line;
* a real CUDA out-of-memory: a micro batch the planner says does not fit under a device memory
  cap, run under that cap; the log's diagnosis (``gpu_oom`` expected);
* the NCCL version and transport lines of a run's own output (``NCCL_DEBUG=INFO``);
* the torch.profiler CUDA trace of the 124M run broken into compute / communication / memcpy /
  idle (labkit.profiling).

Record the printed figures in benchmarks/README.md ("GPU check").
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def require_cuda() -> int:
    """0 when torch sees a CUDA device; else a clear message and 2."""
    import torch

    if torch.cuda.is_available():
        print(f"gpu-check: {torch.cuda.device_count()} CUDA device(s), "
              f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}")
        return 0
    print(f"gpu-check needs a CUDA GPU: torch {torch.__version__} sees none "
          f"(torch.cuda.is_available() is False; CUDA build: {torch.version.cuda or 'no'}). "
          f"Run `make gpu-check` on a GPU node with a CUDA build of torch; the CPU checks are "
          f"`make test`.", file=sys.stderr)
    return 2


def _run(root: Path, name: str, *, env: dict[str, str] | None = None, **fields) -> Path:
    """One training run of code/pretrain_gpt.py on this node; returns its run directory."""
    from labkit.config import RunConfig

    nproc = fields.pop("nproc", 1)
    cfg = RunConfig.from_preset(fields.pop("preset"), name=name, nodes=1, gpus_per_node=nproc,
                                device="cuda", precision="bf16", attention_backend="flash",
                                lr=6e-4, min_lr=6e-5, **fields)
    run_dir = root / name
    run_dir.mkdir(parents=True)
    cfg.to_json(run_dir / "config.json")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           str(nproc), str(REPO / "code" / "pretrain_gpt.py"), "--config",
           str(run_dir / "config.json")]
    t0 = time.perf_counter()
    with open(run_dir / "torchrun.out", "w") as out:
        code = subprocess.call(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                               env={**os.environ, "OMP_NUM_THREADS": "4", **(env or {})})
    print(f"\n== {name}: exit {code} after {time.perf_counter() - t0:.0f} s ({run_dir})")
    return run_dir


def speed_and_memory(run_dir: Path, warmup: int) -> None:
    import torch

    from labkit.config import RunConfig
    from labkit.logs import parse_log
    from labkit.metrics import mfu, model_flops_per_iteration, tflops_per_gpu
    from labkit.planner import stage_memory

    cfg = RunConfig.from_json(run_dir / "config.json")
    log = parse_log(run_dir / "log.txt")
    its = log.iterations[log.iterations["iteration"] > warmup]
    if its.empty:
        print("   no iterations after the warm-up: see torchrun.out")
        return
    ms = statistics.median(its["elapsed_ms"])
    tflops = tflops_per_gpu(ms, model_flops_per_iteration(cfg), cfg.world_size)
    device = torch.cuda.get_device_name(0)
    print(f"   {cfg.num_layers} layers x hidden {cfg.hidden_size}, seq {cfg.seq_length}, micro "
          f"batch {cfg.micro_batch_size}, global batch {cfg.global_batch_size}, "
          f"{cfg.world_size} GPU(s)")
    print(f"   median iteration {ms:.1f} ms over iterations {warmup + 1}-{cfg.train_iters}: "
          f"{cfg.tokens_per_iteration / (ms / 1e3):,.0f} tokens/s, {tflops:.1f} TFLOP/s per "
          f"GPU, MFU {mfu(tflops, device=device, precision=cfg.precision):.1%} ({device})")
    stages = [stage_memory(cfg, r) for r in range(cfg.pp)]
    peak = max(st.total for st in stages)
    static = max(st.static for st in stages)
    if not log.memory.empty:
        measured = float(log.memory["max_allocated_mb"].max()) * 2**20 / 1e9
        print(f"   peak memory: planner {peak:.2f} GB, torch.cuda.max_memory_allocated "
              f"{measured:.2f} GB ({(peak - measured) / measured:+.1%})")
    for line in (run_dir / "log.txt").read_text().splitlines():
        if line.startswith("[labkit] static memory"):
            print(f"   {line[len('[labkit] '):]}")
    print(f"   static memory (planner, largest stage): {static:.3f} GB")


def oom(root: Path) -> None:
    """A micro batch the planner rejects under a cap, run under that cap."""
    import warnings

    from labkit.config import RunConfig
    from labkit.logs import diagnose
    from labkit.planner import plan

    cap = 12.0
    base = dict(preset="gpt2-350m", memory_limit_gb=cap, train_iters=3, log_interval=1,
                lr_warmup_iters=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        probe = RunConfig.from_preset("gpt2-350m", nodes=1, gpus_per_node=1, device="cuda",
                                      precision="bf16", attention_backend="flash",
                                      memory_limit_gb=cap)
        sizes = [(m, plan(probe.replace(micro_batch_size=m, global_batch_size=m)))
                 for m in (1, 2, 4, 8, 16, 32, 64)]
    fits = [m for m, p in sizes if p.fits]
    over = [(m, p) for m, p in sizes if not p.fits]
    if not over:
        print(f"   no micro batch up to 64 exceeds {cap} GB in the plan; skipped")
        return
    m, p = over[0]
    print(f"\n   under a {cap} GB cap the planner says micro batch {max(fits, default=0)} fits "
          f"and {m} does not (needs {p.required_gb:.1f} GB)")
    run_dir = _run(root, "oom_350m", micro_batch_size=m, global_batch_size=m, **base)
    exit_file = run_dir / "exit_code"
    failures = diagnose(run_dir / "log.txt", exit_code=int(exit_file.read_text())
                        if exit_file.is_file() else None)
    kinds = [f.kind for f in failures]
    print(f"   diagnosis of the run: {kinds or 'nothing'}"
          f"{' (predicted by the planner)' if kinds[:1] == ['gpu_oom'] else ' (NOT gpu_oom)'}")


def nccl(run_dir: Path) -> None:
    from labkit.logs import parse_log
    from labkit.logs.nccl import summarize

    parsed = parse_log(run_dir / "torchrun.out")
    channels = parsed.nccl.to_dict("records")
    print(f"   NCCL version (from the run's output): {parsed.nccl_version}; transport lines: "
          f"{len(channels)} {summarize(channels) if channels else '(one GPU: no peers)'}")


def profile(run_dir: Path) -> None:
    from labkit.profiling import profile_breakdown

    folder = run_dir / "profile"
    if not folder.is_dir():
        print("   no profiler trace")
        return
    for row in profile_breakdown(folder).to_dict("records"):
        total = row["total_ms"] or 1.0
        parts = ", ".join(f"{k[:-3]} {row[k]:.1f} ms ({row[k] / total:.0%})"
                          for k in ("compute_ms", "communication_ms", "memcpy_ms", "idle_ms"))
        print(f"   profiler, rank {row['rank']} ({row['device']}, {row['steps']} steps, "
              f"{total:.1f} ms): {parts}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--require-cuda", action="store_true",
                    help="only check that torch sees a CUDA device (exit 2 if not)")
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    a = ap.parse_args()
    code = require_cuda()
    if code or a.require_cuda:
        return code
    import torch

    gpus = torch.cuda.device_count()
    root = Path(tempfile.mkdtemp(prefix="bench_gpu_"))
    t0 = time.perf_counter()
    try:
        nccl_env = {"NCCL_DEBUG": "INFO"}
        small = _run(root, "gpt2_124m", preset="gpt2-124m", micro_batch_size=8,
                     global_batch_size=64, train_iters=30, log_interval=1, lr_warmup_iters=5,
                     torch_profiler=True, env=nccl_env)
        speed_and_memory(small, warmup=10)
        profile(small)
        nccl(small)
        medium = _run(root, "gpt2_350m", preset="gpt2-350m", micro_batch_size=8,
                      global_batch_size=32, train_iters=20, log_interval=1, lr_warmup_iters=5)
        speed_and_memory(medium, warmup=8)
        if gpus >= 2:
            dp = _run(root, "gpt2_124m_dp2", preset="gpt2-124m", micro_batch_size=8,
                      global_batch_size=64, train_iters=20, log_interval=1, lr_warmup_iters=5,
                      nproc=2, env=nccl_env)
            speed_and_memory(dp, warmup=8)
            nccl(dp)
        oom(root)
    finally:
        if a.keep:
            print(f"\nrun directories kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(f"\nbench_gpu: {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
