# %% [markdown]
# # 02 Multi-node data parallel
#
# **What you will learn**
# - how a 2-node job is described and what its sbatch script asks Slurm for;
# - how to confirm the world size from the log;
# - how iteration time changes from 1 node to 2 nodes, and what scaling efficiency means.

# %% tags=["parameters"]
profile = "cpu"  # "cpu": tiny GPT on CPU processes (gloo); "gpu": GPT-2 124M on GPUs (NCCL, bf16)
backend = "local"  # "local": processes on this machine (no Slurm needed); "slurm": sbatch
cluster = None  # Slurm cluster profile (name or YAML path); None: $LABKIT_CLUSTER or the mini-cluster
nodes = 2  # nodes of the multi-node run
gpus_per_node = 2  # GPUs per node (training processes per node on CPU)
train_iters = 10  # iterations per run; keep it small on CPU
gpu_model = None  # GPU model for MFU's peak, e.g. "H100"; None: the GPU this kernel sees
one_node_run = "nb01_dp"  # the 1-node run of notebook 01 (reused when it exists)
run_name = "nb02_dp_2nodes"  # the 2-node run's folder under runs/

# %% [markdown]
# ## 0 Versions

# %%
from labkit.lab import versions

versions()

# %% [markdown]
# ## 1 One node and two nodes
#
# For **weak scaling** each rank keeps the same work: the global batch grows with the number
# of ranks. The 1-node run is notebook 01's (reused when it already ran with the same config).

# %%
from labkit.config import RunConfig

one = RunConfig.for_profile(profile, name=one_node_run, backend=backend, nodes=1,
                            gpus_per_node=gpus_per_node, train_iters=train_iters)
two = one.replace(name=run_name, nodes=nodes, global_batch_size=one.global_batch_size * nodes)
print(two.summary())

# %% [markdown]
# ## 2 The sbatch script of a 2-node job
#
# `--nodes=2` and one task per node: `srun` starts one `torchrun` per node, and each `torchrun`
# starts `gpus_per_node` ranks that meet at the head node (`MASTER_ADDR`).

# %%
from labkit.site import resolve_cluster
from labkit.paths import run_root
from labkit.render import render_sbatch

script = render_sbatch(two, resolve_cluster(cluster), run_root() / two.name)
print("\n".join(ln for ln in script.splitlines() if ln.startswith(("#SBATCH", "srun", "  "))))

# %% [markdown]
# ## 3 Run both

# %%
from labkit.lab import launch

job1 = launch(one, cluster=cluster)
job2 = launch(two, cluster=cluster)
assert job1.state() == "COMPLETED", job1.tail(30)
assert job2.state() == "COMPLETED", job2.tail(30)

# %% [markdown]
# ## 4 The world-size line

# %%
print([ln for ln in job2.tail(400).splitlines() if "using world size" in ln][0])

# %% [markdown]
# ## 5 Iteration time and scaling efficiency

# %%
import matplotlib.pyplot as plt

from labkit.logs import load_runs
from labkit.plots import plot_iteration_time

df = load_runs([job1.run_dir, job2.run_dir])
plot_iteration_time(df, by="name")
plt.show()

# %%
from labkit.lab import steady_median

t1 = steady_median(df[df["name"] == one.name])
t2 = steady_median(df[df["name"] == two.name])
print(f"median iteration time: 1 node {t1:.1f} ms, {nodes} nodes {t2:.1f} ms")

# %% [markdown]
# Per device, the two runs should do the same work per second: the drop in tokens/s per device
# is what the inter-node all-reduce costs. (MFU, the share of the GPUs' peak, is filled in on
# GPUs only; see notebook 01.)

# %%
from labkit.lab import throughput

throughput(df, gpu_model=gpu_model)

# %% [markdown]
# **Exercise 5.1**: in weak scaling the ideal is the same iteration time on more nodes. The
# scaling efficiency is the ratio of the two iteration times. Compute it.

# %%
from labkit.exercises import FIXME, check_scaling_efficiency

efficiency = t1 / t2  # EXERCISE: t1 / t2
check_scaling_efficiency(efficiency, time_1=t1, time_n=t2, n=nodes)

# %%
from labkit.logs import parse_run
from labkit.record import record, record_run

r2 = parse_run(job2.run_dir)
record_run("dp_2nodes", r2.iterations, r2.memory)
record("weak_scaling_efficiency", t1 / t2)

# %% [markdown]
# ## Summary
#
# - A multi-node job is the same config with more `nodes`; Slurm starts one `torchrun` per node.
# - The world-size line shows that all ranks joined.
# - Weak-scaling efficiency t1 / tN shows what the gradient all-reduce across nodes costs. On
#   the CPU mini-cluster the inter-node link is shaped to be slower than inside a node, as on a
#   real cluster.
#
# Next: **03**, what the network between the ranks actually does.
