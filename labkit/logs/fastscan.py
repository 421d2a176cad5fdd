"""The fast path for log files: one compiled multi-literal pass per chunk, iteration lines
turned into a table a chunk at a time.

A big log is mostly iteration lines and chatter. An Aho-Corasick automaton (``ahocorasick-rs``,
SIMD-prefiltered, one pass) finds every trigger word of scan.py and every start of an iteration
counter in chunks of ``CHUNK`` bytes read into one reused, page-aligned buffer, so memory stays
flat in the file size. Lines in the common Megatron format (an optional launcher prefix, then
what ``megatron._FAST`` matches) are found a shape at a time (``_fast_lines``: lines that differ
only in their digits share one regex match's field positions) and become CSV rows in the
collector's column store (pandas' C reader makes the table): no cleaning, no dict per line.
Every other line is fed exactly as ``scan.feed_lines`` would feed it (the same triggers, the line
before a hit and the one after, every line while a record is open; a line of
``lines.MAX_LINE_BYTES`` or more cut there with a note, as ``lines.iter_file`` reads it), with its
line number counted lazily, so every path gives the same result (tests/test_logs.py and
tests/test_logs_speed.py compare them).

Without the ``ahocorasick-rs`` package (or with LABKIT_NO_FASTSCAN=1) this path is off and
scan.py's grep path runs instead.
"""

from __future__ import annotations

import mmap
import os
import re
from bisect import bisect_left
from pathlib import Path
from typing import Any

import numpy as np

from labkit.logs.lines import CUT_NOTE, MAX_LINE_BYTES, clean_line
from labkit.logs.megatron import _FAST
from labkit.logs.scan import SPACES, TRIGGERS, _complete_record, _hit

try:  # optional accelerator (wheels for Linux, macOS and Windows)
    import ahocorasick_rs
except ImportError:  # pragma: no cover - depends on the platform
    ahocorasick_rs = None

CHUNK = 2 << 20  # small enough that its scratch memory is reused, not mapped afresh per chunk
FAST_PACK_ROWS = 20_000  # as parse._CHUNK_ROWS: rows are packed into a frame this often
_NUM = rb"([0-9]{1,20}(?:\.[0-9]{1,20})?(?:E[+-][0-9]{1,3})?)"  # always a valid float
_PREFIX = (rb"(?:[ \t]{0,6}[0-9]{1,6}: |\[rank[0-9]{1,6}\]: ?|\[[a-z_]{1,32}[0-9]{1,6}\]: ?"
           rb"|\[[0-9]{1,6},[0-9]{1,6}\]<std(?:out|err)>:)?")
# megatron._FAST on bytes, ASCII digits, numbers that float() always takes, trailing blanks / CR
_BFAST = re.compile(_PREFIX + _FAST.pattern.encode()
                    .replace(rb"([0-9][0-9.]{0,30}(?:E[+-]\d{1,3})?)", _NUM)
                    .replace(rb"\d", rb"[0-9]") + rb"[ \r]*")
_db: Any = None


# Every match of scan.ITERATION_TRIGGER begins with one of these ("iteration", then a space or a
# digit): a superset (also "per iteration (ms)"), so a line they find is confirmed unless its
# whole line is a common-format record.
_COUNTER_WORDS = [f"iteration{c}".encode() for c in SPACES + "0123456789"]
_N_COUNTER = len(_COUNTER_WORDS)  # pattern ids below this are counter words


def available() -> bool:
    return ahocorasick_rs is not None and not os.environ.get("LABKIT_NO_FASTSCAN")


def _database() -> Any:
    global _db
    if _db is None:
        words = _COUNTER_WORDS + [t.encode() for t in TRIGGERS]
        _db = ahocorasick_rs.BytesAhoCorasick(words, matchkind=ahocorasick_rs.MatchKind.LeftmostFirst)
    return _db


def _count_newlines(data: Any, start: int, stop: int) -> int:
    if stop - start < 1 << 16:
        return data[start:stop].count(b"\n")
    a = np.frombuffer(data, np.uint8, stop - start, start)  # a vectorised compare: ~5x bytes.count
    n = int(np.count_nonzero(a == 10))
    del a  # no export of ``data`` outlives the call
    return n


class _LineNumbers:
    """1-based line numbers of file offsets, counted only when asked for (in file order)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.off, self.n = fd, 0, 1

    def _count_file(self, upto: int) -> None:
        while self.off < upto:  # a stretch nobody needed a number in: count it from the file
            block = os.pread(self.fd, min(CHUNK, upto - self.off), self.off)
            if not block:
                break
            self.n += _count_newlines(block, 0, len(block))
            self.off += len(block)

    def at(self, off: int, buf: Any, buf_off: int) -> int:
        if off < buf_off:
            self._count_file(off)
        else:
            self._count_file(buf_off)
            self.n += _count_newlines(buf, self.off - buf_off, off - buf_off)
            self.off = off
        return self.n


_DIGIT_BLIND = bytes.maketrans(b"123456789", b"000000000")
_GROUP_MIN = 8  # fewer counters left than this in a chunk are matched line by line
_MAX_SHAPES = 16  # line shapes tried a chunk at a time before the rest go line by line


class _RowMaker:
    """Common-format iteration lines -> CSV rows of their fields, one regex match per line shape.

    ``_BFAST`` has no literal digit and no set holding some digits but not all, so whether a line
    matches, and where each group lies, is the same for every line that differs from it only in
    which digits it has: lines with one digit-blind form (``_DIGIT_BLIND``) share one match's
    group spans (a fixed-width log has a few such forms), and the rest is slicing: line by line
    (``row``), or for many lines of one shape at once as a byte matrix (``_csv_rows``)."""

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
        m = _BFAST.fullmatch(line)
        spans = None if m is None else tuple(m.span(g) if m.start(g) >= 0 else (0, 0)
                                             for g in range(1, len(m.groups()) + 1))
        self.shapes[blind] = spans
        return spans

    def row(self, line: bytes) -> bytes | None:
        """``b",".join(_BFAST.fullmatch(line).groups(b""))``, or None where it does not match."""
        spans = self.spans(line)
        return None if spans is None else b",".join([line[a:b] for a, b in spans])


def _fast_lines(buf: Any, cut: int, iters: list[int], fast: _RowMaker,
                cuts: dict[int, bytes]) -> tuple[list[int], list[int], Any, list[int]]:
    """The lines holding an iteration counter (``iters``: end offsets of the counters): (starts,
    ends and CSV rows (``_csv`` takes them) of the common-format ones, starts of the others),
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


def _csv(rows: list[bytes] | np.ndarray, start: int, stop: int) -> bytes:
    """CSV text of rows start..stop-1 (each ending in a newline)."""
    if isinstance(rows, np.ndarray):
        return rows[start:stop].tobytes()
    return b"\n".join(rows[start:stop]) + b"\n"


def feed_file_fast(col: Any, path: Path) -> None:
    """Feed ``path`` to ``col`` (a parse._Collector); same result as scan.feed_lines on its lines."""
    db = _database()
    fast = _RowMaker()
    with open(path, "rb", buffering=0) as f:
        numbers = _LineNumbers(f.fileno())
        # An anonymous map is page-aligned: read() copies into it ~4x faster than into a bytearray,
        # whose data sits 16 bytes past an alignment (benchmarks/README.md, log parsing).
        buf = mmap.mmap(-1, CHUNK)
        view = memoryview(buf)
        buf_off = 0  # file offset of buf[0]
        keep = 0  # bytes of an unfinished line carried to the front of buf
        prev: tuple[int, bytes] | None = None  # (file offset, raw) of the last line seen
        state = {"fed_prev": True, "force": 0}
        while True:
            if keep == len(buf):  # one line longer than the buffer
                if keep >= MAX_LINE_BYTES:  # cut it, as lines.iter_file does, and read on to its end
                    prev, keep, buf_off = _feed_long_line(col, f, view, keep, buf_off, numbers, prev, state,
                                                          fast)
                    continue
                view.release()  # grow the buffer
                bigger = mmap.mmap(-1, 2 * len(buf))
                bigger[:keep] = buf[:keep]
                buf, view = bigger, memoryview(bigger)
            n = f.readinto(view[keep:])
            end = keep + n
            if end == 0:
                break
            cut = buf.rfind(b"\n", 0, end) + 1 if n else end
            if cut == 0:
                keep = end
                continue
            chunk = view[:cut]
            found = db.find_matches_as_indexes(chunk)
            chunk.release()
            iters = [e for i, _, e in found if i < _N_COUNTER]
            others = [e for i, _, e in found if i >= _N_COUNTER] if len(iters) < len(found) else []
            del found
            long = _long_lines(buf, cut)
            prev = _feed_chunk(col, view, buf_off, cut, iters, others, numbers, prev, state, fast, long)
            buf[: end - cut] = buf[cut:end]
            buf_off += cut
            keep = end - cut
            if n == 0:
                break
        view.release()


def _long_lines(buf: Any, cut: int) -> dict[int, tuple[int, int]]:
    """Lines of buf[:cut] of MAX_LINE_BYTES or more (start -> end, length with the newline):
    a few backward searches per chunk, each from MAX_LINE_BYTES on to the newline before."""
    out, p = {}, 0
    while cut - p >= MAX_LINE_BYTES:
        q = buf.rfind(b"\n", p, p + MAX_LINE_BYTES)
        if q >= 0:
            p = q + 1
            continue
        le = buf.find(b"\n", p + MAX_LINE_BYTES, cut)
        le = cut if le < 0 else le
        out[p] = (le, le - p + (le < cut))
        p = le + 1
    return out


def _feed_long_line(col: Any, f: Any, view: memoryview, keep: int, buf_off: int, numbers: _LineNumbers,
                    prev: tuple[int, bytes] | None, state: dict, fast: _RowMaker) -> tuple[Any, int, int]:
    """buf (all ``keep`` bytes of it) begins a line with no newline yet: feed that line cut at
    MAX_LINE_BYTES, reading on to its end in the same buffer. Returns (the last line seen, the
    bytes after the line now at the front of buf, their file offset)."""
    buf = view.obj
    head = bytes(buf[:MAX_LINE_BYTES])
    total, rest, ended = keep, b"", False
    while n := f.readinto(view):
        q = buf.find(b"\n", 0, n)
        if q >= 0:
            total, rest, ended = total + q + 1, bytes(buf[q + 1:n]), True
            break
        total += n
    line = memoryview(bytearray(head + b"\n" * ended))
    prev = _feed_chunk(col, line, buf_off, len(line), [], [], numbers, prev, state, fast,
                       {0: (MAX_LINE_BYTES, total)})
    line.release()
    buf[:len(rest)] = rest
    return prev, len(rest), buf_off + total


def _feed_chunk(col: Any, view: memoryview, buf_off: int, cut: int, iters: list[int], others: list[int],
                numbers: _LineNumbers, prev: tuple[int, bytes] | None, state: dict, fast: _RowMaker,
                long: dict[int, tuple[int, int]]) -> tuple[int, bytes] | None:
    """The lines of buf[:cut] in order, as scan.feed_lines visits them: a line with a hit, the
    line before it and after it (unless it is a whole record), every line while col is busy.
    ``iters`` and ``others`` are the end offsets of the hits (iteration counters, other triggers).
    Common-format iteration lines go to the collector as CSV rows, in runs between the other
    lines. ``prev`` is the (file offset, raw bytes) of the line before buf[0]; the last line is
    returned. A line in ``long`` is cut with a note, and has a hit only if the cut line has one."""
    buf = view.obj
    rfind, find = buf.rfind, buf.find
    cuts = {ls: bytes(view[ls:ls + MAX_LINE_BYTES]) + CUT_NOTE[:-1] % (MAX_LINE_BYTES, total)
            for ls, (_, total) in long.items()}
    if cuts:
        def inside(e: int) -> bool:
            return any(ls < e <= le for ls, (le, _) in long.items())
        iters = [e for e in iters if not inside(e)]
        others = [e for e in others if not inside(e)] + [ls + 1 for ls, raw in cuts.items() if _hit(raw)]
    iters.sort()  # by end offset; a hit at end offset x lies on the line holding byte x - 1
    fs, fe, rows, slow = _fast_lines(buf, cut, iters, fast, cuts)
    fast_at = set(fs) if others else set()
    for e in others:
        ls = rfind(b"\n", 0, e) + 1
        if ls not in fast_at:
            slow.append(ls)
    slow = sorted(set(slow))
    k, nf = 0, len(fs)  # the next common-format line to hand over
    fed_to = 0 if state["fed_prev"] else -1  # where the last line fed ends (+1)
    force = state["force"]

    def emit(upto: int) -> None:  # common-format lines k..upto-1
        nonlocal k, fed_to
        if upto > k:
            col.add_fast_rows(_csv(rows, k, upto), upto - k)
            if col.fast_n >= FAST_PACK_ROWS:
                col._pack_fast()
            fed_to = max(fed_to, fe[upto - 1] + 1)
            k = upto

    def feed(ls: int, hit: bool | None) -> int:  # one line the general way; returns where it ends
        nonlocal fed_to, force, prev
        le = find(b"\n", ls, cut)
        if le < 0:
            le = cut
        raw = cuts[ls] if ls in cuts else bytes(view[ls:le])
        context = (_hit(raw) if hit is None else hit) and not _complete_record(raw)
        if context and fed_to != ls:  # the line before was not fed
            if ls > 0:
                pls = rfind(b"\n", 0, ls - 1) + 1
                prev = (buf_off + pls, cuts[pls] if pls in cuts else bytes(buf[pls:ls - 1]))
            if prev is not None:
                col.feed(clean_line(prev[1], numbers.at(prev[0], buf, buf_off)))
        col.feed(clean_line(raw, numbers.at(buf_off + ls, buf, buf_off)))
        fed_to, force = le + 1, context
        return le + 1

    def read_on(pos: int) -> int:  # the lines after a fed one, while a record is open
        nonlocal k, force
        while (force or col.busy) and pos < cut:
            if k < nf and fs[k] == pos and not col.busy:  # a whole record: no context wanted
                emit(k + 1)
                force, pos = 0, fe[k - 1] + 1
                continue
            if k < nf and fs[k] == pos:
                k += 1  # read the general way, inside an open record
            pos = feed(pos, None)
        return pos

    pos = read_on(0)
    for ls in slow:
        if ls < pos:
            continue  # read already, inside an open record
        emit(bisect_left(fs, ls, k))
        pos = read_on(feed(ls, True))
    emit(nf)
    end = cut - 1 if cut and buf[cut - 1] == 10 else cut
    if cut:
        pls = rfind(b"\n", 0, end) + 1
        prev = (buf_off + pls, cuts[pls] if pls in cuts else bytes(buf[pls:end]))
        state["fed_prev"] = fed_to > pls
    state["force"] = force
    return prev
