"""The doctor's ssh, pdsh, port and interface checks against the mini-cluster's real nodes.

They PASS with sshd on every node, and FAIL naming the host and the fix when sshd is stopped on
one node, when a node's key is missing from known_hosts, and when an nftables rule inside the
head node's namespace drops the rendezvous port. Each test puts the node back as it was.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from labkit import minicluster, minicluster_ssh
from labkit.doctor import CHECKS, FAIL, PASS, run_doctor

pytestmark = pytest.mark.slurm
HOST_CHECKS = [c for c in CHECKS if c[0] in ("hostfile", "hostfile_port", "hostfile_interface")]
SSH_CHECK = [c for c in CHECKS if c[0] == "hostfile"]
# A fixed port, as a site's MASTER_PORT is (the check tests the port the jobs will use, and the
# firewall test drops exactly it). It is bound inside node1's network namespace, where only the
# mini-cluster's jobs live, and the tiers that use the mini-cluster run one test at a time.
PORT = 29623


@pytest.fixture
def site(slurm_cluster, monkeypatch):
    monkeypatch.setenv("MASTER_PORT", str(PORT))
    return minicluster.cluster_status()["profiles"]["hostfile"]


def _by_name(results):
    return {r.name: r for r in results}


def test_all_pass_on_the_real_nodes(site):
    results = run_doctor(cluster=site, checks=HOST_CHECKS)
    assert [r.status for r in results] == [PASS] * 3, results
    by = _by_name(results)
    assert "2 x 2" in by["ssh / pdsh to hostfile hosts"].detail
    assert f"port {PORT} on the head node1" in by["rendezvous port between hosts"].detail
    assert "GLOO_SOCKET_IFNAME=eth0" in by["network interface on the hosts"].detail


def test_sshd_stopped_on_one_node(site):
    pid = json.loads(minicluster.STARTED.read_text())["pids"]["sshd-node2"]
    os.kill(pid, signal.SIGTERM)
    try:
        end = time.time() + 10
        while time.time() < end and os.path.exists(f"/proc/{pid}"):
            time.sleep(0.1)
        r = run_doctor(cluster=site, checks=SSH_CHECK)[0]
        assert r.status == FAIL
        assert "here -> node2: " in r.detail and "Connection refused" in r.detail
        assert "node1 -> node2" in r.detail  # the N x N part saw it from the other node too
        assert "start sshd there" in r.fix and "node2" in r.fix
        assert "here -> node1" not in r.detail  # node1's sshd still runs
    finally:
        minicluster.cluster_up()  # starts the nodes' sshd again (fresh keys)
    assert run_doctor(cluster=site, checks=SSH_CHECK)[0].status == PASS


def test_node_key_missing_from_known_hosts(site):
    known = minicluster_ssh.KNOWN_HOSTS
    before = known.read_text()
    known.write_text("".join(ln + "\n" for ln in before.splitlines() if not ln.startswith("node2,")))
    try:
        r = run_doctor(cluster=site, checks=SSH_CHECK)[0]
        assert r.status == FAIL and "here -> node2: Host key verification failed" in r.detail
        assert "node1 -> node2" in r.detail  # node2 is not reached, so not asked either
        assert "known_hosts" in r.fix and "ssh-keyscan node2" in r.fix
    finally:
        known.write_text(before)
    assert run_doctor(cluster=site, checks=SSH_CHECK)[0].status == PASS


def _nft(*args: str) -> None:
    subprocess.run(["nsenter", "--net=/run/netns/lk-node1", "nft", *args], check=True,
                   capture_output=True, text=True)


def test_firewall_drops_the_rendezvous_port(site):
    _nft("add", "table", "inet", "lkdoctortest")
    try:
        _nft("add", "chain", "inet", "lkdoctortest", "input",
             "{ type filter hook input priority 0 ; }")
        _nft("add", "rule", "inet", "lkdoctortest", "input", "tcp", "dport", str(PORT), "drop")
        by = _by_name(run_doctor(cluster=site, checks=HOST_CHECKS))
        r = by["rendezvous port between hosts"]
        assert r.status == FAIL, r
        assert f"port {PORT} on the head node1 (10.77.0.11)" in r.detail and "node2: " in r.detail
        assert "nft list ruleset" in r.fix and "node1" in r.fix
        assert by["ssh / pdsh to hostfile hosts"].status == PASS  # ssh (port 22) still works
    finally:
        _nft("delete", "table", "inet", "lkdoctortest")
    assert run_doctor(cluster=site, checks=[c for c in CHECKS if c[0] == "hostfile_port"])[
        0].status == PASS
