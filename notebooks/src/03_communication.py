# %% [markdown]
# # 03 Inter- and intra-node communication
#
# **What you will learn**
# - how to read NCCL's `NCCL_DEBUG=INFO` transport lines: P2P and SHM inside a node, NET
#   between nodes (and what gloo, the CPU backend, shows instead);
# - how to measure all-reduce bus bandwidth within a node and across nodes;
# - which process groups of a layout cross nodes, and therefore use the slow link.

# %% tags=["parameters"]
profile = "cpu"  # "cpu": tiny GPT on CPU processes (gloo); "gpu": GPT-2 124M on GPUs (NCCL, bf16)
backend = "local"  # "local": processes on this machine (no Slurm needed); "slurm": sbatch
cluster = None  # Slurm cluster profile (name or YAML path); None: $LABKIT_CLUSTER or the mini-cluster
nodes = 2  # nodes of the benchmark
gpus_per_node = 2  # GPUs per node (processes per node on CPU)
train_iters = 10  # iterations per training run (no training in this notebook)
max_bytes = "4M"  # largest all-reduce message of the bandwidth sweep
run_name = "nb03_busbw"  # the benchmark's folder under runs/

# %% [markdown]
# ## 0 Versions

# %%
from labkit.lab import versions

versions()

# %% [markdown]
# ## 1 NCCL transport lines
#
# With `NCCL_DEBUG=INFO` (a RunConfig's `nccl_debug=True` exports it) every NCCL rank prints,
# per channel, how it reaches its neighbour:
#
# | transport | where | what it is |
# |---|---|---|
# | `P2P` | same node | GPU to GPU over NVLink or PCIe (`P2P/IPC`, `P2P/CUMEM`) |
# | `SHM` | same node | through host shared memory, when P2P is not possible |
# | `NET` | across nodes | the network: `NET/IB` (InfiniBand), `NET/Socket` (TCP) |
#
# Below, a log in NCCL 2.18's recorded format from a 2-node, 8-GPU job, parsed by labkit.

# %%
from labkit.logs import parse_log
from labkit.paths import REPO_ROOT

nccl_log = parse_log(REPO_ROOT / "tests" / "fixtures" / "logs" / "nccl_2.18_transports.txt")
print("NCCL", nccl_log.nccl_version)
nccl_log.nccl

# %%
print(nccl_log.to_dict()["nccl"]["transports"])

# %% [markdown]
# On CPU the backend is **gloo**: it always talks TCP (inside a node over loopback, across
# nodes over the network) and prints no transport lines. The *difference* between the two paths
# is still there, and the benchmark below measures it.

# %% [markdown]
# ## 2 All-reduce bandwidth within a node and across nodes
#
# `code/allreduce_bench.py` is an nccl-tests analog. It reports the **bus bandwidth**
# (`busbw = algbw x 2(n-1)/n` for all-reduce), comparable with the link speed. Scope `intra`
# all-reduces among the ranks of one node, `inter` among one rank per node.

# %%
from labkit.config import RunConfig
from labkit.lab import run_allreduce_bench

bench_cfg = RunConfig.for_profile(profile, name=run_name, backend=backend, nodes=nodes,
                                  gpus_per_node=gpus_per_node)
bw = run_allreduce_bench(bench_cfg, cluster=cluster, max_bytes=max_bytes)
bw.head()

# %%
import matplotlib.pyplot as plt

from labkit.comm import peak_busbw, plot_busbw

plot_busbw(bw)
plt.show()
peak = peak_busbw(bw)
peak

# %%
from labkit.record import record

for _, row in peak.iterrows():
    record(f"busbw_{row['scope']}_gbps", float(row["busbw_gbps"]))

# %% [markdown]
# ## 3 Which groups cross nodes
#
# Ranks are laid out TP first (megatron-core's order `tp-cp-ep-dp-pp`). With 2 processes per
# node, a TP=2 group is one node; DP and PP groups then span nodes.

# %%
from labkit.planner import rank_grid

for tp, pp in [(2, 1), (1, 2), (2, 2)]:
    grid = rank_grid(nodes * gpus_per_node, tp=tp, pp=pp, gpus_per_node=gpus_per_node)
    crossing = {a: g for a, g in grid.groups_crossing_nodes().items() if g}
    print(grid.render())
    print("  groups crossing nodes:", crossing or "none", "\n")

# %% [markdown]
# **Exercise 3.1**: for TP=2 x PP=2 on 2 nodes of 2, which parallelism's groups cross the
# node boundary (answer with `"tp"`, `"dp"` or `"pp"`)?

# %%
from labkit.exercises import FIXME, check_value

grid = rank_grid(nodes * gpus_per_node, tp=2, pp=2, gpus_per_node=gpus_per_node)
answer = "pp"  # EXERCISE: "tp", "dp" or "pp"
crossing = [a for a, g in grid.groups_crossing_nodes().items() if g]
check_value("crossing_axis", [answer], crossing,
            hint=f"the groups that cross nodes are {grid.groups_crossing_nodes()}")

# %%
from IPython.display import Image

Image(filename=str(REPO_ROOT / "images" / "layout_tp2_pp2.png"))

# %% [markdown]
# ## Summary
#
# - NCCL reports P2P / SHM inside a node and NET across nodes; labkit parses those lines.
# - Bus bandwidth inside a node is much higher than across nodes: keep the chattiest group
#   (TP, which all-reduces in every layer) inside a node.
# - The rank grid tells you which groups' traffic crosses the network.
#
# Next: **04**, monitoring and profiling a run.
