# %% [markdown]
# # 08 Launchers and failures
#
# **What you will learn**
# - two ways to start the same multi-node job: Slurm's `srun` + `torchrun`, and a DeepSpeed-style
#   launch from a hostfile;
# - how to kill a running job and resume it from its last checkpoint;
# - how to diagnose a failed job with labkit: the cause and a hint, instead of scrolling logs;
# - how to wait on a job with the hang watchdog, so a hung job is diagnosed and cancelled
#   instead of burning its allocation until the time limit.

# %% tags=["parameters"]
profile = "cpu"  # "cpu": tiny GPT on CPU processes (gloo); "gpu": GPT-2 124M on GPUs (NCCL, bf16)
backend = "local"  # "local": processes on this machine (no Slurm needed); "slurm": sbatch
cluster = None  # Slurm cluster profile (name or YAML path); None: $LABKIT_CLUSTER or the mini-cluster
nodes = 1  # nodes of the runs in this notebook
gpus_per_node = 2  # GPUs per node (training processes per node on CPU)
train_iters = 40  # iterations of the run we kill part-way (long enough to catch it running)
save_interval = 5  # checkpoint every N iterations
kill_at = 12  # cancel the job once the log shows this iteration
hang_timeout = 300  # seconds without a new iteration (before the first: a new log line) until a job counts as hung
run_prefix = "nb08"  # runs go to runs/<run_prefix>_*/

# %% [markdown]
# ## 0 Versions

# %%
from labkit.lab import versions

versions()

# %% [markdown]
# ## 1 Two launchers for one job
#
# **Slurm + torchrun**: sbatch allocates the nodes, `srun` starts one `torchrun` per node, each
# `torchrun` starts `gpus_per_node` ranks that meet at the head node.

# %%
from labkit.site import resolve_cluster
from labkit.config import RunConfig
from labkit.paths import run_root
from labkit.render import render_hostfile, render_sbatch

cfg = RunConfig.for_profile(profile, name=f"{run_prefix}_resume", backend=backend, nodes=nodes,
                            gpus_per_node=gpus_per_node, train_iters=train_iters,
                            save_interval=save_interval)
two_nodes = cfg.replace(nodes=2)
print(render_sbatch(two_nodes, resolve_cluster(cluster), run_root() / two_nodes.name))

# %% [markdown]
# **DeepSpeed style**: no scheduler; a *hostfile* lists the nodes and their slots, and the
# `deepspeed` launcher (or `pdsh`) ssh-es into each to start the ranks. Same ranks, same
# `MASTER_ADDR` rendezvous, different bookkeeping: no queue, no accounting, no cleanup on failure.

# %%
hostfile = render_hostfile(["node1", "node2"], slots=two_nodes.gpus_per_node)
print(hostfile)
print(f"deepspeed --hostfile hostfile --num_nodes {two_nodes.nodes} "
      f"--num_gpus {two_nodes.gpus_per_node} --master_addr node1 --master_port 29500 \\\n"
      f"    code/pretrain_gpt.py --config runs/{two_nodes.name}/config.json")

# %% [markdown]
# ## 2 Kill a job and resume it from its checkpoint
#
# The run saves a checkpoint every `save_interval` iterations. We cancel it part-way (as a
# preemption or a time limit would), then submit it again with `resume=True`: it loads the
# latest complete checkpoint and carries on from there.

# %%
from labkit.lab import launch, wait_for_iteration

job = launch(cfg, cluster=cluster, reuse=False, wait=False)
seen = wait_for_iteration(job, kill_at)
job.cancel()
state = job.wait(progress=False)
print(f"cancelled at iteration >= {seen}: {state}")
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
# (section 4 runs it).

# %%
resumed = launch(cfg, cluster=cluster, resume=True, wait=False)
resumed.wait(hang_timeout=hang_timeout)
assert resumed.state() == "COMPLETED", resumed.tail(30)
print([ln for ln in resumed.tail(400).splitlines() if "resumed from" in ln][-1])

# %%
from labkit.logs import parse_log

its = parse_log(resumed.log_path).iterations
restarts = its[its["iteration"].diff() <= 0]
print("iteration numbers restart at:", restarts["iteration"].tolist())
assert int(its["iteration"].max()) == train_iters

# %% [markdown]
# ## 3 Diagnose a failed job
#
# First the job we cancelled: labkit reads the log, the exit code and the scheduler's state.

# %%
from labkit.logs import diagnose

cancelled = diagnose(job.log_path, exit_code=job.exit_code(), job_state="CANCELLED")
for f in cancelled[:2]:
    print(f"{f.kind}: {f.message}\n  hint: {f.hint}")
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
# **Exercise 3.1**: from the log alone, what ended this job? Answer with one failure kind:
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
    print(f"{f.kind} (rank {f.rank}, line {f.line}): {f.message}\n  hint: {f.hint}")
assert str(bad.state()) == "FAILED" and failures, (bad.state(), failures)

# %% [markdown]
# ## 4 The same from a terminal
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

# %%
from labkit.record import record

record("resume.resumed_iterations", int(its["iteration"].max()))
record("broken.diagnosis", failures[0].kind)

# %% [markdown]
# ## Summary
#
# - `srun` + `torchrun` and a hostfile launcher start the same ranks; Slurm adds the queue,
#   accounting and cleanup.
# - Checkpoints make a killed job cheap: resume picks up at the last saved iteration.
# - A failed job's log says what ended it: you read it yourself first, then
#   `labkit.logs.diagnose` (or `labkit parse LOG`) named the root cause with a hint; a cancelled
#   job is diagnosed as cancelled, whatever signal exceptions the cancel caused.
# - `job.wait(hang_timeout=...)` (or `labkit watch JOB --hang-timeout S`) turns a silent hang into
#   a diagnosis and a cancelled job.
#
# That is the series. Run all of it headless with `make lab`, or `labkit regress` on your cluster
# before a workshop.
