"""nccl-tests tables and NCCL's CUDA failures of two logs scored in the sixth round (tests/fixtures/
logs/heldout4d and heldout4h; their READMEs name each source). Lines are copied from the logs or, where
said, written by the tools' own format strings; the expected values were read by hand."""

from __future__ import annotations

from pathlib import Path

from labkit.logs import parse_lines, parse_log
from labkit.logs.failures import match_line
from labkit.logs.nccltests import header_columns, parse_row

LOGS = Path(__file__).parent / "fixtures" / "logs"
# nccl-tests 2.x alltoall_perf (heldout4d/, microsoft/superbenchmark tests/data/nccl_alltoall.log):
# the header names a redop, the rows print an empty one (alltoall.cu's ``TimeTest(..., "", -1)``)
ALLTOALL = LOGS / "heldout4d" / "nccl_tests_2021_alltoall_8_gpus_one_process_superbench.txt"
HOROVOD = next((LOGS / "heldout4h").glob("nccl_2019_horovod_*.txt"))  # horovod/horovod issue 785


def test_a_collective_without_a_reduction_prints_no_redop_under_the_header() -> None:
    lines = ALLTOALL.read_text().splitlines()
    assert lines[13].split()[4] == "redop" and lines[15].split()[2:4] == ["float", "1.63"]
    (t,) = parse_log(ALLTOALL).nccl_tests
    assert (t["ranks"], len(t["rows"]), t["avg_busbw_gbps"]) == (8, 34, 58.6481)
    last = t["rows"][-1]
    assert (last["size_bytes"], last["count"], last["type"], last["redop"]) == (8589934592, 268435456,
                                                                                "float", None)
    assert (last["time_us"], last["busbw_gbps"], last["error"]) == (33508.0, 224.31, None)
    assert (last["inplace_time_us"], last["inplace_busbw_gbps"]) == (33234.0, 226.16)


def test_every_version_of_a_reduction_free_row_is_read_by_its_header() -> None:
    # 2022's common.cu (51af557, 2.13): ``%12li  %12li  %8s  %6s  %6s`` with opName "" for
    # all_gather/alltoall/broadcast/gather/scatter (hypercube's still ""): the root stays
    cols = header_columns("#       size         count      type   redop    root     time   algbw"
                          "   busbw #wrong     time   algbw   busbw #wrong")
    row = parse_row("        1024           256     float              -1    20.50    0.05    0.04"
                    "      0    20.10    0.05    0.04      0", cols)
    assert row is not None
    assert ("redop" in row, row["root"], row["time_us"], row["inplace_wrong"]) == (False, -1, 20.5, 0)
    # since 2022-09 (d313d20) such rows print ``none``: a word, read as the redop
    row = parse_row("        1024           256     float    none      -1    20.50    0.05    0.04"
                    "      0    20.10    0.05    0.04      0", cols)
    assert row is not None and (row["redop"], row["root"], row["busbw_gbps"]) == ("none", -1, 0.04)
    # 2.x all_reduce keeps its redop (all_reduce.cu's ``%12li  %12li  %8s  %6s``)
    cols = header_columns("#       size         count      type   redop     time   algbw   busbw"
                          "  error     time   algbw   busbw  error")
    row = parse_row("         128            32     float     sum    28.93    0.00    0.01  1e-07"
                    "    28.58    0.00    0.01  1e-07", cols)
    assert row is not None and (row["redop"], row["time_us"], row["error"]) == ("sum", 28.93, 1e-07)


def test_nccl_warns_of_a_failed_cuda_call_are_a_cuda_error() -> None:
    warns = [t for t in HOROVOD.read_text().splitlines() if "NCCL WARN" in t]
    assert warns[0].endswith("NCCL WARN failed to open CUDA IPC handle : 64 peer access is not "
                             "supported between these two devices")
    assert warns[1].endswith("failed to open CUDA IPC handle : 11 invalid argument")
    assert [f["kind"] for f in parse_lines(warns[:1]).failures.to_dict("records")] == ["cuda_error"]
    # the transports' other CUDA calls, as NCCL's p2p.cc and nvls.cc print them
    for text in ("h:1:2 [1] NCCL WARN rank 0 failed to get CUDA IPC handle to device 1(=3a000) : 1 "
                 "invalid argument",
                 "h:1:2 [1] NCCL WARN cudaIpcGetMemHandle failed : invalid argument",
                 "h:1:2 [1] NCCL WARN failed to peer with device 1(=3a000): 217 peer access is not "
                 "supported between these two devices",
                 "h:1:2 [1] NCCL WARN Failed to bind NVLink SHARP (NVLS) Multicast memory of size 1 : "
                 "CUDA error 801 'operation not supported'."):
        f = match_line(text, None)
        assert f is not None and f.kind == "cuda_error", text
    assert match_line("h:1:2 [0] NCCL INFO Ring 00 : 0[0] -> 1[0] via P2P/IPC", None) is None
