"""The real log fixtures by name, for the round tests (tests/test_logs_round*.py): one log of a
folder, and the failures the parser reads in it (sources in each folder's README.md)."""

from __future__ import annotations

from pathlib import Path

from labkit.logs import parse_log

LOGS = Path(__file__).parent / "fixtures" / "logs"


def one(folder: str, words: str) -> Path:
    """The one log of ``folder`` whose file name holds ``words`` (an error if none or several do)."""
    (path,) = (p for p in (LOGS / folder).glob("*.txt") if words in p.name)
    return path


def failure_kinds(path: Path) -> list[tuple[str, int | None]]:
    """The (kind, rank) of every failure the parser reads in the log, sorted."""
    return sorted((f.kind, f.rank) for f in parse_log(path).failure_records)
