# %% [markdown]
# # 06 Hybrid tensor and pipeline parallelism (exercise)
#
# **What you will learn**
# - how to choose TP, PP, micro and global batch for 2 nodes, and check the choice;
# - how to run your layout and confirm it from the world-size line;
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
sweep = None  # extra layouts as [TP, PP] pairs to run next to yours and its interleaved run; None: the planner's first pick
run_prefix = "nb06"  # runs go to runs/<run_prefix>_*/

# %% [markdown]
# ## 0 Versions

# %%
from labkit.lab import versions

versions()

# %% [markdown]
# The queue before this notebook submits (on a cluster: everyone's jobs, then yours):

# %%
from labkit.lab_watch import queue_view
from labkit.site import resolve_cluster

site = resolve_cluster(cluster)  # this notebook's `cluster`, else $LABKIT_CLUSTER or the mini-cluster
print(queue_view(backend=backend, cluster=site))

# %% [markdown]
# ## 1 A hybrid layout for 2 nodes
#
# **Exercise 06.1** (choose): pick a layout for `nodes` x `gpus_per_node` ranks that uses a
# pipeline (PP of at least 2 stages); TP, PP, micro and global batch are yours. The rules:
# - TP x PP x DP must equal the number of ranks, and TP should stay inside a node;
# - PP must divide the number of layers, TP the number of attention heads;
# - the global batch must be a multiple of micro batch x DP, with at least PP microbatches so
#   the pipeline fills.

# %%
from labkit.config import RunConfig
from labkit.site import resolve_cluster
from labkit.exercises import FIXME, check_hybrid

base = RunConfig.for_profile(profile, cluster=resolve_cluster(cluster), name=f"{run_prefix}_hybrid",
                             backend=backend, nodes=nodes, gpus_per_node=gpus_per_node,
                             train_iters=train_iters)
print(f"{nodes} nodes x {gpus_per_node} = {nodes * gpus_per_node} ranks; {base.num_layers} "
      f"layers, {base.num_attention_heads} attention heads")
tp = 1  # EXERCISE
pp = 2  # EXERCISE
micro_batch_size = 1  # EXERCISE
global_batch_size = micro_batch_size * (nodes * gpus_per_node // (tp * pp)) * 2 * pp  # EXERCISE
layout = check_hybrid(tp, pp, micro_batch_size, global_batch_size, nodes=nodes,
                      gpus_per_node=gpus_per_node, num_layers=base.num_layers,
                      num_attention_heads=base.num_attention_heads, min_pp=2)

# %% [markdown]
# ## 2 Run your layout

# %%
from labkit.lab import launch

# Your layout once it passes the check above; until then one that the check worked out.
tp, pp, micro_batch_size, global_batch_size = layout.value
cfg = base.replace(name=f"{run_prefix}_tp{tp}_pp{pp}", tensor_model_parallel_size=tp,
                   pipeline_model_parallel_size=pp, micro_batch_size=micro_batch_size,
                   global_batch_size=global_batch_size)
print(f"layout TP={cfg.tp} x PP={cfg.pp} x DP={cfg.dp}; {cfg.num_microbatches} microbatches of "
      f"{cfg.micro_batch_size} per iteration")
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
# **Exercise 06.2** (predict): before the planner and the timeline tell you: how large is the
# bubble of your run, as a fraction of the ideal compute time? Think in microbatch slots: how
# many slots does a stage wait, and how many does it compute? (`pp` and `cfg.num_microbatches`
# hold your run's numbers.)

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
peak = run.memory.groupby("rank")[["max_allocated_mb"]].max()
# on CPU the log's "max allocated" is the process's peak resident memory (RSS)
peak.rename(columns={"max_allocated_mb": "peak_rss_mb"}) if cfg.device == "cpu" else peak

# %% [markdown]
# That is the whole process (RSS on CPU). The engine also counts its own tensors per rank
# (`memory/rank_N.json`: weights, gradients, optimizer state, other buffers, and the peak of
# what autograd saved for backward), which is what the planner predicts, stage by stage:

# %%
import matplotlib.pyplot as plt

from labkit.measured.memory import compare_memory, load_memory
from labkit.measured.plots import plot_memory_components

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
# its neighbour: the bubble of exercise 06.2, plus any imbalance between the stages. A second
# run splits each stage into 2 virtual chunks (interleaved 1F1B,
# `num_layers_per_virtual_pipeline_stage`): more, shorter slots, so the formula's bubble
# (p-1)/(v*m) halves.

# %%
from labkit.measured.plots import plot_pipeline_timeline
from labkit.measured.timeline import bubble_line, load_timeline, measured_bubble

chunks = 2 if cfg.num_layers % (2 * pp) == 0 else 1  # each chunk needs whole layers
vcfg = cfg.replace(name=f"{run_prefix}_tp{tp}_pp{pp}_vpp{chunks}",
                   num_layers_per_virtual_pipeline_stage=cfg.num_layers // (chunks * pp))
vjob = launch(vcfg, cluster=cluster)
assert vjob.state() == "COMPLETED", vjob.tail(30)
runs = {"1F1B": job, f"interleaved, {chunks} chunks per stage": vjob}
fig, axes = plt.subplots(2, 1, figsize=(11, 2.2 + 1.4 * pp * 2), sharex=True)
timelines, bubbles = {}, {}
for ax, (title, j) in zip(axes, runs.items()):
    timelines[title] = load_timeline(j.run_dir)
    plot_pipeline_timeline(timelines[title], ax=ax)
    ax.set_title(f"{title}: {ax.get_title()}")
    bubbles[title] = measured_bubble(timelines[title])
    print(f"{title}: {bubble_line(timelines[title])}")
fig.tight_layout()
plt.show()

# %% [markdown]
# **Where did each stage's idle time go?** Per iteration the pipeline's span is what the
# slowest stage computes (`busy`) plus everything it waited. Split every stage's idle time
# three ways, from the timeline alone:
# - **schedule**: the formula's bubble of the slowest stage, (p-1)/(v*m) x its busy time: the
#   warm-up and cool-down no schedule avoids;
# - **imbalance**: how much less this stage computes than the slowest one (it waits for it);
# - **other wait**: the rest of the span: transfers between stages, and on a shared machine
#   waiting for a core. Negative when the run beat the formula's schedule.

# %%
import pandas as pd
from IPython.display import display

from labkit.measured.timeline import predicted_bubble, stage_idle


def idle_parts(tl: pd.DataFrame) -> pd.DataFrame:
    """Per stage, median over the iterations after the first: busy and idle in its 3 parts."""
    per = stage_idle(tl)
    per = per[per["iteration"] > per["iteration"].min()].copy()
    b = measured_bubble(tl)
    slowest = per.groupby("iteration")["busy_ms"].transform("max")
    per["schedule_ms"] = predicted_bubble(b["p"], b["v"], b["m"]) * slowest
    per["imbalance_ms"] = slowest - per["busy_ms"]
    per["other_wait_ms"] = per["idle_ms"] - per["schedule_ms"] - per["imbalance_ms"]
    cols = ["busy_ms", "idle_ms", "schedule_ms", "imbalance_ms", "other_wait_ms"]
    return per.groupby("pp_rank")[cols].median()


parts = pd.concat({title: idle_parts(tl) for title, tl in timelines.items()}, names=["run"])
display(parts.round(1))
(t1, b1), (t2, b2) = bubbles.items()
mean = parts.groupby(level="run").mean()
d_sched = mean.loc[t2, "schedule_ms"] - mean.loc[t1, "schedule_ms"]
d_other = mean.loc[t2, "other_wait_ms"] - mean.loc[t1, "other_wait_ms"]
d_imb = mean.loc[t2, "imbalance_ms"] - mean.loc[t1, "imbalance_ms"]
print(f"measured bubble: {t1} {b1['bubble']:.2f}, {t2} {b2['bubble']:.2f} "
      f"(the formula: {b1['predicted']:.2f} -> {b2['predicted']:.2f})")
if chunks == 1:
    print(f"With {pp} stages of {cfg.num_layers // pp} layer(s) no stage splits into chunks: "
          f"both runs are 1F1B.")
elif b2["bubble"] < b1["bubble"]:
    print(f"Interleaving shrank the measured bubble here. Per stage, the schedule part changed by "
          f"{d_sched:+.1f} ms, imbalance by {d_imb:+.1f} ms, the other waits by {d_other:+.1f} ms.")
else:
    eaten = max((("the other waits (transfers, cores)", d_other), ("imbalance", d_imb)),
                key=lambda kv: kv[1])
    print(f"Interleaving did not shrink the measured bubble here. The schedule part changed by "
          f"{d_sched:+.1f} ms per stage, {eaten[0]} by {eaten[1]:+.1f} ms"
          + (": that is what ate the gain (interleaving doubles the transfers between stages)."
             if d_sched < 0 else ": the slowest stage computed longer, so even the schedule part "
             "grew."))

# %% [markdown]
# **More microbatches, a smaller bubble?** The formula says the bubble falls as 1/m. Two short
# runs of your layout (3 iterations each) with 2x and 4x the microbatches, against (p-1)/m:

# %%
m0 = cfg.num_microbatches
m_jobs = {m0: job}
for k in (2, 4):
    mc = cfg.replace(name=f"{run_prefix}_tp{tp}_pp{pp}_m{k * m0}",
                     global_batch_size=k * cfg.global_batch_size, train_iters=3,
                     lr_warmup_iters=min(cfg.lr_warmup_iters, 3))
    m_jobs[k * m0] = launch(mc, cluster=cluster, progress=False)
    assert m_jobs[k * m0].state() == "COMPLETED", m_jobs[k * m0].tail(30)
msweep = pd.DataFrame([{"microbatches": m, "formula": b["predicted"], "measured": b["bubble"]}
                       for m, b in ((m, measured_bubble(load_timeline(j.run_dir)))
                                    for m, j in m_jobs.items())]).set_index("microbatches")
display(msweep.round(3))
ax = msweep.plot(marker="o", figsize=(5, 3), logx=True)
ax.set_ylabel("bubble (idle / busy)")
plt.show()
if msweep["measured"].is_monotonic_decreasing:
    print(f"Measured, the bubble fell with more microbatches: {msweep['measured'].iloc[0]:.2f} at "
          f"m={m0} to {msweep['measured'].iloc[-1]:.2f} at m={4 * m0}.")
else:
    print("Measured, the bubble did not fall steadily with more microbatches here: the other "
          "waits of the table above (transfers, shared cores) do not shrink with m.")

# %% [markdown]
# ## 4 A sweep of layouts
#
# The planner lists every layout of the cluster, fitting ones first, with reasons for the
# invalid ones, and orders the fitting ones by an *estimate* of the iteration time: compute at
# a speed per rank, the bubble, and every collective at a latency plus its bytes over a bus
# bandwidth. Those figures come from what this machine or cluster measured, when notebooks 01
# (compute speed) and 03 (links) stored their measurements; otherwise the estimate uses
# typical figures and says it is UNCALIBRATED. We compare it with the layouts you ran: yours,
# yours interleaved (section 3), and the planner's first pick.

# %%
from labkit.planner import format_layouts, plan_layouts
from labkit.planner.calibration import calibrated_hardware, describe

hw = calibrated_hardware(cfg)
print(describe(hw))
layouts = plan_layouts(nodes=nodes, gpus_per_node=gpus_per_node, model=cfg,
                       micro_batch_size=micro_batch_size, hardware=hw)
print(format_layouts(layouts, show_invalid=False))
if sweep is None:  # the planner's first pick (one model chunk) that you have not run yet
    picks = [[lp.tp, lp.pp] for lp in layouts if lp.plan is not None and lp.plan.fits
             and lp.vpp == 1 and not lp.tp_crosses_nodes and (lp.tp, lp.pp) != (tp, pp)]
    sweep = picks[:1]
print(f"runs next to yours (TP={tp} x PP={pp}) and its interleaved run: "
      + ", ".join(f"TP={t} x PP={q}" for t, q in sweep))

# %%
others = [cfg.replace(name=f"{run_prefix}_tp{t}_pp{q}", tensor_model_parallel_size=t,
                      pipeline_model_parallel_size=q) for t, q in sweep]
ran = [(job, cfg)] + ([(vjob, vcfg)] if chunks > 1 else [])  # already run in section 3
jobs = [j for j, _ in ran] + [launch(c, cluster=cluster) for c in others]
assert all(j.state() == "COMPLETED" for j in jobs), [(j.name, str(j.state())) for j in jobs]

# %%
import matplotlib.pyplot as plt

from labkit.logs import load_runs
from labkit.measured.plots import plot_layout_grid

df = load_runs([j.run_dir for j in jobs])
steady = df[df["iteration"] > 1]
plot_layout_grid(steady[steady["name"] != vcfg.name], value="tokens_per_sec")  # one chunk each
plt.show()
steady.groupby("name")[["elapsed_ms", "tokens_per_sec"]].median()

# %% [markdown]
# **Did the planner rank them the way you measured?** Below, the estimate next to the median
# iteration time you measured, each with its rank (1 = fastest).

# %%
import pandas as pd

from labkit.lab import steady_median
from labkit.planner import estimate_iteration_time

rows = []
for j, c in zip(jobs, [c for _, c in ran] + others):
    est = estimate_iteration_time(c, hw)
    vpp = c.num_layers // (c.pp * c.num_layers_per_virtual_pipeline_stage) \
        if c.num_layers_per_virtual_pipeline_stage else 1
    rows.append({"layout": f"TP{c.tp} x PP{c.pp} x DP{c.dp}" + (f" x VPP{vpp}" if vpp > 1 else ""),
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

record_run(f"tp{tp}_pp{pp}", run.iterations, run.memory)
record(f"tp{tp}_pp{pp}.bubble_fraction", p.bubble_fraction)

# %% [markdown]
# The queue after: nothing of yours is left running.

# %%
print(queue_view(backend=backend, cluster=site))

# %% [markdown]
# ## Summary
#
# - TP x PP x DP = world size; TP inside a node, PP and DP across nodes.
# - Pipeline stages differ in memory. The bubble's schedule part is (p-1)/(v*m) of the slowest
#   stage's compute; your timeline split the rest into imbalance and other waits, and your m
#   sweep showed how much more microbatches bought here.
# - The planner's estimate ranks layouts before you spend queue time; calibrated with your
#   own compute speed and link measurements, you compared its order with the measured one.
#
# Next: **07**, optimizations that trade memory for time.
