"""What a run leaves behind: flags mode, captured logs, TensorBoard scalars, profiler traces."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from engine_runs import PYTHON, REPO, ensure_data, losses, train

pytestmark = pytest.mark.engine


def test_megatron_flags_profile_tensorboard_and_captured_log(tmp_path):
    ensure_data()
    run_dir = tmp_path / "flags_run"
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(REPO / "code" / "pretrain_gpt.py"),
           "--tensor-model-parallel-size", "2", "--num-layers", "2", "--hidden-size", "64",
           "--num-attention-heads", "4", "--seq-length", "64", "--max-position-embeddings", "64",
           "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "6",
           "--lr-warmup-iters", "1", "--log-interval", "1", "--profile", "--run-dir", str(run_dir)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LABKIT_LOG_CAPTURED": "1"}
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    # The job script captures stdout itself: the engine must not write log.txt a second time.
    assert not (run_dir / "log.txt").exists()
    assert "tensor-model-parallel size: 2, pipeline-model-parallel size: 1" in out.stdout
    assert out.stdout.count("| lm loss: ") == 6
    cfg = json.loads((run_dir / "config.json").read_text())
    assert (cfg["tensor_model_parallel_size"], cfg["num_layers"], cfg["torch_profiler"]) == (2, 2, True)
    assert (run_dir / "exit_code").read_text().strip() == "0"

    trace = json.loads((run_dir / "profile" / "rank0.json").read_text())
    assert any("ProfilerStep" in e.get("name", "") for e in trace["traceEvents"])

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"lm-loss", "learning-rate", "iteration-time", "throughput", "mem-max-allocated",
            "batch-size"} <= tags
    steps = [e.step for e in acc.Scalars("lm-loss")]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_no_resume_keeps_old_checkpoints_aside(tmp_path):
    common = dict(train_iters=4, log_interval=2, lr_warmup_iters=1, num_layers=2)
    run_dir = train(tmp_path, "again", **common)
    first = losses(run_dir)
    train(tmp_path, "again", extra_args=["--no-resume"], **common)
    log = (run_dir / "log.txt").read_text()
    assert "--no-resume: moved the old checkpoints to" in log
    assert "resumed from" not in log
    assert list(tmp_path.joinpath("again").glob("checkpoints.old-*/iter_0000004"))
    assert losses(run_dir) == first  # same seed, same data, from scratch: the same curve


def test_bad_config_fails_before_training_with_exit_code(tmp_path):
    run_dir = tmp_path / "bad"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(
        {"name": "bad", "gpus_per_node": 2, "tensor_model_parallel_size": 3}))
    out = subprocess.run([PYTHON, str(REPO / "code" / "pretrain_gpt.py"), "--config",
                          str(run_dir / "config.json")], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 2
    assert "TP x PP = 3 x 1 = 3 does not divide world size 2" in out.stderr
    assert (run_dir / "exit_code").read_text().strip() == "2"


def test_unreadable_config_under_torchrun_is_said_once_and_last(tmp_path):
    """torchrun ends with its failure table: the reason is its last entry, said once."""
    torchrun = Path(PYTHON).parent / "torchrun"
    out = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2",
                          str(REPO / "code" / "pretrain_gpt.py"), "--config",
                          str(tmp_path / "missing" / "config.json")], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    text = out.stdout + out.stderr
    assert out.returncode != 0
    said = "cannot read config file"
    assert text.count(said) == 1, text[-3000:]
    last = [ln for ln in text.splitlines() if ln.strip()][-4:]
    assert any(said in ln for ln in last), last
