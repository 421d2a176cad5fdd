# %% [markdown]
# # 08 Launchers and failures
#
# **What you will learn**
# - three ways to start the same multi-node job: Slurm's `srun` + `torchrun`, `pdsh` + `torchrun`
#   from a hostfile, and the DeepSpeed launcher; what each writes at start-up;
# - how to kill a running job and resume it from its last checkpoint;
# - what happens when a node dies under your run: the diagnosis, the resumed loss curve, and
#   how often to save a checkpoint;
# - how to diagnose a failed job with labkit: the cause and a hint, instead of scrolling logs;
# - how to wait on a job with the hang watchdog, so a hung job is diagnosed and cancelled
#   instead of burning its allocation until the time limit.
# - how to end the lab: cancel all of your own jobs, and see what cleaning your runs would free.

# %% tags=["parameters"]
profile = "cpu"  # "cpu": tiny GPT on CPU processes (gloo); "gpu": GPT-2 124M on GPUs (NCCL, bf16)
backend = "local"  # "local": processes on this machine (no Slurm needed); "slurm": sbatch
cluster = None  # Slurm cluster profile (name or YAML path); None: $LABKIT_CLUSTER or the mini-cluster
nodes = 1  # nodes of the runs in this notebook
gpus_per_node = 2  # GPUs per node (training processes per node on CPU)
train_iters = 20  # iterations of the run we kill part-way (long enough to catch it running)
save_interval = 5  # checkpoint every N iterations
kill_at = 7  # cancel the job once the log shows this iteration
hang_timeout = 300  # seconds without a new iteration (before the first: a new log line) until a job counts as hung
run_prefix = "nb08"  # runs go to runs/<run_prefix>_*/

# %% [markdown]
# ## 0 Versions

# %%
from labkit.lab import versions

versions()

# %% [markdown]
# ## 1 Three launchers for one job
#
# The same run, TP=2 x PP=2 on 2 nodes of `gpus_per_node` processes each, started three ways:
#
# - **srun + torchrun** (backend `slurm`): sbatch allocates the nodes, `srun` starts one
#   `torchrun` per node, each `torchrun` starts its ranks, and all meet at the head node;
# - **pdsh + torchrun** (backend `hostfile`, `launcher: pdsh`): no scheduler. A *hostfile* lists
#   the hosts and their slots; `pdsh -R ssh` runs the job's script on every host, which starts
#   one `torchrun` there (what gpt-neox's launcher does underneath);
# - **the DeepSpeed launcher** (backend `hostfile`, `launcher: deepspeed`): `deepspeed
#   --hostfile` reads the same hostfile, reaches the hosts with pdsh itself and starts the ranks,
#   passing `--local_rank` on their command line.
#
# Same ranks, same `MASTER_ADDR` rendezvous, different bookkeeping: only Slurm adds a queue,
# accounting, and the end of every node's processes when one rank fails. The mini-cluster
# (`labkit cluster up`) runs all three: Slurm, and sshd with keyless ssh between its nodes;
# `labkit cluster status --json` names a site profile for each way in.

# %%
import html

from IPython.display import display

from labkit import minicluster
from labkit.config import RunConfig
from labkit.lab import run_dir_of
from labkit.paths import run_root
from labkit.render import job_hosts, render_hostfile_launch, render_sbatch, render_site_hostfile
from labkit.run import JobSpec
from labkit.site import ClusterProfile, load_cluster, resolve_cluster

cfg = RunConfig.for_profile(profile, name=f"{run_prefix}_resume", backend=backend, nodes=nodes,
                            gpus_per_node=gpus_per_node, train_iters=train_iters,
                            save_interval=save_interval)
profiles = minicluster.cluster_status().get("profiles") or {}
print("labkit cluster status --json -> profiles:", profiles or "none (the mini-cluster is down)")
site = resolve_cluster(cluster)
# All three for real only when this notebook runs on the mini-cluster's Slurm: its hostfile
# profile reaches the same nodes over ssh.
three_ways = (backend == "slurm" and "slurm" in profiles and "hostfile" in profiles
              and site.name == load_cluster(profiles["slurm"]).name)
hosts_site = load_cluster(profiles["hostfile"]) if "hostfile" in profiles else None
if hosts_site is None or min(h.get("slots", 1) for h in hosts_site.hosts) < gpus_per_node:
    hosts_site = ClusterProfile(name="two-hosts-example", hosts=(  # an example site's hosts
        {"name": "node1", "slots": gpus_per_node}, {"name": "node2", "slots": gpus_per_node}))
tp2pp2 = RunConfig.for_profile(profile, name=f"{run_prefix}_srun", backend="slurm", nodes=2,
                               gpus_per_node=gpus_per_node, train_iters=3, lr_warmup_iters=1,
                               save_interval=None, tensor_model_parallel_size=2,
                               pipeline_model_parallel_size=2)
ways = {  # launcher -> (config, site profile)
    "srun + torchrun": (tp2pp2, site),
    "pdsh + torchrun": (tp2pp2.replace(name=f"{run_prefix}_pdsh", backend="hostfile"),
                        hosts_site.replace(launcher="pdsh")),
    "deepspeed": (tp2pp2.replace(name=f"{run_prefix}_deepspeed", backend="hostfile"),
                  hosts_site.replace(launcher="deepspeed")),
}
scripts = {}
for way, (c, prof) in ways.items():
    if c.backend == "slurm":
        scripts[way] = render_sbatch(JobSpec.from_config(c), prof, run_dir_of(c, cluster=prof))
    else:
        scripts[way] = render_hostfile_launch(JobSpec.from_config(c), prof, (prof.run_root_path() or run_root()) / c.name)
hostfile = render_site_hostfile(job_hosts(JobSpec.from_config(tp2pp2), hosts_site))


def launch_lines(script: str) -> str:
    """The command of a job script that starts the processes, with its continuation lines."""
    out, going = [], False
    for line in script.splitlines():
        if line.strip().startswith(("srun ", "pdsh ", '"$DEEPSPEED"', '"$TORCHRUN"')):
            going = True
        if going:
            out.append(line)
            going = line.rstrip().endswith("\\")
    return "\n".join(out)


columns = {"hostfile (pdsh, deepspeed)": hostfile,
           **{way: launch_lines(s) for way, s in scripts.items()}}
side_by_side = ("<div style='display:flex;gap:1em'>" + "".join(
    f"<div style='flex:1;min-width:0'><b>{html.escape(w)}</b><pre style='white-space:pre-wrap;"
    f"font-size:80%'>{html.escape(t)}</pre></div>" for w, t in columns.items()) + "</div>")
display({"text/html": side_by_side,  # columns in Jupyter; one after the other as plain text
         "text/plain": "\n\n".join(f"---- {w}\n{t}" for w, t in columns.items())}, raw=True)

# %% [markdown]
# Now each of them starts the run and we read its start-up lines from its log: the world size
# the ranks agreed on, how many ranks each host ran, and how long the first iteration took to
# arrive after the submit (the launcher's start-up: allocation, ssh, rendezvous, model build).

# %%
import re
from collections import Counter

import pandas as pd

from labkit.lab import launch
from labkit.logs import parse_log

# reuse: a finished run of the very same config (a second pass of the notebook) is not retrained
if three_ways:
    where = {way: f"{prof.name} ({c.backend})" for way, (c, prof) in ways.items()}
    runs = {way: launch(c, cluster=prof, progress=False, hang_timeout=hang_timeout)
            for way, (c, prof) in ways.items()}
else:  # one way only: this notebook's own backend
    for way, (c, prof) in ways.items():
        on = ("the Slurm partition of " + repr(prof.name) if c.backend == "slurm" else
              f"hosts {', '.join(h['name'] for h in prof.hosts)} of {prof.name!r} over ssh")
        print(f"{way:16} would run on {on}")
    if backend == "slurm":
        print(f"\nthis site ({site.name!r}) runs srun + torchrun; the two hostfile launchers need "
              f"ssh between its nodes and a site profile that lists them (hosts:), as the "
              f"mini-cluster's does. srun + torchrun only:")
        one, label, here = tp2pp2, "srun + torchrun", f"{site.name} (slurm)"
    else:
        print(f"\nbackend={backend!r}: this environment cannot start the other launchers (they "
              f"need the mini-cluster: `sudo labkit cluster up`, then backend='slurm'); the same "
              f"run on the local backend instead:")
        one = tp2pp2.replace(name=f"{run_prefix}_local", backend="local")
        label, here = "local (torchrun per simulated node)", "this machine"
    where = {label: here}
    runs = {label: launch(one, cluster=cluster, progress=False, hang_timeout=hang_timeout)}


def startup(job) -> dict:
    """Start-up facts read from a job's log: world size, ranks per host, first iteration."""
    text = job.log_path.read_text(errors="replace")
    parsed = parse_log(job.log_path)
    # Each rank of the first data-parallel replica prints its parameter count once (with TP=2 x
    # PP=2 on 4 ranks: every rank); pdsh puts the host in front of each line.
    hosts = Counter(m.group(1) for m in re.finditer(
        r"^(?:(\S+): )?\s*> number of parameters on \(tensor, pipeline\)", text, re.M))
    nodelist = re.search(r"^\[job\] \S+ on (\S+):", text, re.M)  # Slurm names its nodes once
    per_host = (", ".join(f"{h}: {n}" for h, n in sorted(hosts.items())) if None not in hosts else
                f"{hosts[None]} on {nodelist.group(1) if nodelist else 'this machine'} "
                f"(no host on each line)")
    first = parsed.iterations["timestamp"].iloc[0] if len(parsed.iterations) else None
    return {"state": str(job.state()), "world size": parsed.layout.get("world_size"),
            "ranks per host": per_host,
            "first iteration after (s)": (round(pd.Timestamp(first).to_pydatetime().timestamp()
                                                - job.submitted_at, 1) if first else None)}


startups = pd.DataFrame({way: {"ran on": where[way], **startup(job)}
                         for way, job in runs.items()}).T
display(startups)
world = tp2pp2.nodes * tp2pp2.gpus_per_node
assert (startups["state"] == "COMPLETED").all() and (startups["world size"] == world).all(), startups

# %% [markdown]
# ## 2 Kill a job and resume it from its checkpoint
#
# The run saves a checkpoint every `save_interval` iterations. We cancel it part-way (as a
# preemption or a time limit would), then submit it again with `resume=True`: it loads the
# latest complete checkpoint and carries on from there.

# %%
from labkit.lab import launch, shown, wait_for_iteration
from labkit.logs import parse_log

job = launch(cfg, cluster=cluster, reuse=False, wait=False)
seen = wait_for_iteration(job, kill_at)
job.cancel()
state = job.wait(progress=False)
last = int(parse_log(job.log_path).iterations["iteration"].max())
print(f"asked to cancel at iteration {kill_at}; the log showed iteration {seen} when the cancel "
      f"went out, and the last iteration logged is {last}: {state}")
assert str(state) == "CANCELLED", state

# %%
ckpts = sorted(p.name for p in (job.run_dir / "checkpoints").glob("iter_*"))
print(ckpts)
assert ckpts, "the run should have saved at least one checkpoint before it was killed"

# %% [markdown]
# We wait on the resumed job with the **hang watchdog**: `job.wait(hang_timeout=S)` watches the
# log, and if no new iteration appears for `S` seconds (before the first one: no new line at all)
# it writes a diagnosis to `hang-*.txt` in the run directory (each rank's last line, a py-spy
# stack dump of every rank it can see, the ranks *not* waiting inside a collective, which are
# usually the culprit), cancels the job and raises `HangError`. The iterations of the attempt we
# cancelled, still at the end of the log, are not blamed. From a terminal it is `labkit watch`
# (section 5 runs it).

# %%
resumed = launch(cfg, cluster=cluster, resume=True, wait=False)
resumed.wait(hang_timeout=hang_timeout)
assert resumed.state() == "COMPLETED", resumed.tail(30)
print(shown([ln for ln in resumed.tail(400).splitlines() if "resumed from" in ln][-1]))

# %%
from labkit.logs import parse_log

its = parse_log(resumed.log_path).iterations
restarts = its[its["iteration"].diff() <= 0]
print(f"the resumed job's log: iterations {int(its['iteration'].min())}..{int(its['iteration'].max())}"
      + (f", numbering restarts at {restarts['iteration'].tolist()}" if len(restarts) else ""))
saved = int(ckpts[-1].removeprefix("iter_"))  # the checkpoint the resume loaded
if last > saved:
    print(f"iterations {saved + 1}..{last} ran twice ({last - saved} iterations): done before the "
          f"cancel, after the last checkpoint, and redone after the resume. That is what a "
          f"preemption costs with save_interval={cfg.save_interval}.")
else:
    print(f"no iteration ran twice: the cancel came right after the checkpoint of iteration "
          f"{saved}, the last one logged. With save_interval={cfg.save_interval}, a cancel later "
          f"in the interval redoes up to {cfg.save_interval - 1} iterations.")
assert int(its["iteration"].max()) == train_iters

# %% [markdown]
# ## 3 Diagnose a failed job
#
# First the job we cancelled: labkit reads the log, the exit code and the scheduler's state.

# %%
from labkit.logs import diagnose

cancelled = diagnose(job.log_path, exit_code=job.exit_code(), job_state="CANCELLED")
for f in cancelled[:2]:
    print(shown(f"{f.kind}: {f.message}\n  hint: {f.hint}"))
# the cancel is the cause; the SIGTERM it sent shows up in the log as a consequence
assert cancelled[0].kind == "cancelled", [f.kind for f in cancelled]

# %% [markdown]
# Now a job that crashes. Before labkit reads it for you, read it yourself: below is its log,
# as you would find it after a night in the queue.

# %%
broken = cfg.replace(name=f"{run_prefix}_broken", data_path="/nonexistent/corpus_text_document",
                     save_interval=None, train_iters=4, lr_warmup_iters=1)
bad = launch(broken, cluster=cluster, reuse=False, wait=False)
bad.wait(progress=False, hang_timeout=hang_timeout)  # a crash ends it; a hang would be cancelled
from labkit.paths import REPO_ROOT

lines = bad.log_path.read_text(errors="replace").splitlines()
print(f"state {bad.state()}, exit code {bad.exit_code()}; its log ({len(lines)} lines, the last "
      f"80 shown, numbered):\n")
for number, line in enumerate(lines[-80:], start=max(1, len(lines) - 79)):
    print(f"{number:4} {line.replace(str(REPO_ROOT) + '/', '')}")

# %% [markdown]
# **Exercise 08.1**: from the log alone, what ended this job? Answer with one failure kind:
# `"gpu_oom"`, `"host_oom"`, `"nccl_timeout"`, `"cuda_error"`, `"time_limit"`, `"preempted"`,
# `"node_failure"`, `"child_failed"`, `"python_exception"`, `"cancelled"` or `"hang"`. (Read
# from the bottom up: a launcher's summary often repeats a worker's error; the root cause is
# the first error a rank raised.)

# %%
from labkit.exercises import FIXME
from labkit.exercises_reading import check_diagnosis

failures = diagnose(bad.log_path, exit_code=bad.exit_code(), job_state=str(bad.state()))
cause = "python_exception"  # EXERCISE: a failure kind
check_diagnosis(cause, failures=failures);

# %% [markdown]
# labkit's diagnosis of the same log: the failure is found in the log of every rank and reduced
# to one root cause, with the line to read and a hint.

# %%
for f in failures[:3]:
    print(shown(f"{f.kind} (rank {f.rank}, line {f.line}): {f.message}\n  hint: {f.hint}"))
assert str(bad.state()) == "FAILED" and failures, (bad.state(), failures)

# %% [markdown]
# ## 4 A node dies under your run
#
# On a large cluster a run also ends for reasons you did not cause: a node fails, the time limit
# comes, a job of higher priority takes the nodes. Here it happens to your own run, on purpose:
# 2 nodes of one process each, a checkpoint every `save_interval` iterations. Once its first
# checkpoint is saved and the log shows iteration `kill_at`, node 1 fails. On the local backend every process of that node (its
# `torchrun` and its rank) gets SIGKILL at once, as when a machine loses power; on the
# mini-cluster (`backend="slurm"`) labkit sets `node2` DOWN as an administrator would, and
# Slurm, told by the site profile's `requeue: true`, puts the job back in the queue.
#
# The same configuration also runs once without a failure, to compare the loss curves.
#
# **Predict before you run the next cells**: from which iteration will the resumed run go on?
# How many iterations will it do twice? From there on, will its loss curve lie on the
# uninterrupted one, or beside it?

# %%
import time

from labkit.faults import fail_node, restore_node, wait_for_checkpoint

# On CPU one process per node (the two runs share this machine's cores); on GPUs a node's all.
two = cfg.replace(name=f"{run_prefix}_node_down", nodes=2,
                  gpus_per_node=1 if profile == "cpu" else gpus_per_node)
straight = launch(two.replace(name=f"{run_prefix}_straight"), cluster=cluster, progress=False,
                  hang_timeout=hang_timeout)
victim = launch(two, cluster=cluster, reuse=False, wait=False)
wait_for_checkpoint(victim, two.save_interval)
wait_for_iteration(victim, kill_at, poll_s=0.2)  # a few iterations past the checkpoint
what = fail_node(victim, 1)
print(what)

# %% [markdown]
# What labkit says about it, read from your job: its state, and on the local backend the
# failure's likely cause and the checkpoint to go on from; on Slurm the job's line while it
# waits in the queue again (which attempt, how the last one ended, which node is down and why).

# %%
from labkit.backends.diagnosis import failure_error

if victim.backend == "local":
    state = victim.wait(progress=False)
    print(shown(str(failure_error(victim, state)).split("\nLast log lines:")[0]))
    assert str(state) == "FAILED", state
    victim = launch(two, cluster=cluster, resume=True, progress=False, hang_timeout=hang_timeout)
else:  # Slurm requeues it; the node comes back once we saw it waiting
    node = re.search(r"set (\S+) DOWN", what).group(1)
    try:
        while "requeued" not in (line := victim.status_line()):
            time.sleep(1)
        print(line)
    finally:
        restore_node(victim, node)
    victim.wait(progress=False, hang_timeout=hang_timeout)
assert str(victim.state()) == "COMPLETED", victim.tail(30)

# %%
import matplotlib.pyplot as plt

from labkit.measured.plots import plot_loss

text = victim.log_path.read_text(errors="replace")
resume_line = re.search(r"resumed from \S+ at iteration (\d+)", text)
resumed_at = int(resume_line.group(1))  # the checkpoint the second attempt loaded
done_first = [int(i) for i in re.findall(r"iteration\s+(\d+)/", text[:resume_line.start()])]
died_after = max(done_first)  # the last iteration logged before the node died
both = parse_log(victim.log_path).iterations  # attempt 1's iterations, then attempt 2's
first_part, second_part = both.iloc[:len(done_first)], both.iloc[len(done_first):]
curves = pd.concat([
    parse_log(straight.log_path).iterations.assign(run="uninterrupted"),
    first_part.assign(run="until the node died"), second_part.assign(run="resumed")])
plot_loss(curves, by="run")
plt.show()
ref = parse_log(straight.log_path).iterations.set_index("iteration")["lm_loss"]
after = second_part.set_index("iteration")["lm_loss"]
gap = float((after - ref.reindex(after.index)).abs().max())
print(f"the node died after iteration {died_after}; the resumed attempt went on from the "
      f"checkpoint of iteration {resumed_at}: {died_after - resumed_at} iteration(s) done twice; "
      f"largest loss difference to the uninterrupted run after the resume: {gap:.2g}")
assert 0 <= died_after - resumed_at <= two.save_interval, (died_after, resumed_at)

# %% [markdown]
# **Exercise 08.2**: choose `save_interval` for a real run. A 512-GPU job loses a node about
# once every 8 hours; saving a checkpoint takes 60 s; one iteration takes 2 s. Saving often costs
# the saves; saving rarely costs the work redone after a failure (on average half an interval).
# Young's rule gives the interval that loses the least: sqrt(2 x checkpoint cost x mean time
# between failures), in seconds. How many iterations is that?

# %%
import math

from labkit.exercises import check_save_interval

save_every = round(math.sqrt(2 * 60 * 8 * 3600) / 2)  # EXERCISE: iterations between checkpoints
check_save_interval(save_every, checkpoint_s=60, mtbf_s=8 * 3600, iteration_s=2);

# %% [markdown]
# Now against what your own run lost: with `save_interval` iterations between checkpoints, a
# failure redoes between 0 and `save_interval` of them, half on average.

# %%
print(f"your run: save_interval={two.save_interval}, a failure after iteration {died_after} "
      f"redid {died_after - resumed_at} iteration(s) (at most {two.save_interval}, "
      f"{two.save_interval / 2:g} on average)")
per_failure_min = save_every / 2 * 2 / 60
saves_share = 60 / (save_every * 2)
print(f"the 512-GPU job with save_interval={save_every}: a failure redoes about "
      f"{per_failure_min:.0f} minutes of work on average, and the saves take "
      f"{100 * saves_share:.1f}% of the time")

# %% [markdown]
# ## 5 The same from a terminal
#
# Everything above has a command line. Each command below runs here, on the jobs of this
# notebook, and shows what it prints.

# %%
import os
import shlex
import subprocess
import sys

from labkit.paths import REPO_ROOT


def terminal(command: str) -> None:
    """Run a labkit command line as typed in a terminal (from the repository) and show it."""
    print("$", command)
    argv = [sys.executable, "-m", "labkit", *shlex.split(command)[1:]]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=REPO_ROOT, timeout=600)
    shown = (out.stdout + out.stderr).replace(str(REPO_ROOT) + os.sep, "")  # paths as typed
    print(shown.strip()[-2000:], "\n")
    assert out.returncode == 0, f"{command} exited with {out.returncode}"


bad_log = os.path.relpath(bad.log_path, REPO_ROOT)
for command in (f"labkit status {resumed.name}",
                f"labkit watch {resumed.name} --hang-timeout {hang_timeout}",
                f"labkit parse {shlex.quote(bad_log)}"):
    terminal(command)

# %% [markdown]
# ## 6 End of the lab
#
# Before you leave a shared cluster: cancel whatever of yours still runs (only labkit's jobs of
# yours; the lab's `scancel -u $USER` without ending your other work), and see what removing
# your finished runs' checkpoints would free (`--dry-run` removes nothing; without it, it does).

# %%
site_option = f" --cluster {shlex.quote(str(cluster))}" if cluster else ""
for command in (f"labkit cancel --all{site_option}", f"labkit clean --dry-run{site_option}"):
    terminal(command)

# %%
from labkit.record import record

record("resume.resumed_iterations", int(its["iteration"].max()))
record("broken.diagnosis", failures[0].kind)

# %% [markdown]
# ## Summary
#
# - `srun` + `torchrun`, `pdsh` + `torchrun` and the DeepSpeed launcher start the same ranks from
#   the same hostfile or allocation; their logs say the world size and, with pdsh, the host of
#   every line. Slurm adds the queue, accounting and the cleanup of every node.
# - Checkpoints make a killed job cheap: resume picks up at the last saved iteration.
# - A node that dies costs at most `save_interval` iterations: on Slurm with `requeue: true`
#   the job comes back by itself; Young's rule, sqrt(2 x checkpoint cost x time between
#   failures), says how often to save.
# - A failed job's log says what ended it: you read it yourself first, then
#   `labkit.logs.diagnose` (or `labkit parse LOG`) named the root cause with a hint; a cancelled
#   job is diagnosed as cancelled, whatever signal exceptions the cancel caused.
# - `job.wait(hang_timeout=...)` (or `labkit watch JOB --hang-timeout S`) turns a silent hang into
#   a diagnosis and a cancelled job.
# - `labkit cancel --all` and `labkit clean` end the day: your jobs stopped, your disk freed.
#
# That is the series. Run all of it headless with `make lab`, or `labkit regress` on your cluster
# before a workshop.
