"""Step records read by general rules (labkit/logs/concepts.py, generic.py): names by concept, the
counter by its shape, a terminal's wrap inside a field, records of one step from two readers.

The lines are real: those of the 3t logs are corpus logs (tests/fixtures/logs/real, sources in
its README.md), named beside them; the others come from frameworks no corpus log holds (source
beside each). Expected values are read from the lines by hand.
"""

from __future__ import annotations

import pytest

from labkit.logs import concepts, generic, parse_lines
from labkit.logs.lines import clean_line


@pytest.mark.parametrize("name, kind", [
    ("interval_samples_per_second", "smp"),  # PaddleNLP Trainer's: a prefix, a rate spelled out
    ("samples/sec", "smp"),
    ("Samples per second", "smp"),
    ("loss_scaling", "loss_scale"),  # PaddleNLP's
    ("grad_scale", "loss_scale"),  # fairseq2's (a GradScaler's scale)
    ("tgs", "tokg"),  # InternLM's tokens per GPU per second
    ("tokens/gpu/second", "tok"),  # a device is a flag, not part of the name
    ("consumed_samples", "consumed"),  # LiBai's
    ("num_consumed_samples", "consumed"),
    ("tot_loss", "lm_loss"),  # MiniLLM's total
    ("valid_loss", None),  # an evaluation's
])
def test_names_by_concept(name, kind):
    assert concepts.kind(name) == kind


def test_a_device_in_the_name_is_per_device():
    assert concepts.per_device("tokens/gpu/second") and concepts.per_device("tokens_per_gpu_per_sec")
    assert not concepts.per_device("tokens_per_second")


# internlm_2023_train_metrics_key_value_tgs_internlm22.txt (cut after grad_norm)
INTERNLM = ("2023-07-10 14:26:28,977\tINFO train.py:317 in record_current_batch_training_metrics -- "
            "tflops=188.02533140299252,step=36,loss=5.459033012390137,tgs (tokens/gpu/second)=4233.73,"
            "lr=7.6e-06,loss_scale=65536.0,grad_norm=12.540833573326264,micro_num=4")
# paddlenlp_trainer_2023_llama_interval_runtime_samples_per_second_paddle56363.txt
PADDLE = ("[    INFO] - loss: 2.00048828, learning_rate: 2.1e-06, global_step: 20, "
          "interval_runtime: 26.3106, "
          "interval_samples_per_second: 6.081193361471736, interval_steps_per_second: 0.760149170183967, "
          "epoch: 0.0014")
# vmamba_2024_swin_style_train_lines_tabs_loss_scale_mem_vmamba273.txt (tabs as stored)
VMAMBA = ("[2024-07-27 03:36:12 vssm1_high_tiny_gradacc2] (main.py 295): INFO Train: [30/300][20/2859]\teta "
          "1:28:53 lr 0.000872\t wd 0.0500\ttime 0.4177 (1.8785)\tdata time 0.0007 (1.4406)\tmodel "
          "time 0.0000 "
          "(0.0000)\tloss 1.9455 (1.9647)\tgrad_norm 2.2848 (2.1245)\tloss_scale 32768.0000 "
          "(32768.0000)\tmem 16138MB")
# libai_2024_npu_events_eta_iteration_total_loss_throughput_libai551.txt
LIBAI = ("[09/10 10:40:56 lb.utils.events]:  eta: 21:00:38  iteration: 19/10000  consumed_samples: 80  "
         "total_loss: 9.895  time: 7.5187 s/iter  data_time: 0.0021 s/iter total_throughput: 0.53 samples/s "
         "lr: 1.50e-04")
# paddlenlp_2022_ernie_global_step_valid_step_loss_scaling_paddlenlp3867.txt
ERNIE = ("[2022-11-23 09:46:28,799] [    INFO] - global step 2000, loss: 8.075826, lm_loss: "
         "7.379850, sop_loss: "
         "0.695985, speed: 2.88 steps/s, ips: 92.20 seqs/s, learning rate: 5.00000e-06, "
         "loss_scaling: 131072.00, "
         "incr_count: 0.00, decr_count: 0.00")
ERNIE_VALID = ("[2022-11-23 09:46:31,176] [    INFO] - valid step 2000, batch: 10, loss: 7.448310, lm_loss: "
               "6.745527, sop_loss: 0.702782, ips: 135 seqs/s")


@pytest.mark.parametrize("line, want", [
    (INTERNLM, {"iteration": 36, "lm_loss": 5.459033012390137, "tokens_per_gpu_per_sec": 4233.73,
                "lr": 7.6e-06, "loss_scale": 65536.0, "grad_norm": 12.540833573326264}),
    # the loss before the counter: one record all the same
    (PADDLE, {"iteration": 20, "lm_loss": 2.00048828, "lr": 2.1e-06, "samples_per_sec": 6.081193361471736}),
    # a time beside a data time is in seconds, whatever the separators; its running mean in brackets
    (VMAMBA, {"lr": 0.000872, "elapsed_ms": 417.7, "lm_loss": 1.9455, "grad_norm": 2.2848,
              "loss_scale": 32768.0}),
    (LIBAI, {"iteration": 19, "train_iters": 10000, "consumed_samples": 80, "lm_loss": 9.895,
             "elapsed_ms": 7518.7, "samples_per_sec": 0.53, "lr": 0.00015}),
    (ERNIE, {"iteration": 2000, "lm_loss": 7.37985, "lr": 5e-06, "loss_scale": 131072.0}),  # lm_loss wins
    # iterations per second, the step time's inverse: albert_tf2_2020_..._dlmodels45.txt and
    # mlx_lm_2024_..._mlxexamples724.txt
    ("Train step 1040 -- Loss: 11.174, MLM: 10.479, SOP: 0.695, MLM_acc: 0.000, SOP_acc: 0.521 -- It/s: 1.69",
     {"iteration": 1040, "lm_loss": 11.174, "elapsed_ms": 1000 / 1.69}),
    ("Iter 860: Train loss 0.413, Learning Rate 1.000e-06, It/sec 0.247, Tokens/sec 159.343, Trained Tokens "
     "473342, Peak mem 100.759 GB", {"iteration": 860, "lm_loss": 0.413, "elapsed_ms": 1000 / 0.247}),
])
def test_records_by_general_rules(line, want):
    got = generic.parse(clean_line(line).text)
    assert {k: v for k, v in got.items() if k in want} == pytest.approx(want)
    assert set(want) <= set(got)


def test_an_evaluation_counter_makes_no_record():
    assert generic.parse(clean_line(ERNIE_VALID).text) is None


def _rows(lines: list[str]) -> list[dict]:
    its = parse_lines(lines).to_dict()["iterations"]
    return [{k: v for k, v in r.items() if v is not None} for r in its]


# minillm_2023_deepspeed_ppo_global_iter_wrapped_overflow_lmops130.txt: a record the terminal wrapped
# inside a name (``stu`` / ``_lens``), several counters (the run's is ``global iter``)
MINILLM = [
    "train | data_epochs  0/10 | inner iter:   7/  8 | ppo epoch:  2/ 4 | global iter:     13/  "
    "5000| tot_loss: "
    "2.3541 | rl_loss: -0.0407 | pt_loss: 2.3948 | pg_loss: -0.0428 | reg_loss: 0.0021 | reward: 0.0000 | "
    "rev_kl: 0.0000 | stu",
    "_lens: 97.3750 | mixed_lens: 116.1250 | lr: 2.5000e-07 | scale: 128.00 | time: 1.874 | step time: 0.000",
]


def test_a_record_wrapped_inside_a_field_is_one_record():
    assert _rows(MINILLM) == [{"iteration": 13, "train_iters": 5000, "lm_loss": 2.3541, "lr": 2.5e-07,
                               "loss_scale": 128.0}]


# deepspeed_2023_step_timer_custom_loss_global_step_lines_chatglmfinetuning12.txt: DeepSpeed's step
# and timer lines and the script's own loss line of the same step
CHATGLM = [
    "[2023-04-05 11:22:36,058] [INFO] [logging.py:75:log_dist] [Rank 0] step=170, skipped=21, lr=[1e-05], "
    "mom=[[0.9, 0.95]]",
    "[2023-04-05 11:22:36,071] [INFO] [timer.py:198:stop] epoch=0/micro_step=170/global_step=170, "
    "RunningAvgSamplesPerSec=0.9416068021879145, CurrSamplesPerSec=0.9075004102820523, MemAllocated=15.62GB, "
    "MaxMemAllocated=24.74GB",
    "loss:2.05859375, global_step:170",
]


def test_records_of_one_step_from_two_readers_merge():
    rows = _rows(CHATGLM)
    assert len(rows) == 1
    assert rows[0]["iteration"] == 170 and rows[0]["lm_loss"] == 2.05859375 and rows[0]["lr"] == 1e-05


# sat_2023_deepspeed_step_timer_rank0_iteration_speed_visualglm267.txt: SwissArmyTransformer's record
# does not end in Megatron's "|"; the engine's next step and timer are records of their own
SAT = [
    "[2023-09-11 15:10:44,342] [INFO] [RANK 0]  iteration      100/     300 | elapsed time per "
    "iteration (ms): "
    "1080.9 | learning rate 5.000E-06 | total loss 5.623437E+00 | loss 5.623437E+00 | loss scale "
    "32768.0 |speed "
    "222.03 samples/(min*GPU)",
    "[2023-09-11 15:10:44,343] [INFO] [RANK 0] time (ms) | forward: 407.80 | backward: 669.69 | "
    "allreduce: 0.00 "
    "| optimizer: 2.69 | batch generator: 1.32 | data loader: 0.12",
    "[2023-09-11 15:10:55,110] [INFO] [logging.py:96:log_dist] [Rank 0] step=110, skipped=2, "
    "lr=[7.667891533457719e-05], mom=[[0.9, 0.95]]",
]


def test_a_step_line_never_continues_another_record():
    assert [r["iteration"] for r in _rows(SAT)] == [100, 110]


@pytest.mark.parametrize("line, want", [
    # MMEngine's logging tutorial (https://mmengine.readthedocs.io/en/v0.7.0/advanced_tutorials/logging.html)
    ("08/21 02:58:41 - mmengine - INFO - Epoch(train) [1][10/25]  lr: 1.0000e-02  eta: 0:00:00  "
     "time: 0.0019  "
     "data_time: 0.0004  loss1: 0.8381  loss2: 0.9007  loss: 1.7388",
     {"iteration": 10, "lr": 0.01, "elapsed_ms": 1.9, "lm_loss": 1.7388}),
    # zhedongzheng/tensorflow-nlp, nlp-models/tensorflow/scaled_dot_attn_text_clf_imdb_test.md
    ("Epoch 1/2 | Step 50/781 | train_loss: 0.6205 | train_acc: 0.7500 | lr: 0.0047",
     {"iteration": 50, "lm_loss": 0.6205, "lr": 0.0047}),
    # The Annotated Transformer (harvardnlp, 2018): its run_epoch's line, a rate's name in words
    ("Epoch Step: 1 Loss: 3.023465 Tokens per Sec: 403.074173",
     {"iteration": 1, "lm_loss": 3.023465, "tokens_per_sec": 403.074173}),
    # aakashvardhan/s21-gpt2, log.md
    ("step 1, loss: 10.719036102294922", {"iteration": 1, "lm_loss": 10.719036102294922}),
    # fairseq2's train metrics line with its GradScaler's scale, as a user's public notes quote it
    ("Train Metrics (step 50) - Loss: 540.044 | grad_scale: 0.0625",
     {"iteration": 50, "lm_loss": 540.044, "loss_scale": 0.0625}),
    # CLU's LoggingWriter ([step] name=value, ...), from a public run log of a Flax example
    ("INFO 2023-08-21T19:31:12.653463819Z [100] learning_rate=5.333333683665842e-05, "
     "loss=2.2819416522979736, "
     "loss_std=0.10880677402019501, train_accuracy=0.19312499463558197",
     {"iteration": 100, "lr": 5.333333683665842e-05, "lm_loss": 2.2819416522979736}),
])
def test_loops_no_corpus_log_holds(line, want):
    got = generic.parse(clean_line(line).text)
    assert {k: v for k, v in got.items() if k in want} == pytest.approx(want)
    assert set(want) <= set(got)


# zhedongzheng/tensorflow-nlp, nlp-models/tensorflow/scaled_dot_attn_text_clf_imdb_test.md: the step
# counter starts again with each epoch (an epoch's summary line between, no step of its own)
TF_NLP = [
    "Epoch 1/2 | Step 750/781 | train_loss: 0.3282 | train_acc: 0.8125 | lr: 0.0023",
    "Epoch 1/2 | train_loss: 0.0701 | train_acc: 1.0000 | test_loss: 0.2711 | test_acc: 0.8882 | lr: 0.0022",
    "Epoch 2/2 | Step 0/781 | train_loss: 0.2388 | train_acc: 0.9375 | lr: 0.0022",
    "Epoch 2/2 | Step 50/781 | train_loss: 0.0952 | train_acc: 0.9688 | lr: 0.0021",
]


def test_steps_counted_within_epochs_are_the_runs_steps():
    rows = _rows(TF_NLP)
    assert [(r["iteration"], r["lm_loss"]) for r in rows] == [(750, 0.3282), (781, 0.2388), (831, 0.0952)]
    assert {r["train_iters"] for r in rows} == {1562}
