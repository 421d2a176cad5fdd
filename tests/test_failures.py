"""Failure diagnosis: every kind, the wordings seen since 2020, merging, ordering, hangs."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from labkit.logs import KINDS, detect_hang, diagnose, parse_log

FIX = Path(__file__).parent / "fixtures" / "logs"

# (kind, the log line, the rank it names or None, a word the hint must contain)
CASES = [
    # CUDA OOM: PyTorch 1.6-1.9, 1.10-1.13, 2.0, 2.1 (with its "capacty" typo), 2.4+
    ("gpu_oom", "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total "
     "capacity; 14.56 GiB already allocated; 4.75 MiB free; 14.80 GiB reserved in total by PyTorch)",
     None, "micro_batch_size"),
    ("gpu_oom", "RuntimeError: CUDA out of memory. Tried to allocate 1.50 GiB (GPU 0; 39.59 GiB total "
     "capacity; 36.12 GiB already allocated; 1.09 GiB free; 37.12 GiB reserved in total by PyTorch) If "
     "reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See "
     "documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF", None, "recompute"),
    ("gpu_oom", "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; "
     "79.15 GiB total capacity; 75.01 GiB already allocated)", None, "micro_batch_size"),
    ("gpu_oom", "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
     "total capacty of 79.15 GiB of which 1.06 GiB is free.", None, "micro_batch_size"),
    ("gpu_oom", "[rank7]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 7 has "
     "a total capacity of 79.10 GiB of which 2.1 GiB is free.", 7, "micro_batch_size"),
    ("gpu_oom", "RuntimeError: CUDA error: out of memory", None, "micro_batch_size"),
    ("gpu_oom", "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
     None, "micro_batch_size"),
    ("gpu_oom", "{\"message\": \"RuntimeError('CUDA out of memory. Tried to allocate 20.00 MiB')\"}",
     None, "micro_batch_size"),
    ("gpu_oom", "&lt;pre&gt;torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
     "&lt;/pre&gt;", None, "micro_batch_size"),
    ("gpu_oom", "[default2]:RuntimeError: HIP out of memory. Tried to allocate 1.00 GiB", 2, "micro_batch"),
    # host / CPU OOM
    ("host_oom", "slurmstepd: error: Detected 1 oom-kill event(s) in step 1234.0 cgroup. Some of your "
     "processes may have been killed by the cgroup out-of-memory handler.", None, "--mem"),
    ("host_oom", "slurmstepd: error: Detected 1 oom_kill event in StepId=1234.0. Some of the step tasks "
     "have been OOM Killed.", None, "--mem"),
    ("host_oom", "srun: error: node3: task 5: Out Of Memory", None, "--mem"),
    ("host_oom", "Out of memory: Killed process 4242 (python) total-vm:81234567kB, anon-rss:7777777kB",
     None, "--mem"),
    ("host_oom", "RuntimeError: [enforce fail at alloc_cpu.cpp:127] data. DefaultCPUAllocator: can't "
     "allocate memory: you tried to allocate 2147483648 bytes. Error code 12 (Cannot allocate memory)",
     None, "memory_limit_gb"),
    ("host_oom", "[labkit] out of memory on rank 3 (tensor, pipeline) = (1, 0) during forward-backward at "
     "iteration 1: tried to allocate 2147483648 bytes (memory_limit_gb=0.5)", 3, "memory_limit_gb"),
    # collective timeouts: torch 1.9, 1.11-2.2, 2.3+ and gloo
    ("nccl_timeout", "[E ProcessGroupNCCL.cpp:566] [Rank 1] Watchdog caught collective operation timeout: "
     "WorkNCCL(OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800923 milliseconds before timing out.",
     1, "NCCL_DEBUG"),
    ("nccl_timeout", "[E ProcessGroupNCCL.cpp:828] [Rank 2] Watchdog caught collective operation timeout: "
     "WorkNCCL(SeqNum=77, OpType=BROADCAST, Timeout(ms)=1800000) ran for 1800412 milliseconds before "
     "timing out.", 2, "NCCL_DEBUG"),
    ("nccl_timeout", "[rank5]:[E801 10:30:01.123456789 ProcessGroupNCCL.cpp:616] [PG ID 0 PG GUID "
     "0(default_pg) Rank 5] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1234, "
     "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600083 milliseconds before "
     "timing out.", 5, "NCCL_DEBUG"),
    ("nccl_timeout", "[default1]:RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] "
     "Timed out waiting 1800000ms for recv operation to complete", 1, "GLOO_SOCKET_IFNAME"),
    # CUDA errors
    ("cuda_error", "RuntimeError: CUDA error: uncorrectable ECC error encountered", None, "--exclude"),
    ("cuda_error", "RuntimeError: CUDA error: an illegal memory access was encountered", None,
     "CUDA_LAUNCH_BLOCKING"),
    ("cuda_error", "RuntimeError: CUDA error: unknown error", None, "CUDA_LAUNCH_BLOCKING"),
    ("cuda_error", "NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, unhandled "
     "cuda error, NCCL version 2.14.3", None, "CUDA_LAUNCH_BLOCKING"),
    ("cuda_error", "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.", None,
     "--exclude"),
    # Slurm: new (17.02+) and old wordings
    ("time_limit", "slurmstepd: error: *** JOB 4242 ON node1 CANCELLED AT 2024-03-04T00:00:07 DUE TO TIME "
     "LIMIT ***", None, "--time"),
    ("time_limit", "slurmstepd: *** JOB 4242 CANCELLED AT 2016-03-04T00:00:07 DUE TO TIME LIMIT on node1 ***",
     None, "--time"),
    ("preempted", "slurmstepd: error: *** JOB 4242 ON node1 CANCELLED AT 2024-03-04T00:00:07 DUE TO "
     "PREEMPTION ***", None, "resume"),
    ("preempted", "slurmstepd: *** JOB 4242 CANCELLED AT 2016-03-04T00:00:07 DUE TO PREEMPTION on node1 ***",
     None, "resume"),
    ("cancelled", "slurmstepd: error: *** JOB 4242 ON node1 CANCELLED AT 2024-03-04T00:00:07 ***", None,
     "scancel"),
    ("cancelled", "slurmstepd: *** STEP 4242.0 CANCELLED AT 2016-03-04T00:00:07 ***", None, "scancel"),
    ("node_failure", "slurmstepd: error: *** JOB 4242 ON node1 CANCELLED AT 2024-03-04T00:00:07 DUE TO NODE "
     "FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***", None, "--exclude"),
    ("node_failure", "slurmstepd: *** JOB 4242 CANCELLED AT 2016-03-04T00:00:07 DUE TO NODE FAILURE on "
     "node1 ***", None, "--exclude"),
    ("node_failure", "srun: error: Node failure on node7", None, "--exclude"),
    # Python's OSError for errno 28 (strerror "No space left on device")
    ("disk_full", "OSError: [Errno 28] No space left on device: '/scratch/run/checkpoints/"
     "iter_0000010/__0_0.distcp'", None, "df -h"),
    # code/engine_ckpt.py's message for a checkpoint it cannot load (the real one: test_ckpt_disk.py)
    ("bad_checkpoint", "[labkit] rank 0 failed during checkpoint load at iteration 0: checkpoint "
     "/r/checkpoints/iter_0000010 is truncated or corrupt and cannot be loaded (__0_0.distcp is "
     "truncated: 4046641 bytes, the checkpoint's index says 8093282)", None, "latest_checkpointed"),
]


@pytest.mark.parametrize("kind,line,rank,hint_word", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_single_line_failures(kind, line, rank, hint_word):
    failures = diagnose(["some ordinary line", line, "another ordinary line"])
    assert [f.kind for f in failures] == [kind], failures
    f = failures[0]
    assert f.rank == rank and f.line == 2 and f.message
    assert hint_word in f.hint


def test_torchrun_agent_line_reports_the_failed_worker():
    sigkill = diagnose(["ok", "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) "
                              "local_rank: 0 (pid: 1234) of binary: /usr/bin/python"])
    assert [(f.kind, f.line) for f in sigkill] == [("host_oom", 2), ("child_failed", 2)]
    assert "SIGKILL" in sigkill[0].hint and "local_rank 0, exit code -9" in sigkill[1].message
    abort = diagnose(["E0801 13:23:20.000000 32974 torch/distributed/elastic/multiprocessing/api.py:874] "
                      "failed (exitcode: -6) local_rank: 3 (pid: 33054) of binary: /usr/bin/python3"])
    assert [f.kind for f in abort] == ["child_failed"]
    torch19 = diagnose(["Child process 32378 (local_rank 0) FAILED (exitcode 1)"])
    assert [f.kind for f in torch19] == ["child_failed"]


def test_every_kind_is_covered():
    covered = {c[0] for c in CASES} | {"child_failed", "python_exception", "hang"}
    assert covered == set(KINDS)


def test_wrapped_oom_is_found_once():
    lines = ["2024-06-01 12:00:00,123 - ERROR - worker 3 failed with RuntimeError: CUDA out of me",
             "mory. Tried to allocate 20.00 MiB (GPU 3; 15.78 GiB total capacity)"]
    failures = diagnose(lines)
    assert [(f.kind, f.line) for f in failures] == [("gpu_oom", 1)]


def test_python_traceback_per_rank():
    lines = ["[default0]:Traceback (most recent call last):",
             "[default1]:Traceback (most recent call last):",
             '[default0]:  File "train.py", line 3, in <module>',
             '[default1]:  File "train.py", line 9, in <module>',
             "[default0]:ValueError: micro_batch_size must be positive, got 0",
             "[default1]:KeyError: 'lm loss'"]
    failures = diagnose(lines)
    assert [(f.kind, f.rank, f.line) for f in failures] == [("python_exception", 0, 5),
                                                           ("python_exception", 1, 6)]
    assert failures[0].message == "ValueError: micro_batch_size must be positive, got 0"


@pytest.mark.parametrize("state", ["CANCELLED", "CANCELLED by 0", "TIMEOUT", "PREEMPTED"])
def test_a_job_the_scheduler_ended_is_diagnosed_by_the_state_before_its_signal_exception(state):
    # a real log of our own code: a hung job that was cancelled (torchrun's SignalException)
    log = FIX / "labkit_hang_job_2026.txt"
    signal_lines = [i for i, ln in enumerate(log.read_text().splitlines(), 1)
                    if "SignalException: Process" in ln]
    assert signal_lines, "the fixture holds torchrun's SignalException"
    failures = diagnose(log, exit_code=-15, job_state=state)
    kinds = [f.kind for f in failures]
    assert kinds[0] == {"CANCELLED": "cancelled", "TIMEOUT": "time_limit",
                        "PREEMPTED": "preempted"}[state.split()[0]], kinds
    assert any(f.kind == "python_exception" and f.line in signal_lines for f in failures[1:])
    # without the scheduler's word the exception stays the diagnosis
    assert diagnose(log)[0].kind == "python_exception"


def test_the_engines_own_sigterm_exit_is_a_consequence_of_the_cancel():
    # lines of a real cancelled run of code/pretrain_gpt.py (its SIGTERM handler exits 128 + 15)
    lines = ["Traceback (most recent call last):",
             '  File "/work/main/code/pretrain_gpt.py", line 299, in _on_sigterm',
             "    raise SystemExit(128 + signum)",
             "SystemExit: 143"]
    assert diagnose(lines)[0].kind == "python_exception"
    assert [f.kind for f in diagnose(lines, job_state="CANCELLED")] == ["cancelled",
                                                                        "python_exception"]


def test_an_exception_chained_into_a_stop_is_a_consequence_of_the_cancel():
    # A real cancel of our engine on the local backend (2026-12-07, notebook 08's scenario; CI's
    # diagnosis of it put such an exception ahead of the cancel). The cancel signals torchrun's
    # process group, then each process: the second SIGTERM struck torchrun's handler of the first
    # inside logging's cache lookup, and the traceback chains logging's KeyError: 30 between two
    # SignalExceptions ("During handling of the above exception, another exception occurred").
    log = FIX / "labkit_cancel_double_sigterm_2026.txt"
    lines = log.read_text().splitlines()
    key_error = lines.index("KeyError: 30") + 1
    assert lines[key_error - 7] == "During handling of the above exception, another exception occurred:"
    failures = diagnose(log, exit_code=1, job_state="CANCELLED")
    assert failures[0].kind == "cancelled", [(f.kind, f.line, f.message) for f in failures]
    chained = [f for f in failures if f.line == key_error]
    assert [(f.kind, f.evidence) for f in chained] == [("python_exception", "stopping")]
    assert "consequence" in chained[0].hint
    # the same log without the scheduler's word: the stop's own exception leads, not the KeyError
    # (torchrun's SignalException; the handler's ``SystemExit: 143`` raised inside a finalizer, which
    # Python printed as ``Exception ignored in: <function IndexedDataset.__del__ ...>``, stopped nothing)
    first = parse_log(log).failure_records[0].message
    assert first.endswith("SignalException: Process 16245 got signal: 15"), first


def test_a_real_exception_stays_ahead_of_a_later_cancel():
    lines = ["[default0]:Traceback (most recent call last):",
             '[default0]:  File "train.py", line 3, in <module>',
             "[default0]:ValueError: micro_batch_size must be positive, got 0"]
    assert [f.kind for f in diagnose(lines, job_state="CANCELLED")] == ["python_exception",
                                                                        "cancelled"]


def test_watchdog_follow_ups_are_not_new_timeouts():
    failures = diagnose(FIX / "torch_2.4_nccl_watchdog_followups.txt")
    assert [(f.kind, f.rank) for f in failures] == [("nccl_timeout", 5), ("nccl_timeout", 6)]
    assert "SeqNum=1234" in failures[0].message and "600 s" in failures[0].message
    for fixture in ("torch_2.0_nccl_watchdog.txt", "torch_1.9_nccl_watchdog.txt"):
        assert [f.kind for f in diagnose(FIX / fixture)] == ["nccl_timeout"]


def test_childfailed_root_cause_sigkill():
    failures = diagnose(FIX / "torchrun_2.1_childfailed_sigkill.txt")
    assert [(f.kind, f.rank) for f in failures] == [("host_oom", 3), ("child_failed", 3)]
    assert "exitcode -9" in failures[1].message and "node2" in failures[1].message


def test_childfailed_after_cuda_oom_puts_the_oom_first():
    failures = diagnose(FIX / "torchrun_2.3_childfailed_cuda_oom.txt")
    assert [(f.kind, f.rank) for f in failures] == [("gpu_oom", 3), ("python_exception", 0),
                                                   ("child_failed", 3)]
    assert "another rank" in failures[1].hint  # a communication error is a consequence


def test_time_limit_explains_the_kills_and_counts_once():
    failures = diagnose(FIX / "slurm_22.05_time_limit.txt")
    assert [f.kind for f in failures] == ["time_limit"]


def test_engine_cpu_oom_is_one_host_oom():
    p = parse_log(FIX / "labkit_engine_2026.txt")
    assert [(f["kind"], f["rank"], f["line"]) for f in p.to_dict()["failures"]] == [("host_oom", 3, 9)]
    assert "CPU allocator" in p.failure_records[0].message


@pytest.mark.parametrize("state,kind", [("TIMEOUT", "time_limit"), ("OUT_OF_MEMORY", "host_oom"),
                                        ("NODE_FAIL", "node_failure"), ("PREEMPTED", "preempted"),
                                        ("CANCELLED by 0", "cancelled")])
def test_job_state_fills_in_when_the_log_is_silent(state, kind):
    failures = diagnose(["nothing to see"], job_state=state)
    assert [(f.kind, f.line) for f in failures] == [(kind, None)]


def test_exit_minus_9_without_a_cause_is_a_probable_host_oom():
    assert [f.kind for f in diagnose(["ok"], exit_code=-9)] == ["host_oom"]
    assert diagnose(["ok"], exit_code=1) == []
    # the Slurm time limit explains a SIGKILL: no OOM guess then
    assert [f.kind for f in diagnose(FIX / "slurm_22.05_time_limit.txt", exit_code=137)] == ["time_limit"]


def test_detect_hang_by_iteration_timestamp(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text(" [2026-11-22 03:30:01] iteration        5/      30 | lm loss: 7.0E+00 |\n"
                   "some warning printed later\n")
    t_last = time.mktime(time.strptime("2026-11-22 03:30:01", "%Y-%m-%d %H:%M:%S"))
    os.utime(log, (t_last + 500, t_last + 500))  # the file kept changing, iterations did not
    assert detect_hang(log, timeout_s=600, now=t_last + 300) is None
    f = detect_hang(log, timeout_s=600, now=t_last + 900)
    assert f is not None and f.kind == "hang" and "iteration 5" in f.message and "900 s" in f.message


def test_detect_hang_by_mtime_and_missing_log(tmp_path):
    log = tmp_path / "log.txt"
    assert detect_hang(log, timeout_s=10) is None  # not started yet
    log.write_text(" iteration        5/      30 | lm loss: 7.0E+00 |\n")
    m = log.stat().st_mtime
    assert detect_hang(log, timeout_s=10, now=m + 5) is None
    assert detect_hang(log, timeout_s=10, now=m + 60).kind == "hang"


def test_state_spellings_and_a_missing_log(tmp_path):
    assert [f.kind for f in diagnose(["x"], job_state="JobState.TIMEOUT")] == ["time_limit"]
    assert [f.kind for f in diagnose(tmp_path / "not_yet.txt", job_state="NODE_FAIL")] == ["node_failure"]
    assert [f.kind for f in diagnose(str(tmp_path / "nope.txt"), exit_code=-9)] == ["host_oom"]
