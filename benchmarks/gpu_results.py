"""What the GPU check keeps: one run's figures from its own files, results.json, the PNG figures,
and the micro batches of the out-of-memory demonstration. No CUDA needed (tested on CPU runs).

``run_result(run_dir)`` reads a finished run of code/pretrain_gpt.py (config.json, log.txt,
exit_code) and returns its figures: the median iteration time after the warm-up, tokens/s,
model TFLOP/s per GPU, MFU (``None`` on a device without a peak in labkit.measured.hardware, e.g. a
CPU), the planner's peak and static memory against the measured ones. Measured peak memory is
the engine's memory line after the *last* iteration, whose peaks the engine resets before that
iteration: the steady state, with the optimizer's state allocated (after iteration 1 it is not
yet). Both ``max allocated`` and ``max reserved`` are kept: a cap
(``torch.cuda.set_per_process_memory_fraction``) acts on reserved memory.

``write_results(out, doc)`` writes ``out/results.json``; ``write_figures(out, doc)`` the PNGs.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MIB_TO_GB = 2**20 / 1e9  # the engine's memory lines are in MiB ("MB" in Megatron's format)
OOM_OVER = 1.20
"""The OOM demonstration's micro batch needs at least this much more than the cap in the plan,
so that the run fails for certain and not by the planner's margin (x 1.10) alone."""


STATIC_RE = re.compile(r"after iteration \d+: ([\d.]+) GB in live tensors, planner ([\d.]+) GB")
WORKSPACE_RE = re.compile(r"CUDA workspace measured at start-up: ([\d.]+) GB")


@dataclass(frozen=True)
class OomChoice:
    """The micro batches of the out-of-memory demonstration under ``cap_gb``."""

    cap_gb: float
    fits: int
    """The largest micro batch the planner says fits: trained, it must not run out of memory."""
    fits_gb: float
    oom: int
    """The smallest micro batch whose planned need is at least ``OOM_OVER`` x the cap."""
    oom_gb: float


def oom_choice(cfg: Any, cap_gb: float, *, over: float = OOM_OVER, largest: int = 256) -> OomChoice:
    """Micro batches 1..``largest`` of ``cfg`` (one micro batch per iteration) under ``cap_gb``,
    judged by ``labkit.planner.plan``'s ``required_gb`` (peak stage x the allocator margin)."""
    import warnings

    from labkit.planner import plan

    need: dict[int, float] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        capped = cfg.replace(memory_limit_gb=cap_gb)
        for m in range(1, largest + 1):
            p = plan(capped.replace(micro_batch_size=m, global_batch_size=m))
            need[m] = p.required_gb
            if p.required_gb >= over * cap_gb:
                break
    fits = [m for m, gb in need.items() if gb <= cap_gb]
    oom = [m for m, gb in need.items() if gb >= over * cap_gb]
    if not fits or not oom:
        raise ValueError(
            f"no OOM demonstration for {cfg.num_layers} layers x hidden {cfg.hidden_size} under "
            f"{cap_gb} GB: micro batch 1 needs {need[1]:.2f} GB and {max(need)} needs "
            f"{need[max(need)]:.2f} GB in the plan; choose a cap between them "
            f"(cap_gb < {need[max(need)] / over:.2f} and >= {need[1]:.2f})")
    return OomChoice(cap_gb=cap_gb, fits=max(fits), fits_gb=need[max(fits)], oom=min(oom),
                     oom_gb=need[min(oom)])


def _exit_code(run_dir: Path) -> int | None:
    f = run_dir / "exit_code"
    return int(f.read_text()) if f.is_file() and f.read_text().strip() else None


def run_result(run_dir: Path, *, warmup: int, device: str | None = None) -> dict[str, Any]:
    """The figures of one finished run (see the module docstring); ``device`` names the GPU for
    MFU. Iterations up to ``warmup`` are left out of the median."""
    from labkit.config import RunConfig
    from labkit.errors import LabkitError
    from labkit.logs import diagnose, parse_log
    from labkit.measured.metrics import mfu, model_flops_per_iteration, tflops_per_gpu
    from labkit.planner import stage_memory

    cfg = RunConfig.from_json(run_dir / "config.json")
    code = _exit_code(run_dir)
    log_file = run_dir / "log.txt"
    out: dict[str, Any] = {
        "name": run_dir.name, "exit_code": code,
        "config": {k: getattr(cfg, k) for k in (
            "num_layers", "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size",
            "global_batch_size", "train_iters", "precision", "attention_backend", "world_size",
            "tp", "pp", "dp", "memory_limit_gb")},
        "log": str(log_file),
        "diagnosis": [f.kind for f in diagnose(log_file, exit_code=code)],
    }
    stages = [stage_memory(cfg, r) for r in range(cfg.pp)]
    out["planned_gb"] = {"peak": max(st.total for st in stages),
                         "static": max(st.static for st in stages)}
    if not log_file.is_file():
        return out
    log = parse_log(log_file)
    its = log.iterations
    steady = its[its["iteration"] > warmup] if len(its) else its
    if len(steady):
        ms = float(statistics.median(steady["elapsed_ms"]))
        tflops = tflops_per_gpu(ms, model_flops_per_iteration(cfg), cfg.world_size)
        try:
            util = mfu(tflops, device=device, precision=cfg.precision) if device else None
        except LabkitError:
            util = None  # no peak for this device (a CPU): no MFU
        out.update(iterations=[int(i) for i in steady["iteration"]], median_iteration_ms=ms,
                   tokens_per_s=cfg.tokens_per_iteration / (ms / 1e3),
                   model_tflops_per_gpu=tflops, mfu=util,
                   final_loss=float(its["lm_loss"].iloc[-1]))
    mem = log.memory
    if len(mem):
        last = mem[mem["iteration"] == mem["iteration"].max()]
        out["measured_gb"] = {
            "after_iteration": int(last["iteration"].iloc[0]),
            "max_allocated": float(last["max_allocated_mb"].max()) * MIB_TO_GB,
            "max_reserved": float(last["max_reserved_mb"].max()) * MIB_TO_GB}
        peak = out["measured_gb"]["max_allocated"]
        out["planned_over_measured_peak"] = out["planned_gb"]["peak"] / peak - 1 if peak else None
    for line in log_file.read_text(errors="replace").splitlines():
        if line.startswith("[labkit] static memory"):
            out.setdefault("static_memory_lines", []).append(line[len("[labkit] "):])
            m = STATIC_RE.search(line)
            if m:  # the largest rank's: measured live tensors against the planner
                measured, planned = float(m.group(1)), float(m.group(2))
                if measured >= out.get("static_gb", {}).get("measured", -1.0):
                    out["static_gb"] = {"measured": measured, "planned": planned}
        elif line.startswith("[labkit] CUDA workspace measured"):
            out["workspace_line"] = line[len("[labkit] "):]
            out["workspace_gb"] = float(WORKSPACE_RE.search(line).group(1))
    return out


def environment() -> dict[str, Any]:
    """Device name, torch / CUDA / NCCL / cuDNN versions, as this process sees them."""
    import platform

    import torch

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda": torch.version.cuda, "device": None, "device_count": 0}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(device=torch.cuda.get_device_name(0), device_count=torch.cuda.device_count(),
                   memory_gb=props.total_memory / 1e9,
                   nccl=".".join(map(str, torch.cuda.nccl.version())),
                   cudnn=torch.backends.cudnn.version())
    try:
        from importlib.metadata import version

        env["megatron_core"] = version("megatron-core")
    except Exception:  # noqa: BLE001 - a version we cannot read is only left out
        pass
    return env


def write_results(out: Path, doc: dict[str, Any]) -> Path:
    """``out/results.json`` (written whole each time: a killed benchmark keeps what it had)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")
    tmp.replace(path)
    return path


def write_figures(out: Path, doc: dict[str, Any]) -> list[Path]:
    """PNGs of the runs in ``doc["runs"]``: tokens/s and MFU per run, planned against measured
    peak memory per run; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in doc.get("runs", {}).values() if r.get("tokens_per_s")]
    written: list[Path] = []
    if runs:
        fig, ax = plt.subplots(figsize=(7, 4))
        names = [r["name"] for r in runs]
        ax.bar(names, [r["tokens_per_s"] for r in runs], color="tab:blue")
        for i, r in enumerate(runs):
            label = f"MFU {r['mfu']:.0%}" if r.get("mfu") is not None else "no MFU"
            ax.annotate(label, (i, r["tokens_per_s"]), ha="center", va="bottom")
        ax.set(ylabel="tokens/s", title=f"throughput on {doc.get('env', {}).get('device') or 'cpu'}")
        written.append(_save(fig, out / "throughput.png"))
    mem = [r for r in doc.get("runs", {}).values() if r.get("measured_gb")]
    if mem:
        fig, ax = plt.subplots(figsize=(7, 4))
        x = range(len(mem))
        ax.bar([i - 0.27 for i in x], [r["planned_gb"]["peak"] for r in mem], 0.27,
               label="planned peak")
        ax.bar(list(x), [r["measured_gb"]["max_allocated"] for r in mem], 0.27,
               label="max allocated (last iteration)")
        ax.bar([i + 0.27 for i in x], [r["measured_gb"]["max_reserved"] for r in mem], 0.27,
               label="max reserved (last iteration)")
        ax.set_xticks(list(x), [r["name"] for r in mem])
        ax.set(ylabel="GB", title="peak memory: planner against the run")
        ax.legend()
        written.append(_save(fig, out / "memory.png"))
    return written


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
