"""Real logs users posted publicly (tests/fixtures/logs/real, sources in its README.md).

Every ``<log>.txt`` has a ``<log>.expected.json`` written by reading the log, never by running
the parser: the layout (null where the log does not say), the number of iteration records and
chosen fields of the first and last one, the NCCL version and transport counts, and the failure
kinds (with counts and ranks where the log determines them). Each field is checked on the
``labkit parse --json`` document.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from labkit.logs import found_nothing, parse_log

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from heldout_score import misses  # noqa: E402  (the one rule for "fully right")

REAL = Path(__file__).parent / "fixtures" / "logs" / "real"
LOGS = sorted(p.name for p in REAL.glob("*.txt"))


def _expected(name: str) -> dict:
    return json.loads((REAL / name).with_suffix(".expected.json").read_text())


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
    assert not found_nothing(parsed), "labkit parse refuses it: no training-log lines"
    assert parsed.parse_errors == 0, parsed.first_parse_error
    d = parsed.to_dict()
    json.dumps(d, allow_nan=False)

    assert misses(d, want) == []  # benchmarks/heldout_score.py: what "fully right" means
