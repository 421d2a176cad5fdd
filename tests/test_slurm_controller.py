"""The Slurm controller probe against real slurm.conf files: the mini-cluster's own (a controller
that answers) and a copy of it naming a port nothing listens on (a dead controller, without
stopping the cluster others use). ``labkit status`` then answers from the runs' records at once,
naming the controller, without asking squeue (which would wait about 9 s).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from labkit import slurmcli
from labkit.backends.job import Job


@pytest.fixture
def dead_port():
    """A loopback port that is bound (nothing else can take it) but never listens."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


def _conf_copy(src: Path, dst: Path, port: int) -> Path:
    """``src`` with its controller moved to 127.0.0.1:``port`` (every other line as it was)."""
    lines = [ln for ln in src.read_text().splitlines()
             if not ln.lower().startswith(("slurmctldhost", "slurmctldport", "controlmachine",
                                           "controladdr"))]
    dst.write_text("\n".join([*lines, "SlurmctldHost=deadhead(127.0.0.1)",
                              f"SlurmctldPort={port}"]) + "\n")
    return dst


@pytest.mark.slurm
def test_probe_of_the_real_controller(slurm_cluster, tmp_path, dead_port):
    conf = Path(slurm_cluster.slurm_conf)
    assert slurmcli.controllers(str(conf))  # the mini-cluster's file names its controller
    assert slurmcli.controller_down(str(conf)) is None  # and slurmctld accepts connections
    bad = _conf_copy(conf, tmp_path / "slurm.conf", dead_port)
    assert slurmcli.controller_down(str(bad)) == f"127.0.0.1:{dead_port}"


def test_status_names_a_dead_controller_and_answers_from_the_records(tmp_path, dead_port):
    # The documented slurm.conf format (slurm.conf(5)): SlurmctldHost=name(address), SlurmctldPort.
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=gone\nSlurmctldHost=deadhead(127.0.0.1)\n"
                    f"SlurmctldPort={dead_port}\nAuthType=auth/munge\n")
    root = tmp_path / "runs"
    for job_id, name, code in (("77", "finished", "0\n"), ("78", "unknown", None)):
        d = root / name
        d.mkdir(parents=True)
        Job(job_id=job_id, name=name, run_dir=d, backend="slurm",
            info={"slurm_conf": str(conf), "cluster": "gone"}).save()
        if code:
            (d / "exit_code").write_text(code)
    env = {**os.environ, "LABKIT_RUN_ROOT": str(root), "SLURM_CONF": str(conf)}
    p = subprocess.run([sys.executable, "-m", "labkit", "status", "--json"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    rows = sorted((r["name"], r["state"]) for r in json.loads(p.stdout))
    assert rows == [("finished", "COMPLETED"), ("unknown", "UNKNOWN")]
    lines = [ln for ln in p.stderr.splitlines() if "not answering" in ln]
    assert len(lines) == 1, p.stderr  # one line, not squeue's munge/connect errors
    assert f"the Slurm controller at 127.0.0.1:{dead_port} is not answering" in lines[0]
    assert "labkit cluster up" in lines[0] and "slurm_load_jobs" not in p.stderr
