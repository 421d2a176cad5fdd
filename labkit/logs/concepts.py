"""A metric's name -> its column, by concept, whatever the spelling (generic.py's vocabulary).

Loops name one metric in many ways: ``interval_samples_per_second``, ``samples/sec``, ``Samples/s``
and ``samples per second`` are one concept, as are ``loss_scale``, ``loss scale``, ``loss_scaling``
and ``scale``, or ``tgs``, ``tokens/gpu/s`` and ``tokens_per_second_per_gpu``. A name is normalized
before it is looked up (:func:`canon`): case, ``_``/``-``/blanks alike; a rate's spelling
(``_per_second``, ``_per_sec``, ``/second``, ``/sec``) is ``/s``; a device (``/gpu``, ``_per_device``,
``per_gpu``, `` per GPU``) is a flag, not part of the name; a prefix saying over what the value was
taken (``interval_``, ``train_``, ``training_``, ``num_``, ``current_``) is dropped; an abbreviation
(``tot``, ``tgs``, ``sps``) is the word it stands for; a unit the name states after it (``_seconds``,
``(GiB)``) is the value's, and a rate in brackets (``(iter/s)``) names the concept. The normalized
name is then matched against one table of concepts (:data:`CONCEPTS`, records.py's names and their
kin), each a column kind:

- ``lm_loss`` the loss (``total``/``tot``/``overall``/``lm`` loss wins where a record prints its
  parts too); ``loss`` a loss of another name (any name ending in ``loss`` that is no running mean);
- ``lr``; ``s``/``ms``/``time`` a step time (``time`` takes its unit from the value); ``none`` a
  part of the step (data loading, the forward pass); ``ups`` updates per second (the step time's
  inverse);
- ``smp`` samples/s (images too); ``tok`` tokens/s, ``tokg`` tokens per GPU per second; ``consumed`` the
  samples consumed so far; ``mfu``; ``tflops_per_gpu``; ``grad_norm``; ``loss_scale``; ``mem``.

A metric of an evaluation (``val loss``, ``eval_loss``, ``loss/val``, a ``valid step`` counter) is
none (``EVAL``, ``EVAL_PART``).
"""

from __future__ import annotations

import re
from typing import Any

from labkit.logs.records import NAMES, SEP, norm

# the concepts beyond records.py's names (which stay the table an object's keys are read by)
CONCEPTS = dict(NAMES) | {
    "tot_loss": "lm_loss", "overall_loss": "lm_loss",
    "loss_scaling": "loss_scale", "grad_scale": "loss_scale",  # PaddleNLP's; fairseq2's (a GradScaler's)
    "consumed_samples": "consumed", "consumed_train_samples": "consumed",
    "tokens/gpu/s": "tokg", "tgs": "tokg",  # InternLM's ``tgs (tokens/gpu/second)``
    "samples/s": "smp", "sps": "smp",
    "img/s": "smp", "images/s": "smp",  # Horovod's benchmarks: ``Iter #0: 126.5 img/sec per GPU``
    "total_grad_norm": "grad_norm", "grad_norm_total": "grad_norm",
    "it/s": "ups", "s/it": "s",  # tqdm's units as a name (ALBERT's ``-- It/s: 1.69``, MLX's ``It/sec``)
    "examples/s": "smp", "sequences/s": "smp", "seqs/s": "smp", "imgs/s": "smp",
    "toks/s": "tok",  # lit-llama's ``speed: 1771 toks/s/device``
    # open_clip's ``Data (t): 14.173 Batch (t): 18.240``: a time named by what it timed
    "batch_(t)": "time", "step_(t)": "time", "iter_(t)": "time", "data_(t)": "none",
} | {  # a unit of time per unit of work as the name (TensorFlow's ``(11381.4 examples/sec; 0.022
    # sec/batch)``, ``ms/it``); the inverse, work per time, is updates per second (``steps/s``)
    f"{t}/{w}": "ms" if t == "ms" else "s" for t in ("s", "sec", "secs", "seconds", "ms")
    for w in ("step", "batch", "iter", "iteration", "it", "update")
} | {f"{w}/s": "ups" for w in ("steps", "batches", "iters", "iterations", "updates", "batch", "iter", "step")}
# a prefix saying over what a value was taken: ``interval_samples_per_second``, ``num_consumed_samples``,
# ``current_step_time_seconds`` (this step's, beside a run's average)
_PREFIX = re.compile(r"^(?:interval|train|training|num|current)_(?=[a-z])")
# a unit the name states, after it (a dict's keys: DeepSpeed's Trainer callback ``current_step_time_seconds``,
# ms-swift's ``memory(GiB)``) or a rate's in brackets, which names the concept (``train_speed(iter/s)``)
_NAMED_UNIT = re.compile(r"(?:\((s|sec|ms|gib|gb|mib|mb|[a-z]{1,12}/s)\)|_(seconds|secs|ms|gib|mib))$")
_UNIT_WORDS = {"seconds": "s", "secs": "s", "sec": "s", "s": "s", "ms": "ms", "gib": "GiB", "gb": "GB",
               "mib": "MiB", "mb": "MB"}
# a rate's spellings: ``_per_second``, ``_per_sec``, ``/second``, ``/sec`` -> ``/s``
_RATE = re.compile(r"(?:_per_|/)sec(?:ond)?s?(?=$|/|_)")
PER_DEVICE = re.compile(r"(?:/|[ _]per[ _])(?:device|gpu|GPU|chip|accelerator)(?![a-zA-Z])")
_DEVICE = re.compile(r"(?:/|_per_)(?:device|gpu|chip|accelerator)(?=$|/|_)")
_MIB = {"GiB": 1024.0, "GB": 1e9 / 2**20, "MiB": 1.0, "MB": 1e6 / 2**20, "bytes": 1 / 2**20}
_SCALE = {"K": 1e3, "M": 1e6, "B": 1e9}
# the loss that wins where several are printed (``loss: X, lm_loss: Y``: Y, the loss without
# auxiliary terms; ``aux_loss: A, total_loss: T``: T)
MAIN_LOSS = re.compile(r"(?:total|tot|overall|lm)_")
# a loss that is no step's own: a running mean
_MEAN = re.compile(r"(?i)running|average|avg|mean|ema|smooth")
# a metric of an evaluation, or its counter: the line reports no training step (``cv``: a
# cross-validation's, WeNet's ``CV Batch 5/3700 loss ...``)
EVAL = re.compile(r"(?i)(?<![a-z])(?:val|valid|validation|eval|evaluation|test|cv)[ _/-]{0,2}"
                  r"(?:loss|ppl|perplexity|step|iter|iteration|batch)(?![a-z])")
EVAL_PART = re.compile(r"(?i)(?:^|[/_-])(?:val|valid|validation|eval|evaluation|test)(?:$|[/_-])")


def _spellings(name: str) -> str:
    """The regex of a name's spellings: ``_``/``-``/blank alike, a rate ``/s`` as any rate."""
    pat = SEP.sub("[ _-]", re.escape(name))
    if name.endswith("/s"):  # ``samples/s``: also ``samples/sec``, ``samples_per_second``
        pat = pat[:-len(re.escape("/s"))] + r"(?:/s(?:ec(?:ond)?s?)?|[ _-]per[ _-]sec(?:ond)?s?)"
    return pat


# a name of the vocabulary (after an optional prefix), or any name ending in ``loss`` (``closs``,
# ``mlm_loss``); then a device (``/gpu``, ``_per_device``) and qualifiers (``lr-DecoupledAdamW/group0``,
# ``memory/peak_mem``); a name under up to two groups (verl's ``train/lr``, ``actor/grad_norm``)
NAME = re.compile(r"(?:(?<![\w/])|(?<=\d)(?=seconds))((?:[a-z][a-z0-9_]{0,30}/){0,2})("
                  r"(?:(?:interval|num)[ _-])?(?:"
                  + "|".join(sorted((_spellings(n) for n in CONCEPTS), key=len, reverse=True))
                  + r")|[a-z][a-z0-9]{0,24}[_-]?loss)((?:/|[ _]per[ _])(?:device|gpu|chip|accelerator))?"
                  r"((?:_\d{1,2})?(?:[-/][a-z0-9]\w{0,30}){0,3})(?![\w/])", re.IGNORECASE)  # lr_0: group 0


def canon(name: str) -> str:
    """A metric's name normalized: lower case, ``_`` for ``-`` and blanks, a rate ``/s``, no device."""
    key = _RATE.sub("/s", norm(name))
    return _DEVICE.sub("", key) if "/" in key or "_per_" in key else key


def kind(name: str, qualifier: str = "") -> str | None:
    """The column kind of a metric's name (None: no column)."""
    key = canon(name)
    if EVAL_PART.search(norm(name) + qualifier):  # an evaluation's (``loss/val``, ``valid_loss``)
        return None
    found = CONCEPTS.get(key) or CONCEPTS.get(key[6:] if key.startswith("train/") else key)
    if found is None and _PREFIX.match(key):
        found = CONCEPTS.get(_PREFIX.sub("", key))
    if found is None and "/" in key:  # a metric under a group (``optim/lr``, ``throughput/tokens_per_sec``)
        found = CONCEPTS.get(key.rsplit("/", 1)[1])
    if found is None and key.endswith("loss") and "/" not in key:
        return None if _MEAN.search(key) else "loss"
    if found == "mem" and qualifier and not qualifier.lower().endswith("mem"):
        return None  # ``memory/alloc_retries`` is no size; ``memory/peak_allocated_mem`` is
    if found is None and (u := _NAMED_UNIT.search(key)) is not None:
        if u.group(1) and "/" in u.group(1):
            return CONCEPTS.get(u.group(1))  # a rate: ``(iter/s)`` names updates per second
        # the name before its unit, if it is a memory's or a step's time (MLPerf's ``time_ms`` is a clock)
        base, unit = kind(key[:u.start()]), _UNIT_WORDS[u.group(1) or u.group(2)]
        if base in ("s", "ms", "time") and unit in ("s", "ms"):
            return base if re.search("step|iter|batch", key[:u.start()]) else None
        return base if base == "mem" and unit not in ("s", "ms") else None
    return found


def named_unit(name: str) -> str | None:
    """The unit a metric's name states after it (``_seconds``, ``(GiB)``), else None."""
    u = _NAMED_UNIT.search(norm(name))
    return _UNIT_WORDS.get(u.group(1) or u.group(2)) if u is not None else None


def per_device(name: str) -> bool:
    """Whether a name says its value is per device (``tokens/s/gpu``, ``tokens_per_device``)."""
    return PER_DEVICE.search(name) is not None


def put(rec: dict[str, Any], kind: str, name: str, v: float, unit: str | None, per_device: bool) -> None:
    """A metric's value ``v`` (its unit, as printed) into the column its ``kind`` names (the first
    value of a column wins; a memory size is ``_memory``: (column, MiB); another loss ``_loss``)."""
    if kind == "none":  # a part of the step (loading data, the forward pass), not the step
        return
    unit = unit or named_unit(name)
    if kind in ("s", "ms", "time"):
        unit = unit or (kind if kind != "time" else None)
        if unit in ("s", "sec"):
            rec.setdefault("elapsed_ms", v * 1000.0)
        elif unit == "ms":
            rec.setdefault("elapsed_ms", v)
    elif kind == "consumed":  # the samples so far: a counter of the run's progress
        if v == int(v):
            rec.setdefault("consumed_samples", int(v))
    elif kind == "tokg":
        rec.setdefault("tokens_per_gpu_per_sec", v)
    elif kind == "smp":  # (per device: a column of the DataFrame only, as the Trainer's epoch)
        rec.setdefault("samples_per_gpu_per_sec" if per_device else "samples_per_sec", v)
    elif kind == "ups":
        if v > 0:  # 0: nothing measured yet
            rec.setdefault("elapsed_ms", 1000.0 / v)
    elif kind == "tok":
        col = "tokens_per_gpu_per_sec" if per_device else "tokens_per_sec"
        rec.setdefault(col, v * _SCALE.get(unit or "", 1.0))
    elif kind == "mem":
        peak = "peak" in name or "max" in name  # the peak wins where a record prints the current too
        if unit in _MIB and ("_memory" not in rec or peak and rec["_memory"][0] == "allocated_mb"):
            rec["_memory"] = ("max_allocated_mb" if peak else "allocated_mb", v * _MIB[unit])
    elif kind == "loss":
        rec.setdefault("_loss", v)
    elif kind == "lm_loss" and MAIN_LOSS.match(name) and "_main" not in rec:
        rec["lm_loss"], rec["_main"] = v, True  # the total where a record prints its parts too
    elif unit in (None, "%") or kind == "tflops_per_gpu":
        rec.setdefault(kind, v)


# a loss qualified by a word before its value (``loss native=0.0029 mlite=0.0029``: the first is the
# loop's own); a word that names a mean, an evaluation, a counter or another metric is no qualifier
_QUALIFIED = re.compile(r"\s([a-z]{2,12})\s{0,2}[=:]\s{0,4}(?=[-+]?\d)")
_NO_QUALIFIER = re.compile(r"^(?:steps?|iter|iteration|it|batch|epoch|rank|global|num|is)$")


def qualified(text: str, end: int) -> int | None:
    """Where the qualifier a loss's name at ``end`` of ``text`` has before its value ends; None: none."""
    q = _QUALIFIED.match(text, end)
    if q is None:
        return None
    word = q.group(1)
    if _MEAN.search(word) or EVAL_PART.search(word) or _NO_QUALIFIER.match(word) or kind(word):
        return None
    return q.end(1)

