"""code/allreduce_bench.py (nccl-tests analog) and labkit.comm (its parser and plot).

The run tests start the real benchmark with torchrun on gloo: two simulated nodes of two
processes each, so the world, intra-node and inter-node scopes all have groups of two.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import matplotlib
import pytest

from labkit import comm

matplotlib.use("Agg")
REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "code" / "allreduce_bench.py"
FIXTURES = REPO / "tests" / "fixtures" / "logs"


def _load_bench():
    spec = importlib.util.spec_from_file_location("allreduce_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    # Built from nccl-tests' documented header (size count type redop root time algbw busbw
    # #wrong, out-of-place then in-place), 16 ranks.
    df = comm.read_busbw(FIXTURES / "nccl-tests-2.x_all_reduce_perf_16ranks.txt", op="all_reduce")
    assert len(df) == 7
    assert list(df["size_bytes"])[:3] == [8, 128, 2048]
    big = df.iloc[-1]
    assert big["dtype"] == "float32" and big["op"] == "all_reduce" and big["wrong"] == 0
    assert big["busbw_gbps"] == pytest.approx(big["algbw_gbps"] * 2 * 15 / 16, rel=0.01)
    assert big["inplace_busbw_gbps"] == pytest.approx(13.05)
    peak = comm.peak_busbw(df)
    assert peak.iloc[0]["size_bytes"] == 134217728


def test_real_run_two_nodes_all_ops_all_scopes(tmp_path):
    """Two torchrun agents (simulated nodes) x 2 processes; every op, every scope."""
    out = tmp_path / "bw.jsonl"
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={port}"]
    args = [str(BENCH), "-b", "1K", "-e", "64K", "-f", "8", "-n", "2", "-w", "1",
            "--ops", "all_reduce,all_gather,reduce_scatter", "--scopes", "world,intra,inter",
            "--json-out", str(out), "--timeout", "60"]
    procs = [subprocess.Popen(cmd + [f"--node_rank={i}"] + args, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for i in range(2)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-3000:] + outs[1][1][-3000:]

    df = comm.read_busbw(out)
    # 3 ops x 3 scopes x 3 sizes (1K, 8K, 64K)
    assert len(df) == 27
    assert set(df["scope"]) == {"world", "intra", "inter"}
    assert df.loc[df.scope == "world", "group_size"].eq(4).all()
    assert df.loc[df.scope != "world", "group_size"].eq(2).all()
    assert df["nodes"].eq(2).all() and df["wrong"].eq(0).all()
    assert (df["busbw_gbps"] > 0).all()
    ar = df[(df.op == "all_reduce") & (df.scope == "world")]
    assert (ar["busbw_gbps"] / ar["algbw_gbps"]).round(6).eq(1.5).all()  # 2*(4-1)/4

    # The printed table (node 0's stdout) parses to the same rows.
    text = comm.parse_bench_text(outs[0][0])
    assert len(text) == 27
    assert list(text["size_bytes"]) == list(df["size_bytes"])
    assert text[["op", "scope"]].values.tolist() == df[["op", "scope"]].values.tolist()
    # the table prints 3 decimals
    assert text["busbw_gbps"].tolist() == pytest.approx(df["busbw_gbps"].tolist(), abs=0.0006)

    ax = comm.plot_busbw(df[df.op == "all_reduce"])
    assert len(ax.get_lines()) == 3
    assert ax.get_xlabel() == "message size (bytes)"
