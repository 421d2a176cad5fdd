"""Step records of any training loop: a step counter and named metrics, whatever the loop.

The readers of loops.py, megatron.py and deepspeed.py each know one loop's lines. This one knows
the shape they all share, for the loops none of them knows: a line that names a step counter
and at least one metric of a known name (a loss scale or a memory size alone is none) is a
step record. It is the fallback: parse.py asks it only in a log where no other reader found an
iteration record (then every line of the log is offered to it), and keeps its records only if
no other reader found one by the end (or none of theirs holds a loss).

The counter: named (``step``, ``global step``, ``num_updates``, ``iteration``, ``iter``, ``it``,
``batch``; ``g_step`` the global one; any case) then ``:``, ``=``, ``#``, ``|``, ``,``, blanks or a
bracket and a whole number or ``N/M`` (M the steps planned); or a batch within an epoch (``Epoch:
[1]  [1480/1504]``, ``[1/3][ 49/323]``, ``Train:  1/3 ( 33%) [ 49/323 ( 15%)]``, ``| epoch   1 |
200/ 2983 batches``, minimind's ``Epoch:[1/1](50/56608)``), the step then the batches since the
run's start (its epochs from 0 where the log prints an epoch 0; no record where another reader
numbers the log's steps, as DeepSpeed's ``step=N``),
and a named counter after such a header the step, the metrics on both sides of it; or, with no
name (or a name of one or two letters: ``s:0 trl:11.0``), the number(s) a line starts with, where it
names a loss (``1|25|Loss: 1.26``); or a range of batches, its last (``2626-3000batch``); or a step
of the steps planned in brackets after a header that names no evaluation (MetricLogger's ``Training
[  10/12500]  eta: ...``; with an epoch before it, a batch within that epoch, as above), or at the
end of a line whose metrics hold a loss (PyTorch's quickstart: ``loss: 2.072397  [ 6400/60000]``). A metric is
read in either order, ``name sep value [unit]`` (``loss: 975.9``, ``Loss=0.01``, ``Loss is 0.5``) or
``value [unit] name`` (``93.44 s run``, ``(57.126 sec/step)``); a name may be qualified
(``lr-DecoupledAdamW/group0``, ``memory/peak_allocated_mem``, ``tokens/s/gpu``). A JSON object or
Python dict anywhere in the line (records.py) is read by the same vocabulary, its keys the names
(objects that each name another epoch are the epochs' summaries, no steps).

A loss printed as ``nan`` or ``inf`` is the loss's place, no number (``Training Loss: nan``).

Names -> columns by concept, whatever the spelling (concepts.py), the corpus rules of
tests/fixtures/logs/real/README.md: a loss (``loss``, ``lm loss``, ``train_loss``, ``total_loss``,
...; else any name ending in ``loss`` that is no running mean: ``closs``; a term ``loss/a/b`` yields to
the record's own ``loss``) -> lm_loss; ``lr`` (``lr_0``: group 0's) ->
lr (``lr(1e-3): Y`` is Y x 1e-3); a step time -> elapsed_ms where a unit says seconds or ms (a
clock says neither; beside a data-loading time, ``data_time``, ``data``, it is seconds; ``ups``,
updates per second, its inverse), or a field of its own that is a time with its unit (``|
8060.78ms |``); ``tok/s``, ``tokens_per_second``, ``tps``, ``wps`` (fairseq's words are tokens) ->
tokens_per_sec, per device or GPU -> tokens_per_gpu_per_sec; ``mfu``; ``TFLOP/s``; ``grad_norm``,
``gnorm``, ``norm``; ``loss_scale``; memory -> a memory row in MiB (max_allocated_mb where the
name says peak or max, which wins, else allocated_mb; without a unit a whole number is MiB, as
torch's bytes / 2**20 print, a fraction GB, as Composer's). A metric of an evaluation (``val
loss``, ``eval_loss``, ``loss/val``) is never read; a line of them is a step record only where it
also prints a metric only a training step has (lr, step time, throughput, MFU, grad norm), and an
object of them (``valid_`` keys) none. A line printed twice is one record per step: parse.py
merges records of one iteration.

Where a line prints several counters the run's is the one named ``global`` (``inner iter: 7/8 | global
iter: 13/5000``); one a ``valid``/``eval`` names is an evaluation's; metrics on both sides of the counter are
the record's (``loss: X, global_step: N``) unless an epoch opens the line (its summary).
A step counter that starts again as the epoch advances counts within epochs (epochs.py).

A record over several lines is joined first (multiline.py), then read here.
"""

from __future__ import annotations

import re
from typing import Any

from labkit.logs import concepts, epochs, records
from labkit.logs.concepts import EVAL, EVAL_PART, NAME
from labkit.logs.records import settle

NUM = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d{1,30})(?:\.\d{0,30})?(?:[eE][-+]?\d{1,3})?(?!\d|:\d|\.\d|,\d{3})"
# a named counter; not inside a word (warmup_steps, train_steps, iteration_step, max_iter)
_COUNTERS = r"(?:global|g)[ _](?:step|iter(?:ation)?)|num_updates|acc_iter|step|iteration|iter|it|batch"
_COUNTER = re.compile(r"(?<![\w/.-])(?i:" + _COUNTERS + r")(?i:\(train\))?"
                      r"(?:\s{0,4}[:=#|,]\s{0,12}|\s{1,12})[\[(]?\s{0,12}(\d{1,3}(?:,\d{3}){1,3}|\d{1,12})(?:\.0{1,8})?(?![\d.]|[,.]\d)"
                      r"(?:\s{0,12}/\s{0,12}(\d{1,12})(?![\d.]))?")
# a batch counter within an epoch: the epoch (named, or the first of two bracketed pairs), then
# ``B/M`` (in brackets or parentheses, or followed by ``batches``): ``Epoch: [1]  [1480/1504]``,
# minimind's ``Epoch:[1/1](50/56608)``, ``Epoch(train)
# [1][ 50/313]``, ``Train:    1/3 ( 33%) [  49/323 ( 15%)]``, ``[1/3][ 49/323]``, ``| epoch   1 |
# 200/ 2983 batches |``; the run's step is then the batches since its start
_EPOCH = re.compile(r"(?i)(?:(?<![\w/.-])(?:epoch(?:\(\w{1,12}\))?|train)\s{0,4}[:=]?\s{0,12}|^\s{0,8}(?=\[))"
                    r"\[?\s{0,4}(\d{1,9})(?:\s{0,4}/\s{0,4}\d{1,9})?\s{0,4}\]?\s{0,4}(?:\(\s{0,3}\d{1,3}%\)\s{0,4})?"
                    r"(?:\|\s{0,4}[\w :/.-]{1,60}?:)?[|,:]?\s{0,12}"
                    r"([\[(])?\s{0,4}(\d{1,12})\s{0,4}/\s{0,4}(\d{1,12})(?![\d.])"
                    r"\s{0,4}(?:\(\s{0,3}\d{1,3}%\)\s{0,4})?(?(2)[\])]|\s{1,4}(?:batches(?!\w)|(?=[A-Za-z])))")
# an epoch, then a loss, then the counter: the epoch's summary (fairseq's ``| epoch 027 | loss 6.343 | ...
# | num_updates 10198``) or a count within it (TFLearn's ``epoch: 001 | loss: 2.03 -- iter: 00512/55000``)
_EPOCH_FIRST = re.compile(r"(?i)(?<![\w/])epoch\s{0,4}[:=]?\s{0,4}\d")
# no name: the numbers a line starts with (epoch|step|..., or one right-aligned step number)
# or the step in brackets before named metrics (CLU's ``[100] learning_rate=..., loss=...``), or the
# step of the steps planned and a colon (zipnerf's ``1/25000:loss=0.05934,psnr=20.902,lr=3.14e-06``)
_LEADING = re.compile(r"\s{0,12}(?:\d{1,6}\|)?(\d{1,12})"
                      r"(?:\s{0,4}\|(?=\s{0,4}[A-Za-z])|\s{1,8}(?=[-+]?\d)|/\d{1,12}:\s{0,4}(?=[A-Za-z]))"
                      r"|\s{0,12}\[(\d{1,12})\]\s{1,8}(?=[A-Za-z])")
# an abbreviated counter starting a line that names a loss (llm.c's ``s:0 trl:10.9 lr:0.000001``)
_ABBREV = re.compile(r"\s{0,12}[A-Za-z]{1,2}[:=](\d{1,12})\s{1,8}(?=[A-Za-z])")
# a step of the steps planned in brackets after a header of any words, before named metrics: the
# MetricLogger of torchvision's reference scripts, DETR, DeiT, MAE, DINO and DINOv2 (``header``, then
# ``[{i}/{n}]``, ``eta: ...``, the meters, ``time: ...``, ``data: ...``, ``max mem: ...``, joined by
# blanks or a tab: DINOv2's ``Training  [   1250/2500000]  eta: ...``); a header naming an
# evaluation (``Test:  [ 10/391]``) makes no step
_BRACKET = re.compile(r"(?:^|\s)\[\s{0,12}(\d{1,12})\s{0,4}/\s{0,4}(\d{1,12})\]"
                      r"(?:\s{1,8}(?=[A-Za-z])|\s{0,8}$)")  # at the end: after its metrics (parse)
_EVAL_HEADER = re.compile(r"(?i)(?<![a-z])(?:test|val|valid|validation|eval|evaluation)(?![a-z])")
# a loss that is no number (``Training Loss: nan``): the loss's place, no value
_NO_NUMBER = re.compile(r"\s{0,4}[:=]\s{0,4}(?:nan|NaN|-?inf|-?Inf)(?![a-z])")
# a range of batches a record averages (ESPnet2's ``16epoch:train:2626-3000batch:``): the step is its last
_RANGE = re.compile(r"(?<![\w.-])\d{1,12}-(\d{1,12})\s{0,2}"
                    r"(?i:batch(?:es)?|iter(?:ation)?s?|steps?)(?![a-z])")
_norm = records.norm
# a unit, or an SI suffix glued to the number (``113.4k tok/s``, ``1.2M``): the value x 1e3, 1e6, 1e9
_UNIT = r"(%|ms|sec|s|GiB|GB|MiB|MB|K|M|B|(?<=\d)[kG])?"
_SI = {"k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "B": 1e9}
# a unit in brackets after a value, a rate's the name of what it measures (MLPerf SSD's ``training time:
# 112.634 [ms], speed: 7954.944 [imgs/sec]``): read as ``112.634 ms``, ``7954.944 imgs/sec``
_BRACKETED_UNIT = re.compile(r"(?<=\d) \[((?:ms|s|sec)|[A-Za-z]{1,12}/[A-Za-z]{1,12})\]")
# a unit or a scale in brackets after the name: ``(ms)``, ``train/lr(1e-3):`` (the value x 1e-3)
# (a time's unit there is the value's: verl's ``train/time(s):7.41``); a closing quote (PaddleDetection's
# ``'loss': 78.4`` on a line that is no dict); a value in numpy's repr (verl's ``np.float64(0.65)``)
_AFTER = re.compile(r"['\"]?\s{0,4}(?:\((?:(ms|s|sec)|[a-zA-Z]{1,4}|(1e-?\d{1,2})"
                    r"|[a-zA-Z]{1,12}(?:/[a-zA-Z]{1,12}){1,3})\)"
                    r"\s{0,2})?(?:[:=]|\s(?i:is)\s)?\s{0,4}"
                    r"(?:np\.(?:float|int)\d{0,2}\(|\{['\"]?[\w.-]{1,40}['\"]?:\s{0,4})?("
                    + NUM + r")\s{0,2}" + _UNIT + r"(?![\w/])")
# (a number type may stand between: llm.c's ``29.2% bf16 MFU``; a value per group, its first group's:
# InternLM's ``grad_norm={'0_default': 44.67}``)
_BEFORE = re.compile(r"(?<![\w.:])(" + NUM + r")\s{0,2}" + _UNIT
                     + r"\s{0,2}(?:(?:bf16|fp16|fp8|fp32|tf32)\s{1,2})?$")
# a data-loading time beside the step's: then a time printed without a unit is in seconds
# (detectron2's, MMEngine's and MetricLogger's ``time: 0.1960  data_time: 0.0033``, ``data: 0.0002``)
_DATA = re.compile(r"(?i)(?<![\w/])data(?:[ _]time| ?\(t\))?(?:\s{0,4}[:=]|\s{1,4}(?=\d))")
# ... and so is one an average meter prints with its running mean (PyTorch's ImageNet example and the
# loops built on it, Swin's ``time 0.6408 (0.6516)``): the meter times ``time.time()``, in seconds
_METER = re.compile(r"\s{0,4}\(\s{0,4}\d{1,6}\.\d{1,8}\s{0,4}\)")


# a bare ``scale`` another word names is none of the loss's (open_clip's ``Logit Scale: 100.000``;
# ``current loss scale`` names the loss's)
_OTHER_SCALE = re.compile(r"(?i)(?<![\w-])(?!loss|grad|dynamic)[a-z]{2,20}[ _-]$")
# the columns only a training step fills: a line of evaluation metrics with one of them is a step's
_STEP_ONLY = frozenset({"lr", "elapsed_ms", "tokens_per_sec", "tokens_per_gpu_per_sec", "mfu",
                        "tflops_per_gpu", "grad_norm"})
_OPTIM_LR = re.compile(r"(?<![\w/])optim\d{1,2}_lr\d{1,2}(?![\w/])")  # _metrics: ESPnet's group lr
_PAIR_TUPLE = re.compile(r"\('([A-Za-z_][\w/]{0,60})',\s{0,2}(?=[-+]?\d)")  # _metrics: a Python pair
# a time with its unit and no name, a field of its own between ``|`` or ``,`` (llama2.c: ``490 |
# loss 5.75 | lr 4.9e-05 | 8060.78ms | mfu 0.21%``)
_TIME_FIELD = re.compile(r"(?:^|[|,])\s{0,4}(" + NUM + r")\s{0,2}(ms|s)\s{0,4}(?:[|,]|$)")
# ... or what the step took, in brackets after its loss (llm.c's ``step 0: train loss 4.367631 (took
# 59.288083 ms)``: the time of its forward, backward and update); "took" alone names no step's time
_TOOK = re.compile(r"\(took\s{1,4}(" + NUM + r")\s{0,2}(ms|s)\)")


# a line that ends in one step's time and prints no other metric (ColossalAI's benchmark: ``INFO:
# Step time: 22.885``, between its wrapped logger lines): seconds where no unit is printed, as the
# clocks of Python's time module count; an optimizer's step is a part of the step (a fork's timer:
# ``mixedprecisionOptimizer | Optimizer step time: 208.09``)
_STEP_TIME = re.compile(r"(?i)(?:^|(?<!optimizer)[\s:|,])(?:step|iter(?:ation)?|batch)[ _]time"
                        r"\s{0,2}[:=]\s{0,4}("
                        + NUM + r")\s{0,2}(ms|s)?\s{0,8}$")


# a line that says only that a step ran, with no metric: a record of its step alone (Lightning Fabric's
# example: ``Iteration 0 complete``, a ViT script's ``Current iteration: 100/500000 (0.0%)``, a job's
# ``RANK 2: running step 1/10`` from each rank: one step)
_PROGRESS = re.compile(r"(?i)\s{0,8}(?:(?:rank|worker|process)\s{0,2}\d{1,7}\s{0,2}[:,-]\s{0,4})?"
                       r"(?:(?:current|running|finished|completed|starting|done with)\s{1,4})?"
                       r"(?:global\s)?(?:step|iteration|iter)\s{0,2}[:#=]?\s{0,4}(\d{1,12})(?:\s{0,2}/\s{0,2}(\d{1,12}))?"
                       r"\s{0,4}(?:\(\s{0,2}\d{1,3}(?:\.\d{1,4})?\s{0,2}%\s{0,2}\))?"
                       r"\s{0,4}(?:complete|completed|done|finished)?\s{0,4}[.!]?\s{0,4}$")


def progress(text: str | bytes) -> bool:
    """A cheap test on a raw line: may it be a step that says only that it ran (_PROGRESS)?"""
    if len(text) >= 200:
        return False
    return b"ter" in text or b"tep" in text if isinstance(text, bytes) else "ter" in text or "tep" in text


def may_be_record(text: str | bytes) -> bool:
    """A cheap test before parse: does the line name any metric at all?"""
    t = text.lower()  # a few substring tests: this runs on every line of a log with no record
    if isinstance(t, bytes):
        return (b"loss" in t or b"lr" in t or b"learning" in t or b"tok" in t or b"mfu" in t
                or b"tflop" in t or b"/step" in t or b"time" in t or b"elapsed" in t or b"norm" in t
                or b"img/s" in t or b"sample" in t)
    return ("loss" in t or "lr" in t or "learning" in t or "tok" in t or "mfu" in t
            or "tflop" in t or "/step" in t or "time" in t or "elapsed" in t or "norm" in t
            or "img/s" in t or "sample" in t)


def parse(text: str, state: Any = None) -> dict[str, Any] | None:
    """A cleaned line (lines.py) -> a step record (``_memory``: (column, MiB)), or None. ``state``
    (a multiline.Records): the units of names printed without one, where the log's legend says them,
    and whether the log's epochs count from 0."""
    if (p := _PROGRESS.match(text) if "ter" in text or "tep" in text else None) is not None:
        return {"iteration": int(p.group(1)), **({"train_iters": int(p.group(2))} if p.group(2) else {})}
    if not may_be_record(text):
        return None
    units = state.units if state is not None else None
    obj = records.find_object(text) if "{" in text else None
    if obj is not None:
        rec = records.step_record(obj, concepts.kind, concepts.put)
        if rec is not None:
            return rec if _is_record(rec) else None  # a counter, no step metric: an evaluation's
    evaluation = EVAL.search(text) is not None
    rec: dict[str, Any]
    if evaluation:  # its metrics are no training step's: masked; the line's own step metrics stay
        text = EVAL.sub(lambda e: "~" * len(e.group()), text)
    m = counter(text)
    e = _EPOCH.search(text) if "/" in text else None
    if m is not None:
        rec = {"iteration": count(m)}
        if m.group(2):
            rec["train_iters"] = int(m.group(2))
            epochs.mark(text, m, rec)
        rest = text[m.end():]
        if e is not None and e.end() <= m.start():  # a progress header first: metrics on both sides
            _metrics(text[e.end():m.start()] + " " + rest, rec, units)
        elif not (_EPOCH_FIRST.search(text, 0, m.start()) and _loss(_metrics(text[:m.start()], {}))):
            _metrics(text[:m.start()] + " " + rest, rec, units)  # both sides: ``loss: X, global_step: N``
    elif e is not None and not _EVAL_HEADER.search(text, 0, e.start()):  # batches since the start (an
        epoch = int(e.group(1))  # evaluation's header: none): epochs before x batches per epoch + batch
        first = 0 if epoch == 0 or state is not None and state.epoch0 else 1
        if state is not None:
            state.epoch0 = first == 0
        rec = {"iteration": (epoch - first) * int(e.group(4)) + int(e.group(3)), "_derived": True}
        rest = text[e.end():]
        _metrics(rest, rec, units)
    elif "[" in text and (b := _BRACKET.search(text)) is not None:  # MetricLogger's ``header  [N/M]``
        if _EVAL_HEADER.search(text, 0, b.start()):
            return None
        rec = {"iteration": int(b.group(1)), "train_iters": int(b.group(2))}
        rest = text[b.end():]
        if not rest.strip():  # after the metrics (PyTorch's quickstart: ``loss: 2.07  [ 6400/60000]``)
            _metrics(text[:b.start()], rec, units)
            if not _loss(rec):
                return None
        else:
            _metrics(rest, rec, units)
    elif (r := _RANGE.search(text)) is not None:  # a range of batches: its last, as a batch count
        rec = {"iteration": int(r.group(1)), "_derived": True}
        rest = text[r.end():]
        _metrics(rest, rec, units)
    else:
        m = _LEADING.match(text) or _ABBREV.match(text)
        if m is None:
            t = _STEP_TIME.search(text)  # a step's time alone: a step, numbered in order where no
            if t is None:  # record of the log prints a counter (records.kept)
                return None
            scale = 1.0 if t.group(2) == "ms" else 1000.0
            return {"iteration": None, "elapsed_ms": float(t.group(1)) * scale}
        rec = {"iteration": int(m.group(1) or m.group(2))}
        rest = text[m.end():]
        _metrics(rest, rec, units)
        if not _loss(rec):  # no name for the counter: a loss says it is a step record
            return None
    if "elapsed_ms" not in rec:  # a field of its own that is a time and nothing else: the step's
        t = _TIME_FIELD.search(rest) or (_TOOK.search(rest) if _loss(rec) else None)
        if t is not None:
            rec["elapsed_ms"] = float(t.group(1)) * (1.0 if t.group(2) == "ms" else 1000.0)
    settle(rec)
    if evaluation and not set(rec) & _STEP_ONLY:  # losses only: an evaluation's line
        return None
    return rec if _is_record(rec) else None


def counter(text: str) -> re.Match | None:
    """The step counter of a line that prints several (MiniLLM's ``inner iter:   7/  8 | ppo epoch:  2/ 4 |
    global iter:     13/  5000|``, ``Batch [50/313], Step [50/1565]``): the run's, the first named
    ``global``, else the one of the most steps planned; else the first."""
    first = _COUNTER.search(text)
    if first is None:
        return None
    rest = list(_COUNTER.finditer(text, first.end()))
    if not rest:
        return first
    named = next((m for m in [first, *rest] if m.group()[:1] in "gG"), None)
    if named is not None:
        return named
    return max([first, *rest], key=lambda m: int(m.group(2) or -1))  # (the first of equals)


def count(m: re.Match) -> int:
    """The step a counter (``counter``) names; BasicSR prints thousands separators (``iter: 505,000``)."""
    return int(m.group(1).replace(",", ""))


def without_counters(text: str) -> str:
    """``text`` with its step counters taken out."""
    return _COUNTER.sub(" ", text)


def fields(text: str) -> dict[str, Any]:
    """The counter and the named metrics of ``text``, wherever they sit: a step's record glued
    after a progress bar that names the step (NeMo's DLLogger line ``DLL ... - 0 reduced_train_loss :
    12.94...  lr : 0.0  global_step : 0.0  ...  grad_norm : 14.86...``)."""
    m = counter(text)
    rec = _metrics(text, {"iteration": count(m)} if m else {})
    settle(rec)
    rec.pop("_memory", None)
    return rec


def metrics(text: str) -> dict[str, Any]:
    """The named metrics of ``text`` alone, no counter (``_memory``: (column, MiB))."""
    rec = _metrics(text, {})
    settle(rec)
    return rec


def _loss(rec: dict[str, Any]) -> bool:
    return "lm_loss" in rec or "_loss" in rec


def _is_record(rec: dict[str, Any]) -> bool:
    # a loss scale or memory alone ("checkpoint at step 500, loss scale 65536") is no step record
    return bool(set(rec) - {"iteration", "train_iters", "loss_scale", "_memory", "_derived", "_epoch",
                            "_object", "_main", "consumed_samples", "_in_epoch"})


def _metrics(text: str, rec: dict[str, Any], units: dict[str, str] | None = None) -> dict[str, Any]:
    """The named metrics of ``text`` into ``rec`` (the first value of a column wins)."""
    used = 0  # a number is read once: "93.44 s run, 11.8750 loss" gives run 93.44, loss 11.875
    if "_lr" in text:  # ESPnet's and FunASR's ``optim0_lr0``: optimizer 0's group 0's learning rate
        text = _OPTIM_LR.sub("lr", text)
    if "('" in text:  # a Python pair printed, ``('loss', 24.221)`` (FunASR's list of them): ``loss: 24.221``
        text = _PAIR_TUPLE.sub(r"\1: ", text)
    if " [" in text:  # a unit in brackets after its value: as without them
        text = _BRACKETED_UNIT.sub(r" \1", text)
    data = "ata" in text and _DATA.search(text) is not None  # a time without a unit: seconds
    for m in NAME.finditer(text):
        group, name, per_device, qualifier = m.group(1), m.group(2), m.group(3), m.group(4)
        kind = concepts.kind(name, qualifier) if not group or not EVAL_PART.search("/" + group) else None
        if kind == "lm_loss" and qualifier[:1] == "/":  # a term (``loss/occ/loss_occ``): the record's
            kind = "loss"  # own ``loss:`` wins, as any name ending in loss
        if kind is None or kind == "loss_scale" and name.lower() == "scale" \
                and _OTHER_SCALE.search(text, 0, m.start()):
            continue
        a = _AFTER.match(text, m.end())
        if a is None and kind in ("lm_loss", "loss") and (q := concepts.qualified(text, m.end())):
            a = _AFTER.match(text, q)  # ``loss native=X``: the loss
        if a is None and kind == "lm_loss" and _NO_NUMBER.match(text, m.end()):
            rec.setdefault("lm_loss", None)  # a loss that is no number: its place
            continue
        if a is not None:
            value, unit, used = a.group(3), a.group(4) or a.group(1), a.end()
        elif qualifier:  # a qualified name is followed by its value
            continue
        else:
            b = _BEFORE.search(text, used, m.start())
            if b is None:
                continue
            value, unit, used = b.group(1), b.group(2), m.end()
        try:
            v = float(value.replace(",", "")) * (float(a.group(2)) if a and a.group(2) else 1.0)
        except ValueError:
            continue
        if unit is None:
            unit = (units or {}).get(name.lower())
        if unit is None and kind == "time" and (data or _METER.match(text, used)):
            unit = "s"
        elif kind == "mem" and unit == "G":  # ``max_mem: 12G``: GiB, as ``2996M`` is MiB
            unit = "GiB"
        elif kind != "mem" and unit in _SI:  # a count with its SI suffix (``113.4k tok/s``, ``1.2M``)
            v, unit = v * _SI[unit], None
        elif kind == "mem" and unit in (None, "M"):  # no unit: a whole number MiB (torch's bytes
            # / 2**20: MetricLogger's ``max mem: 51710``, detectron2's ``max_mem: 2996M``), else GB
            unit = "MiB" if unit == "M" or value.isdigit() else "GB"  # (Composer's ``memory/..._mem``)
            if unit == "MiB" and v >= 2**30:  # a petabyte in MiB: torch's bytes as counted (NeMo 2's
                unit = "bytes"  # ``max_memory_allocated: 53930270720``)
        concepts.put(rec, kind, _norm(name + qualifier), v, unit,
             bool(per_device) or concepts.per_device(name + qualifier))
    return rec


def losses(col: Any) -> int:
    """The records the readers found so far that hold a loss (the fast path's all do)."""
    return (col.fast_n + sum(r.get("lm_loss") is not None for r in col.iter_rows)
            + sum(int(c["lm_loss"].notna().sum()) for c in col.iter_chunks if "lm_loss" in c))


def lossless(col: Any) -> bool:
    """Whether no record the other readers found holds a loss (DeepSpeed's engine prints
    ``step=N, skipped=0, lr=[...]`` and the training loop its own loss lines: both are read)."""
    return not (col.fast_n or any("lm_loss" in r for r in col.iter_rows)
                or any("lm_loss" in c for c in col.iter_chunks))  # (a placeholder's None is a loss's place)


def finish(col: Any) -> None:
    """Keep the records gathered here only where no other reader found an iteration."""
    if col.generic is not None:
        col.generic.close(cut=True)
    recs, col.generic = col.generic or [], None
    if col.n_iters and not lossless(col):
        return
    others = col.n_iters
    epochs.number(recs)  # steps counted within epochs, where the counter starts again
    for rec in records.kept(recs):
        if others and rec.get("_derived"):  # the log numbers its steps: a batch count is none
            continue
        rank, mem = rec.pop("_rank"), rec.pop("_memory", None)
        rec.pop("_derived", None)
        if mem is not None:
            col.memory.append({"rank": rank, "iteration": rec["iteration"], mem[0]: mem[1]})
        col._add_iteration(rec)
