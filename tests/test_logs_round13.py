"""Round thirteen, each reading on the real lines it came from (sources named at each test; the
whole logs are in tests/fixtures/logs/heldout5*/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.logs import parse_log

HELD = Path(__file__).parent / "fixtures" / "logs"


def _log(folder: str, stem: str) -> Path:
    (path,) = (HELD / folder).glob(f"*{stem}.txt")
    return path


def test_megatron_memory_reports_named_by_what_they_bracket_are_rows_of_their_iteration():
    # Megatron-LM's report_memory(name) around a checkpoint save, CSCS Alps, 2026 (elena-lyulina/
    # Megatron-LM-Attention-Benchmark, attn_bench/logs/2561509.out): ``0: [Rank 0] (before
    # save_checkpoint for iteration 5) memory (MB) | allocated: 454.89 | ...`` and ``(after
    # save_checkpoint for iteration 5)``, beside the usual ``(after 1 iterations)`` rows.
    memory = parse_log(_log("heldout5p", "elyulina")).memory
    assert memory["iteration"].tolist() == [1, 2, 5, 5, 10, 10, 15, 15]
    assert memory["allocated_mb"].tolist()[2:5] == [454.89, 454.89, 455.52]
    assert set(memory["rank"]) == {0}


def test_a_counter_with_thousands_separators_is_one_number():
    # BasicSR's ``{current_iter:8,d}`` (chxy95/HDRUNet#12, 2021): ``21-08-10 11:12:37.463 - INFO:
    # <epoch:193, iter: 505,000, lr:5.000e-05, , time:51.837> l_pix: 7.5744e-03``, the validation's
    # ``<epoch:193, iter: 505,000> psnr: ...`` no step of its own
    its = parse_log(_log("heldout5o", "hdrunet12")).iterations
    assert its["iteration"].tolist() == list(range(505_000, 505_800, 100))
    assert its["lr"].tolist() == [5e-05] * 8


def test_lightnings_banner_states_the_world():
    # PyTorch Lightning's banner, all it printed of a 32-process NeMo job (NVIDIA-NeMo/NeMo#13996):
    # ``All distributed processes registered. Starting with 32 processes`` between two dash rules:
    # a log, not refused
    parsed = parse_log(_log("heldout5s", "nemo13996"))
    assert parsed.layout["world_size"] == 32
    assert not parsed.failure_records


def test_rusts_failed_allocation_is_the_hosts_memory():
    # a Rust extension's allocator before it aborts (microsoft/DeepSpeedExamples#321, 2023):
    # ``memory allocation of 2097152 bytes failed`` from three processes (two glued), then the
    # DeepSpeed launcher's ``sigkill_handler ... Killing subprocess N``
    path = _log("heldout5t", "dsexamples321")
    lines = path.read_text().splitlines()
    failures = parse_log(path).failure_records
    assert {f.kind for f in failures} == {"host_oom"}
    assert "bytes failed" in lines[failures[0].line - 1]


def test_a_launchers_progress_lines_are_a_programs_output_not_refused():
    # MaxText's multihost_runner.py (google/maxtext#30, 2023): ``Starting multihost runner...``,
    # ``2 slices found.``, ``[t=0.00, SCP] Completed 0/2, slice 0 worker 0 still working...``: no time
    # stamp, no level, no tool labkit knows; a log all the same, with nothing found in it
    parsed = parse_log(_log("heldout5w", "maxtext30"))
    assert [f["kind"] for f in parsed.findings] == ["no_iteration"]
    assert not parsed.failure_records and parsed.iterations.empty


def test_mpiruns_signal_9_with_a_pid_the_user_hid_is_the_sigkill_guess():
    # Open MPI's report under Horovod, with the PID and node the user blanked in the post
    # (Kay1794/Aware-of-the-history#2, 2022): ``mpirun noticed that process rank 1 with PID xxxxxx on node
    # xxxxxxxx exited on signal 9 (Killed).``
    failures = parse_log(_log("heldout5x", "aware_history2")).failure_records
    assert sorted((f.kind, f.rank) for f in failures) == [("child_failed", 1), ("host_oom", 1)]


def test_a_log_collectors_node_prefix_is_a_prefix():
    # ms-swift's multi-node job through a log collector (modelscope/ms-swift#7345, 2026): ``2026-01-09
    # 17:40:31.169312 master-0 >> [rank7]:   File ".../torch/distributed/c10d_logger.py", line 81,
    # in wrapper``: rank 7's traceback, cut at both ends by the post
    failures = parse_log(_log("heldout5v", "msswift7345")).failure_records
    assert [(f.kind, f.rank) for f in failures] == [("python_exception", 7)]


def test_a_rich_traceback_box_cut_at_its_top_ends_at_its_exception_line():
    # accelerate's rich traceback on Windows (bmaltais/kohya_ss#1347, 2023): the excerpt starts inside
    # the box (``│ ❱ 1013 │ ... raise RuntimeError("Distributed package doesn't have NCCL " "built in")``),
    # ``╰───...``, then ``RuntimeError: Distributed package doesn't have NCCL built in`` and the agent's
    # ``failed (exitcode: 1) local_rank: 0``
    path = _log("heldout6a", "kohya1347")
    lines = path.read_text().splitlines()
    failures = parse_log(path).failure_records
    assert sorted(f.kind for f in failures) == ["child_failed", "python_exception"]
    (exc,) = [f for f in failures if f.kind == "python_exception"]
    assert lines[exc.line - 1] == "RuntimeError: Distributed package doesn't have NCCL built in"


@pytest.mark.parametrize("stem", ["automl563", "polyaxon657"])
def test_horovods_stall_warning_is_a_hang(stem):
    # Horovod's stall inspector behind mpirun's ``[1,0]<stderr>:`` (google/automl#563; polyaxon#657, its
    # message split by the tags): ``One or more tensors were submitted to be reduced, gathered or
    # broadcasted by subset of ranks and are waiting for remainder of ranks for more than 60 seconds.
    # ... which will cause deadlock.``, then ``Stalled ranks:``
    assert [f.kind for f in parse_log(_log("heldout5z", stem)).failure_records] == ["hang"]


@pytest.mark.parametrize("folder,stem", [("heldout5z", "gigl217"), ("heldout5o", "xla8588")])
def test_cloud_loggings_prefix_and_its_unindented_frames(folder, stem):
    # Google Cloud Logging's export of Vertex AI jobs (Snapchat/GiGL#217, pytorch/xla#8588):
    # ``ERROR 2025-07-25T19:28:34.134390639Z [resource.labels.taskName: workerpool0-0] File
    # ".../multiprocessing/process.py", line 315, in _bootstrap``, its code line ``self.run()`` at the
    # margin too (the export strips the blanks); the excerpt ends inside the traceback: one
    # exception the log cuts
    failures = parse_log(_log(folder, stem)).failure_records
    assert [(f.kind, f.evidence) for f in failures] == [("python_exception", "cut")]
