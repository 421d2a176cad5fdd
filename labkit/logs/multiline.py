"""Step records printed over several lines, joined before generic.py reads them.

:class:`Records` holds a record open over its lines: a step counter alone on its line, then indented
``name: value`` lines (Composer's ``[batch=366/48000]:``, the log's last record read as far as it
goes); a line ending in a ``name=value,`` pair, continued by lines of such pairs (a hard wrap:
fairseq's ``... loss=15.812,`` / ``nll_loss=15.812, ...,`` / ``num_updates=41, ...``); a record a
terminal's wrap cut inside its last field, joined as printed; a JSON object opened at a line's end
(after a bar), held until its braces close; a step counter's line with no metric, continued by lines
indented to the message's column that hold ``name=value`` pairs (a console logger's wrap: rich's,
ColossalAI's ``... Global_Step: 1, Loss: distogram=4.159 ...`` / ``                             ...
loss=162.822 ...``); a step counter alone on its line (after the epoch it is in) and the next line of
its process that names metrics and no counter (a loop printing its step, then its loss: ``Epoch 0/100,
Batch 16/29316`` / ``Total loss is  236.61 ETA is  7:57:00``; where every process prints both, another
process's lines between them are passed over; the log's last counter is a record as far as it goes
where the log showed the pair before); a record's line and the lines indented under it that hold
only ``name: value`` pairs (Knover's); a run of lines of one pair each, a counter among them (verl's
console, the logger tables of OpenAI's baselines: ``| loss | 1.01 |``), one record; a table's header of
named columns, a step counter's first, then a record a row (tf_cnn_benchmarks). A legend of the
metrics' units (``(measured in ms)``) is kept for the names printed without one.
"""

from __future__ import annotations

import re
from typing import Any

from labkit.logs import generic, megatron
from labkit.logs.concepts import EVAL
from labkit.logs.lines import split_glued

_NUM = generic.NUM

# a record over several lines: a header that is a step counter alone (Composer's
# ``[batch=366/48000]:``, ``[epoch=1][batch=16/625]:`` where its run counts epochs), then
# indented ``name: value`` lines; or a line hard-wrapped after a ``name=value,`` pair, continued
# by lines of such pairs (fairseq's records)
_HEAD = re.compile(r"\s{0,8}(?:\[epoch=\d{1,9}\])?\[?(?i:batch|step|iter|iteration)\s{0,2}[=:]?\s{0,4}"
                   r"\d{1,12}(?:/\d{1,12})?\]?:?\s{0,8}")
# (a field may wear a bullet, ``| > loss_disc: 5.96543  (5.96543)``: Coqui's trainer, with the running
# average after it in parentheses)
_INDENTED = re.compile(r"\s{1,16}(?:[|>*•-]\s{0,2}){0,3}[A-Za-z][\w/ .()-]{0,100}?[:=]\s{0,8}" + _NUM
                       + r"\s{0,8}[A-Za-z%]{0,4}(?:\s{0,8}\(" + _NUM + r"\))?\s{0,4}$")
# (or ``name: value,``: CLIP4Clip's ``Epoch: 1/5, Step: 50/2812, Lr: 0.000000004,`` / ``Loss: nan,
# Time/step: 8.152810``; a value of nan too)
_WRAPPED = re.compile(r"\s{0,8}\w{1,40}(?:=|:\s{1,2})(?:" + _NUM + r"|nan|NaN|inf)(?:,|$)")
# a record a terminal's wrap cut inside its last field (a name without its value: MiniLLM's ``... |
# rev_kl: 0.0000 | stu``), and the line that holds the rest (``_lens: 97.3750 | mixed_lens: ...``); or
# cut after the name's colon (YOLOX's ``..., conf_loss: `` / ``10.2, cls_loss: 1.0, ..., lr: 1.235e-06``)
_CUT = re.compile(r"[|,]\s{0,4}[A-Za-z_][A-Za-z_ /-]{0,40}(?:[:=]\s{0,4})?$")
_REST = re.compile(r"\s?(?:[\w/-]{0,40}\s{0,2}[:=]\s{0,8})?" + _NUM)
# a record a console's logger wrapped at the terminal's width onto lines indented to its message's
# column (rich's handler: ColossalAI's ``Training, Epoch: 0, Step: 1, Global_Step: 1, Loss:
# distogram=4.159 ... fape=1.682`` / ``                             lddt=3.912 ... loss=162.822 ...``)
_INDENT = re.compile(r" {12,}[A-Za-z_][\w/.-]{0,60}\s{0,2}[=:]\s{0,4}[-+]?\d")
# a step counter alone on its line, after the epoch it is in (``Epoch 0/100, Batch 16/29316``)
_ALONE = re.compile(r"\s{0,8}(?:(?i:epoch)\s{0,2}[:=]?\s{0,2}\d{1,9}(?:\s{0,2}/\s{0,2}\d{1,9})?[,|]?\s{1,4})?"
                    r"(?i:batch|step|iter|iteration)\s{0,2}[:=#]?\s{0,4}\d{1,12}(?:\s{0,2}/\s{0,2}\d{1,12})?\s{0,8}")
_PAIRED = 8  # the metrics' line comes within this many lines of its counter's
# a step and one value, nothing else, behind a logger's prefix: ColBERT's ``print_message(batch_idx,
# avg_loss)``, ``[Mar 29, 16:21:59] 0 6.256948947906494`` (its value a running mean: no column)
_BARE = re.compile(r"(\d{1,12}) [-+]?\d{1,12}\.\d{1,20}(?:[eE][-+]?\d{1,3})?\s{0,4}")
# a legend of the metrics a loop prints, a row per name, with its unit: ``│ dt │ Elapsed time per
# training step (measured in **ms**) │`` (WordPlay's, ezpz's)
_LEGEND = re.compile(r"^[\W_]{0,8}(\w{1,40})\W{1,12}[^()]{0,200}\(measured in \**(ms|s)\**\)")


# a record printed a ``name: value`` pair a line, a step counter among them (verl's console: ``step:2 ``
# / ``actor/grad_norm:127.3 `` / ...; the logger tables of OpenAI's baselines and of the diffusion
# models built on it: ``| loss       | 1.01     |`` rows between rules of dashes, ``| step | 1.72e+03 |``)
_PAIR = re.compile(r"\s{0,8}\|?\s{0,4}([A-Za-z_][\w/.-]{0,80}?)\s{0,16}[:=|]\s{0,16}(" + _NUM
                   + r")\s{0,16}\|?\s{0,4}")
_PAIR_BYTES = re.compile(_PAIR.pattern.encode())
_RULE = re.compile(r"\s{0,8}-{8,}\s{0,4}")
_COUNTER_NAME = re.compile(r"(?i)(?:global_)?(?:step|iter|iteration|num_updates)")
# a record's line, then lines indented under it of ``name: value`` pairs and nothing else: more of it
# (PaddlePaddle Knover's ``[train][1] progress: 1/1 step: 10, time: 16.498, ...`` / ``<TAB>current lr:
# 0.0000012`` / ``<TAB>lm_loss: 9.0761, ppl: 8743.9768, ...``)
_TAIL = re.compile(r"(?:\t|\s{2,16})(?:[A-Za-z_][\w /.-]{0,40}?:\s{0,8}" + _NUM + r"(?:,\s{0,4}|\s{0,8}$))+")
# the rest of a record a page hard-wrapped at its width: its line ends in a blank, the next holds
# pairs only (two or more), at the margin and without the prefix (detectron2's ``... loss_ce_1: 2.253  ``
# / ``loss_giou_1: 2.033  ...  time: 1386.3151  data_time: 0.1655  lr: 7.2025e-07  max_mem: 2907``)
_WRAPPED_PAIRS = re.compile(r"(?:[A-Za-z_][\w/.-]{0,40}:\s{0,8}" + _NUM + r"\s{1,8}){1,200}"
                            r"[A-Za-z_][\w/.-]{0,40}:\s{0,8}" + _NUM + r"\s{0,8}")
_BLOCK_LINES = 400  # a longer run of pairs is no step's record (a config printed a key a line)
# a table: a header of names, a step counter's first, then a row a step (tf_cnn_benchmarks'
# ``Step<TAB>Img/sec<TAB>total_loss`` over ``1<TAB>images/sec: 47.9 +/- 0.0 (jitter = 0.0)<TAB>9.066``),
# cells apart by a tab or by two blanks or more; each cell's first number is its column's value
_CELLS = re.compile(r"\t|\s{2,}")
_HEAD_CELL = re.compile(r"[A-Za-z][\w/.%()-]{0,40}(?: [A-Za-z][\w/.%()-]{0,40}){0,3}")
# a table drawn with pipes (a Markdown table: ``Step | Training Loss | ...`` over ``-- | -- | ...``;
# Turi Create's box: ``| Iteration    | Loss         | Elapsed Time |``): its cells are between them
_PIPED = re.compile(r"\s{0,8}\|?\s{0,40}[\w.-]{1,40}(?: [\w.-]{1,40}){0,3}\s{0,40}\|")
_FIRST_NUMBER = re.compile(_NUM)


class Records(list):
    """The records gathered (parse.py's ``col.generic``, read by generic.py), and the record still
    open over lines."""

    def __init__(self) -> None:
        super().__init__()
        self.held: str | None = None  # the open record's text so far
        self.wrap = False  # held: a hard-wrapped line (True), or a header with indented lines
        self.cut = False  # held: a line a terminal's wrap cut inside a field (``| stu`` / ``_lens: 97.3``)
        self.rank: int | None = None
        self.last = 0  # the line number it reached
        self.units: dict[str, str] = {}  # name -> unit, from the log's legend of its metrics
        self.epoch0 = False  # the log's epochs count from 0
        self.depth = 0  # held: a JSON object printed over lines (InstructLab's), its braces still open
        self.indent = False  # held: a counter's line with no metric, its record maybe on indented lines
        self.alone = False  # held: a step counter alone on its line, its metrics on its process's next line
        self.paired = False  # the log printed a counter alone, then its metrics
        self.block: list[Any] | None = None  # lines of one ``name: value`` pair each, in a run
        self.names: set[str] = set()  # the block's names so far
        self.columns: list[str] | None = None  # a table's header: the names of its rows' cells
        self.tail = False  # held: a record's line, maybe continued by indented lines of pairs

    def close(self, cut: bool = False) -> None:
        """The open record ends; ``cut``: the log ends in it (read as far as it goes: its header's
        step, whatever its lines hold)."""
        if cut and self.block is not None:
            _close_block(self)
        text, self.held, self.cut, self.depth, self.tail = self.held, None, False, 0, False
        indent, self.indent = self.indent, False
        alone, self.alone = self.alone, False
        rec = generic.parse(text, self) if text is not None else None
        if alone and rec is not None:
            self.paired = True
        if rec is None and cut and text is not None and not self.wrap and not indent \
                and (self.paired or not alone):
            m = generic.counter(text)
            rec = {"iteration": generic.count(m)} if m else None
            if m and m.group(2):
                rec["train_iters"] = int(m.group(2))
        if rec is not None:
            rec["_rank"] = self.rank
            self.append(rec)


def _counters_only(text: str) -> bool:
    """A header of step counters and nothing else but marks (Coqui's ``--> STEP: 0/406 --
    GLOBAL_STEP: 0``): its record's fields follow on indented lines."""
    if not text[-1:].isdigit() or len(text) > 200 or generic.counter(text) is None:
        return False
    return not any(c.isalnum() for c in generic.without_counters(text))


def offer(col: Any, line: Any) -> None:
    """A line no other reader took (parse.py, where ``col.generic`` is a list): keep its record."""
    recs = col.generic
    if "iteration" in line.text and "|" in line.text and recs.held is None and recs.block is None \
            and (rec := megatron.parse_iteration(line.text)) is not None:
        rec["_rank"] = line.rank  # a Megatron record no trigger word found (ezpz's ``iteration= 5/ 9 |``)
        recs.append(rec)
        return
    if recs.block is not None:
        last = recs.block[-1]
        pair = _PAIR.fullmatch(line.text)
        if (pair and line.lineno <= last.lineno + 1 and line.rank == last.rank
                and len(recs.block) < _BLOCK_LINES and pair.group(1) not in recs.names):
            recs.block.append(line)
            recs.names.add(pair.group(1))
            return
        _close_block(recs)  # (a name again: the next step's record begins, ``step: 1`` / ``loss: ..``
        if _RULE.fullmatch(line.text):  # / ``step: 2`` / ``loss: ..``)
            return
    if recs.held is None and not recs.depth and (pair := _PAIR.fullmatch(line.text)):
        recs.block, recs.names = [line], {pair.group(1)}
        return
    piped = line.text.count("|") >= 2 and _PIPED.match(line.text) is not None
    if "\t" in line.text or "  " in line.text.strip() or piped:
        cells = ([c.strip() for c in line.text.strip().strip("|").split("|")] if piped
                 else _CELLS.split(line.text.strip()))
        if recs.columns is not None and len(cells) == len(recs.columns) and cells[0].isdigit():
            _table_row(recs, line, cells)
            return
        if len(cells) > 1 and _table_head(cells):
            recs.columns = cells
            return
    _offer(recs, line)


def _table_head(cells: list[str]) -> bool:
    """A table's header: names only, a step counter's first, a metric's among the others."""
    return (_COUNTER_NAME.fullmatch(cells[0]) is not None and all(_HEAD_CELL.fullmatch(c) for c in cells)
            and bool(generic.metrics(", ".join(f"{c}: 1" for c in cells[1:]))))


def _table_row(recs: Records, line: Any, cells: list[str]) -> None:
    parts = [f"{recs.columns[0]}: {cells[0]}"]
    for name, cell in zip(recs.columns[1:], cells[1:], strict=True):
        m = _FIRST_NUMBER.search(cell)
        if m is not None and not EVAL.search(name):  # (a row is a step's: its evaluation's columns aside)
            parts.append(f"{name}: {m.group()}")
    rec = generic.parse(", ".join(parts), recs)
    if rec is not None:
        rec["_rank"] = line.rank
        recs.append(rec)


def _close_block(recs: Records) -> None:
    """A run of pair lines ends: one record where a counter is among its names, else each line's own."""
    lines, recs.block = recs.block, None
    rec = None
    if len(lines) > 1:
        pairs = [_PAIR.fullmatch(ln.text).groups() for ln in lines]
        text = ", ".join(f"{name}: {_count(value) if _COUNTER_NAME.fullmatch(name) else value}"
                         for name, value in pairs)
        rec = generic.parse(text, recs)
    if rec is not None and rec["iteration"] is not None:
        rec["_rank"] = lines[0].rank
        recs.append(rec)
        return
    for ln in lines:
        _offer(recs, ln)


def _count(value: str) -> str:
    """A step counter printed as a float (``1.72e+03``: the logger's ``%-8.3g``) as the whole number."""
    try:
        v = float(value)
    except ValueError:
        return value
    return str(int(v)) if v.is_integer() else value


def _offer(recs: Records, line: Any) -> None:
    text = line.text
    if recs.held is not None and not text.strip():  # a blank line (a file's last newline) ends none
        return
    if recs.depth:  # an object printed over lines: read whole where its braces close
        recs.held = f"{recs.held} {text.strip()}"
        recs.depth += text.count("{") - text.count("}")
        if recs.depth <= 0 or len(recs.held) > 16000:
            recs.close()
        return
    if recs.held is not None and recs.alone:  # a step counter alone: its metrics on its process's next line
        counted = generic.counter(text) is not None
        if not counted and line.rank != recs.rank and None not in (line.rank, recs.rank):
            return  # another process's line: the held counter waits for its own
        if not counted and line.lineno <= recs.last + _PAIRED and generic.may_be_record(text):
            recs.held += ", " + text.strip()
            recs.close()
            return
        recs.close()
    if recs.held is not None and recs.tail:  # a record's line: indented lines of pairs may go on with it
        wrapped = (recs.held.endswith(" ") and line.rank in (None, recs.rank)
                   and _WRAPPED_PAIRS.fullmatch(text))
        if line.lineno == recs.last + 1 and (line.rank == recs.rank and _TAIL.fullmatch(text) or wrapped) \
                and len(recs.held) < 8000 and not generic.counter(text):
            recs.held += ", " + text.strip()
            recs.last = line.lineno
            return
        recs.close()
    if recs.held is not None and recs.indent:  # a record wrapped onto lines indented to its column
        wrapped = _INDENT.match(text) is not None  # (else lines of pairs under it: a list, comma-joined)
        if line.lineno <= recs.last + 1 and (wrapped or _TAIL.fullmatch(text)) \
                and len(recs.held) < 8000 and not generic.counter(text):
            recs.held += (" " if wrapped else ", ") + text.strip()
            recs.last = line.lineno
            return
        recs.close()
    if recs.held is not None and recs.cut:  # the rest of a field cut at the terminal's width
        if line.lineno <= recs.last + 1 and _REST.match(text) and not generic.counter(text):
            recs.held += (" " if recs.held[-1] in ":=" else "") + text.rstrip()  # the pieces join as printed
            recs.last = line.lineno
            recs.cut = len(recs.held) < 8000 and _CUT.search(recs.held) is not None
            if not recs.cut:
                recs.close()
            return
        recs.close()
    if recs.held is not None:
        if recs.wrap:  # (a line with a counter, where the record has one, is a new record)
            more = _WRAPPED.match(text) and not (generic.counter(text) and generic.counter(recs.held))
        else:
            more = _INDENTED.match(text)
        if line.lineno <= recs.last + 1 and more:
            recs.held += (" " if recs.wrap else ", ") + text.strip()
            recs.last = line.lineno
            if recs.wrap and not text.rstrip().endswith(","):  # the wrapped record's last line
                recs.close()
            return
        recs.close()
    end = text.rstrip()[-1:]
    if end == "{":  # a JSON object opened at the end of a line (after a bar): its keys follow
        recs.held, recs.depth, recs.rank, recs.last = text.rstrip(), 1, line.rank, line.lineno
        return
    wrapped = end == "," and _WRAPPED.search(text) is not None
    if wrapped or end in (":", "]") and _HEAD.fullmatch(text) or _counters_only(text):  # over lines
        recs.held, recs.wrap, recs.rank, recs.last = text, wrapped, line.rank, line.lineno
        return
    if (end.isalpha() or end in "_:=") and _CUT.search(text) and generic.counter(text):  # cut inside a field
        recs.held, recs.cut, recs.rank, recs.last = text.rstrip(), True, line.rank, line.lineno
        return
    if end.isdigit() and _ALONE.fullmatch(text):
        recs.held, recs.alone, recs.rank, recs.last = text, True, line.rank, line.lineno
        return
    if "easured in" in text:
        legend = _LEGEND.search(text)
        if legend:
            recs.units[legend.group(1).lower()] = legend.group(2)
    bare = _BARE.fullmatch(text) if end.isdigit() and line.width > len(text) else None
    if bare is not None:  # a step and one value behind a logger's prefix, nothing else
        recs.append({"iteration": int(bare.group(1)), "_rank": line.rank})
        return
    rec = generic.parse(text, recs)
    if rec is not None:  # read where its lines end (close)
        recs.held, recs.tail, recs.rank, recs.last = text, True, line.rank, line.lineno
    elif generic.may_be_record(text) and generic.counter(text):  # no metric yet: it may go on, indented
        recs.held, recs.indent, recs.rank, recs.last = text, True, line.rank, line.lineno


def _may_end_alone(raw: str | bytes) -> bool:
    """A cheap test on a raw line ending in a digit: may it end in _ALONE's counter or _BARE's pair?"""
    words = (raw[-100:].decode("latin-1") if isinstance(raw, bytes) else raw[-100:]).split()[-2:]
    return len(words) == 2 and (words[0].isdigit() and "." in words[1] or "/" in words[1]
                                or words[0].lower().rstrip(":=#") in ("batch", "step", "iter", "iteration"))


def offer_raw(col: Any, raw: str | bytes, clean: Any, lineno: int) -> None:
    """The same for a raw line (loops.add_lines), cleaned only where it names a metric (or may be
    part of a record over several lines)."""
    end, recs = raw.rstrip()[-1:], col.generic
    if generic.may_be_record(raw) or end in (b":", b"]", b"{", ":", "]", "{") \
            or recs.held is not None or recs.block is not None or recs.columns is not None \
            or end.isdigit() and _may_end_alone(raw) or len(raw) < 200 and _pair_raw(raw) \
            or generic.progress(raw):
        for line in split_glued(clean(raw, lineno)):
            offer(col, line)


def _pair_raw(raw: str | bytes) -> bool:
    return (_PAIR_BYTES if isinstance(raw, bytes) else _PAIR).fullmatch(raw.rstrip()) is not None
