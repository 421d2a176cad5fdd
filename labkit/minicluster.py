"""A real Slurm mini-cluster on this machine: ``labkit cluster up | down | status`` (root).

``up`` writes its own ``slurm.conf`` under ``STATE_DIR`` and starts munged (if none answers),
one slurmctld and one slurmd per node. Each node is a network namespace with its own address
(10.77.0.11, .12, ...) and an interface named ``eth0`` on the bridge ``lkbr0`` (10.77.0.1, where
slurmctld listens), so torchrun's rendezvous, gloo and Slurm really cross a network between
nodes. Each node's link is shaped with ``tc tbf`` (default 1 Gbit/s), so traffic inside a node
(loopback) and between nodes differ measurably, like NVLink and Ethernet.

slurmd is started with ``nsenter --net=/run/netns/NAME``: ``ip netns exec`` remounts ``/sys``,
which loses ``/sys/fs/cgroup``, and slurmd 22.05 then dies ("Unable to initialize cgroup
plugin"). ``down`` stops exactly what ``up`` recorded in ``started.json``.

While it is up, its cluster profile (``minicluster_cluster()``) is also written to
``labkit.paths.MINICLUSTER_SITE``: that file is how ``labkit.site.resolve_cluster(None)`` and
``--cluster`` without a value find the mini-cluster. ``down`` removes it first.

Every node also runs ``sshd`` in its namespace (``labkit.minicluster_ssh``: cluster key pair,
host keys, known_hosts), so ``ssh node2 hostname`` and ``pdsh -R ssh -w node1,node2 hostname``
work as on a cluster without Slurm; the site profile for the hostfile backend
(``minicluster_hostfile_cluster()``, hosts with their addresses and slots) is written to
``HOSTFILE_SITE`` beside the Slurm one. ``cluster_status()["profiles"]`` names both.

Preemption as on a shared site: a job in partition ``urgent`` (``PREEMPTOR``, higher
PriorityTier, same nodes) preempts jobs of ``lab`` with PreemptMode=REQUEUE: they are sent their
warning signal (``--signal``; preempt_send_user_signal) and SIGTERM, get ``GraceTime`` seconds,
then go back to the queue and start again when the nodes are free.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import yaml

from labkit import minicluster_ssh, nodenet, slurmcli
from labkit._logging import log
from labkit.errors import LabkitError
from labkit.paths import MINICLUSTER_DIR, MINICLUSTER_SITE, check_slurm_dir, default_torchrun
from labkit.site import CLUSTER_DIR, ClusterProfile, load_cluster

STATE_DIR = MINICLUSTER_DIR
SLURM_CONF = STATE_DIR / "slurm.conf"
STARTED = STATE_DIR / "started.json"
BRIDGE, SUBNET, NS_PREFIX, PARTITION = nodenet.BRIDGE, nodenet.SUBNET, "lk-node", "lab"
PREEMPTOR = "urgent"  # a partition whose jobs preempt (requeue) the jobs of PARTITION
GRACE_S = 30  # seconds a preempted job gets between its warning and the kill
ETC_CONF = Path("/etc/slurm/slurm.conf")
HOSTFILE_SITE = STATE_DIR / "site-hostfile.yaml"


class ClusterError(LabkitError, RuntimeError):
    """The mini-cluster could not be started, or is not there."""


def _sh(*cmd: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    p = subprocess.run(list(cmd), capture_output=True, text=True, env=env)
    if check and p.returncode:
        raise ClusterError(f"`{' '.join(cmd)}` failed (exit {p.returncode}): "
                           f"{(p.stderr or p.stdout).strip()}")
    return p


def node_names(n: int) -> list[str]:
    return [f"node{i}" for i in range(1, n + 1)]


node_addr = nodenet.node_addr


def _read_started() -> dict | None:
    try:
        return json.loads(STARTED.read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: int | None, name: str) -> bool:
    try:
        return bool(pid) and name in Path(f"/proc/{pid}/cmdline").read_bytes().decode(
            errors="replace")
    except OSError:
        return False


def _pidfile(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def is_up() -> bool:
    """True when ``up`` ran and its slurmctld is still alive."""
    st = _read_started()
    return bool(st) and _alive(st.get("pids", {}).get("slurmctld"), "slurmctld")


def minicluster_cluster() -> ClusterProfile:
    """The cluster profile for jobs on the mini-cluster (GLOO_SOCKET_IFNAME=eth0, NodeAddr):
    ``code/clusters/local-minicluster.yaml`` with this Python's torchrun and its SLURM_CONF."""
    return load_cluster(CLUSTER_DIR / "local-minicluster.yaml").replace(
        torchrun=default_torchrun(), slurm_conf=str(SLURM_CONF))


def minicluster_hostfile_cluster(launcher: str = "pdsh") -> ClusterProfile:
    """The profile for the hostfile backend on the running mini-cluster: its nodes by name with
    their addresses and slots (CPUs per node), reached with ssh; ``launcher`` pdsh|deepspeed."""
    st = _read_started() or {}
    if not st.get("nodes"):
        raise ClusterError("the mini-cluster is not up: `sudo labkit cluster up` first")
    hosts = [{"name": n, "address": node_addr(i), "slots": st["cpus_per_node"]}
             for i, n in enumerate(node_names(st["nodes"]), start=1)]
    return ClusterProfile(name="local-minicluster-hostfile", hosts=tuple(hosts),
                          launcher=launcher, gpu_request="none", torchrun=default_torchrun(),
                          env=dict(minicluster_cluster().env), time_limit="00:20:00")


def _write_site(cluster: ClusterProfile, path: Path | None = None) -> ClusterProfile:
    """Publish a running mini-cluster's profile at ``path`` (default MINICLUSTER_SITE, which
    labkit.site reads)."""
    path = path or MINICLUSTER_SITE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("# Written by `labkit cluster up` while the mini-cluster runs; `labkit cluster "
                   "down` removes it.\n" + yaml.safe_dump(cluster.to_dict(), sort_keys=False))
    tmp.replace(path)  # atomic: a reader sees the old file or the new one
    return cluster


def _publish(record: dict) -> ClusterProfile:
    """Start the nodes' sshd if they do not run, then write both site profiles."""
    nodes = [(n, f"{NS_PREFIX}{i}", node_addr(i))
             for i, n in enumerate(node_names(record["nodes"]), start=1)]
    if not all(_alive(record["pids"].get(f"sshd-{n}"), "sshd") for n, _, _ in nodes):
        minicluster_ssh.stop(record["pids"])
        record["pids"].update(minicluster_ssh.start(nodes))
        STARTED.write_text(json.dumps(record))
    _write_site(minicluster_hostfile_cluster(), HOSTFILE_SITE)
    return _write_site(minicluster_cluster())


def _slurm_conf(nodes: int, cpus: int) -> str:
    host = socket.gethostname()
    d = STATE_DIR
    # Job ids grow with time across down/up, so an old run's job.json never names a new job.
    first_id = 1000 + (int(time.time()) // 10) % 60_000_000
    lines = [
        "# Written by `labkit cluster up`; do not edit (it is rewritten on every up).",
        "ClusterName=labkit",
        f"SlurmctldHost={host}({SUBNET}.1)",
        "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge",
        f"StateSaveLocation={d}/state", f"SlurmdSpoolDir={d}/spool/%n",
        f"SlurmctldPidFile={d}/run/slurmctld.pid", f"SlurmdPidFile={d}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={d}/log/slurmctld.log", f"SlurmdLogFile={d}/log/slurmd-%n.log",
        # No cgroups and no accounting daemon on one machine: sacct answers nothing here.
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none", "MpiDefault=none",
        # CR_CPU: a job holding a node's CPUs makes the next one wait (PENDING), as on a real site.
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "SlurmdParameters=config_overrides", "ReturnToService=1",
        f"FirstJobId={first_id}", "MinJobAge=300", "KillWait=5", "InactiveLimit=0",
        "SlurmctldTimeout=30", "SlurmdTimeout=60", "MessageTimeout=10",
        # Preemption by partition: urgent's jobs requeue lab's, which get their --signal first.
        "PreemptType=preempt/partition_prio", "PreemptMode=REQUEUE",
        "SlurmctldParameters=preempt_send_user_signal",
    ]
    for i, name in enumerate(node_names(nodes), start=1):
        lines.append(f"NodeName={name} NodeAddr={node_addr(i)} NodeHostname={host} "
                     f"CPUs={cpus} State=UNKNOWN")
    lines.append(f"PartitionName={PARTITION} Nodes=node[1-{nodes}] Default=YES MaxTime=INFINITE "
                 f"State=UP OverSubscribe=NO PriorityTier=1 PreemptMode=REQUEUE "
                 f"GraceTime={GRACE_S}")
    lines.append(f"PartitionName={PREEMPTOR} Nodes=node[1-{nodes}] Default=NO MaxTime=INFINITE "
                 f"State=UP OverSubscribe=NO PriorityTier=2 PreemptMode=OFF")
    return "\n".join(lines) + "\n"


def _conf_changed(nodes: int, cpus: int) -> bool:
    """Whether the running cluster's slurm.conf differs from what this labkit writes (job ids
    aside): a cluster started by an older labkit lacks what the tests and notebooks expect."""
    try:
        old = SLURM_CONF.read_text().splitlines()
    except OSError:
        return True
    new = _slurm_conf(nodes, cpus).splitlines()
    return [x for x in old if not x.startswith("FirstJobId=")] != \
        [x for x in new if not x.startswith("FirstJobId=")]


def _ensure_packages() -> None:
    if shutil.which("slurmctld") and shutil.which("munged") and not minicluster_ssh.packages_missing():
        return
    log.info("installing slurm-wlm, munge, openssh-server and pdsh with apt-get (first start)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _sh("apt-get", "update", "-q", env=env)
    _sh("apt-get", "install", "-y", "-q", "--no-install-recommends", "slurm-wlm", "munge",
        "iproute2", "openssh-server", "openssh-client", "pdsh", env=env)


def _munge_ok() -> bool:
    if not shutil.which("munge"):
        return False
    p = subprocess.run("munge -n | unmunge", shell=True, capture_output=True)
    return p.returncode == 0


def _start_munge() -> int | None:
    if _munge_ok():
        return None  # someone else's munged answers; leave it alone
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
    Path("/run/munge").mkdir(parents=True, exist_ok=True)
    _sh("munged", "--force")
    for _ in range(50):
        if _munge_ok():
            return _pidfile(Path("/run/munge/munged.pid"))
        time.sleep(0.1)
    raise ClusterError("munged started but `munge -n | unmunge` still fails; see "
                       "/var/log/munge/munged.log")


def _network(nodes: int, rate: str) -> None:
    """The nodes' network, the root way in: named namespaces on a bridge in this machine's
    network (where slurmctld listens), built by ``labkit.nodenet`` like the local backend's."""
    link = nodenet.Link(rate=rate)
    for cmd in nodenet.bridge_commands(BRIDGE):
        _sh(*cmd)
    for i in range(1, nodes + 1):
        ns = f"{NS_PREFIX}{i}"
        _sh("ip", "netns", "add", ns)
        for cmd in nodenet.node_commands(i, ns, f"/run/netns/{ns}", link, BRIDGE):
            _sh(*cmd)


def cluster_up(nodes: int = 2, cpus_per_node: int = 2, rate: str = "1gbit") -> ClusterProfile:
    """Start the mini-cluster (idempotent) and return the profile for jobs on it."""
    check_slurm_dir()
    if os.geteuid() != 0:
        raise ClusterError("`labkit cluster up` needs root (it creates network namespaces and "
                           "starts slurmctld/slurmd). Run it with sudo, or use backend='local', "
                           "which runs the same jobs as plain processes without Slurm or root.")
    if nodes < 1 or cpus_per_node < 1:
        raise ClusterError(f"nodes={nodes} and cpus_per_node={cpus_per_node} must be >= 1")
    st = _read_started()
    if is_up() and st and (st["nodes"], st["cpus_per_node"], st["rate"]) == (
            nodes, cpus_per_node, rate) and not _conf_changed(nodes, cpus_per_node):
        _ensure_packages()
        return _publish(st)
    if st:
        log.info("stopping the previous mini-cluster first (other shape, older slurm.conf, half started)")
        cluster_down()
    _ensure_packages()
    for sub in ("state", "run", "log", *(f"spool/{n}" for n in node_names(nodes))):
        (STATE_DIR / sub).mkdir(parents=True, exist_ok=True)
    shutil.rmtree(STATE_DIR / "state", ignore_errors=True)  # a fresh controller, no old jobs
    (STATE_DIR / "state").mkdir()
    SLURM_CONF.write_text(_slurm_conf(nodes, cpus_per_node))
    record: dict = {"nodes": nodes, "cpus_per_node": cpus_per_node, "rate": rate, "pids": {},
                    "etc_link": False, "started_at": time.time()}
    STARTED.write_text(json.dumps(record))  # written early: down can clean a half-started one
    record["pids"]["munged"] = _start_munge()
    STARTED.write_text(json.dumps(record))
    _network(nodes, rate)
    _sh("slurmctld", "-f", str(SLURM_CONF))
    record["pids"]["slurmctld"] = _wait_pidfile(STATE_DIR / "run/slurmctld.pid", "slurmctld")
    STARTED.write_text(json.dumps(record))
    for i, name in enumerate(node_names(nodes), start=1):
        _sh("nsenter", f"--net=/run/netns/{NS_PREFIX}{i}", "slurmd", "-f", str(SLURM_CONF),
            "-N", name)
        record["pids"][f"slurmd-{name}"] = _wait_pidfile(STATE_DIR / f"run/slurmd-{name}.pid",
                                                         "slurmd")
        STARTED.write_text(json.dumps(record))
    if not ETC_CONF.exists() and not ETC_CONF.is_symlink():
        # So that a student's plain `sinfo` / `sbatch job.sh` finds this cluster too.
        ETC_CONF.parent.mkdir(parents=True, exist_ok=True)
        ETC_CONF.symlink_to(SLURM_CONF)
        record["etc_link"] = True
    STARTED.write_text(json.dumps(record))
    _wait_idle(nodes)
    site = _publish(record)
    log.info(f"mini-cluster up: {nodes} nodes x {cpus_per_node} CPUs, link {rate}, "
             f"SLURM_CONF={SLURM_CONF}, sshd on every node")
    return site


def _wait_pidfile(path: Path, name: str, timeout: float = 20) -> int:
    end = time.time() + timeout
    while time.time() < end:
        pid = _pidfile(path)
        if pid and _alive(pid, name):
            return pid
        time.sleep(0.1)
    raise ClusterError(f"{name} did not start (no live pid in {path}); see its log in "
                       f"{STATE_DIR}/log/:\n{_log_tail(name)}")


def _log_tail(name: str, n: int = 15) -> str:
    out = []
    for f in sorted((STATE_DIR / "log").glob(f"{name}*.log")):
        out.append(f"--- {f}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-n:]))
    return "\n".join(out)


def _wait_idle(nodes: int, timeout: float = 60) -> None:
    end, states = time.time() + timeout, {}
    while time.time() < end:
        states = {n["name"]: n["state"] for n in cluster_status()["nodes"]}
        if len(states) == nodes and all(s.startswith("idle") for s in states.values()):
            return
        time.sleep(0.5)
    raise ClusterError(f"nodes not idle after {timeout:.0f} s: {states}. Logs:\n"
                       f"{_log_tail('slurmd')}\n{_log_tail('slurmctld')}")


def _stop(pid: int | None, name: str) -> None:
    if not _alive(pid, name):
        return
    os.kill(pid, signal.SIGTERM)
    for _ in range(50):
        if not _alive(pid, name):
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


def cluster_down() -> None:
    """Stop what ``up`` started (daemons, job processes in its namespaces) and remove its
    namespaces, links and /etc/slurm/slurm.conf link, and its cluster profile at
    MINICLUSTER_SITE. State and logs stay in STATE_DIR."""
    check_slurm_dir()
    MINICLUSTER_SITE.unlink(missing_ok=True)  # first: no new job should pick a stopping cluster
    HOSTFILE_SITE.unlink(missing_ok=True)
    st = _read_started()
    if not st:
        log.info("no mini-cluster recorded in %s: nothing to stop", STARTED)
        return
    pids = st.get("pids", {})
    minicluster_ssh.stop(pids)
    for key, pid in pids.items():
        if key.startswith("slurmd"):
            _stop(pid, "slurmd")
    _stop(pids.get("slurmctld"), "slurmctld")
    for i in range(1, st["nodes"] + 1):
        ns = f"{NS_PREFIX}{i}"
        if not Path(f"/run/netns/{ns}").exists():
            continue
        # Whatever still runs inside our node namespaces is a job step of ours.
        for pid in _sh("ip", "netns", "pids", ns, check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        _sh("ip", "netns", "delete", ns, check=False)
        _sh("ip", "link", "delete", f"lkv{i}", check=False)
    _sh("ip", "link", "delete", BRIDGE, check=False)
    if pids.get("munged"):
        _stop(pids["munged"], "munged")
    if st.get("etc_link") and ETC_CONF.is_symlink() and os.readlink(ETC_CONF) == str(SLURM_CONF):
        ETC_CONF.unlink()
    STARTED.unlink(missing_ok=True)
    log.info("mini-cluster down")


def cluster_status() -> dict:
    """``{"up", "nodes": [{"name", "addr", "state", "cpus"}], "slurm_conf", "partition", "rate",
    "profiles": {"slurm": PATH, "hostfile": PATH}}``; each PATH is a cluster profile YAML of the
    mini-cluster (Slurm; hosts reached with ssh), named only while it is up and the file exists
    (pass it as ``cluster=`` or ``--cluster``); ``{}`` while it is down."""
    check_slurm_dir()
    st = _read_started()
    out = {"up": is_up(), "nodes": [], "slurm_conf": str(SLURM_CONF), "partition": PARTITION,
           "rate": st.get("rate") if st else None, "profiles": {}}
    if not out["up"]:
        return out
    out["profiles"] = {kind: str(path) for kind, path in
                       (("slurm", MINICLUSTER_SITE), ("hostfile", HOSTFILE_SITE)) if path.exists()}
    out["nodes"] = [{"name": n, "addr": a, "state": t, "cpus": c}
                    for n, a, t, c in slurmcli.node_addresses(str(SLURM_CONF))]
    return out
