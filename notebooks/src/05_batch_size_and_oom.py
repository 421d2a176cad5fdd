# %% [markdown]
# # 05 Batch size and out-of-memory
#
# **What you will learn**
# - how throughput (tokens/s) changes with the micro batch size;
# - how the planner predicts memory per rank, and how to predict from its parts which micro
#   batch still fits;
# - what a real out-of-memory failure looks like, how labkit's parser finds it, and that the
#   planner had predicted it before the job was submitted.

# %% tags=["parameters"]
profile = "cpu"  # "cpu": tiny GPT on CPU processes (gloo); "gpu": GPT-2 124M on GPUs (NCCL, bf16)
backend = "local"  # "local": processes on this machine (no Slurm needed); "slurm": sbatch
cluster = None  # Slurm cluster profile (name or YAML path); None: $LABKIT_CLUSTER or the mini-cluster
nodes = 1  # nodes of the runs in this notebook
gpus_per_node = 2  # GPUs per node (training processes per node on CPU)
train_iters = 10  # iterations per run; keep it small on CPU
gpu_model = None  # GPU model for MFU's peak, e.g. "H100"; None: the GPU this kernel sees
micro_batches = [1, 2, 4]  # micro batch sizes of the throughput sweep
one_node_run = "nb01_dp"  # notebook 01's run (micro batch 2), reused for that point
micro1_run = "nb01_micro1"  # notebook 01's edited run (micro batch 1), reused for that point
memory_limit_gb = 1.0  # CPU only: per-rank cap of the OOM demo; on GPUs the budget is the GPU's memory
run_prefix = "nb05"  # runs go to runs/<run_prefix>_*/

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
# ## 1 Throughput vs micro batch
#
# Same global batch, different micro batches: a bigger micro batch means fewer, larger
# matrix multiplications per iteration (fewer microbatches to accumulate).

# %%
import math

from labkit.config import RunConfig
from labkit.site import resolve_cluster
from labkit.lab import launch

base = RunConfig.for_profile(profile, cluster=resolve_cluster(cluster), name=one_node_run, backend=backend,
                             nodes=nodes, gpus_per_node=gpus_per_node, train_iters=train_iters)
gbs = max(micro_batches) * base.dp
earlier = [base, base.replace(name=micro1_run, micro_batch_size=1)]  # notebook 01's two runs
jobs = []
for m in micro_batches:
    cfg = base.replace(micro_batch_size=m, global_batch_size=gbs, name=f"{run_prefix}_mbs{m}")
    # the very run of notebook 01: reused, not trained again
    cfg = next((e for e in earlier if cfg.replace(name=e.name) == e), cfg)
    jobs.append(launch(cfg, cluster=cluster))
assert all(j.state() == "COMPLETED" for j in jobs), [(j.name, str(j.state())) for j in jobs]

# %%
import matplotlib.pyplot as plt

from labkit.logs import load_runs
from labkit.measured.plots import plot_throughput_vs_micro_batch

df = load_runs([j.run_dir for j in jobs])
plot_throughput_vs_micro_batch(df)
plt.show()

# %%
from labkit.lab import steady_median

tput = {m: steady_median(df[df["micro_batch_size"] == m], "tokens_per_sec") for m in micro_batches}
print({m: f"{v:,.0f} tokens/s" for m, v in tput.items()})

# %% [markdown]
# **What did your sweep show?** The cell below reads it: where throughput peaked, and by how
# much against the smallest micro batch.

# %%
small, best = min(tput), max(tput, key=tput.get)
print("tokens/s relative to micro batch "
      f"{small}: " + ", ".join(f"{m}: {v / tput[small]:.2f}x" for m, v in tput.items()))
if best == small:
    print(f"The smallest micro batch, {small}, was the fastest here: larger ones did not help.")
elif best == max(tput):
    print("Throughput still rose at the largest micro batch tried: fewer, larger matrix "
          "multiplications used the hardware better.")
else:
    print(f"Past micro batch {best} throughput fell again.")
if profile == "cpu" and best != max(tput):
    print(f"On CPU the {base.world_size} ranks share this machine's cores: once the matmuls keep "
          f"every core busy, larger ones do not run faster per sample, and differences of a few "
          f"percent are within the noise of a shared machine. On GPUs a larger micro batch keeps "
          f"the tensor cores busier, up to the memory limit.")

# %% [markdown]
# The same per device, with MFU on GPUs (empty on `profile="cpu"`: a CPU has no peak FLOPs in
# `labkit.measured.hardware.PEAK_TFLOPS`). On a GPU, a larger micro batch keeps the tensor cores busier
# until memory runs out; MFU shows how much of the peak that buys.

# %%
from labkit.lab import throughput

throughput(df, by="micro_batch_size", gpu_model=gpu_model)

# %% [markdown]
# ## 2 What fits? Predict it from the planner's parts
#
# The planner adds up weights, gradients, optimizer state, start-up buffers, activations and
# logits per rank. The budget is what one rank may use: on GPUs the GPU's memory
# (`gpu_memory_gb`, from the site profile when it says), on CPU `memory_limit_gb`: there the
# engine caps what a process may allocate after building the model, so the planner counts what
# comes later (optimizer moments, start-up buffers, activations, logits), times the allocator's
# factor, plus a fixed overhead. Only the activations, the logits and the start-up buffers grow
# with the micro batch, each in proportion to it.

# %%
from labkit.planner import plan

cap = {"memory_limit_gb": memory_limit_gb} if base.device == "cpu" else {}


def planned(m: int):
    return plan(base.replace(micro_batch_size=m, global_batch_size=m * base.dp, **cap))


one, two = planned(1), planned(2)
budget_gb = one.gpu_memory_gb  # the limit the planner compares with
per_sample_gb = two.required_gb - one.required_gb
fixed_gb = one.required_gb - per_sample_gb
print(one.summary().splitlines()[3])
print(f"budget per rank: {budget_gb:g} GB; part that does not grow with the micro batch: "
      f"{fixed_gb:.4f} GB; each sample of the micro batch adds {per_sample_gb:.5f} GB "
      f"(activations, logits, start-up buffers, x the allocator's factor)")

# %% [markdown]
# **Exercise 05.1** (predict): micro batches come in powers of two (1, 2, 4, ...). Which is the
# largest micro batch that fits the budget? Work it out from the two numbers just printed; the
# planner's table and two real runs, one on each side of your answer, come after.

# %%
from labkit.exercises import FIXME, check_max_micro_batch

largest_fitting = 2 ** int(math.log2((budget_gb - fixed_gb) / per_sample_gb))  # EXERCISE: a power of two
sizes = [2 ** k for k in range(13)]
need = {m: planned(m).required_gb for m in sizes}
sizes = [m for m in sizes if m == 1 or need[m // 2] <= budget_gb]  # up to the first that fails
need = {m: need[m] for m in sizes}
fit = check_max_micro_batch(largest_fitting, peak_gb_by_micro_batch=need, limit_gb=budget_gb)

# %% [markdown]
# The planner's need for each size (your answer is the last one under the budget):

# %%
{m: f"{gb:.3f} GB {'fits' if gb <= budget_gb else 'does NOT fit'}" for m, gb in need.items()}

# %% [markdown]
# ## 3 The boundary, run for real
#
# Two one-iteration runs under the same budget (one iteration reaches the peak: forward,
# backward and the optimizer's first step): the largest micro batch the planner says fits, and
# the next size up, which it says does not. On CPU the cap is on the address space the process
# may add after start-up (`RLIMIT_AS`); the log's memory lines say how much it added
# (`max reserved`, the largest VmSize, minus the VmSize at start-up).

# %%
import re


def edge_run(m: int):
    c = base.replace(name=f"{run_prefix}_edge_mbs{m}", micro_batch_size=m,
                     global_batch_size=m * base.dp, train_iters=1, lr_warmup_iters=0, **cap)
    # a run of this size that finished (a second pass) is reused; one that failed runs again
    return c, launch(c, cluster=cluster, progress=False)


def added_gb(job) -> float | None:
    """What rank 0 added to its address space after start-up, from its log (CPU only)."""
    text = job.log_path.read_text(errors="replace")
    start = re.search(r"VmSize after start-up ([\d.]+) GB", text)
    peaks = re.findall(r"max reserved: ([\d.]+)", text)
    return max(float(x) for x in peaks) * 2**20 / 1e9 - float(start.group(1)) if start and peaks else None


fit_m = fit.value
for m in (fit_m, 2 * fit_m):
    edge_cfg, edge_job = edge_run(m)
    grew = added_gb(edge_job)
    print(f"micro batch {m}: planner needs {plan(edge_cfg).required_gb:.3f} GB of {budget_gb:g} "
          f"GB ({'fits' if plan(edge_cfg).fits else 'does NOT fit'}); the run {edge_job.state()}"
          + (f", rank 0 added {grew:.3f} GB after start-up" if grew is not None else ""))
edge_ok = str(edge_job.state()) == "COMPLETED"
if edge_ok:
    print(f"The planner's boundary is on the safe side here: micro batch {2 * fit_m} still ran. Its "
          f"need adds the allocator's factor and a fixed overhead to the tensors it counts, "
          f"so a size it rejects can still fit; what it accepts did fit.")

# %% [markdown]
# ## 4 A micro batch that does not fit
#
# Doubling the micro batch until a run fails (the size the planner rejected, or larger): we
# submit it anyway to see the real failure.

# %%
oom_m = 4 * fit_m if edge_ok else 2 * fit_m
oom_cfg, oom_job = edge_run(oom_m) if edge_ok else (edge_cfg, edge_job)  # no second try of 2 x
oom_plan = plan(oom_cfg)
print(oom_plan.summary())
assert not oom_plan.fits, "the planner should predict that this micro batch does not fit"
print(f"micro batch {oom_m}: {oom_job.state()}")
print(oom_job.tail(8))

# %%
from labkit.logs import diagnose

failures = diagnose(oom_job.log_path, exit_code=oom_job.exit_code(),
                    job_state=str(oom_job.state()))
for f in failures[:3]:
    print(f"{f.kind}: {f.message}\n  hint: {f.hint}")
assert str(oom_job.state()) in ("FAILED", "OUT_OF_MEMORY"), oom_job.state()
assert failures and failures[0].kind in ("host_oom", "gpu_oom"), failures
asked = [int(b) for b in re.findall(r"allocate (\d+) bytes", oom_job.tail(400))]
st = oom_plan.last_stage
terms = {"logits": st.logits, "activations": st.activations, "optimizer": st.optimizer}
if asked:
    gb = asked[-1] / 1e9
    close = [k for k, v in terms.items() if abs(v - gb) <= 0.01 * v]
    print(f"the allocation that failed asked for {asked[-1]:,} bytes = {gb:.3f} GB: "
          + (f"exactly the planner's {close[0]} term ({terms[close[0]]:.3f} GB): the step that "
             f"tipped the rank over its budget." if close else
             "no single term of the plan; the rank was already near its budget."))

# %% [markdown]
# ## 5 Memory you can look at
#
# The memory lines of the log are the process's resident memory (RSS on CPU): the interpreter
# and libraries are in it. The engine also counts its own tensors on every rank
# (`runs/<name>/memory/rank_N.json`): weights, gradients, optimizer state and other buffers
# from the model and optimizer objects, and the peak of what autograd saved for backward (the
# activations). That is what the planner predicts. Left: tensors per iteration; right: RSS.

# %%
from labkit.measured.memory import compare_memory, load_memory, memory_iterations
from labkit.measured.plots import plot_memory, plot_memory_components

big_job = jobs[-1]  # the largest micro batch of the sweep
big_cfg = RunConfig.from_json(big_job.run_dir / "config.json")
its = memory_iterations(big_job.run_dir)
fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
plot_memory(its, y="tensors_mb", x="iteration", ax=axes[0])
plot_memory(its, y="rss_mb", x="iteration", ax=axes[1])
fig.suptitle(f"{big_job.name}: tensor memory vs resident memory per rank")
fig.tight_layout()
plt.show()

# %% [markdown]
# Predicted (hatched) and measured, component by component, for that run:

# %%
mem_cmp = compare_memory(big_cfg, load_memory(big_job.run_dir))
plot_memory_components(mem_cmp)
plt.show()
pred, meas = (mem_cmp[mem_cmp["source"] == s].iloc[0] for s in ("predicted", "measured"))
for c in ("weights", "gradients", "optimizer", "activations"):
    print(f"{c:12s} predicted {pred[c + '_mb']:8.3f} MB, measured {meas[c + '_mb']:8.3f} MB "
          f"({meas[c + '_mb'] / pred[c + '_mb'] - 1:+.1%})")
rss = float(its["rss_mb"].max())
print(f"tensors {meas['total_mb']:.1f} MB of a process of {rss:.0f} MB RSS: "
      f"{meas['total_mb'] / rss:.1%}")

# %%
from labkit.record import record

for m, v in tput.items():
    record(f"mbs{m}.tokens_per_sec", v)
record("oom_detected", failures[0].kind)
record("oom_predicted", not oom_plan.fits)

# %% [markdown]
# The queue after: the failed run is gone from it, nothing of yours is left running.

# %%
print(queue_view(backend=backend, cluster=site))

# %% [markdown]
# ## Summary
#
# - Your sweep measured tokens/s per micro batch (section 1 said where it peaked). Larger
#   micro batches help while they make the hardware busier: on GPUs up to the memory limit; on
#   a CPU whose cores are already busy, little or not at all.
# - The planner predicts memory per rank before you queue: a part that stays and a part per
#   sample of the micro batch. You predicted the largest micro batch that fits from those two
#   numbers, and the two runs on either side of it did what the planner said.
# - An out-of-memory job fails with the allocator's own error; `labkit.logs.diagnose` names it
#   (`host_oom` on CPU, `gpu_oom` on GPUs) and suggests a fix.
#
# Next: **06**, splitting the model itself with tensor and pipeline parallelism.
