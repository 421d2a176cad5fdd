"""Step lines of training loops that print ``key: value`` pairs after a step counter.

    torchtitan (2024-2026, colours dropped by lines.py):
        ``step:  1  loss: 12.2482  grad_norm:  4.0921  memory: 42.11GiB(44.33%)  tps: 1,234
        tflops: 31.16  mfu: 3.15%`` (older: ``wps: 1,234`` for tps, no grad_norm / tflops)
    picotron:
        ``Step: 1     | Loss: 11.0160 | Time/step: 812.30ms | Global batch size:   1.05M |
        Tokens/s:  28.21K | Tokens/s/GPU:   3.53K | Tokens:   1.05M/10.00B | MFU: 11.22% |
        Memory usage:  13.65GB`` (earlier versions separate the pairs with ``, ``)
    litgpt (its counter is the micro-batch iteration; ``step`` counts optimizer steps):
        ``iter 76 step 38: loss 10.8259, iter time: 197.87ms (optimizer.step)``
        ``Ep 1 | iter 1 | step 1: loss train (curr): 1.657, ... | iter time: 298.27 ms`` (finetuning)
    nanoGPT:
        ``iter 1631: loss 4.0863, time 561.94ms, mfu 38.12%`` (before 2023-02 without mfu)
    fairseq (progress_bar.py's simple and json formats; 2019 printed them behind ``| ``, later
    versions through logging, ``2020-07-17 07:11:02 | INFO | train_inner | ``):
        ``epoch 001:    450 / 1891 loss=11.521, nll_loss=10.881, ppl=1886.05, wps=52922, ups=0.5,
        wpb=104928, bsz=5325, num_updates=445, lr=8.90889e-05, gnorm=1.543, ..., loss_scale=2.000``
        ``{"epoch": 27, "update": 26.267, "loss": "8.206", ..., "wps": "1195.4", "ups": "1.62",
        "num_updates": "33700", "lr": "0.00017226", "gnorm": "1.833", ...}``

scan.py finds torchtitan's and picotron's lines by their ``memory``/``Memory`` field. nanoGPT's
(and nanochat's, MaxText's) hold no trigger word: parse.py reads them from every line of a log with
no Megatron line and no other loop's records (a nanoGPT log with NCCL, CUDA or torchrun lines in it
included). The line must start with the counter (after the prefixes lines.py removes) and name a
loss; the pairs go into the columns Megatron's lines fill (iteration, lm_loss, lr, grad_norm, elapsed_ms,
tokens_per_sec, tflops_per_gpu) plus ``tokens_per_gpu_per_sec`` and ``mfu`` (percent). torchtitan's
``tps``/``wps`` and picotron's ``Tokens/s/GPU`` are per GPU; torchtitan's ``loss: -1.0000`` is the
placeholder of a pipeline stage that holds no loss (no loss). Memory becomes a memory row: torchtitan
prints its peak reserved memory in GiB, picotron ``torch.cuda.memory_reserved() / 1e9`` (GB).
fairseq's step is its ``num_updates`` (the ``450 / 1891`` before it counts batches of the epoch);
lines before 2019 (``| epoch 010 2000 / 8223 loss=1.27 (1.50), wps=962, ...``: the loss, then its
running mean) print no update counter, and their step is the batch count since the start, (epoch -
1) x batches per epoch + batch. ``loss``, ``lr``, ``gnorm`` and ``loss_scale`` fill their columns,
``wps`` (target tokens per second, all GPUs) tokens_per_sec, and ``ups`` (updates per second,
averaged over the log interval) gives elapsed_ms = 1000 / ups. Its end-of-epoch summaries (``| epoch
027 | loss 6.343 | ...``, json records without ``update`` or with ``train_`` keys) average the epoch and are
no step records; nor are its validation lines. fairseq's lines hold no trigger word either
(``oom=0`` aside) and are read as nanoGPT's are.
    pith-train (and other loops printing ``step N/M`` then ``| name value [unit]`` fields):
        ``step 00000001/00000015 | step-time 73.352 sec | cross-entropy-loss 2.6636 | learning-rate
        1.000000e-06 | gradient-norm 20.2657 | tokens-per-second 28,590 | peak-gpu-memory 63.65 GB``
    nanochat (``step N/M (pct%) | name: value | ...``, the same rule; its ``loss`` is the debiased
        running mean it prints, ``dt`` the step time, ``tok/sec`` all GPUs' tokens per second):
        ``step 00010/01000 (1.00%) | loss: 6.123456 | lrm: 1.00 | dt: 123.45ms | tok/sec: 123,456 |
        mfu: 12.34 | total time: 0.12m``
    MaxText (its metric logger; ``lm_loss``, where printed, is the loss without auxiliary terms):
        ``completed step: 10, seconds: 1.150, TFLOP/s/device: 470.000, Tokens/s/device: 57000.000,
        total_weights: 1000, loss: 10.010``
    PyTorch Lightning's progress bar, whose postfix names the step (NeMo 1, Lightning loops):
        ``Epoch 0:   1%|   | 795/77225 [9:07:58<878:01:48, 41.36s/it, loss=3.1, v_num=,
        reduced_train_loss=3.090, global_step=794.0, consumed_samples=1.63e+6]``: the step is
        ``global_step``, the loss NeMo's ``reduced_train_loss`` (else ``train_loss``, else the bar's
        ``loss``, Lightning's running mean); a bar redrawn for the same step is one record. tqdm
        prints a number in the shorter of its exact and its 3-digit form: a step in the 3-digit
        form (``global_step=3.2e+4``) is not known exactly, and the bar is no record.
    OLMo (``log_metrics_to_console``): a record over several lines, a ``[step=1/739328,epoch=0]``
        header behind the logger's prefix, then one indented ``name=value`` line per metric
        (``optim/total_grad_norm=231.7``, ``train/CrossEntropyLoss=12.18``, ``throughput/device/
        tokens_per_second=26,668``, ``System/Peak GPU Memory (MB)=46,911``: max_memory_allocated /
        1e6); :class:`Blocks` gathers it (parse.py feeds every line while one is open).

nanotron's and NeMo 2's lines have the ``|`` fields of Megatron's and are read in megatron.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from labkit.logs import concepts, generic, multiline
from labkit.logs.findings import UNTRIGGERED
from labkit.logs.lines import clean_line
from labkit.logs.scan import _hit

_UNTRIGGERED_B = tuple(w.encode() for w in UNTRIGGERED)  # findings.py's words, for lines of bytes
_NANOGPT = re.compile(r"^\s{0,8}iter (\d{1,12}): loss "
                      r"([-+]?(?:\d{1,20}(?:\.\d{0,20})?(?:[eE][-+]?\d{1,3})?|nan|inf))"
                      r", time (\d{1,20}(?:\.\d{1,20})?)ms"
                      r"(?:, mfu (-?\d{1,20}(?:\.\d{1,20})?)%)?")
_BUILD_NANOGPT = re.compile(r"^(\d{1,12}) train ([-+]?\d{1,20}\.\d{1,20})\s{0,4}$")
_FAIRSEQ = re.compile(r"epoch (\d{1,6}):?\s{1,12}(\d{1,12}) / (\d{1,12})\s{1,12}(?=loss=)")
_FAIRSEQ_PAIR = re.compile(r"(\w{1,40})=([-+]?(?:\d{1,20}(?:\.\d{0,20})?(?:[eE][-+]?\d{1,3})?|nan|inf))"
                           r"(?![\w.])")
_FAIRSEQ_KEYS = {"loss": "lm_loss", "lr": "lr", "gnorm": "grad_norm", "loss_scale": "loss_scale",
                 "wps": "tokens_per_sec"}
_LITGPT = re.compile(r"iter (\d{1,12})(?: \|)? st[eE]p \d{1,12}(?::| \|) loss(?: train(?: \(curr\))?)?:? "
                     r"([-+]?(?:\d{1,20}(?:\.\d{0,20})?(?:[eE][-+]?\d{1,3})?|nan|inf)),"
                     r".{0,200}?iter time: (\d{1,20}(?:\.\d{1,20})?) ?ms")
_START = re.compile(r"^\s{0,8}[Ss]tep:\s{0,12}(\d{1,12})(?=[\s|,])")
_PAIR = re.compile(r"([A-Za-z][\w /.-]{0,40}?):\s{0,12}([-+]?[0-9][0-9,]*(?:\.\d+)?(?:[eE][-+]?\d+)?)"
                   r"\s{0,2}([KMGBT%]|GiB|GB|MiB|MB|ms|s)?(?![\w.])")
_SCALE = {"K": 1e3, "M": 1e6, "G": 1e9, "B": 1e9, "T": 1e12}
# label (lower case) -> column
_KEYS = {"loss": "lm_loss", "lr": "lr", "grad_norm": "grad_norm", "gradnorm": "grad_norm",
         "tps": "tokens_per_gpu_per_sec", "wps": "tokens_per_gpu_per_sec",
         "tokens/s/gpu": "tokens_per_gpu_per_sec", "tokens/s": "tokens_per_sec",
         "tflops": "tflops_per_gpu", "mfu": "mfu", "time/step": "elapsed_ms",
         "memory": "memory", "memory usage": "memory"}
_MIB = {"GiB": 1024.0, "GB": 1e9 / 2**20, "MiB": 1.0, "MB": 1e6 / 2**20}
_NUMBER = r"[-+]?[0-9][0-9,]*(?:\.\d+)?(?:[eE][-+]?\d+)?"
_DASHED = re.compile(r"^\s{0,8}(?:[\w.-]{1,60} \| ){0,2}step (\d{1,12})(?:/(\d{1,12}))?"
                     r"(?: \(\d{1,3}(?:\.\d{1,4})?%\))?\s{0,4}(?=\|)")
_DASHED_PAIR = re.compile(r"\|\s{0,4}([A-Za-z][\w/-]{0,40}):? (" + _NUMBER
                          + r")\s{0,2}(sec|ms|s|GiB|GB|MiB|MB)?(?:\((" + _NUMBER + r")/gpu\))?"
                          r"(?=\s{0,4}(?:\||$))")
_DASHED_KEYS = {"loss": "lm_loss", "cross-entropy-loss": "lm_loss", "lm-loss": "lm_loss",
                "learning-rate": "lr", "lr": "lr", "gradient-norm": "grad_norm", "grad-norm": "grad_norm",
                "grad_norm": "grad_norm", "tokens-per-second": "tokens_per_sec", "tok/sec": "tokens_per_sec",
                "step-time": "elapsed_ms", "dt": "elapsed_ms", "mfu": "mfu", "bf16_mfu": "mfu",
                "peak-gpu-memory": "memory", "mem": "memory", "tps": "tokens_per_sec"}
_HASH_STEP = re.compile(r"^\s{0,8}Step #(\d{1,12})\s{1,8}Loss: (" + _NUMBER + r"|nan|inf)")
_PIPE = re.compile(r"^\s{0,8}steps: (\d{1,12}) loss: (" + _NUMBER + r"|nan|inf) iter time \(s\): ("
                   + _NUMBER + r") samples/sec: (" + _NUMBER + r")")
_MAXTEXT = re.compile(r"completed step: (\d{1,12}), seconds: (" + _NUMBER + r")")
_MAXTEXT_KEYS = {"TFLOP/s/device": "tflops_per_gpu", "TFLOP/s": "tflops_per_gpu",
                 "Tokens/s/device": "tokens_per_gpu_per_sec", "loss": "lm_loss", "lm_loss": "lm_loss"}
_LIGHTNING_LOSS = ("reduced_train_loss", "train_loss", "loss")
_OLMO_HEAD = re.compile(r"\[step=(\d{1,12})/(\d{1,12})(?:,epoch=\d{1,9})?\]\s{0,8}$")
_OLMO_PAIR = re.compile(r"^\s{1,12}([\w/ ().-]{1,80}?)=(" + _NUMBER + r"|nan|inf)\s{0,8}$")
_OLMO_KEYS = {"train/CrossEntropyLoss": "lm_loss", "optim/total_grad_norm": "grad_norm",
              "optim/learning_rate_group0": "lr",
              "throughput/device/tokens_per_second": "tokens_per_gpu_per_sec"}
_OLMO_MEMORY = "System/Peak GPU Memory (MB)"


def may_be_step_line(text: str) -> bool:
    """A cheap test on a cleaned line: can parse_step_line take it?"""
    return ("tep:" in text or ": loss " in text or "num_updates" in text or "loss=" in text
            or ("step " in text and "|" in text) or "iter time" in text or "Step #" in text
            or "steps: " in text or " train " in text)  # "tep:": also MaxText's "completed step: "


def may_be_loop_line(raw: str | bytes) -> bool:
    """A cheap test on a raw line, before it is cleaned: can it be a step line with no trigger word
    (has_no_trigger's, or any parse_step_line takes: ``step:10, loss:3.65``)?"""
    if isinstance(raw, bytes):
        return (b"iter " in raw and (b": loss " in raw or b"iter time" in raw)) or b"num_updates" in raw \
            or b"loss=" in raw or b"completed step: " in raw or (b"step " in raw and b"| loss" in raw) \
            or b"Step #" in raw or b"steps: " in raw or b"tep:" in raw or b" train " in raw
    return ("iter " in raw and (": loss " in raw or "iter time" in raw)) or "num_updates" in raw \
        or "loss=" in raw or "completed step: " in raw or ("step " in raw and "| loss" in raw) \
        or "Step #" in raw or "steps: " in raw or "tep:" in raw or " train " in raw


def has_no_trigger(text: str) -> bool:
    """A step line of a loop whose lines hold no trigger word (nanoGPT's ``iter N: loss X``,
    fairseq's ``epoch 001:  450 / 1891 loss=...`` and json records)."""
    if "num_updates" in text or "loss=" in text:
        return _fairseq(text) is not None
    if "completed step: " in text:
        return _MAXTEXT.search(text) is not None
    if "Step #" in text:
        return _HASH_STEP.match(text) is not None
    if "steps: " in text:  # DeepSpeed's pipeline engine
        return _PIPE.match(text) is not None
    if "step " in text and "|" in text:
        m = _DASHED.match(text)
        if m is not None:
            return _dashed(text, m) is not None
    if "iter time" in text:
        return _LITGPT.search(text) is not None
    if " train " in text and _BUILD_NANOGPT.match(text):  # build-nanoGPT's log file: ``250 train 6.41``
        return True  # (not its val lines)
    return _NANOGPT.match(text) is not None if text.lstrip().startswith("iter ") else False


def _fairseq(text: str) -> dict[str, Any] | None:
    """A fairseq step line (simple or json format) -> an iteration record, or None."""
    start = text.find('{"epoch": ')
    if start >= 0:
        try:
            pairs = json.loads(text[start:])
        except ValueError:
            return None
        if not isinstance(pairs, dict) or "update" not in pairs:  # no "update": an epoch's summary
            return None
    else:
        m = _FAIRSEQ.search(text)
        if m is None:
            return None
        pairs = dict(_FAIRSEQ_PAIR.findall(text, m.end()))
        if "num_updates" not in pairs:  # before 2019: batches since the start of the run
            pairs["num_updates"] = (int(m.group(1)) - 1) * int(m.group(3)) + int(m.group(2))
    try:
        rec: dict[str, Any] = {"iteration": int(pairs["num_updates"])}
        for key, col in _FAIRSEQ_KEYS.items():
            if key in pairs:
                rec[col] = float(pairs[key])
        ups = float(pairs["ups"]) if "ups" in pairs else 0.0
    except (KeyError, ValueError, TypeError):
        return None
    if ups > 0:
        rec["elapsed_ms"] = 1000.0 / ups
    return rec if "lm_loss" in rec else None


def parse_step_line(text: str) -> dict[str, Any] | None:
    """A torchtitan, picotron, nanoGPT or fairseq step line -> an iteration record (``_memory``:
    column, MiB), or None."""
    if "num_updates" in text or "loss=" in text:
        rec = _fairseq(text) if "global_step=" not in text else _lightning(text)
        if rec is not None and "global_step=" in text:  # a bar's postfix is tqdm's rounded copy: the
            end = text.find("]", text.rfind("global_step="))  # step's record glued after it wins
            own = generic.fields(text[end + 1:]) if end >= 0 else {}
            if own.get("iteration") == rec["iteration"] and own.get("lm_loss") is not None:
                rec.update({k: v for k, v in own.items() if not k.startswith("_")}, _exact=True)
            else:
                rec["_bar"] = True
        if rec is not None:
            return rec
    m = _DASHED.match(text) if "|" in text else None
    if m is not None:
        return _dashed(text, m)
    if "completed step: " in text:
        return _maxtext(text)
    m = _HASH_STEP.match(text) if "Step #" in text else None
    if m is not None:  # Horovod's examples: "Step #10<TAB>Loss: 0.924903"
        return {"iteration": int(m.group(1)), "lm_loss": float(m.group(2))}
    m = _PIPE.match(text) if "steps: " in text else None
    if m is not None:  # DeepSpeed's pipeline engine, after its step= line
        return {"iteration": int(m.group(1)), "lm_loss": float(m.group(2)),
                "elapsed_ms": float(m.group(3)) * 1000.0, "samples_per_sec": float(m.group(4))}
    m = _LITGPT.search(text) if "iter time" in text else None
    if m is not None:
        return {"iteration": int(m.group(1)), "lm_loss": float(m.group(2)), "elapsed_ms": float(m.group(3))}
    if " train " in text and (m := _BUILD_NANOGPT.match(text)) is not None:
        return {"iteration": int(m.group(1)), "lm_loss": float(m.group(2))}
    m = _NANOGPT.match(text) if text.lstrip().startswith("iter ") else None
    if m is not None:
        rec = {"iteration": int(m.group(1)), "lm_loss": float(m.group(2)), "elapsed_ms": float(m.group(3))}
        if m.group(4):
            rec["mfu"] = float(m.group(4))
        return rec
    m = _START.match(text)
    if m is None:
        return None
    rec: dict[str, Any] = {"iteration": int(m.group(1))}
    for label, value, unit in _PAIR.findall(text, m.end()):
        col = _KEYS.get(label.strip().lower())
        if col in rec:
            continue
        try:
            v = float(value.replace(",", ""))
        except ValueError:
            continue
        if col is None:  # a name of the loops' vocabulary (tt-train's ``Time: 53570.87 ms``), not a loss
            kind = concepts.kind(label.strip())
            if kind not in (None, "lm_loss", "loss"):
                concepts.put(rec, kind, label.strip().lower(), v, unit or None, concepts.per_device(label))
            continue
        if col == "memory":
            if unit in _MIB:  # torchtitan's GiB are its peak reserved memory, picotron's GB now reserved
                rec["_memory"] = ("max_reserved_mb" if unit == "GiB" else "reserved_mb", v * _MIB[unit])
            continue
        if unit in _SCALE:
            v *= _SCALE[unit]
        elif col == "elapsed_ms" and unit == "s":
            v *= 1000.0
        rec[col] = v
    if rec.get("lm_loss") == -1.0:  # torchtitan: a pipeline stage without the loss prints -1
        rec["lm_loss"] = None
    return rec if "lm_loss" in rec else None


def redrawn(col: Any, rec: dict[str, Any]) -> bool:
    """Whether ``rec`` is a progress bar's rounded copy of a step whose own record (glued after a
    bar) was read already: tqdm redraws its last bar when it closes. Takes the record's marks."""
    exact, bar = rec.pop("_exact", False), rec.pop("_bar", False)
    if exact:
        col.exact_steps.add(rec["iteration"])
    return bar and rec["iteration"] in col.exact_steps


def _lightning(text: str) -> dict[str, Any] | None:
    """A Lightning bar's postfix (``..., reduced_train_loss=3.090, global_step=794.0, ...]``)."""
    pairs = dict(_FAIRSEQ_PAIR.findall(text))
    loss = next((pairs[k] for k in _LIGHTNING_LOSS if k in pairs), None)
    step = pairs.get("global_step", "e")
    if loss is None or "e" in step or "E" in step:  # tqdm prints 3 digits: 3.2e+4 is no step number
        return None
    rec: dict[str, Any] = {"iteration": int(float(step)), "lm_loss": float(loss)}
    if "lr" in pairs:
        rec["lr"] = float(pairs["lr"])
    if "consumed_samples" in pairs:
        rec["consumed_samples"] = int(float(pairs["consumed_samples"]))
    return rec


def _dashed(text: str, m: re.Match) -> dict[str, Any] | None:
    """``step N/M | name value [unit] | ...`` (pith-train) -> an iteration record."""
    rec: dict[str, Any] = {"iteration": int(m.group(1)),
                           "train_iters": int(m.group(2)) if m.group(2) else None}
    for label, value, unit, per_gpu in _DASHED_PAIR.findall(text, m.end()):
        col = _DASHED_KEYS.get(label)
        if col is None or col in rec:
            continue
        v = float(value.replace(",", ""))
        if per_gpu:  # NeMo Automodel: "tps 31039.28(3879.91/gpu)"
            rec["tokens_per_gpu_per_sec"] = float(per_gpu.replace(",", ""))
        if col == "memory":
            if unit in _MIB:
                rec["_memory"] = ("max_allocated_mb", v * _MIB[unit])
            continue
        rec[col] = v * 1000.0 if col == "elapsed_ms" and unit in ("sec", "s") else v
    if rec["train_iters"] is None:
        del rec["train_iters"]
    return rec if "lm_loss" in rec else None


def _maxtext(text: str) -> dict[str, Any] | None:
    """``completed step: 10, seconds: 1.150, TFLOP/s/device: 470.000, Tokens/s/device: 57000.000,
    total_weights: 1000, loss: 10.010[, lm_loss: 10.000, ...]`` (MaxText's metric logger)."""
    m = _MAXTEXT.search(text)
    if m is None:
        return None
    rec: dict[str, Any] = {"iteration": int(m.group(1)), "elapsed_ms": float(m.group(2)) * 1000.0}
    for part in text[m.end():].split(", "):
        label, _, value = part.partition(": ")
        col = _MAXTEXT_KEYS.get(label.strip())
        if col is not None and re.fullmatch(_NUMBER, value.strip()):
            rec[col] = float(value.strip())  # lm_loss, after loss, wins: the loss without auxiliary terms
    return rec if "lm_loss" in rec else None


class Blocks:
    """OLMo's records over several lines: ``feed`` every line; True for a line of an open record."""

    def __init__(self) -> None:
        self.rec: dict[str, Any] | None = None
        self.rank: int | None = None

    @property
    def busy(self) -> bool:
        return self.rec is not None

    def feed(self, line: Any, col: Any) -> bool:
        text = line.text
        if self.rec is not None:
            m = _OLMO_PAIR.match(text)
            if m is not None:
                name, value = m.group(1), m.group(2)
                key = "_memory" if name == _OLMO_MEMORY else _OLMO_KEYS.get(name)
                if key is not None and value not in ("nan", "inf"):
                    self.rec[key] = float(value.replace(",", ""))
                return True
            self.close(col)
        m = _OLMO_HEAD.search(text) if "[step=" in text else None
        if m is None:
            return False
        self.rec, self.rank = {"iteration": int(m.group(1)), "train_iters": int(m.group(2))}, line.rank
        return True

    def close(self, col: Any) -> None:
        """The open record ends (a line that is none of its own, or the end of the file)."""
        rec, self.rec = self.rec, None
        if rec is None or "lm_loss" not in rec:
            return
        mem = rec.pop("_memory", None)
        if mem is not None:  # max_memory_allocated() / 1e6
            col.memory.append({"rank": self.rank, "iteration": rec["iteration"],
                               "max_allocated_mb": mem * 1e6 / 2**20})
        col._add_iteration(rec)


def wanted(col: Any) -> bool:
    """Whether to look for the step lines that hold no trigger word (add_lines, and generic.py's): in
    a log with no record yet, or whose records all came from such lines (read where they sat beside a
    trigger), or whose records with a loss all did (beside DeepSpeed's lossless ``step=N`` records),
    so no other loop's records mix with them."""
    return not col.n_iters or col.n_iters == col.loop_iters or generic.losses(col) == col.loop_losses


def add_lines(col: Any, lines: Iterable[str] | Iterable[bytes], limit: int) -> None:
    """Add the records of the lines among the first ``limit`` bytes of ``lines`` that
    has_no_trigger takes to ``col`` (parse.py's collector; a record read already merges with its
    copy: the same iteration, the same values). In a log with no record yet, every line is also
    offered to generic.py (kept only if no reader finds a record). Loss-scale lines among these
    lines go to the fp16 findings too (``setting loss scale to`` holds no trigger word: the first
    pass saw only those beside a trigger; findings.py counts a line it saw already once)."""
    seen = 0
    if (not col.n_iters or generic.lossless(col)) and col.generic is None:  # any loop's step lines
        col.generic = multiline.Records()
    for lineno, raw in enumerate(lines, 1):
        seen += len(raw)
        if seen > limit:
            break
        if any(w in raw for w in (UNTRIGGERED if isinstance(raw, str) else _UNTRIGGERED_B)):
            col.seen.observe(clean_line(raw, lineno))  # fairseq's ``NOTE: overflow detected, setting
            #          loss scale to: 16.0``, MLPerf's run_stop (findings.py counts a line read twice once)
        if may_be_loop_line(raw):
            text = clean_line(raw, lineno).text
            rec = parse_step_line(text) if has_no_trigger(text) or not _hit(text) else None
            if rec is not None:
                col._add_iteration(rec)
                continue
        if col.generic is not None:
            multiline.offer_raw(col, raw, clean_line, lineno)
