"""Seconds for `labkit doctor`: the whole run, the per-node probe job, and each check.

On the Slurm mini-cluster (2 nodes, srun probe) when it is up, and always on the local path
(two probe processes). Prints figures only; it asserts nothing.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_doctor.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from labkit import doctor, minicluster
from labkit.doctor.checks import CHECKS


def timed_run(backend: str) -> tuple[float, float, dict[str, float], list[str]]:
    """(total s, probe s, seconds per check, statuses) of one doctor run."""
    ctx_holder: dict = {}
    per_check: dict[str, float] = {}

    def timed(name, fn):
        def run(ctx):
            ctx_holder["ctx"] = ctx
            t = time.perf_counter()
            try:
                return fn(ctx)
            finally:
                per_check[name] = time.perf_counter() - t
        return name, run

    t0 = time.perf_counter()
    results = doctor.run_doctor(backend=backend, nodes=2 if backend == "slurm" else None,
                                checks=[timed(n, f) for n, f in CHECKS])
    total = time.perf_counter() - t0
    probe = ctx_holder["ctx"].probes().seconds
    return total, probe, per_check, [f"{r.name}={r.status}" for r in results]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("LABKIT_RUN_ROOT", tempfile.mkdtemp(prefix="bench_doctor-"))
    backends = (["slurm"] if minicluster.is_up() else []) + ["local"]
    if "slurm" not in backends:
        print("mini-cluster is not up (labkit cluster up): timing the local path only")
    for backend in backends:
        runs = [timed_run(backend) for _ in range(a.repeats)]
        totals = [r[0] for r in runs]
        probes = [r[1] for r in runs]
        print(f"\n{backend}: total {', '.join(f'{t:.1f}' for t in totals)} s "
              f"(median {statistics.median(totals):.1f}); probe job "
              f"{', '.join(f'{p:.1f}' for p in probes)} s")
        checks = runs[-1][2]
        print("  last run, seconds per check (the first node check pays for the probe):")
        for name, secs in checks.items():
            print(f"    {name:12s} {secs:6.2f}")
        not_pass = [s for s in runs[-1][3] if not s.endswith("=PASS")]
        print(f"  not PASS: {not_pass or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
