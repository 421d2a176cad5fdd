"""The GPU check without a GPU: `make gpu-check` installs nothing from a registry and stops
clearly where CUDA is missing; the OOM demonstration's micro batches come from the planner; a
throughput run keeps its last iteration's memory and the results writer reads it.

What only a GPU can show is in tests/test_gpu.py and benchmarks/bench_gpu.py (``make gpu-check``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_results  # noqa: E402

from labkit.config import RunConfig  # noqa: E402
from labkit.planner import plan, stage_memory  # noqa: E402


# --- make gpu-check ----------------------------------------------------------------------------
def test_gpu_check_installs_nothing_from_a_registry():
    out = subprocess.run(["make", "-n", "-B", "gpu-check"], cwd=REPO, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    commands = out.replace("\\\n", " ").splitlines()
    pips = [c for c in commands if re.search(r"-m pip\b", c)]
    assert len(pips) == 2, out  # the carried wheels, then labkit itself
    for c in pips:
        assert " install " in c and "--no-index" in c and "--no-deps" in c, c
    assert not any(re.search(r"pip\S* download|ensurepip|get-pip", c) for c in commands), out
    # Nothing of the CPU set-up (make setup: .venv and its registry installs) is a prerequisite.
    assert ".venv/" not in out and "torch==" not in out, out
    assert any("-m venv --system-site-packages" in c for c in commands), out


def _python_without_torch() -> str | None:
    for exe in (shutil.which("python3"), getattr(sys, "_base_executable", None)):
        if exe and subprocess.run([exe, "-c", "import torch"], capture_output=True,
                                  timeout=60).returncode != 0:
            return exe
    return None


@pytest.mark.parametrize("interpreter", ["cpu torch", "no torch"])
def test_gpu_check_stops_where_cuda_is_missing(tmp_path, interpreter):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: make gpu-check would run for real")
    exe = sys.executable if interpreter == "cpu torch" else _python_without_torch()
    if exe is None:
        pytest.skip("every python3 here has torch")
    out = subprocess.run(["make", "-s", "gpu-check", f"GPU_PYTHON={exe}",
                          f"GPU_VENV={tmp_path}/venv"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    expected = (r"gpu-check needs a CUDA GPU: torch \S+ sees none" if interpreter == "cpu torch"
                else r"gpu-check needs a CUDA GPU and a CUDA build of torch: \S+ has no torch")
    assert re.search(expected, text), text[-2000:]
    assert not (tmp_path / "venv").exists()  # stopped before building anything


# --- the OOM demonstration's micro batches ----------------------------------------------------
def _gpt2_350m() -> RunConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return RunConfig.from_preset("gpt2-350m", nodes=1, gpus_per_node=1, device="cuda",
                                     precision="bf16", attention_backend="flash")


def _need(cfg: RunConfig, m: int, cap: float) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return plan(cfg.replace(memory_limit_gb=cap, micro_batch_size=m,
                                global_batch_size=m)).required_gb


def test_oom_micro_batches_come_from_the_planner():
    cfg = _gpt2_350m()
    choice = gpu_results.oom_choice(cfg, 12.0)
    # The plan, micro batch 3..6 (GB with the x1.10 margin): 10.83, 12.07, 13.30, 14.53.
    assert (choice.fits, choice.oom) == (3, 6)
    assert choice.fits_gb == pytest.approx(10.83, abs=0.01)
    assert choice.oom_gb == pytest.approx(14.53, abs=0.01)
    assert choice.oom_gb >= 1.2 * 12.0 > _need(cfg, 5, 12.0)  # the first >= 20 % over
    assert _need(cfg, 4, 12.0) > 12.0  # 3 is the largest that fits
    with pytest.raises(ValueError, match=r"micro batch 1 needs 8\.37 GB.*choose a cap"):
        gpu_results.oom_choice(cfg, 5.0)


# --- a throughput run on CPU, and the results writer -----------------------------------------
@pytest.mark.engine
def test_throughput_run_reports_its_last_iteration_and_results_are_written(tmp_path):
    from engine_runs import launch, make_config

    cfg, run_dir = make_config(tmp_path, "tput", train_iters=4, log_interval=2, num_layers=2,
                               gpus_per_node=1)
    proc = launch(cfg, run_dir, env={"LABKIT_INSTRUMENT": "0", "LABKIT_SAVE_CHECKPOINTS": "0"})
    assert proc.wait(timeout=300) == 0, (run_dir / "torchrun.out").read_text()[-3000:]
    log = (run_dir / "log.txt").read_text()
    mem = re.findall(r"\[Rank 0\] \(after (\d+) iterations\) memory \(MB\) \| allocated: [\d.]+ \| "
                     r"max allocated: ([\d.]+) \| reserved: [\d.]+ \| max reserved: ([\d.]+)", log)
    assert [int(m[0]) for m in mem] == [2, 4]  # the first report, then the last iteration's
    assert "[labkit] throughput run (LABKIT_INSTRUMENT=0)" in log
    assert "[labkit] no checkpoints (LABKIT_SAVE_CHECKPOINTS=0)" in log
    for folder in ("checkpoints", "timeline", "memory"):
        assert not (run_dir / folder).exists(), folder
    elapsed = [float(x) for x in re.findall(r"elapsed time per iteration \(ms\): ([\d.]+)", log)]
    assert len(elapsed) == 2

    r = gpu_results.run_result(run_dir, warmup=2, device=None)
    assert r["exit_code"] == 0 and r["diagnosis"] == [] and r["iterations"] == [4]
    assert r["median_iteration_ms"] == elapsed[1]
    assert r["tokens_per_s"] == pytest.approx(8 * 64 / (elapsed[1] / 1e3))  # gbs 8 x seq 64
    assert r["mfu"] is None  # a CPU has no peak FLOPs
    assert r["measured_gb"] == {"after_iteration": 4,
                                "max_allocated": pytest.approx(float(mem[1][1]) * 2**20 / 1e9),
                                "max_reserved": pytest.approx(float(mem[1][2]) * 2**20 / 1e9)}
    assert r["planned_gb"]["peak"] == pytest.approx(stage_memory(cfg, 0).total)
    assert r["static_memory_lines"][0].startswith("static memory on (tensor, pipeline) rank (0, 0)")
    live, planned = re.search(r"after iteration 2: ([\d.]+) GB in live tensors, planner ([\d.]+) GB",
                              log).groups()
    assert r["static_gb"] == {"measured": float(live), "planned": float(planned)}
    assert "workspace_gb" not in r  # measured on CUDA only

    out = tmp_path / "gpu-check"
    doc = {"env": gpu_results.environment(), "runs": {"tput": r}}
    assert json.loads(gpu_results.write_results(out, doc).read_text())["runs"]["tput"][
        "tokens_per_s"] == pytest.approx(r["tokens_per_s"])
    figures = gpu_results.write_figures(out, doc)
    assert [f.name for f in figures] == ["throughput.png", "memory.png"]
    assert all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in figures)


def test_h100_nvl_has_its_own_peak():
    """torch names the card "NVIDIA H100 NVL"; it must not read as an H100 SXM (989.4)."""
    from labkit.measured.hardware import peak_tflops

    assert peak_tflops("NVIDIA H100 NVL", "bf16") == 835.5  # 1,671 with sparsity, halved
    assert peak_tflops("NVIDIA H100 NVL", "fp8") == 1670.5
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.4  # the lent machine's card
    assert peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.5
