"""Log parsing speed and memory: labkit.logs.parse_log vs `grep -c iteration` on the same file.

Generates a log of 256 interleaved ranks (srun --label prefixes) in a temporary folder:
NCCL_DEBUG=INFO start-up lines from every rank, one Megatron iteration line per iteration from
the last rank, a memory report from every rank after the first iteration (as Megatron does),
and per-rank chatter
(warnings, data-loader and timer lines) between iterations. Then prints MB/s of both, their
ratio, and the parser's peak memory (measured in a child process, next to the same child's
footprint after imports, so the figure is what parsing adds). The parse runs on the path a user
gets: the Aho-Corasick pass (labkit/logs/fastscan.py); `--path python` forces the line-by-line
reference path (LABKIT_NO_FASTSCAN=1).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_parse.py            # 1 GB (default)
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_parse.py --size-mb 200
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_parse.py --size-mb 565 --cli --long-line-mb 300

``--cli`` also times ``labkit parse --json LOG`` end to end (the JSON written to a file, checked
to hold every iteration), with its peak RSS and whether it printed a traceback; ``--long-line-mb
N`` parses a log whose last line is N MB with a trigger word and no newline (peak RSS again).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RANKS = 256
CHATTER = [
    "[W reducer.cpp:1300] Warning: find_unused_parameters=True was specified in DDP constructor, but did "
    "not find any unused ones in the forward pass.",
    " > building train, validation, and test datasets for GPT ...",
    "(min, max) time across ranks (ms):",
    "    forward-backward ...............................: (801.21, 812.33)",
    "    optimizer ......................................: (10.02, 11.87)",
    "batch generator: 0.21 | forward-compute: 301.3 | backward-compute: 498.1 | optimizer-step: 10.4",
    "INFO:megatron.core.datasets.blended_megatron_dataset_builder:Load the GPTDataset train indices",
    "[2026-11-22 03:30:01,123] torch.distributed.elastic.agent.server.api: [default] Starting worker group",
]


def iteration_line(i: int, n: int) -> str:
    return (f" [2026-11-22 03:30:01] iteration {i:8d}/{n:8d} | consumed samples: {i * 1024:12d} | "
            f"elapsed time per iteration (ms): {800 + i % 17:.1f} | throughput per GPU (TFLOP/s/GPU): "
            f"{180 + i % 7:.1f} | learning rate: {3e-4:.6E} | global batch size:  1024 | lm loss: "
            f"{8.0 / (1 + i / 1000):.6E} | loss scale: 1.0 | grad norm: {1 + i % 5 / 10:.3f} | "
            f"number of skipped iterations:   0 | number of nan iterations:   0 |")


def generate(path: Path, size_mb: int, seed: int = 0) -> dict[str, int]:
    """Write the log; returns line counts by kind."""
    rng = random.Random(seed)
    target = size_mb * 1_000_000
    counts = {"iteration": 0, "memory": 0, "nccl": 0, "chatter": 0}
    with open(path, "w") as f:
        for r in range(RANKS):
            host = f"{r}: node{r // 8:03d}:4{r:03d}"
            f.write(f"{host}:4{r:03d} [{r % 8}] NCCL INFO NCCL version 2.21.5+cuda12.4\n")
            for ch in range(4):
                f.write(f"{r}: node{r // 8:03d}:4{r:03d}:5{r:03d} [{r % 8}] NCCL INFO Channel {ch:02d}/0 : "
                        f"{r}[{r % 8}] -> {(r + 1) % RANKS}[{(r + 1) % 8}] via P2P/CUMEM/read\n")
            counts["nccl"] += 5
        i, n = 0, 10**8
        written = f.tell()
        while written < target:
            i += 1
            buf = [f"{RANKS - 1}: {iteration_line(i, n)}\n"]
            counts["iteration"] += 1
            if i == 1:
                buf += [f"{r}: [Rank {r}] (after {i} iterations) memory (MB) | allocated: 30211.2 | "
                        f"max allocated: {61000 + r:.1f} | reserved: 64112.0 | max reserved: 64112.0\n"
                        for r in range(RANKS)]
                counts["memory"] += RANKS
            for _ in range(24):
                buf.append(f"{rng.randrange(RANKS)}: {rng.choice(CHATTER)}\n")
            counts["chatter"] += 24
            s = "".join(buf)
            f.write(s)
            written += len(s)
    return counts


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def time_grep(path: Path) -> tuple[float, float, int]:
    """(wall s, CPU s, count) of `grep -c iteration`."""
    t, c = time.perf_counter(), _children_cpu()
    out = subprocess.run(["grep", "-c", "iteration", str(path)], capture_output=True, text=True, check=True)
    return time.perf_counter() - t, _children_cpu() - c, int(out.stdout)


PEAK = """
def peak_kb():  # this process's own peak (ru_maxrss would carry the parent's over exec)
    try:
        return next(int(s.split()[1]) for s in open("/proc/self/status") if s.startswith("VmHWM:"))
    except (OSError, StopIteration):
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
"""
CHILD = PEAK + """
import json, sys, time
from labkit.logs import fastscan, parse_log
base = peak_kb()
t, c = time.perf_counter(), time.process_time()
p = parse_log(sys.argv[1])
dt, cpu = time.perf_counter() - t, time.process_time() - c
print(json.dumps({"seconds": dt, "cpu_seconds": cpu,
                  "path": "aho-corasick" if fastscan.available() else sys.argv[2],
                  "iterations": len(p.iterations), "memory_rows": len(p.memory),
                  "channels": len(p.nccl), "failures": len(p.failure_records),
                  "base_rss_mb": base / 1024,
                  "peak_rss_mb": peak_kb() / 1024}))
"""


def time_parse(path: Path, which: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if which == "python":
        env["LABKIT_NO_FASTSCAN"] = "1"
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), which], capture_output=True, text=True,
                         env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


LABKIT = PEAK + """
import sys
from labkit.cli import main
peak_file = sys.argv.pop(1)
rc = main(sys.argv[1:])
sys.stdout.flush()
open(peak_file, "w").write(str(peak_kb()))
sys.exit(rc)
"""
CLI_CHILD = """
import json, resource, subprocess, sys, time
t = time.perf_counter()
with open(sys.argv[2], "wb") as out:
    p = subprocess.run(sys.argv[3:] + ["parse", "--json", sys.argv[1]], stdout=out, stderr=subprocess.PIPE)
ch = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"seconds": time.perf_counter() - t, "cpu_seconds": ch.ru_utime + ch.ru_stime,
                  "rc": p.returncode, "traceback": b"Traceback" in p.stderr,
                  "stderr": p.stderr.decode(errors="replace")[-300:],
                  "peak_rss_mb": int(open(sys.argv[-1]).read() or 0) / 1024}))
"""


def time_cli(path: Path, out: Path) -> dict:
    """``labkit parse --json`` in a child of a fresh process (so the peak RSS is its own)."""
    peak = out.with_suffix(".peak")
    peak.write_text("")  # stays empty if the command dies before it writes its peak
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", CLI_CHILD, str(path), str(out), sys.executable, "-c", LABKIT,
                          str(peak)], capture_output=True, text=True, env=env, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def long_line_log(path: Path, mb: int) -> None:
    """A short log whose last line is ``mb`` MB with a trigger word in it and no newline."""
    with open(path, "wb") as f:
        f.write(iteration_line(1, 10).encode() + b"\n")
        block = b"x" * (1 << 20)
        for i in range(mb):
            f.write(block if i != mb // 2 else block[:-20] + b" Traceback CUDA oom ")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=1000, help="log size in MB (default 1000 = 1 GB)")
    ap.add_argument("--keep", help="write the log here instead of a temporary folder (kept)")
    ap.add_argument("--reuse", action="store_true", help="with --keep: parse the kept log if it exists")
    ap.add_argument("--path", choices=("default", "python"), default="default",
                    help="parse path: default (Aho-Corasick), python (line by line)")
    ap.add_argument("--cli", action="store_true", help="also time `labkit parse --json` on the log")
    ap.add_argument("--long-line-mb", type=int, default=0, help="also parse a log with one line this long")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.keep) if args.keep else Path(tmp) / "log.txt"
        t = time.perf_counter()
        if args.reuse and path.is_file():
            counts = {"reused": sum(1 for _ in open(path, "rb"))}
        else:
            counts = generate(path, args.size_mb)
        size_mb = path.stat().st_size / 1e6
        print(f"generated {size_mb:.0f} MB, {sum(counts.values()):,} lines {counts} from {RANKS} ranks "
              f"in {time.perf_counter() - t:.1f} s")
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
        g_s, g_cpu, g_n = time_grep(path)
        r = time_parse(path, args.path)
        print(f"grep -c iteration : {g_s:8.2f} s  {size_mb / g_s:8.1f} MB/s  (CPU {g_cpu:.2f} s; "
              f"{g_n:,} lines)")
        print(f"labkit parse_log  : {r['seconds']:8.2f} s  {size_mb / r['seconds']:8.1f} MB/s  "
              f"(CPU {r['cpu_seconds']:.2f} s; {r['path']} path) "
              f"({r['iterations']:,} iterations, {r['memory_rows']:,} memory rows, "
              f"{r['channels']:,} channels)")
        print(f"ratio parse/grep  : {g_s / r['seconds']:.3f} of grep's speed by wall time, "
              f"{g_cpu / max(r['cpu_seconds'], 1e-9):.3f} by CPU time (aim: >= 0.333)")
        print(f"peak memory       : {r['peak_rss_mb']:.0f} MB RSS ({r['base_rss_mb']:.0f} MB after imports, "
              f"+{r['peak_rss_mb'] - r['base_rss_mb']:.0f} MB while parsing)")
        if args.cli:
            out = Path(tmp) / "parse.json"
            c = time_cli(path, out)
            n = len(json.loads(out.read_text())["iterations"]) if c["rc"] == 0 else None
            tb = "YES" if c["traceback"] else "no"
            print(f"labkit parse --json: {c['seconds']:8.2f} s  {size_mb / c['seconds']:8.1f} MB/s  (CPU "
                  f"{c['cpu_seconds']:.2f} s) exit {c['rc']}, traceback: {tb}, "
                  f"{out.stat().st_size / 1e6:.0f} MB of JSON, {n if n is None else f'{n:,}'} iterations, "
                  f"peak {c['peak_rss_mb']:.0f} MB RSS")
            if c["rc"]:
                print(f"  stderr: {c['stderr']}")
            out.unlink()
        if args.long_line_mb:
            long_path = Path(tmp) / "long_line.txt"
            long_line_log(long_path, args.long_line_mb)
            r = time_parse(long_path, args.path)
            print(f"{args.long_line_mb} MB line       : {r['seconds']:8.2f} s  peak memory "
                  f"{r['peak_rss_mb']:.0f} MB RSS ({r['base_rss_mb']:.0f} MB after imports), "
                  f"{r['failures']} failures, "
                  f"{r['iterations']} iterations ({r['path']} path)")
            long_path.unlink()


if __name__ == "__main__":
    main()
