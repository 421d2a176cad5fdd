"""The fast path for big log files (labkit/logs/fastscan.py): the same frames as the general path.

Speed itself is a benchmark figure (benchmarks/bench_parse.py), never a timed test.
"""

from __future__ import annotations

import random
import re
import re._constants as sre_constants
import re._parser as sre_parse
from pathlib import Path

import pandas as pd
import pytest

from labkit.logs import fastscan, parse_log, shapes
from labkit.logs import parse as parse_mod
from labkit.logs.frames import frame_of_rows
from labkit.logs.megatron import COMMON_COLS, COMMON_INT
from labkit.logs.scan import ITERATION_TRIGGER, SPACES, TRIGGERS

FIX = Path(__file__).parent / "fixtures" / "logs"
ALL_FIXTURES = sorted(FIX.glob("*.txt")) + sorted((FIX / "real").glob("*.txt"))


def _frames(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[pd.DataFrame, pd.DataFrame]:
    with monkeypatch.context() as m:
        m.setattr(fastscan, "CHUNK", 1 << 12)
        m.setattr(parse_mod, "_CHUNK_ROWS", 7)
        fast = parse_log(path).iterations
    with monkeypatch.context() as m:
        m.setenv("LABKIT_NO_FASTSCAN", "1")
        general = parse_log(path).iterations
    return fast, general


@pytest.mark.parametrize("fixture", ALL_FIXTURES, ids=[p.name for p in ALL_FIXTURES])
def test_fast_path_frame_is_the_general_paths(fixture, monkeypatch):
    """Whole frames (timestamps and dtypes too), not only the JSON document."""
    fast, general = _frames(fixture, monkeypatch)
    pd.testing.assert_frame_equal(fast, general)


def _number(rng: random.Random) -> str:
    """A number as megatron.COMMON takes it: up to 20 digits, a fraction, an exponent."""
    s = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 20)))
    if rng.random() < 0.7:
        s += "." + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 20)))
    if rng.random() < 0.5:
        s += f"E{rng.choice('+-')}{rng.randint(0, 999):0{rng.randint(1, 3)}d}"
    return s


def test_fast_rows_parse_as_python_does():
    """pandas' C reader gives exactly float() and int() of every field, extremes included."""
    rng = random.Random(5)
    floats = [_number(rng) for _ in range(3000)]
    floats += ["1E+999", "1E-999", "4.9E-324", "2.2250738585072014E-308", "9007199254740993", "0.1",
               "179769313486231580793.7E+288"]
    col = parse_mod._Collector()
    expect = []
    for i, f in enumerate(floats):
        fields = {c: str(i) for c in COMMON_INT}
        fields.update({c: f for c in COMMON_COLS if c not in COMMON_INT and c != "timestamp"})
        fields["timestamp"] = "2026-11-22 03:30:01.123456789" if i % 2 else ""
        fields["consumed_samples"] = str(rng.randrange(10**15))
        col.add_fast_rows(",".join(fields[c] for c in COMMON_COLS).encode() + b"\n", 1)
        expect.append(fields)
    df = col.iterations()
    assert list(df["consumed_samples"]) == [int(e["consumed_samples"]) for e in expect]
    for c in ("elapsed_ms", "lr", "lm_loss", "grad_norm", "tflops_per_gpu", "loss_scale"):
        assert df[c].tolist() == [float(e[c]) for e in expect]
    assert df["timestamp"].isna().tolist() == [not e["timestamp"] for e in expect]


PREFIXES = [b"", b"3: ", b"[rank7]: ", b"[default0]:", b"[1,0]<stdout>:"]


def _iteration_line(rng: random.Random, i: int) -> bytes:
    """A common-format iteration line of a random shape: prefix, timestamp, optional fields, ends."""
    line = (f" [2026-11-22 03:30:{i % 60:02d}] iteration {i:8d}/   10000 | consumed samples: "
            f"{8 * i:10d} | elapsed time per iteration (ms): {800 + i % 13}.{i % 7} | "
            f"throughput per GPU (TFLOP/s/GPU): {i % 97}.5 | learning rate: {i * 1.7e-7:.6E} | "
            f"global batch size:     8 | lm loss: "
            f"{9 / (1 + i):.6E} | loss scale: 1.0 | grad norm: {i % 5}.25 | number of skipped iterations:"
            f"   0 | number of nan iterations:   0 |")
    for drop in rng.sample(["[2026", "throughput", "lm loss", "grad norm"], rng.randrange(5)):
        start = line.index(drop)
        line = line[:start] + line[line.index("|", start) + 2:] if drop != "[2026" else \
            line[:start] + line[line.index("] ", start) + 2:]
    return rng.choice(PREFIXES) + line.encode() + rng.choice([b"", b"\r", b"  "])


def test_how_records_are_chunked_changes_no_columns_type():
    """A chunk whose records all lack a value (a loss-less Megatron line, lm_loss None) packs the
    column as NaN floats, as a chunk that holds them among others does."""
    rows = [{"iteration": i, "lm_loss": None if i < 3 else 1.5} for i in range(1, 5)]
    whole = frame_of_rows(rows)
    chunked = pd.concat([frame_of_rows(rows[:2]), frame_of_rows(rows[2:])], ignore_index=True)
    pd.testing.assert_frame_equal(chunked, whole)
    assert whole["lm_loss"].dtype == "float64"


def test_fast_path_frame_on_a_long_mixed_log(tmp_path, monkeypatch):
    """Common-format lines of every shape (prefix, timestamp, optional fields) between other lines."""
    rng = random.Random(11)
    others = [ln for f in ALL_FIXTURES for ln in f.read_bytes().splitlines()]
    out = []
    for i in range(1, 2500):
        out.append(_iteration_line(rng, i))
        out += rng.sample(others, rng.randrange(3))
    log = tmp_path / "log.txt"
    log.write_bytes(b"\n".join(out))
    fast, general = _frames(log, monkeypatch)
    pd.testing.assert_frame_equal(fast, general)
    assert len(fast) >= 2499


def _near_miss(rng: random.Random, line: bytes) -> bytes:
    """The line with one byte changed, so it keeps its width but not its shape (or does: a digit
    for a digit), or a trigger word written into it or around it."""
    i = rng.randrange(len(line))
    op = rng.randrange(5)
    if op == 0:  # a digit for a non-digit, or the other way round
        return line[:i] + (b"7" if line[i:i + 1] not in b"0123456789" else b"x") + line[i + 1:]
    if op == 1:  # a digit for another digit: the same shape
        return line[:i] + (rng.choice(b"0123456789").to_bytes(1, "big") if line[i:i + 1].isdigit()
                           else line[i:i + 1]) + line[i + 1:]
    word = rng.choice(TRIGGERS).encode()
    if op == 2:
        return line[:i] + word + line[i + len(word):]
    if op == 3:
        return word + line if rng.random() < 0.5 else line + word
    return rng.choice([b"iteration ", b"iteration5/", b"per iteration (ms): 3 |", b"iteration\t"]) + word


@pytest.mark.parametrize("chunk", [1 << 9, 1 << 12, 1 << 16, fastscan.CHUNK])
def test_fast_path_agrees_on_near_misses(chunk, tmp_path, monkeypatch):
    """Differential fuzz of the shape-at-a-time matching: runs of common-format lines broken by
    lines of the same width and another shape, trigger words inside and beside them, counter
    words that are no counter, and real lines; every field of the result as the general path's."""
    others = [ln for f in ALL_FIXTURES for ln in f.read_bytes().splitlines()]
    for seed in range(3):
        rng = random.Random(seed * 7 + chunk)
        out = []
        for i in range(1, 1500):
            line = _iteration_line(rng, i)
            out.append(line if rng.random() < 0.85 else _near_miss(rng, line))
            if rng.random() < 0.1:
                out += rng.sample(others, rng.randrange(1, 4))
        log = tmp_path / f"log{seed}.txt"
        log.write_bytes(b"\n".join(out))
        with monkeypatch.context() as m:
            m.setattr(fastscan, "CHUNK", chunk)
            m.setattr(parse_mod, "_CHUNK_ROWS", 301)
            fast = parse_log(log)
        with monkeypatch.context() as m:
            m.setenv("LABKIT_NO_FASTSCAN", "1")
            general = parse_log(log)
        pd.testing.assert_frame_equal(fast.iterations, general.iterations)
        assert fast.to_dict() == general.to_dict()
        assert len(general.iterations) > 1000


def test_counter_words_begin_every_counter():
    """fastscan finds iteration counters by literal words; every ITERATION_TRIGGER match starts
    with one (spaces of every kind, none, a counter of many digits)."""
    rng = random.Random(2)
    for _ in range(2000):
        text = ("iteration" + "".join(rng.choice(SPACES) for _ in range(rng.randrange(4)))
                + str(rng.randrange(10 ** rng.randint(1, 12))) + rng.choice(["", " ", "\t"]) + "/")
        m = re.search(ITERATION_TRIGGER, "x " + text)
        assert m is not None, repr(text)
        assert any(m.group().encode().startswith(w) for w in fastscan._COUNTER_WORDS), repr(text)


def _atoms(sub: sre_parse.SubPattern):
    """Every literal and set of a parsed pattern, at any depth."""
    for op, av in sub:
        if op in (sre_constants.LITERAL, sre_constants.IN):
            yield op, av
            continue
        for x in av if isinstance(av, (tuple, list)) else ():
            for y in x if isinstance(x, list) else (x,):
                if isinstance(y, sre_parse.SubPattern):
                    yield from _atoms(y)


def test_fast_line_match_is_digit_blind():
    """What shapes.RowMaker relies on: BFAST has no literal digit, and each of its sets holds all ten
    digits or none; so lines differing only in their digits match alike, with the same spans."""
    digits = set(b"0123456789")
    atoms = list(_atoms(sre_parse.parse(shapes.BFAST.pattern.decode())))
    assert sum(op == sre_constants.IN for op, _ in atoms) >= 20 and len(atoms) >= 200
    for op, av in atoms:
        if op == sre_constants.LITERAL:
            assert av not in digits, chr(av)
        elif op == sre_constants.IN:
            inside = set()
            for item, arg in av:
                if item == sre_constants.LITERAL:
                    inside |= {arg} & digits
                elif item == sre_constants.RANGE:
                    inside |= set(range(arg[0], arg[1] + 1)) & digits
                else:  # \d, \w and the like hold every digit, a negated set none or all
                    holds = arg in (sre_constants.CATEGORY_DIGIT, sre_constants.CATEGORY_WORD)
                    inside |= digits if holds else set()
                    assert item in (sre_constants.CATEGORY, sre_constants.NEGATE), item
            assert inside in (set(), digits), av
    rng = random.Random(3)
    lines = [ln for f in ALL_FIXTURES for ln in f.read_bytes().splitlines() if b"iteration" in ln]
    maker, seen = shapes.RowMaker(), 0
    for ln in lines * 3:
        mutated = bytes(rng.choice(b"0123456789") if c in b"0123456789" else c for c in ln)
        for line in (ln, mutated):
            m = shapes.BFAST.fullmatch(line)
            assert maker.row(line) == (None if m is None else b",".join(m.groups(b""))), line
            seen += m is not None
    assert seen >= 20


@pytest.mark.parametrize("case", ["inside", "beyond_cut", "before_cut", "boundaries", "at_eof", "over_chunk"])
def test_long_lines_are_cut_as_the_general_path_cuts_them(case, tmp_path, monkeypatch):
    """A line of MAX_LINE_BYTES or more is cut there with a note (memory stays bounded), and only
    a trigger before the cut counts, on every path and at every chunk size."""
    from labkit.logs.lines import MAX_LINE_BYTES as big

    line = (b" [2026-11-22 03:30:01] iteration        5/      30 | consumed samples:           40 | elapsed "
            b"time per iteration (ms): 812.3 | learning rate: 9.000000E-04 | global batch size:     8 | "
            b"loss scale: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |")
    nxt = line.replace(b" 5/", b" 6/")
    data = {
        "inside": b"Traceback (most recent call last):\n" + b"x" * 3 * big + b" Traceback\n" + line + b"\n",
        "beyond_cut": line + b"\n" + b"y" * 2 * big + b" CUDA error: out of memory\n" + nxt + b"\n",
        "before_cut": line + b"\n" + b"CUDA error: out of memory " + b"z" * big + b"\n" + nxt + b"\n",
        "boundaries": b"a" * (big - 1) + b"\n" + b"b" * big + b"\nTraceback\n" + b"c" * (big + 1) + b"\n"
                      + line,
        "at_eof": line + b"\n" + b"RuntimeError " + b"q" * 2 * big,
        "over_chunk": line + b"\n" + b"w" * (fastscan.CHUNK + 5) + b" Traceback\nRuntimeError: x\n" + nxt,
    }[case]
    log = tmp_path / "log.txt"
    log.write_bytes(data)
    fast = parse_log(log).to_dict()
    monkeypatch.setattr(fastscan, "CHUNK", 1 << 12)
    small = parse_log(log).to_dict()
    monkeypatch.setenv("LABKIT_NO_FASTSCAN", "1")
    general = parse_log(log).to_dict()
    assert fast == small == general
    assert len(general["iterations"]) == data.count(b"iteration  ")
    oom = [f for f in general["failures"] if f["kind"] == "gpu_oom"]
    assert bool(oom) == (case == "before_cut")  # the one beyond the cut is not seen


@pytest.mark.parametrize("seed", range(4))
def test_fast_lines_sorts_counter_lines_as_the_regexes_do(seed):
    """shapes.fast_lines' contract, line by line: a line with a counter word is a common-format record
    exactly where BFAST matches it whole (with its fields as the row), else a hit line exactly
    where a trigger regex finds one (a counter word alone, "per iteration (ms)", is none)."""
    rng = random.Random(seed)
    others = [b"forward-backward time per iteration (ms): 812.3", b"iteration 5 done", b"iterations: 3",
              b"x iteration\t7/8 CUDA", b"iteration12/ 40 |", b""]
    lines = []
    for i in range(1, 400):
        line = _iteration_line(rng, i)
        lines.append(line if rng.random() < 0.7 else _near_miss(rng, line) if rng.random() < 0.6
                     else rng.choice(others))
    data = b"\n".join(ln.replace(b"\n", b" ") for ln in lines) + b"\n"
    found = fastscan._database().find_matches_as_indexes(data)
    iters = [e for i, _, e in found if i < fastscan._N_COUNTER]
    fs, fe, rows, slow = shapes.fast_lines(bytearray(data), len(data), iters, shapes.RowMaker(), {})
    words = b"|".join(re.escape(t.encode()) for t in TRIGGERS)
    trigger = re.compile(ITERATION_TRIGGER.encode() + b"|" + words)
    want_fast, want_slow, pos = {}, set(), 0
    for ln in data.split(b"\n")[:-1]:
        if any(w in ln for w in fastscan._COUNTER_WORDS):
            m = shapes.BFAST.fullmatch(ln)
            if m is not None:
                want_fast[pos] = b",".join(m.groups(b""))
            elif trigger.search(ln):
                want_slow.add(pos)
        pos += len(ln) + 1
    got = shapes.csv_text(rows, 0, len(fs)).split(b"\n")[:-1] if fs else []
    assert dict(zip(fs, got, strict=True)) == want_fast
    assert all(data[e:e + 1] in (b"\n", b"") for e in fe)
    assert set(slow) == want_slow
    assert len(want_fast) > 150 and want_slow


@pytest.mark.parametrize("fast", [True, False], ids=["fastscan", "line_by_line"])
def test_a_huge_line_costs_no_more_than_the_cut(fast, tmp_path, monkeypatch):
    """Lines of 12 MB with trigger words (an error, a traceback left open) are cut on both paths:
    the parse holds a few cut lines, never the whole line."""
    import tracemalloc

    from labkit.logs.lines import MAX_LINE_BYTES as big

    log = tmp_path / "log.txt"
    with open(log, "wb") as f:
        f.write(b"NCCL error " + b"n" * 12 * big + b"\nTraceback (most recent call last):\n")
        f.write(b"t" * 12 * big + b"\nRuntimeError: x\n")
    if not fast:
        monkeypatch.setenv("LABKIT_NO_FASTSCAN", "1")
    tracemalloc.start()
    try:
        parsed = parse_log(log)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * big, peak
    assert parsed.tools == ["NCCL", "torch"]  # both lines were read (cut)
