"""Where `make test`'s time goes: seconds per test file and the slowest tests, from its junit files.

    .venv/bin/python benchmarks/suite_time.py runs/ci/junit-fast.xml runs/ci/junit-slow.xml

`.ci/run` writes both files (`make test JUNIT=runs/ci/junit`): the fast phase's tests run in
parallel workers, so its seconds add up to more than its wall time; the slow phase runs one test
after another, so its seconds are its wall time (less collection and start-up). The phase's wall
time is the junit file's own ``time``.
"""

from __future__ import annotations

import argparse
import collections
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def read(path: Path) -> tuple[float, list[tuple[float, str, str]]]:
    """(the phase's wall seconds, [(seconds, test file, test name)])."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    wall = sum(float(s.get("time", 0)) for s in suites)
    rows = []
    for case in root.iter("testcase"):
        module = case.get("classname", "").split(".")
        rows.append((float(case.get("time", 0)), module[1] if len(module) > 1 else module[0],
                     case.get("name", "")))
    return wall, rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("junit", nargs="+", type=Path, help="junit XML files of one make test")
    ap.add_argument("--top", type=int, default=15, help="how many files and tests to list")
    a = ap.parse_args(argv)
    everything = []
    for path in a.junit:
        if not path.is_file():
            print(f"suite_time: no junit file {path} (make test JUNIT=PREFIX writes them)",
                  file=sys.stderr)
            return 2
        wall, rows = read(path)
        everything += rows
        print(f"{path}: {len(rows)} tests, {wall / 60:.1f} min wall, "
              f"{sum(r[0] for r in rows) / 60:.1f} min of test time")
    by_file: collections.Counter[str] = collections.Counter()
    for seconds, module, _ in everything:
        by_file[module] += seconds
    print("\nslowest files (seconds, all phases):")
    for module, seconds in by_file.most_common(a.top):
        print(f"  {seconds:7.1f}  {module}")
    print("\nslowest tests (seconds):")
    for seconds, module, name in sorted(everything, reverse=True)[:a.top]:
        print(f"  {seconds:7.1f}  {module}::{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
