"""What a notebook shows of the machines around its runs, as text to print.

    queue_view(backend=..., cluster=...)   the queue at a notebook's start and end: Slurm's
                                           (squeue, every user) and labkit's own jobs
    device_view(job)                       a running job's devices: nvidia-smi's query on its
                                           node for a GPU run; for a CPU run its training
                                           processes (ps), which stand in for it, said so
    trace_view(run_dir)                    a run's profiler traces and how to open them

``cluster`` is the site as the notebook resolved it (``labkit.site.resolve_cluster``). Slurm is
asked through ``labkit.slurmcli`` (``srun --overlap`` runs the query inside the job's
allocation, on its first node); the local backend's "nodes" are this machine.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from labkit import slurmcli
from labkit.jobs import job_states, list_jobs
from labkit.lab import shown
from labkit.paths import run_root
from labkit.site import as_profile

GPU_QUERY = ["nvidia-smi", "--query-gpu=index,name,utilization.gpu,memory.used,memory.total",
             "--format=csv"]
"""What ``device_view`` asks nvidia-smi on a GPU run's node: per GPU, how busy and how full."""
PS_QUERY = ["ps", "-ww", "-eo", "pid,pcpu,rss,etimes,args", "--sort=pid"]
"""Its stand-in on CPU: every process with CPU %, resident memory (KiB) and age (s)."""


def _root(backend: str, cluster: Any) -> tuple[Path, str | None]:
    if backend == "local":
        return run_root(), None
    site = as_profile(cluster)
    if site is None:
        return run_root(), None  # the site's defaults: Slurm's own configuration
    return site.run_root_path() or run_root(), site.slurm_conf


def queue_view(*, backend: str = "local", cluster: Any = None, finished: int = 3) -> str:
    """The queue as a notebook shows it when it starts and ends: on Slurm, ``squeue``'s jobs of
    every user (waiting and running: what yours queue behind); then labkit's own jobs under the
    run root: every one not finished, and the last ``finished`` that are."""
    root, conf = _root(backend, cluster)
    lines = []
    if backend == "slurm":
        try:
            jobs = slurmcli.all_jobs(conf)
        except slurmcli.SlurmError as e:
            lines.append(f"squeue: {e}")
        else:
            live = {i: v for i, v in jobs.items() if v[0] in ("PENDING", "RUNNING", "CONFIGURING",
                                                              "COMPLETING")}
            lines.append(f"Slurm queue: {len(live)} job(s) pending or running, all users")
            lines += [f"  {i:>10} {st:11} {name}" for i, (st, name, _) in live.items()]
    else:
        lines.append("local backend: no scheduler queue; labkit's jobs run at once on this "
                     "machine")
    mine = list_jobs(root)
    states = job_states(mine)
    active = [j for j in mine if not states[j.job_id].finished]
    done = [j for j in mine if states[j.job_id].finished][-finished:] if finished else []
    lines.append(f"your labkit jobs under {shown(root)}: {len(active)} not finished, "
                 f"{len(mine) - len(active)} finished" + (f" (the last {len(done)}:)" if done
                                                          else ""))
    lines += [f"  {j.job_id:>14} {str(states[j.job_id]):13} {j.name}" for j in done + active]
    return "\n".join(lines)


def _on_node(job: Any, cmd: list[str]) -> tuple[int, str]:
    """Run ``cmd`` where ``job`` runs: here (local), or in its allocation (Slurm)."""
    if job.backend == "slurm":
        p = slurmcli.run(["srun", f"--jobid={job.job_id}", "--overlap", "--nodes=1",
                          "--ntasks=1", *cmd], slurm_conf=job.info.get("slurm_conf"), timeout=30)
    elif job.backend == "local":
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        except FileNotFoundError:
            return 127, f"{cmd[0]}: command not found on this machine"
    else:
        return 1, f"no view of a {job.backend} job's node here"
    return p.returncode, (p.stdout if p.returncode == 0 else p.stderr or p.stdout).rstrip()


def _training_rows(ps_text: str, run_dir: Path) -> list[str]:
    """``ps`` rows of the job's training processes (pretrain_gpt.py with the job's checkpoint
    folder on its command line, not the torchrun that started it)."""
    mark = f"{run_dir}/checkpoints"
    out = []
    for line in ps_text.splitlines()[1:]:
        parts = line.split(None, 4)
        if len(parts) == 5 and mark in parts[4] and "pretrain_gpt.py" in parts[4] \
                and "torchrun" not in parts[4]:
            pid, cpu, rss_kib, age, _ = parts
            out.append(f"  pid {pid:>7}  CPU {float(cpu):5.0f} %  resident {int(rss_kib) / 1024:7.0f} "
                       f"MiB  running {int(age):4d} s")
    return out


def device_view(job: Any, *, device: str | None = None) -> str:
    """What the devices of a running job's node are doing, once, as text.

    A GPU run (``device="cuda"``, else the run's config.json): ``nvidia-smi``'s query on the
    node (utilization and memory per GPU). A CPU run has no nvidia-smi to ask: its training
    processes on the node stand in (CPU % and resident memory, from ``ps``), and the text says
    so. A job that is not running says that instead."""
    state = str(job.state())
    if state != "RUNNING":
        return f"{job.name} is {state}: nothing of it runs on a node now"
    if device is None:
        try:
            device = json.loads((job.run_dir / "config.json").read_text()).get("device", "cpu")
        except (OSError, ValueError):
            device = "cpu"
    where = "this machine" if job.backend == "local" else "its first node"
    if device == "cuda":
        rc, text = _on_node(job, GPU_QUERY)
        head = f"$ {' '.join(GPU_QUERY)}   (on {where}, while {job.name} trains)"
        return f"{head}\n{text}" if rc == 0 else f"{head}\nfailed ({rc}): {text}"
    rc, text = _on_node(job, PS_QUERY)
    head = (f"no GPU: {job.name} trains on CPU processes, so nvidia-smi has nothing to show. "
            f"Its stand-in, the run's training processes on {where} (ps: CPU % of one core, "
            f"resident memory, for nvidia-smi's utilization and memory columns):")
    if rc != 0:
        return f"{head}\nps failed ({rc}): {text}"
    rows = _training_rows(text, job.run_dir.resolve())
    return "\n".join([head, *rows] if rows else [head, "  (none found: the run may be "
                                                        "starting or ending)"])


def trace_view(run_dir: str | Path) -> str:
    """A run's torch.profiler traces (``profile/rank*.json``, Chrome trace format) with their
    sizes, and the ways to open one: Perfetto (ui.perfetto.dev: the file is read in the
    browser, not uploaded) or Chrome's ``chrome://tracing``, on the machine where you view it."""
    files = sorted(Path(run_dir, "profile").glob("*.json"))
    if not files:
        return (f"no trace in {shown(Path(run_dir) / 'profile')}: run with torch_profiler=True "
                f"(it records iterations 3-5 of the ranks in torch_profiler_ranks)")
    lines = [f"  {shown(f)}  ({f.stat().st_size / 1e6:.1f} MB)" for f in files]
    return "\n".join([
        "The profiler's traces, one per profiled rank (Chrome trace format):", *lines,
        "To see a trace on a timeline: copy it to your laptop (on a cluster: scp from the login "
        "node), open https://ui.perfetto.dev and drop the file on it (Perfetto reads it in the "
        "browser; nothing is uploaded), or open chrome://tracing in Chrome and Load it. Each "
        "row is a thread; 'labkit forward/backward chunk c microbatch m' spans mark the "
        "engine's own steps, with the operators inside them."])
