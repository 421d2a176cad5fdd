"""Never crash, never hang: 100k+ lines derived from real-format lines, in 4 chunks of ~25k.

Each hypothesis example is a whole log (400-600 lines, from a drawn seed): lines of our
fixtures (each a documented format) and of the real logs users posted (fixtures/logs/real)
cut, spliced, prefixed, escaped, repeated and sprinkled with bad bytes. Each real log is also
replayed whole: hard-wrapped at random widths, truncated, interleaved as several ranks, mutated.
A CPU-time limit (the cpu_timeout marker, tests/conftest.py) turns a catastrophic-backtracking
regex into a failure instead of a hung CI job; a loaded machine cannot trip it. Only the
generate phase runs: shrinking a seed is meaningless and slow.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from labkit.logs import diagnose, parse_lines, parse_log

FIX = Path(__file__).parent / "fixtures" / "logs"
REAL = sorted((FIX / "real").glob("*.txt"))
SEEDS = sorted({ln for f in sorted(FIX.glob("*.txt")) + REAL
                for ln in f.read_text(errors="replace").splitlines() if ln.strip()})
PREFIXES = ["", "[default3]:", "[rank12]:", "7: ", "node042: ", "[1,4]<stdout>:", "\x1b[31m",
            "0: [default1]:", "progress 50%\r", "[rank1]: ", "   3: "]
NOISE = ["|", ":", " ", "\r", "\x1b[", "&quot;", "&#", "[", "]", "(", ")", "/", "E+", "nan", "inf", "-",
         "\xff", "\x00", "\u2028", "iteration ", "Channel 00/0 : ", " -> ",
         "Traceback (most recent call last):",
         "***", "Rank ", "SeqNum=", "\t", "9" * 30, "..."]


def mutate(rng: random.Random, line: str | None = None) -> str | bytes:
    """One real-format line, damaged the ways real logs are."""
    line = rng.choice(SEEDS) if line is None else line
    op = rng.randrange(8)
    if op == 1:  # cut anywhere (hard wrap, truncated write)
        i = rng.randrange(len(line) + 1)
        line = line[:i] if rng.random() < 0.5 else line[i:]
    elif op == 2:  # splice two real lines
        other = rng.choice(SEEDS)
        line = line[: rng.randrange(len(line) + 1)] + other[rng.randrange(len(other) + 1):]
    elif op == 3:  # insert noise
        i = rng.randrange(len(line) + 1)
        line = line[:i] + rng.choice(NOISE) * rng.randint(1, 50) + line[i:]
    elif op == 4:  # replace digits with junk
        line = line.replace(rng.choice("0123456789"), rng.choice(["", "x", "0" * 40, "-", "nan", "."]))
    elif op == 5:  # arbitrary characters
        line = "".join(chr(rng.randrange(1, 0x2FFF)) for _ in range(rng.randrange(200)))
    elif op == 6:  # repeat (long lines, many separators)
        line = line * rng.randint(2, 30)
    line = rng.choice(PREFIXES) + line
    if rng.randrange(10) == 0:  # invalid UTF-8 through the bytes path
        return line.encode("utf-8", errors="surrogatepass").replace(b"i", b"\xff", 1) + b"\r\n"
    return line


def _check(lines: list) -> None:
    parsed = parse_lines(lines)
    assert parsed.parse_errors == 0, parsed.first_parse_error  # the guard must never be needed
    json.dumps(parsed.to_dict(), allow_nan=False)  # the JSON contract holds for any input
    for f in parsed.failure_records:
        assert f.kind and f.hint


@pytest.mark.cpu_timeout(120)
@pytest.mark.parametrize("chunk", range(4))
def test_fuzz_chunk(chunk):
    count = [0]

    @settings(max_examples=60, deadline=None, database=None, phases=[Phase.generate], derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(seed=st.integers(0, 2**32 - 1), n=st.integers(400, 600))
    def run(seed, n):
        rng = random.Random(seed * 4 + chunk)
        lines = [mutate(rng) for _ in range(n)]
        count[0] += n
        _check(lines)

    run()
    assert count[0] >= 25_000  # 4 chunks: 100k+ lines in all


@pytest.mark.cpu_timeout(60)
@pytest.mark.parametrize("line", [
    "iteration " * 50_000,
    "|" * 500_000,
    " iteration 1/2 |" + " lm loss: 1 |" * 50_000,
    "[rank1]:" * 100_000,
    "[default" + "1" * 200_000 + "]:x",
    "Channel 00/0 : " + "0[0] -> " * 50_000,
    "*** JOB 1 ON " + "x " * 100_000 + "CANCELLED AT",
    "WORLD INFO DICT: {" + "[" * 50_000,
    "Watchdog caught collective operation timeout: WorkNCCL(" + "SeqNum=1, " * 50_000,
    "Traceback (most recent call last):",
    "\x1b[" * 100_000,
    "&amp;" * 100_000,
    "using world size: 8, " + "data-parallel size: 1 " * 20_000,
    "  seq_length " + "." * 100_000 + " 5",
])
def test_pathological_lines_finish(line):
    _check([line, line[: len(line) // 2], "tail"])
    diagnose([line], exit_code=-9)


def _variants(lines: list[str], rng: random.Random) -> list[list]:
    """A real log replayed the ways it gets damaged: wrapped, truncated, interleaved, mutated."""
    width = rng.randint(20, 160)
    wrapped = [ln[i:i + width] for ln in lines for i in range(0, max(len(ln), 1), width)]
    text = "\n".join(lines)
    cut = text[: rng.randrange(len(text) + 1)].splitlines()
    prefixes = rng.choice([["[default{}]:", "[rank{}]:"], ["{}: ", "  {}: "], ["[1,{}]<stdout>:"]])
    ranks = rng.randint(2, 5)
    streams = [[rng.choice(prefixes).format(r) + ln for ln in (wrapped if r % 2 else lines)]
               for r in range(ranks)]
    interleaved = []
    while any(streams):
        s = rng.choice([s for s in streams if s])
        interleaved.append(s.pop(0))
    mutated = [mutate(rng, ln) if rng.random() < 0.3 else ln for ln in lines]
    return [wrapped, cut, interleaved, mutated]


@pytest.mark.cpu_timeout(120)
@pytest.mark.parametrize("log", REAL, ids=[p.stem for p in REAL])
def test_real_logs_damaged(log, tmp_path):
    lines = log.read_text(errors="replace").splitlines()
    # One seed per log: the corpus (some 150 logs) gives the variety, each its own widths and cuts.
    for i, variant in enumerate(_variants(lines, random.Random(f"{log.name}:0"))):
        _check(variant)
        if i == 2:  # the file path too (the Aho-Corasick pass, context reads)
            path = tmp_path / "log.txt"
            path.write_bytes(b"\n".join(v if isinstance(v, bytes) else v.encode("utf-8", "surrogatepass")
                                        for v in variant))
            parsed = parse_log(path)
            assert parsed.parse_errors == 0, parsed.first_parse_error
            json.dumps(parsed.to_dict(), allow_nan=False)
