"""Output of code/pretrain_gpt.py: Megatron-LM-format log lines, memory report, TensorBoard.

The line formats are Megatron-LM's (``training.py``'s ``training_log``), because labkit's log
parser and students' habits are written against them. Lines go to stdout and are appended to
``RUN_DIR/log.txt``, unless ``LABKIT_LOG_CAPTURED=1`` says the job script already redirects
the whole job's output there.
"""

from __future__ import annotations

import math
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch


class RunLog:
    """Prints lines and mirrors them into ``log.txt`` (append, one write per line)."""

    def __init__(self, run_dir: Path):
        captured = os.environ.get("LABKIT_LOG_CAPTURED", "") in ("1", "true", "yes")
        self.path = None if captured else run_dir / "log.txt"

    def emit(self, line: str, *, err: bool = False) -> None:
        print(line, file=sys.stderr if err else sys.stdout, flush=True)
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(line + "\n")


def world_size_line(world: int, dp: int, tp: int, pp: int) -> str:
    return (f"using world size: {world}, data-parallel size: {dp}, context-parallel size: 1, "
            f"tensor-model-parallel size: {tp}, pipeline-model-parallel size: {pp}")


def params_line(tp_rank: int, pp_rank: int, n: int) -> str:
    return (f" > number of parameters on (tensor, pipeline) model parallel rank "
            f"({tp_rank}, {pp_rank}): {n}")


def iteration_line(*, iteration: int, train_iters: int, consumed: int, elapsed_ms: float,
                   tflops: float, lr: float, gbs: int, loss: float, loss_scale: float,
                   grad_norm: float | None, skipped: int, nan: int) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    gn = f" grad norm: {grad_norm:.3f} |" if grad_norm is not None else ""
    return (f" [{stamp}] iteration {iteration:8d}/{train_iters:8d} |"
            f" consumed samples: {consumed:12d} |"
            f" elapsed time per iteration (ms): {elapsed_ms:.1f} |"
            f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |"
            f" learning rate: {lr:.6E} |"
            f" global batch size: {gbs:5d} |"
            f" lm loss: {loss:.6E} |"
            f" loss scale: {loss_scale:.1f} |{gn}"
            f" number of skipped iterations: {skipped:3d} |"
            f" number of nan iterations: {nan:3d} |")


def validation_lines(iteration: int, loss: float) -> list[str]:
    ppl = math.exp(min(20.0, loss))
    body = (f" validation loss at iteration {iteration} | lm loss value: {loss:.6E} | "
            f"lm loss PPL: {ppl:.6E} | ")
    rule = "-" * (len(body) + 1)
    return [rule, body, rule]


# --- memory ---------------------------------------------------------------------------------
class MemoryMeter:
    """Allocated / max allocated / reserved / max reserved in MB.

    On CUDA: the caching allocator's statistics. On CPU there is no such allocator, so the
    numbers are the process's: allocated = resident set (RSS), max allocated = peak RSS,
    reserved = virtual size (VmSize), max reserved = the largest VmSize seen.
    """

    def __init__(self, on_cuda: bool):
        self.on_cuda = on_cuda
        self._max_vms = 0.0

    def read(self) -> dict[str, float]:
        mb = 1024.0 * 1024.0
        if self.on_cuda:
            return {"allocated": torch.cuda.memory_allocated() / mb,
                    "max allocated": torch.cuda.max_memory_allocated() / mb,
                    "reserved": torch.cuda.memory_reserved() / mb,
                    "max reserved": torch.cuda.max_memory_reserved() / mb}
        import psutil

        info = psutil.Process().memory_info()
        self._max_vms = max(self._max_vms, info.vms / mb)
        peak = _peak_rss_kib() / 1024.0
        # The peak and psutil's RSS are sampled differently; the peak is never below now.
        return {"allocated": info.rss / mb, "max allocated": max(peak, info.rss / mb),
                "reserved": info.vms / mb, "max reserved": self._max_vms}

    def reset_peak(self) -> None:
        """Start the peaks afresh (before the last iteration: its peak is the steady state,
        with the optimizer's state allocated). CUDA: the allocator's peak statistics; CPU: the
        kernel's peak RSS (``VmHWM``, reset through ``/proc/self/clear_refs``) and VmSize."""
        if self.on_cuda:
            torch.cuda.reset_peak_memory_stats()
            return
        self._max_vms = 0.0
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass  # the peak then stays the run's peak

    def line(self, rank: int, iteration: int) -> str:
        m = self.read()
        return (f"[Rank {rank}] (after {iteration} iterations) memory (MB) | "
                f"allocated: {m['allocated']:.1f} | max allocated: {m['max allocated']:.1f} | "
                f"reserved: {m['reserved']:.1f} | max reserved: {m['max reserved']:.1f}")

    @staticmethod
    def cpu_note() -> str:
        return ("[labkit] memory report on CPU: there is no CUDA allocator, so 'allocated' is the "
                "process's resident memory (RSS), 'max allocated' its peak RSS, 'reserved' its "
                "virtual size (VmSize)")


def _peak_rss_kib() -> float:
    """The process's peak resident set in KiB: ``VmHWM`` (resettable), else ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1])
    except OSError:
        pass
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB on Linux


# --- FLOPs ----------------------------------------------------------------------------------
def model_flops_per_iteration(cfg: Any) -> float:
    """Model FLOPs of one iteration (forward + backward, no recompute; the MFU convention): the
    planner's formula, the one labkit uses everywhere (SwiGLU and grouped-query attention included)."""
    from labkit.planner.flops import flops_per_iteration

    return float(flops_per_iteration(cfg))


# --- TensorBoard ----------------------------------------------------------------------------
class Board:
    """Scalars under ``RUN_DIR/tb`` (step = iteration), written by the rank that logs."""

    def __init__(self, tb_dir: Path | None):
        self.w = None
        if tb_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self.w = SummaryWriter(log_dir=str(tb_dir), max_queue=50)

    def scalars(self, step: int, values: dict[str, float | None]) -> None:
        if self.w is None:
            return
        for k, v in values.items():
            if v is not None and math.isfinite(v):
                self.w.add_scalar(k, v, step)

    def close(self) -> None:
        if self.w is not None:
            self.w.flush()
            self.w.close()
