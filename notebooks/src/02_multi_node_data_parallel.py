# %% [markdown]
# # 02 Multi-node data parallel
#
# **What you will learn**
# - how a 2-node job is described and what its sbatch script asks Slurm for;
# - how to confirm the world size from the log;
# - how iteration time changes from 1 node to 2 nodes, and what scaling efficiency means;
# - how long the gradient all-reduce across the link between nodes takes: predicted from the
#   gradient bytes and the link's rate, then measured.
#
# On the local backend every node is its own network namespace on this machine, and the link
# between nodes is shaped (1 Gbit/s unless the site profile's `local_link` or
# `LABKIT_LINK_RATE` says otherwise): traffic inside a node stays on its loopback, traffic
# between nodes crosses the slow link, as on a cluster.

# %% tags=["parameters"]
profile = "cpu"  # "cpu": tiny GPT on CPU processes (gloo); "gpu": GPT-2 124M on GPUs (NCCL, bf16)
backend = "local"  # "local": processes on this machine (no Slurm needed); "slurm": sbatch
cluster = None  # Slurm cluster profile (name or YAML path); None: $LABKIT_CLUSTER or the mini-cluster
nodes = 2  # nodes of the multi-node run
gpus_per_node = 1  # GPUs per node (training processes per node on CPU: 2 nodes x 1 fit 2 cores)
train_iters = 10  # iterations per run; keep it small on CPU
gpu_model = None  # GPU model for MFU's peak, e.g. "H100"; None: the GPU this kernel sees
one_node_run = "nb02_1node"  # the 1-node run's folder under runs/
link_gbps = None  # the link between your nodes in Gbit/s; None: read from the job where labkit can
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
# of ranks. On CPU each rank gets one thread, and the 2-node run has no more ranks than this
# machine has cores, so what it adds is the network, not ranks fighting for cores.

# %%
from labkit.config import RunConfig
from labkit.site import resolve_cluster

one = RunConfig.for_profile(profile, cluster=resolve_cluster(cluster), name=one_node_run, backend=backend,
                            nodes=1, gpus_per_node=gpus_per_node, train_iters=train_iters)
two = one.replace(name=run_name, nodes=nodes, global_batch_size=one.global_batch_size * nodes,
                  nccl_debug=profile == "gpu")  # NCCL_DEBUG=INFO: notebook 03 reads its lines
print(two.summary())

import os

cores = os.cpu_count()
if two.device == "cpu":
    print(f"core budget: {two.world_size} rank(s) x {os.environ.get('OMP_NUM_THREADS', '1')} "
          f"thread(s) on this machine's {cores} core(s)"
          + ("" if two.world_size <= cores else
             " (more ranks than cores: they also compete for the cores)"))

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
# The 1-node run gives your baseline: its median iteration time `t1`.

# %%
from labkit.lab import launch, steady_median
from labkit.logs import load_runs

job1 = launch(one, cluster=cluster)
assert job1.state() == "COMPLETED", job1.tail(30)
t1 = steady_median(load_runs([job1.run_dir]))
print(f"1 node ({one.world_size} rank(s)): median {t1:.1f} ms per iteration")

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

from labkit.measured.link import job_link

link = job_link(job2.run_dir, backend=backend, cluster=resolve_cluster(cluster))
print("between the nodes:", link.said)

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
# ## 6 The gradient all-reduce across the link
#
# In data parallelism every rank all-reduces its gradients once per iteration. Their size is
# the parameters of a rank times the bytes of one gradient; labkit reads the parameters from the
# run's log, and the link's rate from the job (what its nodes were built with), not from a
# constant.

# %%
from labkit.measured.link import reference

bytes_per_grad = 4 if two.precision == "fp32" else 2  # fp32 gradients; bf16/fp16 halve them
n_params = int(r2.params["parameters"].max())
grad_bytes = n_params * bytes_per_grad
ranks = two.world_size
if link_gbps is not None:
    rate_bps, rate_from = link_gbps * 1e9, "link_gbps, the parameter you set"
elif link.bits_per_s is not None:
    rate_bps, rate_from = link.bits_per_s, "this job's link"
else:
    ref = reference()
    rate_bps = ref["link_bits_per_s"]
    rate_from = (f"the REFERENCE link ({ref['machine']}, {ref['date']}): this job's nodes had "
                 f"no link whose rate labkit knows")
print(f"gradients: {n_params:,} parameters x {bytes_per_grad} bytes = {grad_bytes / 1e6:.2f} MB "
      f"per rank; {ranks} ranks")
print(f"link rate: {rate_bps / 1e9:g} Gbit/s ({rate_from})")

# %% [markdown]
# **Exercise 02.3** (predict): a ring all-reduce among `n` ranks sends `2 (n-1)/n` times the
# buffer out of every rank, and the ring crosses the link between the nodes. How long does the
# all-reduce of `grad_bytes` take on a link of `rate_bps` bits per second? Answer in
# milliseconds (bytes are 8 bits).

# %%
from labkit.measured.link import ring_allreduce_ms

predicted_ms = 2 * (ranks - 1) / ranks * grad_bytes * 8 / rate_bps * 1000  # EXERCISE: in ms
predicted = check_value("allreduce_ms", predicted_ms,
                        ring_allreduce_ms(grad_bytes, ranks, rate_bps), rel_tol=0.02,
                        hint="Multiply the bytes every rank sends (2 (n-1)/n x grad_bytes) by 8 "
                             "to get bits, divide by the rate in bits per second, and turn "
                             "seconds into milliseconds.")

# %% [markdown]
# Now measure it: the all-reduce benchmark (notebook 03 explains it) all-reduces a buffer of
# exactly `grad_bytes` among the same ranks on the same nodes as the 2-node run.

# %%
from labkit.lab import run_allreduce_bench

bench_cfg = two.replace(name=f"{run_name}_allreduce")
bw = run_allreduce_bench(bench_cfg, cluster=cluster, min_bytes=str(grad_bytes),
                         max_bytes=str(grad_bytes), scopes="world")
measured_ms = float(bw["time_us"].median()) / 1000
print(f"all-reduce of {grad_bytes / 1e6:.2f} MB among {ranks} ranks: predicted "
      f"{predicted.value:.1f} ms, measured {measured_ms:.1f} ms "
      f"(measured / predicted = {measured_ms / predicted.value:.2f})")
if not link.separate:
    print(f"Your all-reduce crossed this machine's loopback, not a link of "
          f"{rate_bps / 1e9:g} Gbit/s: the prediction is for the reference's link, the "
          f"measurement is not (section 7 shows the reference's own).")

# %% [markdown]
# ## 7 What your numbers say
#
# The cell below compares what the second node cost per iteration (`t2 - t1`) with the
# all-reduce you measured alone, and says only what those numbers show.

# %%
extra = t2 - t1
print(f"1 node ({one.world_size} rank(s)): {t1:.1f} ms per iteration; {nodes} nodes "
      f"({two.world_size} ranks): {t2:.1f} ms, {t2 / t1:.2f}x; weak-scaling efficiency "
      f"{eff.value:.0%}.")
print(f"The second node cost {extra:+.1f} ms per iteration; the gradient all-reduce between the "
      f"nodes, measured alone, takes {measured_ms:.1f} ms ({link.said}).")
if not link.separate:
    ref = reference()
    print(f"Your nodes had no link between them (their all-reduce crossed loopback), so your "
          f"numbers cannot show what a link costs. REFERENCE, not your "
          f"machine ({ref['machine']}, {ref['date']}, {ref['how']}): 1 node "
          f"{ref['nb02']['t1_ms']:.1f} ms, 2 nodes {ref['nb02']['t2_ms']:.1f} ms per iteration; "
          f"all-reduce predicted {ref['nb02']['predicted_ms']:.1f} ms, measured "
          f"{ref['nb02']['measured_ms']:.1f} ms.")
elif extra < 0:
    print("The 2-node run was even faster than the 1-node run: no run does better than ideal "
          "weak scaling, so the iteration times are timing noise here (one run each); the "
          "all-reduce measured alone is what the link costs.")
elif abs(extra - measured_ms) <= 0.3 * measured_ms:
    print("Within 30 % of each other: the time the second node added is the gradient "
          "all-reduce across the link.")
elif extra < measured_ms:
    print(f"The second node added less than the all-reduce takes alone: "
          f"{measured_ms - extra:.1f} ms of it did not add to the iteration (it overlapped "
          f"with other work, or the 1-node run was slowed by something else).")
else:
    print(f"The second node added more than the all-reduce alone: {extra - measured_ms:.1f} ms "
          f"per iteration come from something else (the per-iteration plot in section 5 shows "
          f"how steady each run was).")
load = os.getloadavg()[0]
if load > cores:
    print(f"This machine's load average is {load:.1f} on {cores} core(s): other programs shared "
          f"the cores with these runs (one run each), so their iteration times are noisy; the "
          f"all-reduce measured alone is the steadier number.")

# %% [markdown]
# ## Summary
#
# - A multi-node job is the same config with more `nodes`; Slurm starts one `torchrun` per node.
# - The world-size line shows that all ranks joined.
# - Weak-scaling efficiency compares your 2-node iteration time with the ideal, your 1-node time.
# - The gradient all-reduce's time follows from the gradient bytes and the link's rate; you
#   predicted it, measured it, and compared it with what the second node cost (section 7).
#
# Next: **03**, the bandwidth inside a node and across nodes, and which groups cross the link.
