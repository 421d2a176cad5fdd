"""labkit regress: real papermill on tiny notebooks, metrics vs a baseline, failures named."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from labkit import regress as rg


def _nb(path: Path, cells: list[str]) -> Path:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('profile = "cpu"  # cpu or gpu\nloss = 5.0  # fake knob')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params] + [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)
    return path


@pytest.fixture
def series(tmp_path):
    src = tmp_path / "solutions"
    src.mkdir()
    _nb(src / "00_ok.ipynb", [
        "from labkit.record import record\nfrom labkit.exercises import check_layout",
        "record('demo.final_loss', loss)\nrecord('demo.iteration_time_ms', 100.0)",
        "check_layout(2, 1, 2, world_size=4)",
        "import matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.show()",
    ])
    _nb(src / "01_broken.ipynb", ["x = 1", "raise RuntimeError('the job ended FAILED')"])
    return src


def test_run_compare_report(series, tmp_path, monkeypatch):
    monkeypatch.setattr(rg, "SOLUTIONS_DIR", series)
    baseline = tmp_path / "base.json"
    baseline.write_text(json.dumps({"notebooks": {"00_ok": {
        "demo.final_loss": {"value": 4.0},             # 5.0 is 25 % off: a regression
        "demo.iteration_time_ms": {"value": 90.0},     # within 3 x
        "exercise.layout": {"value": True}}}}))
    out = tmp_path / "out"
    monkeypatch.chdir(tmp_path)  # a relative --out (as `make lab` passes) must still collect
    doc = rg.regress(profile="cpu", baseline=baseline, out="out")
    assert not doc["ok"]
    by = {(r["notebook"], r["metric"]): r for r in doc["rows"]}
    assert by[("00_ok", "demo.final_loss")]["status"] == "REGRESSION"
    assert by[("00_ok", "demo.iteration_time_ms")]["status"] == "ok"
    assert by[("00_ok", "exercise.layout")]["status"] == "ok"
    assert by[("01_broken", "(notebook)")]["status"] == "FAILED"
    err = [n for n in doc["notebooks"] if n["notebook"] == "01_broken"][0]["error"]
    assert "01_broken.ipynb failed at cell 3 (In [4])" in err and "the job ended FAILED" in err
    report = (out / "report.md").read_text()
    assert "| 00_ok | demo.final_loss | 5 | 4 | within 15% | REGRESSION |" in report
    assert (out / "notebooks" / "00_ok.ipynb").exists()
    assert list((out / "figures").glob("00_ok_1.png"))
    # a second run never overwrites the first: it is moved aside
    doc2 = rg.regress(["00"], profile="cpu", baseline=baseline, out=out,
                      parameters={"loss": 4.1})
    assert doc2["ok"], doc2["rows"]
    assert list(tmp_path.glob("out.old-*"))


def test_tolerances_by_metric_name():
    assert rg.tolerance_for("dp.iteration_time_ms") == ("up", 3.0)
    assert rg.tolerance_for("dp.tokens_per_sec") == ("down", 3.0)
    assert rg.tolerance_for("x.final_loss", {"tol": 0.5}) == ("both", 0.5)
    assert rg.tolerance_for("exercise.hybrid")[0] == "equal"
    assert rg._judge(250.0, 100.0, "up", 3.0)[0] and not rg._judge(301.0, 100.0, "up", 3.0)[0]
    assert not rg._judge(30.0, 100.0, "down", 3.0)[0]


def test_record_without_regress_writes_the_run_dir(run_root, monkeypatch):
    from labkit import record as rec

    monkeypatch.delenv(rec.METRICS_ENV, raising=False)
    rec.record("a.final_loss", 3.5, run_name="nb01")
    assert json.loads((run_root / "nb01" / "metrics.json").read_text()) == {"a.final_loss": 3.5}
    assert rec.recorded()["a.final_loss"] == 3.5


def test_unknown_notebook_is_named():
    with pytest.raises(rg.RegressError, match="no notebook matches"):
        rg.list_notebooks(["99_nope"])


def test_cli_names_an_unknown_notebook(tmp_path, capsys):
    from labkit.cli import main

    assert main(["regress", "99_nope", "--out", str(tmp_path / "o")]) == 1
    assert "no notebook matches ['99_nope']" in capsys.readouterr().err


def test_write_baseline_keeps_the_old_one(tmp_path):
    doc = {"profile": "cpu", "notebooks": [
        {"notebook": "01_x", "ok": True, "seconds": 1.0, "output": "", "error": None,
         "metrics": {"a.final_loss": 7.6}},
        {"notebook": "02_y", "ok": False, "seconds": 1.0, "output": "", "error": "boom",
         "metrics": {}}]}
    m = tmp_path / "metrics.json"
    m.write_text(json.dumps(doc))
    out = tmp_path / "cpu.json"
    out.write_text("{}")
    rg.write_baseline(m, out)
    assert json.loads(out.read_text())["notebooks"] == {"01_x": {"a.final_loss": {"value": 7.6}}}
    assert list(tmp_path.glob("cpu.old-*.json"))


def test_time_shares_are_reported_not_judged():
    from labkit.regress import _judge, tolerance_for

    direction, _ = tolerance_for("profiled.communication_share")
    assert direction == "report"
    assert _judge(0.07, 0.45, direction, 0.0) == (True, "reported only")
    # a loss is still judged
    d, tol = tolerance_for("run.final_loss")
    assert _judge(9.0, 7.0, d, tol)[0] is False
