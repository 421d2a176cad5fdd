# %% [markdown]
# # 07 Optimizations
#
# **What you will learn**
# - mixed precision (bf16) on GPUs: which parts of the memory shrink, and which grow;
# - gradient accumulation: the same global batch from smaller micro batches;
# - activation recompute: less activation memory for more compute;
# - the distributed optimizer: optimizer state sharded over the data-parallel ranks;
# - to predict which of them brings a run under a memory budget, then verify it;
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
micro1_run = "nb01_micro1"  # notebook 01's edited run (micro batch 1): the gradient-accumulation run
run_prefix = "nb07"  # runs go to runs/<run_prefix>_*/

# %% [markdown]
# ## 0 Versions

# %%
from labkit.lab import versions

versions()

# %% [markdown]
# The queue before this notebook submits:

# %%
from labkit.lab_watch import queue_view
from labkit.site import resolve_cluster

site = resolve_cluster(cluster)  # this notebook's `cluster`, else $LABKIT_CLUSTER or the mini-cluster
print(queue_view(backend=backend, cluster=site))

# %%
from labkit.config import RunConfig
from labkit.site import resolve_cluster
from labkit.planner import plan
from labkit.lab import launch

base = RunConfig.for_profile(profile, cluster=resolve_cluster(cluster), name=one_node_run, backend=backend,
                             nodes=nodes, gpus_per_node=gpus_per_node, train_iters=train_iters)
print(plan(base).summary())

# %% [markdown]
# ## 1 Mixed precision
#
# bf16 stores the weights the model computes with and the activations in 2 bytes instead of 4.
# Not everything shrinks: the optimizer keeps an fp32 master copy of the weights next to the
# Adam moments, and gradients are accumulated in fp32. The CPU path trains in fp32 only, so on
# `profile="cpu"` we compare the planner's prediction for a GPU run (GPT-2 124M, the gpu
# profile), component by component; on `profile="gpu"` the two runs are also measured below.

# %%
from IPython.display import display

if profile == "gpu":
    fp32 = base.replace(name=f"{run_prefix}_fp32", precision="fp32")
    runs_mp = [launch(base, cluster=cluster), launch(fp32, cluster=cluster)]
    print([(j.name, str(j.state())) for j in runs_mp])
import pandas as pd

gpu_twin = RunConfig.for_profile("gpu", name="mp_demo")
parts = pd.DataFrame({prec: plan(gpu_twin.replace(precision=prec)).first_stage.to_dict()
                      for prec in ("fp32", "bf16")})
parts["bf16 / fp32"] = parts["bf16"] / parts["fp32"]
print("GB per GPU (first pipeline stage; startup: buffers allocated at start-up)")
display(parts.round(3))
print(f"logits x{parts.loc['logits', 'bf16 / fp32']:.2f} in bf16: the loss works on an fp32 copy "
      f"of the logits (4 bytes a value) in both runs, and in bf16 the output layer's 2-byte "
      f"logits live beside it: 4 + 2 bytes against 4.")

# %% [markdown]
# **Measured, on GPUs**: the same run in bf16 and in fp32, their median iteration time and the
# peak memory the GPU allocator saw, next to the planner's peak.

# %%
from labkit.lab import steady_median
from labkit.logs import parse_run

if profile == "gpu":
    mp_rows = {}
    for j, c in zip(runs_mp, (base, fp32)):
        assert j.state() == "COMPLETED", j.tail(30)
        r = parse_run(j.run_dir)
        mp_rows[c.precision] = {"iteration_ms": steady_median(r.iterations),
                                "peak_allocated_gb": float(r.memory["max_allocated_mb"].max()) / 1e3,
                                "planned_peak_gb": plan(c).peak_gb}
    mp = pd.DataFrame(mp_rows).T
    display(mp.round(3))
    ratio = mp.loc[base.precision] / mp.loc["fp32"]
    print(f"{base.precision} against fp32 on this GPU: x{ratio['iteration_ms']:.2f} the iteration "
          f"time, x{ratio['peak_allocated_gb']:.2f} the peak memory (planned "
          f"x{ratio['planned_peak_gb']:.2f}).")
else:
    print("Not measured here: profile='cpu' trains in fp32 only, so there is no bf16 run to time. "
          "With profile='gpu' this cell trains the run in bf16 and in fp32 and shows each one's "
          "median iteration time and peak allocated GPU memory, next to the planner's peak.")

# %% [markdown]
# ## 2 Gradient accumulation
#
# The same global batch with micro batch 1 instead of 2: twice as many microbatches per
# iteration, smaller activations, usually a bit slower.

# %%
accum = base.replace(name=micro1_run, micro_batch_size=1)  # notebook 01's edited run, reused
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
          f"hardware FLOPs {p.hardware_flops_per_iteration / 1e9:.3f} GFLOP/iteration")

# %% [markdown]
# **Exercise 07.1** (predict): if an iteration's time followed its FLOPs, how many times the
# baseline's iteration time would the recompute run take? Work it out from the two FLOP counts
# just printed; section 6 measures it.

# %%
from labkit.exercises import FIXME, check_time_from_flops

time_factor = plan(recompute).hardware_flops_per_iteration / plan(base).hardware_flops_per_iteration  # EXERCISE: a factor
predicted_slowdown = check_time_from_flops(time_factor, base=base, option=recompute).value

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
# ## 5 Exercise 07.2: which option fits a budget?
#
# Take the GPU run of section 1 (GPT-2 124M in bf16, 2 nodes x 8 GPUs, DP=16) and its memory
# per GPU by component below. You are given a memory budget per GPU that it exceeds. **Predict**
# which one of three options brings it under the budget: `"accumulation"` (half the micro
# batch, twice the microbatches), `"recompute"` (full activation recompute) or
# `"distributed_optimizer"`. Reason from the components and from what each option changes;
# then run the check, which verifies your prediction with the planner.

# %%
scenario = RunConfig.for_profile("gpu", name="budget_demo")
options = {"accumulation": scenario.replace(micro_batch_size=scenario.micro_batch_size // 2),
           "recompute": scenario.replace(recompute_granularity="full"),
           "distributed_optimizer": scenario.replace(use_distributed_optimizer=True)}
peak_gb = {k: plan(c).peak_gb for k, c in options.items()}
low, second = sorted(peak_gb.values())[:2]
budget_gb = round((low + second) / 2, 2)  # between the two smallest peaks: exactly one fits
components = {k: v for k, v in plan(scenario).first_stage.to_dict().items() if k != "total"}
print(f"budget {budget_gb:.2f} GB per GPU; the run as it is needs {plan(scenario).peak_gb:.2f} GB:")
print({k: f"{v:.3f} GB" for k, v in components.items()}, f"DP={scenario.dp}")

# %%
from labkit.exercises import FIXME
from labkit.exercises_reading import check_fits_budget

option = "distributed_optimizer"  # EXERCISE: "accumulation", "recompute" or "distributed_optimizer"
fits = check_fits_budget(option, peak_gb=peak_gb, budget_gb=budget_gb, baseline=components)

# %% [markdown]
# **Verify**: the planner's peak per GPU for each option, against the budget. (On a GPU cluster
# you can also run the option you chose with `memory_limit_gb=budget_gb`; on CPU the tiny model
# in fp32 is not this run, and its process memory would not show a difference of this size.)

# %%
pd.DataFrame({"planned peak GB": peak_gb, "fits the budget": {k: v <= budget_gb for k, v in
                                                             peak_gb.items()}}).round(3)

# %% [markdown]
# ## 6 Measure them all

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
                 "peak_mb": float(r.memory["max_allocated_mb"].max()),
                 "planned_peak_mb": plan(c).peak_gb * 1e3})
table = pd.DataFrame(rows).set_index("run")
if base.device == "cpu":  # the log's "max allocated" is the process's peak RSS on CPU
    table = table.rename(columns={"peak_mb": "peak_rss_mb"})
display(table)
t0 = table.loc[base.name, "iteration_ms"]
for c in (accum, recompute, distopt):
    print(f"{c.name}: {table.loc[c.name, 'iteration_ms'] / t0 - 1:+.0%} time against the baseline")
measured_slowdown = table.loc[recompute.name, "iteration_ms"] / t0
print(f"recompute: measured x{measured_slowdown:.2f} the baseline's time; its FLOPs predicted "
      f"x{predicted_slowdown:.2f} (exercise 07.1). "
      + ("Time grew more than the FLOPs: the recomputed forward pass also pays each operator's "
         "fixed overhead, which a FLOP count leaves out." if measured_slowdown > predicted_slowdown
         * 1.05 else "Time grew about as the FLOPs did." if measured_slowdown >= predicted_slowdown
         * 0.95 else "Time grew less than the FLOPs." if measured_slowdown >= 1 else
         "The recompute run was even faster than the baseline, which no extra FLOPs explain: "
         "the runs were timed at different moments (the baseline is notebook 01's run), and on "
         "a shared machine the load between them decides more than the option."))

# %% [markdown]
# On CPU the measured peak is the process's resident memory (RSS), which includes the Python
# interpreter and libraries (hundreds of MB), so differences of a few MB in the model's state
# hide in it; on GPUs the allocator's peak shows them directly. Loss curves of the four runs
# should agree closely: these optimizations change memory and time, not the mathematics.

# %% [markdown]
# The engine also counts its own tensors (weights, gradients, optimizer state, other buffers
# and the peak of what autograd saved for backward), which is what the planner predicts. Per
# run, predicted (hatched) next to measured:

# %%
import matplotlib.pyplot as plt

from labkit.measured.memory import compare_memory, load_memory
from labkit.measured.plots import plot_memory_components

have = [(j, c) for j, c in zip(jobs, (base, accum, recompute, distopt))
        if (j.run_dir / "memory").is_dir()]
for j, c in zip(jobs, (base, accum, recompute, distopt)):
    if not (j.run_dir / "memory").is_dir():
        print(f"{j.name}: no memory/ folder (a run made before the engine counted its tensors; "
              f"launch it with reuse=False to measure it)")
fig, axes = plt.subplots(1, max(1, len(have)), figsize=(4.2 * max(1, len(have)), 3.8),
                         squeeze=False, sharey=True)
for ax, (j, c) in zip(axes[0], have):
    mem_cmp = compare_memory(c, load_memory(j.run_dir))
    plot_memory_components(mem_cmp, ax=ax)
    ax.set_title(c.name, fontsize=9)
    if ax is not axes[0][-1]:
        ax.get_legend().remove()
    meas = mem_cmp[mem_cmp["source"] == "measured"].iloc[0]
    pred = mem_cmp[mem_cmp["source"] == "predicted"].iloc[0]
    print(f"{c.name:16s} activations {meas['activations_mb']:6.2f} MB (planned "
          f"{pred['activations_mb']:6.2f}), optimizer {meas['optimizer_mb']:5.2f} MB (planned "
          f"{pred['optimizer_mb']:5.2f})")
fig.tight_layout()
plt.show()

# %% [markdown]
# **Memory against time**, each option a point: measured (filled) and planned (hollow: the
# planner's tensors, at the baseline's time scaled by the option's FLOPs), on the same axes.

# %%
fig, ax = plt.subplots(figsize=(6.5, 4))
for (j, c), color in zip(have, plt.rcParams["axes.prop_cycle"].by_key()["color"]):
    meas = compare_memory(c, load_memory(j.run_dir))
    meas_mb = meas[meas["source"] == "measured"]["total_mb"].iloc[0]
    plan_mb = plan(c).peak_gb * 1e3
    plan_ms = t0 * plan(c).hardware_flops_per_iteration / plan(base).hardware_flops_per_iteration
    ax.scatter(table.loc[c.name, "iteration_ms"], meas_mb, color=color, label=c.name)
    ax.scatter(plan_ms, plan_mb, facecolors="none", edgecolors=color)
    ax.plot([plan_ms, table.loc[c.name, "iteration_ms"]], [plan_mb, meas_mb], color=color, lw=0.6)
ax.set_xlabel("iteration time (ms)")
ax.set_ylabel("tensor memory per rank (MB)")
ax.legend(fontsize=8)
plt.show()

# %%
from labkit.record import record

for run, row in table.iterrows():
    record(f"{run}.iteration_time_ms", row["iteration_ms"])
    record(f"{run}.final_loss", row["final_loss"])

# %% [markdown]
# The queue after: nothing of yours is left running.

# %%
print(queue_view(backend=backend, cluster=site))

# %% [markdown]
# ## Summary
#
# - bf16 halves the weights and activations, but adds an fp32 master copy of the weights to the
#   optimizer: read the components, not a rule of thumb (section 1).
# - Which option fits a budget follows from the largest component and what each option
#   shrinks: you predicted it and the planner verified it (section 5).
# - Gradient accumulation keeps the global batch with less activation memory.
# - Recompute trades compute for activation memory; the planner shows both sides.
# - The distributed optimizer divides optimizer state by DP.
#
# Next: **08**, launchers, killing and resuming jobs, and diagnosing failures.
