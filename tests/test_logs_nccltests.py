"""nccl-tests output (labkit/logs/nccltests.py): its tables in ``labkit parse`` and in
labkit.measured.comm, across the formats nccl-tests printed since 2017.

The real tables are corpus logs (tests/fixtures/logs/real, read by hand in their expected files,
which tests/test_logs_real.py checks); the format tests below hold lines as nccl-tests' printf
formats write them (src/common.cu and src/util.cu of each era, named at each)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from labkit.cli import main
from labkit.logs import clean_line, nccltests, parse_lines, parse_log
from labkit.measured import comm

REAL = Path(__file__).parent / "fixtures" / "logs" / "real"
TREE = REAL / "nccl_tests_2024_tree_two_nodes_table_cut_nccltests232.txt"
ALLTOALL = REAL / "nccl_tests_2025_alltoall_one_rank_inplace_na_nccltests287.txt"
NO_HASH = REAL / "nccl_tests_2021_mpirun_8_ranks_hashes_eaten_nccl583.txt"

# Header lines of each era (the printf formats' words, their spacing as printed)
HEADERS = {
    "2022 on (util.cu)": ("#       size         count      type   redop    root     time   algbw   busbw"
                          " #wrong     time   algbw   busbw #wrong",
                          ["size_bytes", "count", "type", "redop", "root", "time_us", "algbw_gbps",
                           "busbw_gbps", "wrong", "inplace_time_us", "inplace_algbw_gbps",
                           "inplace_busbw_gbps", "inplace_wrong"]),
    "2018-2021, reductions": ("#       size         count    type   redop     time   algbw   busbw  error"
                              "     time   algbw   busbw  error",
                              ["size_bytes", "count", "type", "redop", "time_us", "algbw_gbps", "busbw_gbps",
                               "error", "inplace_time_us", "inplace_algbw_gbps", "inplace_busbw_gbps",
                               "inplace_error"]),
    "2018-2021, all_gather": ("#       size         count    type     time   algbw   busbw  error     time"
                              "   algbw   busbw  error",
                              ["size_bytes", "count", "type", "time_us", "algbw_gbps", "busbw_gbps", "error",
                               "inplace_time_us", "inplace_algbw_gbps", "inplace_busbw_gbps",
                               "inplace_error"]),
    "2017 (time in ms)": ("#      bytes             N    type      op     time  algbw  busbw      res"
                          "     time  algbw  busbw      res",
                          ["size_bytes", "count", "type", "redop", "time_ms", "algbw_gbps", "busbw_gbps",
                           "error", "inplace_time_ms", "inplace_algbw_gbps", "inplace_busbw_gbps",
                           "inplace_error"]),
    "a page ate the #": ("       size         count      type   redop    root  cputime   algbw   busbw"
                         " #wrong",
                         ["size_bytes", "count", "type", "redop", "root", "time_us", "algbw_gbps",
                          "busbw_gbps", "wrong"]),
}


@pytest.mark.parametrize("era", HEADERS)
def test_header_columns_of_every_era(era):
    line, want = HEADERS[era]
    assert nccltests.header_columns(line) == want


def test_lines_that_are_no_header():
    assert nccltests.header_columns("# Avg bus bandwidth    : 2.1234") is None
    assert nccltests.header_columns("#        (B)    (elements)   (us)  (GB/s)  (GB/s)") is None
    assert nccltests.header_columns("busbw: 51.7544  Gbps") is None  # another benchmark's line


def test_rows_by_header_and_by_shape():
    head = nccltests.header_columns(HEADERS["2022 on (util.cu)"][0])
    # util.cu: "%12li  %12li  %8s  %6s  %6s" then "  %7s  %6s  %6s  %6g" twice (#wrong as %6g)
    row = ("    16777216       4194304     float     sum      -1    420.5   39.90   39.90  1e+06"
           "    419.9   39.95   39.95    N/A")
    by_head, by_shape = nccltests.parse_row(row, head), nccltests.parse_row(row)
    assert by_head == by_shape
    assert by_head["size_bytes"] == 16777216 and by_head["root"] == -1 and by_head["redop"] == "sum"
    assert by_head["wrong"] == 1_000_000 and by_head["inplace_wrong"] is None
    assert by_head["inplace_busbw_gbps"] == 39.95
    # 2018-2021 all_gather: no redop, no root; the error column is a difference, not a count
    gather = nccltests.parse_row("     1048576        131072   float    47.38   11.06   11.06  0e+00    46.84"
                                 "   11.19   11.19  0e+00",
                                 nccltests.header_columns(HEADERS["2018-2021, all_gather"][0]))
    assert gather["time_us"] == 47.38 and gather["error"] == 0.0 and "redop" not in gather
    # 2017: "%7.3f" milliseconds
    old = nccltests.parse_row("     1048576        262144   float     sum    0.250   4.19   7.34    1e-07"
                              "    0.251   4.18   7.32    1e-07",
                              nccltests.header_columns(HEADERS["2017 (time in ms)"][0]))
    assert old["time_us"] == pytest.approx(250.0) and old["error"] == pytest.approx(1e-07)
    # mscclpp-tests print the table without a type column: read by the header, never by shape
    typeless = nccltests.header_columns("#       size         count     time   algbw   busbw  #wrong")
    assert nccltests.parse_row("  3221225472     805306368    28286  113.88  213.53      0", typeless) == {
        "size_bytes": 3221225472, "count": 805306368, "time_us": 28286.0, "algbw_gbps": 113.88,
        "busbw_gbps": 213.53, "wrong": 0}
    assert nccltests.parse_row("  3221225472     805306368    28286  113.88  213.53      0") is None
    assert nccltests.parse_row("# Out of bounds values : 0 OK") is None
    assert nccltests.parse_row("  8  2  float  sum  -1  x  0.00  0.00  0") is None


def test_library_version_codes():
    assert nccltests.library_version(21903) == "2.19.3"  # NCCL_VERSION_CODE since 2.9
    assert nccltests.library_version(2708) == "2.7.8"  # before


def test_real_table_in_labkit_parse_json_and_text(capsys):
    d = parse_log(TREE).to_dict()
    (t,) = d["nccl"]["tests"]
    assert t["op"] == "all_reduce" and t["ranks"] is None and len(t["rows"]) == 5
    assert t["rows"][-1]["busbw_gbps"] == 41.31 and t["avg_busbw_gbps"] is None
    (f,) = d["findings"]  # a benchmark that ran: no "stopped before training" finding
    assert f["kind"] == "nccl_tests" and f["peak_busbw_gbps"] == 41.52 and f["peak_size_bytes"] == 33554432
    assert f["message"].startswith("nccl-tests all_reduce_perf: peak busbw 41.52 GB/s at 33554432 bytes")
    assert main(["parse", str(TREE), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["nccl"]["tests"] == [t]
    assert main(["parse", str(TREE)]) == 0
    out = capsys.readouterr().out
    assert "nccl-tests all_reduce: ranks ?, 5 sizes, busbw GB/s by size: 2097152 B 18.53" in out
    assert "FINDING nccl_tests (line 5)" in out


def test_real_devices_average_and_na():
    (t,) = parse_log(ALLTOALL).nccl_tests
    assert (t["op"], t["ranks"], t["hosts"], t["devices"]) == ("alltoall", 1, 1, 1)
    assert t["device_names"] == ["NVIDIA GeForce RTX 5090"] and t["avg_busbw_gbps"] == 0.0
    assert t["rows"][0]["inplace_wrong"] is None and t["out_of_bounds"] == 0
    # the header's "#" eaten by a page: ranks and devices still read, no rows
    (t,) = parse_log(NO_HASH).nccl_tests
    assert (t["ranks"], t["hosts"], t["rows"]) == (8, 1, [])
    assert t["device_names"] == ["NVIDIA A100-SXM4-40GB"]


def test_wrong_values_are_a_failure_finding():
    # util.cu's lines for a run whose checks failed (#wrong > 0, "Out of bounds values : N FAILED")
    lines = ["# nThread 1 nGpus 2 minBytes 8 maxBytes 16 step: 2(factor) warmup iters: 5 iters: 20",
             "#", "# Using devices",
             "#  Rank  0 Group  0 Pid   8756 on     Meowth device  0 [0x01] NVIDIA GeForce GTX 1050 Ti",
             "#  Rank  1 Group  0 Pid   8756 on     Meowth device  1 [0x03] NVIDIA GeForce GTX 950",
             "#", HEADERS["2022 on (util.cu)"][0],
             "           8             2     float     sum      -1    12.90    0.00    0.00      0    12.87"
             "    0.00    0.00      0",
             "          16             4     float     sum      -1    12.88    0.00    0.00      2    12.83"
             "    0.00    0.00      2",
             "# Out of bounds values : 4 FAILED", "# Avg bus bandwidth    : 0.001 "]
    p = parse_lines(lines)
    kinds = [f["kind"] for f in p.findings]
    assert kinds == ["nccl_tests", "nccl_tests_wrong"]
    bad = p.findings[1]
    assert bad["wrong"] == 4 and "over 2 ranks on 1 host: 4 wrong values at 16 B" in bad["message"]


def test_labkit_benchmark_sections_read_by_both():
    # code/allreduce_bench.py's output (its say() lines), read by comm and by labkit parse
    lines = ["# labkit allreduce_bench: backend gloo, world size 4, 2 node(s), dtype float32, iters 2, "
             "warmup 1",
             "#  Rank  0 Group  0 Pid   1234 on host-a (node0) device cpu",
             "#  Rank  1 Group  0 Pid   1235 on host-a (node0) device cpu",
             "#  Rank  2 Group  0 Pid   1236 on host-b (node1) device cpu",
             "#  Rank  3 Group  0 Pid   1237 on host-b (node1) device cpu",
             "#", "# op=all_reduce scope=inter group_size=2 groups=2 nodes=2 world_size=4 backend=gloo "
             "dtype=float32",
             "#       size         count      type   redop    root     time   algbw   busbw #wrong",
             "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)",
             "        1024           256     float     sum      -1    180.2   0.006   0.006      0",
             "# Avg bus bandwidth    : 0.0060 GB/s"]
    df = comm.parse_bench_text("\n".join(lines))
    assert df[["op", "scope", "group_size", "size_bytes", "busbw_gbps"]].values.tolist() == [
        ["all_reduce", "inter", 2, 1024, 0.006]]
    (t,) = parse_lines(lines).nccl_tests
    assert (t["op"], t["ranks"], t["hosts"], t["avg_busbw_gbps"]) == ("all_reduce", 2, 2, 0.006)


def test_a_table_ends_at_another_tools_line():
    lines = [HEADERS["2022 on (util.cu)"][0],
             "     2097152        524288     float     sum      -1    113.2   18.53   18.53      0    93.35"
             "   22.46   22.46      0",
             "node-3:1234:1240 [0] NCCL INFO comm 0x55 rank 0 nranks 2 cudaDev 0 busId 1b000 - Destroy "
             "COMPLETE",
             "Traceback (most recent call last):",
             "     4194304       1048576     float     sum      -1    154.4   27.16   27.16      0    153.3"
             "   27.37   27.37      0"]
    tables = nccltests.Tables()
    for i, text in enumerate(lines, 1):
        tables.feed(clean_line(text, i))
        assert tables.busy == (i < 4), i  # NCCL's lines inside a table keep it open, others end it
    (t,) = tables.result(None)
    assert [r["size_bytes"] for r in t["rows"]] == [2097152]
