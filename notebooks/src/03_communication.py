# %% [markdown]
# # 03 Inter- and intra-node communication
#
# **What you will learn**
# - how to read NCCL's `NCCL_DEBUG=INFO` transport lines: P2P and SHM inside a node, NET
#   between nodes (from your own GPU run; on CPU, gloo prints none, and you read a sample);
# - how to measure all-reduce bus bandwidth within a node and across nodes;
# - which process groups of a layout cross nodes, and therefore use the slow link.
#
# On the local backend every node is its own network namespace on this machine with a shaped
# link to the others (1 Gbit/s unless the site profile's `local_link` or `LABKIT_LINK_RATE`
# says otherwise): inside a node the ranks talk over its loopback, across nodes over the link.

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
# On `profile="gpu"` the benchmark of section 2 runs with `NCCL_DEBUG=INFO`, and right after
# it you read **your own run's** lines. On `profile="cpu"` the benchmark runs gloo, which always
# talks TCP (inside a node over loopback, across nodes over the network) and prints no transport
# lines: there you read a **sample of the format, not a measurement**, a log a user posted
# publicly (NVIDIA/nccl issue 952, a job of two 8-GPU nodes).

# %% [markdown]
# ## 2 All-reduce bandwidth within a node and across nodes
#
# `code/allreduce_bench.py` is an nccl-tests analog. It reports the **bus bandwidth**
# (`busbw = algbw x 2(n-1)/n` for all-reduce), comparable with the link speed. Scope `intra`
# all-reduces among the ranks of one node, `inter` among one rank per node, `world` among all.
#
# On CPU every rank needs a core of its own, or the ranks measure their fight for the cores
# instead of the link. Where the layout has more ranks than this machine has cores, each scope
# runs in a job of its own that fits: `intra` on 1 node of `gpus_per_node` ranks, `inter` and
# `world` on `nodes` nodes of 1 rank (where `world` is the same ring as `inter`).

# %%
import os

import pandas as pd

from labkit.config import RunConfig
from labkit.lab import run_allreduce_bench

bench_cfg = RunConfig.for_profile(profile, name=run_name, backend=backend, nodes=nodes,
                                  gpus_per_node=gpus_per_node)
cores = os.cpu_count() or 1
split = bench_cfg.device == "cpu" and bench_cfg.world_size > cores
if split:  # each scope with no more ranks than cores
    intra_cfg = bench_cfg.replace(name=f"{run_name}_intra", nodes=1)
    bench_cfg = bench_cfg.replace(gpus_per_node=1)  # one rank per node: across the link
    jobs = [(intra_cfg, "intra"), (bench_cfg, "inter,world")]
else:
    jobs = [(bench_cfg, "world,intra,inter")]
bw = pd.concat([run_allreduce_bench(c, cluster=cluster, max_bytes=max_bytes, scopes=scopes)
                for c, scopes in jobs], ignore_index=True)
if bench_cfg.device == "cpu":
    threads = os.environ.get("OMP_NUM_THREADS", "1")
    for c, scopes in jobs:
        print(f"core budget of {scopes}: {c.nodes} node(s) x {c.gpus_per_node} rank(s) x "
              f"{threads} thread(s) on this machine's {cores} core(s)"
              + ("" if c.world_size <= cores else
                 " (more ranks than cores: they also compete for the cores)"))
bw.head()

# %% [markdown]
# Which transports did NCCL pick for the benchmark's channels?

# %%
import pandas as pd

from labkit.measured.comm import nccl_transports
from labkit.lab import run_dir_of
from labkit.logs import parse_log
from labkit.paths import REPO_ROOT

bench_dir = run_dir_of(bench_cfg, cluster=cluster)
if bench_cfg.device == "cuda":
    nccl = nccl_transports(bench_dir)
    assert nccl, (f"the benchmark ran NCCL with NCCL_DEBUG=INFO, yet {bench_dir.name}/log.txt "
                  f"has no transport line")
    print(f"YOUR OWN RUN: the benchmark above ({bench_dir.name}/log.txt, NCCL_DEBUG=INFO), "
          f"NCCL {nccl['version'] or '(version not in the log)'}")
else:
    print("This environment cannot show NCCL transports: on CPU the benchmark ran gloo, which "
          "prints none.\nBelow is a SAMPLE of the format, NOT A MEASUREMENT of this machine: a log "
          "a user posted in NVIDIA/nccl issue 952 (two 8-GPU nodes).")
    sample = REPO_ROOT / "tests/fixtures/logs/real/nccl_2.1x_socket_and_ipc_nccl952.txt"
    nccl = parse_log(sample).to_dict()["nccl"]
transports = nccl["transports"]
print("channels per transport:", transports)
pd.DataFrame(nccl["channels"]).head(12)

# %%
if bench_cfg.device == "cuda":  # your own GPUs: NCCL must have found the links this layout has
    assert transports["P2P"] + transports["SHM"] > 0 or gpus_per_node == 1, transports
    if backend != "local" and nodes > 1:  # separate machines: their ranks meet over the network
        assert transports["NET"] > 0, transports

# %%
import matplotlib.pyplot as plt

from labkit.measured.comm import peak_busbw, plot_busbw

plot_busbw(bw)
plt.show()
peak = peak_busbw(bw)
peak

# %%
from labkit.record import record

for _, row in peak.iterrows():
    record(f"busbw_{row['scope']}_gbps", float(row["busbw_gbps"]))

# %%
from labkit.planner.calibration import save_link_calibration

# stored with the benchmark's run: `labkit plan` and notebook 06 estimate time with these links
save_link_calibration(run_dir_of(bench_cfg, cluster=cluster), bw, device=bench_cfg.device,
                      backend=backend);

# %% [markdown]
# **What did you measure?** The cell below compares the scopes with each other and with the
# link's rate, which labkit reads from the benchmark's job (`job_link`). Where the nodes are
# separate (their own network namespaces here, the mini-cluster, a real cluster) the link across
# nodes must be the slower one, and the notebook asserts it. Before you run it: which of
# `intra`, `inter` and `world` do you expect to be bounded by the link?

# %%
from labkit.measured.link import job_link, reference
from labkit.site import resolve_cluster

best = peak.set_index("scope")["busbw_gbps"]
intra, inter = float(best.get("intra", float("nan"))), float(best.get("inter", float("nan")))
world = float(best.get("world", float("nan")))
link = job_link(bench_dir, backend=backend, cluster=resolve_cluster(cluster))
print(f"between the nodes: {link.said}")
print(f"peak bus bandwidth: inside a node {intra:.3f} GB/s, across nodes {inter:.3f} GB/s "
      f"(across / inside = {inter / intra:.2f}), world {world:.3f} GB/s")
if not link.separate:
    ref = reference()["nb03"]
    print("Your nodes shared this machine's loopback: both scopes above ran over it, and the "
          "numbers cannot show a link.")
    print(f"REFERENCE, not your machine ({reference()['machine']}, {reference()['date']}): "
          f"inside a node {ref['busbw_intra_gbps']:.3f} GB/s, across nodes "
          f"{ref['busbw_inter_gbps']:.3f} GB/s, world {ref['busbw_world_gbps']:.3f} GB/s.")
elif nodes > 1:
    assert inter < intra, (f"across nodes {inter:.3f} GB/s is not below inside a node "
                           f"{intra:.3f} GB/s: is the inter-node traffic really leaving the node?")
    print(f"Crossing the node boundary costs {intra / inter:.1f}x in bandwidth.")
    if link.bits_per_s:
        rate = link.bits_per_s / 8e9  # GB/s
        groups = int(bw[bw["scope"] == "inter"]["groups"].max())
        print(f"The link carries {rate:.3f} GB/s. The inter scope ran {groups} group(s) at once, "
              f"one per rank of a node, all over that one link: {inter * groups:.3f} GB/s "
              f"together ({inter * groups / rate:.0%} of the link).")
        ranks = int(bw[bw["scope"] == "world"]["world_size"].max())
        print(f"The world group ({ranks} ranks) is one ring through every rank; "
              f"it crosses the link once each way, so the link bounds it too: {world:.3f} GB/s "
              f"is {world / rate:.0%} of the link and {world / intra:.0%} of the bandwidth "
              f"inside a node.")

# %% [markdown]
# ## 3 Which groups cross nodes
#
# Ranks are laid out TP first (megatron-core's order `tp-cp-ep-dp-pp`): neighbouring ranks form
# a TP group, and the launcher fills node 0 with the first `gpus_per_node` ranks. A group's
# traffic crosses the network when its ranks sit on different nodes.
#
# **Exercise 03.1**: below is TP=2 x PP=2 on 2 nodes of 2, each rank with its TP, DP and PP
# coordinates (`t`, `d`, `p`). Which parallelism's groups cross the node boundary? Answer
# `"tp"`, `"dp"` or `"pp"` (a list if several do).

# %%
from labkit.planner import rank_grid

print(rank_grid(nodes * gpus_per_node, tp=2, pp=2, gpus_per_node=gpus_per_node).render())

# %%
from labkit.exercises import FIXME
from labkit.exercises_reading import check_crossing_axis

crossing_axis = "pp"  # EXERCISE: "tp", "dp" or "pp"
check_crossing_axis(crossing_axis, tp=2, pp=2, nodes=nodes, gpus_per_node=gpus_per_node)

# %% [markdown]
# Now three layouts of this shape, with the groups that cross nodes listed by labkit:

# %%
for tp, pp in [(2, 1), (1, 2), (2, 2)]:
    grid = rank_grid(nodes * gpus_per_node, tp=tp, pp=pp, gpus_per_node=gpus_per_node)
    crossing = {a: g for a, g in grid.groups_crossing_nodes().items() if g}
    print(grid.render())
    print("  groups crossing nodes:", crossing or "none", "\n")

# %%
from IPython.display import Image

Image(filename=str(REPO_ROOT / "images" / "layout_tp2_pp2.png"))

# %% [markdown]
# ## Summary
#
# - NCCL reports P2P / SHM inside a node and NET across nodes; labkit parses those lines (your
#   own on the gpu profile, a sample of the format on CPU).
# - You measured bus bandwidth inside a node and across nodes, and section 2 compared them
#   with the link's rate read from the job. On separate nodes the link across nodes is the
#   slower one, asserted above, and it bounds every group whose ring crosses it, the world
#   group included: keep the chattiest group (TP, which all-reduces in every layer) inside a
#   node.
# - The rank grid tells you which groups' traffic crosses the network.
#
# Next: **04**, monitoring and profiling a run.
