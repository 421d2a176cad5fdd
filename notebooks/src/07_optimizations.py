# %% [markdown]
# # 07 Optimizations
#
# **What you will learn**
# - mixed precision (bf16) on GPUs: half the bytes for weights and activations;
# - gradient accumulation: the same global batch from smaller micro batches;
# - activation recompute: less activation memory for more compute;
# - the distributed optimizer: optimizer state sharded over the data-parallel ranks;
#
# each measured against the planner's prediction.

# %% tags=["parameters"]
profile = "cpu"  # "cpu": tiny GPT on CPU processes (gloo); "gpu": GPT-2 124M on GPUs (NCCL, bf16)
backend = "local"  # "local": processes on this machine (no Slurm needed); "slurm": sbatch
cluster = None  # Slurm cluster profile (name or YAML path); None: $LABKIT_CLUSTER or the mini-cluster
nodes = 1  # nodes of the runs in this notebook
gpus_per_node = 2  # GPUs per node (training processes per node on CPU)
train_iters = 10  # iterations per run; keep it small on CPU
one_node_run = "nb01_dp"  # notebook 01's run: the baseline every optimization is compared with
run_prefix = "nb07"  # runs go to runs/<run_prefix>_*/

# %% [markdown]
# ## 0 Versions

# %%
from labkit.lab import versions

versions()

# %%
from labkit.config import RunConfig
from labkit.planner import plan
from labkit.lab import launch

base = RunConfig.for_profile(profile, name=one_node_run, backend=backend, nodes=nodes,
                             gpus_per_node=gpus_per_node, train_iters=train_iters)
print(plan(base).summary())

# %% [markdown]
# ## 1 Mixed precision
#
# bf16 halves weights and activations (fp32 master weights and Adam state stay). The CPU path
# trains in fp32 only, so on `profile="cpu"` we compare the planner's prediction for a GPU run.

# %%
if profile == "gpu":
    fp32 = base.replace(name=f"{run_prefix}_fp32", precision="fp32")
    runs_mp = [launch(base, cluster=cluster), launch(fp32, cluster=cluster)]
    print([(j.name, str(j.state())) for j in runs_mp])
gpu_twin = RunConfig.for_profile("gpu", name="mp_demo")
for prec in ("fp32", "bf16"):
    print(prec, f"{plan(gpu_twin.replace(precision=prec)).peak_gb:.2f} GB peak per GPU")

# %% [markdown]
# ## 2 Gradient accumulation
#
# The same global batch with micro batch 1 instead of 2: twice as many microbatches per
# iteration, smaller activations, usually a bit slower.

# %%
accum = base.replace(name=f"{run_prefix}_accum", micro_batch_size=1)
print(f"microbatches per iteration: {base.num_microbatches} -> {accum.num_microbatches}")
# %% [markdown]
# ## 3 Activation recompute
#
# `recompute_granularity="full"` keeps only each layer's input and recomputes the rest in the
# backward pass: activation memory drops, compute rises by about one forward pass.

# %%
recompute = base.replace(name=f"{run_prefix}_recompute", recompute_granularity="full")
for c in (base, recompute):
    p = plan(c)
    print(f"{c.name}: activations {p.first_stage.activations:.4f} GB, "
          f"hardware FLOPs {p.hardware_flops_per_iteration / 1e9:.1f} GFLOP/iteration")

# %% [markdown]
# ## 4 Distributed optimizer
#
# With `use_distributed_optimizer=True` each data-parallel rank keeps only 1/DP of the fp32
# master weights and Adam moments.

# %%
distopt = base.replace(name=f"{run_prefix}_distopt", use_distributed_optimizer=True)
for c in (base, distopt):
    print(f"{c.name}: optimizer state {plan(c).first_stage.optimizer * 1e3:.2f} MB per rank")

# %% [markdown]
# ## 5 Measure them all

# %%
jobs = [launch(c, cluster=cluster) for c in (base, accum, recompute, distopt)]
assert all(j.state() == "COMPLETED" for j in jobs), [(j.name, str(j.state())) for j in jobs]

# %%
from labkit.logs import parse_run
from labkit.lab import steady_median

rows = []
for j, c in zip(jobs, (base, accum, recompute, distopt)):
    r = parse_run(j.run_dir)
    rows.append({"run": c.name, "iteration_ms": steady_median(r.iterations),
                 "final_loss": float(r.iterations["lm_loss"].iloc[-1]),
                 "peak_rss_mb": float(r.memory["max_allocated_mb"].max()),
                 "planned_peak_mb": plan(c).peak_gb * 1e3})
import pandas as pd

table = pd.DataFrame(rows).set_index("run")
table

# %% [markdown]
# On CPU the measured peak is the process's resident memory (RSS), which includes the Python
# interpreter and libraries (hundreds of MB), so differences of a few MB in the model's state
# hide in it; on GPUs the allocator's peak shows them directly. Loss curves of the four runs
# should agree closely: these optimizations change memory and time, not the mathematics.

# %%
from labkit.record import record

for run, row in table.iterrows():
    record(f"{run}.iteration_time_ms", row["iteration_ms"])
    record(f"{run}.final_loss", row["final_loss"])

# %% [markdown]
# ## Summary
#
# - bf16 halves weights and activations on GPUs; the optimizer state stays fp32.
# - Gradient accumulation keeps the global batch with less activation memory.
# - Recompute trades compute for activation memory; the planner shows both sides.
# - The distributed optimizer divides optimizer state by DP.
#
# Next: **08**, launchers, killing and resuming jobs, and diagnosing failures.
