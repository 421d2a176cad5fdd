"""Memory of training steps by category, from torch.profiler's own memory timeline.

torch.profiler with ``profile_memory``, ``record_shapes`` and ``with_stack`` tracks every tensor
of the profiled code and sorts it into a category (``torch.profiler._memory_profiler``, the data
behind ``profile.export_memory_timeline``): PARAMETER, OPTIMIZER_STATE, INPUT, TEMPORARY,
ACTIVATION, GRADIENT, AUTOGRAD_DETAIL, or unknown. ``profile_training_steps`` runs a few
training steps under it and returns the bytes of each category over time, with the phase
(forward, backward, optimizer) and step each moment falls in: Adam's state appears in the
first optimizer step and stays; activations pile up in forward and drain in backward.

The analysis needs the Python stack of every op (``with_stack``): cheap for a small model run
in the notebook's own process, too slow for the engine's megatron-core runs on a CPU (those
record the total only: ``labkit.measured.profiling.memory_timeline``). MB = 1e6 bytes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pandas as pd

from labkit.errors import LabkitError

PHASES = ("forward", "backward", "optimizer")


def _categories() -> list[str]:
    """Category names in torch's column order (lower case; ``unknown`` for no category)."""
    # torch takes seconds to import: only when memory is profiled
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX

    order = sorted(_CATEGORY_TO_INDEX, key=_CATEGORY_TO_INDEX.__getitem__)
    return [c.name.lower() if c is not None else "unknown" for c in order]


@contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """File descriptor 2 to /dev/null: the profiler's C++ start/stop lines (``USDT: ...
    profiler_start``) would otherwise be a red box in a notebook. Python's own warnings and
    exceptions do not go through it (a notebook's ``sys.stderr`` is the kernel's stream)."""
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2: nothing to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        sys.stderr.flush()
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def profile_training_steps(loss_fn: Callable[[], Any], optimizer: Any, *, steps: int = 2,
                           device: str = "cpu") -> pd.DataFrame:
    """Run ``steps`` training steps under torch.profiler; their memory by category.

    One step: ``loss = loss_fn()`` (the forward), ``loss.backward()``, ``optimizer.step()``,
    ``optimizer.zero_grad(set_to_none=True)``; ``optimizer`` is a ``torch.optim.Optimizer``
    (the profiler recognises its state from the call). One row per moment the memory changed:
    ``time_ms`` (from the first), ``step`` (1, 2, ...; 0 before the first forward), ``phase``
    (forward, backward, optimizer, or "" between them) and one ``<category>_mb`` column per
    category (``parameter_mb``, ``optimizer_state_mb``, ``activation_mb``, ``gradient_mb``, ...).
    """
    # torch takes seconds to import: only when memory is profiled
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    if steps < 1:
        raise LabkitError(f"profile_training_steps needs steps >= 1; got steps={steps}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise LabkitError(f"profile_training_steps needs a torch.optim.Optimizer (its state is "
                          f"recognised from its step); got {type(optimizer).__name__}")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda")
                                           else [])
    with _native_stderr_silenced(), profile(activities=activities, profile_memory=True,
                                            record_shapes=True, with_stack=True) as prof:
        for i in range(1, steps + 1):
            with record_function(f"labkit step {i} forward"):
                loss = loss_fn()
            with record_function(f"labkit step {i} backward"):
                loss.backward()
            with record_function(f"labkit step {i} optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    times, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline(device)
    if not times:
        raise LabkitError(f"the profiler saw no tensor on {device!r}: is the model there?")
    spans = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        try:
            parts = node.name.split()
        except UnicodeDecodeError:  # a Python frame's name the profiler stored garbled
            parts = []
        if len(parts) == 4 and parts[:2] == ["labkit", "step"] and parts[3] in PHASES:
            spans.append((node.start_time_ns / 1e3, node.end_time_ns / 1e3, int(parts[2]),
                          parts[3]))
        else:
            stack.extend(node.children)
    spans.sort()
    return _frame(times, sizes, spans)


def _frame(times: list[int], sizes: list[list[int]],
           spans: list[tuple[float, float, int, str]]) -> pd.DataFrame:
    names = _categories()
    t0 = min(times)
    rows = []
    for t, row in zip(times, sizes, strict=True):
        step, phase = 0, ""
        for lo, hi, s, p in spans:
            if t >= lo:
                step = s
            if lo <= t <= hi:
                phase = p
        # Column 0 of torch's rows is a spare zero; the categories follow in their order.
        rows.append({"time_ms": (t - t0) / 1e3, "step": step, "phase": phase,
                     **{f"{c}_mb": v / 1e6 for c, v in zip(names, row[1:], strict=True)}})
    return pd.DataFrame(rows)


def category_columns(df: pd.DataFrame) -> list[str]:
    """The ``<category>_mb`` columns of a ``profile_training_steps`` frame, in torch's order."""
    return [c for c in df.columns if c.endswith("_mb")]


def step_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per step and phase, the largest MB of each category (rows in the order they ran)."""
    d = df[df["phase"] != ""]
    out = d.groupby(["step", "phase"], sort=False)[category_columns(df)].max()
    return out.reset_index()
