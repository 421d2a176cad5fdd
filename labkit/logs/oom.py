"""How each tool says it ran out of memory: PyTorch's CUDA and CPU allocators, the engine's own
line, Slurm's cgroup and the kernel's OOM killer (failures.py turns a match into a failure), and
the size one event tried to allocate, its key."""

from __future__ import annotations

import re

# NCCL's ``NCCL WARN Cuda failure 'out of memory'`` (since 2.x numbered: ``Cuda failure 2 '...'``);
# PyTorch before 1.0: ``THCudaCheck FAIL file=... line=66 error=2 : out of memory``, then
# ``RuntimeError: cuda runtime error (2) : out of memory at ...`` (one event: no size, one key)
# An accelerator's memory of any framework: XLA's (JAX, TensorFlow, PyTorch/XLA) status on a TPU or a GPU,
# ``XlaRuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory
# space hbm. Used 87.08G of 30.75G hbm.`` or ``RESOURCE_EXHAUSTED: Out of memory while trying to
# allocate 8589934592 bytes.``, and TensorFlow's ``OOM when allocating tensor with shape[...] ... on
# /job:localhost/replica:0/task:0/device:GPU:0``; the CUDA driver's and runtime's own names for it, which
# frameworks on them print (TensorFlow's ``cuda_driver.cc:828] failed to allocate 2.96G (3173555200
# bytes) from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory``, CuPy's, JAX's; ``cudaErrorMemoryAllocation``)
GPU_OOM = re.compile(r"(?:CUDA|HIP) out of memory|OutOfMemoryError|CUDA error: out of memory"
                     r"|CUBLAS_STATUS_ALLOC_FAILED|Cuda failure (?:2 )?'out of memory'"
                     r"|(?:cuda runtime error \(2\)|THCudaCheck FAIL .{0,300}error=2) : out of memory"
                     r"|RESOURCE_EXHAUSTED: .{0,200}?(?:[Oo]ut of memory|Ran out of memory in memory space)"
                     r"|OOM when allocating tensor .{0,400}device:(?:GPU|TPU)"
                     r"|CUDA_ERROR_OUT_OF_MEMORY|(?<!Search for `)cudaErrorMemoryAllocation")  # (no hint's)
# torch.cuda.memory_summary()'s table counts the allocator's out-of-memory errors: ``|  CUDA OOMs: 1  |
# cudaMalloc retries: 1  |``; a count above 0 is the event (the OOM line printed beside it, the same one)
SUMMARY_OOMS = re.compile(r"\bCUDA OOMs: [1-9]\d{0,6}\b")
TRIED = re.compile(r"[Tt]ried to allocate (\d{1,20}(?:\.\d{1,6})?) ?(bytes|[KMGT]?i?B)\b")
SIZE_UNITS = {"bytes": 1, "B": 1, "KiB": 2 ** 10, "KB": 2 ** 10, "MiB": 2 ** 20, "MB": 2 ** 20,
              "GiB": 2 ** 30, "GB": 2 ** 30, "TiB": 2 ** 40, "TB": 2 ** 40}
LABKIT_OOM = re.compile(r"\[labkit\] out of memory on rank (\d{1,6})")
# (Rust's allocator, before it aborts the process: ``memory allocation of 2097152 bytes failed``)
CPU_OOM = re.compile(r"DefaultCPUAllocator: can't allocate memory|alloc_cpu\.cpp|std::bad_alloc"
                     r"|^MemoryError\b|Cannot allocate memory|\bmemory allocation of \d{1,20} bytes failed")
SLURM_OOM = re.compile(r"Detected \d{1,9} oom[-_]kill event|killed by the cgroup out-of-memory"
                       r"|task \d{1,6}(?:-\d{1,6})?: Out Of Memory|Exceeded (?:job|step) memory limit"
                       r"|[Oo]ut of memory: Kill(?:ed)? process")  # the kernel's, a cgroup's
# Ray's memory monitor (2.2 on) kills a worker before the kernel would: the raylet's summary ``1 Workers
# (tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed due to other reasons``, the
# task's error ``ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.``
# (2.55 on: ``2 worker(s) were killed due to the node running low on memory.``): the host's memory
RAY_OOM = re.compile(r"\b[1-9]\d{0,6} Workers? \(tasks / actors\) killed due to memory pressure"
                     r"|killed due to the node running low on memory")

# ENOSPC on shared memory (a tmpfs in RAM: a container's /dev/shm is 64 MB unless docker's
# --shm-size or --ipc=host raise it) is memory, not a disk: the path names it (``/dev/shm/...``,
# torch's shared tensors ``unable to write to file </torch_739_144252761_4>``, NCCL's segments
# ``include/shm.h:28 NCCL WARN Call to posix_fallocate failed``), or the traceback's code line just
# above the exception names the call (``_multiprocessing.SemLock(``: a POSIX semaphore, made in
# /dev/shm; ``shm_open``, ``SharedMemory(``, torch's ``_share_fd_cpu_()``)
SHM = re.compile(r"/dev/shm|</torch_\d|\bshm\.(?:h|cc)\b|shared memory")
SHM_CALL = re.compile(r"^\s.{0,200}\b(?:SemLock|sem_open|shm_open|SharedMemory"
                      r"|_share_(?:fd|filename)\w{0,8})\(")


# the device torch's CUDA error names: ``GPU 6 has a total capacity of 79.33 GiB`` (2.x), ``(GPU 0;
# 10.76 GiB total capacity; ...)`` (1.x)
_DEVICE = re.compile(r"\bGPU (\d{1,4}) has a total capac|\(GPU (\d{1,4}); ")


def oom_key(text: str) -> str:
    """One out-of-memory event's key: the size it tried to allocate, written the way PyTorch's
    allocator writes sizes (its ``format_size``: ``590.00 MiB``), so that the engine's line
    (``tried to allocate 618659840 bytes``) and torch's own error after it are one event; then the
    device where torch's error names one (``@GPU 6``): processes of a data-parallel job run out at
    the same size, each on its own device (same_oom)."""
    t = TRIED.search(text)
    if t is None:
        return "oom:"
    d = _DEVICE.search(text)
    at = f"@GPU {d.group(1) or d.group(2)}" if d else ""
    n = float(t.group(1)) * SIZE_UNITS[t.group(2)]
    if n <= 2 ** 10:
        return f"oom:{int(n)} bytes{at}"
    for scale, unit in ((2 ** 10, "KiB"), (2 ** 20, "MiB")):
        if n <= scale * 2 ** 10:
            return f"oom:{n / scale:.2f} {unit}{at}"
    return f"oom:{n / 2 ** 30:.2f} GiB{at}"


def same_oom(key: str, known: list[str]) -> str:
    """The key of the event an out-of-memory line repeats, among the ``known`` keys: its own; a line
    naming a device repeats the line of that size naming none (the engine's, before torch's error),
    and a line naming none the first of that size."""
    if key in known:
        return key
    if key == "oom:summary":  # a memory summary's count of the errors a line before it reported
        return known[0] if known else key
    size = key.split("@")[0]
    if "@" in key:
        return size if size in known else key
    return next((k for k in known if k.split("@")[0] == size), key)
