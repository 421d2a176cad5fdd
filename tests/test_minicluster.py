"""`labkit cluster up|down|status`: the mini-cluster's network, daemons and clean shutdown."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from labkit import minicluster, paths
from labkit.cli import main as cli
from labkit.site import load_cluster, resolve_cluster


def test_needs_root_and_says_what_to_do(monkeypatch):
    monkeypatch.setattr(minicluster.os, "geteuid", lambda: 1000)
    with pytest.raises(minicluster.ClusterError, match="backend='local'"):
        minicluster.cluster_up()


def test_slurm_conf_shape():
    conf = minicluster._slurm_conf(3, 4)
    for needle in ("SelectTypeParameters=CR_CPU", "AccountingStorageType=accounting_storage/none",
                   "ProctrackType=proctrack/linuxproc", "NodeName=node3 NodeAddr=10.77.0.13",
                   "CPUs=4", "PartitionName=lab Nodes=node[1-3]", "OverSubscribe=NO",
                   # urgent's jobs requeue lab's after their warning signal and a grace time
                   "PreemptType=preempt/partition_prio", "PreemptMode=REQUEUE",
                   "SlurmctldParameters=preempt_send_user_signal",
                   "PriorityTier=1 PreemptMode=REQUEUE GraceTime=30",
                   "PartitionName=urgent Nodes=node[1-3]", "PriorityTier=2 PreemptMode=OFF"):
        assert needle in conf, needle


def test_down_removes_the_published_profile_even_when_nothing_runs(tmp_path, monkeypatch):
    site_yaml = tmp_path / "site.yaml"
    monkeypatch.setattr(minicluster, "MINICLUSTER_SITE", site_yaml)
    monkeypatch.setattr(minicluster, "HOSTFILE_SITE", tmp_path / "site-hostfile.yaml")
    monkeypatch.setattr(minicluster, "STARTED", tmp_path / "started.json")
    cluster = minicluster._write_site(minicluster.minicluster_cluster())
    assert load_cluster(site_yaml) == cluster  # what resolve_cluster(None) reads while up
    assert cluster.slurm_conf == str(minicluster.SLURM_CONF) and cluster.torchrun
    assert not list(tmp_path.glob("*.tmp"))
    minicluster.cluster_down()  # no started.json: nothing to stop, the stale file still goes
    assert not site_yaml.exists()


def test_status_names_the_profile_files_only_while_up(monkeypatch):
    """A profile path is named only while the mini-cluster is up and the file exists: a notebook
    that reads it while the cluster is down must not be sent to a missing file."""
    assert paths.MINICLUSTER_SITE.parent == minicluster.STATE_DIR
    monkeypatch.setattr(minicluster, "is_up", lambda: False)
    assert minicluster.cluster_status()["profiles"] == {}


@pytest.mark.slurm
def test_status_names_the_profile_files(slurm_cluster):
    st = minicluster.cluster_status()
    assert st["profiles"] == {"slurm": str(paths.MINICLUSTER_SITE),
                              "hostfile": str(minicluster.HOSTFILE_SITE)}


def _ns(name: str, *cmd: str) -> str:
    return subprocess.run(["nsenter", f"--net=/run/netns/{name}", *cmd], capture_output=True,
                          text=True, check=True).stdout


@pytest.mark.slurm
def test_nodes_are_namespaces_with_shaped_links(slurm_cluster, capsys):
    st = minicluster.cluster_status()
    assert st["up"] and [(n["name"], n["addr"]) for n in st["nodes"]] == [
        ("node1", "10.77.0.11"), ("node2", "10.77.0.12")]
    assert all(n["state"] in ("idle", "mix", "alloc") and n["cpus"] == 2 for n in st["nodes"])
    for i in (1, 2):
        assert f"10.77.0.1{i}/24" in _ns(f"lk-node{i}", "ip", "-br", "addr", "show", "eth0")
        assert "tbf" in _ns(f"lk-node{i}", "tc", "qdisc", "show", "dev", "eth0")
    pid = json.loads(minicluster.STARTED.read_text())["pids"]["slurmctld"]
    assert minicluster.cluster_up() == slurm_cluster  # idempotent: same cluster, no restart
    assert json.loads(minicluster.STARTED.read_text())["pids"]["slurmctld"] == pid
    assert cli(["cluster", "status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["up"] is True


@pytest.mark.slurm
def test_down_removes_what_up_made_then_up_again(slurm_cluster, monkeypatch):
    monkeypatch.delenv("LABKIT_CLUSTER", raising=False)
    assert load_cluster(paths.MINICLUSTER_SITE) == slurm_cluster
    assert resolve_cluster(None) == slurm_cluster
    pids = json.loads(minicluster.STARTED.read_text())["pids"]
    minicluster.cluster_down()
    assert not minicluster.is_up()
    assert not paths.MINICLUSTER_SITE.exists() and resolve_cluster(None).name == "generic"
    assert not any(Path(f"/run/netns/lk-node{i}").exists() for i in (1, 2))
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    assert "lkbr0" not in links and "lkv1" not in links
    for key, pid in pids.items():
        if key != "munged" and pid:
            assert not minicluster._alive(pid, key.split("-")[0]), key
    # Leave it up for the other tests of the session.
    assert minicluster.cluster_up() == slurm_cluster
    assert minicluster.is_up() and resolve_cluster(None) == slurm_cluster
