"""The notebooks' views of the machines around a run (labkit.lab_watch): the queue, a running
job's devices, a run's profiler traces. A real local job (a program that waits for a file, no
training); nvidia-smi is faked at the command boundary, on PATH."""

from __future__ import annotations

import re
import time

from labkit.jobs import JobSpec, submit
from labkit.lab_watch import device_view, queue_view, trace_view

WAITER = """import os, pathlib, sys, time
stop = pathlib.Path(sys.argv[-1]).parent / "stop"
(stop.parent / f"pid.{os.getpid()}").write_text("")
for _ in range(1200):  # at most 2 minutes, then it ends on its own
    if stop.exists():
        break
    time.sleep(0.1)
"""


def _until(what, check, limit_s: float = 120.0):
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        value = what()
        if check(value):
            return value
        time.sleep(0.3)
    raise AssertionError(f"not reached in {limit_s:.0f} s; last: {value}")


def test_queue_and_devices_of_a_running_local_job(run_root, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert "0 not finished, 0 finished" in queue_view()
    prog = tmp_path / "pretrain_gpt.py"  # the name the view looks for, as the engine's
    prog.write_text(WAITER)
    job = submit(JobSpec("watched", gpus_per_node=2), program=prog,
                 program_args=["--save", "{run_dir}/checkpoints"])
    try:
        pids = _until(lambda: sorted(p.name[4:] for p in job.run_dir.glob("pid.*")),
                      lambda p: len(p) == 2)
        seen = device_view(job)
        assert sorted(re.findall(r"  pid +(\d+) ", seen)) == pids, seen  # the ranks, not torchrun
        assert seen.startswith("no GPU: watched trains on CPU processes, so nvidia-smi has "
                               "nothing to show"), seen
        assert "resident" in seen and "CPU" in seen
        q = queue_view()
        assert "local backend: no scheduler queue" in q and "1 not finished, 0 finished" in q
        assert "RUNNING       watched" in q, q
        fake = tmp_path / "bin" / "nvidia-smi"
        fake.parent.mkdir()
        fake.write_text("#!/bin/sh\necho \"$*\"\necho '0, NVIDIA H100 80GB HBM3, 97 %, 30512 MiB, "
                        "81559 MiB'\n")
        fake.chmod(0o755)
        monkeypatch.setenv("PATH", f"{fake.parent}:{__import__('os').environ['PATH']}")
        gpu = device_view(job, device="cuda")
        assert "(on this machine, while watched trains)" in gpu
        assert "--query-gpu=index,name,utilization.gpu,memory.used,memory.total" in gpu
        assert gpu.endswith("0, NVIDIA H100 80GB HBM3, 97 %, 30512 MiB, 81559 MiB")
    finally:
        (job.run_dir / "stop").write_text("")
    job.wait(timeout=120, progress=False)
    assert device_view(job) == "watched is COMPLETED: nothing of it runs on a node now"
    q = queue_view()
    assert "0 not finished, 1 finished (the last 1:)" in q and "COMPLETED     watched" in q


def test_trace_view_lists_the_traces_and_says_how_to_open_them(tmp_path):
    assert "no trace in" in trace_view(tmp_path) and "torch_profiler=True" in trace_view(tmp_path)
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "rank0.json").write_text("{}" * 50_000)
    text = trace_view(tmp_path)
    assert "rank0.json  (0.1 MB)" in text and "ui.perfetto.dev" in text
    assert "chrome://tracing" in text
