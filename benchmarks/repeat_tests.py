"""Run the fast tiers (pure + fake: no mini-cluster, training, notebooks, browser or Unix users) N times, each
in its own shuffled order, optionally under CPU hogs, and name every test that failed even once.

    .venv/bin/python benchmarks/repeat_tests.py --runs 20 --hogs 2     # make test-repeat N=20 HOGS=2

A test that fails in one run out of twenty is a defect to fix at its root (a shared file, a fixed
port, a sleep, a wall-clock limit, order dependence), never to retry. Each run's JUnit XML stays in
runs/test-repeat/ so a failure can be read afterwards; the exit status is 1 if any test failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FAST_TIERS = "not slurm and not engine and not notebooks and not browser and not users and not gpu"


def failures(junit: Path) -> list[str]:
    """The ids of the tests that failed or errored in one run's JUnit XML."""
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            out.append(f"{case.get('classname')}::{case.get('name')}")
    return out


def start_hogs(n: int) -> list[subprocess.Popen]:
    """``n`` processes that each keep one core busy, as a loaded shared machine does."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="how many shuffled runs (default 20)")
    ap.add_argument("--hogs", type=int, default=0, help="CPU hogs beside the runs (default 0)")
    ap.add_argument("--first-seed", type=int, default=1, help="seed of the first run's order")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "test-repeat")
    ap.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.hogs < 0:
        ap.error(f"--runs must be >= 1 and --hogs >= 0 (got --runs {args.runs} --hogs {args.hogs})")
    args.out.mkdir(parents=True, exist_ok=True)
    failed: dict[str, list[int]] = defaultdict(list)
    hogs = start_hogs(args.hogs)
    t0 = time.monotonic()
    try:
        for i in range(args.runs):
            seed = args.first_seed + i
            junit = args.out / f"run-{seed}.xml"
            junit.unlink(missing_ok=True)
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", FAST_TIERS,
                   "--shuffle", str(seed), f"--junitxml={junit}", *args.pytest_args]
            t = time.monotonic()
            rc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL).returncode
            load = os.getloadavg()[0]
            if not junit.exists():
                print(f"run {i + 1} (seed {seed}): pytest exit {rc}, no JUnit XML: {' '.join(cmd)}")
                failed["<no result>"].append(seed)
                continue
            names = failures(junit)
            for name in names:
                failed[name].append(seed)
            print(f"run {i + 1}/{args.runs} (seed {seed}): exit {rc}, {len(names)} failed, "
                  f"{time.monotonic() - t:.0f} s, load {load:.1f}", flush=True)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    print(f"\n{args.runs} shuffled runs of the fast tiers with {args.hogs} CPU hog(s) on "
          f"{os.cpu_count()} cores in {(time.monotonic() - t0) / 60:.1f} min: "
          f"{len(failed)} test(s) failed at least once")
    for name, seeds in sorted(failed.items()):
        print(f"  {name}: failed in {len(seeds)} run(s), seeds {seeds} (rerun: --shuffle SEED)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
