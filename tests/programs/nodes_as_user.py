"""Local jobs whose nodes are rootless network namespaces, driven as a user who is not root
(tests/test_nodenet_users.py runs it with runuser): the all-reduce benchmark on 2 nodes x 2
ranks, then two jobs at once (same node addresses) of which one launcher is killed with -9 and
the other cancelled, then a job that fails. Prints one JSON object: what each job ended as, the
network namespaces its processes were in, and what of it was still running afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from labkit import nodenet
from labkit.backends import local
from labkit.config import RunConfig
from labkit.jobs import submit
from labkit.measured.comm import read_busbw, submit_bench

PROGRAM = Path(__file__).with_name("allreduce_job.py")


def _netns(job) -> set[str]:
    out = set()
    for pid, _ in local._members(job):
        try:
            out.add(os.readlink(f"/proc/{pid}/ns/net"))
        except OSError:
            pass
    return out


def _workers(job) -> int:
    n = 0
    for pid, _ in local._members(job):
        try:
            n += b"allreduce_job.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            pass
    return n


def _until(pred, timeout: float) -> bool:
    end = time.time() + timeout
    while not pred():
        if time.time() > end:
            return False
        time.sleep(0.2)
    return True


def _cfg(name: str, **extra) -> RunConfig:
    return RunConfig(name=name, nodes=2, gpus_per_node=1, train_iters=3, extra=extra)


def main() -> int:
    out: dict = {"probe": nodenet.probe(), "jobs": {}}
    if out["probe"]:
        print(json.dumps(out))
        return 0
    bench = submit_bench("ns_bench", nodes=2, gpus_per_node=2, min_bytes="256K",
                         max_bytes="1M", iters=5, warmup=1)
    bench.wait(timeout=600, progress=False)
    peak = read_busbw(bench.run_dir).groupby("scope")["busbw_gbps"].max().to_dict()
    out["bench"] = {"state": str(bench.state()), "peak": peak,
                    "record": nodenet.read_record(bench.run_dir)}
    # Two jobs at once, on the same node addresses: one launcher gets kill -9, one is cancelled.
    killed = submit(_cfg("ns_kill9", sleep=300, iters=300), program=PROGRAM)
    cancelled = submit(_cfg("ns_cancel", sleep=300, iters=300), program=PROGRAM)
    both = _until(lambda: _workers(killed) == 2 and _workers(cancelled) == 2, 300)
    seen = {"ns_kill9": _netns(killed), "ns_cancel": _netns(cancelled)}
    os.kill(killed.info["pid"], signal.SIGKILL)
    local.cancel(cancelled, grace=10)
    failed = submit(_cfg("ns_fail", fail=True), program=PROGRAM)
    failed.wait(timeout=300, progress=False, raise_on_failure=False)
    seen["ns_fail"] = set()  # it ran and ended; its namespaces are checked from outside
    for job in (killed, cancelled, failed):
        _until(lambda j=job: not local._members(j), 30)
        out["jobs"][job.name] = {"state": str(job.state()), "left": len(local._members(job)),
                                 "netns": sorted(seen[job.name])}
    out["both_running"] = both
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
