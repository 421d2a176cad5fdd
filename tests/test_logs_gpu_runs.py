"""Our engine's own logs from a real GPU (tests/fixtures/logs/gpu, README there): what a student
sees on a cluster, NCCL's INFO lines and a CUDA out-of-memory included, read as by hand."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from labkit.logs import found_nothing, parse_log

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from heldout_score import misses  # noqa: E402  (the one rule for "fully right")

GPU_LOGS = Path(__file__).parent / "fixtures" / "logs" / "gpu"


@pytest.mark.parametrize("name", sorted(p.name for p in GPU_LOGS.glob("*.txt")))
def test_gpu_run_log(name):
    want = json.loads((GPU_LOGS / name).with_suffix(".expected.json").read_text())
    parsed = parse_log(GPU_LOGS / name)
    assert not found_nothing(parsed)
    assert parsed.parse_errors == 0, parsed.first_parse_error
    assert misses(parsed.to_dict(), want) == []


def test_gpu_memory_lines_are_the_cuda_allocator_figures():
    """The memory rows carry the CUDA allocator's max allocated / max reserved, in MB as printed."""
    d = parse_log(GPU_LOGS / "labkit_h100_gpt2_124m_nccl_2026.txt").to_dict()
    last = d["memory"][-1]
    assert (last["iteration"], last["max_allocated_mb"], last["max_reserved_mb"]) == (30, 6915.7, 7576.0)
