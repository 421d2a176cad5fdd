"""A node fails under a running job, on purpose: what notebook 08 does to the student's own run.

``fail_node(job, node)`` makes node ``node`` (0: the head) of a running multi-node job fail the
way a dead node does:

- local backend: every process of that simulated node, its torchrun agent and its ranks, gets
  SIGKILL at once (no chance to save, as when a machine loses power); the other nodes' ranks
  then fail on their next collective with the dead peer, and the job ends FAILED;
- Slurm: the node is set DOWN (``scontrol update nodename=NODE state=down reason=...``, an
  administrator's command: root on the mini-cluster); Slurm ends the job's step on it and, with
  ``requeue: true`` in the site profile, puts the job back in the queue. ``restore_node``
  brings the node back (``state=resume``); call it in a ``finally``.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from labkit import slurmcli
from labkit.errors import LabkitError

REASON = "labkit: node failure on purpose (notebook 08)"


def _node_processes(pgid: int, node: int) -> list[Any]:
    """The torchrun agent of simulated node ``node`` in process group ``pgid``, and all its
    descendants (the ranks and their helpers)."""
    import psutil  # only where a node is failed on purpose

    agents = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            argv = p.info["cmdline"] or []
            if os.getpgid(p.pid) != pgid or "--node_rank" not in argv:
                continue
            at = argv.index("--node_rank")
            if at + 1 < len(argv) and argv[at + 1] == str(node) and any(
                    "torchrun" in a or "torch.distributed.run" in a for a in argv[:at]):
                agents.append(p)
        except (psutil.Error, OSError, ValueError):
            continue
    out = []
    for a in agents:
        try:
            out += [a, *a.children(recursive=True)]
        except psutil.Error:
            continue
    return out


def fail_node(job: Any, node: int = 1, *, reason: str = REASON) -> str:
    """Make ``node`` of the running ``job`` fail now; returns what was done, in one line (the
    Slurm node's name is in it: pass it to ``restore_node``)."""
    if isinstance(node, bool) or not isinstance(node, int) or node < 0:
        raise LabkitError(f"node={node!r} must be a node index of the job: 0 (the head), 1, ...")
    if job.backend == "local":
        pgid = job.info.get("pgid")
        procs = _node_processes(int(pgid), node) if isinstance(pgid, int) else []
        if not procs:
            raise LabkitError(f"job {job.job_id} ({job.name}) has no running node {node} (a "
                              f"torchrun agent with --node_rank {node}): is it still running, "
                              f"with more than {node} node(s)?")
        for p in procs:
            try:
                p.send_signal(signal.SIGKILL)
            except Exception:  # noqa: BLE001 - gone already: that is the point
                pass
        return (f"killed node {node} of job {job.job_id}: its torchrun agent and "
                f"{len(procs) - 1} process(es) under it (SIGKILL)")
    if job.backend == "slurm":
        conf = job.info.get("slurm_conf")
        fields = slurmcli.job_fields(conf, job.job_id) or {}
        names = slurmcli.hostnames(conf, fields.get("NodeList", ""))
        if fields.get("JobState") != "RUNNING" or node >= len(names):
            raise LabkitError(f"Slurm job {job.job_id} is {fields.get('JobState', 'unknown')} on "
                              f"{names or 'no nodes'}: it has no running node {node}")
        slurmcli.set_node_state(conf, names[node], "down", reason)
        return f"set {names[node]} DOWN under job {job.job_id} (reason: {reason})"
    raise LabkitError(f"fail_node() knows the local and Slurm backends, not {job.backend!r}")


def restore_node(job: Any, name: str) -> None:
    """Bring Slurm node ``name`` back into service after ``fail_node`` (``state=resume``); a
    requeued job waiting for its BeginTime (Slurm holds a requeued job about 2 minutes) may
    start sooner: KillWait + 5 s later (so the old attempt has ended on every node first),
    ``scontrol update jobid=ID StartTime=now``, the administrator's shortcut."""
    conf = job.info.get("slurm_conf")
    slurmcli.set_node_state(conf, name, "resume")
    fields = slurmcli.job_fields(conf, job.job_id) or {}
    if fields.get("JobState") == "PENDING" and fields.get("Reason") == "BeginTime":
        # A requeued job keeps its id: the node's slurmd may still be ending the old attempt's
        # step (SIGTERM, KillWait seconds, SIGKILL), and would end a new step of the same job
        # started there meanwhile. So not at once: after KillWait and 5 s more (waited here:
        # a later StartTime would wait for Slurm's next scheduling pass too).
        time.sleep(slurmcli.kill_wait(conf) + 5)
        slurmcli.start_now(conf, job.job_id)


def wait_for_checkpoint(job: Any, iteration: int, timeout: float = 600.0) -> int:
    """Block until the job's last complete checkpoint is at ``iteration`` or later; returns
    it. LabkitError when the job ends first or ``timeout`` seconds pass."""
    tracker = job.run_dir / "checkpoints" / "latest_checkpointed_iteration.txt"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            text = tracker.read_text().strip()
        except OSError:
            text = ""
        if text.isdigit() and int(text) >= iteration:
            return int(text)
        if job.state().finished:
            break
        time.sleep(0.2)
    raise LabkitError(f"job {job.job_id} ({job.name}) has no checkpoint of iteration {iteration} "
                      f"(it is {job.state()}; {tracker} says {text or 'nothing'}); give the run "
                      f"a save_interval <= {iteration} and train_iters above it")
