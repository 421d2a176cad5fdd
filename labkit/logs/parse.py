"""The streaming driver: one pass over a log, every record kind into its own DataFrame.

A log is streamed, never read whole. scan.py (or fastscan.py) passes on only the lines that can
hold a record (and their context), which is what keeps a 1 GB log fast; each is cleaned
(lines.py) and offered to the record parsers here and to the failure scanner; fastscan.py hands
whole iteration lines in the common format straight to a column store (``add_fast_rows``).
Multi-line records (tracebacks, the argument block, torchrun's failure table, hard-wrapped
iteration lines) make the collector ``busy``: every line is then fed until they close.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from labkit.errors import LabkitError
from labkit.logs import deepspeed, fastscan, generic, loops, megatron, multiline, nccl, nccltests
from labkit.logs.failures import Failure, FailureScanner
from labkit.logs.findings import Seen, program_output
from labkit.logs.frames import (
    ITER_COLUMNS,
    LAYOUT_KEYS,
    frame_of_columns,
    frame_of_rows,
    iterations_frame,
    layout_of,
    plain_records,
)
from labkit.logs.lines import Line, iter_file, split_glued
from labkit.logs.ranking import rank_failures
from labkit.logs.scan import _hit, feed_file, feed_lines

MEMORY_COLUMNS = ["rank", "iteration", "allocated_mb", "max_allocated_mb", "reserved_mb",
                  "max_reserved_mb"]
FAILURE_COLUMNS = ["kind", "rank", "line", "message", "hint"]
NCCL_COLUMNS = ["channel", "conn", "src", "dst", "direction", "via", "transport"]
_MAX_WRAP = 8  # a wrapped iteration line is joined over at most this many pieces
_EVERY_LINE_BYTES = 64 << 20  # a log without one trigger word is read line by line up to here
_CHUNK_ROWS = 20_000  # iteration records are packed into a frame this often
_FAST_DTYPES = {c: "str" if c == "timestamp" else "int64" if c in megatron.COMMON_INT else "float64"
                for c in megatron.COMMON_COLS}
_FAST_OPTIONAL = [c for c in megatron.COMMON_COLS if c == "timestamp" or c not in megatron.COMMON_INT]
# pandas >= 3.1 reads a float as float() does, older ones with round_trip (tests/test_logs_speed.py)
_EXACT_FLOATS: dict[str, str] = ({} if tuple(map(int, pd.__version__.split(".")[:2])) >= (3, 1)
                                  else {"float_precision": "round_trip"})


@dataclass
class ParsedLog:
    """Everything one log (or several logs of one run) says, one DataFrame per record kind."""

    iterations: pd.DataFrame
    memory: pd.DataFrame
    validation: pd.DataFrame
    params: pd.DataFrame
    nccl: pd.DataFrame
    failures: pd.DataFrame
    layout: dict[str, int | None]
    nccl_version: str | None = None
    nccl_build: str | None = None
    """What the NCCL banner says after ``+`` (``cuda12.1`` in ``NCCL version 2.18.1+cuda12.1``)."""
    args: dict[str, str] = field(default_factory=dict)
    theoretical_memory: dict[str, float] | None = None
    failure_records: list[Failure] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    parse_errors: int = 0
    """Lines a parser choked on and skipped (0 in every test; see ``first_parse_error``)."""
    first_parse_error: str | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)
    """What the log shows as a whole (findings.py): where a job without iterations stopped, a
    collapsing fp16 loss scale; ``[{"kind", "line", "message"}]``."""
    tools: list[str] = field(default_factory=list)
    """The tools whose lines the log holds (NCCL, torch, DeepSpeed, Megatron, HF, Slurm, CUDA, ...)."""
    nccl_tests: list[dict[str, Any]] = field(default_factory=list)  # nccltests.py: its tables

    def to_dict(self) -> dict[str, Any]:
        """The ``labkit parse --json`` document (DESIGN.md section 5); null where the log is silent."""
        its = self.iterations.reindex(columns=ITER_COLUMNS[:-1])
        mem = self.memory.reindex(columns=MEMORY_COLUMNS)
        channels = self.nccl.reindex(columns=NCCL_COLUMNS)
        return {
            "layout": {k: self.layout.get(k) for k in LAYOUT_KEYS},
            "iterations": plain_records(its),
            "memory": plain_records(mem),
            "nccl": {"version": self.nccl_version,
                     "transports": nccl.summarize(plain_records(channels)),
                     "channels": plain_records(channels), "tests": self.nccl_tests},
            "failures": [f.to_dict() for f in self.failure_records],
            "findings": list(self.findings),
        }


class _Collector:
    def __init__(self, every: bool = False) -> None:
        # Iteration records are packed into DataFrame chunks as they come, so memory grows with
        # the compact table, not with one Python dict per iteration.
        self.iter_rows: list[dict[str, Any]] = []
        self.fast_rows: list[bytes] = []  # whole Megatron lines as CSV text (fastscan.py)
        self.fast_n = 0  # rows in fast_rows
        self.iter_chunks: list[pd.DataFrame] = []
        self.memory: list[dict[str, Any]] = []
        self.validation: list[dict[str, Any]] = []
        self.params: list[dict[str, Any]] = []
        self.channels: dict[tuple, dict[str, Any]] = {}
        self.layout: dict[str, int | None] = {}
        self.launcher: dict[str, int] = {}
        self.steps = deepspeed.Steps()  # DeepSpeed and Hugging Face Trainer step numbering
        self.args: dict[str, str] = {}
        self.theory: dict[str, float] | None = None
        self.nccl_version: str | None = None
        self.nccl_build: str | None = None
        self.scanner = FailureScanner()
        self.seen = Seen()  # tools, NCCL start-up, fp16 loss scale (findings.py)
        self.tables, self.blocks = nccltests.Tables(), loops.Blocks()  # nccl-tests output, OLMo records
        self.pending: dict[tuple, tuple[Line, int, bool]] = {}  # wrapped iteration lines, per source
        # iteration records; of them, those from lines with no trigger word (nanoGPT's); and with a loss
        self.n_iters = self.loop_iters = self.loop_losses = 0
        self.exact_steps: set[int] = set()  # steps read from a record glued after a progress bar
        self.errors = 0
        self.in_args = 0  # lines left in Megatron's argument block (read whole, no trigger words)
        self.first_error: str | None = None
        self.generic: multiline.Records | None = multiline.Records() if every else None  # generic.py

    @property
    def busy(self) -> bool:
        return (self.scanner.busy or bool(self.pending) or self.in_args > 0 or self.tables.busy
                or self.blocks.busy)

    def feed(self, line: Line) -> None:
        for part in split_glued(line):  # a message with the next one's prefix glued to its end
            self._feed(part)

    def _feed(self, line: Line) -> None:
        if self.in_args:
            self.in_args = 0 if "end of arguments" in line.text else self.in_args - 1
        elif "- arguments -" in line.text:
            self.in_args = 5000
        src = megatron.wrapped_source(line, self.pending)
        held = self.pending.pop(src, None)
        if held is not None and (deepspeed.starts_record(line.text) and not held[2]
                                 or held[2] and not megatron.continues(held[0].text, line.text)):
            self._safe(held[0])  # a new record, not a continuation: the held one ends here
            held = None
        if held is not None:
            first, pieces, _ = held
            line = Line(first.lineno, first.rank, first.text + line.text, first.host)
            if pieces < _MAX_WRAP:  # a wrapped record that ends in "|" may go on (closed=True)
                self.pending[src] = (line, pieces + 1, not megatron.is_incomplete_iteration(line.text))
                return
        elif megatron.is_incomplete_iteration(line.text) and "|" in line.text:
            self.pending[src] = (line, 1, False)
            return
        elif megatron.may_go_on(line.text):  # complete as far as it goes, and it may go on
            self.pending[src] = (line, 1, True)
            return
        self._safe(line)

    def _add_iteration(self, rec: dict[str, Any], rank: int | None = None) -> None:
        """A step record (its memory field, ``_memory``: (column, MiB), a memory row of ``rank``)."""
        if (mem := rec.pop("_memory", None)) is not None:
            self.memory.append({"rank": rank, "iteration": rec["iteration"], mem[0]: mem[1]})
        if ("_bar" in rec or "_exact" in rec) and loops.redrawn(self, rec):
            return
        if (rec.get("mfu") or 0) < 0:  # a placeholder before the loop measured one (nanoGPT's and
            rec["mfu"] = None  # llm.c's -100 %): no number, whichever reader read it
        self.n_iters += 1
        if self.fast_rows:  # keep the records in log order
            self._pack_fast()
        self.iter_rows.append(rec)
        if len(self.iter_rows) >= _CHUNK_ROWS:
            self.pack_rows()

    def pack_rows(self) -> None:
        """Pack the iteration records of the general path (before rows of the fast path follow)."""
        if self.iter_rows:
            self.iter_chunks.append(frame_of_rows(self.iter_rows))
            self.iter_rows = []

    def add_fast_rows(self, csv: bytes, n: int) -> None:
        """``n`` iteration lines in the common Megatron format: megatron.COMMON's groups as CSV rows
        (``b",".join(match.groups(b""))`` and a newline each, an absent field empty)."""
        self.pack_rows()  # the general path's records stay before these rows
        self.seen.tools.setdefault("Megatron", 0)
        self.fast_rows.append(csv)
        self.fast_n += n
        self.n_iters += n
        if self.fast_n >= _CHUNK_ROWS:
            self._pack_fast()

    def _pack_fast(self) -> None:
        """The frame frame_of_rows makes of megatron._parse_common's records, by pandas' C reader."""
        blob = b"".join(self.fast_rows)
        self.fast_rows, self.fast_n = [], 0
        df = pd.read_csv(io.BytesIO(blob), header=None, names=list(megatron.COMMON_COLS), engine="c",
                         dtype=_FAST_DTYPES, keep_default_na=False, na_values=[""], **_EXACT_FLOATS)
        absent = [c for c in _FAST_OPTIONAL if df[c].isna().all()]  # a record dict leaves them out
        self.iter_chunks.append(frame_of_columns(df.drop(columns=absent) if absent else df))

    def iterations(self) -> pd.DataFrame:
        """All iteration records; several records of one iteration merge (the last value wins)."""
        if self.fast_rows:
            self._pack_fast()
        frames = [f for f in self.iter_chunks + [frame_of_rows(self.iter_rows)] if not f.empty]
        self.iter_chunks, self.iter_rows = [], []
        if not frames:
            return pd.DataFrame()
        df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        del frames
        if df["iteration"].duplicated().any():  # DeepSpeed step + timer lines, or a resumed run
            df = df.groupby("iteration", sort=True).last().reset_index()
        elif not df["iteration"].is_monotonic_increasing:
            df = df.sort_values("iteration", kind="stable")
        return df

    def _safe(self, line: Line) -> None:
        # Never crash on one odd line: count it, keep the first error for the report.
        try:
            self.seen.observe(line)
            self.tables.feed(line)
            if self.blocks.feed(line, self):  # a line of an OLMo record
                return
            if not self._records(line) or self.scanner.busy:  # a training record is no failure
                self.scanner.feed(line)
        except (ValueError, OverflowError, TypeError, KeyError, IndexError, ZeroDivisionError) as e:
            self.errors += 1
            if self.first_error is None:
                self.first_error = f"line {line.lineno}: {type(e).__name__}: {e}"

    def _records(self, line: Line) -> bool:
        """Offer the line to the record parsers; True if it was a training record."""
        text = line.text
        rec = megatron.parse_iteration(text)
        if rec is not None:
            self._add_iteration(rec, line.rank)
            return True
        for parse, sink in ((megatron.parse_memory, self.memory),
                            (megatron.parse_validation, self.validation),
                            (megatron.parse_params, self.params)):
            r = parse(text)
            if r is not None:
                if sink is self.params and line.rank is not None:
                    r.setdefault("rank", line.rank)
                sink.append(r)
                return True
        if loops.may_be_step_line(text):
            rec = loops.parse_step_line(text)
            if rec is not None:
                if loops.has_no_trigger(text) or not _hit(text):
                    self.loop_iters += 1
                    self.loop_losses += rec.get("lm_loss") is not None
                self._add_iteration(rec, line.rank)
                return "%|" not in text  # a message glued to a progress bar is read too
        ch = nccl.parse_channel(text)
        if ch is not None:
            self.channels.setdefault(tuple(ch.values()), ch)
            return True
        lay = megatron.parse_layout(text)
        if lay is not None:
            self.layout.update(lay)
            return False
        ds = self.steps.parse(line)
        if ds is not None:
            self.memory += [m for m in [deepspeed.take_memory(ds, line.rank)] if m]
            ds.pop("rank", None)
            if "skipped" in ds and self.seen.scale is not None:  # a DeepSpeed step= line
                ds.setdefault("loss_scale", self.seen.scale)
            self._add_iteration(ds)
            return False
        r = deepspeed.parse_launcher(text)
        if r is not None:
            self.launcher.update(r)
            return False
        v = nccl.parse_version(text)
        if v is not None:
            if self.nccl_version is None:
                self.nccl_version, self.nccl_build = v
            return False
        t = megatron.parse_theoretical_memory(text)
        if t is not None:
            self.theory = t
            return False
        a = megatron.parse_argument(text)
        if a is not None:
            self.args.setdefault(*a)
        elif self.generic is not None:  # no reader took it: any loop's step record? (generic.py)
            multiline.offer(self, line)
        return False

    def flush(self) -> None:
        for line, _, _ in list(self.pending.values()):
            self._safe(line)
        self.pending.clear()
        self.scanner.close()  # a traceback the file ends inside
        self.blocks.close(self)
        self.memory, self.steps.memory = self.memory + self.steps.memory, []
        for rec in self.steps.numbered_in_order():
            self.memory += [m for m in [deepspeed.take_memory(rec, None)] if m]
            self._add_iteration(rec)


def _is_file(s: str | Path) -> bool:
    try:
        return Path(s).is_file()
    except (OSError, ValueError):  # too long, NUL bytes, ...: not a file
        return False


def parse_log(path: str | Path | Sequence[str | Path]) -> ParsedLog:
    """Parse the training log at ``path`` (a file), or several files of one run (e.g. per-rank logs).

    Returns a :class:`ParsedLog`; never raises on odd content (unknown fields are ignored, missing
    ones are null). Raises LabkitError if a path is not a file. Text already in memory goes to
    :func:`parse_lines`.
    """
    if isinstance(path, (bytes, bytearray)) or not isinstance(path, (str, Path, list, tuple)):
        raise LabkitError(f"parse_log takes the path of a log file or a list of paths, got "
                          f"{type(path).__name__}. For text in memory use "
                          f"parse_lines(text.splitlines()).")
    paths = [path] if isinstance(path, (str, Path)) else list(path)
    odd = [repr(p)[:80] for p in paths if not isinstance(p, (str, Path))]
    if odd or not paths:
        raise LabkitError(f"parse_log takes the path of a log file or a list of paths, got "
                          f"{', '.join(odd) or 'an empty list'}. For lines of text use parse_lines(lines).")
    missing = [str(p)[:200] for p in paths if not _is_file(p)]
    if missing:
        raise LabkitError(f"no such log file: {', '.join(missing)}. Pass the path of a training log "
                          f"(e.g. runs/<name>/log.txt); for lines of text use parse_lines(lines).")
    col = _Collector()
    feed = fastscan.feed_file_fast if fastscan.available() else feed_file
    for p in paths:
        feed(col, Path(p))
        col.flush()  # a wrapped line never continues into the next file
    if _found_nothing(col):  # no trigger word: offer every line (of the first _EVERY_LINE_BYTES)
        col = _Collector(every=True)
        for p in paths:
            feed_lines(col, iter_file(p), every=_EVERY_LINE_BYTES)
            col.flush()
    elif loops.wanted(col):
        for p in paths:
            loops.add_lines(col, iter_file(p), _EVERY_LINE_BYTES)
    return _result(col, [str(p) for p in paths], lambda: (ln for p in paths for ln in iter_file(p)))


def _found_nothing(col: _Collector) -> bool:
    return not (col.iter_rows or col.fast_n or col.iter_chunks or col.memory or col.channels
                or col.scanner.failures or col.seen.tools or col.args or col.layout
                or col.nccl_version or col.steps.unnumbered or col.launcher or col.tables.tables)


def parse_lines(lines: Iterable[str] | Iterable[bytes]) -> ParsedLog:
    """Parse log lines already in memory (str or bytes, with or without their line ends).

    The same records as :func:`parse_log` on a file holding these lines; a str is not accepted
    (it would be read character by character): pass ``text.splitlines()``.
    """
    if isinstance(lines, (str, bytes, bytearray, Path)):
        raise LabkitError(f"parse_lines takes an iterable of lines, got a {type(lines).__name__}: "
                          f"use parse_lines(text.splitlines()) for text, parse_log(path) for a file.")
    lines = lines if isinstance(lines, (list, tuple)) else list(lines)
    col = _Collector()
    feed_lines(col, lines)
    col.flush()
    if _found_nothing(col):  # as parse_log: every line, when no trigger word was found
        col = _Collector(every=True)
        feed_lines(col, lines, every=_EVERY_LINE_BYTES)
        col.flush()
    elif loops.wanted(col):
        loops.add_lines(col, lines, _EVERY_LINE_BYTES)
    return _result(col, [], lambda: lines)


def _result(col: _Collector, sources: list[str], head: Callable[[], Iterable]) -> ParsedLog:
    generic.finish(col)
    col.seen.output_line = program_output(head()) if _found_nothing(col) else 0  # findings.py
    layout = layout_of(col, head)
    failures = rank_failures(col.scanner.failures)
    its = iterations_frame(col, layout)
    return ParsedLog(
        iterations=its,
        memory=pd.DataFrame(col.memory).reindex(columns=MEMORY_COLUMNS),
        validation=pd.DataFrame(col.validation),
        params=pd.DataFrame(col.params),
        nccl=pd.DataFrame(list(col.channels.values())).reindex(columns=NCCL_COLUMNS),
        failures=pd.DataFrame([f.to_dict() for f in failures], columns=FAILURE_COLUMNS),
        layout=layout, nccl_version=col.nccl_version, nccl_build=col.nccl_build, args=col.args,
        theoretical_memory=col.theory,
        failure_records=failures, sources=sources, parse_errors=col.errors,
        first_parse_error=col.first_error, tools=sorted(col.seen.tools),
        nccl_tests=col.tables.result(col.nccl_version, head),  # before the findings: names the ops
        findings=col.tables.findings(col.seen.findings(len(its), len(failures))))
