"""Throughput, TFLOP/s, MFU against the explicit peak table, scaling efficiency."""

from __future__ import annotations

import pandas as pd
import pytest

from labkit.config import RunConfig
from labkit.errors import LabkitError
from labkit.measured import metrics


@pytest.mark.parametrize("device,precision,peak", [
    ("H100", "bf16", 989.4), ("NVIDIA H100 80GB HBM3", "bf16", 989.4), ("NVIDIA H100 PCIe", "bf16", 756.5),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312.0), ("A100", "fp32", 19.5), ("Tesla V100-SXM2-32GB", "fp16", 125.0),
    ("NVIDIA H200", "fp8", 1978.9), ("B200", "bf16", 2250.0), ("NVIDIA RTX A6000", "bf16", 154.8),
    ("NVIDIA L40S", "bf16", 362.05), ("NVIDIA A10", "bf16", 125.0),
])
def test_peak_table(device, precision, peak):
    assert metrics.peak_tflops(device, precision) == peak


def test_unknown_device_or_precision_asks_for_the_peak():
    with pytest.raises(LabkitError, match="peak_tflops="):
        metrics.peak_tflops("Intel Xeon", "fp32")
    with pytest.raises(LabkitError, match="no bf16 peak for V100"):
        metrics.peak_tflops("V100", "bf16")


def test_mfu_and_its_upper_bound():
    assert metrics.mfu(494.7, device="H100", precision="bf16") == pytest.approx(0.5)
    assert metrics.mfu(50.0, peak_tflops=100.0) == 0.5
    with pytest.raises(LabkitError, match=r"MFU 120% > 100%"):
        metrics.mfu(120.0, peak_tflops=100.0)


def test_throughput_from_planner_flops():
    cfg = RunConfig(global_batch_size=8, seq_length=128, gpus_per_node=2)
    df = pd.DataFrame({"iteration": [1, 2], "elapsed_ms": [1000.0, 500.0], "tflops_per_gpu": [0.0, 0.0]})
    out = metrics.add_throughput(df, cfg)
    assert out["samples_per_sec"].tolist() == [8.0, 16.0]
    assert out["tokens_per_sec"].tolist() == [1024.0, 2048.0]
    flops = metrics.model_flops_per_iteration(cfg)
    assert out["tflops_per_gpu"].tolist() == pytest.approx([flops / 2 / 1e12, flops / 0.5 / 2 / 1e12])
    assert metrics.tflops_per_gpu(500.0, flops, 2) == pytest.approx(out["tflops_per_gpu"][1])
    with_mfu = metrics.add_mfu(out, peak_tflops=1.0)
    assert with_mfu["mfu"].tolist() == pytest.approx(out["tflops_per_gpu"].tolist())


def test_scaling_efficiency():
    rows = []
    for n, tps in ((1, 1000.0), (2, 1900.0), (4, 3000.0)):
        for it in (1, 2, 3):  # iteration 1 is warm-up (slow) and skipped
            rows.append({"run_dir": f"r{n}", "world_size": n, "iteration": it,
                         "tokens_per_sec": tps / 10 if it == 1 else tps})
    eff = metrics.scaling_efficiency(pd.DataFrame(rows))
    assert eff["speedup"].tolist() == pytest.approx([1.0, 1.9, 3.0])
    assert eff["ideal"].tolist() == [1.0, 2.0, 4.0]
    assert eff["efficiency"].tolist() == pytest.approx([1.0, 0.95, 0.75])
    with pytest.raises(LabkitError, match="'nodes' column"):
        metrics.scaling_efficiency(pd.DataFrame(rows), by="nodes")
