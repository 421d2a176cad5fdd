"""Systems lines read by general rules, from real lines (a sixth set): ProcessGroupNCCL's heartbeat
monitor in each version's prefix, a GPU fallen off the bus with and without an Xid, nccl-tests rows
that NCCL's debug lines split into pieces, a trainer's statement that it shards over N GPUs.

Each line is a line of a public log, its source named beside it; the expected values are read from
the lines by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.logs import parse_lines
from labkit.logs.stated import launcher_flags

HELDOUT = Path(__file__).parent / "fixtures" / "logs"

# https://github.com/Intellindust-AI-Lab/DEIM/issues/105 (torch 2.3's ``[PG 0 Rank 1]`` prefix)
DEIM = [
    "[rank1]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 1] Heartbeat monitor timed out! Process will be "
    "terminated after dumping debug info. workMetaList_.size()=103",
    "[rank1]:[E ProcessGroupNCCL.cpp:1153] [PG 0 Rank 1] ProcessGroupNCCL preparing to dump debug info.",
    "[rank0]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 0] Heartbeat monitor timed out! Process will be "
    "terminated after dumping debug info. workMetaList_.size()=84",
]
# https://github.com/snowflakedb/ArcticTraining/issues/219 (torch 2.5+'s ``[PG ID 0 PG GUID ...]``),
# the fatal line alone, then another rank's collective timeout
ARCTIC = [
    "[rank7]:[E626 05:14:36.393067540 ProcessGroupNCCL.cpp:1743] [PG ID 0 PG GUID 0(default_pg) Rank 7] "
    "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring enqueued "
    "collectives. This typically indicates a NCCL/CUDA API (e.g., CudaEventDestroy) hang blocking the "
    "watchdog, and could be triggered by another thread holding the GIL inside a CUDA api (for example, "
    "CudaEventDestroy), or other deadlock-prone behaviors.If you suspect the watchdog is not actually stuck "
    "and a longer timeout would help, you can either increase the timeout (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC) "
    "to a larger value or disable the heartbeat monitor (TORCH_NCCL_ENABLE_MONITORING=0).If either of "
    "aforementioned helps, feel free to file an issue to PyTorch about the short timeout or false positive "
    "abort; otherwise, please attempt to debug the hang. ",
    "[rank2]:[E626 05:06:30.929096625 ProcessGroupNCCL.cpp:632] [Rank 2] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=120049, OpType=_ALLGATHER_BASE, NumelIn=16384000, "
    "NumelOut=131072000, Timeout(ms)=1800000) ran for 1800065 milliseconds before timing out.",
]


def test_the_heartbeat_monitor_is_a_hang_of_the_rank_its_first_line_names():
    p = parse_lines(DEIM)
    assert [(f.kind, f.rank) for f in p.failure_records] == [("hang", 1), ("hang", 0)]
    assert "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC" in p.failure_records[0].hint


def test_a_stuck_watchdog_beside_a_collective_timeout_is_both():
    p = parse_lines(ARCTIC)
    assert sorted((f.kind, f.rank) for f in p.failure_records) == [("hang", 7), ("nccl_timeout", 2)]
    assert "480 s" in next(f.message for f in p.failure_records if f.kind == "hang")


# https://github.com/bytedance/flux/issues/40 (torch 2.4's ``[PG 0 (default_pg) Rank 1]``)
FLUX = ("[rank1]:[E907 22:34:22.723784108 ProcessGroupNCCL.cpp:1515] [PG 0 (default_pg) Rank 1] Process "
        "group watchdog thread terminated with exception: CUDA error: an illegal memory access was "
        "encountered")


@pytest.mark.parametrize("prefix", ["", "[default1]:"])
def test_a_rank_in_each_versions_process_group_prefix(prefix):
    (f,) = parse_lines([prefix + FLUX.removeprefix("[rank1]:")]).failure_records
    assert (f.kind, f.rank) == ("cuda_error", 1)


# https://github.com/NVIDIA/NVSentinel/issues/155: the driver's message wrapped, no Xid
NVSENTINEL = ["[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
              "               NVRM: (PCI ID: 10de:26b5) installed in this system has",
              "               NVRM: fallen off the bus and is not responding to commands.",
              "[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s)."]
# https://github.com/Bumblebee-Project/Bumblebee/issues/554 (2014's one-line form, twice)
BUMBLEBEE = ["[   49.261458] NVRM: GPU at 0000:01:00.0 has fallen off the bus.",
             "[   49.261465] NVRM: os_pci_init_handle: invalid context!",
             "[   49.261472] NVRM: GPU at 0000:01:00.0 has fallen off the bus."]


@pytest.mark.parametrize("lines", [NVSENTINEL, BUMBLEBEE])
def test_a_gpu_fallen_off_the_bus_is_one_cuda_error_with_a_hardware_hint(lines):
    (f,) = parse_lines(lines).failure_records
    assert f.kind == "cuda_error" and "exclude the node" in f.hint.lower()


def test_nccl_tests_rows_split_by_ncclS_debug_lines_are_joined():
    """heldout3y's timezzx log (Timez-zx/nccl-tests, nccl-fault.log): every row in three pieces."""
    log = next((HELDOUT / "heldout3y").glob("nccl_tests_2.27.7_*.txt"))
    (t,) = parse_lines(log.read_text().split("\n")).nccl_tests
    rows = t["rows"]
    assert (len(rows), t["op"], t["avg_busbw_gbps"]) == (11, "all_reduce", 28.2632)
    first, last = rows[0], rows[-1]
    assert (first["size_bytes"], first["time_us"], first["busbw_gbps"], first["inplace_busbw_gbps"]) == (
        8388608, 314.7, 26.66, 26.99)
    assert (last["size_bytes"], last["time_us"], last["inplace_time_us"]) == (8589934592, 300866.0, 300304.0)


# https://github.com/mistralai/mistral-finetune/issues/71
MISTRAL = ("2024-06-13 21:57:40 (UTC) - 0:00:03 - finetune.wrapped_model - INFO - Sharding model over 2 "
           "GPUs ...")


def test_a_trainer_sharding_over_n_gpus_states_the_world_size():
    assert launcher_flags([MISTRAL]) == {"world_size": 2}


# https://github.com/huggingface/diffusers/issues/12422: a blocking wait's timeout (NCCL_BLOCKING_WAIT)
# after the watchdog's line of the same collective, then alone
DIFFUSERS = [
    "[rank1]:[E1002 18:16:40.662329700 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=2521, OpType=ALLREDUCE, NumelIn=160672064, NumelOut=160672064, "
    "Timeout(ms)=600000) ran for 600000 milliseconds before timing out.",
    "[rank1]:[E1002 18:16:40.662691402 ProcessGroupNCCL.cpp:756] [Rank 1] Work WorkNCCL(SeqNum=2521, "
    "OpType=ALLREDUCE, NumelIn=160672064, NumelOut=160672064, Timeout(ms)=600000) timed out in blocking "
    "wait.",
]


@pytest.mark.parametrize("lines", [DIFFUSERS, DIFFUSERS[1:]])
def test_a_blocking_waits_timeout_is_the_collectives_one_timeout(lines):
    (f,) = parse_lines(lines).failure_records
    assert (f.kind, f.rank, f.count) == ("nccl_timeout", 1, len(lines))


# https://github.com/desihub/desispec/issues/2744: Slurm ends a step whose task failed
DESI = ["[2026-04-29T23:36:37.809] error: *** STEP 52222788.0 ON nid002888 CANCELLED AT 2026-04-29T23:36:37 "
        "DUE TO TASK FAILURE ***",
        "srun: error: nid002888: tasks 0-57,59-63: Terminated",
        "srun: Force Terminated StepId=52222788.0"]


def test_a_step_cancelled_due_to_task_failure_points_at_the_task():
    (f,) = parse_lines(DESI).failure_records
    assert f.kind == "cancelled" and "one of its tasks failed" in f.hint


# https://github.com/NVIDIA/nccl-tests/issues/166: NCCL could not grow its segment in /dev/shm
SHMUTILS = ["ubuntu:9621:9688 [3] misc/shmutils.cc:112 NCCL WARN Error while creating shared memory segment "
            "/dev/shm/nccl-KWfVyt (size 5967872)",
            "ubuntu:9621:9688 [3] NCCL INFO transport/shm.cc:114 -> 2",
            "ubuntu:9621:9691 [6] misc/shmutils.cc:71 NCCL WARN Error: failed to extend "
            "/dev/shm/nccl-fjwOOB to 5967876 bytes"]


def test_nccl_failing_to_extend_its_shared_memory_segment_is_a_full_dev_shm():
    (f,) = parse_lines(SHMUTILS).failure_records
    assert f.kind == "host_oom" and "--shm-size" in f.hint


# https://github.com/ofsoundof/GRL-Image-Restoration/issues/27: torch's store client, behind TorchX
# prefixes, failing to reach the rendezvous; no other line
GRL = ["trainer/0 [1]:[W socket.cpp:558] [c10d] The client socket has failed to connect to "
       "[::ffff:0.0.0.5]:40323 (errno: 110 - Connection timed out).",
       "trainer/0 [1]:[E socket.cpp:610] [c10d] The client socket has failed to connect to any network "
       "address of (05, 40323)."]


def test_a_log_of_c10d_store_connection_failures_is_a_torch_log_that_stopped_before_training():
    p = parse_lines(GRL)
    assert p.tools == ["torch"] and [f["kind"] for f in p.findings] == ["no_iteration"]
    assert p.failure_records == []  # a socket's connect timing out is no collective timeout


# https://github.com/horovod/horovod/issues/469: Open MPI's launcher ending a Horovod job (the dashes
# of the help text kept as posted)
HOROVOD = ["/-------------------------------------------------------",
           "Primary job  terminated normally, but 1 process returned",
           "a non-zero exit code. Per user-direction, the job has been aborted.",
           "/-------------------------------------------------------",
           "",
           "/--------------------------------------------------------------------------",
           "mpirun noticed that process rank 7 with PID 0 on node HOSTNAME exited on signal 9 (Killed).",
           "/--------------------------------------------------------------------------"]
# https://github.com/horovod/horovod/issues/926: another signal (the node name left empty as posted)
HOROVOD_SIGILL = ("mpirun noticed that process rank 0 with PID 0 on node exited on signal 4 (Illegal "
                  "instruction).")


def test_mpirun_noticing_a_rank_killed_is_that_ranks_failure_and_a_sigkill():
    p = parse_lines(HOROVOD)
    assert sorted((f.kind, f.rank) for f in p.failure_records) == [("child_failed", 7), ("host_oom", 7)]
    assert "MPI" in p.tools


def test_mpirun_noticing_another_signal_is_a_failed_process_only():
    (f,) = parse_lines([HOROVOD_SIGILL]).failure_records
    assert (f.kind, f.rank) == ("child_failed", 0) and "signal 4" in f.message


# https://github.com/yassouali/pytorch-segmentation/issues/77 (torch 1.x's words, the traceback's end)
SEGMENTATION = [
    "  File \"/anaconda3/envs/water/lib/python3.6/site-packages/torch/autograd/__init__.py\", line 93, in "
    "backward",
    "    allow_unreachable=True)  # allow_unreachable flag",
    "RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"]
# https://github.com/hugochan/BAMnet/issues/3 (torch 0.4.1 spells it CuDNN)
BAMNET = "RuntimeError: CuDNN error: CUDNN_STATUS_INTERNAL_ERROR"


@pytest.mark.parametrize("lines", [SEGMENTATION, [BAMNET]])
def test_a_cudnn_status_error_is_a_cuda_error(lines):
    p = parse_lines(lines)
    assert [f.kind for f in p.failure_records] == ["cuda_error"] and "CUDA" in p.tools


# https://github.com/hezhangsprinter/DCPDN/issues/58: a DataLoader worker's bus error, then the
# traceback the poster pasted below it
DCPDN = ["ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared "
         "memory (shm).",
         "Traceback (most recent call last):",
         "  File \"/home/zyq/anaconda3/envs/dehazepy36/lib/python3.6/site-packages/PIL/ImageFile.py\", line "
         "510, in _save",
         "    fh = fp.fileno()",
         "AttributeError: '_idat' object has no attribute 'fileno'"]
# https://github.com/THU-DA-6D-Pose-Group/GDR-Net/issues/16: the DataLoader's own exception (the
# comment's list separator at its end kept)
GDRNET = ("RuntimeError: DataLoader worker (pid 3216) is killed by signal: Bus error. It is possible that "
          "dataloader's workers are out of shared memory. Please try to raise your shared memory "
          "limit.\u3001")


def test_a_dataloader_workers_bus_error_is_a_full_shared_memory():
    p = parse_lines(DCPDN)
    assert sorted(f.kind for f in p.failure_records) == ["host_oom", "python_exception"]
    assert "--shm-size" in next(f.hint for f in p.failure_records if f.kind == "host_oom")
    (f,) = parse_lines([GDRNET]).failure_records
    assert f.kind == "host_oom" and "torch" in parse_lines([GDRNET]).tools
