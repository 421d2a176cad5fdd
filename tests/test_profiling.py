"""Profiler traces -> per-rank breakdown: a real 2-process gloo CPU trace, and a CUDA-format trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from labkit.errors import LabkitError
from labkit.measured.profiling import classify, profile_breakdown, trace_breakdown

CODE = Path(__file__).resolve().parent.parent / "code"

GEN = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    from torch.profiler import profile, ProfilerActivity, schedule
    rank = int(os.environ["RANK"]); out = sys.argv[1]
    dist.init_process_group("gloo")
    a = torch.randn(128, 128)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=2),
                 on_trace_ready=lambda p: p.export_chrome_trace(f"{out}/rank{rank}.json")) as p:
        for _ in range(3):
            b = a @ a                          # compute
            t = torch.ones(200000) * rank
            dist.all_reduce(t)                 # communication (gloo)
            c = b.to(torch.float64)            # memcpy
            p.step()
    dist.destroy_process_group()
    sys.path.insert(0, sys.argv[2])
    from engine_stop import end_process
    end_process(0)
""")


@pytest.fixture(scope="module")
def cpu_traces(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile")
    script = out / "gen.py"
    script.write_text(GEN)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                        "2", str(script), str(out), str(CODE)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return out


def test_real_gloo_trace_breakdown(cpu_traces):
    df = profile_breakdown(cpu_traces)
    assert df["rank"].tolist() == [0, 1] and set(df["device"]) == {"cpu"}
    assert df["steps"].tolist() == [2, 2]
    for _, row in df.iterrows():
        assert row["compute_ms"] > 0 and row["communication_ms"] > 0 and row["memcpy_ms"] > 0
        parts = row["compute_ms"] + row["communication_ms"] + row["memcpy_ms"] + row["idle_ms"]
        assert parts == pytest.approx(row["total_ms"], rel=1e-6)


def _cuda_trace():
    """Kineto's Chrome-trace shape for a CUDA run (documented cats: kernel, gpu_memcpy, cpu_op)."""
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 1000, "pid": 1,
         "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 10, "dur": 50, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32", "ts": 100, "dur": 400,
         "pid": 0, "tid": 7},
        {"ph": "X", "cat": "kernel",
         "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage)", "ts": 450,
         "dur": 300, "pid": 0, "tid": 20},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "ts": 800, "dur": 100,
         "pid": 0, "tid": 7},
    ]
    return {"traceEvents": ev, "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 8}}


def test_cuda_trace_uses_the_gpu_timeline_with_overlap_once():
    row = trace_breakdown(_cuda_trace())
    assert row["rank"] == 3 and row["device"] == "cuda"
    # GPU span 100..900 = 800 us; nccl 450..750 wins over the gemm where they overlap
    assert row["total_ms"] == pytest.approx(0.8)
    assert row["communication_ms"] == pytest.approx(0.3)
    assert row["compute_ms"] == pytest.approx(0.35)
    assert row["memcpy_ms"] == pytest.approx(0.1)
    assert row["idle_ms"] == pytest.approx(0.05)


@pytest.mark.parametrize("event,cuda,expected", [
    ({"cat": "user_annotation", "name": "gloo:all_reduce"}, False, "communication"),
    ({"cat": "cpu_op", "name": "c10d::allreduce_"}, False, "communication"),
    ({"cat": "cpu_op", "name": "record_param_comms"}, False, "communication"),
    ({"cat": "cpu_op", "name": "aten::copy_"}, False, "memcpy"),
    ({"cat": "cpu_op", "name": "aten::addmm"}, False, "compute"),
    ({"cat": "user_annotation", "name": "ProfilerStep#3"}, False, None),
    ({"cat": "cpu_op", "name": "aten::addmm"}, True, None),
    ({"cat": "kernel", "name": "ncclKernel_AllGather_RING_LL_Sum_int8_t"}, True, "communication"),
    ({"cat": "gpu_memset", "name": "Memset (Device)"}, True, "memcpy"),
])
def test_classify(event, cuda, expected):
    assert classify(event, cuda=cuda) == expected


def test_errors_name_the_file(tmp_path):
    with pytest.raises(LabkitError, match="no such profiler trace"):
        profile_breakdown(tmp_path / "nope")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(LabkitError, match="bad.json"):
        profile_breakdown(tmp_path / "bad.json")
    (tmp_path / "d").mkdir()
    with pytest.raises(LabkitError, match="torch_profiler=True"):
        profile_breakdown(tmp_path / "d")
    (tmp_path / "empty.json").write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(LabkitError, match="no operator"):
        profile_breakdown(tmp_path / "empty.json")


@pytest.mark.gpu
def test_real_cuda_trace_breakdown(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(2048, 2048, device="cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(3):
            b = a @ a
            b.cpu()
        torch.cuda.synchronize()
    p.export_chrome_trace(str(tmp_path / "rank0.json"))
    row = profile_breakdown(tmp_path / "rank0.json").iloc[0]
    assert row["device"] == "cuda" and row["rank"] == 0
    assert row["compute_ms"] > 0 and row["memcpy_ms"] > 0
