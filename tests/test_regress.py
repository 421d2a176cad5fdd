"""labkit regress: real papermill on tiny notebooks, metrics vs a baseline, failures named."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from labkit import regress as rg
from labkit.verdict import compare, passed, render_table


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
        "from labkit._logging import log\nfrom labkit.paths import REPO_ROOT\n"
        "log.info('wrote %s', REPO_ROOT / 'runs' / 'demo' / 'log.txt')",
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
    assert "| 00_ok | demo.final_loss | 5 | 4 | x1.25 | within 15% | judged | REGRESSION |" in report
    assert (out / "notebooks" / "00_ok.ipynb").exists()
    assert all(n["load"] >= 1.0 for n in doc["notebooks"])
    # labkit's log lines in a notebook: plain stdout, no machine path (not a red stderr box)
    outputs = [o for c in nbformat.read(out / "notebooks" / "00_ok.ipynb", 4).cells
               if c.cell_type == "code" for o in c.get("outputs", [])]
    logged = [o for o in outputs if "[labkit]" in o.get("text", "")]
    assert [(o["name"], o["text"]) for o in logged] == [("stdout", "[labkit] wrote runs/demo/log.txt\n")]
    assert list((out / "figures").glob("00_ok_1.png"))
    # a second run never overwrites the first: it is moved aside
    doc2 = rg.regress(["00"], profile="cpu", baseline=baseline, out=out,
                      parameters={"loss": 4.1})
    assert doc2["ok"], doc2["rows"]
    assert list(tmp_path.glob("out.old-*"))


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




# --- the verdicts, on the committed baseline (a real make-lab run) ---------------------------
BASELINE = json.loads((Path(rg.REPO_ROOT) / "baselines" / "cpu.json").read_text())


def _rerun(changes: dict[str, dict[str, object]] | None = None, *, load: float = 1.0,
           failed: tuple[str, ...] = ()) -> list[rg.NotebookResult]:
    """Results that recorded the baseline's own values, with ``changes`` per notebook
    (a value of ``...`` drops the metric)."""
    out = []
    for nb, metrics in BASELINE["notebooks"].items():
        m = {k: spec["value"] for k, spec in metrics.items()}
        for k, v in (changes or {}).get(nb, {}).items():
            if v is ...:
                m.pop(k)
            else:
                m[k] = v
        out.append(rg.NotebookResult(nb, nb not in failed, 60.0, "", None, m, load))
    return out


def _row(rows, nb, metric):
    return next(r for r in rows if r.notebook.startswith(nb) and r.metric == metric)


def test_the_baseline_against_itself_passes():
    rows = compare(_rerun(), BASELINE, backend="local")
    assert passed(rows)
    assert {r.verdict for r in rows} == {"judged", "reported"}


def test_the_seen_failure_better_efficiency_is_reported_not_judged():
    # a run that once failed make lab: 0.9621 against a baseline of 0.3557 (local backend)
    rows = compare(_rerun({"02_multi_node_data_parallel": {"weak_scaling_efficiency": 0.9621}}),
                   BASELINE, backend="local")
    r = _row(rows, "02", "weak_scaling_efficiency")
    assert (r.verdict, r.status) == ("reported", "-") and passed(rows)
    # a much worse ratio is reported too: noise on one machine's shared cores
    rows = compare(_rerun({"02_multi_node_data_parallel": {
        "weak_scaling_efficiency": 0.01}, "04_monitoring_and_profiling": {
        "profiled.communication_share": 0.99}}), BASELINE, backend="local")
    assert passed(rows)
    assert _row(rows, "04", "profiled.communication_share").verdict == "reported"
    base = _row(rows, "02", "weak_scaling_efficiency").baseline
    assert (f"| 02_multi_node_data_parallel | weak_scaling_efficiency | 0.01 | {base:.4g} | "
            f"x{0.01 / base:.2f} |") in render_table(rows)


def test_faster_never_fails_and_three_times_slower_does():
    fast = _rerun({"01_single_node": {"dp_1node.iteration_time_ms": 1.0,
                                      "dp_1node.tokens_per_sec": 1e9},
                   "03_communication": {"busbw_intra_gbps": 100.0}})
    assert passed(compare(fast, BASELINE))
    base_ms = BASELINE["notebooks"]["01_single_node"]["dp_1node.iteration_time_ms"]["value"]
    slow = _rerun({"01_single_node": {"dp_1node.iteration_time_ms": 3.2 * base_ms}})
    r = _row(compare(slow, BASELINE), "01", "dp_1node.iteration_time_ms")
    assert (r.verdict, r.status) == ("judged", "REGRESSION")
    base_tps = BASELINE["notebooks"]["01_single_node"]["dp_1node.tokens_per_sec"]["value"]
    slow = _rerun({"01_single_node": {"dp_1node.tokens_per_sec": base_tps / 3.2}})
    assert _row(compare(slow, BASELINE), "01", "dp_1node.tokens_per_sec").status == "REGRESSION"


def test_machine_load_measured_in_the_run_widens_the_timing_limit():
    base_ms = BASELINE["notebooks"]["01_single_node"]["dp_1node.iteration_time_ms"]["value"]
    slow = {"01_single_node": {"dp_1node.iteration_time_ms": 4 * base_ms}}
    assert not passed(compare(_rerun(slow, load=1.0), BASELINE))
    rows = compare(_rerun(slow, load=2.0), BASELINE)  # two other busy processes on 2 cores
    assert passed(rows)
    assert "x load 2.00" in _row(rows, "01", "dp_1node.iteration_time_ms").rule
    # 7 x slower is not explained by a load of 2
    slow7 = {"01_single_node": {"dp_1node.iteration_time_ms": 7 * base_ms}}
    assert not passed(compare(_rerun(slow7, load=2.0), BASELINE))
    # the load of the baseline run counts against it: loaded then, loaded now, no extra room
    loaded = {**BASELINE, "loads": {"01_single_node": 2.0}}
    assert not passed(compare(_rerun(slow, load=2.0), loaded))


def test_the_spread_of_baseline_runs_sets_the_limit():
    nb = "01_single_node"
    spread = json.loads(json.dumps(BASELINE))
    spread["notebooks"][nb]["dp_1node.iteration_time_ms"] = {"value": 150.0,
                                                             "runs": [120.0, 150.0, 400.0]}
    run = _rerun({nb: {"dp_1node.iteration_time_ms": 600.0}})  # 4 x the median
    assert not passed(compare(run, BASELINE))  # no spread recorded: 3 x
    rows = compare(run, spread)  # 1.5 x (400 / 150) = 4 x
    assert passed(rows) and "spread of 3 runs" in _row(rows, "01", "dp_1node.iteration_time_ms").rule
    assert not passed(compare(_rerun({nb: {"dp_1node.iteration_time_ms": 700.0}}), spread))


def test_deterministic_outcomes_are_judged_strictly():
    cases = {
        "00_setup_and_cluster": {"exercise.world_size": False},
        "05_batch_size_and_oom": {"oom_predicted": False},
        "08_launchers_and_failures": {"broken.diagnosis": "cancelled"},
    }
    for nb, change in cases.items():
        rows = compare(_rerun({nb: change}), BASELINE)
        metric = next(iter(change))
        assert _row(rows, nb[:2], metric).status == "REGRESSION", (nb, metric)
    rows = compare(_rerun({"05_batch_size_and_oom": {"oom_detected": "python_exception"}}), BASELINE)
    assert not passed(rows)
    rows = compare(_rerun({"08_launchers_and_failures": {"resume.resumed_iterations": 39}}), BASELINE)
    assert _row(rows, "08", "resume.resumed_iterations").status == "REGRESSION"
    rows = compare(_rerun({"01_single_node": {"dp_1node.final_loss": 9.5}}), BASELINE)
    assert _row(rows, "01", "dp_1node.final_loss").status == "REGRESSION"
    rows = compare(_rerun({"06_hybrid_tp_pp": {"tp1_pp2.bubble_fraction": 0.5}}), BASELINE)
    assert _row(rows, "06", "tp1_pp2.bubble_fraction").status == "REGRESSION"


def test_missing_metric_failed_notebook_and_new_exercise_fail():
    rows = compare(_rerun({"01_single_node": {"dp_1node.final_loss": ...}}), BASELINE)
    assert _row(rows, "01", "dp_1node.final_loss").status == "MISSING" and not passed(rows)
    rows = compare(_rerun(failed=("03_communication",)), BASELINE)
    assert _row(rows, "03", "(notebook)").status == "FAILED" and not passed(rows)
    rows = compare(_rerun({"04_monitoring_and_profiling": {"exercise.trace": False}}), BASELINE)
    assert _row(rows, "04", "exercise.trace").status == "FAILED"
    rows = compare(_rerun({"04_monitoring_and_profiling": {"exercise.trace": True,
                                                           "profiled.new_ms": 5.0}}), BASELINE)
    assert passed(rows) and _row(rows, "04", "profiled.new_ms").status == "new"
    # a metric the baseline run could not measure (recorded as null) is shown, not judged
    nulled = json.loads(json.dumps(BASELINE))
    nulled["notebooks"]["01_single_node"]["dp_1node.peak_memory_mb"] = {"value": None}
    rows = compare(_rerun(), nulled)
    assert passed(rows) and _row(rows, "01", "dp_1node.peak_memory_mb").verdict == "reported"


def test_ratios_are_judged_only_on_the_cluster_the_baseline_says():
    cluster_base = {**BASELINE, "backend": "slurm", "cluster": "mysite", "judge_ratios": True}
    worse = _rerun({"02_multi_node_data_parallel": {"weak_scaling_efficiency": 0.1}})
    rows = compare(worse, cluster_base, backend="slurm", cluster="code/clusters/mysite.yaml")
    r = _row(rows, "02", "weak_scaling_efficiency")
    assert (r.verdict, r.status) == ("judged", "REGRESSION")
    better = _rerun({"02_multi_node_data_parallel": {"weak_scaling_efficiency": 0.99}})
    assert passed(compare(better, cluster_base, backend="slurm", cluster="mysite"))
    for backend, cluster in (("local", None), ("slurm", "othersite")):
        rows = compare(worse, cluster_base, backend=backend, cluster=cluster)
        assert _row(rows, "02", "weak_scaling_efficiency").verdict == "reported" and passed(rows)
    # judge_ratios on a local baseline is not honoured: both "nodes" share one machine
    local_base = {**BASELINE, "judge_ratios": True}
    assert passed(compare(worse, local_base, backend="local"))


def test_write_baseline_keeps_the_old_one_and_records_the_spread(tmp_path):
    def metrics(i, t):
        doc = {"profile": "cpu", "backend": "local", "cluster": None, "notebooks": [
            {"notebook": "01_x", "ok": True, "seconds": 1.0, "output": "", "error": None,
             "metrics": {"a.final_loss": 7.6, "a.iteration_time_ms": t, "a.diagnosis": "oom"},
             "load": 1.0 + i},
            {"notebook": "02_y", "ok": False, "seconds": 1.0, "output": "", "error": "boom",
             "metrics": {}}]}
        (tmp_path / f"m{i}.json").write_text(json.dumps(doc))
        return tmp_path / f"m{i}.json"

    out = tmp_path / "cpu.json"
    out.write_text("{}")
    rg.write_baseline(metrics(0, 100.0), out)
    assert json.loads(out.read_text())["notebooks"] == {"01_x": {
        "a.diagnosis": {"value": "oom"}, "a.final_loss": {"value": 7.6},
        "a.iteration_time_ms": {"value": 100.0}}}
    assert list(tmp_path.glob("cpu.old-*.json"))
    doc = json.loads(rg.write_baseline([metrics(i, t) for i, t in enumerate((100, 140, 120))],
                                       tmp_path / "b.json").read_text())
    assert doc["notebooks"]["01_x"]["a.iteration_time_ms"] == {"value": 120, "runs": [100, 140, 120]}
    assert doc["loads"] == {"01_x": 3.0} and doc["backend"] == "local" and not doc["judge_ratios"]


def test_machine_load_is_a_factor_of_at_least_one():
    assert rg.machine_load(loops=10_000) >= 1.0


def test_regress_refuses_at_once_what_cannot_run_here(monkeypatch, tmp_path):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(rg.shutil, "which", lambda name: None)
    with pytest.raises(rg.RegressError, match="no sbatch on PATH"):
        rg.regress(profile="gpu", backend="slurm", out=tmp_path / "o")
    with pytest.raises(rg.RegressError, match="torch sees none"):
        rg.regress(profile="gpu", backend="local", out=tmp_path / "o")
    assert not (tmp_path / "o").exists()  # nothing started, nothing written
