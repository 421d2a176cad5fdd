# %% [markdown]
# # 06 Hybrid tensor and pipeline parallelism (exercise)
#
# **What you will learn**
# - how to choose TP, PP, micro and global batch for 2 nodes, and check the choice;
# - how to run TP=2 x PP=2 and confirm the layout from the world-size line;
# - memory per pipeline stage and the pipeline bubble, predicted and measured;
# - how layouts compare in a sweep, and how to explore layouts with a live widget.

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

base = RunConfig.for_profile(profile, name=f"{run_prefix}_tp2_pp2", backend=backend,
                             nodes=nodes, gpus_per_node=gpus_per_node, train_iters=train_iters)
tp = 2  # EXERCISE
pp = 2  # EXERCISE
micro_batch_size = 2  # EXERCISE
global_batch_size = 8  # EXERCISE
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
# stage also keeps the most microbatches in flight (1F1B schedule). The **bubble** is the idle
# share of a pipeline: (PP - 1) / microbatches of the ideal compute time.

# %%
from labkit.planner import plan

p = plan(cfg)
print(p.summary())

# %% [markdown]
# **Exercise 3.1**: compute the bubble fraction of this run.

# %%
from labkit.exercises import check_bubble

bubble = (pp - 1) / cfg.num_microbatches  # EXERCISE: (PP - 1) / microbatches
check_bubble(bubble, pp=pp, num_microbatches=cfg.num_microbatches)

# %%
from labkit.logs import parse_run

run = parse_run(job.run_dir)
run.memory.groupby("rank")[["max_allocated_mb"]].max()

# %% [markdown]
# ## 4 A sweep of layouts
#
# The planner lists every layout of the cluster, fitting ones first, with reasons for the
# invalid ones. We run a few and compare measured iteration times.

# %%
from labkit.planner import format_layouts, plan_layouts

print(format_layouts(plan_layouts(nodes=nodes, gpus_per_node=gpus_per_node, model=cfg,
                                  micro_batch_size=micro_batch_size), show_invalid=False))

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
# - The planner ranks layouts before you spend queue time; the sweep checks it against reality.
#
# Next: **07**, optimizations that trade memory for time.
