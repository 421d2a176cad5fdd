# %% [markdown]
# # 01 Single node
#
# **What you will learn**
# - how one `RunConfig` describes a training run, and the numbers it derives;
# - how to render and read the job script (sbatch or local launch) before submitting it;
# - how to submit a 1-node data-parallel run and wait for it with a progress bar, and check
#   the queue before and after;
# - how to change a run by editing its job script's Megatron-LM flags, checked by labkit;
# - how to read the world-size line and the iteration lines as a table, and plot loss and
#   iteration time.

# %% tags=["parameters"]
profile = "cpu"  # "cpu": tiny GPT on CPU processes (gloo); "gpu": GPT-2 124M on GPUs (NCCL, bf16)
backend = "local"  # "local": processes on this machine (no Slurm needed); "slurm": sbatch
cluster = None  # Slurm cluster profile (name or YAML path); None: $LABKIT_CLUSTER or the mini-cluster
nodes = 1  # this notebook stays on one node
gpus_per_node = 2  # GPUs per node (training processes per node on CPU)
train_iters = 10  # iterations of the run; keep it small on CPU
gpu_model = None  # GPU model for MFU's peak, e.g. "H100"; None: the GPU this kernel sees
run_name = "nb01_dp"  # the run's folder: runs/<run_name>/ (notebook 02 reuses this run)
edit_run = "nb01_micro1"  # the run of your edited job script (05 and 07 reuse it)

# %% [markdown]
# ## 0 Versions

# %%
from labkit.lab import versions

versions()

# %% [markdown]
# **The queue, before you submit.** On a cluster your jobs wait behind everyone's: look first
# (`squeue`, and labkit's own jobs: `labkit status`). Every notebook that submits shows it at its
# start and at its end, where nothing of yours should still be running.

# %%
from labkit.lab_watch import queue_view
from labkit.site import resolve_cluster

site = resolve_cluster(cluster)  # this notebook's `cluster`, else $LABKIT_CLUSTER or the mini-cluster
print(queue_view(backend=backend, cluster=site))

# %% [markdown]
# ## 1 A RunConfig
#
# One frozen, validated object describes the run: model, batch, layout and where it runs. Field
# names are Megatron-LM's argument names (`tensor_model_parallel_size` is
# `--tensor-model-parallel-size`). A wrong combination fails here, before anything is submitted.

# %%
from labkit.config import RunConfig
from labkit.site import resolve_cluster

cfg = RunConfig.for_profile(profile, cluster=resolve_cluster(cluster), name=run_name, backend=backend,
                            nodes=nodes, gpus_per_node=gpus_per_node, train_iters=train_iters)
print(f"global batch {cfg.global_batch_size} samples per iteration, micro batch "
      f"{cfg.micro_batch_size} samples, {cfg.dp} data-parallel rank(s)")

# %% [markdown]
# **Exercise 01.1** (predict, then read): with data parallelism every rank processes
# `micro_batch_size` samples at a time, and gradients are accumulated until the global batch is
# complete. How many microbatches does each rank run per iteration? Answer from the three
# numbers just printed (`cfg.global_batch_size`, `cfg.micro_batch_size`, `cfg.dp`); the config's
# own summary comes after your answer.

# %%
from labkit.exercises import FIXME, check_num_microbatches

num_microbatches = cfg.global_batch_size // (cfg.micro_batch_size * cfg.dp)  # EXERCISE
check_num_microbatches(num_microbatches, global_batch_size=cfg.global_batch_size,
                       micro_batch_size=cfg.micro_batch_size, dp=cfg.dp)

# %% [markdown]
# What the config derives, once, with units (your answer is its `batch:` line):

# %%
print(cfg.summary())

# %% [markdown]
# ## 2 Render and read the job script
#
# labkit renders the script it will run; read it before you submit. On Slurm it is an sbatch
# script (`#SBATCH` lines, then `srun torchrun ... pretrain_gpt.py` with the run as Megatron-LM
# flags, grouped: `--tensor-model-parallel-size`, `--micro-batch-size`, ...; the fields with no
# Megatron-LM flag travel in the run directory's `config.json`); with the local backend, one
# `torchrun` per simulated node on this machine. Its paths are the run directory `launch` submits
# in (`run_dir_of`: on a shared site, your own run root).

# %%
from labkit.lab import shown
from labkit.script_edit import render_script

script = render_script(cfg, cluster=site)  # sbatch on Slurm, the local launch script here
print(shown(script))  # paths relative to the repository (the script itself has them in full)

# %% [markdown]
# ## 3 Submit and wait
#
# `launch` submits the run and waits with a progress bar of the training iterations. (If the
# very same run already finished, it is reused instead of trained again.)

# %%
from labkit.lab import launch, shown

job = launch(cfg, cluster=cluster)
print(job.state(), shown(job.run_dir))
assert job.state() == "COMPLETED", job.tail(30)

# %% [markdown]
# ## 4 The world-size line and the iteration lines
#
# The training script prints Megatron-LM's log format. The first line to look for says how the
# ranks were divided; then one line per iteration. `parse_run` turns them into DataFrames.

# %%
print([ln for ln in job.tail(400).splitlines() if "using world size" in ln][0])

# %%
from labkit.logs import parse_run

run = parse_run(job.run_dir)
print(run.layout)
run.iterations[["iteration", "elapsed_ms", "lm_loss", "lr", "grad_norm", "tokens_per_sec"]]

# %% [markdown]
# **Throughput.** Tokens per second *per device* is the number to compare across layouts and
# machines. **MFU** (model FLOPs utilisation) is the model's FLOP/s per GPU over the GPU's dense
# peak (`labkit.measured.hardware.PEAK_TFLOPS`, for the precision trained in); large trainings report
# about 40 % (Llama 3 405B on H100s: 38-43 %). It is a GPU figure: on `profile="cpu"` the
# `mfu` column stays empty, because a CPU has no peak in that table and a tiny model on gloo
# says nothing about a GPU.

# %%
from labkit.lab import throughput
from labkit.logs import load_runs

throughput(load_runs([job.run_dir]), gpu_model=gpu_model)

# %% [markdown]
# ## 5 Loss and iteration time

# %%
import matplotlib.pyplot as plt

from labkit.measured.plots import plot_iteration_time, plot_loss

fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
plot_loss(run.iterations, ax=axes[0])
plot_iteration_time(run.iterations, ax=axes[1])
plt.show()

# %%
from labkit.record import record_run

record_run("dp_1node", run.iterations, run.memory)

# %% [markdown]
# The median iteration time of this run is also how fast one rank computes on this machine or
# cluster. Stored with the run, it calibrates the planner's time estimate (`labkit plan`,
# notebook 06) instead of typical figures of some other machine.

# %%
from labkit.lab import steady_median
from labkit.planner.calibration import save_compute_calibration

t_iter = steady_median(run.iterations)
save_compute_calibration(job.run_dir, cfg, t_iter)
print(f"median {t_iter:.1f} ms per iteration, stored in {job.run_dir.name}/calibration.json")

# %% [markdown]
# ## 6 Edit the job script yourself
#
# On a cluster you would change a run by editing its sbatch script's flags. labkit keeps that
# path safe: it writes an **editable copy** of the job script for a second run, reads your
# flags back, checks them against the same rules as any RunConfig (a wrong combination is
# refused here, with the numbers, before anything is queued), says what changed, and submits
# the run; the job script it renders for that run carries exactly your flags. Only the flags of
# the `..._ARGS=( ... )` arrays are read: the `#SBATCH` lines and paths come from the RunConfig
# and the site profile.

# %%
from labkit.script_edit import editable_copy

copy = editable_copy(cfg.replace(name=edit_run), cluster=site)
print(f"your copy: {shown(copy)} (open it from JupyterLab's file browser)")

# %% [markdown]
# **Exercise 01.2** (edit the job script): change one Megatron-LM flag in your copy so that each
# rank takes **one sample at a time**, while an iteration still covers the same global batch.
# Either open the copy in JupyterLab's editor, change the flag, save, and write
# `edited = copy.read_text()`; or change its text in Python (`copy.read_text().replace(...)`).
# labkit checks your edit below.

# %%
from labkit.exercises import FIXME
from labkit.script_edit import check_script_edit

edited = copy.read_text().replace(f"--micro-batch-size {cfg.micro_batch_size}\n", "--micro-batch-size 1\n")  # EXERCISE
edit = check_script_edit(edited, base=cfg.replace(name=edit_run), want={"micro_batch_size": 1},
                         cluster=site, task="The exercise asks for one sample per rank at a "
                         "time and the same global batch per iteration.")

# %% [markdown]
# Submit it (your edit once it passes the check; until then, the one the exercise asks for):

# %%
from labkit.script_edit import submit_edit

edited_job, change = submit_edit(cfg.replace(name=edit_run), edit.value, cluster=site)
print(f"what changed:\n{change}")
assert edited_job.state() == "COMPLETED", edited_job.tail(30)
print([ln for ln in edited_job.tail(400).splitlines() if "microbatch(es) of" in ln][0])
t_edit = steady_median(parse_run(edited_job.run_dir).iterations)
print(f"median iteration: {t_edit:.1f} ms with your edit, {t_iter:.1f} ms as rendered "
      f"(the same samples per iteration, in {change.config.num_microbatches} microbatches "
      f"instead of {cfg.num_microbatches})")

# %% [markdown]
# The engine's first lines say how it split the batch: the same global batch, in more, smaller
# microbatches. Notebook 05 reuses this run as its micro batch 1 point, notebook 07 as its
# gradient-accumulation run.
#
# **The queue, after.** Nothing of yours should be left running:

# %%
print(queue_view(backend=backend, cluster=site))

# %% [markdown]
# ## Summary
#
# - A `RunConfig` is the one description of a run; `summary()` prints what it implies.
# - Read the rendered script before submitting; `launch` submits and waits. Check the queue
#   before you submit and when you are done.
# - You changed a run by editing its job script's flags: labkit read them back, checked them
#   like any config, said what changed, and ran exactly what you wrote.
# - The log's world-size line confirms the layout; `parse_run` gives iterations and memory as
#   DataFrames, ready to plot.
# - Your run's median iteration time is stored with it and calibrates the planner's time
#   estimate for this machine.
#
# Next: **02**, the same training on two nodes.
