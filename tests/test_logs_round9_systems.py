"""Round nine's systems rules (launchers' reports, process counts, OOM kills, CUDA errors, cut
tracebacks), each on real lines of the held-out sets 4r, 4t, 4u and 4v (the whole logs are in
tests/fixtures/logs/heldout4r/, 4t/, 4u/, 4v/; their sources are named in each folder's README and
at each test) or of a public source named beside them."""

from __future__ import annotations

from pathlib import Path

from labkit.logs import parse_lines

HELD = Path(__file__).parent / "fixtures" / "logs"


def _lines(folder: str, stem: str) -> list[bytes]:
    (path,) = (HELD / folder).glob(f"*{stem}.txt")
    return path.read_bytes().split(b"\n")


def _kinds(p) -> list[tuple[str, int | None]]:
    return sorted((f.kind, f.rank) for f in p.failure_records)


def test_pals_reporting_a_rank_that_died_is_a_failed_worker_and_a_worker_count_is_the_world():
    """ALCF Polaris: ``DDP: I am worker 2 of 8``, three watchdog timeouts, then PALS's ``host: rank 2
    died from signal 6 and dumped core`` and ``rank 1 died from signal 15`` (argonne-lcf/alcf-nccl-tests,
    pytests/resnet50/results/2024-11-08-21-24-51/with_aws.log)."""
    p = parse_lines(_lines("heldout4r", "alcf"))
    assert p.layout["world_size"] == 8
    child = [f for f in p.failure_records if f.kind == "child_failed"]
    assert [(f.rank, "signal 6" in f.message) for f in child] == [(2, True)]  # SIGTERM: PALS's own stop
    assert not any(f.kind == "host_oom" for f in p.failure_records)


def test_hydra_bad_termination_with_a_sigkill_is_a_failed_worker_and_the_sigkill_guess():
    """MPICH hydra's banner and ``EXIT STRING: Killed (signal 9)`` (openai/jukebox#155)."""
    p = parse_lines(_lines("heldout4v", "jukebox155"))
    assert _kinds(p) == [("child_failed", None), ("host_oom", None)]


def test_open_mpi_primary_job_report_is_read_beside_other_triggers():
    """DeepBench's `` Num Ranks: 2``, NCCL's ``unhandled cuda error ... rank: 0`` and Open MPI's ``Primary
    job  terminated normally, but 1 process returned`` (baidu-research/DeepBench#97)."""
    p = parse_lines(_lines("heldout4v", "deepbench97"))
    assert p.layout["world_size"] == 2
    kinds = [(f.kind, f.rank) for f in p.failure_records]
    assert ("child_failed", None) in kinds
    assert next(r for k, r in kinds if k == "cuda_error") == 0  # the rank the message names


def test_torch_distributed_launch_called_process_error_is_the_launchers_report():
    """The pre-elastic launcher's traceback ending ``subprocess.CalledProcessError: Command '[...,
    '--local_rank=0']' returned non-zero exit status 1.`` (megvii-research/MSPN#31)."""
    p = parse_lines(_lines("heldout4v", "mspn31"))
    assert [f.kind for f in p.failure_records] == ["child_failed"]


def test_nccl_ras_job_summary_states_the_processes_in_total():
    """NCCL 2.26.2's RAS ``Job summary``: 32 nodes, 256 processes (NVIDIA/nccl#1730)."""
    p = parse_lines(_lines("heldout4t", "nccl1730"))
    assert p.layout["world_size"] == 256


def test_ray_memory_monitor_kills_are_host_oom():
    """The raylet's ``1 Workers (tasks / actors) killed due to memory pressure (OOM)`` (hiyouga/EasyR1#185)
    and the task's error in Ray's docs (ray-project/ray, doc/source/ray-core/scheduling/
    ray-oom-prevention.rst): a host's memory, not a GPU's."""
    p = parse_lines(_lines("heldout4t", "easyr1_185"))
    assert sorted(f.kind for f in p.failure_records) == ["host_oom", "python_exception"]
    line = "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory."
    p = parse_lines([line])
    assert [f.kind for f in p.failure_records] == ["host_oom"]


def test_a_cuda_error_quoted_after_its_source_place_is_a_cuda_error():
    """DeepEP's ``what():  Failed: CUDA error /workspace/DeepEP/csrc/deep_ep.cpp:83 'unspecified launch
    failure'`` (deepseek-ai/DeepEP#274)."""
    p = parse_lines(_lines("heldout4u", "deepep274"))
    assert [f.kind for f in p.failure_records] == ["cuda_error"]


def test_a_cut_traceback_beside_a_watchdog_timeout_is_an_exception_unless_it_ends_in_a_collective():
    """mmsegmentation's traceback cut in mmcv's runner after two watchdog lines
    (open-mmlab/mmsegmentation#2137) is an exception of its own; one cut in ``all_reduce`` is the
    timed-out collective's (lyulyul/shine-cluster#171, ../heldout3p/)."""
    p = parse_lines(_lines("heldout4u", "mmseg2137"))
    assert sorted({f.kind for f in p.failure_records}) == ["nccl_timeout", "python_exception"]
    p = parse_lines(_lines("heldout3p", "shinecluster171"))
    assert {f.kind for f in p.failure_records} == {"nccl_timeout"}


def test_one_scale_fall_printed_by_several_unnamed_processes_is_one_skipped_step():
    """DeepSpeed 0.3's ZeRO-1 overflow line from three processes at one instant
    (stanford-crfm/mistral#36)."""
    p = parse_lines(_lines("heldout4v", "mistral36"))
    (f,) = p.findings
    assert f["kind"] == "fp16_overflow" and f["skipped_steps"] == 1
