"""The hostfile backend on the real mini-cluster: sshd on every node, pdsh, the DeepSpeed launcher.

Trains a 2-node TP=2 x PP=2 run through pdsh + torchrun and through the DeepSpeed launcher (both
to COMPLETED with "using world size: 4" in the log), cancels a running job and looks on both
nodes for what is left, and checks the ssh set-up that ``labkit cluster up`` made.
"""

from __future__ import annotations

import os
import subprocess
import time
from importlib.util import find_spec

import pytest
from conftest import skip_or_fail

from labkit import minicluster
from labkit.config import RunConfig
from labkit.jobs import JobState, submit
from labkit.site import load_cluster

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def hostfile_site(slurm_cluster):
    path = minicluster.cluster_status()["profiles"]["hostfile"]
    return load_cluster(path)


def _cfg(name: str, **kw) -> RunConfig:
    return RunConfig(**{**dict(name=name, nodes=2, gpus_per_node=2, train_iters=5,
                               tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                               backend="hostfile"), **kw})


def _token_pids(token: str) -> list[int]:
    """Processes on this machine (all nodes share its process table) carrying the token."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                env = open(f"/proc/{d}/environ", "rb").read()
            except OSError:
                continue
            if f"LABKIT_JOB_TOKEN={token}".encode() in env.split(b"\0"):
                out.append(int(d))
    return out


def _cmdline(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_ssh_and_pdsh_between_nodes(hostfile_site):
    assert [h["name"] for h in hostfile_site.hosts] == ["node1", "node2"]
    p = subprocess.run(["ssh", "node2", "ip", "-o", "-4", "addr", "show", "eth0"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and "10.77.0.12/" in p.stdout, p.stderr
    p = subprocess.run(["pdsh", "-R", "ssh", "-w", "node1,node2", "echo", "rank", "%n"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["node1: rank 0", "node2: rank 1"]
    # N x N, each node to itself included: the nodes share the client config and keys.
    p = subprocess.run(["ssh", "node1", "ssh", "node2", "ssh", "node2", "true"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("launcher", ["pdsh", "deepspeed"])
def test_tp2_pp2_on_two_hosts(hostfile_site, run_root, launcher):
    if launcher == "deepspeed" and find_spec("deepspeed") is None:
        skip_or_fail("the deepspeed extra is not installed (pip install -e .[deepspeed])")
    job = submit(_cfg(f"hf_{launcher}"), cluster=hostfile_site.replace(launcher=launcher))
    assert job.backend == "hostfile" and job.info["hosts"] == ["node1", "node2"]
    st = job.wait(timeout=540, progress=False)
    log = job.log_path.read_text()
    assert st is JobState.COMPLETED, job.tail(60)
    assert "using world size: 4," in log and job.exit_code() == 0
    assert (job.run_dir / "hostfile").read_text().splitlines()[1:] == [
        "node1 slots=2  # 10.77.0.11", "node2 slots=2  # 10.77.0.12"]
    # Both nodes ran ranks: pdsh prefixes each host's lines with its name.
    assert "node1: " in log and "node2: " in log
    if launcher == "deepspeed":
        assert "dist_world_size=4" in log and "--local_rank=1" in log
    assert not _token_pids(job.info["token"])


def test_cancel_leaves_nothing_on_either_node(hostfile_site, run_root):
    job = submit(_cfg("hf_cancel", train_iters=10_000), cluster=hostfile_site)
    token = job.info["token"]
    end = time.time() + 300
    while time.time() < end and "iteration        1/" not in job.log_path.read_text():
        assert job.state() is JobState.RUNNING, job.tail(40)
        time.sleep(2)
    pids = _token_pids(token)
    nets = {os.readlink(f"/proc/{p}/ns/net") for p in pids} - {os.readlink("/proc/self/ns/net")}
    assert len(nets) == 2, f"the job's processes should live on both nodes: {pids}"
    bystander = subprocess.Popen(["ssh", "node2", "sleep", "120"])  # not the job's: must survive
    try:
        time.sleep(1)
        job.cancel()
        assert job.state() is JobState.CANCELLED
        assert _token_pids(token) == [], "processes of the cancelled job are left"
        assert bystander.poll() is None, "cancel ended a process that was not the job's"
        for i in (1, 2):  # whatever still runs in a node's namespace
            left = [_cmdline(int(pid)) for pid in subprocess.run(
                ["ip", "netns", "pids", f"lk-node{i}"], capture_output=True, text=True,
                check=True).stdout.split()]
            left = [c for c in left if "pretrain_gpt" in c or "torchrun" in c]
            assert left == [], f"node{i} still runs {left}"
    finally:
        bystander.kill()
    assert job.exit_code() is not None  # the launcher wrote it after pdsh returned


def test_world_size_is_checked_against_the_hostfile(hostfile_site, run_root):
    from labkit.errors import ConfigError

    with pytest.raises(ConfigError, match=r"node2 has slots=2 < 3.*gpus_per_node <= 2"):
        submit(_cfg("hf_big", gpus_per_node=3, tensor_model_parallel_size=1,
                    pipeline_model_parallel_size=1, global_batch_size=12), cluster=hostfile_site)
    assert not (run_root / "hf_big").exists()
    with pytest.raises(ConfigError, match=r"needs 3 hosts.*has 2"):
        submit(_cfg("hf_three", nodes=3, tensor_model_parallel_size=1,
                    pipeline_model_parallel_size=1, global_batch_size=12), cluster=hostfile_site)


def test_unreachable_host_is_refused_before_launch(hostfile_site, run_root):
    from labkit.errors import SubmissionError

    hosts = [*hostfile_site.hosts[:1], {"name": "no-such-node.invalid", "slots": 2}]
    with pytest.raises(SubmissionError, match="no-such-node.invalid"):
        submit(_cfg("hf_unreachable"), cluster=hostfile_site.replace(hosts=tuple(hosts)))
    assert not (run_root / "hf_unreachable").exists()


def test_a_lost_host_fails_the_job_with_a_hint_naming_it(hostfile_site, run_root):
    """node2 goes away under a running job: everything the job runs there dies at once (as in a
    crash, an OOM kill of the agent or a reboot). The job ends FAILED, the host is named in
    ``lost_hosts`` and in the failure's hint, and nothing of the job is left on node1."""
    from labkit.backends import hostfile
    from labkit.backends.diagnosis import failure_error

    job = submit(_cfg("hf_lost", train_iters=10_000), cluster=hostfile_site)
    token = job.info["token"]
    end = time.time() + 300
    while time.time() < end and "iteration        1/" not in job.log_path.read_text():
        assert job.state() is JobState.RUNNING, job.tail(40)
        time.sleep(2)
    on_node2 = set(subprocess.run(["ip", "netns", "pids", "lk-node2"], capture_output=True,
                                  text=True, check=True).stdout.split())
    victims = [p for p in _token_pids(token) if str(p) in on_node2]
    assert any("torchrun" in _cmdline(p) for p in victims), [_cmdline(p) for p in victims]
    try:
        for pid in victims:
            os.kill(pid, 9)
        st = job.wait(timeout=300, progress=False)
        assert st is JobState.FAILED, (st, job.tail(40))
        assert hostfile.lost_hosts(job) == ["node2"], job.tail(40)
        message = str(failure_error(job, st))
        assert "lost host node2" in message and "ssh node2 uptime" in message, message
        assert job.exit_code() not in (None, 0)
        end = time.time() + 60  # node1's ranks end once their peers on node2 are gone
        while _token_pids(token) and time.time() < end:
            time.sleep(1)
        assert _token_pids(token) == [], [_cmdline(p) for p in _token_pids(token)]
    finally:
        if job.state() is JobState.RUNNING:
            job.cancel()
