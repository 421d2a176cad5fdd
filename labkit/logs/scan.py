"""Which lines of a log reach the parsers: a fast pre-filter, with exact context.

Only lines holding a trigger (a word, or an iteration counter) can carry a record or a failure.
For a file, fastscan.py (Aho-Corasick) or else ``grep -E`` (over the whole file, in C) finds them;
Python then reads around them directly (the line before and after, for messages hard-wrapped
over two lines, and every following line while a multi-line record is open: a traceback, the
Megatron argument block, torchrun's failure table). Without either, or for in-memory lines, the
same rules run in Python, line by line. Every path feeds the collector the same lines.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from labkit.errors import LabkitError
from labkit.logs.lines import Line, clean_line, iter_file

# Every record parser and failure rule is gated on one of these words, or on an iteration
# counter (``iteration 5/ 30``: every iteration record has one; the word alone is no record).
TRIGGERS = ("emory", "world size", "WORLD INFO", "dist_world_size", "nnodes=",
            "number of parameters", "Theoretical", "validation loss", "validation results", "test loss",
            "test results", "step=", "SamplesPerSec", "- arguments -", "NCCL", " via ", "rror",
            "xception", "Traceback", "ALLOC", "alloc", "oom", "Out Of Memory", "Kill", "SIGKILL",
            "CANCELLED", "Node failure", "failed on node", "NODE_FAIL", "Watchdog", "imed out", "CUDA",
            "cuda", "Xid", "ECC", "exitcode", "parallel_size", "parallel size", "world_size", "seq_length",
            "world_info=", "{'loss': ", '{"loss": ', "No space", "ENOSPC", "quota", "corrupt",
            "OVERFLOW", "iteration: ")
# "emory": Megatron's and torchtitan's "memory", picotron's "Memory"; "OVERFLOW": DeepSpeed's fp16
# skipped steps; "iteration: ": nanotron's records. With fastscan.py's counter words these are 64
# patterns in an order the Aho-Corasick pass's SIMD prefilter takes well: one more, or one left
# out, made the pass 1.5-2.5x slower (benchmarks/README.md), so a new word replaces an old one.
SPACES = "\t\x0b\x0c\r "  # a space within a line, ASCII only (the same on str and bytes)
_SP = f"[{SPACES}]"
ITERATION_TRIGGER = f"iteration{_SP}{{0,40}}[0-9]{{1,12}}{_SP}{{0,40}}/"
TRIGGER_PATTERNS = (ITERATION_TRIGGER, *(re.escape(t) for t in TRIGGERS))
_TRIGGER_RE = re.compile("|".join(TRIGGER_PATTERNS))
_TRIGGER_B = re.compile("|".join(TRIGGER_PATTERNS).encode())
_ERE_SPECIAL = re.compile(r"([.\[\]()*+?{}|^$\\])")
_GREP_OUT = re.compile(rb"(\d{1,15}):(\d{1,20}):")


class Collector(Protocol):
    busy: bool

    def feed(self, line: Line) -> None: ...


def _complete_record(raw: bytes | str) -> bool:
    """Lines that are whole records on their own need no context lines around them."""
    b = raw.encode("utf-8", "replace") if isinstance(raw, str) else raw
    s = b.rstrip()
    return (b"iteration" in b and s.endswith(b"|")) or b"memory (MB)" in b or b"NCCL INFO" in b


def _hit(raw: bytes | str) -> bool:
    return (_TRIGGER_B if isinstance(raw, bytes) else _TRIGGER_RE).search(raw) is not None


def feed_lines(col: Collector, lines: Iterable[str] | Iterable[bytes], every: int = 0) -> None:
    """The pure-Python path: every line is tested for a trigger. With ``every`` > 0 every line of
    the first ``every`` bytes is fed, trigger or not (a log where no trigger word was found: a
    nanoGPT or fairseq log, launcher lines only)."""
    if every:
        seen = 0
        for lineno, raw in enumerate(lines, 1):
            seen += len(raw)
            if seen > every:
                break
            col.feed(clean_line(raw, lineno))
        return
    prev: tuple[int, Any] | None = None
    fed_prev = True
    force = 0
    for lineno, raw in enumerate(lines, 1):
        hit = _hit(raw)
        if not (hit or force or col.busy):
            prev, fed_prev = (lineno, raw), False
            continue
        context = hit and not _complete_record(raw)
        if context and not fed_prev and prev is not None:
            col.feed(clean_line(prev[1], prev[0]))  # a message may have wrapped onto this line
        col.feed(clean_line(raw, lineno))
        force = 1 if context else max(0, force - 1)  # ... or onto the next one
        prev, fed_prev = (lineno, raw), True


def _line_before(fh: Any, offset: int) -> bytes | None:
    if offset <= 0:
        return None
    start = max(0, offset - 65536)
    fh.seek(start)
    chunk = fh.read(offset - start)
    body = chunk[:-1] if chunk.endswith(b"\n") else chunk
    cut = body.rfind(b"\n")
    return body[cut + 1:] + b"\n" if (cut >= 0 or start == 0) else None


def feed_file_grep(col: Collector, path: Path, grep: str) -> None:
    """The fast path for files: grep finds trigger lines, Python reads their context."""
    ere = [ITERATION_TRIGGER] + [_ERE_SPECIAL.sub(r"\\\1", t) for t in TRIGGERS]
    with tempfile.NamedTemporaryFile("wb", suffix=".patterns", delete=False) as pf:
        pf.write("\n".join(ere).encode() + b"\n")  # the same triggers, as extended regexes
    env = {**os.environ, "LC_ALL": "C"}  # bytes, not characters: invalid UTF-8 cannot stop it
    proc = subprocess.Popen([grep, "-a", "-n", "-b", "-E", "-f", pf.name, "--", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, bufsize=1 << 20)
    last_fed = 0
    try:
        with open(path, "rb") as fh:
            assert proc.stdout is not None
            for out in proc.stdout:
                m = _GREP_OUT.match(out)
                if m is None:
                    continue
                lineno, offset = int(m.group(1)), int(m.group(2))
                if lineno <= last_fed:
                    continue
                raw = out[m.end():]
                context = not _complete_record(raw)
                if context and lineno - 1 > last_fed:
                    before = _line_before(fh, offset)
                    if before is not None:
                        col.feed(clean_line(before, lineno - 1))
                col.feed(clean_line(raw, lineno))
                last_fed = lineno
                pos = offset + len(raw)
                want_next = context
                while want_next or col.busy:  # read on directly while a record is open
                    fh.seek(pos)
                    nxt = fh.readline()
                    if not nxt:
                        break
                    last_fed += 1
                    col.feed(clean_line(nxt, last_fed))
                    pos += len(nxt)
                    want_next = _hit(nxt) and not _complete_record(nxt)
    finally:
        if proc.stdout is not None:
            proc.stdout.close()
        rc = proc.wait()
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.stderr is not None:
            proc.stderr.close()
        os.unlink(pf.name)
    if rc > 1:  # 0: lines found, 1: none found
        raise LabkitError(f"grep failed on {path} (exit {rc}): {err.strip()[:300]}. Set "
                          f"LABKIT_NO_GREP=1 to parse in pure Python.")


def feed_file(col: Collector, path: Path) -> None:
    """Feed the log file at ``path`` to ``col`` (through grep when there is one)."""
    grep = None if os.environ.get("LABKIT_NO_GREP") else shutil.which("grep")
    if grep:
        feed_file_grep(col, path, grep)
    else:
        feed_lines(col, iter_file(path))
