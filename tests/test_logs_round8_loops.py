"""Step records of the training loops the seen held-out sets left unread (tests/fixtures/logs/
heldout4f, 4m, 4n, 4o; their READMEs name each source). Each line is copied from its log; the
expected values were read from the lines by hand."""

from __future__ import annotations

from labkit.logs import parse_lines


def test_a_trainer_dict_names_its_step_as_a_quoted_fraction() -> None:
    # ms-swift: single quotes behind a container's stamp (heldout4m/, modelscope/ms-swift issue 4291),
    # double quotes (heldout4n/, issue 4146)
    lines = ["2025-05-21T03:50:19.029644300Z {'loss': 0.42409496, 'token_acc': 0.85283019, 'grad_norm': "
             "3.6537035, 'learning_rate': 9.99e-06, 'memory(GiB)': 76.72, 'train_speed(iter/s)': 0.193983, "
             "'epoch': 0.2, 'global_step/max_steps': '295/4491', 'percentage': '6.57%', 'elapsed_time': "
             "'25m 15s', 'remaining_time': '5h 59m 14s'}",
             "2025-05-21T03:50:42.015709928Z {'loss': 0.42228584, 'token_acc': 0.87710843, 'grad_norm': "
             "5.19625193, 'learning_rate': 9.99e-06, 'memory(GiB)': 76.72, 'train_speed(iter/s)': 0.194334, "
             "'epoch': 0.2, 'global_step/max_steps': '300/4491', 'percentage': '6.68%', 'elapsed_time': "
             "'25m 38s', 'remaining_time': '5h 58m 11s'}"]
    its = parse_lines(lines).iterations
    assert its["iteration"].tolist() == [295, 300] and its["train_iters"].tolist() == [4491, 4491]
    assert its["lm_loss"].tolist() == [0.42409496, 0.42228584]
    line = ('{"loss": 1.93790436, "grad_norm": 8.50966809, "learning_rate": 9.81e-06, "memory(GiB)": 15.2, '
            '"train_speed(iter/s)": 0.026265, "rewards/chosen": 5.53808594, "rewards/rejected": -1.36999512, '
            '"rewards/accuracies": 0.75, "rewards/margins": 6.91113281, "logps/chosen": -404.0, '
            '"logps/rejected": -543.5, "logits/chosen": -0.4083252, "logits/rejected": 0.08028412, '
            '"nll_loss": 1.74902344, "epoch": 0.26666667, "global_step/max_steps": "5/36", "percentage": '
            '"13.89%", "elapsed_time": "3m 2s", "remaining_time": "18m 53s"}')
    it = parse_lines([line]).iterations.iloc[0]
    assert (it["iteration"], it["train_iters"], it["lm_loss"]) == (5, 36, 1.93790436)


def test_copies_of_a_step_printed_one_after_another_are_one_record_the_first_copy() -> None:
    # a PyTorchJob's two pods print each step, each its own loss (heldout4m/, kubeflow/trainer issue 1532)
    lines = ["Train Epoch: 1 [0/15018 (0%)]\tloss=7.0561",
             "Train Epoch: 1 [0/15018 (0%)]\tloss=7.1878",
             "Train Epoch: 1 [1280/15018 (33%)]\tloss=3.3173",
             "Train Epoch: 1 [1280/15018 (33%)]\tloss=3.3822",
             "Train Epoch: 1 [2560/15018 (67%)]\tloss=3.3661",
             "Train Epoch: 1 [2560/15018 (67%)]\tloss=3.2486"]
    assert parse_lines(lines).iterations["lm_loss"].tolist() == [7.0561, 3.3173, 3.3661]


def test_a_counter_alone_then_its_loss_on_its_process_next_line() -> None:
    # a user's Horovod script under mpirun --tag-output, two ranks interleaved (heldout4o/,
    # horovod/horovod issue 1421); the log ends in batch 21's counter
    lines = ["[1,1]<stdout>:Epoch 0/100, Batch 16/29316",
             "[1,0]<stdout>:Total loss is  236.61468505859375 ETA is  7:57:00.494483",
             "[1,1]<stdout>:Total loss is  236.6444549560547 ETA is  7:57:05.048570",
             "[1,1]<stdout>:Epoch 0/100, Batch 17/29316",
             "[1,0]<stdout>:Epoch 0/100, Batch 17/29316",
             "[1,1]<stdout>:Total loss is  30.246166229248047 ETA is  7:37:42.398659",
             "[1,0]<stdout>:Total loss is  29.862733840942383 ETA is  7:37:43.721964",
             "[1,0]<stdout>:Epoch 0/100, Batch 18/29316",
             "[1,1]<stdout>:Epoch 0/100, Batch 18/29316",
             "[1,0]<stdout>:Total loss is  53.665191650390625 ETA is  7:19:39.170223",
             "[1,1]<stdout>:Total loss is  48.74404525756836 ETA is  7:19:45.835702",
             "[1,0]<stdout>:Epoch 0/100, Batch 19/29316",
             "[1,1]<stdout>:Epoch 0/100, Batch 19/29316"]
    its = parse_lines(lines).iterations
    assert its["iteration"].tolist() == [16, 17, 18, 19]
    assert its["lm_loss"].tolist()[:3] == [236.6444549560547, 29.862733840942383, 48.74404525756836]
    # rank 1's loss line follows its own counter; rank 0's, between them, is another process's
    assert parse_lines(lines[:2]).iterations.empty


def test_a_counter_then_a_throughput_per_gpu_is_a_step() -> None:
    # Horovod's pytorch_synthetic_benchmark.py under horovodrun (heldout4m/, horovod/horovod issue 2686)
    lines = ["[0]<stdout>:Running benchmark...",
             "[0]<stdout>:Iter #0: 126.5 img/sec per GPU",
             "[0]<stdout>:Iter #1: 128.6 img/sec per GPU",
             "[0]<stdout>:Iter #2: 125.1 img/sec per GPU",
             "[0]<stdout>:Img/sec per GPU: 124.7 +-3.1",
             "[0]<stdout>:Total img/sec on 1 GPU(s): 124.7 +-3.1"]
    p = parse_lines(lines)
    assert p.iterations["iteration"].tolist() == [0, 1, 2]
    assert p.iterations["samples_per_gpu_per_sec"].tolist() == [126.5, 128.6, 125.1]
    assert p.iterations["samples_per_sec"].isna().all()  # per GPU, not the job's


def test_a_step_and_one_value_behind_a_stamp_are_a_step() -> None:
    # ColBERT's print_message(batch_idx, avg_loss) (heldout4f/, bclavie/ColBERT train.out): the value
    # is its running mean, no column; the score lines around it are no steps
    lines = ["\t\t\t\t 0.5405381917953491 5.7164106369018555",
             "#>>>    5.09 5.08 \t\t|\t\t 0.009999999999999787",
             "[Mar 29, 16:21:59] 0 6.256948947906494",
             "True",
             "\t\t\t\t 0.5518649220466614 5.935708999633789",
             "#>>>    5.16 5.35 \t\t|\t\t -0.1899999999999995",
             "[Mar 29, 16:22:00] 1 6.257179573059082",
             "True"]
    its = parse_lines(lines).iterations
    assert its["iteration"].tolist() == [0, 1] and its["lm_loss"].isna().all()
