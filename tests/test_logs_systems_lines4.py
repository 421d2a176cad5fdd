"""Systems lines read by general rules, from real lines (a fifth set): fp16 overflow lines of several
processes at one step, DeepSpeed's data-parallel group size, a layout a program states by short
names, an accelerator out of memory outside CUDA, a log of PyTorch FSDP start-up lines only, and
ENOSPC on shared memory.

Each line is a line of a public log, its source named beside it; the expected values are read from
the lines by hand.
"""

from __future__ import annotations

import pytest

from labkit.logs import parse_lines
from labkit.logs.stated import launcher_flags

# https://github.com/THUDM/GLM/issues/32: ZeRO-2's overflow line of seven ranks at one instant
GLM = ("[2022-09-14 22:58:01,089] [INFO] [stage2.py:1387:step] [deepspeed] fp16 dynamic loss scale "
       "overflow! Rank {} Skipping step. Attempted loss scale: 536870912.0, reducing to 268435456.0")


def test_overflow_lines_of_several_ranks_at_one_step_are_one_skipped_step():
    p = parse_lines([GLM.format(r) for r in (6, 4, 1, 7, 2, 5, 3)])
    (f,) = p.findings
    assert (f["kind"], f["skipped_steps"], f["loss_scale"]) == ("fp16_overflow", 1, 268435456.0)


def test_two_overflow_lines_of_one_rank_are_two_skipped_steps():
    p = parse_lines([GLM.format(0), GLM.format(0).replace("536870912.0, reducing to 268435456.0",
                                                          "268435456.0, reducing to 134217728.0")])
    assert p.findings[0]["skipped_steps"] == 2


# linskybing/LLM, logs/nv/zero_3.out: DeepSpeed 0.17.4's engine, after its mpi_discovery lines
SUMMARY = ["[2025-10-28 20:50:25,639] [INFO] [engine.py:1339:_configure_distributed_model] ********** "
           "distributed groups summary **********",
           "\t self.dp_world_size=8", "\t self.mp_world_size=1", "\t self.seq_dp_world_size=8",
           "\t self.sequence_parallel_size=1"]
DISCOVERY = ("[2025-10-28 20:50:14,455] [INFO] [comm.py:891:mpi_discovery] Discovered MPI settings of "
             "world_rank=5, local_rank=5, world_size=8, master_addr=10.100.12.17, master_port=29500")


def test_deepspeeds_data_parallel_group_size_is_dp():
    """mp_world_size is the model-parallel group, not split into TP and PP: those stay unknown."""
    assert launcher_flags(SUMMARY) == {"dp": 8}
    assert parse_lines([DISCOVERY, *SUMMARY]).layout == {"world_size": 8, "tp": None, "pp": None, "dp": 8,
                                                         "cp": None}


def test_a_sequence_parallel_groups_data_parallel_size_is_no_dp():
    assert launcher_flags(SUMMARY[3:4]) == {}


# ISEEKYAN/Megatron-LM, experimental/lite/examples/verl/scripts/
# distopt_e2e_training_identity_job14245957.log: the program's own statement of its layout
ENV = "[env] world=4 tp=2 dp=2 H=32 batch=8 steps=6 muon_tp_mode=distributed"


def test_a_layout_stated_by_short_names_gives_the_dimensions_it_leaves_out_as_one():
    assert launcher_flags([ENV]) == {"world_size": 4, "tp": 2, "dp": 2, "pp": 1, "cp": 1}
    assert parse_lines([ENV]).layout == {"world_size": 4, "tp": 2, "pp": 1, "dp": 2, "cp": 1}


def test_short_names_that_do_not_multiply_to_the_world_state_no_layout():
    assert launcher_flags([ENV.replace("dp=2", "dp=4")]) == {}
    # the same log's first line names tp= but no world: no statement
    assert launcher_flags(["DISTOPT_E2E job=14245957 ngpu=4 tp=2 mcore=/lustre/fs1/mcore"]) == {}


@pytest.mark.parametrize("line", [
    # https://github.com/young-geng/EasyLM/issues/98: JAX on a TPU v4 pod, compiling train_step
    "jax._src.traceback_util.UnfilteredStackTrace: jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: "
    "XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used 87.08G of 30.75G hbm. "
    "Exceeded hbm capacity by 56.33G.",
])
def test_an_accelerators_memory_exhausted_in_any_framework_is_a_gpu_oom(line):
    """A log of that line alone is read (never refused): one gpu_oom, no separate exception."""
    assert [f.kind for f in parse_lines([line]).failure_records] == ["gpu_oom"]


# https://github.com/mlfoundations/dclm/issues/62: open_lm's start-up lines, the log cut before a step
OPEN_LM = ["After FSDP parameter num: 51,458,176 on rank 6", "After FSDP 0.239 GB on rank 6",
           "2024-08-21,16:48:12 | INFO | Start epoch 0"]


def test_a_log_of_fsdp_start_up_lines_is_read_and_says_where_it_stopped():
    p = parse_lines(OPEN_LM)
    assert p.tools == ["torch"]
    (f,) = p.findings
    assert f["kind"] == "no_iteration" and "no iteration logged" in f["message"]


@pytest.mark.parametrize(("line", "kind"), [
    # https://github.com/NVIDIA/nccl/issues/290: NCCL's shared-memory segment in a docker container
    ("gpu2-ru7:2143:2561 [1] include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No space left on "
     "device", "host_oom"),
    # https://github.com/logicalclocks/hopsworks/issues/1557: a DataLoader worker's shared tensor
    ("RuntimeError: unable to write to file </torch_739_144252761_4>: No space left on device (28)",
     "host_oom"),
    # https://github.com/databrickslabs/dolly/issues/139: torch.save on a full disk stays a full disk
    ("2023-04-29 06:01:12.977 [177/train/578 (pid 28936)] [09c561ee-a44c-4795-967c-7183a83b3160] OSError: "
     "[Errno 28] No space left on device", "disk_full"),
])
def test_enospc_on_shared_memory_is_memory_not_a_full_disk(line, kind):
    (f,) = parse_lines([line]).failure_records
    assert f.kind == kind
    assert ("shm" in f.hint) == (kind == "host_oom")


# https://github.com/NVIDIA/Megatron-LM/issues/878 (in docker; fixed by --shm-size): two DataLoader
# processes' tracebacks through one pipe, the semaphore's call just above the exception, then the
# same error again glued to another frame
SEMLOCK = ['  File "/usr/lib/python3.10/multiprocessing/synchronize.py", line 57, in __init__',
           "    sl = self._semlock = _multiprocessing.SemLock(",
           "    sl = self._semlock = _multiprocessing.SemLock(",
           "OSError: [Errno 28] No space left on device",
           "    return iter(dataloader)OSError",
           "[Errno 28] No space left on device",
           '  File "/usr/local/lib/python3.10/dist-packages/torch/utils/data/dataloader.py", line 436, '
           'in __iter__']


@pytest.mark.parametrize("head", [[], ["Traceback (most recent call last):"]])
def test_enospc_of_a_shared_memory_call_in_the_frame_above_is_memory(head):
    (f,) = parse_lines(head + SEMLOCK).failure_records
    assert (f.kind, f.count) == ("host_oom", 2)


def test_a_bare_enospc_without_a_shared_memory_call_stays_a_full_disk():
    lines = [SEMLOCK[0], "    os.write(fd, data)", SEMLOCK[3]]
    assert [f.kind for f in parse_lines(lines).failure_records] == ["disk_full"]
