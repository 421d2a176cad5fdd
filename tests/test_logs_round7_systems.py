"""nccl-tests tables and NCCL's CUDA failures of two logs scored in the sixth round (tests/fixtures/
logs/heldout4d and heldout4h; their READMEs name each source). Lines are copied from the logs; the
expected values were read by hand."""

from __future__ import annotations

from pathlib import Path

from labkit.logs import parse_lines, parse_log

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


def test_nccl_warns_of_a_failed_cuda_call_are_a_cuda_error() -> None:
    warns = [t for t in HOROVOD.read_text().splitlines() if "NCCL WARN" in t]
    assert warns[0].endswith("NCCL WARN failed to open CUDA IPC handle : 64 peer access is not "
                             "supported between these two devices")
    assert warns[1].endswith("failed to open CUDA IPC handle : 11 invalid argument")
    assert [f["kind"] for f in parse_lines(warns[:1]).failures.to_dict("records")] == ["cuda_error"]
