# %% [markdown]
# # 02 Multi-node data parallel
#
# **What you will learn**
# - how a 2-node job is described and what its sbatch script asks Slurm for;
# - how to confirm the world size from the log;
# - how iteration time changes from 1 node to 2 nodes, and what scaling efficiency means;
# - what your environment can and cannot show: on the local backend both "nodes" are processes
#   on this machine, so there is no network between them.

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
from labkit.site import resolve_cluster

one = RunConfig.for_profile(profile, cluster=resolve_cluster(cluster), name=one_node_run, backend=backend,
                            nodes=1, gpus_per_node=gpus_per_node, train_iters=train_iters)
two = one.replace(name=run_name, nodes=nodes, global_batch_size=one.global_batch_size * nodes,
                  nccl_debug=profile == "gpu")  # NCCL_DEBUG=INFO: notebook 03 reads its lines
print(two.summary())

# %% [markdown]
# ## 2 The sbatch script of a 2-node job
#
# `--nodes=2` and one task per node: `srun` starts one `torchrun` per node, and each `torchrun`
# starts `gpus_per_node` ranks that meet at the head node (`MASTER_ADDR`). The paths are the
# run directory `launch` submits in (`run_dir_of`).

# %%
from labkit.lab import run_dir_of, shown
from labkit.site import resolve_cluster
from labkit.render import render_sbatch
from labkit.run import JobSpec

script = render_sbatch(JobSpec.from_config(two), resolve_cluster(cluster), run_dir_of(two, cluster=cluster))
print(shown("\n".join(ln for ln in script.splitlines() if ln.startswith(("#SBATCH", "srun", "  ")))))

# %% [markdown]
# ## 3 One node first
#
# The 1-node run (notebook 01's, reused when it exists) gives your baseline: its median
# iteration time `t1`.

# %%
from labkit.lab import launch, steady_median
from labkit.logs import load_runs

job1 = launch(one, cluster=cluster)
assert job1.state() == "COMPLETED", job1.tail(30)
t1 = steady_median(load_runs([job1.run_dir]))
print(f"1 node ({one.world_size} ranks): median {t1:.1f} ms per iteration")

# %% [markdown]
# **Exercise 02.1** (predict): the 2-node run gives every rank the same work as the 1-node run
# (the global batch grew with the ranks). Before you run it: with perfect weak scaling, how many
# times the 1-node iteration time would the 2-node iteration take? (0.5 = half as long, 1 = as
# long, 2 = twice as long.)

# %%
from labkit.exercises import FIXME, check_value

ideal_factor = 1  # EXERCISE: the ideal 2-node time as a multiple of the 1-node time
ideal = check_value("ideal_factor", ideal_factor, 1.0, rel_tol=0.01,
                    hint="In weak scaling each rank's work is the same on 1 and on 2 nodes, "
                         "and the ranks work at the same time; ideally nothing else takes time.")
ideal_t2 = ideal.value * t1
print(f"ideal 2-node time: {ideal_t2:.1f} ms per iteration")

# %% [markdown]
# ## 4 Two nodes, and the world-size line

# %%
job2 = launch(two, cluster=cluster)
assert job2.state() == "COMPLETED", job2.tail(30)
print([ln for ln in job2.tail(400).splitlines() if "using world size" in ln][0])

# %% [markdown]
# ## 5 Iteration time and scaling efficiency

# %%
import matplotlib.pyplot as plt

from labkit.measured.plots import plot_iteration_time

df = load_runs([job1.run_dir, job2.run_dir])
plot_iteration_time(df, by="name")
plt.show()
t2 = steady_median(df[df["name"] == two.name])
print(f"median iteration time: 1 node {t1:.1f} ms, {nodes} nodes {t2:.1f} ms")

# %% [markdown]
# Per device, ideal weak scaling does the same work per second on 1 and on 2 nodes; the drop
# in tokens/s per device is what the second node cost *in this environment* (section 6 says
# what that is here). (MFU, the share of the GPUs' peak, is filled in on GPUs only; see
# notebook 01.)

# %%
from labkit.lab import throughput

throughput(df, gpu_model=gpu_model)

# %% [markdown]
# **Exercise 02.2**: the scaling efficiency says which share of the ideal the larger job reached:
# 1.0 is ideal, 0.5 means it took twice as long as ideal. Work it out from your ideal time
# `ideal_t2` (exercise 02.1) and the 2-node time `t2` you measured.

# %%
from labkit.exercises import check_scaling_efficiency

efficiency = ideal_t2 / t2  # EXERCISE: from ideal_t2 and t2
eff = check_scaling_efficiency(efficiency, time_1=t1, time_n=t2, n=nodes)

# %%
from labkit.logs import parse_run
from labkit.record import record, record_run

r2 = parse_run(job2.run_dir)
record_run("dp_2nodes", r2.iterations, r2.memory)
record("weak_scaling_efficiency", eff.value)

# %% [markdown]
# ## 6 What your numbers say
#
# The lesson is the comparison you just measured, read for the environment it was measured in:
# - **local backend**: both "nodes" are groups of processes on this machine. They talk over
#   loopback and share its CPU cores; there is no network to measure. (labkit does not shape
#   loopback here: that would slow the traffic inside a "node" as much as between them; the
#   mini-cluster gives every node its own network namespace and a shaped link instead.)
# - **the mini-cluster** (`sudo labkit cluster up`, then `backend="slurm"`): the link between
#   its nodes is shaped like a slow network, but its nodes still share this machine's cores.
# - **a real cluster**: separate machines; the slowdown is the gradient all-reduce over the
#   network (and any straggler).

# %%
import os

from labkit.site import resolve_cluster

print(f"1 node ({one.world_size} ranks): {t1:.1f} ms per iteration; {nodes} nodes "
      f"({two.world_size} ranks): {t2:.1f} ms, {t2 / t1:.2f}x; weak-scaling efficiency "
      f"{eff.value:.0%}.")
cores = os.cpu_count()
if t2 > 1.05 * t1:
    seen = "The slowdown you see"
elif t2 < 0.95 * t1:
    seen = ("The 2-node run was even faster: no environment scales better than ideal, so this is "
            "timing noise (one run each, on a machine other jobs may be using). Whatever you see")
else:
    seen = "No slowdown beyond a few percent: whatever you see"
if backend == "local":
    print(f"Local backend: all {two.world_size} ranks ran on this machine's {cores} CPU core(s) "
          f"(the 1-node run: {one.world_size}), over loopback. {seen} is CPU contention and "
          f"noise, not the network: run with backend='slurm' on the mini-cluster or on your "
          f"cluster to see the link.")
elif resolve_cluster(cluster).name.startswith("local-minicluster"):
    print(f"Mini-cluster: the gradient all-reduce crossed the shaped link between the nodes, and "
          f"the {two.world_size} ranks also shared this machine's {cores} CPU core(s): the "
          f"slowdown mixes the two (notebook 03 measures the link alone).")
else:
    print("Separate nodes: the slowdown is what the gradient all-reduce across the network "
          "(and the slowest node) cost; notebook 03 measures the link alone.")

# %% [markdown]
# ## Summary
#
# - A multi-node job is the same config with more `nodes`; Slurm starts one `torchrun` per node.
# - The world-size line shows that all ranks joined.
# - Weak-scaling efficiency compares your 2-node iteration time with the ideal, your 1-node
#   time. What the loss means depends on where you ran (section 6): CPU contention on the local
#   backend, the shaped link plus shared cores on the mini-cluster, the network on a cluster.
#
# Next: **03**, what the network between the ranks actually does.
