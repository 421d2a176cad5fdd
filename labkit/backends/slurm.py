"""The Slurm backend: ``sbatch --parsable`` to submit; state from squeue, scontrol, the run's
``exit_code`` file and sacct, in that order; ``scancel JOBID`` for labkit's own jobs only.

Every Slurm command goes through ``labkit.slurmcli``, the one door tests replace with a FakeSlurm
for what a real Slurm cannot produce on demand (sbatch refusing, squeue unreachable).

Why this order: squeue lists live jobs (and, with ``-t all``, finished ones for MinJobAge);
``scontrol show job`` keeps a finished job a little longer; ``exit_code`` is written by the job
script itself, so a COMPLETED/FAILED answer never depends on accounting; sacct comes last
because a cluster without slurmdbd (like the mini-cluster) answers "accounting storage is
disabled". Jobs are named ``labkit-<user>-<run>`` (``labkit.site.slurm_job_name``), so that
``squeue`` says whose they are; the record keeps the name sbatch was given. A Slurm job whose
name is not that name is not ours: a job id can be reused by a restarted controller, and labkit
must never act on someone else's job.
"""

from __future__ import annotations

import getpass
import os
import time
from collections.abc import Sequence
from pathlib import Path

from labkit import slurmcli
from labkit._logging import warn_once
from labkit.backends.job import Job
from labkit.errors import LabkitError, SubmissionError
from labkit.render import render_sbatch, sbatch_options
from labkit.run.attempts import attempts
from labkit.run.spec import JobSpec
from labkit.run.state import JobState
from labkit.site import ClusterProfile
from labkit.slurmcli import SlurmError

# Slurm's job states -> ours. Transitional ones count as the state they lead to.
SLURM_STATES = {
    "PENDING": JobState.PENDING, "CONFIGURING": JobState.PENDING, "REQUEUED": JobState.REQUEUED,
    "REQUEUE_HOLD": JobState.REQUEUE_HOLD, "REQUEUE_FED": JobState.REQUEUED,
    "RESV_DEL_HOLD": JobState.PENDING,
    "RUNNING": JobState.RUNNING, "COMPLETING": JobState.RUNNING, "SUSPENDED": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING, "SIGNALING": JobState.RUNNING, "RESIZING": JobState.RUNNING,
    "STOPPED": JobState.RUNNING,
    "COMPLETED": JobState.COMPLETED, "FAILED": JobState.FAILED, "CANCELLED": JobState.CANCELLED,
    "TIMEOUT": JobState.TIMEOUT, "DEADLINE": JobState.DEADLINE,
    "OUT_OF_MEMORY": JobState.OUT_OF_MEMORY, "NODE_FAIL": JobState.NODE_FAIL,
    "BOOT_FAIL": JobState.BOOT_FAIL, "PREEMPTED": JobState.PREEMPTED,
    "SPECIAL_EXIT": JobState.FAILED, "REVOKED": JobState.CANCELLED,
}
_SBATCH_HINTS = [
    ("Requested node configuration is not available",
     "no partition has that many nodes/CPUs/GPUs: compare nodes x gpus_per_node and the "
     "profile's cpus_per_task with `sinfo -N -l`"),
    ("Invalid account", "set `account:` in the cluster profile (`sacctmgr show assoc user=$USER`)"),
    ("invalid partition", "set `partition:` in the cluster profile (`sinfo -s` lists them)"),
    ("Invalid qos", "set or remove `qos:` in the cluster profile"),
    ("time limit", "lower time_limit in the cluster profile (`sinfo -o '%P %l'` shows maxima)"),
    ("Unable to contact slurm controller",
     "slurmctld is not answering: on this machine `sudo labkit cluster up`; on a site, ask its "
     "admins"),
]
POLL_TTL = 1.0  # seconds: jobs polled within this window share one squeue call
_poll_cache: dict[str | None, tuple[float, dict[str, tuple[str, str]] | None]] = {}


def preflight(cluster: ClusterProfile) -> None:
    """Fail before anything is written when there is no Slurm to submit to."""
    if not slurmcli.has_sbatch(cluster.slurm_conf):
        raise SubmissionError("no sbatch on PATH: use backend='local' or run `labkit cluster up` "
                              "(a real Slurm mini-cluster on this machine, as root)")


def submit(spec: JobSpec, run_dir: Path, *, cluster: ClusterProfile,
           program: str | Path | None = None, program_args: Sequence[str] | None = None) -> Job:
    """Render ``job.sh`` for ``cluster`` and ``sbatch`` it; SubmissionError with a fix if refused."""
    script = run_dir / "job.sh"
    script.write_text(render_sbatch(spec, cluster, run_dir, program=program,
                                    program_args=program_args))
    script.chmod(0o755)
    # --output and --job-name again on the command line: they win over the #SBATCH lines.
    opts = [o for o in sbatch_options(spec, cluster, run_dir)
            if o.startswith(("--output=", "--job-name="))]
    try:
        job_id = slurmcli.sbatch(opts, script, cluster.slurm_conf, cwd=run_dir)
    except SlurmError as e:
        if e.returncode == 0:
            raise SubmissionError(e.message) from None
        hint = next((h for k, h in _SBATCH_HINTS if k.lower() in e.message.lower()),
                    f"check the #SBATCH lines of {script} against `sinfo`")
        if e.returncode == 127:
            hint = "use backend='local' or run `labkit cluster up`"
        raise SubmissionError(f"sbatch refused run {spec.name!r} (exit {e.returncode}): "
                              f"{e.message}\nTry: {hint}") from None
    name = next(o.split("=", 1)[1] for o in opts if o.startswith("--job-name="))
    return Job(job_id=job_id, name=spec.name, run_dir=run_dir, backend="slurm",
               info={"slurm_conf": cluster.slurm_conf, "cluster": cluster.name,
                     "slurm_job_name": name})


def job_name(job: Job) -> str:
    """The Slurm job name of a labkit job: the one sbatch was given, as its record keeps it
    (``labkit-<user>-<run>``); for a record without it (labkit named jobs by the run's name
    alone before), the run's name."""
    name = job.info.get("slurm_job_name")
    return name if isinstance(name, str) and name else job.name


def _down_hint(where: str) -> str:
    return (f"the Slurm controller at {where} is not answering (fix: on this machine `sudo labkit "
            f"cluster up`; on a site, `scontrol ping` and ask its admins)")


# --- state -------------------------------------------------------------------------------------
def _squeue(conf: str | None) -> dict[str, tuple[str, str]] | None:
    """{job id: (Slurm state, job name)} for this user's jobs, or None if squeue failed (or
    the controller does not accept a connection: then squeue is not asked)."""
    now = time.time()
    hit = _poll_cache.get(conf)
    if hit and now - hit[0] < POLL_TTL:
        return hit[1]
    down = slurmcli.controller_down(conf)
    if down:
        warn_once(f"{_down_hint(down)}; showing what the runs' own exit_code files say, UNKNOWN "
                  f"where there is none")
        _poll_cache[conf] = (now, None)
        return None
    out: dict[str, tuple[str, str]] | None
    try:
        out = slurmcli.my_jobs(conf, getpass.getuser())
    except SlurmError as e:
        warn_once(f"Slurm does not answer (squeue exit {e.returncode}: {e.first_line}); showing "
                  f"what the runs' own exit_code files say, UNKNOWN where there is none")
        out = None
    _poll_cache[conf] = (now, out)
    return out


def _scontrol(conf: str | None, job_id: str) -> tuple[str, str] | None:
    """(state, name) of a job of this user that scontrol still knows; another user's job of
    that id answers None (it is not ours, whatever its name)."""
    rec = slurmcli.job_record(conf, job_id)
    if rec is None or (rec[2] is not None and rec[2] != os.geteuid()):
        return None
    return rec[0], rec[1]


def _map(slurm_state: str) -> JobState:
    # "CANCELLED by 0" -> CANCELLED
    return SLURM_STATES.get(slurm_state.split()[0].rstrip("+"), JobState.UNKNOWN)


def states(jobs: list[Job]) -> dict[str, JobState]:
    """One squeue call per cluster for all the jobs; fall-backs only for the ones it lacks."""
    out: dict[str, JobState] = {}
    for j in jobs:
        conf = j.info.get("slurm_conf")
        live = _squeue(conf)
        rec = live.get(j.job_id) if live is not None else None
        if rec is None and live is not None:  # squeue failing means scontrol would wait too
            rec = _scontrol(conf, j.job_id)
        if rec is not None and rec[1] == job_name(j):
            out[j.job_id] = _map(rec[0])
            continue
        code = j.exit_code()
        if code is not None:  # Slurm forgot the job; its own script recorded how it ended
            out[j.job_id] = JobState.COMPLETED if code == 0 else JobState.FAILED
            continue
        acct = slurmcli.accounted_state(conf, j.job_id) if live is not None else None
        out[j.job_id] = _map(acct) if acct else JobState.UNKNOWN
    return out


def cancel(job: Job) -> None:
    """``scancel JOBID`` after checking that Slurm's job of that id is this run's job."""
    conf = job.info.get("slurm_conf")
    down = slurmcli.controller_down(conf)
    if down:
        raise LabkitError(f"cannot cancel Slurm job {job.job_id} (run {job.name!r}): "
                          f"{_down_hint(down)}")
    rec = (_squeue(conf) or {}).get(job.job_id) or _scontrol(conf, job.job_id)
    if rec is None:
        raise LabkitError(f"Slurm does not know job {job.job_id} (run {job.name!r}) any more; "
                          f"nothing to cancel")
    if rec[1] != job_name(job):
        raise LabkitError(f"Slurm job {job.job_id} is named {rec[1]!r}, not {job_name(job)!r} "
                          f"(run {job.name!r}): it is not the job labkit submitted, so labkit "
                          f"left it alone")
    try:
        slurmcli.scancel(conf, job.job_id)
    except SlurmError as e:
        raise LabkitError(f"scancel {job.job_id} failed (exit {e.returncode}): {e.message}") from None
    finally:
        _poll_cache.clear()


# --- why Slurm ended it, and what comes next ---------------------------------------------------
STOPPED_ON_WARNING = 75  # code/engine_stop.py: saved a checkpoint on the warning signal, stopped
_SLURM_SAID = {
    JobState.NODE_FAIL: "a node of the job failed (NODE_FAIL)",
    JobState.PREEMPTED: "a higher-priority job preempted it (PREEMPTED)",
    JobState.BOOT_FAIL: "a node failed to boot for it (BOOT_FAIL)",
    JobState.TIMEOUT: "it reached its time limit (TIMEOUT)",
    JobState.DEADLINE: "its deadline passed (DEADLINE)",
}


def _checkpoint(job: Job) -> int | None:
    try:
        text = (job.run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text()
    except OSError:
        return None
    return int(text) if text.strip().isdigit() else None


def failure_hint(job: Job, state: JobState) -> str | None:
    """For a job a node failure, a preemption, a time limit or the warning signal ended: what
    Slurm said, how its last attempt ended (its log), which nodes are out of service and why,
    and how to go on from the last checkpoint (read by ``labkit.backends.diagnosis``); None for
    other failures, which the log parser's diagnosis explains."""
    stopped = job.exit_code() == STOPPED_ON_WARNING
    if state not in _SLURM_SAID and not stopped:
        return None
    said = _SLURM_SAID.get(state) or ("the training saved a checkpoint on Slurm's warning signal "
                                      "(time limit or preemption) and stopped (exit code 75)")
    parts = [f"Slurm ended job {job.job_id}: {said}"]
    try:
        runs = attempts(job.log_path.read_text(errors="replace"))
    except OSError:
        runs = []
    if runs and runs[-1].reason:
        last = runs[-1]
        at = (f" at iteration {last.last_iteration}" if last.last_iteration is not None
              and "iteration" not in last.reason else "")
        parts.append(f"attempt {last.number} ended: {last.reason}{at}")
    down = slurmcli.out_of_service(job.info.get("slurm_conf"))
    if down:
        parts.append("out of service: " + ", ".join(f"{n} {st} ({why})"
                                                    for n, (st, why) in sorted(down.items())))
    ckpt = _checkpoint(job)
    again = (f"its last checkpoint is iteration {ckpt}: `labkit submit CONFIG --resume` goes on "
             f"from there" if ckpt is not None else
             "it saved no checkpoint (save_interval): resubmitting starts over")
    parts.append(again + "; with `requeue: true` in the site profile Slurm requeues such a job "
                         "by itself and it resumes on its own")
    return "; ".join(parts)
