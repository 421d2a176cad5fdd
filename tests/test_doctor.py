"""labkit doctor: the table and JSON contract, real local probes, real failures, the mini-cluster.

Error paths are made for real: an interface that does not exist, a MASTER_ADDR that does not
resolve, a run root that cannot be created, a hostfile host that ssh cannot reach, and on the
mini-cluster the classic trap of an unset GLOO_SOCKET_IFNAME on nodes sharing one hostname.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from labkit import doctor
from labkit.doctor.checks import CHECKS, FAIL, PASS, WARN, Result

REPO = Path(__file__).resolve().parents[1]
NODE_CHECKS = ("run root shared and writable", "MASTER_ADDR and port", "all-reduce across nodes")


def _by_name(results: list[Result]) -> dict[str, Result]:
    return {r.name: r for r in results}


@pytest.fixture
def clean_env(monkeypatch, run_root):
    for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return run_root


def test_checks_are_data_with_unique_names():
    names = [n for n, _ in CHECKS]
    assert len(names) == len(set(names)) >= 11
    for want in ("python", "gpus", "slurm", "accounting", "run_root", "master", "clock", "ulimit",
                 "interface", "hostfile", "allreduce"):
        assert want in names


def test_render_table_golden(assert_golden):
    results = [
        Result("python and packages", PASS, "Python 3.11.7; 13 pinned packages"),
        Result("slurm accounting", WARN, "sacct does not answer (Slurm accounting storage is "
               "disabled); labkit copes: job states come from squeue, scontrol and exit_code",
               "nothing to do for labkit"),
        Result("all-reduce across nodes", FAIL, "did not finish within 30s: {1: 'stopped in "
               "phase allreduce'}", "check the interface"),
    ]
    text = doctor.render_table(results, width=90)
    assert_golden("doctor_table.txt", text + "\n")
    assert text.splitlines()[-1] == "3 checks: 1 PASS, 1 WARN, 1 FAIL"
    assert "fix: check the interface" in text and "fix: nothing" in text


def test_wrong_interface_fails_interface_and_allreduce(clean_env, monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "nosuch0")
    by = _by_name(doctor.run_doctor(backend="local", timeout_s=15))
    iface = by["network interface (NCCL/gloo)"]
    assert iface.status == FAIL and "GLOO_SOCKET_IFNAME=nosuch0" in iface.detail
    assert "lo" in iface.detail and "GLOO_SOCKET_IFNAME=" in iface.fix
    ar = by["all-reduce across nodes"]
    assert ar.status == FAIL and "nosuch0" in ar.detail


def test_unresolvable_master_addr_fails(clean_env, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "no-such-head.invalid")
    results = doctor.run_doctor(backend="local", timeout_s=3,
                                checks=[c for c in CHECKS if c[0] in ("master", "allreduce")])
    by = _by_name(results)
    m = by["MASTER_ADDR and port"]
    assert m.status == FAIL and "no-such-head.invalid" in m.detail and m.fix
    assert by["all-reduce across nodes"].status == FAIL


def test_master_port_already_taken_warns(clean_env, monkeypatch):
    """The classroom trap: everyone on MASTER_PORT=29500. A real listener holds the port."""
    with socket.socket() as held:
        held.bind(("", 0))
        held.listen(1)
        port = held.getsockname()[1]
        monkeypatch.setenv("MASTER_PORT", str(port))
        by = _by_name(doctor.run_doctor(backend="local", timeout_s=10,
                                        checks=[c for c in CHECKS if c[0] == "master"]))
    m = by["MASTER_ADDR and port"]
    assert m.status == WARN and f"port {port}" in m.detail and "MASTER_PORT" in m.fix


def test_run_root_that_cannot_exist_fails(clean_env, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("LABKIT_RUN_ROOT", str(blocker / "runs"))
    by = _by_name(doctor.run_doctor(backend="local", timeout_s=5,
                                    checks=[c for c in CHECKS if c[0] == "run_root"]))
    r = by["run root shared and writable"]
    assert r.status == FAIL and str(blocker) in r.detail and "LABKIT_RUN_ROOT" in r.fix


def test_hostfile_with_unreachable_host_fails(tmp_path, clean_env):
    hf = tmp_path / "hostfile"
    hf.write_text("# DeepSpeed hostfile\nno-such-node.invalid slots=2\n")
    by = _by_name(doctor.run_doctor(backend="local", hostfile=hf,
                                    checks=[c for c in CHECKS if c[0] == "hostfile"]))
    r = by["ssh / pdsh to hostfile hosts"]
    assert r.status == FAIL and "no-such-node.invalid" in r.detail and "ssh-copy-id" in r.fix
    empty = tmp_path / "empty"
    empty.write_text("\n")
    r = doctor.run_doctor(hostfile=empty, checks=[c for c in CHECKS if c[0] == "hostfile"])[0]
    assert r.status == FAIL and "no hosts" in r.detail


def test_cli_local_probe_passes_on_this_machine(clean_env):
    """`labkit doctor --backend local --json`: the JSON contract, the exit code, and every
    node-wide check passing with two real local probe processes."""
    p = subprocess.run([sys.executable, "-m", "labkit", "doctor", "--backend", "local", "--json",
                        "--timeout", "20"], capture_output=True, text=True, timeout=180)
    doc = json.loads(p.stdout)  # stdout holds only the JSON document
    assert set(doc) == {"checks"} and len(doc["checks"]) == len(CHECKS)
    for c in doc["checks"]:
        assert set(c) == {"name", "status", "detail", "fix"}
        assert c["status"] in ("PASS", "WARN", "FAIL", "SKIP") and c["detail"]
        if c["status"] in ("WARN", "FAIL"):
            assert c["fix"], f"{c['name']} is {c['status']} without a fix"
    failed = [c for c in doc["checks"] if c["status"] == "FAIL"]
    assert p.returncode == (1 if failed else 0), failed
    assert "[labkit]" in p.stderr  # progress goes to stderr
    by = {c["name"]: c for c in doc["checks"]}
    for name in NODE_CHECKS + ("python and packages", "clock skew",
                               "network interface (NCCL/gloo)"):
        assert by[name]["status"] == "PASS", by[name]
    assert "sum 2 = world size" in by["all-reduce across nodes"]["detail"]
    assert not (clean_env / ".doctor").exists(), "the probe's scratch folder is left behind"


# --- the real mini-cluster (the jobs tests' slurm_cluster session fixture) -------------------
@pytest.mark.slurm
def test_doctor_on_minicluster_passes(slurm_cluster, clean_env):
    results = doctor.run_doctor(slurm_cluster, timeout_s=400)  # the queue may be busy
    by = _by_name(results)
    bad = [r for r in results if r.status == FAIL]
    assert not bad, bad
    assert "2 node(s) in Slurm job" in by["all-reduce across nodes"].detail
    assert "NodeAddr" in by["MASTER_ADDR and port"].detail
    assert by["slurm accounting"].status == WARN  # the mini-cluster has no slurmdbd
    assert "eth0" in by["network interface (NCCL/gloo)"].detail


@pytest.mark.slurm
def test_doctor_on_minicluster_catches_unset_socket_ifname(slurm_cluster, clean_env):
    """Nodes share one hostname that resolves to 127.0.0.1: without GLOO_SOCKET_IFNAME gloo
    advertises loopback to the other node, and the all-reduce cannot finish."""
    profile = slurm_cluster.replace(env={})
    # 80 s in all: each probe phase gets 20 s (a quarter), what the doomed all-reduce waits
    by = _by_name(doctor.run_doctor(profile, timeout_s=80, checks=[
        c for c in CHECKS if c[0] in ("interface", "allreduce")]))
    iface = by["network interface (NCCL/gloo)"]
    assert iface.status == FAIL and "loopback" in iface.detail
    assert "GLOO_SOCKET_IFNAME=eth0" in iface.fix
    assert by["all-reduce across nodes"].status == FAIL


@pytest.mark.slurm
def test_gpu_profile_on_cpu_only_cluster_fails_gpus(slurm_cluster, clean_env):
    """A GPU profile (gres) against the CPU-only mini-cluster: Slurm itself refuses the GPU
    request, and the doctor says so before any training job is submitted."""
    profile = slurm_cluster.replace(gpu_request="gres")
    by = _by_name(doctor.run_doctor(profile, timeout_s=10, checks=[
        c for c in CHECKS if c[0] in ("slurm", "gpus")]))
    assert by["slurm"].status == WARN and "no partition offers GRES" in by["slurm"].detail
    gpus = by["CUDA and GPUs"]
    assert gpus.status == FAIL and "gres" in gpus.detail.lower() and "gpu_request" in gpus.fix


def test_a_check_that_does_not_apply_is_skip_not_pass():
    from labkit.doctor.checks import SKIP, check_hostfile

    r = check_hostfile(doctor.Context(hostfile=None))
    assert r.status == SKIP and r.detail.startswith("skipped")
    text = doctor.render_table([r, Result("python and packages", PASS, "ok")])
    assert text.splitlines()[2].startswith("SKIP ")
    assert text.splitlines()[-1] == "2 checks: 1 PASS, 0 WARN, 0 FAIL, 1 SKIP"


def test_probe_is_a_node_program_that_does_not_import_labkit():
    """The probe runs on nodes that may have torch but no labkit: standard library and torch."""
    import ast

    probe = REPO / "code" / "doctor_probe.py"
    tree = ast.parse(probe.read_text())
    mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {m for m in mods if m.split(".")[0] == "labkit"}, mods
    r = subprocess.run([sys.executable, str(probe), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--rank" in r.stdout


def test_probes_started_at_once_each_get_their_own_ports(tmp_path):
    """Three 2-rank probes on this machine at the same time: each rank 0 binds its ports before
    it publishes them (the ping listener, then the all-reduce's store on a port the OS gives),
    so no probe can take another's port between a look-up and a bind, and every all-reduce
    finishes with its own two ranks."""
    probe = REPO / "code" / "doctor_probe.py"
    procs = []
    for k in range(3):
        for rank in (0, 1):
            procs.append(subprocess.Popen(
                [sys.executable, str(probe), "--out", str(tmp_path / f"p{k}"), "--rank", str(rank),
                 "--world", "2", "--master-addr", "127.0.0.1", "--timeout", "120"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}))
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    stores, pings = set(), set()
    for k in range(3):
        out = tmp_path / f"p{k}"
        for rank in (0, 1):
            rec = json.loads((out / f"rank-{rank}.json").read_text())
            assert rec["phase"] == "done" and rec["ping"]["ok"], rec
            assert rec["allreduce"]["ok"] and rec["allreduce"]["value"] == 2.0, rec["allreduce"]
        pings.add(json.loads((out / "ports.json").read_text())["ping"])
        stores.add(json.loads((out / "store.json").read_text())["port"])
    assert len(pings) == 3 and len(stores) == 3 and not pings & stores, (pings, stores)
