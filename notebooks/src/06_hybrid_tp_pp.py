# %% [markdown]
# # 06 Hybrid tensor and pipeline parallelism (exercise)
#
# **What you will learn**
# - how to choose TP, PP, micro and global batch for 2 nodes, and check the choice;
# - how to run TP=2 x PP=2 and confirm the layout from the world-size line;
# - memory per pipeline stage and the pipeline bubble, predicted and measured;
# - how layouts compare in a sweep: the planner's time estimate (calibrated from your own
#   measurements of notebooks 01 and 03) against the iteration times you measure;
# - how to explore layouts with a live widget.

# %% tags=["parameters"]
profile = "cpu"  # "cpu": tiny GPT on CPU processes (gloo); "gpu": GPT-2 124M on GPUs (NCCL, bf16)
backend = "local"  # "local": processes on this machine (no Slurm needed); "slurm": sbatch
cluster = None  # Slurm cluster profile (name or YAML path); None: $LABKIT_CLUSTER or the mini-cluster
nodes = 2  # nodes of the hybrid runs
gpus_per_node = 2  # GPUs per node (training processes per node on CPU)
train_iters = 10  # iterations per run; keep it small on CPU
sweep = [[2, 1], [1, 2]]  # extra layouts as [TP, PP] pairs, compared with TP 2 x PP 2
run_prefix = "nb06"  # runs go to runs/<run_prefix>_*/

# %% [markdown]
# ## 0 Versions

# %%
from labkit.lab import versions

versions()

# %% [markdown]
# ## 1 Exercise: a hybrid layout for 2 nodes
#
# Fill in a layout with **TP=2 and PP=2** on `nodes` x `gpus_per_node` ranks:
# - TP x PP x DP must equal the number of ranks, and TP should stay inside a node;
# - PP must divide the number of layers;
# - the global batch must be a multiple of micro batch x DP, with at least PP microbatches so
#   the pipeline fills.

# %%
from labkit.config import RunConfig
from labkit.exercises import FIXME, check_hybrid

base = RunConfig.for_profile(profile, cluster=cluster, name=f"{run_prefix}_tp2_pp2",
                             backend=backend, nodes=nodes, gpus_per_node=gpus_per_node,
                             train_iters=train_iters)
tp = 2  # EXERCISE
pp = 2  # EXERCISE
micro_batch_size = 2  # EXERCISE
global_batch_size = micro_batch_size * (nodes * gpus_per_node // (tp * pp)) * 2 * pp  # EXERCISE
layout = check_hybrid(tp, pp, micro_batch_size, global_batch_size, nodes=nodes,
                      gpus_per_node=gpus_per_node, num_layers=base.num_layers,
                      num_attention_heads=base.num_attention_heads, want_tp=2, want_pp=2)

# %% [markdown]
# ## 2 Run TP=2 x PP=2

# %%
from labkit.lab import launch

# Your layout once it passes the check above; until then one that the check worked out.
tp, pp, micro_batch_size, global_batch_size = layout.value
cfg = base.replace(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                   micro_batch_size=micro_batch_size, global_batch_size=global_batch_size)
print(cfg.summary())
job = launch(cfg, cluster=cluster)
assert job.state() == "COMPLETED", job.tail(30)
print([ln for ln in job.tail(400).splitlines() if "using world size" in ln][0])

# %% [markdown]
# ## 3 Memory per stage and the bubble
#
# The first stage holds the embedding, the last the output layer and the logits; the first
# stage also keeps the most microbatches in flight (1F1B schedule). The **bubble** is the time
# a stage idles because of the pipeline itself: at the start the later stages wait until the
# first microbatch has passed the stages before them, at the end the earlier stages wait until
# the last backward pass comes back to them.
#
# **Exercise 3.1**: before the planner tells you: how large is the bubble of this run, as a
# fraction of the ideal compute time? Think in microbatch slots: how many slots does a stage
# wait, and how many does it compute? (`pp` and `cfg.num_microbatches` hold this run's numbers.)

# %%
from labkit.exercises import check_bubble

bubble = (pp - 1) / cfg.num_microbatches  # EXERCISE: a fraction of the ideal compute time
check_bubble(bubble, pp=pp, num_microbatches=cfg.num_microbatches)

# %%
from labkit.planner import plan

p = plan(cfg)
print(p.summary())

# %%
from labkit.logs import parse_run

run = parse_run(job.run_dir)
run.memory.groupby("rank")[["max_allocated_mb"]].max()

# %% [markdown]
# That is the whole process (RSS on CPU). The engine also counts its own tensors per rank
# (`memory/rank_N.json`: weights, gradients, optimizer state, other buffers, and the peak of
# what autograd saved for backward), which is what the planner predicts, stage by stage:

# %%
import matplotlib.pyplot as plt

from labkit.measured_memory import compare_memory, load_memory
from labkit.plots import plot_memory_components

measured = load_memory(job.run_dir)
mem_cmp = compare_memory(cfg, measured)
plot_memory_components(mem_cmp)
plt.show()
for stage, g in mem_cmp.groupby("pp_rank"):
    pred, meas = (g[g["source"] == s].iloc[0] for s in ("predicted", "measured"))
    rss = measured[measured["pp_rank"] == stage]["rss_mb"].median()
    print(f"stage {stage}: tensors measured {meas['total_mb']:.2f} MB vs predicted "
          f"{pred['total_mb']:.2f} MB ({meas['total_mb'] / pred['total_mb'] - 1:+.1%}), "
          f"activations {meas['activations_mb']:.2f} vs {pred['activations_mb']:.2f} MB; "
          f"RSS {rss:.0f} MB")

# %% [markdown]
# ### The pipeline, drawn
#
# Every rank also timed the forward and the backward pass of each microbatch
# (`timeline/rank_N.jsonl`). Per stage, the grey between the bars is time the stage waited for
# its neighbour: the bubble of exercise 3.1, plus any imbalance between the stages. A second
# run splits each stage into 2 virtual chunks (interleaved 1F1B,
# `num_layers_per_virtual_pipeline_stage`): more, shorter slots, so the formula's bubble
# (p-1)/(v*m) halves.

# %%
from labkit.plots import plot_pipeline_timeline
from labkit.timeline import bubble_line, load_timeline, measured_bubble

vcfg = cfg.replace(name=f"{run_prefix}_tp{tp}_pp{pp}_vpp2",
                   num_layers_per_virtual_pipeline_stage=cfg.num_layers // (2 * pp))
vjob = launch(vcfg, cluster=cluster)
assert vjob.state() == "COMPLETED", vjob.tail(30)
fig, axes = plt.subplots(2, 1, figsize=(11, 2.2 + 1.4 * pp * 2))
bubbles = {}
for ax, (title, j) in zip(axes, [("1F1B", job), ("interleaved, 2 chunks per stage", vjob)]):
    timeline = load_timeline(j.run_dir)
    plot_pipeline_timeline(timeline, ax=ax)
    ax.set_title(f"{title}: {ax.get_title()}")
    bubbles[title] = measured_bubble(timeline)
    print(f"{title}: {bubble_line(timeline)}")
fig.tight_layout()
plt.show()

# %%
b1, b2 = bubbles.values()
print(f"Interleaving took the measured bubble from {b1['bubble']:.2f} to {b2['bubble']:.2f} "
      f"(the formula: {b1['predicted']:.2f} -> {b2['predicted']:.2f}).")
for name, b in bubbles.items():
    gap = b["bubble"] - b["predicted"]
    print(f"{name}: measured {'above' if gap > 0 else 'below'} the formula by {abs(gap):.2f}")

# %% [markdown]
# The formula assumes equal stages and free communication. Read your timeline for what it
# leaves out: the last stage also runs the output layer and the loss (its bars are longer, so
# the first stage waits for it: imbalance), every arrow between stages is a send/receive that
# takes time, and interleaving doubles those transfers. On the cpu profile the ranks share
# this machine's cores, so a stage may also wait for a core: bars stretch and gaps appear that
# no schedule explains. On GPUs with a larger model the bars even out and the measured bubble
# comes closer to (p-1)/(v*m).

# %% [markdown]
# ## 4 A sweep of layouts
#
# The planner lists every layout of the cluster, fitting ones first, with reasons for the
# invalid ones, and orders the fitting ones by an *estimate* of the iteration time: compute at
# a speed per rank, the bubble, and every collective at a latency plus its bytes over a bus
# bandwidth. Those figures come from what this machine or cluster measured, when notebooks 01
# (compute speed) and 03 (links) stored their measurements; otherwise the estimate uses
# typical figures and says it is UNCALIBRATED. We then run a few layouts and compare.

# %%
from labkit.planner import format_layouts, plan_layouts
from labkit.planner.calibration import calibrated_hardware, describe

hw = calibrated_hardware(cfg)
print(describe(hw))
print(format_layouts(plan_layouts(nodes=nodes, gpus_per_node=gpus_per_node, model=cfg,
                                  micro_batch_size=micro_batch_size, hardware=hw),
                     show_invalid=False))

# %%
others = [cfg.replace(name=f"{run_prefix}_tp{t}_pp{q}", tensor_model_parallel_size=t,
                      pipeline_model_parallel_size=q) for t, q in sweep]
jobs = [job] + [launch(c, cluster=cluster) for c in others]
assert all(j.state() == "COMPLETED" for j in jobs), [(j.name, str(j.state())) for j in jobs]

# %%
import matplotlib.pyplot as plt

from labkit.logs import load_runs
from labkit.plots import plot_layout_grid

df = load_runs([j.run_dir for j in jobs])
steady = df[df["iteration"] > 1]
plot_layout_grid(steady, value="tokens_per_sec")
plt.show()
steady.groupby(["tp", "pp", "dp"])[["elapsed_ms", "tokens_per_sec"]].median()

# %% [markdown]
# **Did the planner rank them the way you measured?** Below, the estimate next to the median
# iteration time you measured, each with its rank (1 = fastest).

# %%
import pandas as pd

from labkit.lab import steady_median
from labkit.planner import estimate_iteration_time

rows = []
for j, c in zip(jobs, [cfg] + others):
    est = estimate_iteration_time(c, hw)
    rows.append({"layout": f"TP{c.tp} x PP{c.pp} x DP{c.dp}",
                 "measured_ms": steady_median(df[df["name"] == c.name]),
                 "estimated_ms": est["iteration_s"] * 1e3,
                 "est_compute_ms": est["compute_s"] * 1e3, "est_bubble_ms": est["bubble_s"] * 1e3,
                 "est_comm_ms": sum(est["comm_s"].values()) * 1e3})
order = pd.DataFrame(rows).set_index("layout")
order["measured_rank"] = order["measured_ms"].rank().astype(int)
order["estimated_rank"] = order["estimated_ms"].rank().astype(int)
print(describe(hw))
same = order["measured_ms"].sort_values().index.equals(order["estimated_ms"].sort_values().index)
print("The planner's order matches your measurements." if same else
      "The planner's order differs from your measurements.")
order.round(1)

# %% [markdown]
# Read the estimate's parts (`est_*` columns). Calibrated on CPU processes, a rank's compute
# is its layers x microbatches at the time per layer and microbatch that notebook 01 measured:
# the tiny model's matmuls are so small that each operator's fixed overhead dominates, and a
# TP rank runs as many operators as a whole model, each half as large. TP then only adds its
# all-reduces (a few ms of latency each, as 03 measured), while PP halves a rank's layers. On
# GPUs the FLOPs count instead. What the estimate leaves out: overlap of communication with
# compute, the load of a shared machine (01, 03 and this sweep ran at different moments: the
# absolute times can be far off even when the order is right), and noise: two layouts within
# ~20 % of each other can swap places from one run to the next. Uncalibrated, it uses typical
# figures of another machine, and its order is a guess.

# %% [markdown]
# ## 5 Explore layouts live
#
# Move the sliders: every change is validated by `RunConfig` (errors carry the numbers and a
# fix) and planned (memory per stage, fits, bubble).

# %%
from labkit.widgets import layout_builder

layout_builder(profile, nodes=nodes, gpus_per_node=gpus_per_node)

# %%
from labkit.record import record, record_run

record_run("tp2_pp2", run.iterations, run.memory)
record("tp2_pp2.bubble_fraction", p.bubble_fraction)

# %% [markdown]
# ## Summary
#
# - TP x PP x DP = world size; TP inside a node, PP and DP across nodes.
# - Pipeline stages differ in memory; more microbatches shrink the bubble.
# - The planner's estimate ranks layouts before you spend queue time; calibrated with your
#   own compute speed and link measurements, you compared its order with the measured one.
#
# Next: **07**, optimizations that trade memory for time.
