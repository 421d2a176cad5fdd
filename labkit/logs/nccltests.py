"""nccl-tests output (``all_reduce_perf`` and friends): its tables, the devices, what it measured.

The one reader of these tables: ``labkit parse`` (parse.py streams a log's lines through
:class:`Tables`) and labkit.measured.comm (the rows of a printed table, ``header_columns`` and
``parse_row``) both use it. What nccl-tests prints, over its versions (src/common.cu, util.cu)::

    # nccl-tests version 2.13.8 nccl-headers=21903 nccl-library=21903     (2023 on)
    # Collective test starting: all_reduce_perf                          (2023 on)
    # nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 ...
    # Using devices
    #  Rank  0 Group  0 Pid  12345 on     node01 device  0 [0000:07:00] NVIDIA A100-SXM4-80GB
    #   Rank  0 Pid  12345 on node01 device  0 [0x07] Tesla V100-SXM2-16GB      (2019-2021)
    #   Rank  0 on node01 device  0 [0x07] Tesla P100                           (2017-2018)
    #       size         count      type   redop    root     time   algbw   busbw #wrong  (in-place ...)
    #        (B)    (elements)                               (us)  (GB/s)  (GB/s)
             8             2     float     sum      -1    40.1    0.00    0.00      0    40.5 ...
    # Out of bounds values : 0 OK
    # Avg bus bandwidth    : 2.1234

Older headers name fewer columns: ``size count type redop time algbw busbw error`` (2018-2021: no
root; ``error`` is the largest difference, not a count), ``size count type time ...`` (all_gather
and friends: no redop), and 2017's ``bytes N type op time algbw busbw res`` (time in ms). Newer
ones may add per-iteration columns (``i_min i_max i_p99 i_cv%``), ``cputime`` for ``time`` and a
time stamp. A row is read by the header's column names; without a header (an excerpt that starts
at its rows, a web page that ate the ``#``), by its shape. labkit's own benchmark
(code/allreduce_bench.py) prints the same table behind ``# op=all_reduce scope=... group_size=N``.

Sizes are bytes, times microseconds, bandwidths GB/s (1e9 bytes per second), as nccl-tests prints.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from typing import Any

ROW_KEYS = ("size_bytes", "count", "type", "redop", "root", "time_us", "algbw_gbps", "busbw_gbps",
            "wrong", "error", "inplace_time_us", "inplace_algbw_gbps", "inplace_busbw_gbps", "inplace_wrong",
            "inplace_error")
"""A row's values; ``wrong`` counts wrong elements (``#wrong``), ``error`` is the largest difference
(the ``error`` column before 2022); null where the table has no such column or prints ``N/A``."""
# header word -> the value it names; the second time/algbw/busbw/#wrong are the in-place ones
_NAMES = {"size": "size_bytes", "bytes": "size_bytes", "count": "count", "N": "count", "type": "type",
          "redop": "redop", "op": "redop", "root": "root", "time": "time_us", "cputime": "time_us",
          "algbw": "algbw_gbps", "busbw": "busbw_gbps", "#wrong": "wrong", "error": "error", "res": "error",
          "wrong": "wrong"}
_HEAD_WORDS = ("nccl-tests version", "Collective test starting", "nThread ", "Using devices",
               "Blocking Enabled", "Parallel Init", "Per-Iteration", "Swap Comms", "labkit allreduce_bench",
               "rccl-tests: Version")  # (ROCm's fork prints its version inside the header)
# (rccl-tests on ROCm may print no device: ``#  Rank  0 Group  0 Pid  37300 on   g100n126 ``)
_RANK = re.compile(r"^Rank\s{1,8}(\d{1,7})(?:\s{1,8}Group\s{1,8}\d{1,7})?(?:\s{1,8}Pid\s{1,8}\d{1,10})?"
                   r"\s{1,8}on\s{1,24}(\S{1,255})(?:\s{1,8}(?:\(\S{1,64}\)\s{1,8})?device\s{1,8}(\w{1,16})"
                   r"(?:\s{1,8}\[[\w:]{1,20}\])?\s{0,8}(.{0,120}))?\s{0,8}$")
_VERSION = re.compile(r"nccl-tests version (\S{1,40}) nccl-headers=(\d{1,9}) nccl-library=(\d{1,9})")
_PROGRAM = re.compile(r"(?<![\w.])(\w{1,40})_perf(?:_mpi)?\b")
_SECTION = re.compile(r"^op=(\w{1,40})(.{0,400})$")
_OOB = re.compile(r"^Out of bounds values\s{0,8}:\s{0,8}(\d{1,20})\s{0,8}(OK|FAILED)?")
_AVG = re.compile(r"^Avg bus bandwidth\s{0,8}:\s{0,8}([-+0-9.eE]{1,30}|nan|inf)")
_WORD = re.compile(r"\w")
# A table is its header and every row after it until its summary, whatever NCCL prints between the
# rows (the connections its first collective makes, with NCCL_DEBUG=INFO) and lines without a word (a
# ``...`` standing for rows left out); a line of another tool ends it.
_NUM = re.compile(r"^[-+]?(?:\d{1,30}(?:\.\d{0,30})?|\.\d{1,30})(?:[eE][-+]?\d{1,4})?$")
# With NCCL_DEBUG=INFO and collective tracing, NCCL's lines split a row into pieces: nccl-tests prints
# each half of a row when it has it, without a line end, and NCCL's next line (``host:pid:tid [dev]
# NCCL INFO AllReduce: opCount ...``) is glued after the piece (``...  -1mew0:65704:65704 [1] NCCL
# INFO``; a host name that starts with a letter). The pieces are joined in order up to a whole row.
_GLUED_NCCL = re.compile(r"^([-+\w.\s]{0,400}?\d)[A-Za-z][\w.-]{0,254}:\d{1,10}:\d{1,10} \[\d{1,4}\] NCCL ")


def _body(text: str) -> str:
    """A line without its leading blanks and nccl-tests' ``#`` (which a web page may have eaten)."""
    s = text.strip()
    return s[1:].strip() if s.startswith("#") else s


def header_columns(text: str) -> list[str] | None:
    """The column names of a table header line (``# size count type redop root time algbw busbw
    #wrong ...``, ``#`` or not), each mapped to its ROW_KEYS name (in-place ones prefixed), or None."""
    if "busbw" not in text or "algbw" not in text:
        return None
    words = _body(text).split()
    if not words or words[0] not in ("size", "bytes"):
        return None
    cols, seen = [], set()
    for w in words:
        key = _NAMES.get(w, w)
        if key in seen and key in ROW_KEYS and not key.startswith("inplace_"):
            key = "inplace_" + key if "inplace_" + key in ROW_KEYS else key + "_2"
        seen.add(key)
        cols.append(key)
    if words[0] == "bytes":  # 2017: the time column is in milliseconds
        cols = ["time_ms" if c == "time_us" else "inplace_time_ms" if c == "inplace_time_us" else c
                for c in cols]
    return cols


def _value(key: str, tok: str) -> Any:
    if key in ("type", "redop"):
        return tok
    if tok in ("N/A", "-"):
        return None
    if not _NUM.match(tok):
        raise ValueError(tok)
    x = float(tok)
    if key in ("size_bytes", "count", "root") or (key.endswith("wrong") and x.is_integer()
                                                   and "." not in tok):
        return int(x)
    return x


def parse_row(text: str, columns: list[str] | None = None) -> dict[str, Any] | None:
    """One data row of a table -> ``{size_bytes, count, type, redop, root, time_us, algbw_gbps,
    busbw_gbps, wrong, inplace_...}`` (keys the row has no column for are left out), or None.
    ``columns``: the header's (header_columns); without it the row is read by its shape."""
    toks = text.split()
    if len(toks) < 5 or not toks[0].isdigit() or not toks[1].isdigit():
        return None
    if columns is None:
        if len(toks) < 7 or not toks[2][:1].isalpha():
            return None
        rest = toks[3:]
        head = ["size_bytes", "count", "type"]
        if rest[0][:1].isalpha():
            head.append("redop")
            rest = rest[1:]
        if len(rest) % 4 == 1:
            head.append("root")
        columns = head + ["time_us", "algbw_gbps", "busbw_gbps", "wrong",
                          "inplace_time_us", "inplace_algbw_gbps", "inplace_busbw_gbps", "inplace_wrong"]
    if "redop" in columns and len(toks) > columns.index("redop") and _NUM.match(toks[columns.index("redop")]):
        # A collective without a reduction prints an empty redop under the header's ``redop``
        # (``%6s`` of ""): 2020-2021's alltoall_perf, 2022's all_gather/alltoall/broadcast/gather/
        # scatter, hypercube to this day; a redop is a word (sum, prod, max, min, avg, mulsum, none).
        columns = [c for c in columns if c != "redop"]
    if "busbw_gbps" not in columns or len(toks) <= columns.index("busbw_gbps"):
        return None
    row: dict[str, Any] = {}
    try:
        for key, tok in zip(columns, toks, strict=False):
            if key in ROW_KEYS or key.endswith("time_ms"):
                row[key] = _value(key, tok)
    except ValueError:
        return None
    for k in ("time_ms", "inplace_time_ms"):
        if k in row:
            ms = row.pop(k)
            row[k.replace("_ms", "_us")] = None if ms is None else ms * 1000.0
    if row.get("redop") is not None and _NUM.match(row["redop"]):
        return None
    return row if row.get("busbw_gbps") is not None or row.get("time_us") is not None else None


def library_version(code: int) -> str:
    """NCCL_VERSION_CODE -> ``2.19.3`` (21903; before 2.9: 2708 -> ``2.7.8``)."""
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def _new_table(op: str | None) -> dict[str, Any]:
    return {"op": op, "ranks": None, "hosts": None, "devices": None, "device_names": [],
            "nccl_version": None, "nccl_tests_version": None, "line": None, "rows": [],
            "out_of_bounds": None, "avg_busbw_gbps": None}


class Tables:
    """The nccl-tests tables of a log, read line by line (``feed`` each cleaned line; ``busy``
    while a header or table is open: the lines after it must be fed even without a trigger word)."""

    def __init__(self) -> None:
        self.tables: list[dict[str, Any]] = []
        self.state = 0  # 0: nothing open, 1: the header (devices), 2: a table
        self.columns: list[str] | None = None
        self.piece: list[str] | None = None  # the tokens of a row NCCL's lines split (_GLUED_NCCL)
        self.op: str | None = None
        self.version: tuple[str, str] | None = None  # (nccl-tests, NCCL) versions
        self.devices: dict[int, tuple[str, str, str]] = {}  # rank -> (host, device, name)
        self.group: int | None = None  # labkit's benchmark: the group size of the section

    @property
    def busy(self) -> bool:
        return self.state > 0

    def feed(self, line: Any) -> None:
        text = line.text
        body = _body(text)
        if self.state == 0 and "_perf" in text and "Collective test" not in text:
            m = _PROGRAM.search(text)  # the command line: ./build/all_reduce_perf -b 8 ...
            if m:
                self.op = m.group(1)
        if body.startswith(_HEAD_WORDS):
            self._head(body)
            return
        cols = header_columns(text)
        if cols is not None:
            self.columns, self.state = cols, 2
            t = _new_table(self.op)
            t["line"] = line.lineno
            self.tables.append(t)
            self._devices(t)
            return
        if self.state == 1:
            m = _RANK.match(body)
            if m:
                self.devices[int(m.group(1))] = (m.group(2), m.group(3) or "", (m.group(4) or "").strip())
            elif body.startswith("op="):
                self._section(body)
            elif body and "out-of-place" not in body and "NCCL" not in text:
                self.state = 0
            return
        if self.state == 2:
            self._table_line(body, text)
        elif body.startswith("op="):
            self._section(body)
            self.state = 1

    def _head(self, body: str) -> None:
        if self.state == 2 or (self.state == 0 and self.devices and not body.startswith("Using")):
            self.devices, self.group = {}, None  # a new run of nccl-tests
        self.state = 1
        m = _VERSION.search(body)
        if m:
            self.version = (m.group(1), library_version(int(m.group(3))))
        elif body.startswith("Collective test starting"):
            name = body.split(":", 1)[1].strip() if ":" in body else ""
            m = _PROGRAM.search(os.path.basename(name))
            self.op = m.group(1) if m else name or self.op

    def _section(self, body: str) -> None:
        m = _SECTION.match(body)
        if m:
            self.op = m.group(1)
            g = re.search(r"group_size=(\d{1,7})", m.group(2))
            self.group = int(g.group(1)) if g else None

    def _devices(self, t: dict[str, Any]) -> None:
        if self.version:
            t["nccl_tests_version"], t["nccl_version"] = self.version
        if self.group is not None:
            t["ranks"] = self.group
        elif self.devices:
            t["ranks"] = max(self.devices) + 1
        if self.devices:
            t["hosts"] = len({h for h, _, _ in self.devices.values()})
            t["devices"] = len(set(self.devices.values()))
            t["device_names"] = sorted({n for _, _, n in self.devices.values() if n})

    def _table_line(self, body: str, text: str) -> None:
        t = self.tables[-1]
        glued = _GLUED_NCCL.match(body) if "NCCL" in text else None
        if glued is not None:
            body = glued.group(1)
        if self._piece(body, t):
            return
        row = parse_row(body, self.columns)
        if row is not None:
            t["rows"].append({k: row.get(k) for k in ROW_KEYS})
            return
        m = _OOB.match(body)
        if m:
            t["out_of_bounds"] = int(m.group(1))
            return
        m = _AVG.match(body)
        if m:
            avg = float(m.group(1))
            t["avg_busbw_gbps"] = avg if avg == avg and abs(avg) != float("inf") else None
            self.state, self.op = 0, None
            return
        if not _WORD.search(body) or body.startswith("(B)") or "out-of-place" in body or "NCCL" in text:
            return  # an elision (``...``), a rule, or NCCL's own lines between the rows: the table goes on
        self.state, self.op = 0, None  # another tool's line: the table ended

    def _piece(self, body: str, t: dict[str, Any]) -> bool:
        """A piece of a row split by NCCL's lines (_GLUED_NCCL): a row's first columns start one,
        numbers alone go on with it; True where the line was such a piece."""
        toks = body.split()
        if self.piece is not None and toks and all(_NUM.match(x) or x == "N/A" for x in toks):
            self.piece += toks
        elif (len(toks) >= 3 and toks[0].isdigit() and toks[1].isdigit() and toks[2][:1].isalpha()
              and self.columns is not None and len(toks) < len(self.columns)
              and parse_row(body, self.columns) is None):
            self._end_piece(t)
            self.piece = toks
        else:
            if "NCCL" not in body:  # NCCL's own lines between the pieces leave the row open
                self._end_piece(t)
            return False
        if self.columns is not None:
            need = len(self.columns)
            if "redop" in self.columns and len(self.piece) > self.columns.index("redop") \
                    and _NUM.match(self.piece[self.columns.index("redop")]):
                need -= 1  # no reduction: the empty redop prints nothing (parse_row)
            if len(self.piece) >= need:
                self._end_piece(t)
        return True

    def _end_piece(self, t: dict[str, Any]) -> None:
        if self.piece is not None:
            row = parse_row(" ".join(self.piece), self.columns)
            if row is not None:
                t["rows"].append({k: row.get(k) for k in ROW_KEYS})
            self.piece = None

    def result(self, banner_version: str | None,
               head: Callable[[], Iterable[Any]] | None = None) -> list[dict[str, Any]]:
        """The tables (``labkit parse --json``'s ``nccl.tests``); the NCCL version the log's banner
        names where nccl-tests did not print its own; a table whose collective no line next to it
        named takes it from the program a line between it and the table before names (``head()``:
        the log's lines; a command line among lines no parser reads, as ``srun ... all_reduce_perf_mpi
        -b 8`` above a launcher's start-up errors)."""
        for t in self.tables:
            if t["nccl_version"] is None:
                t["nccl_version"] = banner_version
        if head is not None and any(t["op"] is None for t in self.tables):
            _programs(self.tables, head())
        return self.tables

    def findings(self, others: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``others`` (findings.Seen's) with what each table measured and its wrong results; a log
        that measured something did not stop before training (no ``stopped`` finding)."""
        measured = [t for t in self.tables if t["rows"]]
        if not measured:
            return others
        out = [f for f in others if f["kind"] not in ("stopped_after_init", "no_iteration")]
        for t in measured:
            out += _table_findings(t)
        return out


def _programs(tables: list[dict[str, Any]], lines: Iterable[Any]) -> None:
    """Each table with no collective named takes the last program named between the table before
    it and its own header line."""
    last = max(t["line"] for t in tables if t["op"] is None)
    named: list[tuple[int, str]] = []
    for lineno, raw in enumerate(lines, 1):
        if lineno >= last:
            break
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        if "_perf" in text:
            named += [(lineno, m.group(1)) for m in _PROGRAM.finditer(text)]
    before = 0
    for t in tables:
        if t["op"] is None:
            ops = [op for n, op in named if before < n < t["line"]]
            t["op"] = ops[-1] if ops else None
        before = t["line"]


def _size(n: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k and n % (1 << k) == 0:
            return f"{n >> k} {unit}"
    return f"{n} B"


def _table_findings(t: dict[str, Any]) -> list[dict[str, Any]]:
    what = f"nccl-tests {t['op']}_perf" if t["op"] else "nccl-tests (the collective is not named)"
    if t["ranks"]:
        what += f" over {t['ranks']} rank{'s' if t['ranks'] != 1 else ''}"
        if t["hosts"]:
            what += f" on {t['hosts']} host{'s' if t['hosts'] != 1 else ''}"
    best = None
    for r in t["rows"]:
        for k in ("busbw_gbps", "inplace_busbw_gbps"):
            if r[k] is not None and (best is None or r[k] > best[0]):
                best = (r[k], r["size_bytes"])
    msg = what + ": "
    if best is not None:
        msg += f"peak busbw {best[0]:g} GB/s at {best[1]} bytes ({_size(best[1])}), "
    avg = t["avg_busbw_gbps"]
    msg += f"average {avg:g} GB/s" if avg is not None else "no average printed (the table ends early)"
    msg += f", {len(t['rows'])} sizes"
    out = [{"kind": "nccl_tests", "line": t["line"], "op": t["op"], "ranks": t["ranks"],
            "peak_busbw_gbps": best[0] if best else None, "peak_size_bytes": best[1] if best else None,
            "avg_busbw_gbps": avg, "message": msg}]
    wrong = [(r["size_bytes"], w) for r in t["rows"] for w in (r["wrong"], r["inplace_wrong"])
             if isinstance(w, int) and w > 0]
    if wrong or t["out_of_bounds"]:
        n = sum(w for _, w in wrong) or t["out_of_bounds"]
        sizes = sorted({s for s, _ in wrong})
        at = f" at {', '.join(_size(s) for s in sizes[:4])}" if sizes else ""
        at += " ..." if len(sizes) > 4 else ""
        out.append({"kind": "nccl_tests_wrong", "line": t["line"], "wrong": n,
                    "message": f"{what}: {n} wrong values{at} (#wrong): the collective returned wrong "
                               f"data - a failing GPU, NVLink, NIC or driver; run the test per node and "
                               f"per GPU pair to find which"})
    return out
