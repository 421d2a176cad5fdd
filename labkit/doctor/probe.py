"""The doctor's probe job on Slurm: a job like any other, waited for within a bound.

The probe (``code/doctor_probe.py`` in the site's ``code_dir``) is the program of a job script
rendered and submitted by the Slurm backend (``labkit.backends.slurm.submit``, which renders
with ``labkit.render.render_sbatch``): the site's partition, account, qos, ``sbatch_extra``
(a reservation, a constraint), modules, setup lines, container and environment all apply, as
they do to a training run. The doctor then waits at most ``timeout_s`` seconds, queue included.
When it gives up it says what it waited for: the job id, its state and Slurm's queue reason
(``squeue -h -j ID -o %r``), with the fix for that reason, and it cancels the job.
"""

from __future__ import annotations

import math
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit import slurmcli
from labkit.backends import slurm
from labkit.errors import LabkitError
from labkit.paths import CODE_DIR
from labkit.run.spec import JobSpec
from labkit.site import ClusterProfile
from labkit.slurmcli import SlurmError

# Slurm's queue reasons (squeue %r) -> what to do about them.
QUEUE_FIXES = [
    ("PartitionDown", "the partition is DOWN: ask the admins to bring it up (`scontrol update "
                      "PartitionName={partition} State=UP`), or set another partition in the site "
                      "profile"),
    ("PartitionInactive", "the partition is INACTIVE: ask the admins, or use another partition"),
    ("PartitionNodeLimit", "the job asks more nodes than the partition has or allows per job: "
                           "lower --nodes (scontrol show partition {partition}: TotalNodes, "
                           "MaxNodes)"),
    ("PartitionTimeLimit", "the job's time limit exceeds the partition's: lower time_limit in "
                           "the site profile"),
    ("ReqNodeNotAvail", "nodes it needs are down, drained or reserved: `sinfo -R` says why; "
                        "ask for fewer nodes, or use the class's reservation (sbatch_extra: "
                        "--reservation=NAME)"),
    ("NodeDown", "a node it needs is down: `sinfo -R` says why; ask the admins"),
    ("Reservation", "the job waits for its reservation to start: check `scontrol show "
                    "reservation` (start time, users, nodes)"),
    ("Resources", "the partition's nodes are busy or fewer are up than asked: wait for them, "
                  "ask for fewer nodes (--nodes), or book a reservation for the class"),
    ("Priority", "other jobs are ahead in the queue: wait, or book a reservation for the class"),
    ("Assoc", "an account/association limit holds it: `sacctmgr show assoc user=$USER` "
              "(GrpTRES, MaxJobs); ask the admins to raise it for the class"),
    ("QOS", "a QOS limit holds it: `sacctmgr show qos`; set another qos in the site profile"),
    ("BeginTime", "the job was told to start later (--begin in sbatch_extra?)"),
    ("Dependency", "the job waits for another job (--dependency in sbatch_extra?)"),
    ("JobHeld", "the job is held: `scontrol release JOBID`, or look for --hold in sbatch_extra"),
]


@dataclass
class ProbeRun:
    """What the per-node probes reported (one record per rank that wrote anything)."""

    mode: str
    expected: int
    out: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    timed_out: bool = False
    error: str = ""
    fix: str = ""
    seconds: float = 0.0
    job_id: str | None = None
    """The Slurm probe job's id (None for local probes or when sbatch refused it)."""
    waited: str = ""
    """What the doctor waited for when it gave up: job id, state and queue reason."""
    queued_s: float | None = None
    """Seconds the Slurm job waited in the queue before it started (None: never started)."""


def queue_fix(reason: str, partition: str | None) -> str:
    """The fix for one of Slurm's queue reasons (``squeue %r``)."""
    for key, fix in QUEUE_FIXES:
        if reason.startswith(key) or (key in ("Assoc", "QOS") and key in reason):
            return fix.format(partition=partition or "PARTITION")
    return (f"see why with `squeue -j JOBID -o %r` and `sinfo -p {partition or 'PARTITION'}`; "
            f"ask the admins what the reason {reason or '(none)'!r} means on this site")


def job_state(job_id: str, slurm_conf: str | None) -> tuple[str | None, str]:
    """(Slurm state, queue reason) of a job (``squeue -j ID -t all``); state None
    when squeue no longer lists it (finished and forgotten), ``UNKNOWN`` when squeue fails."""
    try:
        rec = slurmcli.queued_job(slurm_conf, job_id)
    except SlurmError as e:
        return "UNKNOWN", f"squeue does not answer: {e.message[:200]}"
    return (rec[0], rec[1]) if rec else (None, "")


FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED")


def slurm_probe(cluster: ClusterProfile, out: Path, nodes: int, probe_args: list[str], *,
                timeout_s: float, gpu: bool) -> ProbeRun:
    """Submit the probe as a job of ``nodes`` nodes (one task each, one GPU each with ``gpu``),
    wait for it at most ``timeout_s`` seconds, cancel it if it is still there, and return what
    its ranks wrote to ``out`` (the job's run directory)."""
    run = ProbeRun("slurm", nodes, out)
    spec = JobSpec(name=f"labkit-doctor-{out.name[-6:]}", nodes=nodes, gpus_per_node=1,
                   device="cuda" if gpu else "cpu", layout="doctor probe: one task per node")
    # A short time limit (the job needs less than the doctor waits) helps the scheduler
    # backfill it; everything else is the site's, as for every job.
    site = cluster.replace(time_limit=str(max(2, math.ceil(timeout_s / 60) + 1)))
    program = Path(cluster.code_dir or CODE_DIR) / "doctor_probe.py"
    t0 = time.time()
    try:
        job = slurm.submit(spec, out, cluster=site, program=program, program_args=probe_args)
    except LabkitError as e:
        msg, _, hint = str(e).partition("\nTry: ")
        run.error, run.fix = msg, hint or "check the site profile's Slurm options"
        return run
    run.job_id = job.job_id
    state, reason, started = None, "", None
    while True:
        state, reason = job_state(job.job_id, cluster.slurm_conf)
        if started is None and state not in (None, "PENDING", "CONFIGURING"):
            started = time.time()
        if state is None or state in FINISHED or (out / "exit_code").exists():
            break
        if time.time() - t0 > timeout_s:
            run.timed_out = True
            break
        time.sleep(1.0)
    run.queued_s = started - t0 if started else None
    if run.timed_out:
        what = (f"probe job {job.job_id} ({nodes} node(s)) still {state} after {timeout_s:.0f}s"
                + (f", queue reason: {reason}" if reason and reason != "None" else ""))
        run.waited = what
        try:
            slurm.cancel(job)
            what += "; the doctor cancelled it"
        except LabkitError as e:
            what += f"; cancelling it failed: {e}"
        if state in ("PENDING", "CONFIGURING", "REQUEUED"):
            run.error = what
            run.fix = queue_fix(reason, cluster.partition)
        else:  # it ran but did not finish: the checks show how far each node got
            run.error, run.fix = what, ("see the all-reduce and interface checks; rerun with a "
                                        "larger --timeout if the nodes are merely slow")
            time.sleep(1.0)  # let the cancelled ranks stop writing
    run.seconds = time.time() - t0
    if not run.timed_out and not any(out.glob("rank-*.json")):
        code = (out / "exit_code").read_text().strip() if (out / "exit_code").exists() else "?"
        tail = _log_tail(out / "log.txt")
        run.error = (f"probe job {job.job_id} ended ({state or 'gone from squeue'}, exit {code}) "
                     f"without any node reporting" + (f": {tail}" if tail else ""))
        run.fix = ("check the site profile's modules, setup lines and container: the job "
                   f"runs {program} with {cluster.torchrun} on the nodes")
    return run


def _log_tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    keep = [ln for ln in text if not ln.startswith("[job]")]
    return " | ".join(keep[-lines:])[-600:]


def local_probes(probe: list[str], n: int, master: str, env: dict[str, str],
                 wall: float) -> tuple[list[str], bool]:
    """Two (``n``) probe processes on this machine; (their last stderr lines, timed out)."""
    procs = [subprocess.Popen(probe + ["--rank", str(r), "--world", str(n), "--master-addr",
                                       master], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for r in range(n)]
    errs, timed_out, t0 = [], False, time.time()
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=max(1.0, wall - (time.time() - t0)))
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            _, err = proc.communicate()
        if proc.returncode not in (0, None) and err.strip():
            errs.append(err.strip().splitlines()[-1])
    return errs, timed_out
