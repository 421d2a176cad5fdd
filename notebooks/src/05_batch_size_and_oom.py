# %% [markdown]
# # 05 Batch size and out-of-memory
#
# **What you will learn**
# - how throughput (tokens/s) changes with the micro batch size;
# - how the planner predicts memory per rank, and which micro batch still fits;
# - what a real out-of-memory failure looks like, how labkit's parser finds it, and that the
#   planner had predicted it before the job was submitted.

# %% tags=["parameters"]
profile = "cpu"  # "cpu": tiny GPT on CPU processes (gloo); "gpu": GPT-2 124M on GPUs (NCCL, bf16)
backend = "local"  # "local": processes on this machine (no Slurm needed); "slurm": sbatch
cluster = None  # Slurm cluster profile (name or YAML path); None: $LABKIT_CLUSTER or the mini-cluster
nodes = 1  # nodes of the runs in this notebook
gpus_per_node = 2  # GPUs per node (training processes per node on CPU)
train_iters = 10  # iterations per run; keep it small on CPU
gpu_model = None  # GPU model for MFU's peak, e.g. "H100"; None: the GPU this kernel sees
micro_batches = [1, 2, 4]  # micro batch sizes of the throughput sweep
one_node_run = "nb01_dp"  # notebook 01's run (micro batch 2), reused for that point
memory_limit_gb = 1.0  # CPU only: per-rank cap of the OOM demo; on GPUs the budget is the GPU's memory
oom_micro_batch = 128  # a micro batch that does not fit the budget (doubled on a GPU where it would)
run_prefix = "nb05"  # runs go to runs/<run_prefix>_*/

# %% [markdown]
# ## 0 Versions

# %%
from labkit.lab import versions

versions()

# %% [markdown]
# ## 1 Throughput vs micro batch
#
# Same global batch, different micro batches: a bigger micro batch means fewer, larger
# matrix multiplications per iteration (fewer microbatches to accumulate).

# %%
from labkit.config import RunConfig
from labkit.lab import launch

base = RunConfig.for_profile(profile, cluster=cluster, name=one_node_run, backend=backend,
                             nodes=nodes, gpus_per_node=gpus_per_node, train_iters=train_iters)
gbs = max(micro_batches) * base.dp
jobs = []
for m in micro_batches:
    cfg = base.replace(micro_batch_size=m, global_batch_size=gbs, name=f"{run_prefix}_mbs{m}")
    if cfg.replace(name=one_node_run) == base:
        cfg = base  # the very run of notebook 01: reused, not trained again
    jobs.append(launch(cfg, cluster=cluster))
assert all(j.state() == "COMPLETED" for j in jobs), [(j.name, str(j.state())) for j in jobs]

# %%
import matplotlib.pyplot as plt

from labkit.logs import load_runs
from labkit.plots import plot_throughput_vs_micro_batch

df = load_runs([j.run_dir for j in jobs])
plot_throughput_vs_micro_batch(df)
plt.show()

# %%
from labkit.lab import steady_median

tput = {m: steady_median(df[df["micro_batch_size"] == m], "tokens_per_sec") for m in micro_batches}
print({m: f"{v:,.0f} tokens/s" for m, v in tput.items()})

# %% [markdown]
# **What did your sweep show?** The cell below reads it: where throughput peaked, and by how
# much against the smallest micro batch.

# %%
small, best = min(tput), max(tput, key=tput.get)
print("tokens/s relative to micro batch "
      f"{small}: " + ", ".join(f"{m}: {v / tput[small]:.2f}x" for m, v in tput.items()))
if best == small:
    print(f"The smallest micro batch, {small}, was the fastest here: larger ones did not help.")
elif best == max(tput):
    print("Throughput still rose at the largest micro batch tried: fewer, larger matrix "
          "multiplications used the hardware better.")
else:
    print(f"Past micro batch {best} throughput fell again.")
if profile == "cpu" and best != max(tput):
    print(f"On CPU the {base.world_size} ranks share this machine's cores: once the matmuls keep "
          f"every core busy, larger ones do not run faster per sample, and differences of a few "
          f"percent are within the noise of a shared machine. On GPUs a larger micro batch keeps "
          f"the tensor cores busier, up to the memory limit.")

# %% [markdown]
# The same per device, with MFU on GPUs (empty on `profile="cpu"`: a CPU has no peak FLOPs in
# `labkit.hardware.PEAK_TFLOPS`). On a GPU, a larger micro batch keeps the tensor cores busier
# until memory runs out; MFU shows how much of the peak that buys.

# %%
from labkit.lab import throughput

throughput(df, by="micro_batch_size", gpu_model=gpu_model)

# %% [markdown]
# ## 2 What fits? Ask the planner
#
# The planner adds up weights, gradients, optimizer state, activations and logits per rank.
# The budget is what one rank may use: on GPUs the GPU's memory (`gpu_memory_gb`, from the
# site profile when it says), on CPU `memory_limit_gb`: there the engine caps what a process
# may allocate after building the model, so the planner counts what comes later (optimizer
# moments, activations, logits).

# %%
from labkit.planner import plan

cap = {"memory_limit_gb": memory_limit_gb} if base.device == "cpu" else {}
budget_gb = memory_limit_gb if cap else base.gpu_memory_gb
print(f"budget: {budget_gb:g} GB per rank")


def planned(m: int):
    return plan(base.replace(micro_batch_size=m, global_batch_size=m * base.dp, **cap))


while planned(oom_micro_batch).fits:  # a GPU with more memory than this demo expects
    oom_micro_batch *= 2
sizes = sorted({1, 2, 4, 8, 16, 32, 64, oom_micro_batch})
need = {m: planned(m).required_gb for m in sizes}
{m: f"{gb:.3f} GB" for m, gb in need.items()}

# %% [markdown]
# **Exercise 2.1**: what is the largest micro batch (of those above) that fits the budget
# (`budget_gb`)?

# %%
from labkit.exercises import FIXME, check_max_micro_batch

largest_fitting = max([m for m, gb in need.items() if gb <= budget_gb], default=None)  # EXERCISE
check_max_micro_batch(largest_fitting, peak_gb_by_micro_batch=need, limit_gb=budget_gb)

# %% [markdown]
# ## 3 A micro batch that does not fit
#
# The planner says no; we submit anyway to see the real failure.

# %%
oom_cfg = base.replace(name=f"{run_prefix}_oom", micro_batch_size=oom_micro_batch,
                       global_batch_size=oom_micro_batch * base.dp,
                       train_iters=min(train_iters, 3),
                       lr_warmup_iters=min(base.lr_warmup_iters, 3), **cap)
oom_plan = plan(oom_cfg)
print(oom_plan.summary())
assert not oom_plan.fits, "the planner should predict that this micro batch does not fit"

# %%
oom_job = launch(oom_cfg, cluster=cluster, reuse=False, progress=False)
print(oom_job.state())
print(oom_job.tail(8))

# %%
from labkit.logs import diagnose

failures = diagnose(oom_job.log_path, exit_code=oom_job.exit_code(),
                    job_state=str(oom_job.state()))
for f in failures[:3]:
    print(f"{f.kind}: {f.message}\n  hint: {f.hint}")
assert str(oom_job.state()) in ("FAILED", "OUT_OF_MEMORY"), oom_job.state()
assert failures and failures[0].kind in ("host_oom", "gpu_oom"), failures

# %% [markdown]
# ## 4 Memory you can look at
#
# The memory lines of the log are the process's resident memory (RSS on CPU): the interpreter
# and libraries are in it. The engine also counts its own tensors on every rank
# (`runs/<name>/memory/rank_N.json`): weights, gradients, optimizer state and other buffers
# from the model and optimizer objects, and the peak of what autograd saved for backward (the
# activations). That is what the planner predicts. Left: tensors per iteration; right: RSS.

# %%
from labkit.measured_memory import compare_memory, load_memory, memory_iterations
from labkit.plots import plot_memory, plot_memory_components

big_job = jobs[-1]  # the largest micro batch of the sweep
big_cfg = RunConfig.from_json(big_job.run_dir / "config.json")
its = memory_iterations(big_job.run_dir)
fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
plot_memory(its, y="tensors_mb", x="iteration", ax=axes[0])
plot_memory(its, y="rss_mb", x="iteration", ax=axes[1])
fig.suptitle(f"{big_job.name}: tensor memory vs resident memory per rank")
fig.tight_layout()
plt.show()

# %% [markdown]
# Predicted (hatched) and measured, component by component, for that run:

# %%
mem_cmp = compare_memory(big_cfg, load_memory(big_job.run_dir))
plot_memory_components(mem_cmp)
plt.show()
pred, meas = (mem_cmp[mem_cmp["source"] == s].iloc[0] for s in ("predicted", "measured"))
for c in ("weights", "gradients", "optimizer", "activations"):
    print(f"{c:12s} predicted {pred[c + '_mb']:8.3f} MB, measured {meas[c + '_mb']:8.3f} MB "
          f"({meas[c + '_mb'] / pred[c + '_mb'] - 1:+.1%})")
rss = float(its["rss_mb"].max())
print(f"tensors {meas['total_mb']:.1f} MB of a process of {rss:.0f} MB RSS: "
      f"{meas['total_mb'] / rss:.1%}")

# %% [markdown]
# ## 5 One step's memory, from the profiler
#
# `torch_profiler_memory=True` makes the PyTorch profiler record the first two iterations with
# every allocation and free. Before the first optimizer step only the weights and gradients
# exist; Adam's two moments appear in that step and stay. In each step the activations pile
# up during the forward passes and drain in the backward passes.

# %%
from labkit.plots import plot_memory_timeline
from labkit.profiling import memory_timeline

mem_run = big_cfg.replace(name=f"{run_prefix}_memory_timeline", train_iters=3,
                          lr_warmup_iters=min(big_cfg.lr_warmup_iters, 3),
                          torch_profiler=True, torch_profiler_memory=True)
mem_job = launch(mem_run, cluster=cluster)
assert mem_job.state() == "COMPLETED", mem_job.tail(30)
mt = memory_timeline(mem_job.run_dir, rank=0)
plot_memory_timeline(mt)
plt.show()
first, second = mt[mt["step"] == 1], mt[mt["step"] == 2]
print(f"step 1 starts at {first['allocated_mb'].iloc[0]:.2f} MB (weights + gradients "
      f"{mt['baseline_mb'].iloc[0]:.2f} MB); step 2 never drops below "
      f"{second['allocated_mb'].min():.2f} MB: the optimizer state stayed. Peak in step 2: "
      f"{second['allocated_mb'].max():.2f} MB, during "
      f"{second.loc[second['allocated_mb'].idxmax(), 'phase'] or 'the step'}.")

# %%
from labkit.record import record

for m, v in tput.items():
    record(f"mbs{m}.tokens_per_sec", v)
record("oom_detected", failures[0].kind)
record("oom_predicted", not oom_plan.fits)

# %% [markdown]
# ## Summary
#
# - Your sweep measured tokens/s per micro batch (section 1 said where it peaked). Larger
#   micro batches help while they make the hardware busier: on GPUs up to the memory limit; on
#   a CPU whose cores are already busy, little or not at all.
# - The planner predicts memory per rank before you queue; its `fits` verdict matched the run.
# - An out-of-memory job fails with the allocator's own error; `labkit.logs.diagnose` names it
#   (`host_oom` on CPU, `gpu_oom` on GPUs) and suggests a fix.
#
# Next: **06**, splitting the model itself with tensor and pipeline parallelism.
