"""The fast path for log files: one compiled multi-pattern pass per large chunk, iteration
lines parsed straight from the bytes.

A big log is mostly iteration lines and chatter. Hyperscan (a compiled multi-pattern engine)
finds every trigger (scan.py's patterns) in chunks of ``CHUNK`` bytes (16 MB) read into one reused
buffer, so memory stays flat in the file size. Lines in the common Megatron format (an optional
launcher prefix, then what ``megatron._FAST`` matches) become one CSV row of their fields in the
collector's column store (``add_fast``; pandas' C reader makes the table): no cleaning, no dict
per line, one regex match per line shape (``_RowMaker``). Every other line is fed exactly as
``scan.feed_lines`` would feed it (the same triggers, the line before a hit and the one after,
every line while a record is open; a line of ``lines.MAX_LINE_BYTES`` or more cut there with a
note, as ``lines.iter_file`` reads it), with its line number counted lazily, so both paths give
the same result (tests/test_logs.py and tests/test_logs_speed.py compare them).

Without the ``hyperscan`` package this path is off and scan.py's grep path runs instead.
"""

from __future__ import annotations

import os
import re
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np

from labkit.logs.lines import CUT_NOTE, MAX_LINE_BYTES, clean_line
from labkit.logs.megatron import _FAST
from labkit.logs.scan import TRIGGER_PATTERNS, _complete_record, _hit

try:  # optional accelerator: hyperscan wheels exist for x86-64 Linux and macOS
    import hyperscan
except ImportError:  # pragma: no cover - depends on the platform
    hyperscan = None

CHUNK = 16 << 20
FAST_PACK_ROWS = 20_000  # as parse._CHUNK_ROWS: rows are packed into a frame this often
_NUM = rb"([0-9]{1,20}(?:\.[0-9]{1,20})?(?:E[+-][0-9]{1,3})?)"  # always a valid float
_PREFIX = (rb"(?:[ \t]{0,6}[0-9]{1,6}: |\[rank[0-9]{1,6}\]: ?|\[[a-z_]{1,32}[0-9]{1,6}\]: ?"
           rb"|\[[0-9]{1,6},[0-9]{1,6}\]<std(?:out|err)>:)?")
# megatron._FAST on bytes, ASCII digits, numbers that float() always takes, trailing blanks / CR
_BFAST = re.compile(_PREFIX + _FAST.pattern.encode()
                    .replace(rb"([0-9][0-9.]{0,30}(?:E[+-]\d{1,3})?)", _NUM)
                    .replace(rb"\d", rb"[0-9]") + rb"[ \r]*")
_db: Any = None


def available() -> bool:
    return hyperscan is not None and not os.environ.get("LABKIT_NO_HYPERSCAN")


def _database() -> Any:
    global _db
    if _db is None:
        exprs = [p.encode() for p in TRIGGER_PATTERNS]
        db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        db.compile(expressions=exprs, ids=list(range(len(exprs))), elements=len(exprs),
                   flags=[0] * len(exprs))
        _db = db
    return _db


def _count_newlines(data: Any, start: int, stop: int) -> int:
    if stop - start < 1 << 16:
        return data.count(b"\n", start, stop)
    a = np.frombuffer(data, np.uint8, stop - start, start)  # a vectorised compare: ~5x bytes.count
    n = int(np.count_nonzero(a == 10))
    del a  # no export of ``data`` outlives the call (a bytearray with one cannot be resized)
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

    def at(self, off: int, buf: bytearray, buf_off: int) -> int:
        if off < buf_off:
            self._count_file(off)
        else:
            self._count_file(buf_off)
            self.n += _count_newlines(buf, self.off - buf_off, off - buf_off)
            self.off = off
        return self.n


_DIGIT_BLIND = bytes.maketrans(b"123456789", b"000000000")


class _RowMaker:
    """Common-format iteration lines -> CSV rows of their fields, one regex match per line shape.

    ``_BFAST`` has no literal digit and no set holding some digits but not all, so whether a line
    matches, and where each group lies, is the same for every line that differs from it only in
    which digits it has: lines with one digit-blind form (``_DIGIT_BLIND``) share one match's
    group spans (a fixed-width log has a few such forms), and the rest is slicing."""

    def __init__(self) -> None:
        self.shapes: dict[bytes, Any] = {}  # digit-blind line -> itemgetter of its fields, or False

    def learn(self, line: bytes) -> Any:
        if len(self.shapes) >= 4096:
            self.shapes.clear()
        m = _BFAST.fullmatch(line)
        get = False if m is None else itemgetter(*(slice(*m.span(g)) if m.start(g) >= 0 else slice(0, 0)
                                                   for g in range(1, len(m.groups()) + 1)))
        self.shapes[line.translate(_DIGIT_BLIND)] = get
        return get

    def row(self, line: bytes) -> bytes | None:
        """``b",".join(_BFAST.fullmatch(line).groups(b""))``, or None where it does not match."""
        get = self.shapes.get(line.translate(_DIGIT_BLIND))
        if get is None:
            get = self.learn(line)
        return b",".join(get(line)) if get else None


def _collect(_id: int, _start: int, end: int, _flags: int, hits: list[int]) -> None:
    hits.append(end)


def feed_file_fast(col: Any, path: Path) -> None:
    """Feed ``path`` to ``col`` (a parse._Collector); same result as scan.feed_lines on its lines."""
    db = _database()
    fast = _RowMaker()
    with open(path, "rb", buffering=0) as f:
        numbers = _LineNumbers(f.fileno())
        buf = bytearray(CHUNK)
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
                buf.extend(bytes(len(buf)))
                view = memoryview(buf)
            n = f.readinto(view[keep:])
            end = keep + n
            if end == 0:
                break
            cut = buf.rfind(b"\n", 0, end) + 1 if n else end
            if cut == 0:
                keep = end
                continue
            hits: list[int] = []
            chunk = view[:cut]
            db.scan(chunk, match_event_handler=_collect, context=hits)
            chunk.release()
            long = _long_lines(buf, cut)
            prev = _feed_chunk(col, view, buf_off, cut, hits, numbers, prev, state, fast, long)
            buf[: end - cut] = buf[cut:end]
            buf_off += cut
            keep = end - cut
            if n == 0:
                break
        view.release()


def _long_lines(buf: bytearray, cut: int) -> dict[int, tuple[int, int]]:
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
    prev = _feed_chunk(col, line, buf_off, len(line), [], numbers, prev, state, fast,
                       {0: (MAX_LINE_BYTES, total)})
    line.release()
    buf[:len(rest)] = rest
    return prev, len(rest), buf_off + total


def _feed_chunk(col: Any, view: memoryview, buf_off: int, cut: int, hits: list[int], numbers: _LineNumbers,
                prev: tuple[int, bytes] | None, state: dict, fast: _RowMaker,
                long: dict[int, tuple[int, int]]) -> tuple[int, bytes] | None:
    """The lines of buf[:cut] in order, as scan.feed_lines visits them: a line with a hit, the
    line before it and after it (unless it is a whole record), every line while col is busy.
    ``prev`` is the (file offset, raw bytes) of the line before buf[0]; the last line is returned.
    A line in ``long`` is cut with a note, and has a hit only if the cut line has one."""
    buf = view.obj
    rfind, find = buf.rfind, buf.find
    rows = col.fast_rows
    add, join, shapes, blind = rows.append, b",".join, fast.shapes, _DIGIT_BLIND
    cuts = {ls: bytes(view[ls:ls + MAX_LINE_BYTES]) + CUT_NOTE[:-1] % (MAX_LINE_BYTES, total)
            for ls, (_, total) in long.items()}
    if cuts:
        hits = [e for e in hits if not any(ls < e <= le for ls, (le, _) in long.items())]
        hits += [ls + 1 for ls, raw in cuts.items() if _hit(raw)]
    hits.sort()  # by end offset; a hit at end offset x lies on the line holding byte x - 1
    force, fed_prev = state["force"], state["fed_prev"]
    pls = ple = -1  # the previous line when it lies in buf (else ``prev`` holds it)
    pos, h, nh = 0, 0, len(hits)
    slow = -1  # the start of a hit line already found not to be a common-format iteration line
    while pos < cut:
        busy = col.busy
        if not (force or busy):
            while True:  # whole common-format iteration lines, one per hit line, as long as they come
                while h < nh and hits[h] <= pos:
                    h += 1
                if h == nh:
                    break
                ls = rfind(b"\n", 0, hits[h]) + 1
                le = find(b"\n", hits[h], cut)
                if le < 0:
                    le = cut
                if ls in cuts:
                    slow = ls
                    break
                line = bytes(view[ls:le])
                get = shapes.get(line.translate(blind))
                if get is None:
                    get = fast.learn(line)
                if not get:
                    slow = ls
                    break
                if col.iter_rows:
                    col.pack_rows()  # the general path's records stay before this row
                add(join(get(line)))
                if len(rows) >= FAST_PACK_ROWS:
                    col._pack_fast()  # empties the same list
                fed_prev, pls, ple, pos = True, ls, le, le + 1
            if pos >= cut:
                break
            if h == nh:  # none left: the chunk's last line becomes the unfed previous line
                end = cut - 1 if buf[cut - 1] == 10 else cut
                pls, ple, fed_prev = max(pos, rfind(b"\n", pos, end) + 1), end, False
                break
            ls = rfind(b"\n", 0, hits[h]) + 1
            if ls > pos:  # lines were skipped: the one just before is the unfed previous line
                pls, ple, fed_prev = rfind(b"\n", 0, ls - 1) + 1, ls - 1, False
        else:
            ls = pos
        le = find(b"\n", ls, cut)
        if le < 0:
            le = cut
        hit = False
        while h < nh and hits[h] <= le:
            hit = hit or hits[h] > ls
            h += 1
        raw = cuts[ls] if ls in cuts else bytes(view[ls:le])
        row = fast.row(raw) if hit and not busy and ls != slow else None
        if row is not None:  # a whole iteration record in the common format
            col.add_fast(row)
            force = 0
        else:
            context = hit and not _complete_record(raw)
            if context and not fed_prev:
                if pls >= 0:
                    prev = (buf_off + pls, cuts.get(pls) or bytes(buf[pls:ple]))
                if prev is not None:
                    col.feed(clean_line(prev[1], numbers.at(prev[0], buf, buf_off)))
            col.feed(clean_line(raw, numbers.at(buf_off + ls, buf, buf_off)))
            force = 1 if context else 0
        fed_prev = True
        pls, ple = ls, le
        pos = le + 1
    state["force"], state["fed_prev"] = force, fed_prev
    return (buf_off + pls, cuts.get(pls) or bytes(buf[pls:ple])) if pls >= 0 else prev
