"""The notebooks' helpers: the live layout builder (headless), the figures script, report helpers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from labkit import widgets

REPO = Path(__file__).resolve().parents[1]


def test_layout_builder_logic_validates_and_plans():
    bad = widgets.evaluate_layout("cpu", nodes=2, gpus_per_node=2, tensor_model_parallel_size=3)
    assert not bad["valid"]
    assert any("TP x PP = 3 x 1 = 3 does not divide world size 4" in e for e in bad["errors"])
    assert "Invalid layout" in widgets.render_layout_html(bad)
    good = widgets.evaluate_layout("cpu", nodes=2, gpus_per_node=2, tensor_model_parallel_size=2,
                                   pipeline_model_parallel_size=2)
    assert good["valid"] and good["plan"]["layout"]["dp"] == 1
    html = widgets.render_layout_html(good)
    assert "first stage" in html and "last stage" in html and "fits" in html


def test_layout_builder_widget_builds_headless_and_updates():
    box = widgets.layout_builder("cpu", nodes=2, gpus_per_node=2)
    tp = box.children[0].children[0]
    panel = box.children[2]
    tp.value = 3
    assert "Invalid layout" in panel.value
    tp.value = 2
    assert "Invalid layout" not in panel.value and "TP=2" in panel.value


def test_job_snapshot_of_a_recorded_job(tmp_path):
    from labkit.jobs import Job

    d = tmp_path / "r"
    d.mkdir()
    (d / "log.txt").write_text("line 1\nline 2\n")
    (d / "exit_code").write_text("0\n")
    job = Job(job_id="local-1", name="r", run_dir=d, backend="local")
    text = widgets.job_snapshot(job, lines=1)
    assert text.startswith("r [") and text.endswith("line 2")


def test_figures_script_writes_the_images(tmp_path):
    code = ("import sys; sys.path.insert(0, 'images'); import make_figures as m; "
            f"print(len(m.main(__import__('pathlib').Path({str(tmp_path)!r}))))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    names = {p.name for p in tmp_path.glob("*.png")}
    assert {"topology_2x2.png", "layout_tp2_pp2.png"} <= names
    for n in names:  # every figure the script makes is committed
        assert (REPO / "images" / n).exists(), f"images/{n} is not committed; run make_figures.py"


def test_lab_helpers(run_root):
    import pandas as pd

    from labkit import lab

    v = lab.versions(("labkit", "no-such-package-xyz"))
    assert v.loc["no-such-package-xyz", "version"] == "missing"
    df = pd.DataFrame({"elapsed_ms": [900.0, 100.0, 110.0, 120.0]})
    assert lab.steady_median(df) == pytest.approx(110.0)


def test_layout_builder_memory_slider_flips_the_verdict():
    box = widgets.layout_builder("cpu", nodes=2, gpus_per_node=2)
    mem, panel = box.children[1].children[2], box.children[2]
    assert "does NOT fit" not in panel.value and "fits" in panel.value
    mem.value = 0.001
    assert "does NOT fit" in panel.value and "of 0.001 GB" in panel.value


def test_throughput_per_device_and_mfu_from_a_real_engine_log(tmp_path):
    """Tokens/s per device from a log of our engine (tests/fixtures/logs/labkit_engine_2026.txt,
    world size 4, global batch 8); MFU only for a GPU run with a known GPU model."""
    import math
    import re
    import shutil

    from labkit import lab
    from labkit.config import RunConfig
    from labkit.logs import load_runs
    from labkit.measured.metrics import model_flops_per_iteration, peak_tflops

    log = REPO / "tests" / "fixtures" / "logs" / "labkit_engine_2026.txt"
    cpu = RunConfig(name="cpu_run", nodes=2, gpus_per_node=2, tensor_model_parallel_size=2,
                    pipeline_model_parallel_size=2, micro_batch_size=2, global_batch_size=8)
    gpu = RunConfig.for_profile("gpu", name="gpu_run", nodes=2, gpus_per_node=2,
                                tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                                micro_batch_size=2, global_batch_size=8)
    for cfg in (cpu, gpu):
        (tmp_path / cfg.name).mkdir()
        shutil.copy(log, tmp_path / cfg.name / "log.txt")
        cfg.to_json(tmp_path / cfg.name / "config.json")
    df = load_runs([tmp_path / "cpu_run", tmp_path / "gpu_run"])
    # Expected values from the log's own numbers, read here without labkit's parser.
    elapsed = [float(m) for m in re.findall(r"elapsed time per iteration \(ms\): ([\d.]+)",
                                            log.read_text())]
    steady = sorted(elapsed[1:])
    mid = len(steady) // 2
    median_ms = steady[mid] if len(steady) % 2 else (steady[mid - 1] + steady[mid]) / 2

    t = lab.throughput(df, gpu_model="H100")
    row = t.loc["cpu_run"]
    assert row["world_size"] == 4 and row["device"] == "cpu"
    assert row["tokens_per_sec_per_device"] == pytest.approx(
        8 * cpu.seq_length / (median_ms / 1e3) / 4, rel=1e-6)
    assert math.isnan(row["mfu"])  # no CPU peak: MFU is a GPU figure
    g = t.loc["gpu_run"]
    expected_tflops = model_flops_per_iteration(gpu) / (median_ms / 1e3) / 4 / 1e12
    assert g["model_tflops_per_device"] == pytest.approx(expected_tflops, rel=1e-6)
    assert g["mfu"] == pytest.approx(expected_tflops / peak_tflops("H100", gpu.precision))
    assert math.isnan(lab.throughput(df[df["name"] == "gpu_run"], gpu_model=None)["mfu"].iloc[0]) \
        or lab._visible_gpu() is not None


def _sums(line: str) -> tuple[float, list[float]]:
    """``total = a + b + ...`` of one summary line: the total and its parts."""
    total, rest = line.split(" GB = ")
    return float(total.split()[-1]), [float(t.split()[-1]) for t in rest.split(" + ")]


@pytest.mark.parametrize("profile,limit", [("cpu", None), ("cpu", 1.0), ("gpu", None)])
def test_plan_summary_totals_equal_their_listed_parts_and_name_the_limit(profile, limit):
    from labkit.config import RunConfig
    from labkit.planner import plan

    cfg = RunConfig.for_profile(profile, name="x", nodes=1, gpus_per_node=2, micro_batch_size=16,
                                global_batch_size=32, memory_limit_gb=limit)
    p = plan(cfg)
    lines = p.summary().splitlines()
    for stage in (ln for ln in lines if ln.startswith(("first stage", "last stage"))):
        total, parts = _sums(stage.split("stage")[1])
        assert total == pytest.approx(sum(parts), abs=0.004), stage
    need = next(ln for ln in lines if ln.startswith("needs"))
    assert f"needs {p.required_gb:.3f} GB" in need and "margin" not in need
    if limit is not None:
        assert "memory limit (memory_limit_gb) 1 GB" in need
    elif profile == "cpu":
        assert "no memory limit" in need
    else:
        assert f"GPU memory {cfg.gpu_memory_gb:g} GB" in need
