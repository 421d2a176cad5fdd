"""The checks of ``labkit doctor``: small functions ``(ctx) -> Result``, listed in ``CHECKS``.

Local checks look at this machine. Node checks read what ``code/doctor_probe.py`` found on each
node (one probe job per doctor run, started by ``Context.probes``): a Slurm job on Slurm, or as
two local processes on a plain machine.
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Callable
from importlib import metadata
from typing import TYPE_CHECKING

from labkit import slurmcli
from labkit.doctor import hostchecks, sitechecks
from labkit.doctor.result import FAIL, PASS, SKIP, WARN, Result
from labkit.slurmcli import SlurmError

if TYPE_CHECKING:
    from labkit.doctor.context import Context

SKEW_WARN_S, SKEW_FAIL_S = 1.0, 30.0
NOFILE_WANT = 4096


# --- this machine ------------------------------------------------------------------------
def check_python(ctx: Context) -> Result:
    name = "python and packages"
    py = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info[:2] != (3, 11):
        return Result(name, FAIL, f"Python {py}; labkit's pins (torch 2.13.0 CPU wheel, "
                      "megatron-core 0.16.1) need Python 3.11",
                      "create the env with Python 3.11: `make setup` or "
                      "`conda env create -f environment.yml`")
    try:
        reqs = metadata.requires("labkit") or []
    except metadata.PackageNotFoundError:
        return Result(name, FAIL, f"Python {py}; labkit is not installed in {sys.executable}",
                      "pip install -e . (or `make setup`)")
    missing, wrong = [], []
    for req in reqs:
        if "extra ==" in req or "==" not in req:
            continue
        pkg, pin = (s.strip() for s in req.split(";")[0].split("=="))
        try:
            got = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            missing.append(pkg)
            continue
        if got.split("+")[0] != pin:
            wrong.append(f"{pkg} {got} (pinned {pin})")
    if missing:
        return Result(name, FAIL, f"Python {py}; missing: {', '.join(missing)}",
                      "make setup (installs the pinned packages into .venv)")
    pinned = len([r for r in reqs if "==" in r and "extra ==" not in r])
    if wrong:
        return Result(name, WARN, f"Python {py}; versions differ from the pins: {'; '.join(wrong)}",
                      "pip install -e . to get the pinned versions (results may differ otherwise)")
    return Result(name, PASS, f"Python {py}; {pinned} pinned packages at their pinned versions")


def check_gpus(ctx: Context) -> Result:
    name = "CUDA and GPUs"
    # torch takes seconds to import: only the GPU check needs it
    import torch

    here = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if ctx.mode == "slurm" and ctx.wants_cuda:
        # What counts is what a job step sees on the compute nodes, not this login node.
        run = ctx.probes()
        seen = {f"{p.get('hostname')}#{p['rank']}": (p.get("gpus"), p.get("gpus_installed"))
                for p in run.records}
        if not seen:
            return Result(name, FAIL, f"a job step asking for one GPU per node did not run: "
                          f"{run.error}", "check the profile's gpu_request (gres or "
                          "gpus-per-node) against what sinfo -o %G shows, and the partition; "
                          + run.fix)
        detail = ("GPUs visible to a job step per node (installed per nvidia-smi): "
                  + ", ".join(f"{k}: {v} ({n})" for k, (v, n) in seen.items()))
        if any(not v for v, _ in seen.values()):
            return Result(name, FAIL, detail, "request GPUs the way the site does (profile "
                          "gpu_request: gres or gpus-per-node), check the partition has GPU "
                          "nodes (sinfo -o %G) and that CUDA_VISIBLE_DEVICES is not empty")
        if len({v for v, _ in seen.values()}) > 1:
            return Result(name, WARN, detail, "nodes differ in GPU count: pin the partition or "
                          "add a --constraint in the profile's sbatch_extra")
        return Result(name, PASS, detail)
    if here == 0:
        if ctx.wants_cuda:
            return Result(name, FAIL, f"no CUDA device visible here (torch {torch.__version__}, "
                          f"built for CUDA {torch.version.cuda}) and no Slurm cluster to ask",
                          "check nvidia-smi and CUDA_VISIBLE_DEVICES, or use the cpu profile")
        return Result(name, PASS, f"CPU mode: no CUDA device; training uses gloo "
                      f"(torch {torch.__version__})")
    names = sorted({torch.cuda.get_device_name(i) for i in range(here)})
    return Result(name, PASS, f"{here} GPU(s) here: {', '.join(names)}; CUDA {torch.version.cuda}")


def check_slurm(ctx: Context) -> Result:
    name = "slurm"
    try:
        rows = slurmcli.partitions(ctx.slurm_conf)
    except SlurmError as e:
        if e.returncode == 127:
            return Result(name, WARN if ctx.wants_slurm else PASS,
                          "no Slurm client (sinfo) on PATH: the local backend runs jobs here",
                          "for Slurm: install slurm-wlm, or `labkit cluster up` for the local one")
        return Result(name, FAIL if ctx.wants_slurm else WARN,
                      f"sinfo does not answer: {e.last_line}",
                      "start the controller (`labkit cluster up` for the local mini-cluster) or "
                      "check SLURM_CONF / slurm.conf's SlurmctldHost; the local backend still works")
    parts: dict[str, dict] = {}
    for p, avail, count, state, gres in rows:
        d = parts.setdefault(p, {"avail": avail, "nodes": 0, "states": set(), "gres": set()})
        d["nodes"] += count
        d["states"].add(state)
        d["gres"].add(gres)
    shown = "; ".join(f"{p} ({d['avail']}, {d['nodes']} nodes {'/'.join(sorted(d['states']))}, "
                      f"GRES {','.join(sorted(d['gres']))})" for p, d in parts.items())
    want = ctx.profile.partition if ctx.profile else None
    if want and not any(p.rstrip("*") == want for p in parts):
        return Result(name, FAIL, f"partition {want!r} of the profile is not in sinfo: {shown}",
                      f"set partition to one of {[p.rstrip('*') for p in parts]} in the profile")
    if ctx.wants_cuda and all(g in ("(null)", "") for d in parts.values() for g in d["gres"]):
        return Result(name, WARN, f"reachable, but no partition offers GRES: {shown}",
                      "set gpu_request: gpus-per-node (or none) in the profile if GPUs are not GRES")
    return Result(name, PASS, f"reachable: {shown}")


def check_accounting(ctx: Context) -> Result:
    name = "slurm accounting"
    if not ctx.mode == "slurm":
        return Result(name, SKIP, "skipped: no Slurm cluster (local backend)")
    try:
        slurmcli.check_accounting(ctx.slurm_conf)
    except SlurmError as e:
        if e.returncode == 127:
            return Result(name, WARN, "no sacct on PATH; labkit does not need it (job states "
                          "come from squeue, scontrol and runs/<name>/exit_code)", "")
        return Result(name, WARN, f"sacct does not answer ({e.last_line}); labkit copes: job "
                      f"states come from squeue, scontrol and runs/<name>/exit_code",
                      "nothing to do for labkit; for history, enable slurmdbd")
    return Result(name, PASS, "sacct answers (job history available)")


def check_ulimit(ctx: Context) -> Result:
    name = "open files (ulimit -n)"

    here = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    per_node = {sitechecks.node_name(p): p.get("nofile_soft")
                for p in ctx.probes().records if p.get("nofile_soft") is not None}
    low = {k: v for k, v in per_node.items() if v < NOFILE_WANT}
    detail = f"here {here}; on the nodes: {per_node or 'no probe results'}"
    if here < NOFILE_WANT or low:
        return Result(name, WARN, detail + f"; below {NOFILE_WANT}, many ranks can run out of "
                      "file descriptors (sockets, shared memory, data files)",
                      "ulimit -n 65536 in the profile's setup lines, or raise nofile in "
                      "/etc/security/limits.conf (Slurm: PropagateResourceLimits)")
    return Result(name, PASS, detail)


def _hostfile_hosts(ctx: Context, name: str) -> tuple[list | None, Result | None]:
    """The hosts of ``--hostfile`` or of the profile's ``hosts``; else a SKIP/FAIL Result."""
    hosts, where = hostchecks.hosts_of(ctx.hostfile, ctx.profile)
    if hosts:
        return hosts, None
    if not where:
        return None, Result(name, SKIP, "skipped: no hostfile and no hosts in the profile (only "
                            "the pdsh and DeepSpeed launchers need passwordless ssh)")
    return None, Result(name, FAIL, where if "no hosts" in where or "cannot read" in where
                        else f"{where} (no hosts)", "one line per host: `node1 slots=8`; pass an "
                        "existing file: labkit doctor --hostfile FILE")


def check_hostfile(ctx: Context) -> Result:
    name = "ssh / pdsh to hostfile hosts"
    hosts, skip = _hostfile_hosts(ctx, name)
    return skip or Result(name, *hostchecks.ssh_mesh(hosts))


def check_hostfile_port(ctx: Context) -> Result:
    name = "rendezvous port between hosts"
    hosts, skip = _hostfile_hosts(ctx, name)
    if skip:
        return skip
    port = os.environ.get("MASTER_PORT", "")
    return Result(name, *hostchecks.port_reachable(
        hosts, int(port) if port.isdigit() else hostchecks.DEFAULT_PORT))


def check_hostfile_interface(ctx: Context) -> Result:
    name = "network interface on the hosts"
    hosts, skip = _hostfile_hosts(ctx, name)
    if skip:
        return skip
    gpu = ctx.profile is not None and ctx.profile.gpu_request != "none"
    var = "NCCL_SOCKET_IFNAME" if gpu else "GLOO_SOCKET_IFNAME"
    env = dict(ctx.profile.env) if ctx.profile is not None else {}
    return Result(name, *hostchecks.interface_on_hosts(hosts, var, env.get(var) or
                                                       os.environ.get(var)))


CheckFn = Callable[["Context"], Result]


# --- every node (from the probe) ----------------------------------------------------------
def _where(ctx: Context) -> str:
    run = ctx.probes()
    return (f"{run.expected} node(s) in Slurm job {run.job_id}" if run.mode == "slurm"
            else f"{run.expected} local probe processes")


def check_run_root(ctx: Context) -> Result:
    name = "run root shared and writable"
    run = ctx.probes()
    if run.error and not run.records:
        return Result(name, FAIL, f"the probe job did not start: {run.error}", run.fix)
    seen = {p["rank"] for p in run.records if p.get("run_root_rw")}
    missing = sorted(set(range(run.expected)) - seen)
    if missing:
        return Result(name, FAIL, f"{run.out} was not written by rank(s) {missing} of "
                      f"{_where(ctx)}: the run root is not shared with (or not writable on) "
                      f"those nodes", "put the run root on a file system every node mounts "
                      "(profile run_root or LABKIT_RUN_ROOT), e.g. /shared/$USER/runs")
    blind = [p["rank"] for p in run.records if p.get("ports_seen") is False]
    if blind:
        return Result(name, FAIL, f"rank(s) {blind} wrote {run.out} but never saw rank 0's "
                      f"file there: not the same folder on every node", "mount one shared run "
                      "root on all nodes (NFS/Lustre), not a node-local path like /tmp")
    return Result(name, PASS, f"{run.out.parent} written and read back by {_where(ctx)}")


def check_master(ctx: Context) -> Result:
    name = "MASTER_ADDR and port"
    run = ctx.probes()
    if not run.records:
        return Result(name, FAIL, f"no probe results ({run.error})", run.fix)
    head = next((p for p in run.records if p["rank"] == 0), run.records[0])
    addr, ip = head.get("master_addr"), head.get("master_ip")
    how = head.get("master_how")
    if head.get("master_error") or not ip:
        return Result(name, FAIL, f"MASTER_ADDR {addr!r} does not resolve on the head node: "
                      f"{head.get('master_resolve_error') or head.get('master_error')}",
                      "use the head node's address (profile master_addr_from: nodeaddr) or fix "
                      "DNS / /etc/hosts for the node names")
    detail = f"MASTER_ADDR {addr} ({how}) -> {ip}"
    if head.get("master_nodeaddr"):
        detail += f" via Slurm NodeAddr {head['master_nodeaddr']} (its name resolves to loopback)"
        if ctx.profile is not None and ctx.profile.master_addr_from == "hostname":
            return Result(name, FAIL, detail + "; but the profile's job scripts use the host "
                          "name, which other nodes cannot reach",
                          "set master_addr_from: nodeaddr in the cluster profile")
    unreachable = [f"rank {p['rank']} ({p.get('hostname')}): {p.get('ping', {}).get('error')}"
                   for p in run.records if not p.get("ping", {}).get("ok")]
    if unreachable:
        return Result(name, FAIL, detail + f"; port {head.get('ports', {}).get('ping')} on it is "
                      f"not reachable from: " + "; ".join(unreachable),
                      "open the port range between nodes (firewall/security group), check that "
                      "MASTER_ADDR is the head's address on the inter-node network")
    if head.get("port_free") is False:
        return Result(name, WARN, detail + f"; {head.get('port_error')} is taken on the head "
                      "node (another job, or the whole class on one port)",
                      "give each user/job its own MASTER_PORT (e.g. 29500 + uid % 1000)")
    rtt = [round(p["ping"]["rtt_ms"], 2) for p in run.records if p["rank"] != 0]
    return Result(name, PASS, detail + f"; port {head.get('ports', {}).get('wanted')} free on "
                  f"the head and reached from every rank (RTT ms: {rtt or '-'})")


def check_clock(ctx: Context) -> Result:
    name = "clock skew"
    run = ctx.probes()
    skews = {p["rank"]: p["ping"]["skew_s"] for p in run.records
             if p.get("ping", {}).get("ok") and p["rank"] != 0}
    if run.mode == "local":
        return Result(name, PASS, "one machine, one clock")
    if not skews:
        return Result(name, WARN, "not measured: no node reached the head node", "see the "
                      "MASTER_ADDR and port check")
    worst = max(abs(v) for v in skews.values())
    detail = f"offset from the head node: {', '.join(f'rank {r}: {v:+.3f}s' for r, v in skews.items())}"
    if worst > SKEW_FAIL_S:
        return Result(name, FAIL, detail, "start chrony/ntpd on every node: timestamps in logs "
                      "and Slurm's time limits disagree")
    if worst > SKEW_WARN_S:
        return Result(name, WARN, detail, "sync the clocks (chrony/ntpd); log timelines across "
                      "nodes will not line up")
    return Result(name, PASS, detail)


def check_interface(ctx: Context) -> Result:
    name = "network interface (NCCL/gloo)"
    run = ctx.probes()
    if not run.records:
        return Result(name, FAIL, f"no probe results ({run.error})", run.fix)
    problems, seen = [], []
    for p in run.records:
        env = p.get("ifname_env", {})
        var = "NCCL_SOCKET_IFNAME" if ctx.wants_cuda else "GLOO_SOCKET_IFNAME"
        want = env.get(var)
        ifs, dev = p.get("interfaces", []), p.get("route_dev")
        who = f"rank {p['rank']} ({p.get('hostname')})"
        if want:
            names = [w.lstrip("^=") for w in want.split(",")]
            if not want.startswith("^") and not any(i.startswith(n) for n in names for i in ifs):
                problems.append(f"{who}: {var}={want} but the node has {ifs}")
            elif dev and not want.startswith("^") and not any(dev.startswith(n) for n in names):
                problems.append(f"{who}: {var}={want} but the route to MASTER_ADDR leaves by {dev}")
            seen.append(f"{who}: {var}={want}, route via {dev}")
        else:
            ip = p.get("hostname_ip") or ""
            seen.append(f"{who}: {var} unset, hostname -> {ip}, route via {dev}")
            if run.mode == "slurm" and run.expected > 1 and ip.startswith("127."):
                problems.append(f"{who}: {var} is unset and the hostname resolves to {ip} "
                                f"(loopback): peers on other nodes cannot reach it")
    if problems:
        dev = next((p.get("route_dev") for p in run.records if p.get("route_dev")), "eth0")
        return Result(name, FAIL, "; ".join(problems),
                      f"export GLOO_SOCKET_IFNAME={dev} (and NCCL_SOCKET_IFNAME={dev} on GPUs) "
                      f"in the profile's env: the interface of the inter-node network")
    return Result(name, PASS, "; ".join(seen))


def check_allreduce(ctx: Context) -> Result:
    name = "all-reduce across nodes"
    run = ctx.probes()
    if not run.records:
        return Result(name, FAIL, f"no probe results ({run.error})", run.fix)
    done = [p for p in run.records if p.get("allreduce", {}).get("ok")]
    if len(done) == run.expected and not run.timed_out:
        secs = max(p["allreduce"]["seconds"] for p in done)
        return Result(name, PASS, f"gloo all-reduce over {_where(ctx)} finished in {secs:.2f}s "
                      f"(sum {done[0]['allreduce']['value']:.0f} = world size)")
    stuck = {p["rank"]: p.get("allreduce", {}).get("error") or f"stopped in phase {p['phase']}"
             for p in run.records if p not in done}
    lost = sorted(set(range(run.expected)) - {p["rank"] for p in run.records})
    detail = (f"all-reduce over {_where(ctx)} did not finish within {ctx.phase_s:.0f}s"
              if run.timed_out else f"all-reduce over {_where(ctx)} failed")
    detail += f": {stuck}" + (f"; no report from rank(s) {lost}" if lost else "")
    return Result(name, FAIL, detail, "a hang here is a hang in training: check the interface "
                  "and MASTER_ADDR checks above, the firewall between nodes, and that every "
                  "node runs the same torch; rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL")


CHECKS: list[tuple[str, CheckFn]] = [
    ("python", check_python),
    ("gpus", check_gpus),
    ("slurm", check_slurm),
    ("accounting", check_accounting),
    ("probe_job", sitechecks.check_probe_job),
    ("run_root", check_run_root),
    ("data", sitechecks.check_data),
    ("master", check_master),
    ("clock", check_clock),
    ("ulimit", check_ulimit),
    ("interface", check_interface),
    ("hostfile", check_hostfile),
    ("hostfile_port", check_hostfile_port),
    ("hostfile_interface", check_hostfile_interface),
    ("allreduce", check_allreduce),
]
# `labkit doctor --class` (the instructor), after the checks above.
CLASS_CHECKS: list[tuple[str, CheckFn]] = [
    ("class_run_root", sitechecks.check_class_run_root),
    ("class_fit", sitechecks.check_class_fit),
    ("class_solutions", sitechecks.check_class_solutions),
]
