"""Step records of any training loop: a step counter and named metrics, whatever the loop.

The readers of loops.py, megatron.py and deepspeed.py each know one loop's lines. This one knows
the shape they all share, for the loops none of them knows: a line that names a step counter
and at least one metric of a known name (a loss scale or a memory size alone is none) is a
step record. It is the fallback: parse.py asks it only in a log where no other reader found an
iteration record (then every line of the log is offered to it), and keeps its records only if
no other reader found one by the end.

The counter, by name and in any case (``step``, ``global step``, ``global_step``, ``iteration``,
``iter``, ``it``, ``batch``), then a separator (``:``, ``=``, ``#``, ``|``, ``,``, blanks, a
bracket) and a whole number, or ``N/M`` (N the step, M the steps planned); or, with no name, the
number(s) a line starts with, where the line names a loss: ``1|25|Loss: 1.26`` (epoch|step,
torchtune's bar description), ``    1 93.44 s run, 11.8750 loss`` (tinygrad). A metric is read in
either order, ``name sep value [unit]`` (``loss: 975.9991``, ``Loss=0.01022``, ``loss = 79.35``)
or ``value [unit] name`` (``93.44 s run``, ``(57.126 sec/step)``, ``0.000000000001 LR``)::

    03:26:55 [INFO] [TRAIN] [Rank 0] step: 8, loss: 975.9991, tokens_per_second: 76957.79, mfu: 42.46
    INFO:tensorflow:global step 1: loss = 79.3501 (57.126 sec/step)
    | Training Device=xla:0/3 Epoch=1 Step=280 Loss=0.01022 Rate=1760.91 GlobalRate=257.10 Time=07:29:39

Names -> columns (the corpus rules, tests/fixtures/logs/real/README.md): ``loss``, ``lm loss``,
``train_loss``, ``total_loss``, ``reduced_train_loss``, ``step_loss``, ``batch_loss`` -> lm_loss
(``train/`` before a name is the same name); ``lr``, ``learning_rate`` -> lr (a scale after the
name, ``lr(1e-3): 6.8e-05``, multiplies); a step time (``sec/step``, ``s/step``, ``ms/step``,
``step_time``, ``iter time``,
``time/step``, ``elapsed``, ``seconds``, ``run``, ``time``) -> elapsed_ms, only where a unit says
seconds or milliseconds (a bare number, or a clock like ``07:29:39``, says neither; beside a
``data_time``, as detectron2's and OpenMMLab's loggers print them, it is seconds), or a field of
its own that is a time with its unit (``| 8060.78ms |``, llama2.c); ``tokens_per_second``,
``tok/s``, ``tokens/s``, ``tps`` -> tokens_per_sec, per device or GPU -> tokens_per_gpu_per_sec (``K``,
``M`` multiply); ``mfu`` -> mfu as printed; ``TFLOP/s``, ``tflops`` -> tflops_per_gpu;
``grad_norm``, ``gnorm``, ``norm`` -> grad_norm; ``loss_scale`` -> loss_scale; memory (``memory``,
``mem``, ``peak_memory``, ...) with GB/GiB/MB/MiB -> a memory row in MiB (max_allocated_mb where
the name says peak or max, else allocated_mb; detectron2's ``max_mem: 2996M`` and OpenMMLab's
whole ``memory: 15266`` beside a ``data_time`` are MiB, Composer's ``memory/peak_allocated_mem``
GB). Other names (``Rate``, ``GB used``, ``GFLOPS``, ``epoch``) are no column. A metric of an
evaluation (``val loss``, ``eval_loss``, ``valid ppl``, ``test loss``) is never read; a line of
them is a step record only where it also prints a metric only a training step has (lr, step time,
throughput, MFU, grad norm: modula's ``step: 10  train loss: 3.11  test loss: 3.05
tokens/gpu/sec: 9378.40  MFU: 63.91%``), not where it prints losses alone (llama2.c's ``step 500:
train loss 5.7373, val loss 5.9544``). A line printed twice (two log handlers, every device) is
one record per step: parse.py merges records of one iteration.

A record over several lines is joined first (:class:`Records` holds it open): a step counter alone
on its line, then indented ``name: value`` lines (Composer's console logger: ``[batch=366/48000]:``,
``         Train loss/train/total: 10.3750``); a line ending in a ``name=value,`` pair, continued
by lines of such pairs (a hard wrap: fairseq's ``... loss=15.812,`` / ``nll_loss=15.812, ...,`` /
``num_updates=41, lr=5.22398e-06, ...``; fairseq's ``num_updates=N`` is its step, wherever it sits).
"""

from __future__ import annotations

import re
from typing import Any

from labkit.logs.lines import split_glued

_NUM = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d{1,30})(?:\.\d{0,30})?(?:[eE][-+]?\d{1,3})?(?!\d|:\d|\.\d|,\d{3})"
# a named counter; not inside a word (warmup_steps, train_steps, iteration_step, max_iter)
_COUNTER = re.compile(r"(?<![\w/.-])(?i:global[ _]step|acc_iter|step|iteration|iter|it|batch)"
                      r"(?i:\(train\))?"
                      r"(?:\s{0,4}[:=#|,]\s{0,12}|\s{1,12})[\[(]?\s{0,12}(\d{1,12})(?:\.0{1,8})?(?![\d.]|[,.]\d)"
                      r"(?:\s{0,12}/\s{0,12}(\d{1,12})(?![\d.]))?")
# no name: the numbers a line starts with (epoch|step|..., or one right-aligned step number)
_LEADING = re.compile(r"\s{0,12}(?:\d{1,6}\|)?(\d{1,12})"
                      r"(?:\s{0,4}\|(?=\s{0,4}[A-Za-z])|\s{1,8}(?=[-+]?\d))")
_NAMES = {
    "loss": "lm_loss", "lm loss": "lm_loss", "lm_loss": "lm_loss", "train_loss": "lm_loss",
    "train loss": "lm_loss", "training loss": "lm_loss", "training_loss": "lm_loss",
    "total_loss": "lm_loss", "loss/train/total": "lm_loss",
    "reduced_train_loss": "lm_loss", "train/loss": "lm_loss", "loss/train": "lm_loss",
    "step_loss": "lm_loss", "batch_loss": "lm_loss", "iter_loss": "lm_loss", "step loss": "lm_loss",
    "lr": "lr", "learning_rate": "lr", "learning rate": "lr", "learning-rate": "lr",
    "sec/step": "s", "s/step": "s", "ms/step": "ms", "ms/batch": "ms", "s/iter": "s", "ms/iter": "ms",
    "step_time": "time", "batch time": "time", "batch_time": "time",
    "data time": "none", "data_time": "none", "forward time": "none", "backward time": "none",
    "step time": "time", "iter time": "time", "iter_time": "time", "time/step": "time", "elapsed": "time",
    "elapsed_time": "time", "seconds": "s", "run": "time", "time": "time", "step-time": "time", "dt": "time",
    "tokens_per_second": "tok", "tokens_per_sec": "tok", "tokens/s": "tok", "tokens/sec": "tok",
    "tok/s": "tok", "tok/sec": "tok", "tokens-per-second": "tok",
    "tokens/gpu/sec": "tok", "tokens/gpu/s": "tok", "tps": "tok",
    "mfu": "mfu", "tflop/s": "tflops_per_gpu", "tflops": "tflops_per_gpu",
    "grad_norm": "grad_norm", "grad norm": "grad_norm", "norm": "grad_norm", "gnorm": "grad_norm",
    "grad-norm": "grad_norm",
    "gradient_norm": "grad_norm", "loss_scale": "loss_scale", "loss scale": "loss_scale",
    "memory": "mem", "mem": "mem", "peak_memory": "mem", "max_memory": "mem", "gpu_memory": "mem",
    "peak memory": "mem", "max memory": "mem", "max_mem": "mem", "memory_allocated": "mem",
    "max_memory_allocated": "mem", "memory/peak_allocated_mem": "mem",
}
_PER_DEVICE = re.compile(r"(?:/|_per_)(?:device|gpu|GPU|chip|accelerator)\b")
_NAME = re.compile(r"(?<![\w/])(?:train/)?("  # verl's train/lr as lr
                   + "|".join(sorted((re.escape(n) for n in _NAMES), key=len, reverse=True))
                   + r")((?:/|_per_)(?:device|gpu|chip|accelerator))?(?![\w/])", re.IGNORECASE)
_UNIT = r"(%|ms|sec|s|GiB|GB|MiB|MB|K|M|B)?"
# a unit or a scale in brackets after the name: ``(ms)``, ``train/lr(1e-3):`` (the value x 1e-3)
_AFTER = re.compile(r"\s{0,4}(?:\((?:[a-zA-Z]{1,4}|(1e-?\d{1,2}))\)\s{0,2})?[:=]?\s{0,4}("
                    + _NUM + r")\s{0,2}" + _UNIT + r"(?![\w/])")
_BEFORE = re.compile(r"(?<![\w.:])(" + _NUM + r")\s{0,2}" + _UNIT + r"\s{0,2}$")
_MIB = {"GiB": 1024.0, "GB": 1e9 / 2**20, "MiB": 1.0, "MB": 1e6 / 2**20}
_SCALE = {"K": 1e3, "M": 1e6, "B": 1e9}
# a metric of an evaluation: the line reports no training step
_EVAL = re.compile(r"(?i)(?<![a-z])(?:val|valid|validation|eval|evaluation|test)[ _/-]{0,2}"
                   r"(?:loss|ppl|perplexity)")


# the columns only a training step fills: a line of evaluation metrics with one of them is a step's
_STEP_ONLY = frozenset({"lr", "elapsed_ms", "tokens_per_sec", "tokens_per_gpu_per_sec", "mfu",
                        "tflops_per_gpu", "grad_norm"})
# a time with its unit and no name, a field of its own between ``|`` or ``,`` (llama2.c: ``490 |
# loss 5.75 | lr 4.9e-05 | 8060.78ms | mfu 0.21%``)
_TIME_FIELD = re.compile(r"(?:^|[|,])\s{0,4}(" + _NUM + r")\s{0,2}(ms|s)\s{0,4}(?:[|,]|$)")
# units a tool prints no unit for: Composer's memory monitor reports GB
_BARE_UNIT = {"memory/peak_allocated_mem": "GB"}


# a record over several lines: a header that is a step counter alone (Composer's
# ``[batch=366/48000]:``, ``[epoch=1][batch=16/625]:`` where its run counts epochs), then
# indented ``name: value`` lines; or a line hard-wrapped after a ``name=value,`` pair, continued
# by lines of ``name=value,`` pairs (fairseq's records)
_HEAD = re.compile(r"\s{0,8}(?:\[epoch=\d{1,9}\])?\[?(?i:batch|step|iter|iteration)\s{0,2}[=:]?\s{0,4}"
                   r"\d{1,12}(?:/\d{1,12})?\]?:?\s{0,8}")
_INDENTED = re.compile(r"\s{1,16}[A-Za-z][\w/ .()-]{0,100}?[:=]\s{0,8}" + _NUM + r"\s{0,8}[A-Za-z%]{0,4}$")
_WRAPPED = re.compile(r"\s{0,8}\w{1,40}=" + _NUM + r"(?:,|$)")
# a legend of the metrics a loop prints, a row per name, with its unit: ``│ dt │ Elapsed time per
# training step (measured in **ms**) │`` (WordPlay's, ezpz's)
_LEGEND = re.compile(r"^[\W_]{0,8}(\w{1,40})\W{1,12}[^()]{0,200}\(measured in \**(ms|s)\**\)")
# a batch counter within an epoch, the run's step counted as fairseq's before 2019 (PyTorch
# examples' word_language_model: ``| epoch   1 |   200/ 2983 batches | lr 20.0000 | ms/batch 11.61 |``)
_EPOCH_BATCHES = re.compile(r"(?i)(?<![\w/.-])epoch\s{0,4}[:=]?\s{0,12}(\d{1,9})\s{0,4}[|,:]?\s{0,12}"
                            r"(\d{1,12})\s{0,4}/\s{0,4}(\d{1,12})\s{1,4}batches(?!\w)")
# a timm-style record: ``Train:    1/3 ( 33%) [  49/323 ( 15%)]  Loss: 36.77 (81.7)  LR: 1.351e-04 ...
# Acc_iter 50  Data time: 0.00(0.02)  Forward time: 0.31(0.29)  Batch time: 0.31(0.31)`` (OpenPCDet)
_TIMM = re.compile(r"\s{0,8}Train:\s{1,8}\d{1,9}(?:/\d{1,9})?\s{1,4}(?:\(\s{0,3}\d{1,3}%\)\s{1,4})?\[")
# fairseq's update counter, wherever it sits in its record (its records print the loss first)
_UPDATES = re.compile(r"(?<![\w/.-])num_updates=(\d{1,12})(?![\d.])")


def may_be_record(text: str | bytes) -> bool:
    """A cheap test before parse: does the line name any metric at all?"""
    t = text.lower()  # a few substring tests: this runs on every line of a log with no record
    if isinstance(t, bytes):
        return (b"loss" in t or b"lr" in t or b"learning" in t or b"tok" in t or b"mfu" in t
                or b"tflop" in t or b"/step" in t or b"time" in t or b"elapsed" in t or b"norm" in t)
    return ("loss" in t or "lr" in t or "learning" in t or "tok" in t or "mfu" in t
            or "tflop" in t or "/step" in t or "time" in t or "elapsed" in t or "norm" in t)


def parse(text: str, units: dict[str, str] | None = None) -> dict[str, Any] | None:
    """A cleaned line (lines.py) -> a step record (``_memory``: (column, MiB)), or None; ``units``:
    the unit of a name printed without one, where the log's legend says it."""
    if not may_be_record(text):
        return None
    evaluation = _EVAL.search(text) is not None
    rec: dict[str, Any]
    if evaluation:  # its metrics are no training step's: masked; the line's own step metrics stay
        text = _EVAL.sub(lambda e: "~" * len(e.group()), text)
    u = _UPDATES.search(text) if "num_updates=" in text else None
    e = _EPOCH_BATCHES.search(text) if u is None and "batches" in text else None
    m = _COUNTER.search(text) if u is None and e is None else None
    if e is not None:  # batches since the start of the run: (epoch - 1) x batches per epoch + batch
        rest = text[e.end():]
        rec = _metrics(rest, {"iteration": (int(e.group(1)) - 1) * int(e.group(3)) + int(e.group(2))}, units)
    elif u is not None:
        rec = _metrics(text[:u.start()] + text[u.end():], {"iteration": int(u.group(1))}, units)
        rest = ""
    elif m is not None:
        rec = {"iteration": int(m.group(1))}
        if m.group(2):
            rec["train_iters"] = int(m.group(2))
        rest = text[m.end():]
        if _TIMM.match(text):  # a timm-style header: the counter sits among the metrics
            _metrics(text[:m.start()] + " " + rest, rec, units)
        elif "lm_loss" not in _metrics(text[:m.start()], {}):  # a loss before the counter: no record
            _metrics(rest, rec, units)
    else:
        m = _LEADING.match(text)
        if m is None:
            return None
        rec = {"iteration": int(m.group(1))}
        rest = text[m.end():]
        _metrics(rest, rec, units)
        if "lm_loss" not in rec:  # no name for the counter: a loss says it is a step record
            return None
    if "elapsed_ms" not in rec:  # a field of its own that is a time and nothing else: the step's
        t = _TIME_FIELD.search(rest)
        if t is not None:
            rec["elapsed_ms"] = float(t.group(1)) * (1.0 if t.group(2) == "ms" else 1000.0)
    if evaluation and not set(rec) & _STEP_ONLY:  # losses only: an evaluation's line
        return None
    # a loss scale or memory alone ("checkpoint at step 500, loss scale 65536") is no step record
    return rec if set(rec) - {"iteration", "train_iters", "loss_scale", "_memory"} else None


def _metrics(text: str, rec: dict[str, Any], units: dict[str, str] | None = None) -> dict[str, Any]:
    """The named metrics of ``text`` into ``rec`` (the first value of a column wins)."""
    used = 0  # a number is read once: "93.44 s run, 11.8750 loss" gives run 93.44, loss 11.875
    # OpenMMLab's, detectron2's and OpenPCDet's loggers: time in s, memory in MiB
    mmlab = "data_time" in text or "Data time" in text
    for m in _NAME.finditer(text):
        name, per_device = m.group(1).lower(), m.group(2)
        kind = _NAMES[name]
        a = _AFTER.match(text, m.end())
        if a is not None:
            value, unit, used = a.group(2), a.group(3), a.end()
        else:
            b = _BEFORE.search(text, used, m.start())
            if b is None:
                continue
            value, unit, used = b.group(1), b.group(2), m.end()
        try:
            v = float(value.replace(",", "")) * (float(a.group(1)) if a and a.group(1) else 1.0)
        except ValueError:
            continue
        if unit is None and mmlab:
            unit = "s" if kind == "time" else "MiB" if kind == "mem" and value.isdigit() else None
        if unit is None:
            unit = _BARE_UNIT.get(name) or (units or {}).get(name)
        elif kind == "mem" and unit == "M":  # detectron2's ``max_mem: 2996M``: MiB
            unit = "MiB"
        _put(rec, kind, name, v, unit, bool(per_device) or _PER_DEVICE.search(name) is not None)
    return rec


def _put(rec: dict[str, Any], kind: str, name: str, v: float, unit: str | None, per_device: bool) -> None:
    if kind == "none":  # a part of the step (loading data, the forward pass), not the step
        return
    if kind in ("s", "ms", "time"):
        unit = unit or (kind if kind != "time" else None)
        if unit in ("s", "sec"):
            rec.setdefault("elapsed_ms", v * 1000.0)
        elif unit == "ms":
            rec.setdefault("elapsed_ms", v)
    elif kind == "tok":
        col = "tokens_per_gpu_per_sec" if per_device else "tokens_per_sec"
        rec.setdefault(col, v * _SCALE.get(unit or "", 1.0))
    elif kind == "mem":
        if unit in _MIB and "_memory" not in rec:
            peak = "peak" in name or "max" in name
            rec["_memory"] = ("max_allocated_mb" if peak else "allocated_mb", v * _MIB[unit])
    elif kind == "mfu" and v < 0:  # a placeholder before the loop has measured one (-100): no number
        rec.setdefault(kind, None)
    elif unit in (None, "%") or kind == "tflops_per_gpu":
        rec.setdefault(kind, v)


class Records(list):
    """The records gathered (parse.py's ``col.generic``), and the record still open over lines."""

    def __init__(self) -> None:
        super().__init__()
        self.held: str | None = None  # the open record's text so far
        self.wrap = False  # held: a hard-wrapped line (True), or a header with indented lines
        self.rank: int | None = None
        self.last = 0  # the line number it reached
        self.units: dict[str, str] = {}  # name -> unit, from the log's legend of its metrics

    def close(self) -> None:
        text, self.held = self.held, None
        rec = parse(text, self.units) if text is not None else None
        if rec is not None:
            rec["_rank"] = self.rank
            self.append(rec)


def offer(col: Any, line: Any) -> None:
    """A line no other reader took (parse.py, where ``col.generic`` is a list): keep its record."""
    recs, text = col.generic, line.text
    if recs.held is not None:
        more = _WRAPPED.match(text) and not _COUNTER.search(text) if recs.wrap else _INDENTED.match(text)
        if line.lineno <= recs.last + 1 and more:  # (a line with a counter of its own is a new record)
            recs.held += (" " if recs.wrap else ", ") + text.strip()
            recs.last = line.lineno
            if recs.wrap and not text.rstrip().endswith(","):  # the wrapped record's last line
                recs.close()
            return
        recs.close()
    end = text.rstrip()[-1:]
    wrapped = end == "," and _WRAPPED.search(text) is not None
    if wrapped or end in (":", "]") and _HEAD.fullmatch(text):  # a record over several lines
        recs.held, recs.wrap, recs.rank, recs.last = text, wrapped, line.rank, line.lineno
        return
    if "easured in" in text:
        legend = _LEGEND.search(text)
        if legend:
            recs.units[legend.group(1).lower()] = legend.group(2)
    rec = parse(text, recs.units)
    if rec is not None:
        rec["_rank"] = line.rank
        recs.append(rec)


def offer_raw(col: Any, raw: str | bytes, clean: Any, lineno: int) -> None:
    """The same for a raw line (loops.add_lines), cleaned only where it names a metric (or may be
    part of a record over several lines)."""
    end = raw.rstrip()[-1:]
    if may_be_record(raw) or col.generic.held is not None or end in (b":", b"]", ":", "]"):
        for line in split_glued(clean(raw, lineno)):
            offer(col, line)


def lossless(col: Any) -> bool:
    """Whether no record the other readers found holds a loss (DeepSpeed's engine prints
    ``step=N, skipped=0, lr=[...]`` and the training loop its own loss lines: both are read)."""
    return not (col.fast_n or any("lm_loss" in r for r in col.iter_rows)
                or any("lm_loss" in c for c in col.iter_chunks))  # (a placeholder's None is a loss's place)


def finish(col: Any) -> None:
    """Keep the records gathered here only where no other reader found an iteration."""
    if col.generic is not None:
        col.generic.close()
    recs, col.generic = col.generic or [], None
    if col.n_iters and not lossless(col):
        return
    for rec in recs:
        rank, mem = rec.pop("_rank"), rec.pop("_memory", None)
        if mem is not None:
            col.memory.append({"rank": rank, "iteration": rec["iteration"], mem[0]: mem[1]})
        col._add_iteration(rec)
