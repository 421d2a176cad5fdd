"""Which lines of a log reach the parsers: the trigger rules, and the line-by-line reader.

Only lines holding a trigger (a word, or an iteration counter) can carry a record or a failure,
with their context: the line before and after (for messages hard-wrapped over two lines), and
every following line while a multi-line record is open (a traceback, the Megatron argument
block, torchrun's failure table). ``feed_lines`` applies these rules line by line (lines in
memory; a file with LABKIT_NO_FASTSCAN=1, the reference the tests compare with);
fastscan.py applies the same rules to a file a chunk at a time (one Aho-Corasick pass over the
same words). Both feed the collector the same lines.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from labkit.logs.lines import Line, clean_line, iter_file

# Every record parser and failure rule is gated on one of these words, or on an iteration
# counter (``iteration 5/ 30``: every iteration record has one; the word alone is no record).
TRIGGERS = ("emory", "world size", "WORLD INFO", "busbw", "nnodes=",
            "number of parameters", "nThread ", "loss at ", "results at ", "File ",
            "CCL version", "step=", "SamplesPerSec", "- arguments -", "NCCL", " via ", "rror",
            "xception", "Traceback", "ALLOC", "alloc", "oom", "nccl-tests", "Kill", "SIGKILL",
            "CANCELLED", "signal", "failed on node", "NODE_FAIL", "Watchdog", "imed out", "CUDA",
            "cuda", "Xid", "ECC", "exit", "parallel_size", "parallel size", "world_size", "seq_length",
            "world_info=", "{'loss': ", '{"loss": ', "No space", "ENOSPC", "quota", "corrupt",
            "OVERFLOW", "iteration: ")
# "exit" and "signal": what launchers say of a worker that ended (launchers.py: torchrun's "exitcode",
# "exited on signal 9", "died from signal 6", "non-zero exit code"); srun's "error: Node failure on"
# holds "rror". "emory": Megatron's and torchtitan's "memory", picotron's "Memory" (and "Theoretical
# memory", "Out Of Memory"); "world_size" covers "dist_world_size"; "OVERFLOW": DeepSpeed's fp16
# skipped steps; "iteration: ": nanotron's records; "File ": a traceback's frames (Python's, IPython's),
# where the log cut its header and its exception line (exceptions.py); "loss at ", "results at ": Megatron's
# validation and test lines; "CCL version": RCCL's banner (NCCL's holds "NCCL"); "nccl-tests",
# "nThread ", "busbw": nccl-tests' header and table (nccltests.py). With fastscan.py's counter words
# these are 64 patterns in an order the Aho-Corasick pass's SIMD prefilter takes well: one more, or
# one left out, made the pass 1.5-2.5x slower (benchmarks/README.md), so a new word replaces an old
# one.
SPACES = "\t\x0b\x0c\r "  # a space within a line, ASCII only (the same on str and bytes)
_SP = f"[{SPACES}]"
ITERATION_TRIGGER = f"iteration{_SP}{{0,40}}[0-9]{{1,12}}{_SP}{{0,40}}/"
TRIGGER_PATTERNS = (ITERATION_TRIGGER, *(re.escape(t) for t in TRIGGERS))
_TRIGGER_RE = re.compile("|".join(TRIGGER_PATTERNS))
_TRIGGER_B = re.compile("|".join(TRIGGER_PATTERNS).encode())


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


def feed_file(col: Collector, path: Path) -> None:
    """Feed the log file at ``path`` to ``col`` line by line (lines.iter_file: streamed, a line
    over lines.MAX_LINE_BYTES cut there). fastscan.feed_file_fast feeds the same lines faster."""
    feed_lines(col, iter_file(path))
