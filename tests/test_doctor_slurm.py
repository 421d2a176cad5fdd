"""labkit doctor on the real Slurm mini-cluster, with site profiles written as an instructor
writes them: the probe job runs the way jobs run (sbatch_extra, env), a probe that cannot be
scheduled is given up on with Slurm's queue reason and cancelled, a missing or unreadable
dataset fails naming each node, and `labkit doctor --class` (docs/INSTRUCTORS.md)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from labkit import doctor
from labkit.doctor.checks import CHECKS

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def env(monkeypatch, run_root):
    for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "MASTER_ADDR", "MASTER_PORT",
              "LABKIT_CLUSTER"):
        monkeypatch.delenv(k, raising=False)
    return run_root


def _site(path: Path, slurm_cluster, **extra) -> Path:
    """A site YAML as an instructor writes it for the mini-cluster (not its built-in profile)."""
    lines = [f"name: {path.stem}", "partition: lab", "gpu_request: none",
             "master_addr_from: nodeaddr", f"torchrun: {slurm_cluster.torchrun}",
             f"slurm_conf: {slurm_cluster.slurm_conf}"]
    lines += [f"{k}: {json.dumps(v)}" for k, v in extra.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


# Probes that must run get a long --timeout: the mini-cluster may be busy with other jobs.
QUEUE_S = "400"


def _doctor(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labkit", "doctor", *args], capture_output=True,
                          text=True, timeout=timeout)


def _row(table: str, name: str) -> str:
    """One check's row of the text table, its wrapped lines joined."""
    lines = table.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln[8:].startswith(name))
    j = next((j for j in range(i + 1, len(lines)) if lines[j][:1].strip()), len(lines))
    return " ".join(ln.strip() for ln in lines[i:j])


def _checks(p: subprocess.CompletedProcess) -> dict[str, dict]:
    return {c["name"]: c for c in json.loads(p.stdout)["checks"]}


def test_probe_runs_with_the_sites_sbatch_extra_and_env(slurm_cluster, env, tmp_path):
    """sbatch_extra pins the one-node probe to node2 (so the job is not node1's by chance) and
    the site's env reaches the node's probe process."""
    site = _site(tmp_path / "site.yaml", slurm_cluster, run_root=str(tmp_path / "runs"),
                 sbatch_extra=["--nodelist=node2"],
                 env={"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"})
    p = _doctor("--cluster", str(site), "--nodes", "1", "--timeout", QUEUE_S, "--json")
    by = _checks(p)
    failed = [c for c in by.values() if c["status"] == "FAIL"]
    assert p.returncode == 0 and not failed, failed
    job = by["probe job (as the site's jobs run)"]
    assert job["status"] == "PASS" and "(node2)" in job["detail"], job
    assert "--nodelist=node2" in job["detail"] and "GLOO_SOCKET_IFNAME" in job["detail"]
    data = by["dataset and tokenizer on every node"]
    assert data["status"] == "PASS" and "on node2;" in data["detail"] and "node1" not in data["detail"]
    iface = by["network interface (NCCL/gloo)"]
    assert "GLOO_SOCKET_IFNAME=eth0" in iface["detail"]  # read from the node's own environment
    assert not (tmp_path / "runs" / ".doctor").exists()


@pytest.fixture
def down_partition(slurm_cluster):
    """A second partition over the same nodes, set DOWN (the shared `lab` is left alone);
    deleted in teardown."""
    name = f"dd{uuid.uuid4().hex[:6]}"
    run = {"env": {**os.environ, "SLURM_CONF": slurm_cluster.slurm_conf},
           "capture_output": True, "text": True, "timeout": 30}
    p = subprocess.run(["scontrol", "create", f"PartitionName={name}", "Nodes=node[1-2]",
                        "State=DOWN"], **run)
    assert p.returncode == 0, p.stderr
    try:
        yield name
    finally:
        subprocess.run(["scontrol", "delete", f"PartitionName={name}"], **run)


def test_unschedulable_probe_is_given_up_with_the_queue_reason(slurm_cluster, env, tmp_path,
                                                               down_partition):
    site = _site(tmp_path / "site.yaml", slurm_cluster, run_root=str(tmp_path / "runs"),
                 env={"GLOO_SOCKET_IFNAME": "eth0"})
    site.write_text(site.read_text().replace("partition: lab", f"partition: {down_partition}"))
    p = _doctor("--cluster", str(site), "--timeout", "15", "--json")
    assert p.returncode == 1
    job = _checks(p)["probe job (as the site's jobs run)"]
    assert job["status"] == "FAIL", job
    assert "still PENDING after 15s" in job["detail"], job
    assert "queue reason: PartitionDown" in job["detail"] and "cancelled it" in job["detail"]
    assert f"PartitionName={down_partition} State=UP" in job["fix"]
    for name in ("run root shared and writable", "dataset and tokenizer on every node",
                 "all-reduce across nodes"):
        assert "PartitionDown" in _checks(p)[name]["detail"]
    job_id = re.search(r"probe job (\d+)", job["detail"]).group(1)
    q = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                       env={**os.environ, "SLURM_CONF": slurm_cluster.slurm_conf})
    assert q.stdout.strip() in ("", "CANCELLED"), q.stdout  # not left in the queue
    # Bounded without a wall-clock limit (which a loaded machine could break): the job was waited
    # for 15 s ("still PENDING after 15s" above), and the checks that need a job did not wait for
    # one of their own (each says PartitionDown).


def test_more_nodes_than_the_partition_has_waits_with_its_reason(slurm_cluster, env, tmp_path):
    """Slurm queues a 3-node job on the 2-node partition (it never refuses it): the doctor
    gives up after --timeout, says PartitionNodeLimit and what to lower, and cancels it."""
    site = _site(tmp_path / "site.yaml", slurm_cluster, run_root=str(tmp_path / "runs"))
    r = doctor.run_doctor(site, nodes=3, timeout_s=10,
                          checks=[c for c in CHECKS if c[0] == "probe_job"])[0]
    assert r.status == "FAIL" and "(3 node(s)) still PENDING after 10s" in r.detail, r
    assert "queue reason: PartitionNodeLimit" in r.detail and "cancelled it" in r.detail
    assert "lower --nodes" in r.fix and "TotalNodes" in r.fix


def test_missing_or_unreadable_data_fails_naming_each_node(slurm_cluster, env, tmp_path):
    """The site's own checkout (code_dir) beside a data/ folder with no .bin and a vocab.json
    that cannot be read: what pretrain_gpt.py in that code_dir would read."""
    code = tmp_path / "shared" / "code"
    code.mkdir(parents=True)
    shutil.copy(REPO / "code" / "doctor_probe.py", code)
    data = tmp_path / "shared" / "data"
    (data / "tokenizer" / "vocab.json").mkdir(parents=True)  # a folder: not a readable file
    shutil.copy(REPO / "data" / "tokenizer" / "merges.txt", data / "tokenizer")
    shutil.copy(REPO / "data" / "corpus_text_document.idx", data)
    site = _site(tmp_path / "site.yaml", slurm_cluster, code_dir=str(code),
                 run_root=str(tmp_path / "runs"), env={"GLOO_SOCKET_IFNAME": "eth0"})
    by = {r.name: r for r in doctor.run_doctor(site, timeout_s=int(QUEUE_S), checks=[
        c for c in CHECKS if c[0] in ("probe_job", "data")])}
    assert by["probe job (as the site's jobs run)"].status == "PASS"
    r = by["dataset and tokenizer on every node"]
    assert r.status == "FAIL", r
    for node in ("node1", "node2"):
        assert f"{node}: dataset .bin {data}/corpus_text_document.bin missing" in r.detail
        assert f"{node}: tokenizer vocab.json {data}/tokenizer/vocab.json not readable" in r.detail
    assert "idx" not in r.detail.replace("/.idx", "")  # the .idx that is there is not blamed
    assert "make data" in r.fix and str(data) in r.fix


def test_doctor_class_on_the_minicluster(slurm_cluster, env, tmp_path):
    """`labkit doctor --cluster SITE --class --students 3`, as docs/INSTRUCTORS.md says: the
    shared root (1777) per user, and 3 students' 2-node jobs on the 2 x 2-CPU partition (one
    at a time: a WARN that says so); one student's job fits (PASS)."""
    shared = tmp_path / "class"
    shared.mkdir()
    shared.chmod(0o1777)
    site = _site(tmp_path / "site.yaml", slurm_cluster, run_root=f"{shared}/{{user}}/runs",
                 env={"GLOO_SOCKET_IFNAME": "eth0"})
    p = _doctor("--cluster", str(site), "--class", "--students", "3", "--timeout", QUEUE_S)
    assert p.returncode == 0, p.stdout + p.stderr
    root = _row(p.stdout, "class: run root per user")
    assert root.startswith("PASS") and "and sticky" in root and "created and removed" in root, root
    fit = _row(p.stdout, "class: jobs at once in the partition")
    assert fit.startswith("WARN"), fit
    assert "only 1 of 3 students' jobs (2 node(s) x 2 CPU(s) each) run at once in partition " \
           "lab" in fit and "reservation" in fit
    assert list(shared.iterdir()) == []  # the doctor's probe folder is gone
    one = doctor.run_doctor(site, checks=[c for c in CHECKS if c[0] == "python"], for_class=True,
                            students=1)
    fit = {r.name: r for r in one}["class: jobs at once in the partition"]
    assert fit.status == "PASS" and "1 students x 2 node(s) x 2 CPU(s) fit partition lab" in fit.detail
