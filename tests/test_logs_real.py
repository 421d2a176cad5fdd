"""Real logs users posted publicly (tests/fixtures/logs/real, sources in its README.md).

Every ``<log>.txt`` has a ``<log>.expected.json`` written by reading the log, never by running
the parser: the layout (null where the log does not say), the number of iteration records and
chosen fields of the first and last one, the NCCL version and transport counts, and the failure
kinds (with counts and ranks where the log determines them). Each field is checked on the
``labkit parse --json`` document.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from labkit.logs import parse_log

REAL = Path(__file__).parent / "fixtures" / "logs" / "real"
LOGS = sorted(p.name for p in REAL.glob("*.txt"))


def _expected(name: str) -> dict:
    return json.loads((REAL / name).with_suffix(".expected.json").read_text())


def _same(got, want) -> bool:
    if want is None or got is None:
        return got is want
    if isinstance(want, float) or isinstance(got, float):
        return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)
    return got == want


def test_corpus_is_complete():
    assert len(LOGS) >= 60
    for name in LOGS:
        assert (REAL / name).with_suffix(".expected.json").is_file(), name
    readme = (REAL / "README.md").read_text()
    missing = [n for n in LOGS if f"`{n}`" not in readme]
    assert not missing, f"logs without a source row in README.md: {missing}"


@pytest.mark.parametrize("name", LOGS)
def test_real_log(name):
    want = _expected(name)
    parsed = parse_log(REAL / name)
    assert parsed.parse_errors == 0, parsed.first_parse_error
    d = parsed.to_dict()
    json.dumps(d, allow_nan=False)

    assert d["layout"] == want["layout"]

    its = d["iterations"]
    assert len(its) == want["iterations"]["count"]
    for which, row in (("first", 0), ("last", -1)):
        for key, value in want["iterations"].get(which, {}).items():
            assert _same(its[row][key], value), f"{which} iteration {key}: {its[row][key]!r} != {value!r}"

    if "memory_rows" in want:
        assert len(d["memory"]) == want["memory_rows"]

    assert d["nccl"]["version"] == want["nccl"]["version"]
    assert d["nccl"]["transports"] == want["nccl"]["transports"]

    failures = d["failures"]
    assert sorted({f["kind"] for f in failures}) == want["failures"]["kinds"]
    for kind, n in want["failures"].get("counts", {}).items():
        assert sum(f["kind"] == kind for f in failures) == n, kind
    for kind, rank in want["failures"].get("ranks", {}).items():
        assert next(f["rank"] for f in failures if f["kind"] == kind) == rank, kind

    if "findings" in want:
        found = d["findings"]
        assert sorted({f["kind"] for f in found}) == want["findings"]["kinds"]
        if "skipped_steps" in want["findings"]:
            assert max(f.get("skipped_steps", 0) for f in found) == want["findings"]["skipped_steps"]
