"""code/allreduce_bench.py (nccl-tests analog) and labkit.measured.comm (its parser and plot).

The run tests submit the real benchmark as a labkit job (torchrun, gloo): two simulated nodes
of two processes each on the local backend, and the two-node Slurm mini-cluster.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import matplotlib
import pytest

from labkit.measured import comm
from labkit.run import JobState

matplotlib.use("Agg")
REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "code" / "allreduce_bench.py"
FIXTURES = REPO / "tests" / "fixtures" / "logs"


def _load_bench():
    spec = importlib.util.spec_from_file_location("allreduce_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("text,expected", [("8", 8), ("1K", 1024), ("64M", 64 << 20),
                                           ("1g", 1 << 30), ("4KB", 4096), ("1.5K", 1536)])
def test_parse_size_like_nccl_tests(text, expected):
    assert _load_bench().parse_size(text) == expected


def test_message_sizes_and_bus_factors():
    b = _load_bench()
    assert b.message_sizes(1024, 1 << 20, 4) == [1024, 4096, 16384, 65536, 262144, 1048576]
    # nccl-tests: all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n
    assert b.BUS_FACTOR["all_reduce"](8) == pytest.approx(1.75)
    assert b.BUS_FACTOR["all_gather"](8) == pytest.approx(0.875)
    assert b.BUS_FACTOR["reduce_scatter"](2) == pytest.approx(0.5)


def test_bad_op_is_refused_with_the_menu():
    r = subprocess.run([sys.executable, str(BENCH), "--ops", "allreduce"], capture_output=True,
                       text=True)
    assert r.returncode == 2
    assert "allreduce" in r.stderr and "all_reduce" in r.stderr


def test_without_torchrun_says_how_to_start_it():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    r = subprocess.run([sys.executable, str(BENCH)], capture_output=True, text=True, env=env)
    assert r.returncode != 0 and "torchrun" in r.stderr


def test_parses_nccl_tests_table():
    # A real all_reduce_perf table posted in nccl-tests issue 232 (2 ranks, one H100 per node; the
    # excerpt ends after 5 rows): read by the reader labkit parse uses (labkit/logs/nccltests.py).
    real = FIXTURES / "real" / "nccl_tests_2024_tree_two_nodes_table_cut_nccltests232.txt"
    df = comm.read_busbw(real, op="all_reduce")
    assert len(df) == 5
    assert list(df["size_bytes"])[:3] == [2097152, 4194304, 8388608]
    big = df.iloc[-1]
    assert big["dtype"] == "float32" and big["op"] == "all_reduce" and big["wrong"] == 0
    assert big["time_us"] == 812.3 and big["algbw_gbps"] == 41.31
    assert big["busbw_gbps"] == pytest.approx(big["algbw_gbps"] * 2 * (2 - 1) / 2)  # 2 ranks
    assert big["inplace_busbw_gbps"] == pytest.approx(41.52) and big["inplace_wrong"] == 0
    peak = comm.peak_busbw(df)
    assert peak.iloc[0]["size_bytes"] == 33554432


def test_real_run_as_local_job_two_nodes_all_ops_all_scopes(run_root, monkeypatch):
    """Submitted like any run (local backend: two torchrun agents = two simulated nodes, two
    processes each); every op, every scope; results in the run dir and in the log's table."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    job = comm.submit_bench("bw", nodes=2, gpus_per_node=2, backend="local",
                            ops=("all_reduce", "all_gather", "reduce_scatter"),
                            min_bytes="1K", max_bytes="64K", factor=8, iters=2, warmup=1)
    assert job.wait(timeout=240, progress=False) is JobState.COMPLETED, job.tail(30)
    # A program with arguments, not a training run: no config.json, the arguments in job.sh.
    assert not (job.run_dir / "config.json").exists()
    assert f"--json-out {job.run_dir}/busbw.jsonl" in (job.run_dir / "job.sh").read_text()

    df = comm.read_busbw(job.run_dir)
    # 3 ops x 3 scopes x 3 sizes (1K, 8K, 64K)
    assert len(df) == 27
    assert set(df["scope"]) == {"world", "intra", "inter"}
    assert df.loc[df.scope == "world", "group_size"].eq(4).all()
    assert df.loc[df.scope != "world", "group_size"].eq(2).all()
    assert df["nodes"].eq(2).all() and df["wrong"].eq(0).all()
    assert (df["busbw_gbps"] > 0).all()
    ar = df[(df.op == "all_reduce") & (df.scope == "world")]
    assert (ar["busbw_gbps"] / ar["algbw_gbps"]).round(6).eq(1.5).all()  # 2*(4-1)/4

    # The table rank 0 printed into log.txt parses to the same rows.
    text = comm.read_busbw(job.log_path)
    assert len(text) == 27
    assert list(text["size_bytes"]) == list(df["size_bytes"])
    assert text[["op", "scope"]].values.tolist() == df[["op", "scope"]].values.tolist()
    # the table prints 3 decimals
    assert text["busbw_gbps"].tolist() == pytest.approx(df["busbw_gbps"].tolist(), abs=0.0006)

    ax = comm.plot_busbw(df[df.op == "all_reduce"])
    assert len(ax.get_lines()) == 3
    assert ax.get_xlabel() == "message size (bytes)"


@pytest.mark.slurm
def test_bench_job_on_minicluster_intra_and_inter_node(slurm_cluster, run_root, monkeypatch):
    """Through sbatch on the two-node mini-cluster: one rank per node talks over the shaped
    inter-node link (scope inter), two ranks of one node over loopback (scope intra)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    job = comm.submit_bench("bw-slurm", nodes=2, gpus_per_node=2, backend="slurm",
                            cluster=slurm_cluster, min_bytes="4K", max_bytes="256K", factor=8,
                            iters=2, warmup=1)
    assert job.wait(timeout=300, progress=False) is JobState.COMPLETED, job.tail(30)
    df = comm.read_busbw(job.run_dir)
    assert len(df) == 3 * 3 and df["wrong"].eq(0).all() and df["nodes"].eq(2).all()
    peak = comm.peak_busbw(df).set_index("scope")
    assert set(peak.index) == {"world", "intra", "inter"}
    assert peak.loc["inter", "group_size"] == 2 and peak.loc["world", "group_size"] == 4
