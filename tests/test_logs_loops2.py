"""Step lines of whole loop families, read from the loops' own logging code and checked on lines
users posted (labkit/logs/generic.py, loops.py, lines.py's prefixes).

Each line is copied from a public issue thread or a held-out log (its source named beside it); the
expected values are read from the line by hand.
"""

from __future__ import annotations

import pytest

from labkit.logs import generic, parse_lines

# MetricLogger (torchvision's references, DETR, DeiT, MAE, DINO, DINOv2): ``header  [i/n]  eta: ...
# meters  time: ...  data: ...  max mem: ...``, each meter ``median (global average)``.
# DINOv2 behind its glog-style prefix, the first line behind a Markdown backtick
# (https://github.com/facebookresearch/dinov2/issues/492; heldout3z/dinov2_2025_..._dinov2_492.txt)
DINOV2 = [
    "`I20250104 12:12:42 90 dinov2 helpers.py:102] Training  [   1250/2500000]  eta: 40 days, 13:22:08  "
    "lr: 0.0006 (0.0003)  wd: 0.0400 (0.0400)  mom: 0.9940 (0.9940)  last_layer_lr: 0.0000 (0.0000)  "
    "current_batch_size: 380.0000 (380.0000)  total_loss: 6.7223 (inf)  dino_local_crops_loss: 4.9698 "
    "(5.1138)  dino_global_crops_loss: 0.6292 (0.6445)  koleo_loss: 0.0315 (inf)  ibot_loss: 1.0857 "
    "(1.1301)  time: 1.363414  data: 0.000342  max mem: 61695",
    "I20250104 12:12:55 90 dinov2 helpers.py:102] Training  [   1260/2500000]  eta: 40 days, 13:03:52  "
    "lr: 0.0006 (0.0003)  wd: 0.0400 (0.0400)  mom: 0.9940 (0.9940)  last_layer_lr: 0.0006 (0.0000)  "
    "current_batch_size: 380.0000 (380.0000)  total_loss: 6.7171 (inf)  dino_local_crops_loss: 4.9707 "
    "(5.1126)  dino_global_crops_loss: 0.6294 (0.6444)  koleo_loss: 0.0315 (inf)  ibot_loss: 1.0856 "
    "(1.1297)  time: 1.356799  data: 0.000374  max mem: 61695",
]
# MAE-style fine-tuning (https://github.com/THU-MIG/PYRA/issues/3): an epoch's lines, its
# ``Total time`` and ``Averaged stats`` summaries (no steps)
PYRA = [
    "Epoch: [34]  [10/31]  eta: 0:00:09  lr: 0.001134  loss: 0.0231 (0.0361)  time: 0.4437  data: 0.3777  "
    "max mem: 5990",
    "Epoch: [34]  [20/31]  eta: 0:00:03  lr: 0.001134  loss: 0.0277 (0.0426)  time: 0.1559  data: 0.0924  "
    "max mem: 5990",
    "Epoch: [34] Total time: 0:00:07 (0.2424 s / it)",
    "Averaged stats: lr: 0.001134  loss: 0.0277 (0.0398)",
]
# DETR (https://github.com/facebookresearch/detr/issues/22), the head of a line of epoch 0
DETR = ("Epoch: [0]  [210/225]  eta: 0:00:04  lr: 0.001000  class_error: 100.00  loss: 18.0540 (23.4763)  "
        "loss_ce: 0.6480 (0.7208)  loss_bbox: 1.0048 (1.4134)  loss_giou: 1.5002 (1.7948)  loss_ce_0: "
        "0.6452 (0.7170)  loss_bbox_0: 1.0194 (1.4193)")
# an evaluation's MetricLogger lines (https://github.com/JH-LEE-KR/dualprompt-pytorch/issues/5)
DUALPROMPT_TEST = ("Test: [Task 1]  [30/63]  eta: 0:00:03  Loss: 0.6518 (0.5845)  Acc@1: 81.2500 (83.6694)  "
                   "Acc@5: 100.0000 (97.5806)  time: 0.1127  data: 0.0001  max mem: 2112")
# ChatLLaMA's loop under DeepSpeed, two processes' lines glued (https://github.com/nebuly-ai/optimate/
# issues/314; heldout3z/deepspeed_2023_chatllama_..._optimate314.txt)
CHATLLAMA = ("Epoch: 1/1, Iteration: 1/160782, Training Loss: nanEpoch: 1/1, Iteration: 1/160782, "
             "Training Loss: nan")
# fairseq's fp16 scaler note between its step lines (https://github.com/facebookresearch/fairscale/pull/121;
# heldout3w/fairseq_2020_fairscale_..._fairscale121.txt)
FAIRSCALE = [
    "2020-10-01 10:55:02 | INFO | train_inner | epoch 001:      2 / 78 loss_scale=32, train_wall=0, wall=6",
    "2020-10-01 10:55:02 | INFO | fairseq.trainer | NOTE: overflow detected, setting loss scale to: 16.0",
    "2020-10-01 10:55:02 | INFO | train_inner | epoch 001:      3 / 78 loss_scale=16, train_wall=0, wall=7",
    "2020-10-01 10:55:02 | INFO | train_inner | epoch 001:      4 / 78 loss=1.006, ppl=2.01, wps=0, ups=0, "
    "wpb=1024, bsz=8, num_updates=1, lr=2.24975e-07, gnorm=0.056, loss_scale=16, train_wall=0, wall=7",
]


def test_metric_logger_lines_behind_a_glog_prefix_are_steps() -> None:
    its = parse_lines(DINOV2).iterations
    assert its["iteration"].tolist() == [1250, 1260]
    assert its["train_iters"].tolist() == [2500000, 2500000]
    assert its["lm_loss"].tolist() == pytest.approx([6.7223, 6.7171])  # total_loss's current value
    assert its["lr"].tolist() == pytest.approx([0.0006, 0.0006])
    assert its["elapsed_ms"].tolist() == pytest.approx([1363.414, 1356.799])  # beside ``data:``: seconds


def test_metric_logger_summaries_are_no_steps() -> None:
    parsed = parse_lines(PYRA)
    its = parsed.iterations
    assert len(its) == 2
    assert its["lm_loss"].tolist() == pytest.approx([0.0231, 0.0277])
    assert its["elapsed_ms"].tolist() == pytest.approx([443.7, 155.9])
    assert parsed.memory["max_allocated_mb"].tolist() == [5990.0, 5990.0]


def test_metric_logger_of_epoch_0_counts_its_batches() -> None:
    rec = generic.parse(DETR)
    assert rec is not None
    assert (rec["iteration"], rec["lm_loss"], rec["lr"]) == (210, pytest.approx(18.054), pytest.approx(0.001))


def test_metric_logger_of_an_evaluation_is_no_step() -> None:
    assert generic.parse(DUALPROMPT_TEST) is None


def test_a_loss_printed_as_nan_keeps_its_step() -> None:
    rec = generic.parse(CHATLLAMA)
    assert rec is not None and rec["iteration"] == 1 and rec["lm_loss"] is None


def test_fairseq_overflow_note_is_a_skipped_step() -> None:
    parsed = parse_lines(["python fairseq_train.py --fp16 --model-parallel-size 2", *FAIRSCALE])
    assert parsed.iterations["iteration"].tolist() == [1]
    assert [(f["kind"], f.get("skipped_steps")) for f in parsed.findings] == [("fp16_overflow", 1)]


# ColossalAI's rich logger (FastFold, https://github.com/hpcaitech/FastFold/pull/138): a record wrapped
# at the terminal's width onto a line indented to the message's column, its own ``loss=`` there
FASTFOLD = [
    "[01/15/23 18:11:55] INFO     colossalai - colossalai - INFO: train.py:230 main",
    "                    INFO     colossalai - colossalai - INFO: Training, Epoch: 0, Step: 1, "
    "Global_Step: 1, "
    "Loss: distogram=4.159 experimentally_resolved=0.693 fape=1.682",
    "                             lddt=3.912 masked_msa=3.135 supervised_chi=0.937 violation=404.925 "
    "unscaled_loss=10.176 loss=162.822 lddt_ca=0.010 drmsd_ca=26.113",
    "[01/15/23 18:12:07] INFO     colossalai - colossalai - INFO: train.py:230 main",
    "                    INFO     colossalai - colossalai - INFO: Training, Epoch: 0, Step: 2, "
    "Global_Step: 2, "
    "Loss: distogram=4.159 experimentally_resolved=0.693 fape=1.543",
    "                             lddt=3.912 masked_msa=3.135 supervised_chi=0.961 violation=393.072 "
    "unscaled_loss=10.062 loss=160.364 lddt_ca=0.009 drmsd_ca=22.707",
]
# ``g_step`` the global step before the epoch's (https://github.com/LorrinWWW/two-are-better-than-one/issues/24)
G_STEP = "g_step 2000, step 152, avg_time 0.874, loss:51.5502"


def test_a_record_wrapped_onto_an_indented_line_is_read_whole() -> None:
    its = parse_lines(FASTFOLD).iterations
    assert its["iteration"].tolist() == [1, 2]
    assert its["lm_loss"].tolist() == pytest.approx([162.822, 160.364])  # the record's own loss


def test_g_step_is_the_global_step() -> None:
    rec = generic.parse(G_STEP)
    assert rec is not None and (rec["iteration"], rec["lm_loss"]) == (2000, pytest.approx(51.5502))
