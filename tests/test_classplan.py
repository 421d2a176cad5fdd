"""``labkit class plan``: node-hours, peak nodes and disk for N students from a rehearsal's runs
(their own config.json, job.json and exit_code), on run directories laid out as labkit writes
them, with known sizes and times."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

from labkit.classplan import class_plan
from labkit.config import RunConfig
from labkit.errors import LabkitError
from labkit.site import ClusterProfile


def _run(root, name: str, nodes: int, wall_s: float | None, ckpt_bytes: int, log_bytes: int):
    d = root / name
    (d / "checkpoints").mkdir(parents=True)
    RunConfig.for_profile("cpu", name=name, nodes=nodes).to_json(d / "config.json")
    (d / "job.json").write_text(json.dumps({"job_id": "1", "name": name, "run_dir": str(d),
                                            "backend": "slurm", "submitted_at": 1_000_000.0}))
    (d / "checkpoints" / "model.pt").write_bytes(b"\0" * ckpt_bytes)
    (d / "log.txt").write_bytes(b"x" * log_bytes)
    if wall_s is not None:
        (d / "exit_code").write_text("0\n")
        os.utime(d / "exit_code", (1_000_000.0 + wall_s, 1_000_000.0 + wall_s))
    return d


@pytest.fixture
def rehearsal(tmp_path):
    root = tmp_path / "runs"
    _run(root, "nb01_dp", nodes=1, wall_s=360, ckpt_bytes=1000, log_bytes=10)
    _run(root, "nb02_dp_2nodes", nodes=2, wall_s=720, ckpt_bytes=3000, log_bytes=20)
    _run(root, "nb02_extra", nodes=2, wall_s=None, ckpt_bytes=0, log_bytes=5)
    (root / "scratch").mkdir()  # not a notebook's run: left out
    return root


def test_plan_for_thirty(rehearsal):
    site = ClusterProfile(name="workshop", partition="gpu", exclusive=True)
    plan = class_plan(30, site, rehearsal)
    nb = {r["notebook"]: r for r in plan["notebooks"]}
    assert sorted(nb) == ["01", "02"]
    assert nb["01"]["node_hours"] == pytest.approx(0.1)        # 1 node x 360 s
    assert nb["02"]["node_hours"] == pytest.approx(0.4)        # 2 nodes x 720 s; one not ended
    assert nb["02"]["unfinished"] == ["nb02_extra"] and nb["02"]["runs"] == 2
    assert plan["node_hours_per_student"] == pytest.approx(0.5)
    assert plan["node_hours_class"] == pytest.approx(15.0)
    assert (plan["peak_nodes"], plan["peak_notebook"]) == (60, "02")
    assert nb["01"]["checkpoint_bytes"] == 1000 and nb["02"]["checkpoint_bytes"] == 3000
    config_bytes = sum((d / f).stat().st_size for d in rehearsal.iterdir() if d.name != "scratch"
                       for f in ("config.json", "job.json"))
    disk = 1000 + 3000 + 10 + 20 + 5 + config_bytes + 2 * len("0\n")
    assert plan["disk_bytes_per_student"] == disk and plan["disk_bytes_class"] == 30 * disk
    assert plan["exclusive"] and plan["site"] == "workshop"


def test_bad_input_is_named(rehearsal, tmp_path):
    with pytest.raises(LabkitError, match="students=0"):
        class_plan(0, None, rehearsal)
    with pytest.raises(LabkitError, match="no notebook runs .*labkit regress"):
        class_plan(3, None, tmp_path / "empty")


def test_the_cli(rehearsal):
    p = subprocess.run([sys.executable, "-m", "labkit", "class", "plan", "--students", "30",
                        "--runs", str(rehearsal)], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0, p.stderr
    assert "peak: 60 nodes at once if all 30 run notebook 02 together" in p.stdout, p.stdout
    assert "not ended: nb02_extra" in p.stdout
    p = subprocess.run([sys.executable, "-m", "labkit", "class", "plan", "--students", "30",
                        "--runs", str(rehearsal), "--json"], capture_output=True, text=True,
                       cwd=REPO)
    assert json.loads(p.stdout)["node_hours_class"] == pytest.approx(15.0)
