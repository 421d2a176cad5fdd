"""DeepSpeed launcher / runner lines and Hugging Face Trainer dicts (labkit.logs.deepspeed, hf).

The real logs these formats come from are checked field by field in test_logs_real.py; here:
the numbering rules one at a time, and every scan path agreeing on those logs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.logs import parse_lines, parse_log
from labkit.logs.hf import parse_trainer_dict

REAL = Path(__file__).parent / "fixtures" / "logs" / "real"
LAUNCHER_AND_TRAINER = sorted(p for p in REAL.glob("*.txt")
                              if p.name.startswith(("hf_trainer_", "deepspeed_")))
MISTRAL = REAL / "hf_trainer_deepspeed_0.4_pdsh_mistral_guide.txt"


@pytest.mark.parametrize("log", LAUNCHER_AND_TRAINER, ids=lambda p: p.stem)
def test_every_scan_path_reads_the_same(log, monkeypatch):
    fast = parse_log(log).to_dict()
    monkeypatch.setenv("LABKIT_NO_FASTSCAN", "1")
    assert parse_log(log).to_dict() == fast  # line by line
    # the file's lines end at "\n" only (bytes.splitlines would split at a bar's carriage returns too)
    assert parse_lines(log.read_bytes().split(b"\n")).to_dict() == fast


def test_old_timer_counts_micro_steps_not_iterations():
    lines = MISTRAL.read_text().splitlines()
    timers = [ln for ln in lines if "SamplesPerSec=" in ln]
    assert len(timers) == 40
    assert parse_lines(timers).iterations.empty  # 0/1200 .. 0/1590: no step= line says which step
    steps = parse_log(MISTRAL).iterations
    assert list(steps["iteration"]) == [150, 160, 170, 180, 190]
    assert steps["samples_per_sec"].isna().all()


def test_a_trainer_dict_takes_the_step_its_own_process_printed():
    lines = MISTRAL.read_text().splitlines()[:4]  # machine2's dict, machine1's step, timer, dict
    only_machine2 = [lines[0]] + lines[1:3]
    it = parse_lines(only_machine2).iterations
    assert list(it["iteration"]) == [150] and it["lm_loss"].isna().all()
    assert parse_lines(lines).iterations["lm_loss"].tolist() == [6.591]


def test_dicts_without_step_counters_are_numbered_in_order_per_process():
    log = (REAL / "hf_trainer_loss_dicts_line_numbered_accelerate1837.txt").read_text().splitlines()
    two_nodes = [f"node1: {ln.lstrip(' 0123456789')}" for ln in log]
    two_nodes += [f"node2: {ln.lstrip(' 0123456789')}" for ln in log]
    it = parse_lines(two_nodes).iterations
    assert list(it["iteration"]) == [1, 2, 3, 4]
    assert list(it["lm_loss"]) == [1.306, 1.3887, 1.4621, 1.3461]


def test_progress_bars_and_other_dicts_are_no_iterations():
    lines = ["  3%|▎         | 37/1200 [01:02<32:10,  1.66s/it]",
             "{'eval_loss': 2.5, 'eval_runtime': 10.1, 'eval_samples_per_second': 99.0, 'epoch': 1.0}",
             "{'train_runtime': 1234.5, 'train_samples_per_second': 8.1, 'train_loss': 2.2, 'epoch': 3.0}",
             "{'loss': 2."]  # cut inside the number
    assert parse_lines(lines).iterations.empty


@pytest.mark.parametrize("line,want", [
    ("{'loss': 2.1234, 'grad_norm': 0.98, 'learning_rate': 5e-05, 'epoch': 0.01}",
     {"lm_loss": 2.1234, "grad_norm": 0.98, "lr": 5e-05, "epoch": 0.01}),
    ("{'loss': nan, 'learning_rate': 0, 'epoch': 0.0}", {"lm_loss": None, "lr": 0.0, "epoch": 0.0}),
    ('{"loss": 1.5, "learning_rate": 1e-4, "step": 40}', {"lm_loss": 1.5, "lr": 1e-4, "iteration": 40}),
    ("{'loss': '0.7712', 'grad_norm': '1.093', 'learning_rate': '1.998e-05', 'epoch': '0.02'}",
     {"lm_loss": 0.7712, "grad_norm": 1.093, "lr": 1.998e-05, "epoch": 0.02}),
    ("{'eval_loss': 2.5, 'epoch': 1.0}", None),
])
def test_trainer_dict_fields(line, want):
    assert parse_trainer_dict(line) == want


def test_launcher_world_behind_pdsh_host_prefixes():
    lines = ["node1: [2024-05-01 10:00:00,000] [INFO] [launch.py:146:main] WORLD INFO DICT: "
             "{'node1': [0, 1], 'node2': [0, 1], 'node3': [0]}",
             "node1: [2024-05-01 10:00:00,000] [INFO] [launch.py:152:main] nnodes=3, num_local_procs=2, "
             "node_rank=0"]
    assert parse_lines(lines).layout["world_size"] == 5  # mixed slot counts: 2 + 2 + 1
    assert parse_lines(lines[1:]).layout["world_size"] is None  # this node's count says no total


def test_runner_world_info_that_is_not_base64_json_is_ignored():
    line = "[INFO] [runner.py:508:main] cmd = pdsh -S -f 1024 -w a1,a2 python -m deepspeed.launcher.launch "
    for bad in ("--world_info=%%%%", "--world_info=bm90IGpzb24=", "--world_info=WzEsIDJd"):
        p = parse_lines([line + bad])
        assert p.layout["world_size"] is None and p.parse_errors == 0
