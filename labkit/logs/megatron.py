"""Megatron-LM (2020-2026), Megatron-DeepSpeed and gpt-neox training-log records.

All three print ``label: value`` fields separated by ``|``. Rather than one regex per version,
an iteration line is split on ``|`` and each label is looked up in ``FIELDS``; unknown fields
are kept as extra columns (losses) or ignored, never an error. Missing fields stay missing
(a skipped iteration prints no ``lm loss``: that is null, never 0).

Formats (see tests/fixtures/logs/README.md for where each comes from):
    `` [2024-05-01 12:00:00] iteration      5/     30 | consumed samples: 40 | elapsed time per
    iteration (ms): 812.3 | throughput per GPU (TFLOP/s/GPU): 0.0 | learning rate: 9.0E-04 |
    global batch size:     8 | lm loss: 7.1E+00 | loss scale: 1.0 | grad norm: 1.234 |
    number of skipped iterations:   0 | number of nan iterations:   0 |``
    Megatron-DeepSpeed: ``elapsed time per iteration (s): 0.41 | ... | TFLOPs: 145.2 |``
    gpt-neox: `` samples/sec: 123.4 | iteration 100/ 320000 | ... | lm_loss: 7.1E+00 |``
    Megatron-LM 2019: `` iteration 100/ 300000 | elapsed time per iteration (ms): 1234.5 | learning
    rate 1.500E-04 | lm loss 7.1E+00 | loss scale 65536.0 |`` (no colon after these labels)
"""

from __future__ import annotations

import math
import re
from typing import Any

from labkit.logs import generic

# --- iteration lines --------------------------------------------------------------------------
_ITER = re.compile(r"(?:^|\s)iteration[:=]?\s{0,40}(\d{1,12})\s{0,40}/\s{0,40}(\d{1,12})")
_TIMESTAMP = re.compile(r"\[(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?)\]")

# label (lower case, spaces collapsed) -> (column, scale)
FIELDS: dict[str, tuple[str, float]] = {
    "consumed samples": ("consumed_samples", 1.0),
    "consumed tokens": ("consumed_tokens", 1.0),
    "elapsed time per iteration (ms)": ("elapsed_ms", 1.0),
    "elapsed time per iteration (s)": ("elapsed_ms", 1000.0),  # Megatron-DeepSpeed
    "throughput per gpu (tflop/s/gpu)": ("tflops_per_gpu", 1.0),
    "tflops": ("tflops_per_gpu", 1.0),  # Megatron-DeepSpeed: per GPU
    "learning rate": ("lr", 1.0),
    "global batch size": ("global_batch_size", 1.0),
    "gloabl batch size": ("global_batch_size", 1.0),  # sic, printed by ModelLink's fork (2023)
    "lm loss": ("lm_loss", 1.0),
    "lm_loss": ("lm_loss", 1.0),  # gpt-neox
    "loss scale": ("loss_scale", 1.0),
    "grad norm": ("grad_norm", 1.0),
    "num zeros": ("num_zeros", 1.0),
    "params norm": ("params_norm", 1.0),
    "number of skipped iterations": ("skipped", 1.0),
    "number of nan iterations": ("nan", 1.0),
    "samples per second": ("samples_per_sec", 1.0),
    "samples/sec": ("samples_per_sec", 1.0),  # gpt-neox
    "tokens per gpu per second (tgs)": ("tokens_per_gpu_per_sec", 1.0),
    "tokens per gpu per second tgs": ("tokens_per_gpu_per_sec", 1.0),  # ezpz's tokens_per_gpu_per_second_tgs=
    "actual seqlen": ("seq_length", 1.0),
    # nanotron (``iteration: 1 / 100 | consumed_tokens: 262K | elapsed_time_per_iteration_ms: 6.53K``)
    "elapsed time per iteration ms": ("elapsed_ms", 1.0),
    "time per iteration ms": ("elapsed_ms", 1.0),
    "tokens per sec": ("tokens_per_sec", 1.0),
    "tokens per sec per gpu": ("tokens_per_gpu_per_sec", 1.0),
    "model tflops per gpu": ("tflops_per_gpu", 1.0),
    "lr": ("lr", 1.0),
    # NeMo 2 / Lightning (``Training epoch 0, iteration 0/99 | lr: 1.5e-07 | global_step: 0 |
    # reduced_train_loss: 11.03 | train_step_timing in s: 12.6 | consumed_samples: 256``)
    "reduced train loss": ("lm_loss", 1.0),
    "train step timing in s": ("elapsed_ms", 1000.0),
    "global step": ("global_step", 1.0),
}
# A line hard-wrapped inside a label ("number of skipped" / "iterations: 0") is joined without a
# space, so labels are also looked up with their spaces removed.
_FIELDS_JOINED = {k.replace(" ", ""): v for k, v in FIELDS.items()}
# gpt-neox prints "approx flops per GPU: 123.4TFLOPS"
_FLOPS_UNIT = re.compile(r"^\s{0,9}([0-9.eE+-]{1,30})\s{0,3}([KMGTPE]?)FLOPS", re.I)
_UNIT_SCALE = {"": 1e-12, "K": 1e-9, "M": 1e-6, "G": 1e-3, "T": 1.0, "P": 1e3, "E": 1e6}
_INT_COLUMNS = ("iteration", "train_iters", "global_batch_size", "consumed_samples", "skipped", "nan")


_HUMAN = {"K": 1e3, "M": 1e6, "G": 1e9, "B": 1e9, "T": 1e12, "P": 1e15}


def _num(value: str) -> float | None:
    value = value.strip()
    try:
        return float(value)
    except ValueError:
        pass
    if len(value) > 1 and value[-1] in _HUMAN:  # nanotron's human format: 262K, 6.53K, 1.2M
        try:
            return float(value[:-1]) * _HUMAN[value[-1]]
        except ValueError:
            return None
    return None


def _label(text: str) -> str:
    return " ".join(text.lower().split())


# The common Megatron-LM line (2021 on, and our engine's): its fields in the order printed, as
# (label, optional). Each label's column and unit are FIELDS' (one scale of 1: the fast paths copy
# the number as printed); a column in _INT_COLUMNS is an integer. From this one table come
# COMMON (the line in one regex match, ~10x faster than the field-by-field path below, which
# every other variant takes) and shapes.py's byte form of it (fastscan.py's table rows).
COMMON_FIELDS = (("consumed samples", False), ("elapsed time per iteration (ms)", False),
                 ("throughput per GPU (TFLOP/s/GPU)", True), ("learning rate", False),
                 ("global batch size", False), ("lm loss", True), ("loss scale", False),
                 ("grad norm", True), ("number of skipped iterations", False),
                 ("number of nan iterations", False))
COMMON_FLOAT = r"([0-9][0-9.]{0,30}(?:E[+-]\d{1,3})?)"  # a float as Megatron prints it
_I = r" {0,20}(\d{1,15})"  # an integer, right-aligned


def _common() -> tuple[re.Pattern, tuple[str, ...]]:
    cols, parts = ["timestamp", "iteration", "train_iters"], []
    for label, optional in COMMON_FIELDS:
        col, scale = FIELDS[_label(label)]
        if scale != 1.0:  # the fast paths copy the number as printed: no unit to convert
            raise ValueError(f"COMMON_FIELDS: {label!r} has scale {scale}; only scale 1 fields fit")
        number = _I if col in _INT_COLUMNS else " " + COMMON_FLOAT
        field = " " + label.replace("(", r"\(").replace(")", r"\)") + ":" + number + r" \|"
        parts.append(f"(?:{field})?" if optional else field)
        cols.append(col)
    start = (r" ?(?:\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,9})?)\] )?"
             r"iteration {0,20}(\d{1,12})/ {0,20}(\d{1,12}) \|")
    return re.compile(start + "".join(parts) + " ?"), tuple(cols)


COMMON, COMMON_COLS = _common()
COMMON_INT = frozenset(c for c in COMMON_COLS if c in _INT_COLUMNS)


def _parse_common(text: str) -> dict[str, Any] | None:
    m = COMMON.fullmatch(text)
    if m is None:
        return None
    rec: dict[str, Any] = {}
    for col, v in zip(COMMON_COLS, m.groups(), strict=True):
        if v is not None:
            rec[col] = v if col == "timestamp" else (int(v) if col in COMMON_INT else float(v))
    return rec


def parse_iteration(text: str) -> dict[str, Any] | None:
    """An iteration line -> a record (dict of column -> value), or None if it is not one."""
    if "|" not in text or "iteration" not in text:
        return None
    try:
        common = _parse_common(text)
    except ValueError:  # e.g. "1.2.3": let the general path decide
        common = None
    if common is not None:
        return common
    return _parse_general(text)


def _parse_general(text: str, shared: bool = True) -> dict[str, Any] | None:
    m = _ITER.search(text)
    if m is None:
        return None
    rec: dict[str, Any] = {"iteration": int(m.group(1)), "train_iters": int(m.group(2))}
    ts = _TIMESTAMP.search(text, 0, m.start() + 1)
    if ts:
        rec["timestamp"] = ts.group(1).replace("T", " ").replace(",", ".")
    for part in text.split("|"):
        if _ITER.search(part):
            continue
        if ":" in part or "=" in part:  # ``name: value``; ezpz's ``name=value`` (Argonne's fork, 2025)
            label, _, value = part.rpartition(":" if ":" in part else "=")
        else:  # Megatron-LM 2019: " learning rate 1.500E-04 | lm loss 7.1E+00 | loss scale 65536.0 |"
            label, _, value = part.strip().rpartition(" ")
            if _label(label) not in FIELDS and not _label(label).endswith("loss"):
                continue
        key = _label(label)
        field = (FIELDS.get(key) or FIELDS.get(key.replace("_", " "))
                 or _FIELDS_JOINED.get(key.replace(" ", "")))
        if field is not None:
            v = _num(value)
            if v is not None:
                rec[field[0]] = v * field[1]
        elif key == "approx flops per gpu":
            fm = _FLOPS_UNIT.match(value)
            if fm and _num(fm.group(1)) is not None:
                rec["tflops_per_gpu"] = float(fm.group(1)) * _UNIT_SCALE[fm.group(2).upper()]
        elif key.endswith("loss") and len(key) < 60:
            v = _num(value)  # extra losses come and go (load balancing, MTP, z-loss)
            if v is not None:
                rec[key.replace(" ", "_").replace("-", "_")] = v
        elif shared:  # a label of no table here (NeMo 2's ``TFLOPS_per_GPU: 48.58``, a fork's ``iteration
            # time: 270.1 s samples/sec: 3.8``): the names every loop shares (concepts.py) read it
            for col, v in generic.metrics(part).items():
                rec.setdefault(col, v)
    if "global_step" in rec:  # Lightning's step counts across epochs; its iteration restarts per epoch
        rec["iteration"] = rec.pop("global_step")
    for k in _INT_COLUMNS:
        if k in rec and math.isfinite(rec[k]) and abs(rec[k]) < 2**53:  # NaN / inf / junk stay float
            rec[k] = int(rec[k])
    return rec


def is_incomplete_iteration(text: str) -> bool:
    """A Megatron iteration line always ends with ``|``; without it the line was hard-wrapped."""
    return ("iteration" in text and not text.rstrip().endswith("|") and "iteration:" not in text
            and "global_step" not in text and _ITER.search(text) is not None)


def wrapped_source(line: Any, pending: dict[tuple, tuple[Any, int, bool]]) -> tuple:
    """The source (rank, host) whose held record ``line`` goes on: its own; a line with no prefix
    right after the last piece of another source's held record goes on with that one (a terminal's
    hard wrap leaves srun's label, a host or a tag on the first piece only)."""
    src = (line.rank, line.host)
    if src in pending or line.rank is not None or line.host is not None:
        return src
    return next((key for key, (first, pieces, _) in pending.items() if first.lineno + pieces == line.lineno),
                src)


def may_go_on(text: str) -> bool:
    """An iteration line that ends in ``|`` but holds no loss yet: a terminal may have wrapped the
    record right after one of its ``|`` (Megatron-Bridge's at 86 columns: ``... | consumed samples:
    5120 |`` / ``elapsed time per iteration (ms): 13212.7 | ... | global batch`` / ...)."""
    return ("loss" not in text and "iteration" in text and text.rstrip().endswith("|")
            and _ITER.search(text) is not None)


def continues(record: str, text: str) -> bool:
    """Whether ``text`` is more of the hard-wrapped record ``record`` that ended in ``|``: it holds
    no iteration counter and joined on, the record reads more known fields."""
    if ":" not in text or "iteration" in text and _ITER.search(text):
        return False
    before, after = _parse_general(record, False), _parse_general(record + text, False)  # (Megatron's own)
    return before is not None and after is not None and len(after) > len(before)


# --- validation / test lines ------------------------------------------------------------------
_VALID = re.compile(
    r"(validation|test) (?:loss|results) at (?:iteration\s{0,20}(\d{1,12})|the end of training)")


def parse_validation(text: str) -> dict[str, Any] | None:
    if "|" not in text or "at " not in text:
        return None
    m = _VALID.search(text)
    if m is None:
        return None
    rec: dict[str, Any] = {"split": m.group(1), "iteration": int(m.group(2)) if m.group(2) else None}
    for part in text[m.end():].split("|"):
        label, sep, value = part.rpartition(":")
        if not sep:
            continue
        key = _label(label).replace("_", " ")
        v = _num(value)
        if v is None:
            continue
        if key in ("lm loss value", "lm loss"):
            rec["lm_loss"] = v
        elif key in ("lm loss ppl", "lm loss ppl value"):
            rec["lm_loss_ppl"] = v
        elif key.endswith("value"):
            rec[key[: -len(" value")].replace(" ", "_")] = v
    return rec


# --- memory report lines ----------------------------------------------------------------------
# Megatron-LM's report_memory(name): ``[Rank 0] (after 5 iterations) memory (MB) | ...``; any name
# that holds an iteration is a row of it (``(before save_checkpoint for iteration 5)``, 2026)
_MEM = re.compile(r"(?:\[Rank (\d{1,6})\] )?\(?(?:after (\d{1,12}) iterations|[a-z][\w ]{0,80}?"
                  r"\biteration (\d{1,12}))\)? memory \(MB\)")
_MEM_FIELDS = {"allocated": "allocated_mb", "max allocated": "max_allocated_mb",
               "reserved": "reserved_mb", "max reserved": "max_reserved_mb"}


def parse_memory(text: str) -> dict[str, Any] | None:
    if "memory (MB)" not in text:
        return None
    m = _MEM.search(text)
    if m is None:
        return None
    rec: dict[str, Any] = {"rank": int(m.group(1)) if m.group(1) else None,
                           "iteration": int(m.group(2) or m.group(3))}
    for part in text[m.end():].split("|"):
        label, sep, value = part.rpartition(":")
        col = _MEM_FIELDS.get(_label(label)) if sep else None
        if col:
            rec[col] = _num(value)
    return rec


# --- layout, parameters, theoretical memory, arguments ----------------------------------------
_WS_OLD = re.compile(r"using world size: (\d{1,9}) and model-parallel size: (\d{1,9})")
_WS = re.compile(r"using world size: (\d{1,9})")
# (some Megatron-LM releases print ``hierarchical context-parallel sizes: Nonetensor-model-parallel size:
# 1``: no comma after that value, None or a list, so the next name follows it glued)
_SIZE = re.compile(r"(?:,\s{0,4}|\s|(?<=sizes: None)|(?<=\]))([a-z-]{2,40}?)[ -]size: (\d{1,9})")
_SIZE_NAMES = {"data-parallel": "dp", "context-parallel": "cp", "tensor-model-parallel": "tp",
               "pipeline-model-parallel": "pp", "expert-model-parallel": "ep"}


def parse_layout(text: str) -> dict[str, int] | None:
    """``using world size: 8, data-parallel size: 2, ...`` (all Megatron-LM variants)."""
    if "using world size" not in text:
        return None
    m = _WS_OLD.search(text)
    if m:  # Megatron v1 (2020): model parallel meant tensor parallel, and there was no pipeline
        # (frames.layout_of makes pp 1 unless Megatron-DeepSpeed's pipe_parallel_size says more);
        # gpt-neox prints the same words (``NeoXArgs.configure_distributed_args() using ...``) and has a
        # pipeline, whose size the line does not say
        return {"world_size": int(m.group(1)), "tp": int(m.group(2)), "v1": int("NeoXArgs" not in text)}
    m = _WS.search(text)
    if m is None:
        return None
    out: dict[str, int] = {"world_size": int(m.group(1))}
    for sm in _SIZE.finditer(text, m.end()):
        name = sm.group(1)
        if name.startswith(("encoder-", "hierarchical")):
            continue  # an encoder size (0 or not) is not the decoder's TP/PP
        key = _SIZE_NAMES.get(name)
        if key and key not in out:
            out[key] = int(sm.group(2))
    return out


_PARAMS = re.compile(r"number of parameters on (?:\(([a-z, ]{1,60})\) )?model parallel rank "
                     r"\(?([0-9, ]{1,40})\)?: (\d{1,15})")


def parse_params(text: str) -> dict[str, Any] | None:
    """`` > number of parameters on (tensor, pipeline) model parallel rank (0, 1): 123456``."""
    if "number of parameters" not in text:
        return None
    m = _PARAMS.search(text)
    if m is None:
        return None
    ranks = [int(x) for x in m.group(2).replace(" ", "").split(",") if x]
    names = [n.strip() for n in m.group(1).split(",")] if m.group(1) else ["tensor"]
    rec: dict[str, Any] = {"parameters": int(m.group(3))}
    for n, r in zip(names, ranks, strict=False):
        rec[f"{n}_rank"] = r
    return rec


_MB = r"(\d{1,15}(?:\.\d{1,9})?)"
_THEORY = re.compile(rf"Theoretical memory footprints: weight and optimizer={_MB} MB"
                     rf"(?:, activation={_MB} MB, total={_MB} MB)?")


def parse_theoretical_memory(text: str) -> dict[str, float] | None:
    if "Theoretical memory" not in text:
        return None
    m = _THEORY.search(text)
    if m is None:
        return None
    out = {"weight_and_optimizer_mb": float(m.group(1))}
    if m.group(2):
        out.update(activation_mb=float(m.group(2)), total_mb=float(m.group(3)))
    return out


# Megatron prints every argument once: "  seq_length ...................................... 1024";
# DeepSpeed its config the same way, after its logger's place: "[config.py:752:print]   world_size
# ................... 16" (world_size: the number of processes)
_ARG = re.compile(r"^(?:\[[\w.]{1,60}:\d{1,7}:print\])?\s{1,4}([a-z_][a-z0-9_]{0,60}) \.{3,80} (.{0,200})$")


# gpt-neox's dump tells where each value came from: ``pipe_parallel_size .... 0.........default``
_SOURCE = re.compile(r"\.{3,}(?:default|updated)$")


def parse_argument(text: str) -> tuple[str, str] | None:
    if "..." not in text:
        return None
    m = _ARG.match(text)
    return (m.group(1), _SOURCE.sub("", m.group(2).strip())) if m else None
