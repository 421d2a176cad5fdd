"""The time estimate calibrated from stored measurements: what is stored, what is read back,
what `labkit plan` says, and that an estimate without measurements says it is uncalibrated."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from labkit.config import RunConfig
from labkit.errors import LabkitError
from labkit.planner import estimate_iteration_time, plan_layouts
from labkit.planner.calibration import (
    CALIBRATION_FILE,
    calibrated_hardware,
    describe,
    link_figures,
    load_calibration,
    save_compute_calibration,
    save_link_calibration,
)


def _cpu(**kw) -> RunConfig:
    return RunConfig.for_profile("cpu", name="cal", **kw)


def _bench_rows(scope: str, n: int, latency_s: float, gbps: float) -> list[dict]:
    """Rows shaped like labkit.measured.comm.read_busbw's, for a link of this latency and bandwidth."""
    rows = []
    for size in (4096, 65536, 1 << 20, 4 << 20):
        moved = size * 2 * (n - 1) / n
        t = latency_s + moved / (gbps * 1e9)
        rows.append({"op": "all_reduce", "scope": scope, "group_size": n, "size_bytes": size,
                     "time_us": t * 1e6, "busbw_gbps": moved / t / 1e9})
    return rows


def test_link_figures_recover_latency_and_bandwidth():
    rows = _bench_rows("intra", 2, 0.002, 1.0) + _bench_rows("inter", 2, 0.004, 0.1)
    f = link_figures(rows)
    # the best bus bandwidth is reached at the largest message, just under the link's own
    assert f["intra"]["gbps"] == pytest.approx(1.0, rel=0.25)
    assert f["inter"]["gbps"] == pytest.approx(0.1, rel=0.25)
    assert f["intra"]["latency_s"] == pytest.approx(0.002, rel=0.3)
    assert f["inter"]["latency_s"] == pytest.approx(0.004, rel=0.3)


def test_without_measurements_the_estimate_says_uncalibrated(run_root):
    cfg = _cpu(nodes=2, gpus_per_node=2)
    hw = calibrated_hardware(cfg)
    assert not hw.calibrated and "UNCALIBRATED" in describe(hw)
    est = estimate_iteration_time(cfg, hw)
    assert est["calibrated"] is False and est["note"].startswith("UNCALIBRATED")


def test_measurements_are_stored_with_their_runs_and_read_back(run_root):
    one = _cpu(nodes=1, gpus_per_node=2)
    save_compute_calibration(run_root / "nb01_dp", one, 150.0)
    save_link_calibration(run_root / "nb03_busbw",
                          _bench_rows("intra", 2, 0.003, 0.8) + _bench_rows("inter", 2, 0.003, 0.1),
                          device="cpu", backend="local")
    stored = json.loads((run_root / "nb01_dp" / CALIBRATION_FILE).read_text())
    assert stored["compute"]["iteration_s"] == 0.15 and stored["compute"]["config"]["nodes"] == 1
    found = load_calibration("cpu", precision="fp32")
    assert set(found) == {"compute", "links"} and load_calibration("cuda") == {}
    hw = calibrated_hardware(_cpu(nodes=2, gpus_per_node=2))
    assert hw.calibrated and hw.calibrated_from == ("compute: nb01_dp", "links: nb03_busbw")
    assert hw.inter_node_latency_s == pytest.approx(0.003, rel=0.3)
    # the measured run's own time comes back: estimating it gives what was measured
    assert estimate_iteration_time(one, hw)["iteration_s"] == pytest.approx(0.15, rel=0.01)
    with pytest.raises(LabkitError, match="positive time in ms"):
        save_compute_calibration(run_root / "x", one, 0.0)


def test_ranks_sharing_cores_compute_slower(run_root):
    one = _cpu(nodes=1, gpus_per_node=2)
    save_compute_calibration(run_root / "nb01_dp", one, 150.0)
    hw = calibrated_hardware(one)
    cores = hw.cores_per_host
    assert cores and hw.measured_ranks_per_host == 2
    local4 = _cpu(nodes=2, gpus_per_node=2, backend="local")
    slurm4 = local4.replace(backend="slurm")
    t_local = estimate_iteration_time(local4, hw)["compute_s"]
    t_slurm = estimate_iteration_time(slurm4, hw)["compute_s"]
    # the local backend puts 4 ranks on this machine, Slurm 2 per node
    expected = min(1.0, cores / 2) / min(1.0, cores / 4)
    assert t_local == pytest.approx(t_slurm * expected)


def test_plan_says_what_its_estimate_rests_on(run_root, capsys):
    from labkit.cli import main

    assert main(["plan", "--nodes", "2", "--gpus-per-node", "2"]) == 0
    assert "time estimate UNCALIBRATED" in capsys.readouterr().out.splitlines()[0]
    save_compute_calibration(run_root / "nb01_dp", _cpu(nodes=1, gpus_per_node=2), 150.0)
    assert main(["plan", "--nodes", "2", "--gpus-per-node", "2"]) == 0
    assert "time estimate calibrated from compute: nb01_dp" in capsys.readouterr().out


def test_plan_layouts_takes_the_calibrated_figures(run_root):
    save_link_calibration(run_root / "b", _bench_rows("intra", 2, 0.05, 0.8)
                          + _bench_rows("inter", 2, 0.05, 0.1), device="cpu", backend="local")
    base = _cpu(nodes=2, gpus_per_node=2)
    slow_links = calibrated_hardware(base)
    layouts = plan_layouts(nodes=2, gpus_per_node=2, model=base, micro_batch_size=2,
                           hardware=slow_links, interleaved=False)
    fitting = [lp for lp in layouts if lp.fits]
    # 50 ms per collective: the layout with no TP and no PP (one all-reduce) is fastest
    assert (fitting[0].tp, fitting[0].pp) == (1, 1)


RECORDED = Path(__file__).parent / "fixtures" / "calibration" / "cpu_local_2core"


def _recorded_root(tmp_path) -> Path:
    """The run root as the series left it: each calibration.json in its run's folder."""
    for run in ("nb01_dp", "nb03_busbw"):
        (tmp_path / run).mkdir()
        shutil.copy(RECORDED / run / CALIBRATION_FILE, tmp_path / run / CALIBRATION_FILE)
    return tmp_path


def test_the_stored_compute_time_is_the_runs_own_median():
    from labkit.lab import steady_median
    from labkit.logs import parse_log

    stored = json.loads((RECORDED / "nb01_dp" / CALIBRATION_FILE).read_text())["compute"]
    measured = steady_median(parse_log(RECORDED / "nb01_dp" / "log.txt").iterations)
    assert stored["iteration_s"] * 1e3 == pytest.approx(measured)
    assert stored["config"] == RunConfig.from_json(RECORDED / "nb01_dp" / "config.json").to_dict()


def test_on_recorded_measurements_the_planner_orders_layouts_as_they_measured(tmp_path):
    from labkit.lab import steady_median
    from labkit.logs import parse_log

    root = _recorded_root(tmp_path)
    runs = sorted(RECORDED.glob("nb06_*"))
    configs = {d.name: RunConfig.from_json(d / "config.json") for d in runs}
    measured = {d.name: steady_median(parse_log(d / "log.txt").iterations) for d in runs}
    hw = calibrated_hardware(next(iter(configs.values())), root=root)
    assert hw.calibrated_from == ("compute: nb01_dp", "links: nb03_busbw")
    estimated = {n: estimate_iteration_time(c, hw)["iteration_s"] for n, c in configs.items()}
    by_measured = sorted(measured, key=measured.get)
    assert by_measured == sorted(estimated, key=estimated.get), (measured, estimated)
    # the sweep `labkit plan` and notebook 06 print ranks them the same way
    base = configs["nb06_tp2_pp2"]
    layouts = plan_layouts(nodes=base.nodes, gpus_per_node=base.gpus_per_node, model=base,
                           micro_batch_size=base.micro_batch_size, hardware=hw, interleaved=False)
    swept = [f"nb06_tp{lp.tp}_pp{lp.pp}" for lp in layouts if f"nb06_tp{lp.tp}_pp{lp.pp}" in measured]
    assert swept == by_measured
