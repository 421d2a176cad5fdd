# %% [markdown]
# # 04 Monitoring and profiling
#
# **What you will learn**
# - how to follow a running job (a small job monitor) instead of `squeue` and `sleep`, and look
#   at its devices while it trains (`nvidia-smi` on GPUs, the processes on CPU);
# - how to read a run's TensorBoard scalars back into a DataFrame and plot them, and how to open
#   TensorBoard itself;
# - where a PyTorch profiler trace is and how to open it on a timeline, and how it becomes a
#   compute / communication / idle breakdown.

# %% tags=["parameters"]
profile = "cpu"  # "cpu": tiny GPT on CPU processes (gloo); "gpu": GPT-2 124M on GPUs (NCCL, bf16)
backend = "local"  # "local": processes on this machine (no Slurm needed); "slurm": sbatch
cluster = None  # Slurm cluster profile (name or YAML path); None: $LABKIT_CLUSTER or the mini-cluster
nodes = 1  # nodes of the profiled run
gpus_per_node = 2  # GPUs per node (training processes per node on CPU)
train_iters = 10  # iterations of the run (the profiler records iterations 3-5)
run_name = "nb04_profiled"  # the run's folder under runs/

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
# ## 1 Submit a profiled run and watch it
#
# `torch_profiler=True` records torch.profiler traces of a few iterations on rank 0 into
# `runs/<name>/profile/`. The monitor below refreshes the job's state and last log lines until it
# ends (in a live notebook it updates in place).

# %%
from labkit.config import RunConfig
from labkit.lab import launch
from labkit.widgets import job_monitor

cfg = RunConfig.for_profile(profile, name=run_name, backend=backend, nodes=nodes,
                            gpus_per_node=gpus_per_node, train_iters=train_iters)
cfg = cfg.replace(torch_profiler=True)  # record torch.profiler traces
job = launch(cfg, cluster=cluster, wait=False)

# %% [markdown]
# **The devices while it trains.** On a GPU node you would run `nvidia-smi` in a second terminal:
# how busy each GPU is and how much of its memory the run holds. `device_view` asks the node the
# same (`nvidia-smi --query-gpu=...`, inside the job's allocation on Slurm). A CPU run has no GPU
# to ask: its training processes stand in (`ps`: CPU % and resident memory per rank), and the
# output says so.

# %%
from labkit.lab import wait_for_iteration
from labkit.lab_watch import device_view

wait_for_iteration(job, 2)  # training, not starting up
print(device_view(job))

# %%
final = job_monitor(job, refresh_s=1.0)
assert final == "COMPLETED", job.tail(30)

# %% [markdown]
# ## 2 TensorBoard scalars
#
# The training script writes TensorBoard event files to `<run root>/<name>/tb/`; TensorBoard
# lists each of them as a run. TensorBoard is a small web server: start it on the run root with
# the command printed below (in a terminal, where the runs are), then open its address.
# The command is written as you type it in a terminal opened in the repository (with
# `$LABKIT_RUN_ROOT` when that variable sets your run root).
# - **On this machine**: open http://localhost:6006.
# - **On a cluster**: start it on the login node (the runs are on the shared file system) and
#   forward the port from your laptop: `ssh -L 6006:localhost:6006 you@login-node`, then open
#   http://localhost:6006 on the laptop. Take another port if 6006 is in use (`--port`), the
#   same on both sides.
# - **Through JupyterLab**: with `jupyter-server-proxy` installed next to JupyterLab, the
#   JupyterLab server forwards to it: open `<your JupyterLab address>/proxy/6006/` (keep the
#   final `/`); no second tunnel is needed.
#
# Here we also read the scalars back as a DataFrame.

# %%
from labkit.measured.tb import read_scalars, tensorboard_command_line

print("$", tensorboard_command_line(port=6006))

tb = read_scalars(job.run_dir / "tb")
print(sorted(tb["tag"].unique()))
tb.head()

# %%
import matplotlib.pyplot as plt

from labkit.measured.plots import plot_scalars

tags = [t for t in ("lm-loss", "iteration-time", "throughput") if t in set(tb["tag"])]
fig, axes = plt.subplots(1, len(tags), figsize=(4 * len(tags), 3.2), squeeze=False)
for ax, tag in zip(axes[0], tags):
    plot_scalars(tb, tag, ax=ax)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 3 Profiler trace: where the time goes
#
# The trace lists every operator and kernel with its start and duration. Look at it on a
# timeline first: PyTorch's TensorBoard plugin for the profiler is deprecated, and PyTorch's own
# documentation opens a trace in Perfetto or `chrome://tracing` instead (TensorBoard stays the
# place for the scalars above). Then labkit sums the trace into compute (matmuls, attention,
# ...), communication (all-reduce, send/recv, ...) and idle (gaps where the rank waits).

# %%
from labkit.lab_watch import trace_view
from labkit.measured.profiling import profile_breakdown

print(trace_view(job.run_dir))
breakdown = profile_breakdown(job.run_dir / "profile")  # read now, shown after your prediction
print(f"the trace holds {len(breakdown)} rank(s) of the run's {cfg.world_size}: "
      f"{', '.join(str(r) for r in breakdown['rank'])}")

# %% [markdown]
# **Exercise 04.1** (predict, then look): the breakdown is read but not shown yet. From what
# you know of this run (a tiny model, ranks sharing this machine's cores, the gradient
# all-reduce every iteration), which phase do you expect to take the largest share of the
# profiled time, summed over the ranks: `"compute"`, `"communication"`, `"memcpy"` or `"idle"`?
# And which of the remedies listed below would shrink that phase?

# %%
from labkit.exercises_reading import REMEDIES

for key, (_, what) in REMEDIES.items():
    print(f"{key!r:22} {what}")

# %%
from labkit.exercises import FIXME
from labkit.exercises_reading import check_profile_reading

phase = max(["compute", "communication", "memcpy", "idle"], key=lambda ph: breakdown[f"{ph}_ms"].sum())  # EXERCISE
remedy = {"compute": "more_ranks", "communication": "overlap", "memcpy": "pinned_memory"}.get(phase, "more_microbatches")  # EXERCISE
reading = check_profile_reading(phase, remedy, breakdown=breakdown)

# %% [markdown]
# Your trace, phase by phase and rank by rank:

# %%
from IPython.display import display

from labkit.lab import shown
from labkit.measured.plots import plot_profile_breakdown

display(breakdown.assign(file=breakdown["file"].map(shown)))  # paths relative to the repository
plot_profile_breakdown(breakdown, normalize=True)
plt.show()
parts = ["compute_ms", "communication_ms", "memcpy_ms", "idle_ms"]
shares = breakdown.set_index("rank")[parts].div(breakdown.set_index("rank")[parts].sum(axis=1),
                                                axis=0)
print(shares.rename(columns=lambda c: c.removesuffix("_ms")).round(2).to_string())
top = shares.mean().idxmax().removesuffix("_ms")
print(f"\n{top} dominates this run ({shares.mean().max():.0%} of the profiled time on average). "
      f"The trace covers rank(s) {', '.join(str(r) for r in breakdown['rank'])} of the run's "
      f"{cfg.world_size} ({cfg.nodes} node(s) x {cfg.gpus_per_node}) in a "
      f"{'CPU (gloo)' if cfg.device == 'cpu' else 'GPU'} run"
      + (": on the local backend the ranks share this machine's cores, so waiting for a busy "
         "core shows up as communication or idle time, not only the bytes moved."
         if backend == "local" else "."))

# %% [markdown]
# ## 4 One training step's memory, by category
#
# The profiler can also say *what* the memory of a step is: it follows every tensor and sorts it
# into parameters, optimizer state, activations, gradients, temporaries and autograd's own
# buffers. That analysis needs the Python stack of every operator, too slow for the engine's
# megatron-core run on a CPU, so here it follows two training steps of a plain PyTorch GPT of
# the cpu profile's shape (embedding, transformer layers, output layer; Adam), run in this
# notebook's own process on the CPU.

# %%
import torch

from labkit.measured.plots import plot_memory_categories
from labkit.measured.step_memory import profile_training_steps, step_summary

shape = RunConfig.for_profile("cpu", name="step_memory")
torch.manual_seed(0)
h, vocab = shape.hidden_size, shape.vocab_size
gpt = torch.nn.Sequential(
    torch.nn.Embedding(vocab, h),
    *[torch.nn.TransformerEncoderLayer(h, shape.num_attention_heads, 4 * h, dropout=0.0,
                                       batch_first=True, norm_first=True)
      for _ in range(shape.num_layers)],
    torch.nn.LayerNorm(h), torch.nn.Linear(h, vocab, bias=False))
adam = torch.optim.Adam(gpt.parameters(), lr=1e-4)
tokens = torch.randint(0, vocab, (shape.micro_batch_size, shape.seq_length + 1))


def lm_loss():
    logits = gpt(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))


step_mem = profile_training_steps(lm_loss, adam, steps=2)
plot_memory_categories(step_mem)
plt.show()
summary = step_summary(step_mem)
summary.round(2)

# %%
peak = step_mem.loc[step_mem["activation_mb"].idxmax()]
opt_before = step_mem[step_mem["step"] == 1]["optimizer_state_mb"].iloc[0]
opt_after = step_mem[step_mem["step"] == 2]["optimizer_state_mb"].min()
assert opt_before == 0 < opt_after and peak["phase"] in ("forward", "backward"), summary
print(f"optimizer state: {opt_before:.2f} MB when step 1 starts, {opt_after:.2f} MB throughout "
      f"step 2 (Adam's two moments, created by its first step; parameters "
      f"{step_mem['parameter_mb'].iloc[0]:.2f} MB)")
print(f"activations peak at {peak['activation_mb']:.2f} MB in step {int(peak['step'])}'s "
      f"{peak['phase']}; gradients reach {step_mem['gradient_mb'].max():.2f} MB in backward")

# %%
from labkit.logs import parse_run
from labkit.record import record, record_run

run = parse_run(job.run_dir)
record_run("profiled", run.iterations, run.memory)
b = breakdown.iloc[0]
record("profiled.communication_share",
       float(b["communication_ms"] / b[["compute_ms", "communication_ms", "memcpy_ms", "idle_ms"]].sum()))

# %% [markdown]
# The queue after: nothing of yours is left running.

# %%
print(queue_view(backend=backend, cluster=site))

# %% [markdown]
# ## Summary
#
# - A job monitor (or `job.wait()`) replaces `squeue` + `sleep` + `tail`.
# - TensorBoard scalars are plain data: `read_scalars` gives a DataFrame you can plot.
# - The profiler's memory timeline shows what a step's memory is made of: the optimizer state
#   appears in the first optimizer step and stays; activations rise in forward and fall in
#   backward, as gradients appear.
# - A profiler trace answers "compute bound or communication bound?" with numbers: you read
#   which phase dominated your run and picked a remedy that shortens it.
#
# Next: **05**, batch size, throughput and running out of memory.
