"""How often ``make lab``'s regress passes while CPU hogs keep every core busy.

    .venv/bin/python benchmarks/bench_regress_hog.py                    # 3 runs of 01 under 2 hogs
    .venv/bin/python benchmarks/bench_regress_hog.py 01 02 --runs 5
    .venv/bin/python benchmarks/bench_regress_hog.py --full --runs 2    # the whole series

Starts ``--hogs`` busy-loop processes (default: one per core), then, ``--runs`` times:

- default: runs the chosen solved notebooks with papermill exactly as ``labkit regress`` does
  (``labkit.regress.run_series``: a fresh run root, the machine load measured around each
  notebook) and judges what they recorded against ``baselines/cpu.json`` with the same
  verdicts (``labkit.verdict.compare``). It also judges the same metrics as if the load had
  not been measured, to show what the load factor buys. A notebook is minutes of real
  training on a loaded 2-core machine; notebook 01 is the cheapest real run.
- ``--full``: runs ``make lab``'s own command, ``labkit regress --profile cpu --backend local``,
  over the whole series (5-10 min a run on 2 cores, longer under the hogs) and counts exit 0.

Prints one line per run and the pass count; asserts nothing. The hogs are stopped at the end
(also on Ctrl-C). Outputs go under ``runs/bench_regress_hog/`` (an earlier one moved aside).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from labkit.paths import REPO_ROOT  # noqa: E402
from labkit.regress import load_baseline, run_series  # noqa: E402
from labkit.verdict import FAILING, compare, passed  # noqa: E402


def start_hogs(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-S", "-c", "while True: pass"]) for _ in range(n)]


def stop_hogs(hogs: list[subprocess.Popen]) -> None:
    for p in hogs:
        p.kill()
        p.wait()


def _worst_timing(rows) -> str:
    """The largest slowdown among the judged timings, as 'metric xN.NN'."""
    worst, name = 0.0, ""
    for r in rows:
        if r.verdict != "judged" or not isinstance(r.value, (int, float)) or not r.baseline:
            continue
        if r.metric.endswith(("_ms", "_s")):
            f = r.value / r.baseline
        elif r.metric.endswith(("_per_sec", "_gbps")) and r.value:
            f = r.baseline / r.value
        else:
            continue
        if f > worst:
            worst, name = f, r.metric
    return f"{name} x{worst:.2f} slower" if name else "no timing judged"


def run_cheap(i: int, args: argparse.Namespace, baseline: dict, out: Path) -> tuple[bool, bool]:
    results = run_series(args.notebooks or ["01"], profile="cpu", backend="local",
                         out=out / f"run{i}")
    rows = compare(results, baseline, backend="local")
    ignoring_load = compare([replace(r, load=1.0) for r in results], baseline, backend="local")
    ok, ok_no_load = passed(rows), passed(ignoring_load)
    loads = " ".join(f"{r.notebook[:2]}:{r.load:.2f}" for r in results)
    secs = sum(r.seconds for r in results)
    print(f"run {i}: {'PASS' if ok else 'FAIL'} ({'pass' if ok_no_load else 'fail'} if the load "
          f"were ignored)  {secs:6.0f} s  load {loads}  worst {_worst_timing(rows)}", flush=True)
    for r in rows:
        if r.status in FAILING:
            print(f"    {r.notebook} {r.metric} {r.value} vs {r.baseline} ({r.rule}): {r.status}")
    for r in results:
        if r.error:
            print(f"    {r.error}")
    return ok, ok_no_load


def run_full(i: int, out: Path) -> tuple[bool, bool]:
    labkit = Path(sys.executable).parent / "labkit"
    cmd = [str(labkit), "regress", "--profile", "cpu", "--backend", "local",
           "--out", str(out / f"run{i}")]
    t0 = time.monotonic()
    rc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True).returncode
    secs = time.monotonic() - t0
    doc_path = out / f"run{i}" / "metrics.json"
    doc = json.loads(doc_path.read_text()) if doc_path.exists() else {"rows": [], "notebooks": []}
    loads = " ".join(f"{n['notebook'][:2]}:{n.get('load', 1.0):.2f}" for n in doc["notebooks"])
    print(f"run {i}: {'PASS' if rc == 0 else f'FAIL (exit {rc})'}  {secs:6.0f} s  load {loads}",
          flush=True)
    for r in doc["rows"]:
        if r["status"] in FAILING:
            print(f"    {r['notebook']} {r['metric']} {r['value']} vs {r['baseline']} "
                  f"({r['rule']}): {r['status']}")
    return rc == 0, rc == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", help="number prefixes to run (default: 01)")
    ap.add_argument("--runs", type=int, default=3, help="repetitions (default 3)")
    ap.add_argument("--hogs", type=int, default=len(os.sched_getaffinity(0)),
                    help="busy-loop processes (default: one per core)")
    ap.add_argument("--full", action="store_true",
                    help="run `labkit regress --profile cpu --backend local` (make lab) each time")
    ap.add_argument("--baseline", help="baseline file (default baselines/cpu.json)")
    ap.add_argument("--out", default=str(REPO_ROOT / "runs" / "bench_regress_hog"))
    args = ap.parse_args()
    if args.full and args.notebooks:
        ap.error("--full runs the whole series; leave out the notebook names")
    out = Path(args.out)
    if out.exists():  # never overwrite an earlier benchmark's runs: move them aside
        out.rename(out.with_name(f"{out.name}.old-{time.strftime('%Y%m%d-%H%M%S')}"))
    out.mkdir(parents=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    baseline = load_baseline(args.baseline, "cpu")
    what = "labkit regress (the whole series)" if args.full else \
        f"notebooks {' '.join(args.notebooks or ['01'])}"
    print(f"# {what} under {args.hogs} CPU hog(s), {args.runs} run(s); "
          f"{len(os.sched_getaffinity(0))} core(s), load average {os.getloadavg()[0]:.1f} "
          f"before the hogs, Python {platform.python_version()}", flush=True)
    hogs = start_hogs(args.hogs)
    tally = [0, 0]
    try:
        for i in range(1, args.runs + 1):
            ok, ok_no_load = run_full(i, out) if args.full else run_cheap(i, args, baseline, out)
            tally[0] += ok
            tally[1] += ok_no_load
    finally:
        stop_hogs(hogs)
    print(f"passed {tally[0]}/{args.runs} under {args.hogs} hog(s)"
          + ("" if args.full else f"; {tally[1]}/{args.runs} if the measured load were ignored"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
