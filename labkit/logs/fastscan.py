"""The fast path for log files: one compiled multi-literal pass per chunk, iteration lines
turned into a table a chunk at a time.

A big log is mostly iteration lines and chatter. An Aho-Corasick automaton (``ahocorasick-rs``,
SIMD-prefiltered, one pass) finds every trigger word of scan.py and every start of an iteration
counter in chunks of ``CHUNK`` bytes read into one reused, page-aligned buffer, so memory stays
flat in the file size. Lines in the common Megatron format (an optional launcher prefix, then
what ``megatron.COMMON`` matches) are found a shape at a time (shapes.py: lines that differ only
in their digits share one regex match's field positions) and become CSV rows in the
collector's column store (pandas' C reader makes the table): no cleaning, no dict per line.
Every other line is fed exactly as ``scan.feed_lines`` would feed it (the same triggers, the line
before a hit and the one after, every line while a record is open; a line of
``lines.MAX_LINE_BYTES`` or more cut there with a note, as ``lines.iter_file`` reads it), with its
line number counted lazily, so every path gives the same result (tests/test_logs.py and
tests/test_logs_speed.py compare them).

``ahocorasick-rs`` is a dependency (wheels for Linux, macOS and Windows, x86-64 and ARM). With
LABKIT_NO_FASTSCAN=1 a file is read line by line instead (scan.feed_file: the reference path).
"""

from __future__ import annotations

import mmap
import os
from bisect import bisect_left
from pathlib import Path
from typing import Any

import ahocorasick_rs
import numpy as np

from labkit.logs.lines import CUT_NOTE, MAX_LINE_BYTES, clean_line
from labkit.logs.scan import SPACES, TRIGGERS, _complete_record, _hit
from labkit.logs.shapes import RowMaker, csv_text, fast_lines

CHUNK = 2 << 20  # small enough that its scratch memory is reused, not mapped afresh per chunk
_db: Any = None


# Every match of scan.ITERATION_TRIGGER begins with one of these ("iteration", then a space or a
# digit): a superset (also "per iteration (ms)"), so a line they find is confirmed unless its
# whole line is a common-format record.
_COUNTER_WORDS = [f"iteration{c}".encode() for c in SPACES + "0123456789"]
_N_COUNTER = len(_COUNTER_WORDS)  # pattern ids below this are counter words


def available() -> bool:
    """False where LABKIT_NO_FASTSCAN is set: read files line by line (scan.feed_file)."""
    return not os.environ.get("LABKIT_NO_FASTSCAN")


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


def feed_file_fast(col: Any, path: Path) -> None:
    """Feed ``path`` to ``col`` (a parse._Collector); same result as scan.feed_lines on its lines."""
    db = _database()
    fast = RowMaker()
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
                    prev: tuple[int, bytes] | None, state: dict, fast: RowMaker) -> tuple[Any, int, int]:
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
                numbers: _LineNumbers, prev: tuple[int, bytes] | None, state: dict, fast: RowMaker,
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
    fs, fe, rows, slow = fast_lines(buf, cut, iters, fast, cuts)
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
            col.add_fast_rows(csv_text(rows, k, upto), upto - k)  # packed every parse._CHUNK_ROWS
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
