"""Step records printed as an object: a JSON object or a Python dict anywhere in a line.

Loops that log a dict print it behind any prefix (a logger's, a tool's ``train_inner | ``), as
JSON (fairseq's and metaseq's json log format, every value a quoted string: ``"loss": "15.878"``)
or as Python's repr (``{'loss': 2.31, 'step': 10}``), flat or nested one level (``{"train":
{"loss": ...}}`` is ``train/loss``). :func:`find_object` finds the first such object and flattens
it; generic.py reads its keys by the same vocabulary as a line's ``name: value`` pairs.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from typing import Any

SEP = re.compile(r"[ _-]")
# the counter's names as an object's keys
_COUNTER_KEYS = frozenset({"global_step", "num_updates", "acc_iter", "step", "iteration", "iter", "it",
                           "batch", "current_steps", "current_step",
                           "step_num"})  # MLPerf's event metadata (``"epoch_num": 1, "step_num": 10``)
# the steps planned (LLaMA-Factory's trainer_log.jsonl: ``"current_steps": 10, "total_steps": 1287``)
_TOTAL_KEYS = ("total_steps", "max_steps", "total_iters", "train_iters")
_EVAL_GROUP = re.compile(r"(?:val|valid|validation|eval|evaluation|test)/")
_PER_DEVICE = re.compile(r"(?:/|_per_)(?:device|gpu|GPU|chip|accelerator)\b")
# names, ``_``, ``-`` and blanks alike (``learning rate``, ``learning_rate``, ``learning-rate``)
NAMES = {
    "loss": "lm_loss", "lm_loss": "lm_loss", "train_loss": "lm_loss", "training_loss": "lm_loss",
    "total_loss": "lm_loss", "loss/train/total": "lm_loss", "reduced_train_loss": "lm_loss",
    "train/loss": "lm_loss", "loss/train": "lm_loss", "step_loss": "lm_loss", "batch_loss": "lm_loss",
    "iter_loss": "lm_loss", "losses": "lm_loss",  # the sum of the terms a loop names (NLUT's)
    "trl": "lm_loss",  # llm.c's main.log abbreviates (``s:0 trl:10.9 lr:... norm:...``; ``tel``: eval)
    "lr": "lr", "learning_rate": "lr",
    "sec/step": "s", "s/step": "s", "ms/step": "ms", "ms/batch": "ms", "s/iter": "s", "ms/iter": "ms",
    "time/iter": "s", "time_per_iter": "s",  # a time per iteration without a unit: seconds
    "time_per_step": "s",
    # ``elapsed time per iteration: 21392.5 ms`` (Megatron-Bridge, the unit after the value): its unit
    "elapsed_time_per_iteration": "time", "time_per_iteration": "time", "elapsed_time_per_step": "time",
    "batch_cost": "s", "reader_cost": "none",  # PaddlePaddle's suites: seconds a batch, its data's part
    "step_time": "time", "batch_time": "time", "iter_time": "time", "time/step": "s", "elapsed": "time",
    "elapsed_time": "time", "seconds": "s", "run": "time", "time": "time", "dt": "time",
    "train_step_timing_in_s": "s",  # NeMo's (Lightning's logged metric, its unit in the name)
    "data_time": "none", "data": "none", "forward_time": "none", "backward_time": "none",
    "samples/s": "smp", "samples/sec": "smp", "samples/second": "smp", "samples_per_second": "smp",
    "records/s": "smp", "records/second": "smp",  # BigDL's ``Throughput is N records/second``
    "ups": "ups",  # updates per second: the step time is its inverse
    "tokens_per_second": "tok", "tokens_per_sec": "tok", "tokens/s": "tok", "tokens/sec": "tok",
    "tok/s": "tok", "tok/sec": "tok", "tokens/gpu/sec": "tok", "tokens/gpu/s": "tok", "tps": "tok",
    "wps": "tok",  # words: fairseq's target tokens
    "mfu": "mfu", "tflop/s": "tflops_per_gpu", "tflops": "tflops_per_gpu",
    "grad_norm": "grad_norm", "norm": "grad_norm", "gnorm": "grad_norm", "gradient_norm": "grad_norm",
    "loss_scale": "loss_scale", "scale": "loss_scale",
    "memory": "mem", "mem": "mem", "peak_memory": "mem", "max_memory": "mem", "gpu_memory": "mem",
    "max_mem": "mem", "peak_mem": "mem", "memory_allocated": "mem", "max_memory_allocated": "mem",
    "peak_memory_active": "mem", "peak_memory_alloc": "mem",  # torchtune's (its reserved is no allocation)
}
_DECODER = json.JSONDecoder()
# Python's repr of a float that is no number: no literal, so read as None (no number)
_NOT_A_NUMBER = re.compile(r"(?<![\w'\"])-?(?:nan|inf)(?![\w'\"])")
_LONGEST = 100_000  # a longer object is no step record (a config dump): not decoded


def find_object(text: str) -> dict[str, Any] | None:
    """The first JSON object or Python dict literal in ``text``, its nested objects flattened one
    level (keys joined by ``/``); None where the line holds none."""
    start = text.find("{")
    for _ in range(3):  # a prefix may hold a brace of its own: the next one
        if start < 0:
            return None
        obj = _decode(text, start)
        if isinstance(obj, dict):
            return _flat(_event(obj))
        start = text.find("{", start + 1)
    return None


def _decode(text: str, start: int) -> Any:
    try:
        return _DECODER.raw_decode(text, start)[0]
    except ValueError:
        pass
    end = text.rfind("}")
    if end < start or end - start > _LONGEST or "'" not in text:
        return None
    body = text[start:end + 1]
    if "nan" in body or "inf" in body:
        body = _NOT_A_NUMBER.sub("None", body)
    try:
        return ast.literal_eval(body)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def _event(obj: dict) -> dict:
    """A logging event that names its metric by a key (MLPerf's ``:::MLLOG {"namespace": "",
    "time_ms": ..., "event_type": "POINT_IN_TIME", "key": "train_loss", "value": 2.08, "metadata":
    {"file": ..., "lineno": 223, "samples_count": 80, "lr": 0.0005}}``) is that metric and its
    metadata's values (``{"train_loss": 2.08, "samples_count": 80, "lr": 0.0005}``), marked
    ``_event``: it prints no step counter (see kept). An event whose value is an object (MLPerf's
    ``tracked_stats``, a block's averages) keeps its shape."""
    key, value = obj.get("key"), obj.get("value")
    if not (isinstance(key, str) and "event_type" in obj and isinstance(value, (int, float, str))):
        return obj
    meta = obj.get("metadata")
    out: dict[str, Any] = {key: value, "_event": True}
    for k, v in (meta.items() if isinstance(meta, dict) else ()):
        if k not in ("file", "lineno"):
            out.setdefault(k, v)
    return out


def _flat(obj: dict) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(v, (dict, list)):
                    out.setdefault(f"{key}/{k}", v)
        elif not isinstance(value, list):
            out.setdefault(str(key), value)
    return out


def number(value: Any) -> float | None:
    """A value of an object as a number: a number, or a string that is one (``"15.878"``)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        v = float(value)
    elif isinstance(value, str) and len(value) < 40:
        try:
            v = float(value.replace(",", ""))
        except ValueError:
            return None
    else:
        return None
    return v if v == v and abs(v) != float("inf") else None  # nan, inf: no number


def norm(name: str) -> str:
    """A metric's name, ``_``, ``-`` and blanks alike (``learning rate`` is ``learning_rate``)."""
    return SEP.sub("_", name.lower())


def settle(rec: dict[str, Any]) -> None:
    """A loss of a name out of the vocabulary (``_loss``) is the loss where no name of it gives one."""
    rec.pop("_main", None)
    other = rec.pop("_loss", None)
    if other is not None:
        rec.setdefault("lm_loss", other)


def step_record(obj: dict[str, Any], kind: Callable[[str], str | None],
                put: Callable[..., None]) -> dict[str, Any] | None:
    """An object's step record (the counter and the metrics ``kind`` names, by ``put``), None
    where it names no counter (an evaluation's ``valid_num_updates`` is none)."""
    step = None
    for key, value in obj.items():
        k = norm(key)  # a counter under any group but an evaluation's (``trainer/global_step``)
        if k.rsplit("/", 1)[-1] in _COUNTER_KEYS and not _EVAL_GROUP.match(k):
            v = number(value)
            if v is not None and v >= 0 and v == int(v):
                step = int(v)
                break
    if step is None and "_event" not in obj:
        return None
    rec: dict[str, Any] = {"iteration": step, "_object": True}  # (an event's: numbered by kept)
    total = next((number(obj[k]) for k in _TOTAL_KEYS if k in obj), None)
    if total is not None and (step is None or total >= step) and total == int(total):
        rec["train_iters"] = int(total)
    epoch = number(obj.get("epoch"))
    if epoch is not None:
        rec["_epoch"] = epoch
    data = any(norm(str(key)).endswith("data_time") for key in obj)  # then a time is in seconds
    for key, value in obj.items():
        k = kind(str(key))
        v = number(value) if k is not None else None
        if v is not None:  # a memory size as a whole number: MiB (torch's bytes / 2**20), as on a line
            unit = "s" if k == "time" and data else "MiB" if k == "mem" and isinstance(value, int) else None
            put(rec, k, norm(key), v, unit, _PER_DEVICE.search(str(key)) is not None)
    settle(rec)
    return rec


def kept(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records that are steps': where every object record names a whole epoch and no two the
    same one (fairseq's json summaries: ``{"epoch": 10, "loss": "3.180", ..., "num_updates": 21497}``),
    they report epochs, not steps (a fraction, ``"epoch": 0.0019``, is a step's progress through
    its epoch: LLaMA-Factory's trainer_log.jsonl). Where a line's ``name: value`` record and an
    object name the same step, the line's values win: the object is the step's copy for a logger
    (MLPerf's ``:::MLLOG`` ``tracked_stats``, whose values are the run's averages). Copies of one
    step printed one right after another (every process prints its own, each its local loss:
    ``Train Epoch: 1 [0/15018 (0%)]\tloss=7.0561`` then ``... loss=7.1878``) are one record, the first
    copy's values."""
    events = [r for r in recs if r["iteration"] is None]  # events that print no counter: the
    if len(events) < len(recs):  # steps in the order logged, where no record of the log has one
        recs = [r for r in recs if r["iteration"] is not None]  # (else a logger's copies of them)
    for n, r in enumerate(events if len(events) == len(recs) else (), 1):
        r["iteration"] = n
    epochs = [r["_epoch"] for r in recs if "_epoch" in r]
    objects = sum(1 for r in recs if "_object" in r)
    summaries = len(epochs) > 1 and len(epochs) == len(set(epochs)) == objects \
        and all(e == int(e) for e in epochs)
    out = [r for r in recs if not (summaries and "_epoch" in r)]
    lines = {r["iteration"]: r for r in out if "_object" not in r}
    for r in out:
        r.pop("_epoch", None)
        own = lines.get(r["iteration"]) if r.pop("_object", None) else None
        for key in own or ():  # (records of one step merge: the last value wins)
            if key != "iteration" and not key.startswith("_"):
                r.pop(key, None)
    steps: list[dict[str, Any]] = []
    for r in out:
        if steps and steps[-1]["iteration"] == r["iteration"]:
            steps[-1].update({k: v for k, v in r.items() if k not in steps[-1]})
        else:
            steps.append(r)
    return steps
