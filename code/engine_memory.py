"""The memory cap (``memory_limit_gb``), start-up memory and the out-of-memory report of
code/pretrain_gpt.py, and the process-level settings that must precede any allocation.

On CUDA the cap is ``torch.cuda.set_per_process_memory_fraction``, applied right after
``torch.cuda.set_device`` and before anything is allocated on the GPU. It caps PyTorch's caching
allocator only (every tensor, including cuBLAS workspaces that PyTorch allocates): the CUDA
context, NCCL's buffers and other libraries' own ``cudaMalloc`` calls are outside it, so the
process can use more GPU memory than the cap (about 0.5-1 GB more; the planner's
``CONTEXT_GB``). Beyond the cap torch raises ``torch.OutOfMemoryError`` ("CUDA out of memory").

On CPU it is a real address-space limit: ``RLIMIT_AS`` = the process's VmSize after start-up and
model build + the budget, so a too-large micro batch makes torch's own allocator fail
(``DefaultCPUAllocator: can't allocate memory``), exactly as a GPU run fails with
``CUDA out of memory``.
"""

from __future__ import annotations

import datetime
import gc
import os
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


DIST_TIMEOUT_S = 300.0
"""How long a collective may wait for a peer before the process group gives up (torch's NCCL
default is 10 minutes). One rank's failure (an OOM, a crash) then ends its peers within this
time instead of leaving them blocked in NCCL; ``LABKIT_DIST_TIMEOUT_S`` overrides it."""


def dist_timeout() -> datetime.timedelta:
    """The ``timeout=`` for ``init_process_group`` (``LABKIT_DIST_TIMEOUT_S`` or 300 s)."""
    return datetime.timedelta(seconds=float(os.environ.get("LABKIT_DIST_TIMEOUT_S",
                                                           DIST_TIMEOUT_S)))


def cuda_env(cfg, on_cuda: bool) -> dict[str, str]:
    """Environment to export before CUDA starts: ``CUDA_DEVICE_MAX_CONNECTIONS=1`` with TP on
    CUDA (one hardware queue, so a TP communication kernel is scheduled before the GEMM that
    waits for it: megatron-core's overlap of TP/SP communication relies on it)."""
    return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if on_cuda and cfg.tp > 1 else {}


def cpu_env(on_cuda: bool) -> dict[str, str]:
    """Environment for a CPU run (``device='cpu'``, the cpu profile) on a host where CUDA is
    visible: no GPU, so megatron-core and torch take the CPU paths that ``cpu_compat`` prepares
    (its redirect is only applied where torch sees no CUDA device). Exported before anything
    asks torch about CUDA; torch reads it once, when it first initialises CUDA."""
    return {} if on_cuda else {"CUDA_VISIBLE_DEVICES": ""}


def run_switch(name: str, default: bool = True) -> bool:
    """An on/off switch of the engine, read from the environment: ``default`` where unset, else
    on unless 0/false/no.

    ``LABKIT_INSTRUMENT``: the lessons' instrumentation (code/engine_timing.py's timeline and
    tensor-memory accounting, a ``synchronize()`` and a loss read back every iteration); a
    throughput run sets it to 0, and the loss is then read at log iterations only.
    ``LABKIT_SAVE_CHECKPOINTS``: checkpoints (periodic and final); 0 for a benchmark.
    ``LABKIT_FUSIONS``: megatron-core's torch.compile fusions on CUDA (engine_model.fusions);
    off unless set to 1.
    """
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() not in ("0", "false", "no")


WORKSPACE: dict[str, int | None] = {"bytes": None}
"""What PyTorch's CUDA allocator keeps after a first GEMM forward and backward at start-up
(``measure_cuda_workspace``): the cuBLAS / cuBLASLt workspaces, one per handle and stream."""


def measure_cuda_workspace(dtype: torch.dtype) -> int:
    """Bytes the allocator keeps after one linear layer (bias: cuBLASLt) and one matmul (cuBLAS)
    forward and backward in ``dtype`` on this device, their tensors freed: the library
    workspaces, measured instead of the planner's ``CUDA_WORKSPACES_GB`` guess. Backward runs on
    autograd's device thread, which has its own cuBLAS handle and so its own workspace."""
    dev = torch.cuda.current_device()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    x = torch.randn(64, 256, device=dev, dtype=dtype, requires_grad=True)
    w = torch.randn(256, 256, device=dev, dtype=dtype, requires_grad=True)
    b = torch.zeros(256, device=dev, dtype=dtype, requires_grad=True)
    (torch.nn.functional.linear(x, w, b) @ w).float().sum().backward()
    del x, w, b
    torch.cuda.synchronize()
    WORKSPACE["bytes"] = int(torch.cuda.memory_allocated() - before)
    return WORKSPACE["bytes"]


def workspace_line() -> str:
    from labkit.planner.memory import CUDA_WORKSPACES_GB

    ws = WORKSPACE["bytes"] or 0
    return (f"[labkit] CUDA workspace measured at start-up: {ws / GB:.6f} GB held by PyTorch's "
            f"allocator after one GEMM forward and backward (cuBLAS/cuBLASLt workspaces; the "
            f"planner's start-up memory counts {CUDA_WORKSPACES_GB} GB for them)")


def apply_memory_limit(limit_gb: float | None, on_cuda: bool) -> str | None:
    """Cap this process's memory; returns a one-line description (None when no cap).

    Call it on CUDA before anything is allocated on the device; on CPU after the model and the
    optimizer are built (the budget is then what the run allocates on top of them).
    """
    if not limit_gb:
        return None
    if on_cuda:
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        fraction = min(1.0, limit_gb * GB / total)
        torch.cuda.set_per_process_memory_fraction(fraction)
        return (f"memory cap: {limit_gb} GB = {fraction:.3f} of the GPU's {total / GB:.1f} GB "
                f"(torch.cuda.set_per_process_memory_fraction: PyTorch's allocator only, not "
                f"the CUDA context or NCCL buffers)")
    base = vm_size_bytes()
    cap = base + int(limit_gb * GB)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    return (f"memory cap: RLIMIT_AS = VmSize after start-up {base / GB:.2f} GB + "
            f"memory_limit_gb {limit_gb} GB = {cap / GB:.2f} GB")


def live_tensor_bytes(on_cuda: bool) -> int:
    """Bytes held by live tensors: ``torch.cuda.memory_allocated`` on CUDA; on CPU the distinct
    storages of every tensor the garbage collector can reach (parameters, DDP buffers,
    optimizer state, megatron-core's global buffers)."""
    if on_cuda:
        torch.cuda.synchronize()
        return int(torch.cuda.memory_allocated())
    seen: dict[int, int] = {}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
                st = obj.untyped_storage()
                seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
        except (RuntimeError, ReferenceError):  # meta tensors, freed weak references
            continue
    return sum(seen.values())


def static_memory_line(cfg, tp_rank: int, pp_rank: int, iteration: int, on_cuda: bool) -> str:
    """What is allocated between iterations against the planner's static memory (weights,
    gradients, optimizer state and megatron-core's start-up buffers)."""
    from labkit.planner.memory import stage_memory

    st = stage_memory(cfg, pp_rank)
    planned = st.weights + st.gradients + st.optimizer + st.startup
    ws = WORKSPACE["bytes"]
    measured = (f"; CUDA workspace measured at start-up {ws / GB:.6f}"
                if on_cuda and ws is not None else "")
    return (f"[labkit] static memory on (tensor, pipeline) rank ({tp_rank}, {pp_rank}) after "
            f"iteration {iteration}: {live_tensor_bytes(on_cuda) / GB:.6f} GB in live tensors, "
            f"planner {planned:.6f} GB (weights {st.weights:.6f} + gradients {st.gradients:.6f} "
            f"+ optimizer {st.optimizer:.6f} + start-up {st.startup:.6f}{measured})")


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
             exc: BaseException, limit_gb: float | None, on_cuda: bool = False) -> str:
    """The engine's one-line out-of-memory report. On CUDA it names the device and the cap as
    such (log parsers read ``memory_limit_gb=`` as the CPU address-space cap)."""
    size = requested_bytes(exc)
    what = f"tried to allocate {size} bytes" if size is not None else "allocation failed"
    fix = ("lower micro_batch_size, use recompute_granularity='full', or raise "
           + ("the device memory cap" if on_cuda else "memory_limit_gb")
           if limit_gb else "lower micro_batch_size or use more TP/PP")
    cap = (f"CUDA, device memory cap {limit_gb} GB" if on_cuda and limit_gb else
           "CUDA, no cap" if on_cuda else f"memory_limit_gb={limit_gb}")
    return (f"[labkit] out of memory on rank {rank} (tensor, pipeline) = ({tp_rank}, {pp_rank}) "
            f"during {phase} at iteration {iteration}: {what} ({cap}). Try: {fix}")
