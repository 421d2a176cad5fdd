"""The memory cap (``memory_limit_gb``) and the out-of-memory report of code/pretrain_gpt.py.

On CUDA the cap is ``torch.cuda.set_per_process_memory_fraction``. On CPU it is a real
address-space limit: ``RLIMIT_AS`` = the process's VmSize after start-up and model build + the
budget, so a too-large micro batch makes torch's own allocator fail
(``DefaultCPUAllocator: can't allocate memory``), exactly as a GPU run fails with
``CUDA out of memory``.
"""

from __future__ import annotations

import re
import resource

import torch

GB = 1e9
_OOM_PATTERNS = ("can't allocate memory", "out of memory", "CUDA out of memory",
                 "Cannot allocate memory", "std::bad_alloc")


def vm_size_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def apply_memory_limit(limit_gb: float | None, on_cuda: bool) -> str | None:
    """Cap this process's memory; returns a one-line description (None when no cap)."""
    if not limit_gb:
        return None
    if on_cuda:
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        fraction = min(1.0, limit_gb * GB / total)
        torch.cuda.set_per_process_memory_fraction(fraction)
        return (f"memory cap: {limit_gb} GB = {fraction:.3f} of the GPU's {total / GB:.1f} GB "
                f"(torch.cuda.set_per_process_memory_fraction)")
    base = vm_size_bytes()
    cap = base + int(limit_gb * GB)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    return (f"memory cap: RLIMIT_AS = VmSize after start-up {base / GB:.2f} GB + "
            f"memory_limit_gb {limit_gb} GB = {cap / GB:.2f} GB")


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    return isinstance(exc, RuntimeError) and any(p in str(exc) for p in _OOM_PATTERNS)


def requested_bytes(exc: BaseException) -> int | None:
    """The allocation size named in torch's CPU or CUDA out-of-memory message, if any."""
    text = str(exc)
    m = re.search(r"you tried to allocate (\d+) bytes", text)
    if m:
        return int(m.group(1))
    m = re.search(r"Tried to allocate ([\d.]+) (GiB|MiB|KiB|B)", text)
    if m:
        scale = {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10, "B": 1}[m.group(2)]
        return int(float(m.group(1)) * scale)
    return None


def oom_line(*, rank: int, tp_rank: int, pp_rank: int, phase: str, iteration: int,
             exc: BaseException, limit_gb: float | None) -> str:
    size = requested_bytes(exc)
    what = f"tried to allocate {size} bytes" if size is not None else "allocation failed"
    fix = ("lower micro_batch_size, use recompute_granularity='full', or raise memory_limit_gb"
           if limit_gb else "lower micro_batch_size or use more TP/PP")
    return (f"[labkit] out of memory on rank {rank} (tensor, pipeline) = ({tp_rank}, {pp_rank}) "
            f"during {phase} at iteration {iteration}: {what} (memory_limit_gb={limit_gb}). "
            f"Try: {fix}")
