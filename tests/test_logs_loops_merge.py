"""Step records of several readers and of several lines (labkit/logs/generic.py, deepspeed.py's
Steps), from real lines.

Each line is a line of a corpus log (tests/fixtures/logs/real, sources in its README.md), named
beside it; the expected values are read from the line by hand.
"""

from __future__ import annotations

import pytest

from labkit.logs import generic, parse_lines

# nanogpt_style_2026_qwen3_dense_..._pratic.txt, its first and last step lines
PRATIC = ["step   47700 | loss 1.4684 | lr 1.79e-04 | grad 0.075 | 113.4k tok/s | mfu 114.07%",
          "step   57350 | loss 13.5626 | lr 1.38e-04 | grad 0.820 | 37.2k tok/s | mfu 37.42%"]
# hf_trainer_deepspeed_2025_llamafactory_..._chevolier.txt: DeepSpeed's step=0 at the engine's build,
# then the first two Trainer dicts glued behind their bars (carriage returns as logged)
CHEVOLIER = [
    "[2025-04-01 07:26:44,333] [INFO] [logging.py:96:log_dist] [Rank 0] step=0, skipped=0, lr=[0.0, 0.0], "
    "mom=[(0.9, 0.999), (0.9, 0.999)]",
    "***** Running training *****",
    "\r  1%|          | 1/120 [03:05<6:07:17, 185.19s/it]\r" + " " * 50 + "\r{'loss': 1.5071, "
    "'grad_norm': 7.700284481048584, 'learning_rate': 4.166666666666667e-06, 'epoch': 0.04}",
    "\r  1%|          | 1/120 [03:05<6:07:17, 185.19s/it]\r  2%|\u258f         | 2/120 [05:40<5:29:58, "
    "167.78s/it]\r" + " " * 50 + "\r{'loss': 1.5376, 'grad_norm': 7.167555809020996, "
    "'learning_rate': 8.333333333333334e-06, 'epoch': 0.08}",
]
# instructlab_2024_tqdm_glued_json_..._instructlab392.txt, its first record (a JSON object over lines
# glued behind a bar) and the per-rank loss lines of the next step, glued
INSTRUCTLAB = ["Epoch 0:  97%|\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u258b| 76/78 "
               "[03:54<00:05,  2.94s/it]{", '    "epoch": 0,', '    "step": 76,', '    "rank": 0,',
               '    "overall_throughput": 44.94857943825548,', '    "lr": 2.0000000000000003e-06,',
               '    "cuda_mem_allocated": 1.2444758415222168,', '    "cuda_malloc_retries": 0,',
               '    "num_loss_counted_tokens": 25623,', '    "batch_size": 125,',
               '    "total_loss": 3.9130468719509817,', '    "samples_seen": 9661,',
               '    "timestamp": "2024-12-20T13:51:34.253834"', "}",
               "Epoch: 0, Step: 77, Rank: 3, loss = 0.95703125Epoch: 0, Step: 77, Rank: 1, loss = 0.71484375",
               "Epoch: 0, Step: 77, Rank: 0, loss = 0.921875"]


@pytest.mark.parametrize("line, tokens", [(PRATIC[0], 113400.0), (PRATIC[1], 37200.0)])
def test_a_number_with_an_si_suffix_is_scaled(line: str, tokens: float) -> None:
    rec = generic.parse(line)
    assert rec is not None and rec["tokens_per_sec"] == pytest.approx(tokens)
    its = parse_lines([line]).iterations
    assert its["tokens_per_sec"].tolist() == pytest.approx([tokens])


def test_deepspeed_step_0_at_the_engine_build_numbers_no_trainer_dict() -> None:
    its = parse_lines(CHEVOLIER).iterations
    assert its["iteration"].tolist() == [0, 1, 2]
    assert its["lr"].tolist() == pytest.approx([0.0, 4.166666666666667e-06, 8.333333333333334e-06])
    assert its["lm_loss"].isna().tolist() == [True, False, False]
    assert its["lm_loss"].tolist()[1:] == pytest.approx([1.5071, 1.5376])


def test_a_json_object_over_lines_after_a_bar_is_one_step_record() -> None:
    its = parse_lines(INSTRUCTLAB).iterations
    assert its["iteration"].tolist() == [76, 77]
    assert its["lm_loss"].tolist()[0] == pytest.approx(3.9130468719509817)
    assert its["lr"].tolist()[0] == pytest.approx(2.0000000000000003e-06)


# megatron_core_2026_torchrun_glog_nccl_2.30.7_..._iseekyan.txt: a loop's loss qualified by a word
ISEEKYAN = ["[step 0] loss native=0.002999 mlite=0.002999 | native-vs-mlite global_max_abs=0.000e+00 | "
            "neg-control(no-finalize) global_max_abs=2.075e-03",
            "[step 1] loss native=0.002341 mlite=0.002341 | native-vs-mlite global_max_abs=0.000e+00 | "
            "neg-control(no-finalize) global_max_abs=2.441e-03"]


def test_a_loss_qualified_by_a_word_is_the_first_value() -> None:
    its = parse_lines(ISEEKYAN).iterations
    assert its["iteration"].tolist() == [0, 1]
    assert its["lm_loss"].tolist() == pytest.approx([0.002999, 0.002341])


# Loops whose logs are in no corpus folder, read by the general rules (a line each, or an object over
# lines), sources: torchtune's log of huggingface.co/sca255/javabookgpt (log_1727690571.txt);
# MMEngine's of huggingface.co/kanashi6/GiT (det_base.log); detectron2's metrics.json of
# huggingface.co/unoaiinc/parser (parser_2024-03-12/metrics.json); MMDetection 2's JSON log of
# huggingface.co/czczup/ViT-Adapter (mask_rcnn_deit_adapter_tiny_fpn_1x_coco.log); an axolotl run's
# log_history entry of huggingface.co/duoyuncloud/zsh-cli-lora (checkpoint-45/trainer_state.json)
UNSEEN = [
    (["Step 1 | loss:2.575782299041748 lr:2.0000000000000002e-07 "
      "tokens_per_second_per_gpu:242.20615514588104"],
     {"iteration": 1, "lm_loss": 2.575782299041748, "lr": 2.0000000000000002e-07,
      "tokens_per_gpu_per_sec": 242.20615514588104}, None),
    (["2023/11/27 07:38:21 - mmengine - INFO - Iter(train) [ 500/120000] base_lr: 1.9999e-04 lr: 1.9999e-05 "
      "eta: 2 days, 0:24:47 time: 1.4585 data_time: 0.0141 memory: 20933 grad_norm: 0.7712 loss: 0.6846 "
      "detection_loss_cls: 0.1402 detection_loss_reg: 0.5444"],
     {"iteration": 500, "train_iters": 120000, "elapsed_ms": 1458.5, "lm_loss": 0.6846, "lr": 1.9999e-05,
      "grad_norm": 0.7712}, 20933.0),
    (['{"data_time": 0.0036090999999487394, "eta_seconds": 17583.512774706414, "fast_rcnn/cls_accuracy": '
      '0.79443359375, "iteration": 19, "loss_box_reg": 0.2794760763645172, "loss_cls": 1.0581414699554443, '
      '"loss_rpn_cls": 0.07686016336083412, "loss_rpn_loc": 0.07191445678472519, "lr": 4.99525e-06, '
      '"roi_head/num_bg_samples": 440.0, "time": 0.29315626500010694, "total_loss": 1.607136425562203}'],
     {"iteration": 19, "elapsed_ms": 293.15626500010694, "lm_loss": 1.607136425562203, "lr": 4.99525e-06},
     None),
    (['{"mode": "train", "epoch": 1, "iter": 50, "lr": 2e-05, "memory": 14346, "data_time": 1.77455, '
      '"loss_rpn_cls": 0.68081, "loss_rpn_bbox": 0.10844, "loss_cls": 2.70253, "acc": 55.43164, "loss_bbox": '
      '0.00945, "loss_mask": 0.90792, "loss": 4.40916, "time": 2.17396}'],
     {"iteration": 50, "elapsed_ms": 2173.96, "lm_loss": 4.40916, "lr": 2e-05}, 14346.0),
    (["    {", '      "epoch": 0.41237113402061853,', '      "grad_norm": 29.422929763793945,',
      '      "learning_rate": 3.6e-05,', '      "loss": 2.1003,', '      "memory/device_reserved (GiB)": 0,',
      '      "memory/max_active (GiB)": 4.94,', '      "memory/max_allocated (GiB)": 8.44,',
      '      "ppl": 8.16862,', '      "step": 10,', '      "tokens/total": 40960,',
      '      "tokens/train_per_sec_per_gpu": 0.03,', '      "tokens/trainable": 732', "    },"],
     {"iteration": 10, "lm_loss": 2.1003, "lr": 3.6e-05, "grad_norm": 29.422929763793945}, None),
]


@pytest.mark.parametrize("lines, want, allocated", UNSEEN)
def test_loops_of_no_corpus_log_read(lines: list[str], want: dict, allocated: float | None) -> None:
    parsed = parse_lines(lines)
    got = parsed.iterations.dropna(axis=1, how="all").to_dict("records")
    assert len(got) == 1 and got[0] == pytest.approx(want)
    mem = parsed.memory["allocated_mb"].dropna().tolist()
    assert mem == ([allocated] if allocated is not None else [])
