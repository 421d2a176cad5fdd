"""World sizes stated by a program's own count of its processes, and logging events that name their
metric by a key (MLPerf's ``:::MLLOG``). Every line is copied from a real log (source beside it);
the expected values were read from the line by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.logs import parse_lines

# (line, world size stated)
STATEMENTS = [
    # fairseq 0.9 (tests/fixtures/logs/heldout4c/, fairseq issue 1967)
    ("2020-04-05 18:38:41 | INFO | fairseq_cli.train | training on 1 GPUs", 1),
    # timm's train.py (heldout4c/, T2T-ViT issue 19)
    ("Training in distributed mode with multiple processes, 1 GPU per process. Process 0, total 8.", 8),
    # ColBERT's run settings (heldout4f/, bclavie's committed nohup log)
    ("nranks = 2 \t num_gpus = 2 \t device=1", 2),
    # llm.c's parameter table (heldout4f/, hectorfcardenas' Slurm output)
    ("| num_processes         | 1                                                  |", 1),
    # MLPerf HPC's OpenFold (heldout4d/, mlcommons/hpc_results_v3.0, NVIDIA eos_n260)
    (':::MLLOG {"namespace": "", "time_ms": 1695867236858, "event_type": "POINT_IN_TIME", "key": '
     '"number_of_ranks", "value": 2080, "metadata": {"file": "/workspace/openfold/train.py", "lineno": 816}}',
     2080),
]


@pytest.mark.parametrize(("line", "world"), STATEMENTS)
def test_a_programs_count_of_its_processes_is_the_world_size(line: str, world: int) -> None:
    assert parse_lines([line]).layout["world_size"] == world


def test_a_communicators_size_is_no_world_size() -> None:
    # NCCL 2.11.4 (tests/fixtures/logs/real/bert_2021_mlperf_bind_pyt_nccl_2.11.4_..._dell.txt, line 310):
    # one communicator's ranks (a TP group's may be fewer than the job's), printed without a separator
    line = ("node071:58333:58583 [0] NCCL INFO comm 0x7ffd14008fb0 rank 0 nranks 8 cudaDev 0 "
            "busId 1b000 - Init COMPLETE")
    assert parse_lines([line]).layout["world_size"] is None
    # NCCL 2.21.5's collective trace (tests/fixtures/logs/heldout4d/, the mycroft harness log, line 16)
    trace = ("<HOST>:<PID>:<TID> [0] NCCL INFO AllReduce: opCount 0 sendbuff <PTR_2> recvbuff <PTR_3> "
             "count 4 datatype 7 op 0 root 0 comm <PTR_0> [nranks=2] stream <PTR_4>")
    assert parse_lines([trace]).layout["world_size"] is None


# NeMo's MLPerf Llama 2 70B LoRA (tests/fixtures/logs/heldout4d/, mlcommons/training_results_v5.1,
# Krai's result_1.txt, lines 763-765 and a tracked_stats event), behind srun's label
MLLOG = [
    ' 0: :::MLLOG {"namespace": "", "time_ms": 1758418662236, "event_type": "POINT_IN_TIME", "key": '
    '"train_loss", "value": 2.086329460144043, "metadata": {"file": "/workspace/ft-llm/custom_callbacks.py",'
    ' "lineno": 223, "samples_count": 80, "lr": 0.0004998463440980931}}',
    ' 0: :::MLLOG {"namespace": "", "time_ms": 1758418678775, "event_type": "POINT_IN_TIME", "key": '
    '"train_loss", "value": 1.4272558689117432, "metadata": {"file": "/workspace/ft-llm/custom_callbacks.py",'
    ' "lineno": 223, "samples_count": 160, "lr": 0.0004993855652734615}}',
    ' 0: :::MLLOG {"namespace": "", "time_ms": 1758418973475, "event_type": "POINT_IN_TIME", "key": '
    '"tracked_stats", "value": {"throughput": 4.804002827195647}, "metadata": {"file": '
    '"/workspace/ft-llm/custom_callbacks.py", "lineno": 287, "step": 1536}}',
]


def test_mllog_train_loss_events_are_the_steps_in_order() -> None:
    its = parse_lines(MLLOG).iterations
    assert its["iteration"].tolist() == [1, 2]  # no counter printed: the events in order
    assert its["lm_loss"].tolist() == [2.086329460144043, 1.4272558689117432]
    assert its["lr"].tolist() == [0.0004998463440980931, 0.0004993855652734615]


def test_an_event_whose_value_is_an_object_is_no_step() -> None:
    assert parse_lines(MLLOG[2:]).iterations.empty  # a block's averages (tracked_stats)


def test_a_log_of_mllog_events_alone_is_a_log() -> None:
    # MLPerf Training v1.0, Google's JAX ResNet (heldout4d/, mlcommons/training_results_v1.0,
    # tpu-v4-256-JAX-Distributed-Shampoo result_0.txt): events behind a glog prefix, no step record
    line = (Path(__file__).parent / "fixtures" / "logs" / "heldout4d"
            / "jax_2021_mlperf_resnet_tpu_v4_256_shampoo_mllog_only_google.txt").read_text().splitlines()[1]
    p = parse_lines([line])
    assert p.tools and p.iterations.empty
