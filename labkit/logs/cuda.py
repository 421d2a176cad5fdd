"""How a GPU's failure is said: CUDA's, the driver's, NCCL's and the frameworks' lines of a CUDA error,
a lost GPU or a memory (ECC) fault; failures.py makes each a ``cuda_error``.

One event is printed many times (every thread of a kernel, torch's ``RuntimeError`` after the
kernel's own line, a ``what():`` repeat): the merge key is the error's own words, so those lines
count once.
"""

from __future__ import annotations

import re

# (c10's ``CUDA warning: device-side assert triggered``, where a destructor met the sticky error: the same)
_CUDA_ERR = re.compile(r"CUDA (?:error|warning): (?P<msg>[^\n]{1,200})|unhandled (?:cuda|CUDA) error"
                       r"|Xid \(PCI:[^)]{1,40}\): (?P<xid>\d{1,4})|CUDA driver error|uncorrectable ECC error"
                       r"|CUDA failure: (?P<fail>[^\n]{1,200})"  # torch 1.x's THC: THCudaCheck FAIL file=..
                       r"|THCudaCheck FAIL .{0,400}? error=\d{1,4} : (?P<thc>.{1,200})"  # error=10 : ...
                       # and its exception after it: ``RuntimeError: cuda runtime error (10) : invalid device
                       # ordinal at /pytorch/torch/csrc/cuda/Module.cpp:33`` (one event: the words, no place)
                       r"|cuda runtime error \(\d{1,4}\) : (?P<rt>[^\n]{1,200}?)(?: at \S{1,400})?\s{0,4}$"
                       r"|Cuda failure (?:\d{1,4} )?'(?P<nccl>[^'\n]{1,200})'"  # NCCL's WARN, 2.x
                       # NCCL's transports on a CUDA call's error (code and string): ``failed to open
                       # CUDA IPC handle : 64 peer access is not supported ...`` (p2p), ``rank 0 failed
                       # to get CUDA IPC handle to device 1 : ...``, ``cudaIpcGetMemHandle failed : ...``,
                       # ``failed to peer with device 1: 217 ...``, NVLS's ``CUDA error 801 '...'``
                       r"|(?P<ipc>failed to (?:open|get) CUDA IPC handle[^\n]{0,200}|cudaIpc\w{1,40} failed"
                       r"[^\n]{0,200}|failed to peer with device \S{1,40}: \d{1,4} [^\n]{1,200})"
                       # a CUDA call's error string quoted after its code or the source's place: NVLS's
                       # ``CUDA error 801 '...'``, DeepEP's EPException ``Failed: CUDA error
                       # /workspace/DeepEP/csrc/deep_ep.cpp:83 'unspecified launch failure'`` (``HIP error``
                       # on ROCm, whose runtime also says ``HW Exception by GPU node-9 ... :GPU Hang``)
                       r"|(?:CUDA|HIP) error (?:\d{1,4}|\S{1,300}:\d{1,6}) '(?P<quoted>[^'\n]{1,200})'"
                       r"|(?P<drv>\[ {0,3}\d{1,4}\] \S{0,300}libcuda\.so|from \S{0,300}libcuda\.so)"
                       # the runtime's error by its enum's name, or a library's wrapper of it with the code
                       # and its string (torch_memory_saver's ``cudaError error: 1 (invalid argument)``)
                       r"|(?<!Search for `)\bcudaError(?P<enum>[A-Z]\w{1,40})"
                       r"|\bcudaError(?: error)?:? \d{1,4} \((?P<wrapped>[^)\n]{1,100})\)"
                       r"|(?P<hsa>(?:HW Exception|Memory access fault) by GPU node-\d{1,4})"
                       r"|(?P<bus>fallen off the bus)"  # the driver's (NVRM) words for a lost GPU
                       # a C/C++ trainer's own check of a CUDA call (llm.c's cudaCheck: ``[CUDA ERROR] at
                       # file train_gpt2.cu:1238:``, the runtime's error string on the next line)
                       r"|\[CUDA ERROR\] at file (?P<check>\S{1,300}:\d{1,6})"
                       # a CUDA call's failure with the runtime's string (Horovod's ``cudaEventQuery
                       # failed: an illegal memory access was encountered``)
                       r"|\bcuda[A-Z]\w{1,40} failed: (?P<call>[a-z][^\n]{1,200})"
                       # cuDNN's status: ``cuDNN error: CUDNN_STATUS_...`` (0.4's CuDNN, 0.3's bare)
                       r"|(?:[Cc]u[Dd][Nn][Nn] error: |RuntimeError: )(?P<dnn>CUDNN_STATUS_\w{1,40})"
                       # a kernel's device-side assertion, printed by each failing thread before torch
                       # raises ``CUDA error: device-side assert triggered`` (one event with it):
                       # ``.../cuda/Indexing.cu:1284: indexSelectLargeIndex: block: [37,0,0], thread:
                       # [92,0,0] Assertion `srcIndex < srcSelectDimSize` failed.``
                       r"|(?P<kernel>\.cu:\d{1,6}: .{0,300}?block: \[\d{1,6},\d{1,6},\d{1,6}\], "
                       r"thread: \[\d{1,6},\d{1,6},\d{1,6}\] Assertion .{0,1000} failed\.)")
_WORDS = ("CUDA", "cuda", "Xid", "ECC", "Cuda failure", "HIP error", "off the bus", "CUDNN_STATUS",
          "to peer with", "by GPU node-", "Assertion")
_RANK_NAMED = re.compile(r"\brank:? (\d{1,7})\s{0,4}$")  # a CUDA error's message naming its rank at the end
# Xid codes of the GPU's memory (NVIDIA's Xid catalogue): 48 double-bit ECC, 63/64 row remapping or
# page retirement, 92 high single-bit ECC rate, 94/95 contained/uncontained ECC; 79 is a GPU the
# driver lost (fallen off the bus)
_XID_MEMORY = ("48", "63", "64", "92", "94", "95")
_DEVICE_ASSERT = "device-side assert triggered"  # torch's words for the error a kernel's assertion raises


def cuda_error(text: str, rank: int | None) -> tuple[int | None, str, str, str] | None:
    """A line's CUDA error as (rank, message, hint name, merge key), else None."""
    if not any(w in text for w in _WORDS):
        return None
    m = _CUDA_ERR.search(text)
    if m is None:
        return None
    if m.group("drv"):  # a crash backtrace (signal handler, gdb) with frames in the driver
        return rank, "a process crashed inside the CUDA driver (libcuda in its backtrace): " + text.strip(), \
            "cuda_error", "cuda:libcuda-crash"
    xid = m.group("xid")
    if m.group("bus") or xid == "79":
        return rank, "the GPU fell off the bus (the driver lost it): " + text.strip(), "gpu_lost", "cuda:bus"
    if m.group("kernel"):
        return rank, "a CUDA kernel's device-side assertion failed: " + text.strip(), "cuda_error", \
            "cuda:" + _DEVICE_ASSERT
    ecc = "ECC" in text or xid in _XID_MEMORY
    groups = ("msg", "fail", "thc", "rt", "nccl", "dnn", "ipc", "quoted", "hsa", "enum", "wrapped", "check",
              "call")
    what = next((m.group(g) for g in groups if m.group(g)), "")
    named = _RANK_NAMED.search(text)  # the program names its rank: ``... at line: 86 rank: 0``
    rank = int(named.group(1)) if named else rank
    return rank, text.strip(), "ecc" if ecc else "cuda_error", f"cuda:{'ecc' if ecc else what[:40]}"
