"""Kinds of lines of many loops and tools, from real lines: step records the generic reader reads
(labkit/logs/generic.py), records over several lines, NCCL's CUDA failures, a rank named inside a
message, a Slurm requeue after a preemption (failures.py).

Each line is a line of a corpus log (tests/fixtures/logs/real, sources in its README.md), named
beside it; the expected values are read from the line by hand.
"""

from __future__ import annotations

import pytest

from labkit.logs import generic, parse_lines
from labkit.logs.lines import clean_line

# llama2c_2023_pipe_step_lines_mfu_eval_checkpoint_between_llama2c461.txt
LLAMA2C = "490 | loss 5.7543 | lr 4.900000e-05 | 8060.78ms | mfu 0.21%"
# xtuner_2024_mmengine_iter_train_lr_eta_time_memory_loss_xtuner658.txt
XTUNER = ("2024/05/07 12:40:23 - mmengine - INFO - Iter(train) [1510/2046]  lr: 3.3994e-05  eta: 0:29:39  "
          "time: 24.9128  data_time: 22.0483  memory: 15266  loss: 0.7818  grad_norm: 0.0005")
# detectron2_2019_events_iter_total_loss_time_lr_max_mem_d2_214.txt
D2 = ("[11/01 19:16:15 d2.utils.events]: eta: 4:52:26  iter: 19  total_loss: 1.750  loss_cls: 1.248  "
      "loss_box_reg: 0.503  time: 0.1960  data_time: 0.0033  lr: 0.000200  max_mem: 2996M")
# modula_2024_step_train_test_loss_tokens_per_gpu_mfu_columns_modula1.txt
MODULA = ("step: 10         train loss: 3.11        test loss: 3.05         tokens/gpu/sec: 9378.40         "
          "MFU: 63.91%")
# verl_2025_sft_trainer_bars_glued_step_loss_lr_1e-3_nccl_banner_rldecisionagent.txt
VERL = ("Epoch 3/3:  83%|████████████████████████████████████████████████████████████████████▊              "
        "| 29/35 [06:26<01:19, 13.17s/it]step:100 - train/loss:0.0592457540333271 - "
        "train/lr(1e-3):6.81934829863884e-05")


@pytest.mark.parametrize("line, want, memory", [
    # no name for the counter; a field that is a time with its unit is the step time
    (LLAMA2C, {"iteration": 490, "lm_loss": 5.7543, "lr": 4.9e-05, "elapsed_ms": 8060.78, "mfu": 0.21}, None),
    # MMEngine: Iter(train) [N/M]; time beside data_time in seconds, a whole memory in MiB
    (XTUNER, {"iteration": 1510, "train_iters": 2046, "lr": 3.3994e-05, "elapsed_ms": 24912.8,
              "lm_loss": 0.7818, "grad_norm": 0.0005}, ("allocated_mb", 15266.0)),
    # detectron2: total_loss the loss, max_mem: NM in MiB
    (D2, {"iteration": 19, "lm_loss": 1.75, "elapsed_ms": 196.0, "lr": 0.0002}, ("max_allocated_mb", 2996.0)),
    # the test loss is an evaluation's; the line's training metrics are read
    (MODULA, {"iteration": 10, "lm_loss": 3.11, "tokens_per_gpu_per_sec": 9378.4, "mfu": 63.91}, None),
    # train/ before a name; a scale in brackets after it
    (VERL, {"iteration": 100, "lm_loss": 0.0592457540333271, "lr": 6.81934829863884e-08}, None),
])
def test_step_records_of_more_loops(line, want, memory):
    got = generic.parse(clean_line(line).text)
    assert got is not None
    assert got.pop("_memory", None) == memory
    assert got == pytest.approx(want)


@pytest.mark.parametrize("line", [
    "step 500: train loss 5.7373, val loss 5.9544",  # llama2c461: losses of an evaluation only
    "step:105 - val/loss:0.058481086045503616",  # rldecisionagent: a validation
])
def test_evaluation_lines_are_no_step_records(line):
    assert generic.parse(clean_line(line).text) is None


def test_a_counter_header_with_indented_metric_lines_is_one_record():
    # composer_2023_batch_header_indented_train_metrics_record_llmshearing24.txt (lines 1-2, 15, 19-20,
    # 24-25)
    lines = ["[batch=366/48000]:", "         Train time/batch: 365",
             "         Train memory/current_allocated_mem: 9.7173",
             "         Train memory/peak_allocated_mem: 44.6420",
             "         Train memory/peak_active_mem: 44.8020",
             "         Train trainer/device_train_microbatch_size: 16",
             "         Train loss/train/total: 10.3750"]
    d = parse_lines(lines).to_dict()
    its = [(r["iteration"], r["train_iters"], r["lm_loss"]) for r in d["iterations"]]
    assert its == [(366, 48000, 10.375)]
    assert [round(m["max_allocated_mb"], 1) for m in d["memory"]] == [round(44.642e9 / 2**20, 1)]


def test_a_record_hard_wrapped_after_name_value_pairs_is_one_record():
    # fairseq_xla_2019_records_wrapped_over_four_lines_five_devices_ptxla_fairseq21.txt (lines 1-8)
    lines = ["| epoch 001 | training on xla:0/4:     41 / 4830 loss=15.812,",
             "nll_loss=15.812, wps=945, ups=0, wpb=3986.024, bsz=128.000,",
             "num_updates=41, lr=5.22398e-06, gnorm=6.531, oom=0.000, wall=173,",
             "train_wall=21",
             "| epoch 001 | training on xla:0/6:     41 / 4830 loss=15.938,",
             "nll_loss=15.938, wps=753, ups=0, wpb=3145.122, bsz=128.000,",
             "num_updates=41, lr=5.22398e-06, gnorm=7.156, oom=0.000, wall=171,",
             "train_wall=21"]
    its = parse_lines(lines).to_dict()["iterations"]
    assert [(r["iteration"], r["lr"]) for r in its] == [(41, 5.22398e-06)]  # two devices, one update
    its = parse_lines(lines[:4]).to_dict()["iterations"]
    assert [(r["lm_loss"], r["grad_norm"]) for r in its] == [(15.812, 6.531)]


@pytest.mark.parametrize("line", [
    # nccl_2.2x_warn_cuda_failure_700_alloc_nan_check_torchrun_pytorch131755.txt: numbered
    "n122-164-108:7400:7642 [1] include/alloc.h:125 NCCL WARN Cuda failure 700 'an illegal memory access "
    "was encountered'",
    # nccl_2.x_nccl_tests_cuda_illegal_access_after_ib_reset_nccl629.txt: the older wording
    "A03-R28-I49-2-6000166:104934:104934 [1] init.cc:204 NCCL WARN Cuda failure 'an illegal memory access "
    "was encountered'",
])
def test_nccl_cuda_failure_is_a_cuda_error(line):
    (f,) = parse_lines([line]).to_dict()["failures"]
    assert (f["kind"], f["rank"]) == ("cuda_error", None)  # [1] is a CUDA device, no rank


@pytest.mark.parametrize("prefix", ["", "3: [1,3]<stdout>:"])
def test_a_rank_inside_the_message_is_the_failures_rank(prefix):
    # torch_2024_ray_worker_prefix_watchdog_cuda_illegal_access_rank0_vllm4108.txt (its last line)
    line = ("[E ProcessGroupNCCL.cpp:916] [Rank 0] NCCL watchdog thread terminated with exception: CUDA "
            "error: an illegal memory access was encountered")
    (f,) = parse_lines([prefix + line]).to_dict()["failures"]
    assert (f["kind"], f["rank"]) == ("cuda_error", 0)


# slurm_2022_submitit_preempted_job_requeue_step_cancelled_submitit1708.txt (lines 1-3)
NOTICE = ("submitit WARNING (2022-08-12 02:06:11,453) - Caught signal SIGUSR2 on SERVER_NAME: this job "
          "is preempted.")
REQUEUE = ["slurmstepd: error: *** JOB 608 ON SERVER_NAME CANCELLED AT 2022-08-12T02:06:12 DUE TO JOB "
           "REQUEUE ***",
           "slurmstepd: error: *** STEP 608.0 ON SERVER_NAME CANCELLED AT 2022-08-12T02:06:12 DUE TO JOB "
           "REQUEUE ***"]


def test_a_requeue_after_a_preemption_notice_is_a_preemption():
    fs = parse_lines([NOTICE] + REQUEUE).to_dict()["failures"]
    assert [f["kind"] for f in fs] == ["preempted"]  # JOB and STEP lines: one event
    # the line alone: Slurm requeues by hand (scontrol requeue) too
    assert [f["kind"] for f in parse_lines(REQUEUE).to_dict()["failures"]] == ["cancelled"]


def test_nccl_numbered_cuda_out_of_memory_is_a_gpu_oom():
    # openxla/xla pull request 7201 (its example error): NCCL's last warning, numbered (2:
    # cudaErrorMemoryAllocation)
    line = ("NCCL operation ncclCommInitRank(&comm, nranks, id, rank) failed: unhandled cuda error (run "
            "with NCCL_DEBUG=INFO for details). Last NCCL warning(error) log entry (may be unrelated) "
            "'Cuda failure 2 'out of memory''.; current tracing scope: all-reduce-start.285; current "
            "profiling annotation: XlaModule:#hlo_module=pjit__wrapped_step_fn,program_id=25#.")
    assert [f["kind"] for f in parse_lines([line]).to_dict()["failures"]] == ["gpu_oom"]
