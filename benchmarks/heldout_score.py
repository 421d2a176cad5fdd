"""How many logs of a folder `labkit parse --json` reads fully right, as a new user runs it.

Each ``<log>.txt`` has a ``<log>.expected.json`` read by hand (tests/fixtures/logs/real/README.md
says what each field means). A log is fully right when labkit does not refuse it and every
expected field matches: layout, iteration count and the first/last fields given, memory rows,
NCCL version and transports, failure kinds (counts, ranks), and findings where given.

    .venv/bin/python benchmarks/heldout_score.py tests/fixtures/logs/heldout
    .venv/bin/python benchmarks/heldout_score.py DIR --tree /tmp/base   # another checkout's labkit

``--tree`` runs the labkit of another checkout (e.g. ``git worktree add /tmp/base COMMIT``) to
score the parser before a change on the same logs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path


def _same(got, want) -> bool:
    if want is None or got is None:
        return got is want
    if isinstance(want, float) or isinstance(got, float):
        return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)
    return got == want


def misses(d: dict, want: dict) -> list[str]:
    """What the ``labkit parse --json`` document ``d`` gets wrong against the hand-read ``want``
    (empty: fully right). The one definition: tests/test_logs_real.py checks the corpus with it."""
    out = []
    if d["layout"] != want["layout"]:
        out.append(f"layout {d['layout']}")
    its = d["iterations"]
    if len(its) != want["iterations"]["count"]:
        out.append(f"{len(its)} iterations, not {want['iterations']['count']}")
    else:
        for which, row in (("first", 0), ("last", -1)):
            for key, value in want["iterations"].get(which, {}).items():
                got = its[row].get(key)
                if not _same(got, value):
                    out.append(f"{which} {key} {got!r} != {value!r}")
    if "memory_rows" in want and len(d["memory"]) != want["memory_rows"]:
        out.append(f"{len(d['memory'])} memory rows")
    for k in ("version", "transports"):
        if d["nccl"][k] != want["nccl"][k]:
            out.append(f"nccl {k} {d['nccl'][k]}")
    out += _table_misses(d["nccl"].get("tests") or [], want["nccl"].get("tests"))
    kinds = sorted({f["kind"] for f in d["failures"]})
    if kinds != sorted(want["failures"]["kinds"]):  # a set of kinds, in whatever order it was written
        out.append(f"failures {kinds}")
    for kind, n in want["failures"].get("counts", {}).items():
        if sum(f["kind"] == kind for f in d["failures"]) != n:
            out.append(f"{kind} count")
    for kind, rank in want["failures"].get("ranks", {}).items():
        if next((f["rank"] for f in d["failures"] if f["kind"] == kind), None) != rank:
            out.append(f"{kind} rank")
    if "findings" in want:
        found = d.get("findings", [])
        if sorted({f["kind"] for f in found}) != sorted(want["findings"]["kinds"]):
            out.append(f"findings {[f['kind'] for f in found]}")
        elif "skipped_steps" in want["findings"] and max(
                f.get("skipped_steps", 0) for f in found) != want["findings"]["skipped_steps"]:
            out.append("skipped steps")
    return out


def _table_misses(got: list[dict], want: list[dict] | None) -> list[str]:
    """nccl-tests tables, where the expected file gives them: per table the collective, the ranks
    its ``Rank`` lines name, the row count, chosen fields of the first and last row, the average."""
    if want is None:
        return []
    if len(got) != len(want):
        return [f"{len(got)} nccl-tests tables, not {len(want)}"]
    out = []
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        for key in ("op", "ranks", "avg_busbw_gbps"):
            if key in w and not _same(g.get(key), w[key]):
                out.append(f"nccl-tests table {i} {key} {g.get(key)!r} != {w[key]!r}")
        if len(g["rows"]) != w["rows"]:
            out.append(f"nccl-tests table {i}: {len(g['rows'])} rows, not {w['rows']}")
            continue
        for which, row in (("first", 0), ("last", -1)):
            for key, value in w.get(which, {}).items():
                if not _same(g["rows"][row].get(key), value):
                    out.append(f"nccl-tests table {i} {which} {key} {g['rows'][row].get(key)!r} != {value!r}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--tree", type=Path, help="checkout whose labkit to run (default: this one)")
    args = ap.parse_args()
    env = dict(os.environ)
    if args.tree:
        env["PYTHONPATH"] = str(args.tree.resolve())
    logs = sorted(args.folder.resolve().glob("*.txt"))
    right = refused = 0
    for log in logs:
        want = json.loads(log.with_suffix(".expected.json").read_text())
        p = subprocess.run([sys.executable, "-m", "labkit", "parse", str(log), "--json"], env=env,
                           capture_output=True, text=True, cwd=args.tree or None)
        if p.returncode != 0:
            refused += 1
            print(f"REFUSED {log.name}: {p.stderr.strip().splitlines()[-1][:120]}")
            continue
        bad = misses(json.loads(p.stdout), want)
        right += not bad
        why = ": " + "; ".join(bad) if bad else ""
        print(f"{'WRONG  ' if bad else 'ok     '} {log.name}{why}")
    share = 100 * right / max(1, len(logs))
    print(f"\n{right} of {len(logs)} fully right ({share:.0f} %), {refused} refused")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
