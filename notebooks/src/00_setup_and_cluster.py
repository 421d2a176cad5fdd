# %% [markdown]
# # 00 Setup and cluster
#
# **What you will learn**
# - which versions of the tools this lab runs on, and whether this machine or cluster is ready
#   (`labkit doctor`);
# - what the cluster looks like: nodes, the Slurm partition and its queue;
# - the dataset and the tokenizer every training run in this series reads;
# - what a *node*, a *rank* and a *process group* are, and how ranks are laid out on nodes.
#
# Every notebook starts with a **parameters** cell. Change it by hand, or let papermill do it:
# `papermill 00_setup_and_cluster.ipynb out.ipynb -p backend slurm`.

# %% tags=["parameters"]
profile = "cpu"  # "cpu": tiny GPT on CPU processes (gloo); "gpu": GPT-2 124M on GPUs (NCCL, bf16)
backend = "local"  # "local": processes on this machine (no Slurm needed); "slurm": sbatch
cluster = None  # Slurm cluster profile (name or YAML path); None: $LABKIT_CLUSTER or the mini-cluster
nodes = 2  # nodes of the cluster this series uses
gpus_per_node = 2  # GPUs per node (training processes per node on CPU)
train_iters = 10  # iterations per training run (no training in this notebook)
run_doctor = True  # run the preflight checks (labkit doctor)

# %% [markdown]
# ## 0 Versions

# %%
from labkit.lab import versions

versions()

# %% [markdown]
# ## 1 Preflight: `labkit doctor`
#
# The doctor checks Python and packages, the dataset, the number of CPUs/GPUs, and (on Slurm)
# that the nodes answer and can all-reduce with each other. Each check says PASS, WARN or FAIL
# and, for the last two, how to fix it. From a terminal: `labkit doctor`.

# %%
from labkit.doctor import render_table, run_doctor as doctor
from labkit.lab import shown

if run_doctor:
    results = doctor(cluster, backend=backend, timeout_s=60)
    print(shown(render_table(results)))  # paths relative to the repository

# %% [markdown]
# ## 2 The cluster
#
# On Slurm, `sinfo` lists the nodes of each partition and `squeue` the jobs waiting or running.
# With the local backend every "node" is a group of processes on this machine.

# %%
import os

from labkit import slurmcli
from labkit.site import resolve_cluster

if backend == "slurm":
    prof = resolve_cluster(cluster)
    for cmd in (["sinfo", "-N", "-l"], ["squeue"]):
        print("$", " ".join(cmd))
        p = slurmcli.run(cmd, slurm_conf=prof.slurm_conf)  # (a missing command: exit 127, its message)
        print(p.stdout if p.returncode == 0 else f"({slurmcli.why(p)})")
else:
    print(f"local backend: {nodes} simulated node(s) x {gpus_per_node} process(es) on "
          f"{os.cpu_count()} CPU core(s) of this machine")

# %%
from IPython.display import Image

from labkit.paths import REPO_ROOT

Image(filename=str(REPO_ROOT / "images" / "topology_2x2.png"))

# %% [markdown]
# ## 3 The dataset and the tokenizer
#
# `code/prepare_data.py` (run by `make data`) trained a byte-level BPE tokenizer (GPT-2 file
# format: `vocab.json` + `merges.txt`) and wrote the corpus as a Megatron indexed dataset
# (`corpus_text_document.bin` + `.idx`): token ids, one document after another.

# %%
from tokenizers import ByteLevelBPETokenizer

from labkit.paths import DATA_DIR

tok_dir = DATA_DIR / "tokenizer"
tok = ByteLevelBPETokenizer(str(tok_dir / "vocab.json"), str(tok_dir / "merges.txt"))
enc = tok.encode("Data parallelism splits every batch across the ranks.")
print(tok.get_vocab_size(), "tokens in the vocabulary")
list(zip(enc.ids, enc.tokens))

# %%
from labkit.quiet import quiet_megatron

with quiet_megatron():  # megatron-core's notes about optional packages, said once
    from megatron.core.datasets.indexed_dataset import IndexedDataset

ds = IndexedDataset(str(DATA_DIR / "corpus_text_document"))
print(f"{len(ds):,} documents, {int(ds.sequence_lengths.sum()):,} tokens")
print(tok.decode(ds[0][:60].tolist()))

# %% [markdown]
# ## 4 Nodes, ranks and process groups
#
# A **node** is one machine. Each GPU (on CPU: each training process) runs one process, a
# **rank**; the ranks of a job are numbered `0 .. world_size - 1` and node 0 holds the first
# `gpus_per_node` of them. A **process group** is a subset of ranks that talk to each other:
# the tensor-parallel (TP) group shares every layer, the pipeline-parallel (PP) group passes
# activations from stage to stage, the data-parallel (DP) group averages gradients.
#
# **Exercise 00.1**: the parameters cell above describes this series' job (`nodes`,
# `gpus_per_node`). How many ranks does it have? Write a Python expression of the parameters, so
# that your answer stays right when papermill changes them.

# %%
from labkit.exercises import FIXME, check_world_size

world_size = nodes * gpus_per_node  # EXERCISE: the number of ranks of this job
ranks = check_world_size(world_size, nodes=nodes, gpus_per_node=gpus_per_node)

# %% [markdown]
# megatron-core numbers ranks with TP fastest, then DP, then PP (order `tp-cp-ep-dp-pp`): TP
# groups are neighbouring ranks, which the launcher puts on the same node.

# %%
from labkit.planner import rank_grid

grid = rank_grid(ranks.value, tp=2, pp=1, gpus_per_node=gpus_per_node)  # your world_size once it passes
print(grid.render())
grid.to_frame()

# %%
Image(filename=str(REPO_ROOT / "images" / "layout_tp2_dp2.png"))

# %% [markdown]
# ## Summary
#
# - `labkit doctor` tells you before a workshop whether the machine or cluster is ready.
# - The training data is a BPE tokenizer plus an indexed dataset of token ids.
# - One rank per GPU (per process on CPU): you counted the world size of this job yourself;
#   TP x PP x DP must multiply to it.
# - Ranks are laid out TP-first, so TP groups stay inside a node and DP / PP groups cross nodes.
#
# Next: **01**, a first training run on one node.
