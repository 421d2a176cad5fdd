"""The hostfile backend: a job on a site's hosts over ssh, without a scheduler.

As the gpt-neox, LMFlow and DeepSpeed multi-node guides do: the cluster profile lists the hosts
(name, address, slots; or an existing DeepSpeed hostfile) and a ``launcher``:

- ``pdsh``: ``pdsh -R ssh`` runs ``job.sh node RANK PORT`` on every host, which starts one
  torchrun agent with ``--nnodes N --node_rank RANK --master_addr HEAD``;
- ``deepspeed``: the DeepSpeed launcher (``deepspeed --hostfile hostfile --master_addr HEAD
  ...``), which reaches the hosts with pdsh itself and passes ``--local_rank``.

``submit`` checks before anything starts that the job fits the hosts (world size against their
slots), that the launcher is installed and that every host answers ssh; it writes ``hostfile``
and ``job.sh`` into the run directory (which every host must see) and starts ``job.sh`` here as the
local backend starts its launcher (``local.start_launcher``: its own session, stdout/stderr in
``log.txt``, a free rendezvous port); the script writes ``exit_code``.

Every process the job starts on a host carries a random token in its environment
(``LABKIT_JOB_TOKEN``). ``states`` reads the launcher here and ``exit_code``; ``cancel`` ends
the launcher and, over ssh on every host, exactly the processes with the job's token in that
host's network namespace (on the mini-cluster the nodes share one process table), SIGTERM then
SIGKILL. A host that ssh no longer reaches when the job ends is named in ``hosts/lost``; the job
is then NODE_FAIL, with the host in the log. A host whose agent ended without reporting its exit
code (pdsh launcher) is lost too: the job is FAILED, and ``failure_hint`` names the host.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path

from labkit.backends.job import Job
from labkit.backends.local import launcher_alive, reap, start_launcher
from labkit.errors import LabkitError, SubmissionError
from labkit.render import job_hosts, render_hostfile_launch, render_site_hostfile
from labkit.run.spec import JobSpec
from labkit.run.state import JobState
from labkit.site import ClusterProfile

CANCELLED_MARK = "cancelled"
TOKEN_ENV = "LABKIT_JOB_TOKEN"
# '--': the host name that follows is never read as an option
SSH = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "--"]
# On a host: the pids of this network namespace's processes carrying the token, then signal
# them. Bash and /proc only, so it runs on any Linux host (the token is hex: no quoting issue).
_REMOTE_KILL = r"""
t={token}; me=$(readlink /proc/self/ns/net)
find() {{ for f in $(grep -lzx "LABKIT_JOB_TOKEN=$t" /proc/[0-9]*/environ 2>/dev/null); do
  p=${{f%/environ}}; [ "$(readlink $p/ns/net 2>/dev/null)" = "$me" ] && echo ${{p#/proc/}}
done; }}
pids=$(find); [ -z "$pids" ] && exit 0
kill -TERM $pids 2>/dev/null
for i in $(seq 1 {grace}); do sleep 1; pids=$(find); [ -z "$pids" ] && exit 0; done
kill -KILL $pids 2>/dev/null; sleep 1; pids=$(find); [ -z "$pids" ] || {{ echo "left: $pids"; exit 1; }}
"""
def _ssh_ok(host: str) -> str | None:
    """None when ``ssh host true`` works, else why not."""
    try:
        p = subprocess.run([*SSH, host, "true"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "no answer in 30 s"
    return None if p.returncode == 0 else (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]


def preflight(spec: JobSpec, cluster: ClusterProfile) -> list:
    """Fail before anything starts: hosts and slots, the launcher, ssh to every host."""
    hosts = job_hosts(spec, cluster)  # ConfigError: the job does not fit the hostfile
    if not shutil.which("pdsh"):
        raise SubmissionError("pdsh is not installed here (both launchers use it to reach the "
                              "hosts): apt-get install pdsh (and openssh-client)")
    if cluster.launcher == "deepspeed" and find_spec("deepspeed") is None:
        raise SubmissionError("launcher: deepspeed, but the deepspeed package is not installed "
                              "in this Python: pip install -e .[deepspeed] (or use launcher: pdsh)")
    bad = [f"{h.name}: {why}" for h in hosts if (why := _ssh_ok(h.name))]
    if bad:
        raise SubmissionError(f"passwordless ssh fails to {len(bad)} of {len(hosts)} host(s): "
                              + "; ".join(bad) + ". Fix ssh (keys, known_hosts, sshd) first; "
                              "`labkit doctor --cluster PROFILE` checks every host")
    return hosts


def submit(spec: JobSpec, run_dir: Path, *, cluster: ClusterProfile,
           program: str | Path | None = None, program_args: Sequence[str] | None = None) -> Job:
    """Render ``hostfile`` and ``job.sh`` for ``cluster`` and start the launcher here."""
    hosts = preflight(spec, cluster)
    (run_dir / CANCELLED_MARK).unlink(missing_ok=True)
    (run_dir / "hostfile").write_text(render_site_hostfile(hosts))
    script = run_dir / "job.sh"
    script.write_text(render_hostfile_launch(spec, cluster, run_dir, program=program,
                                             program_args=program_args))
    script.chmod(0o755)
    info = {"launcher": cluster.launcher, "cluster": cluster.name,
            "hosts": [h.name for h in hosts], "master_addr": hosts[0].address}
    return start_launcher(spec.name, run_dir, "hostfile", info=info)


def unreachable_hosts(job: Job) -> list[str]:
    """Hosts the job's script found unreachable by ssh when the job ended (``hosts/lost``)."""
    try:
        return (job.run_dir / "hosts" / "lost").read_text().split()
    except OSError:
        return []


def lost_hosts(job: Job) -> list[str]:
    """Hosts the job lost, once it ended (not by a cancel): those ssh no longer reached, and,
    with the pdsh launcher, those whose agent never wrote its exit code (``hosts/RANK.exit``):
    its processes were killed, or the host rebooted or was cut off under the job."""
    lost = unreachable_hosts(job)
    hosts = job.info.get("hosts")
    if (job.info.get("launcher") == "pdsh" and isinstance(hosts, list) and job.exit_code()
            and not (job.run_dir / CANCELLED_MARK).exists()):
        lost += [str(h) for rank, h in enumerate(hosts) if str(h) not in lost
                 and not (job.run_dir / "hosts" / f"{rank}.exit").exists()]
    return lost


def failure_hint(job: Job, state: JobState) -> str | None:
    """The hint for a job that lost hosts: which, and what to do (read by
    ``labkit.backends.diagnosis.failure_error``)."""
    lost = lost_hosts(job) if state in (JobState.FAILED, JobState.NODE_FAIL) else []
    if not lost:
        return None
    gone = unreachable_hosts(job)
    names = ", ".join(lost)
    why = ("ssh no longer reaches it" if set(lost) <= set(gone) else
           "its torchrun agent ended without reporting an exit code (killed, the host rebooted "
           "or its network went down)")
    return (f"lost host {names}: {why}; the other hosts' ranks then failed waiting for its "
            f"ranks. Check {lost[0]} (ssh {lost[0]} uptime; dmesg there) and run `labkit doctor "
            f"--cluster SITE.yaml` on the profile {job.info.get('cluster')!r}; resubmit with "
            f"--resume once it answers, or without it (take it out of the profile's hosts)")


def _state(job: Job) -> JobState:
    if job.info.get("host", socket.gethostname()) != socket.gethostname():
        return JobState.UNKNOWN  # launched from another machine: its launcher is not visible
    if launcher_alive(job):
        return JobState.RUNNING
    if (job.run_dir / CANCELLED_MARK).exists():
        return JobState.CANCELLED
    code = job.exit_code()
    if code == 0:
        return JobState.COMPLETED
    return JobState.NODE_FAIL if unreachable_hosts(job) else JobState.FAILED


def states(jobs: list[Job]) -> dict[str, JobState]:
    return {j.job_id: _state(j) for j in jobs}


def kill_on_host(host: str, token: str, grace: int = 10) -> str | None:
    """End the processes with ``token`` on ``host`` (ssh); None when none is left, else why."""
    if not (len(token) == 32 and all(c in "0123456789abcdef" for c in token)):
        raise LabkitError(f"job token {token!r:.40} is not labkit's; nothing signalled")
    try:
        p = subprocess.run([*SSH, host, "bash", "-s"], input=_REMOTE_KILL.format(
            token=token, grace=grace), capture_output=True, text=True, timeout=grace + 60)
    except subprocess.TimeoutExpired:
        return f"{host}: no answer"
    return None if p.returncode == 0 else f"{host}: {(p.stdout + p.stderr).strip()[-300:]}"


def cancel(job: Job, grace: float = 10.0) -> None:
    """End the job on every host (its token's processes only), then the launcher here."""
    token, hosts = job.info.get("token"), job.info.get("hosts") or []
    if not isinstance(token, str) or not isinstance(hosts, list):
        raise LabkitError(f"job {job.job_id} has no token or hosts recorded; labkit leaves it "
                          f"alone")
    (job.run_dir / CANCELLED_MARK).write_text(f"{time.time():.0f}\n")
    problems = [why for h in hosts if (why := kill_on_host(str(h), token, int(grace)))]
    pid = job.info.get("pid")
    end = time.time() + grace
    while launcher_alive(job) and time.time() < end:  # it writes exit_code once pdsh returns
        time.sleep(0.2)
    if launcher_alive(job):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    reap(job)
    if problems:
        raise LabkitError(f"job {job.job_id} cancelled, but on some hosts processes may be left: "
                          + "; ".join(problems) + " (check with ssh HOST ps -ef)")
