"""The GPU check's benchmark: speed, MFU and memory of code/pretrain_gpt.py on one GPU (or more).

    make gpu-check                          # on the GPU machine: this script, then the gpu tests
    .venv-gpu/bin/python benchmarks/bench_gpu.py --out runs/gpu-check    # this script alone
    python3 benchmarks/bench_gpu.py --require-cuda     # only: is there a CUDA GPU? (stdlib + torch)
    python3 benchmarks/bench_gpu.py --summary runs/gpu-check   # the kept results, exit 1 on failures

Every figure comes from a real run of code/pretrain_gpt.py under torchrun (NCCL, bf16, SDPA
attention; megatron-core's torch.compile fusions only where ``LABKIT_FUSIONS=1`` asks, as in the
engine) and its own log. Throughput runs switch the
lessons' instrumentation and the checkpoints off (``LABKIT_INSTRUMENT=0``,
``LABKIT_SAVE_CHECKPOINTS=0``). Kept under ``--out`` (default runs/gpu-check/):

* ``results.json``: the device, torch / CUDA / NCCL versions, and per run its tokens/s, model
  TFLOP/s per GPU, MFU (labkit.measured.hardware's peak), the planner's peak and static memory against
  the measured ones (benchmarks/gpu_results.py), the CUDA workspace measured at start-up;
  rewritten after every step, so a run stopped by its time limit keeps what it measured;
* ``throughput.png``, ``memory.png``, ``profile.png`` (the 124M run's torch.profiler trace as
  compute / communication / memcpy / idle);
* ``runs/NAME/``: each training's config.json, log.txt and torchrun.out (its traceback if it
  failed); ``failures/STEP.txt``: the traceback of a step of this script that failed.

The runs: GPT-2 124M (with the profiler and ``NCCL_DEBUG=INFO``) and a 350M-class GPT (24 layers,
hidden 1024) at sequence 1024; with two GPUs 124M on DP=2; the out-of-memory demonstration
under a 12 GB cap: the largest micro batch the planner says fits (it must train) and the
smallest it says needs >= 20 % more than the cap (it must fail as ``gpu_oom``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

THROUGHPUT_ENV = {"LABKIT_INSTRUMENT": "0", "LABKIT_SAVE_CHECKPOINTS": "0"}
OOM_CAP_GB = 12.0
STEP_S = 45.0
"""What one step (a torchrun start, torch.compile and a short training) is given: a step is
skipped, and said so in results.json, when less than this is left of ``--budget-s``."""


def require_cuda() -> int:
    """0 when torch sees a CUDA device; else a clear message and 2."""
    try:
        import torch
    except ImportError:
        print(f"gpu-check needs a CUDA GPU and a CUDA build of torch: {sys.executable} has no "
              f"torch. Run `make gpu-check` on a GPU machine whose python3 has a CUDA torch "
              f"(or name that interpreter: make gpu-check GPU_PYTHON=/path/to/python3); the CPU "
              f"checks are `make test`.", file=sys.stderr)
        return 2
    if torch.cuda.is_available():
        print(f"gpu-check: {torch.cuda.device_count()} CUDA device(s), "
              f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}")
        return 0
    print(f"gpu-check needs a CUDA GPU: torch {torch.__version__} sees none "
          f"(torch.cuda.is_available() is False; CUDA build: {torch.version.cuda or 'no'}). "
          f"Run `make gpu-check` on a GPU node with a CUDA build of torch; the CPU checks are "
          f"`make test`.", file=sys.stderr)
    return 2


IMPORTS = ("torch", "megatron.core", "ahocorasick_rs", "yaml", "pandas", "matplotlib", "psutil",
           "tokenizers", "tensorboard", "tqdm", "pytest")
"""What the GPU check imports: the image's packages, the carried wheels and labkit's own."""


def check_imports() -> int:
    """0 when every module of ``IMPORTS`` imports here; else which do not, and 2."""
    import importlib

    missing = []
    for name in IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            missing.append(f"{name} ({exc})")
    if missing:
        print(f"gpu-check: {sys.executable} cannot import {'; '.join(missing)}. Add the "
              f"package to GPU_WHEEL_PINS in the Makefile, run make gpu-wheels where the "
              f"registry is reachable and carry gpu-wheels/ again.", file=sys.stderr)
        return 2
    return 0


class Bench:
    """The steps, their results and failures, written to ``out`` as they come."""

    def __init__(self, out: Path, budget_s: float):
        from gpu_results import environment

        self.out, self.budget_s, self.t0 = out, budget_s, time.perf_counter()
        self.doc = {"env": environment(), "runs": {}, "failures": {}, "skipped": [],
                    "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        (out / "runs").mkdir(parents=True, exist_ok=True)
        self.save()

    def save(self) -> None:
        from gpu_results import write_results

        self.doc["elapsed_s"] = round(time.perf_counter() - self.t0, 1)
        write_results(self.out, self.doc)

    def step(self, name: str, fn, *args, need_s: float = STEP_S, **kwargs):
        """Run one step if ``need_s`` is left of the budget; a failure is kept (traceback in
        failures/NAME.txt), never raised."""
        left = self.budget_s - (time.perf_counter() - self.t0)
        if left < need_s:
            print(f"\n== {name}: skipped, {left:.0f} s left of the {self.budget_s:.0f} s budget")
            self.doc["skipped"].append(name)
            self.save()
            return None
        try:
            return fn(*args, **kwargs)
        except Exception:  # noqa: BLE001 - every failure is kept and the next step runs
            tb = traceback.format_exc()
            print(f"\n== {name} FAILED:\n{tb}", file=sys.stderr)
            (self.out / "failures").mkdir(exist_ok=True)
            (self.out / "failures" / f"{name}.txt").write_text(tb)
            self.doc["failures"][name] = tb.strip().splitlines()[-1]
            return None
        finally:
            self.save()

    def train(self, name: str, *, env: dict[str, str] | None = None, warmup: int = 0,
              **fields) -> dict:
        """One training of code/pretrain_gpt.py on this node; its figures go into results."""
        from gpu_results import run_result

        from labkit.config import RunConfig

        nproc = fields.pop("nproc", 1)
        cfg = RunConfig.from_preset(fields.pop("preset"), name=name, nodes=1, gpus_per_node=nproc,
                                    device="cuda", precision="bf16", attention_backend="flash",
                                    lr=6e-4, min_lr=6e-5, **fields)
        run_dir = self.out / "runs" / name
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        cfg.to_json(run_dir / "config.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
               str(nproc), str(REPO / "code" / "pretrain_gpt.py"), "--config",
               str(run_dir / "config.json"), "--no-resume"]
        t0 = time.perf_counter()
        with open(run_dir / "torchrun.out", "w") as out:
            code = subprocess.call(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, "OMP_NUM_THREADS": "4",
                                        "PYTHONUNBUFFERED": "1", **(env or {})})
        shutil.rmtree(run_dir / "data_cache", ignore_errors=True)
        result = run_result(run_dir, warmup=warmup, device=self.doc["env"]["device"])
        result["wall_s"] = round(time.perf_counter() - t0, 1)
        self.doc["runs"][name] = result
        print(f"\n== {name}: exit {code} after {result['wall_s']:.0f} s")
        _print_run(result)
        return result


def _print_run(r: dict) -> None:
    if r.get("tokens_per_s"):
        mfu = f"MFU {r['mfu']:.1%}" if r.get("mfu") is not None else "no MFU"
        print(f"   median iteration {r['median_iteration_ms']:.1f} ms: "
              f"{r['tokens_per_s']:,.0f} tokens/s, {r['model_tflops_per_gpu']:.1f} TFLOP/s per "
              f"GPU, {mfu}")
    if r.get("measured_gb"):
        m = r["measured_gb"]
        print(f"   peak memory after iteration {m['after_iteration']}: max allocated "
              f"{m['max_allocated']:.2f} GB, max reserved {m['max_reserved']:.2f} GB; planner "
              f"{r['planned_gb']['peak']:.2f} GB ({r['planned_over_measured_peak']:+.1%})")
    for line in r.get("static_memory_lines", []) + [r.get("workspace_line", "")]:
        if line:
            print(f"   {line}")
    if r.get("diagnosis"):
        print(f"   diagnosis: {r['diagnosis']}")


def oom(bench: Bench) -> None:
    """The largest micro batch the planner fits under the cap trains; one it says needs >= 20 %
    more than the cap fails as gpu_oom."""
    from dataclasses import asdict

    from gpu_results import oom_choice

    from labkit.config import RunConfig

    probe = RunConfig.from_preset("gpt2-350m", nodes=1, gpus_per_node=1, device="cuda",
                                  precision="bf16", attention_backend="flash")
    choice = oom_choice(probe, OOM_CAP_GB)
    bench.doc["oom"] = asdict(choice)
    print(f"\n   under a {OOM_CAP_GB} GB cap the planner fits micro batch {choice.fits} "
          f"({choice.fits_gb:.2f} GB with its margin) and says {choice.oom} needs "
          f"{choice.oom_gb:.2f} GB ({choice.oom_gb / choice.cap_gb - 1:+.0%} against the cap)")
    common = dict(preset="gpt2-350m", memory_limit_gb=OOM_CAP_GB, train_iters=3, log_interval=1,
                  lr_warmup_iters=1, env=THROUGHPUT_ENV)
    fits = bench.train("oom_fits_350m", micro_batch_size=choice.fits,
                       global_batch_size=choice.fits, **common)
    over = bench.train("oom_350m", micro_batch_size=choice.oom, global_batch_size=choice.oom,
                       **common)
    bench.doc["oom"].update(fits_trained=fits["exit_code"] == 0,
                            oom_diagnosed=over["diagnosis"][:1] == ["gpu_oom"])
    print(f"   micro batch {choice.fits} trained: {fits['exit_code'] == 0}; micro batch "
          f"{choice.oom} diagnosed as gpu_oom: {over['diagnosis'][:1] == ['gpu_oom']}")


def profile(bench: Bench, run: str) -> None:
    from gpu_results import _save

    from labkit.measured.plots import plot_profile_breakdown
    from labkit.measured.profiling import profile_breakdown

    folder = bench.out / "runs" / run / "profile"
    df = profile_breakdown(folder)
    bench.doc["profile"] = df.to_dict("records")
    for row in bench.doc["profile"]:
        total = row["total_ms"] or 1.0
        print(f"   profiler, rank {row['rank']} ({row['steps']} steps, {total:.1f} ms): " + ", ".join(
            f"{k[:-3]} {row[k]:.1f} ms ({row[k] / total:.0%})"
            for k in ("compute_ms", "communication_ms", "memcpy_ms", "idle_ms")))
    ax = plot_profile_breakdown(df, normalize=True)
    _save(ax.figure, bench.out / "profile.png")
    shutil.rmtree(folder)  # tens of MB of Chrome trace; its breakdown is kept above


def nccl(bench: Bench, run: str) -> None:
    from labkit.logs import parse_log
    from labkit.logs.nccl import summarize

    parsed = parse_log(bench.out / "runs" / run / "torchrun.out")
    channels = parsed.nccl.to_dict("records")
    bench.doc["runs"][run]["nccl"] = {"version_in_log": parsed.nccl_version,
                                      "transport_lines": len(channels),
                                      "summary": summarize(channels) if channels else None}
    print(f"   NCCL (from the run's output): {parsed.nccl_version}; transport lines: "
          f"{len(channels)}")


def compile_probe(bench: Bench) -> None:
    """torch.compile on this device (Inductor, Triton, a C compiler for Triton's launcher), the
    engine's fusions need it: where it fails, the runs go on with ``LABKIT_FUSIONS=0`` and
    results.json says so, rather than every training failing the same way."""
    import torch

    before = os.environ.get("LABKIT_FUSIONS")
    bench.doc["fusions"] = False
    os.environ["LABKIT_FUSIONS"] = "0"
    fn = torch.compile(lambda x, b: torch.nn.functional.gelu(x + b, approximate="tanh"))
    x = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    # Against the float32 answer, within bf16's own rounding (eps 2**-8, twice over): the fused
    # kernel rounds once where eager bf16 rounds after each op, so the two bf16 results differ
    # by an ulp here and there and comparing them to each other fails a correct compiler.
    exact = torch.nn.functional.gelu(x.float() + x[0].float(), approximate="tanh")
    torch.testing.assert_close(fn(x, x[0]).float(), exact, rtol=2 ** -7, atol=2 ** -7)
    if before is None:
        os.environ.pop("LABKIT_FUSIONS")
    else:
        os.environ["LABKIT_FUSIONS"] = before
    bench.doc["fusions"] = os.environ.get("LABKIT_FUSIONS", "0") not in ("0", "false", "no")


def summary(out: Path) -> int:
    """Print the kept results; 1 when a step or a gpu test failed (pytest.xml), else 0."""
    if not (out / "results.json").is_file():
        print(f"gpu-check: no {out}/results.json: the benchmark did not start (see above)")
        return 1
    doc = json.loads((out / "results.json").read_text())
    print(f"\ngpu-check on {doc['env'].get('device')} (torch {doc['env'].get('torch')}, CUDA "
          f"{doc['env'].get('cuda')}, NCCL {doc['env'].get('nccl')}), in {out}/:")
    for r in doc["runs"].values():
        print(f"  {r['name']}: exit {r['exit_code']}")
        _print_run(r)
    bad = dict(doc["failures"])
    xml = out / "pytest.xml"
    if xml.is_file():
        import xml.etree.ElementTree as ET

        suite = ET.parse(xml).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        print(f"  gpu tests: {suite.get('tests')} run, {failed} failed, "
              f"{suite.get('skipped')} skipped (pytest.txt)")
        if failed:
            bad["gpu tests"] = f"{failed} failed"
    else:
        bad["gpu tests"] = "no pytest.xml"
    for name, why in bad.items():
        print(f"  FAILED {name}: {why}")
    for name in doc["skipped"]:
        print(f"  skipped (time budget): {name}")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--require-cuda", action="store_true",
                    help="only check that torch sees a CUDA device (exit 2 if not)")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "gpu-check",
                    help="where results.json, the figures and the runs are kept")
    ap.add_argument("--budget-s", type=float, default=270.0,
                    help="seconds for all steps; a step is skipped when less than 45 s is left")
    ap.add_argument("--summary", type=Path, metavar="OUT",
                    help="print the results kept in OUT and exit 1 if anything failed")
    ap.add_argument("--check-imports", action="store_true",
                    help="only check that what the GPU check imports is installed (exit 2 if not)")
    a = ap.parse_args()
    if a.check_imports:
        return check_imports()
    if a.summary:
        return summary(a.summary)
    code = require_cuda()
    if code or a.require_cuda:
        return code
    import torch

    bench = Bench(a.out, a.budget_s)
    bench.step("compile_probe", compile_probe, bench, need_s=0)
    nccl_env = {**THROUGHPUT_ENV, "NCCL_DEBUG": "INFO"}
    small = bench.step("gpt2_124m", bench.train, "gpt2_124m", preset="gpt2-124m",
                       micro_batch_size=8, global_batch_size=64, train_iters=30, log_interval=1,
                       lr_warmup_iters=5, torch_profiler=True, env=nccl_env, warmup=10)
    if small:
        bench.step("profile", profile, bench, "gpt2_124m", need_s=0)
        bench.step("nccl", nccl, bench, "gpt2_124m", need_s=0)
    bench.step("gpt2_350m", bench.train, "gpt2_350m", preset="gpt2-350m", micro_batch_size=8,
               global_batch_size=32, train_iters=20, log_interval=1, lr_warmup_iters=5,
               env=THROUGHPUT_ENV, warmup=8)
    bench.step("oom", oom, bench, need_s=2 * STEP_S)
    if torch.cuda.device_count() >= 2:
        if bench.step("gpt2_124m_dp2", bench.train, "gpt2_124m_dp2", preset="gpt2-124m",
                      micro_batch_size=8, global_batch_size=64, train_iters=20, log_interval=1,
                      lr_warmup_iters=5, nproc=2, env=nccl_env, warmup=8):
            bench.step("nccl_dp2", nccl, bench, "gpt2_124m_dp2", need_s=0)
    from gpu_results import write_figures

    bench.step("figures", write_figures, bench.out, bench.doc, need_s=0)
    print(f"\nbench_gpu: {time.perf_counter() - bench.t0:.0f} s; results in {bench.out}")
    return 1 if bench.doc["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
