"""Hugging Face Trainer log lines: the dict the Trainer prints at every logging step.

``{'loss': 2.1234, 'grad_norm': 0.98, 'learning_rate': 5e-05, 'epoch': 0.01}`` (the keys after
``loss`` vary: ``grad_norm`` since transformers 4.38, a model's own metrics, ``epoch`` last). Its
loss and learning rate are an iteration record's ``lm_loss`` and ``lr``; axolotl's
``'memory/max_mem_allocated(gib)'`` and ``'memory/device_mem_reserved(gib)'`` a memory row. The
dict names no step unless a trainer adds ``'step'`` / ``'global_step'``, or the step with the steps
planned as a quoted fraction (ms-swift's ``'global_step/max_steps': '295/4491'``); deepspeed.Steps
numbers the others.
The ``eval_loss`` and ``train_runtime`` dicts (evaluation, the closing summary) are no training
step, and neither is the progress bar (``37/1200 [01:02<32:10, 1.66s/it]``): its count can
run ahead of the logged steps and its rate is smoothed over the bar's own window.
"""

from __future__ import annotations

import re
from typing import Any

from labkit.logs import concepts, records

# A dict whose first key is the training loss; the bar tqdm redraws can sit before it.
_START = re.compile(r"\{(['\"])loss\1: ")
_NUM = r"['\"]?(-?(?:[0-9]{1,30}(?:\.[0-9]{0,30})?|\.[0-9]{1,30})(?:[eE][+-]?[0-9]{1,4})?|nan|-?inf)['\"]?"
_KEYS = {"loss": "lm_loss", "learning_rate": "lr", "grad_norm": "grad_norm", "epoch": "epoch",
         "step": "iteration", "global_step": "iteration"}
_FIELD = re.compile(r"(['\"])(loss|learning_rate|grad_norm|epoch|step|global_step)\1: " + _NUM + r"[,}]")
# a counter and its total under one key, the value ``'N/M'`` (ms-swift's ``'global_step/max_steps'``)
_FRACTION = re.compile(r"(['\"])(?:global_)?step/(?:max|total)_steps\1: (['\"])(\d{1,12})/(\d{1,12})\2[,}]")
# axolotl's memory keys (GiB): 'memory/max_mem_allocated(gib)': 25.45, ...
_MEM_FIELD = re.compile(r"(['\"])memory/(max_mem_allocated|device_mem_reserved)\(gib\)\1: " + _NUM + r"[,}]")
_MEM_KEYS = {"max_mem_allocated": "max_allocated_mb", "device_mem_reserved": "reserved_mb"}


def _value(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_trainer_dict(text: str) -> dict[str, Any] | None:
    """A Trainer's logging dict -> ``{"lm_loss", "lr", "grad_norm", "epoch"}`` (those it holds),
    with ``iteration`` only where the dict itself names its step; None for any other line."""
    if "loss" not in text:
        return None
    m = _START.search(text)
    if m is None:
        return None
    end = text.find("}", m.end())
    body = text[m.start(): end + 1 if end >= 0 else len(text)]
    rec: dict[str, Any] = {}
    for f in _FIELD.finditer(body):
        key = _KEYS[f.group(2)]
        v = _value(f.group(3))
        if key == "iteration":
            if v is not None and v.is_integer() and 0 <= v < 2**53:
                rec["iteration"] = int(v)
        elif key not in rec:
            rec[key] = None if v is None or v != v or v in (float("inf"), float("-inf")) else v
    if "lm_loss" not in rec:  # e.g. the line was cut inside the loss's number
        return None
    f = _FRACTION.search(body) if "_steps" in body else None
    if f is not None:
        rec["iteration"], rec["train_iters"] = int(f.group(3)), int(f.group(4))
    if "memory/" in body:
        for f in _MEM_FIELD.finditer(body):
            v = _value(f.group(3))
            if v is not None and v == v:
                rec.setdefault(_MEM_KEYS[f.group(2)], v * 1024.0)  # GiB -> MiB
    _vocabulary(body, rec)
    return rec


def _vocabulary(body: str, rec: dict[str, Any]) -> None:
    """The dict's other keys the loops' vocabulary names (concepts.py): a trainer's step time
    (``'current_step_time_seconds': 19.5``), speed (``'train_speed(iter/s)': 0.01689``), memory
    (``'memory(GiB)': 10.31``), throughput; the keys above win."""
    obj = records.find_object(body)
    found: dict[str, Any] = {}
    for key, value in (obj or {}).items():
        kind = concepts.kind(str(key)) if str(key) not in _KEYS else None
        v = records.number(value) if kind not in (None, "lm_loss", "loss", "lr", "grad_norm") else None
        if v is not None and v == v:
            concepts.put(found, kind, records.norm(str(key)), v, None, concepts.per_device(str(key)))
    if "_memory" in found:
        column, mib = found.pop("_memory")
        rec.setdefault(column, mib)
    for column, v in found.items():
        if not column.startswith("_"):
            rec.setdefault(column, v)
