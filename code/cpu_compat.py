"""Run megatron-core 0.16 on a machine without CUDA: the one place that bends its GPU assumptions.

megatron-core is written for GPUs. Training with gloo on CPU works once a short list of CUDA
assumptions is redirected to the CPU (measured in FIELD_NOTES.md):

  * ``torch.cuda.current_device()`` is used as a device for new tensors -> ``"cpu"``;
  * ``torch.cuda.synchronize`` / ``manual_seed(_all)`` / ``get_rng_state`` / ``set_rng_state``
    -> no-op or the CPU generator (so the RNG tracker forks the CPU generator);
  * the RNG tracker's ``_get_cuda_rng_state`` / ``_set_cuda_rng_state``
    (``megatron.core.tensor_parallel.random``) -> CPU generator state;
  * tensors created with ``device="cuda"`` (schedules' token counters, optimizer scale, grad
    scaler, ``clip_grads``, global memory buffer) -> created on the CPU;
  * ``Tensor.cuda()`` -> the tensor itself;
  * ``param.type() == 'torch.cuda.FloatTensor'`` checks in the optimizer and ``clip_grads``
    -> a CPU ``torch.FloatTensor`` answers that it is one.

Why globally in torch and not inside megatron-core: the ``device="cuda"`` literals are spread
over a dozen megatron modules; redirecting the factory functions once is shorter, and in a
process without CUDA any ``"cuda"`` request would fail anyway, so nothing that worked before
changes. Nothing is vendored or forked.

``apply()`` is a no-op when ``torch.cuda.is_available()`` is True (see ``needs_cpu_redirect``)
and idempotent: a second call patches nothing and returns ``[]``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch

_APPLIED: list[str] = []
# Factory functions that take a ``device=`` keyword and that megatron-core calls with "cuda".
_FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "arange", "zeros_like", "ones_like",
              "empty_like", "full_like", "randn", "rand", "randint", "as_tensor")


def needs_cpu_redirect(cuda_available: bool | None = None) -> bool:
    """True when the redirect should be applied: only where no CUDA device exists."""
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    return not cuda_available


def _is_cuda(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return False  # an int index means a GPU ordinal; megatron passes current_device() -> "cpu"


def _redirect_device(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        kwargs.pop("pin_memory", None)  # pinning needs a CUDA host allocator
        return fn(*args, **kwargs)

    wrapper.__labkit_cpu_redirect__ = True  # type: ignore[attr-defined]
    return wrapper


def _tensor_cuda(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return self


_real_type = torch.Tensor.type


def _tensor_type(self: torch.Tensor, dtype: Any = None, non_blocking: bool = False,
                 **kwargs: Any) -> Any:
    # megatron checks ``param.type() == 'torch.cuda.FloatTensor'`` to pick fp32 params;
    # a CPU fp32 tensor must pass the same check.
    if dtype is None and not kwargs:
        name = _real_type(self)
        return name.replace("torch.", "torch.cuda.", 1) if not self.is_cuda else name
    if isinstance(dtype, str) and dtype.startswith("torch.cuda."):
        dtype = dtype.replace("torch.cuda.", "torch.", 1)
    return _real_type(self, dtype, non_blocking, **kwargs)


def _cpu_rng_get(*args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.get_rng_state()


def _cpu_rng_set(new_state: torch.Tensor, *args: Any, **kwargs: Any) -> None:
    torch.set_rng_state(new_state)


def _eager(fn: Callable | None = None, **_options: Any) -> Any:
    """``torch.compile``'s signature, compiling nothing: ``@_eager`` and ``@_eager(...)``."""
    return fn if fn is not None else (lambda f: f)


def _import_megatron_eager() -> None:
    """Import megatron-core with its ``jit_fuser`` decorator left as the plain function.

    megatron-core binds ``megatron.core.jit.jit_fuser = torch.compile`` when it is imported and
    decorates its fused element-wise kernels with it: some thirty ``torch.compile`` wrappers (and
    torch._dynamo's import) for kernels the CPU path never calls, its fusions being off
    (``engine_model.fusions``). That cost about 1 s of CPU per rank here before the first
    iteration (2.6 instead of 3.5 s from ``import torch`` to a built optimizer). Every
    ``@jit_fuser``, also in modules imported later, gets its function back unchanged;
    ``torch.compile`` itself is torch's own again at once.
    """
    compile_ = torch.compile
    torch.compile = _eager
    try:
        import megatron.core  # noqa: F401  (binds jit_fuser and decorates with it)
    finally:
        torch.compile = compile_


def apply() -> list[str]:
    """Redirect megatron-core's CUDA assumptions to the CPU; returns the names patched.

    Returns ``[]`` when CUDA exists or when it was already applied in this process.
    """
    if not needs_cpu_redirect() or _APPLIED:
        return []
    patched: list[str] = []

    def put(owner: Any, attr: str, value: Any, label: str) -> None:
        setattr(owner, attr, value)
        patched.append(label)

    put(torch.cuda, "current_device", lambda: "cpu", "torch.cuda.current_device")
    put(torch.cuda, "synchronize", lambda *a, **k: None, "torch.cuda.synchronize")
    # The CPU generator directly: torch.manual_seed itself calls torch.cuda.manual_seed_all.
    put(torch.cuda, "manual_seed", lambda seed: torch.default_generator.manual_seed(int(seed)),
        "torch.cuda.manual_seed")
    put(torch.cuda, "manual_seed_all", lambda seed: None, "torch.cuda.manual_seed_all")
    put(torch.cuda, "get_rng_state", _cpu_rng_get, "torch.cuda.get_rng_state")
    put(torch.cuda, "set_rng_state", _cpu_rng_set, "torch.cuda.set_rng_state")
    for name in _FACTORIES:
        put(torch, name, _redirect_device(getattr(torch, name)), f"torch.{name}(device='cuda')")
    put(torch.Tensor, "cuda", _tensor_cuda, "torch.Tensor.cuda")
    put(torch.Tensor, "type", _tensor_type, "torch.Tensor.type")

    if "megatron.core" not in sys.modules:
        _import_megatron_eager()
        patched.append("megatron.core.jit.jit_fuser -> eager")
    # The RNG tracker imported its helpers by name; patch them where they live.
    from megatron.core.tensor_parallel import random as mp_random

    put(mp_random, "_get_cuda_rng_state", _cpu_rng_get,
        "megatron.core.tensor_parallel.random._get_cuda_rng_state")
    put(mp_random, "_set_cuda_rng_state", _cpu_rng_set,
        "megatron.core.tensor_parallel.random._set_cuda_rng_state")
    _APPLIED.extend(patched)
    return patched


def applied() -> list[str]:
    """What ``apply()`` patched in this process (empty if nothing)."""
    return list(_APPLIED)
