"""Bus bandwidth vs message size, intra-node (loopback) and inter-node (the shaped link).

Submits code/allreduce_bench.py as a labkit job on the Slurm mini-cluster (2 nodes x 2
processes, gloo) when it is up, else on the local backend (two simulated nodes, all loopback),
and prints busbw per message size for each scope, then the peak of each. Prints figures only;
it asserts nothing.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_allreduce.py [--backend slurm|local]
        [--ops all_reduce,all_gather,reduce_scatter] [--max-bytes 16M] [--plot busbw.png]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from labkit import minicluster
from labkit.measured import comm


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["local", "slurm"])
    ap.add_argument("--ops", default="all_reduce")
    ap.add_argument("--min-bytes", default="1K")
    ap.add_argument("--max-bytes", default="16M")
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--plot", help="save the busbw plot to this PNG")
    a = ap.parse_args()
    backend = a.backend or ("slurm" if minicluster.is_up() else "local")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("LABKIT_RUN_ROOT", tempfile.mkdtemp(prefix="bench_allreduce-"))
    t0 = time.time()
    job = comm.submit_bench(f"busbw-{backend}-{int(t0)}", nodes=2, gpus_per_node=2,
                            backend=backend, ops=a.ops.split(","), min_bytes=a.min_bytes,
                            cluster=minicluster.minicluster_cluster() if backend == "slurm" else None,
                            max_bytes=a.max_bytes, factor=a.factor, iters=a.iters)
    state = job.wait(timeout=1800, progress=False)
    print(f"backend {backend}: job {job.job_id} {state} in {time.time() - t0:.1f} s "
          f"(run dir {job.run_dir})")
    if str(state) != "COMPLETED":
        print(job.tail(30))
        return 1
    df = comm.read_busbw(job.run_dir)
    table = df.pivot_table(index="size_bytes", columns=["op", "scope"], values="busbw_gbps")
    print("\nbus bandwidth (GB/s) by message size (bytes)")
    print(table.round(4).to_string())
    print("\npeak bus bandwidth per op and scope")
    print(comm.peak_busbw(df).round(4).to_string(index=False))
    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        ax = comm.plot_busbw(df)
        ax.figure.savefig(a.plot, dpi=120, bbox_inches="tight")
        print(f"plot: {a.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
