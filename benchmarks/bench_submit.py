"""Seconds from submit to RUNNING and to the first training iteration, per backend.

Runs the real engine (code/pretrain_gpt.py, tiny GPT, TP=2 x PP=2 on 2 nodes x 2 processes)
with the local backend and, when it is up (or can be started as root), on the Slurm
mini-cluster. Prints one line per backend and repeat; no assertions.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_submit.py [--repeats 2] [--no-slurm]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
import time

from labkit.config import RunConfig
from labkit.jobs import JobState, submit

FIRST_ITER = re.compile(r"iteration\s+1\s*/")


def one(backend: str, name: str, cluster=None) -> tuple[float, float, float, str]:
    cfg = RunConfig(name=name, nodes=2, gpus_per_node=2, tensor_model_parallel_size=2,
                    pipeline_model_parallel_size=2, train_iters=3)
    t0 = time.time()
    job = submit(cfg, backend=backend, cluster=cluster)
    t_submit = time.time() - t0
    t_running = t_first = None
    while True:
        st = job.state()
        now = time.time() - t0
        if t_running is None and st in (JobState.RUNNING, JobState.COMPLETED):
            t_running = now
        if t_first is None and job.log_path.exists() and FIRST_ITER.search(
                job.log_path.read_text(errors="replace")):
            t_first = now
        if st.finished:
            break
        time.sleep(0.1)
    return t_submit, t_running or float("nan"), t_first or float("nan"), str(st)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-slurm", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["LABKIT_RUN_ROOT"] = tempfile.mkdtemp(prefix="bench_submit_")
    backends: list[tuple[str, object]] = [("local", None)]
    if not args.no_slurm:
        from labkit import minicluster

        if minicluster.is_up() or os.geteuid() == 0:
            backends.append(("slurm", minicluster.cluster_up()))
    print(f"{'backend':8} {'submit s':>9} {'to RUNNING s':>13} {'to 1st iter s':>14}  final")
    for backend, cluster in backends:
        firsts = []
        for r in range(args.repeats):
            s, run, first, st = one(backend, f"bench_{backend}_{r}", cluster)
            firsts.append(first)
            print(f"{backend:8} {s:9.2f} {run:13.2f} {first:14.2f}  {st}", flush=True)
        print(f"{backend:8} median to first iteration: {statistics.median(firsts):.2f} s")


if __name__ == "__main__":
    main()
