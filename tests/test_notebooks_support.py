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
    from labkit.backends import Job

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
