"""Wall time of each notebook of the series and of the whole series (cpu profile by default).

    .venv/bin/python benchmarks/bench_notebooks.py                 # all, local backend
    .venv/bin/python benchmarks/bench_notebooks.py 01 05 --backend slurm

Runs the solved notebooks with papermill exactly as ``labkit regress`` does (a fresh run root
under ``runs/bench_notebooks/``, so runs are reused between notebooks as in a workshop) and
prints one line per notebook and the total. Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from labkit.paths import REPO_ROOT  # noqa: E402
from labkit.regress import run_series  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", help="number prefixes, e.g. 01 05 (default: all)")
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--backend", default="local")
    ap.add_argument("--out", default=str(REPO_ROOT / "runs" / "bench_notebooks"))
    args = ap.parse_args()
    out = Path(args.out)
    if out.exists():  # never overwrite an earlier benchmark's runs: move them aside
        out.rename(out.with_name(f"{out.name}.old-{time.strftime('%Y%m%d-%H%M%S')}"))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(f"# notebooks, profile {args.profile}, backend {args.backend}, "
          f"{os.cpu_count()} CPU core(s), {platform.python_version()}")
    results = run_series(args.notebooks or None, profile=args.profile, backend=args.backend,
                         out=out)
    for r in results:
        print(f"{r.notebook:32s} {r.seconds:7.1f} s  {'ok' if r.ok else 'FAILED: ' + str(r.error)}")
    total = sum(r.seconds for r in results)
    print(f"{'total':32s} {total:7.1f} s  ({total / 60:.1f} min)")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
