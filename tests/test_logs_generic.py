"""Step records of any training loop (labkit/logs/generic.py, records.py), TorchX prefixes glued
to a bar (lines.py) and Slurm's allocation-side node failure (failures.py), from real lines.

Each line is a line of a corpus log (tests/fixtures/logs/real, sources in its README.md), named
beside it; the expected values are read from the line by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from labkit.logs import generic, multiline, parse_lines, parse_log, records
from labkit.logs.lines import clean_line, iter_file, iter_lines, split_glued

REAL = Path(__file__).parent / "fixtures" / "logs" / "real"

# prime_rl_2025_..._primerl20.txt (its only line)
PRIME = "03:26:55 [INFO] [TRAIN] [Rank 0] step: 8, loss: 975.9991, tokens_per_second: 76957.79, mfu: 42.46"
# tensorflow_2018_slim_..._tfmodels2980.txt
TF = "INFO:tensorflow:global step 1: loss = 79.3501 (57.126 sec/step)"
# torch_xla_2023_..._xla6026.txt
XLA = ("| Training Device=xla:0/3 Epoch=1 Step=280 Loss=0.01022 Rate=1760.91 GlobalRate=257.10 "
       "Time=07:29:39")
# tinygrad_2025_..._tinygrad13803.txt
TINY = "    1 93.44 s run, 11.8750 loss, 0.000000000001 LR, 642.43 GB used,  19644.30 GFLOPS"
# torchtune_2025_..._torchtune2620.txt: the bar's second copy, the next line's prefix glued to it
TUNE = ("[trainer0|0]:1|27|Loss: 1.1958776712417603:  27%|██▋       | 27/101 [07:00<17:31, 14.21s/it]"
        "[trainer0|0]:")
# maxtext_2024_completed_step_..._maxtext761.txt (read by loops.py too: the same fields)
MAXTEXT = ("completed step: 9, seconds: 1.341, TFLOP/s/device: 257.929, Tokens/s/device: 36653.244, "
           "loss: 0.000")


@pytest.mark.parametrize("line, want", [
    (PRIME, {"iteration": 8, "lm_loss": 975.9991, "tokens_per_sec": 76957.79, "mfu": 42.46}),
    (TF, {"iteration": 1, "lm_loss": 79.3501, "elapsed_ms": 57126.0}),  # value unit name: sec/step
    (XLA, {"iteration": 280, "lm_loss": 0.01022}),  # Rate: no column; Time=07:29:39 a clock
    (TINY, {"iteration": 1, "elapsed_ms": 93440.0, "lm_loss": 11.875, "lr": 1e-12}),  # no counter name
    (TUNE, {"iteration": 27, "lm_loss": 1.1958776712417603}),  # epoch|step|Loss
    (MAXTEXT, {"iteration": 9, "elapsed_ms": 1341.0, "tflops_per_gpu": 257.929,
               "tokens_per_gpu_per_sec": 36653.244, "lm_loss": 0.0}),
    # llm.c's train_gpt2.py (karpathy/llm.c issue 77) and train_gpt2.c (pull request 156): formats
    # none of the corpus logs prints ("took" alone is no name, a save or a load takes time too; in
    # brackets after a step's loss it is the step's: train_gpt2.c times forward, backward and update)
    ("iteration 0, loss: 2.86417818069458, time: 2833.053ms",
     {"iteration": 0, "lm_loss": 2.86417818069458, "elapsed_ms": 2833.053}),
    ("step 0: train loss 4.845659 (took 2141 ms)",
     {"iteration": 0, "lm_loss": 4.845659, "elapsed_ms": 2141.0}),
])
def test_step_records_of_any_loop(line, want):
    got = generic.parse(clean_line(line).text)
    assert got == pytest.approx(want)


@pytest.mark.parametrize("line", [
    "INFO:tensorflow:Recording summary at step 0.",  # tfmodels2980: a counter, no metric
    "val loss 6.971008",  # llm.c pull request 156: an evaluation, no counter
    "INFO:tensorflow:global_step/sec: 0.0339311",  # tfmodels2980: a rate, no counter
    # nanotron115: a start-up summary (train_steps, start_iteration_step are no counters)
    "[Start training] datetime: 2024-03-22 19:46:52.930585 | mbs: 1 | grad_accum: 8 | global_batch_size: "
    "8 | sequence_length: 4096 | train_steps: 5 | start_iteration_step: 0 | consumed_train_samples: 0",
    # trlx342: losses in a bar's description, the bar's own counter
    "[losses/total_loss: 1.64 | losses/policy_loss: 0.12 | losses/value_loss: 7.62]:  16%|█████      "
    "| 1024/6400 [1:14:23<1:13:02,  1.23it/s]",
    # tinygrad's generation timing per token (tinygrad PR 8733): a rate, no step counter
    "total 148.01 ms, 6.76 tok/s, 551.54 GB/s, param 491.02 GB/s",
    # nanoGPT's evaluation line, as its train.py prints it: an estimate, no training step
    "step 2000: train loss 1.7633, val loss 1.8840",
    "  lr .............................................. 0.00015",  # bigscience_..._n16-ds-off: arguments
    "     2097152        524288     float     sum      -1    113.2   18.53   18.53      0    93.35   "
    "22.46   22.46      0",  # nccl_tests_2024_tree_two_nodes_table_cut_nccltests232: a table row
])
def test_lines_that_are_no_step_records(line):
    assert generic.parse(clean_line(line).text) is None


def test_the_corpus_holds_no_line_it_misreads():
    """On every line of every corpus log: a record the generic reader would keep names an
    iteration inside the log's hand-read range, and a log with no iteration gives none."""
    wrong = []
    for log in sorted(REAL.glob("*.txt")):
        want = json.loads(log.with_suffix(".expected.json").read_text())["iterations"]
        first = want.get("first", {}).get("iteration")
        last = want.get("last", {}).get("iteration")
        recs = multiline.Records()  # the log's records, as the reader keeps them (epoch summaries not)
        for line in iter_lines(log):
            rec = generic.parse(line.text, recs) if generic.may_be_record(line.text) else None
            if rec is not None:
                recs.append({**rec, "_line": (line.lineno, line.text[:120])})
        for rec in records.kept(recs):
            n = rec["iteration"]
            inside = want["count"] > 0 and (first is None or last is None or first <= n <= last)
            if not inside:
                wrong.append((log.name, *rec["_line"]))
    assert wrong == []


def test_a_dedicated_reader_wins_and_a_doubled_line_is_one_record():
    nanogpt = "iter 1631: loss 4.0863, time 561.94ms, mfu 38.12%"  # nanogpt110
    its = parse_lines([nanogpt, PRIME]).to_dict()["iterations"]
    assert [r["iteration"] for r in its] == [1631]  # nanoGPT's reader read the log: no generic record
    tf2 = "INFO:tensorflow:global step 2: loss = 72.8609 (17.053 sec/step)"
    its = parse_lines([TF, TF, tf2, tf2]).to_dict()["iterations"]  # two log handlers print each line
    assert [(r["iteration"], r["lm_loss"], r["elapsed_ms"]) for r in its] == [
        (1, 79.3501, 57126.0), (2, 72.8609, 17053.0)]


@pytest.mark.parametrize("other", [
    "node-3:1234:1234 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.3<0>",  # nccl_2.22_p2p_cumem
    "------------------------ arguments ------------------------",  # bigscience_..._n16-ds-off: Megatron
])
def test_generic_records_beside_other_tools(other):
    """A log with another tool's lines (a trigger word), Megatron's included, and no record of
    theirs is read a second time for step lines."""
    d = parse_lines([other, XLA]).to_dict()
    assert [(r["iteration"], r["lm_loss"]) for r in d["iterations"]] == [(280, 0.01022)]


def test_torchx_prefix_names_the_rank_and_a_glued_prefix_splits_the_line():
    line = clean_line("[trainer0|3]:1|25|Loss: 1.2621808052062988:  26%|██▌       | 26/101 "
                      "[06:45<17:27, 13.96s/it]   [trainer1|5]:1|25|Loss: 1.25:")
    first, second = split_glued(line)
    assert (first.rank, first.text.strip()) == (3, "1|25|Loss: 1.2621808052062988:")
    assert (second.rank, second.text) == (5, "1|25|Loss: 1.25:")
    its = parse_lines([TUNE, TUNE.replace("1|27|", "1|28|")]).to_dict()["iterations"]
    assert [r["iteration"] for r in its] == [27, 28]


@pytest.mark.parametrize("line, node", [
    ("salloc: error: Node failure on worker-1", "worker-1"),  # soperator854
    # GoogleCloudPlatform/cluster-toolkit issue 1600 (srun -N3 hostname)
    ("srun: error: Node failure on hpcsmall-debug-ghpc-0", "hpcsmall-debug-ghpc-0"),
])
def test_slurm_node_failure_names_the_node(line, node):
    (f,) = parse_lines([line]).to_dict()["failures"]
    assert f["kind"] == "node_failure" and f"node {node} failed" in f["message"]


def _line(name: str, lineno: int) -> str:
    """Line ``lineno`` of the corpus log ``name``, as the reader gets it (prefixes removed)."""
    return next(ln.text for ln in iter_lines(REAL / name) if ln.lineno == lineno)


def _fields(rec: dict | None) -> dict | None:
    return None if rec is None else {k: v for k, v in rec.items() if not k.startswith("_")}


ACCESSORY = "llama2_accessory_2023_metric_logger_epoch_batch_closs_median_grad_norm_max_mem_accessory48.txt"
METASEQ = "metaseq_2022_slurm_procid_prefix_train_inner_json_records_wps_ups_metaseq507.txt"
COMPOSER = "composer_2023_global_rank_stdout_stderr_banners_batch_records_mfu_warning_foundry244.txt"
FAIRSEQ_JSON = "fairseq_2020_json_record_fairseq2201.txt"
FAIRSEQ_SUMMARIES = "fairseq_2018_json_epoch_summaries_only_fairseq233.txt"
VIT = "dsex_data_efficiency__vit_finetuning__out__cifar__training.txt"


def test_a_batch_in_brackets_after_its_epoch_and_any_name_ending_in_loss():
    # ``[05:19:47.352788] Epoch: [1]  [1480/1504]  lr: 0.000012  closs: 0.9233 (0.9531)  grad_norm:
    # 0.2695 (0.3902)  time: 4.3916  data: 0.0002  max mem: 51710``: closs the loss, time in seconds
    # beside a data-loading time, a memory without a unit a whole number of MiB
    rec = generic.parse(_line(ACCESSORY, 1))
    assert rec.pop("_memory") == ("max_allocated_mb", 51710.0)
    assert _fields(rec) == pytest.approx({"iteration": 1480, "lr": 1.2e-05, "lm_loss": 0.9233,
                                          "grad_norm": 0.2695, "elapsed_ms": 4391.6})
    # epoch 2's batch 0 follows epoch 1's last: batches since the run's start, (2 - 1) x 1504 + 0
    its = parse_log(REAL / ACCESSORY).to_dict()["iterations"]
    assert [r["iteration"] for r in its] == [1480, 1490, 1500, 1504, 1514, 1524, 1534]


def test_a_log_whose_epochs_count_from_0():
    # ``Epoch: [0][  0/391]`` then ``Epoch: [1][  0/391]`` (the ImageNet example's ProgressMeter)
    state = multiline.Records()
    got = [generic.parse(_line(VIT, n), state) for n in (200, 206)]
    assert [(r["iteration"], r["lm_loss"]) for r in got] == [(0, 3.436), (391, 2.2442)]


def test_a_json_record_anywhere_in_the_line_with_quoted_numbers():
    # ``slurm_procid 0 : 2022-11-11 14:05:29 | INFO | train_inner | {"epoch": 1, ..., "loss":
    # "15.864", ..., "wps": "739601", "ups": "0.71", ..., "num_updates": "2", "lr": "5.60224e-07",
    # "gnorm": "16.783", ...}``
    assert _fields(generic.parse(_line(METASEQ, 2))) == pytest.approx({
        "iteration": 2, "lm_loss": 15.864, "lr": 5.60224e-07, "grad_norm": 16.783,
        "tokens_per_sec": 739601.0, "elapsed_ms": 1000 / 0.71})  # actv_norm, tok_norm: no gradient norm
    # fairseq's own json format, read by loops.py too: the same fields
    rec = _fields(generic.parse(_line(FAIRSEQ_JSON, 1)))
    assert (rec["iteration"], rec["lm_loss"], rec["lr"], rec["grad_norm"], rec["tokens_per_sec"]) == (
        33700, 8.206, 0.00017226, 1.833, 1195.4)
    assert rec["elapsed_ms"] == pytest.approx(1000 / 1.62)


def test_json_records_of_an_evaluation_or_of_whole_epochs_are_no_steps():
    assert generic.parse(_line(FAIRSEQ_SUMMARIES, 1)) is None  # valid_ keys, no counter
    # ``{"epoch": 10, "loss": "3.180", ..., "num_updates": 21497, ...}``, then epoch 11's, ...: one
    # record per epoch, its summary
    assert parse_log(REAL / FAIRSEQ_SUMMARIES).to_dict()["iterations"] == []
    # metaseq's two records of epoch 1 are steps
    its = parse_log(REAL / METASEQ).to_dict()["iterations"]
    assert [(r["iteration"], r["lm_loss"]) for r in its] == [(1, 15.878), (2, 15.864)]


def test_a_qualified_name_and_a_record_the_log_cuts_off():
    # ``[batch=1/10]:`` then ``Train memory/allocated_mem: 1.4586`` (GB, no unit printed), ...,
    # ``Train lr-DecoupledAdamW/group0: 0.0000``; ``[batch=2/10]:`` and two lines, then the log ends
    d = parse_log(REAL / COMPOSER).to_dict()
    its = [(r["iteration"], r["train_iters"], r["lm_loss"], r["lr"]) for r in d["iterations"]]
    assert its == [(1, 10, 11.6153, 0.0), (2, 10, None, None)]
    assert [round(m["allocated_mb"], 1) for m in d["memory"]] == [round(1.4586e9 / 2**20, 1)]


BIGDL = "bigdl_2017_epoch_iteration_wall_clock_train_in_seconds_throughput_records_loss_is_bigdl678.txt"
NLUT = "custom_loop_2023_iter_time_per_iter_lr_four_losses_total_losses_turn_nan_nlut12.txt"
ESPNET = "espnet2_2020_host_bracket_trainer_epoch_train_batch_range_stats_loss_lr0_espnet2675.txt"
LLAMAFACTORY = ("llamafactory_2023_ppo_trainer_log_jsonl_current_steps_total_steps_loss_negative_ellipsis_"
                "lf856.txt")
MMCV = "mmdet3d_2025_mmcv_text_logger_epoch_iter_tab_lr_time_memory_task_losses_loss_grad_norm_daocc25.txt"
LLMC = "llmc_2024_main_log_s_trl_lr_norm_tel_head_tail_cut_moddednanogpt.txt"
NEMO_GKE = "nemo_2025_gke_pod_lightning_bar_glued_dllogger_steps_world_32_tp2_pp2_gpurecipes.txt"


def test_the_records_own_loss_wins_over_its_terms():
    # ``... Epoch [1][54/30895]<TAB>lr: 8.080e-05, eta: 4 days, 9:46:02, time: 1.966, data_time: 0.093,
    # memory: 13102, loss/object/heatmap/task0: 0.3297, ..., loss/occ/loss_occ: 1.4139, loss: 46.4968,
    # grad_norm: 448.5880``: the loss/... names are terms, the bare loss the record's total
    rec = generic.parse(_line(MMCV, 1))
    assert rec.pop("_memory") == ("allocated_mb", 13102.0)
    assert _fields(rec) == pytest.approx({"iteration": 54, "lr": 8.08e-05, "elapsed_ms": 1966.0,
                                          "lm_loss": 46.4968, "grad_norm": 448.588})


@pytest.mark.parametrize("name, lineno, want", [
    # `` iter 3700   time/iter: 0.50  lr: 0.000100 loss_mn: 0.0016 ... loss_mse: 0.0280 losses: 3.4793``:
    # a time per iteration without a unit is seconds; losses the total of the named terms
    (NLUT, 1, {"iteration": 3700, "elapsed_ms": 500.0, "lr": 0.0001, "lm_loss": 3.4793}),
    # ``... loss_mn: nan ... losses: nan``: the loss's place, no number; the step's other metrics stay
    (NLUT, 11, {"iteration": 4700, "elapsed_ms": 490.0, "lr": 0.0001, "lm_loss": None}),
    # ``[Epoch 1 28160000/28857522][Iteration 56][Wall Clock 72.891726153s] Train 512000 in
    # 1.236008372seconds. Throughput is 414236.66 records/second. Loss is 0.53861904.``
    (BIGDL, 1, {"iteration": 56, "elapsed_ms": 1236.008372, "samples_per_sec": 414236.66,
                "lm_loss": 0.53861904}),
    # ``[PC] ... INFO: 16epoch:train:2626-3000batch: iter_time=0.001, forward_time=0.005, loss=1.303, ...,
    # lr_0=0.100, train_time=0.014``: a record over a range of batches (its last numbers it), lr_0 group 0's
    (ESPNET, 1, {"iteration": 3000, "lm_loss": 1.303, "lr": 0.1}),
    # ``{"current_steps": 10, "total_steps": 1287, "loss": -0.1994, "eval_loss": null, ...,
    # "learning_rate": 9.998795309164754e-06, "epoch": 0.01, ..., "elapsed_time": "0:11:19", ...}``
    (LLAMAFACTORY, 1, {"iteration": 10, "train_iters": 1287, "lm_loss": -0.1994,
                       "lr": 9.998795309164754e-06}),
    # ``s:0 trl:11.0091 lr:0.000001 norm:15.37``: an abbreviated counter starting a line with a loss
    (LLMC, 2, {"iteration": 0, "lm_loss": 11.0091, "lr": 1e-06, "grad_norm": 15.37}),
])
def test_records_of_more_loops(name, lineno, want):
    assert _fields(generic.parse(_line(name, lineno))) == pytest.approx(want)


def test_evaluation_lines_of_those_loops_are_no_records():
    assert generic.parse(_line(LLMC, 1)) is None  # ``s:0 tel:11.0092``: an evaluation
    # ``Loss is (Loss: 134.79276, count: 128, Average Loss: 1.0530684)``: BigDL's validation
    assert generic.parse(_line(BIGDL, 2)) is None


def test_a_record_glued_after_a_progress_bar_wins_over_the_bars_rounded_copy():
    # ``Epoch 0: : 5%|...| 1/20 [00:40<12:58, v_num=None, reduced_train_loss=12.90, global_step=0.000,
    # ..., train_step_timing in s=41.00]DLL 2025-06-11 08:26:37.591698 - 0 reduced_train_loss :
    # 12.944934844970703  lr : 0.0  global_step : 0.0  ...  grad_norm : 14.865035057067871
    # train_step_timing in s : 40.98364186286926  epoch : 0``; the last bar, redrawn alone at the end
    its = parse_log(REAL / NEMO_GKE).to_dict()["iterations"]
    assert len(its) == 20
    got = [(r["iteration"], r["lm_loss"], r["lr"], r["grad_norm"], r["elapsed_ms"])
           for r in (its[0], its[-1])]
    assert got == [(0, 12.944934844970703, 0.0, 14.865035057067871, pytest.approx(40983.64186286926)),
                   (19, 8.54244613647461, 1.4250000504034688e-06, 10.089638710021973,
                    pytest.approx(13447.93004989624))]


PIPE = "megatron_deepspeed_2026_pipe_engine_steps_two_nodes_world16_tp2_pp4_dp2_nccl_2.27_lockclock.txt"
LF_JSONL = "llamafactory_2025_trainer_log_jsonl_dpo_grpo_32b_two_node_360lf.txt"
MASKRCNN = "maskrcnn_2022_trainer_eta_iter_loss_lr_max_mem_crlf_stops_mid_training_cut_azure.txt"


def _raw(name: str, first: int, last: int) -> list[bytes]:
    """Lines ``first``-``last`` of the corpus log ``name``, as the file holds them."""
    return [ln for n, ln in enumerate(iter_file(REAL / name), 1) if first <= n <= last]


def test_pipe_engine_steps_are_read_beside_megatron_lines():
    # the arguments banner ``------------------------ arguments ------------------------`` and
    # ``[Rank 5] (after 1 iterations) memory (MB) | allocated: 6365.63...`` around
    # ``steps: 1 loss: 12.6418 iter time (s): 20.245 samples/sec: 0.790`` ... ``steps: 9 ...``
    its = parse_lines(_raw(PIPE, 1, 997)).to_dict()["iterations"]
    assert [(r["iteration"], r["lm_loss"], r["elapsed_ms"]) for r in (its[0], its[-1])] == \
        [(1, 12.6418, 20245.0), (9, 12.5345, 23756.0)]
    assert len(its) == 9


def test_jsonl_records_with_a_fractional_epoch_are_steps_not_epoch_summaries():
    # ``{"current_steps": 1, "total_steps": 5100, "loss": 0.6491, "accuracy": 1.0, "lr":
    # 9.803921568627451e-10, "epoch": 0.0019588638589618022, ...}``: every epoch another, none whole
    its = parse_lines(_raw(LF_JSONL, 1, 3)).to_dict()["iterations"]
    assert [(r["iteration"], r["train_iters"], r["lm_loss"]) for r in its] == \
        [(1, 5100, 0.6491), (2, 5100, 0.6466), (3, 5100, 1.1105)]


def test_a_lines_record_wins_over_an_mllog_object_of_the_same_step():
    # ``... maskrcnn_benchmark.trainer INFO: eta: 2:56:41  iter: 50  time: 0.2474 (0.2654)  data:
    # 0.0003 (0.0136)  loss: 1.2980 (2.2687)  ...  lr: 0.009600  max mem: 20326`` then ``:::MLLOG
    # {..., "key": "tracked_stats", "value": {"time": 0.2653..., "loss": 2.268724710941315, ...},
    # "metadata": {..., "step": 50}}``: the object's values are the run's averages
    its = parse_lines(_raw(MASKRCNN, 1046, 1047)).to_dict()["iterations"]
    assert [(r["iteration"], r["lm_loss"], r["lr"], r["elapsed_ms"]) for r in its] == \
        [(50, 1.298, 0.0096, pytest.approx(247.4))]


# verl (tests/fixtures/logs/heldout3q/verl_2026_grpo_..._fork.txt, its line 885, behind Ray's
# ``(TaskRunner pid=625502)``; some of its fields, each whole)
VERL = ("step:1 - global_seqlen/min:2578 - actor/entropy:0.463403582572937 - actor/pg_loss:0.0 - "
        "actor/grad_norm:0.009721037931740284 - actor/lr:3e-05 - perf/mfu/actor:0.0 - "
        "training/global_step:1 - timing_s/step:36.26888222503476 - perf/time_per_step:36.26888222503476")
VERL_SFT = "verl_2025_sft_trainer_bars_glued_step_loss_lr_1e-3_nccl_banner_rldecisionagent.txt"


def test_a_metric_under_groups_is_read_by_its_own_name():
    rec = _fields(generic.parse(VERL))
    assert (rec["iteration"], rec["lr"], rec["grad_norm"], rec["elapsed_ms"]) == \
        (1, 3e-05, 0.009721037931740284, pytest.approx(36268.88222503476))
    # ``step:105 - val/loss:0.058481086045503616``: an evaluation's group reads no record
    assert generic.parse(_line(VERL_SFT, 13)) is None
