"""Common-format Megatron iteration lines, recognised a line shape at a time (fastscan.py's
fast path).

A line in the common format (an optional launcher prefix, then what ``megatron.COMMON`` matches:
the one definition of its fields and units, ``megatron.COMMON_FIELDS``) becomes one CSV row of
its fields (pandas' C reader makes the table). ``BFAST`` has no literal
digit and no set holding some digits but not all, so whether a line matches, and where each
group lies, is the same for every line that differs from it only in which digits it has: such
lines share one shape, one regex match's field positions, and the rest is slicing, line by line
(``RowMaker.row``) or for a chunk's lines of one shape at once as a byte matrix (``fast_lines``).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from labkit.logs.lines import MAX_LINE_BYTES
from labkit.logs.megatron import COMMON, COMMON_FLOAT
from labkit.logs.scan import _hit

_NUM = rb"([0-9]{1,20}(?:\.[0-9]{1,20})?(?:E[+-][0-9]{1,3})?)"  # always a valid float
_PREFIX = (rb"(?:[ \t]{0,6}[0-9]{1,6}: |\[rank[0-9]{1,6}\]: ?|\[[a-z_]{1,32}[0-9]{1,6}\]: ?"
           rb"|\[[0-9]{1,6},[0-9]{1,6}\]<std(?:out|err)>:)?")
# megatron.COMMON on bytes, ASCII digits, numbers that float() always takes, trailing blanks / CR
BFAST = re.compile(_PREFIX + COMMON.pattern.encode()
                   .replace(COMMON_FLOAT.encode(), _NUM)
                   .replace(rb"\d", rb"[0-9]") + rb"[ \r]*")
_DIGIT_BLIND = bytes.maketrans(b"123456789", b"000000000")
_GROUP_MIN = 8  # fewer counters left than this in a chunk are matched line by line
_MAX_SHAPES = 16  # line shapes tried a chunk at a time before the rest go line by line


class RowMaker:
    """Common-format iteration lines -> CSV rows of their fields, one regex match per line shape
    (a line's shape: its digit-blind form, ``_DIGIT_BLIND``; a fixed-width log has a few)."""

    def __init__(self) -> None:
        self.shapes: dict[bytes, Any] = {}  # digit-blind line -> spans of its fields, or None

    def spans(self, line: bytes) -> Any:
        blind = line.translate(_DIGIT_BLIND)
        try:
            return self.shapes[blind]
        except KeyError:
            pass
        if len(self.shapes) >= 4096:
            self.shapes.clear()
        m = BFAST.fullmatch(line)
        spans = None if m is None else tuple(m.span(g) if m.start(g) >= 0 else (0, 0)
                                             for g in range(1, len(m.groups()) + 1))
        self.shapes[blind] = spans
        return spans

    def row(self, line: bytes) -> bytes | None:
        """``b",".join(BFAST.fullmatch(line).groups(b""))``, or None where it does not match."""
        spans = self.spans(line)
        return None if spans is None else b",".join([line[a:b] for a, b in spans])


def fast_lines(buf: Any, cut: int, iters: list[int], fast: RowMaker,
               cuts: dict[int, bytes]) -> tuple[list[int], list[int], Any, list[int]]:
    """The lines holding an iteration counter (``iters``: end offsets of the counters): (starts,
    ends and CSV rows (``csv_text`` takes them) of the common-format ones, starts of the others),
    each in file order.

    Lines of one shape have their counter at one distance from their start: take the first
    counter's line as the shape, place every other counter's line where that shape would put it,
    and keep those bounded by newlines with the shape's digit-blind form (a byte-matrix compare);
    repeat for what is left, a few shapes, then line by line."""
    a = np.frombuffer(buf, np.uint8, cut)
    todo = np.asarray(iters, dtype=np.int64)  # sorted, one per counter
    got_s: list[np.ndarray] = []
    got_w: list[np.ndarray] = []
    got_r: list[list[bytes] | np.ndarray] = []
    slow: list[int] = []
    for _ in range(_MAX_SHAPES):
        if todo.size < _GROUP_MIN:
            break
        e0 = int(todo[0])
        ls = buf.rfind(b"\n", 0, e0) + 1
        le = buf.find(b"\n", e0, cut)
        le = cut if le < 0 else le
        width = le - ls
        spans = None if width >= MAX_LINE_BYTES or ls in cuts else fast.spans(bytes(buf[ls:le]))
        if spans is None:
            if _hit(bytes(buf[ls:le])):
                slow.append(ls)
            todo = todo[(todo <= ls) | (todo > le)]
            continue
        cand = todo - (e0 - ls)
        cand = cand[(cand >= 0) & (cand + width <= cut)]
        bounded = (cand == 0) | (a[cand - 1] == 10)  # a newline (or the chunk's start) before
        bounded &= (cand + width == cut) | (a[np.minimum(cand + width, cut - 1)] == 10)  # and after
        cand = cand[bounded]
        lines = np.lib.stride_tricks.sliding_window_view(a, width)[cand]
        rep = a[ls:le]  # the same digit-blind form: its digits digits, every other byte equal
        digit = (rep - 48) <= 9
        low, span = np.where(digit, 48, rep).astype(np.uint8), digit.astype(np.uint8) * 9
        same = ~((lines - low) > span).any(1)
        if not same.all():
            cand, lines = cand[same], lines[same]
        got_s.append(cand)
        got_w.append(np.full(len(cand), width))
        got_r.append(_csv_rows(lines, spans))
        i = np.searchsorted(cand, todo, "right") - 1
        at = cand[np.maximum(i, 0)]
        todo = todo[(i < 0) | (todo <= at) | (todo > at + width)]  # counters on other lines
    le = -1
    one_s, one_w, one_r = [], [], []
    for e in todo.tolist():  # the rest, line by line
        if e > le:
            ls = buf.rfind(b"\n", 0, e) + 1
            le = buf.find(b"\n", e, cut)
            le = cut if le < 0 else le
            row = None if ls in cuts or le - ls >= MAX_LINE_BYTES else fast.row(bytes(buf[ls:le]))
            if row is None:
                if _hit(bytes(buf[ls:le])):
                    slow.append(ls)
            else:
                one_s.append(ls)
                one_w.append(le - ls)
                one_r.append(row)
    del a
    if one_s:
        got_s.append(np.asarray(one_s, dtype=np.int64))
        got_w.append(np.asarray(one_w, dtype=np.int64))
        got_r.append(one_r)
    if not got_s:
        return [], [], [], slow
    if len(got_s) == 1:
        s, w, rows = got_s[0], got_w[0], got_r[0]
    else:  # several shapes: rows as bytes, put in file order
        s, w = np.concatenate(got_s), np.concatenate(got_w)
        order = np.argsort(s, kind="stable")
        s, w = s[order], w[order]
        flat = [r for part in got_r for r in (part if isinstance(part, list) else
                                              part.tobytes().split(b"\n")[:-1])]
        rows = [flat[i] for i in order.tolist()]
    return s.tolist(), (s + w).tolist(), rows, slow


def _csv_rows(lines: np.ndarray, spans: tuple[tuple[int, int], ...]) -> np.ndarray:
    """The fields at ``spans`` of each row of the byte matrix ``lines``, as a matrix of CSV rows
    (each ending in a newline)."""
    n = len(lines)
    sep, end = np.full((n, 1), ord(","), np.uint8), np.full((n, 1), ord("\n"), np.uint8)
    cols = [x for a, b in spans for x in (lines[:, a:b], sep)]
    cols[-1] = end
    return np.concatenate(cols, axis=1)


def csv_text(rows: list[bytes] | np.ndarray, start: int, stop: int) -> bytes:
    """CSV text of rows start..stop-1 (each ending in a newline)."""
    if isinstance(rows, np.ndarray):
        return rows[start:stop].tobytes()
    return b"\n".join(rows[start:stop]) + b"\n"
