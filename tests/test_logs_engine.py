"""Parse what a real run of code/pretrain_gpt.py wrote: log, TensorBoard, profiler trace, OOM.

Slow (real torchrun + megatron-core on CPU): marked ``engine``, kept to two short runs.
"""

from __future__ import annotations

import math

import pytest

from labkit.logs import diagnose, parse_run
from labkit.measured.profiling import profile_breakdown
from labkit.measured.tb import read_scalars

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def tp2_run(tmp_path_factory):
    from tests.engine_runs import train

    return train(tmp_path_factory.mktemp("logs_engine"), "tp2", tensor_model_parallel_size=2,
                 train_iters=6, log_interval=1, eval_interval=3, eval_iters=1,
                 torch_profiler=True, torch_profiler_ranks=(0, 1))


def test_real_log_parses_into_the_contract(tp2_run):
    p = parse_run(tp2_run)
    assert p.layout == {"world_size": 2, "tp": 2, "pp": 1, "dp": 1, "cp": 1}
    its = p.iterations
    assert its["iteration"].tolist() == [1, 2, 3, 4, 5, 6]
    assert (its["train_iters"] == 6).all() and its["lm_loss"].map(math.isfinite).all()
    assert (its["elapsed_ms"] > 0).all() and its["timestamp"].notna().all()
    assert (its["tokens_per_sec"] == its["samples_per_sec"] * 64).all()  # seq_length 64
    assert (its["tp"] == 2).all() and (its["name"] == "tp2").all()
    assert set(p.memory["rank"]) <= {0, 1} and len(p.memory) >= 1
    assert p.validation["iteration"].tolist()[:2] == [3, 6]
    assert not p.params.empty
    assert p.failure_records == [] and diagnose(tp2_run / "log.txt", exit_code=0) == []


def test_real_tensorboard_matches_the_log(tp2_run):
    tb = read_scalars(tp2_run / "tb")
    assert {"lm-loss", "learning-rate", "iteration-time"} <= set(tb["tag"])
    loss = tb[tb["tag"] == "lm-loss"].set_index("step")["value"]
    log = parse_run(tp2_run).iterations.set_index("iteration")["lm_loss"]
    assert sorted(loss.index) == sorted(log.index)
    for step, value in loss.items():
        assert value == pytest.approx(log[step], rel=1e-5)  # the log prints 7 significant digits


def test_real_profiler_trace_breakdown(tp2_run):
    df = profile_breakdown(tp2_run / "profile")
    assert df["rank"].tolist() == [0, 1] and set(df["device"]) == {"cpu"}
    assert (df["communication_ms"] > 0).all() and (df["compute_ms"] > 0).all()  # TP all-reduces
    parts = df[["compute_ms", "communication_ms", "memcpy_ms", "idle_ms"]].sum(axis=1)
    assert parts.tolist() == pytest.approx(df["total_ms"].tolist())


def test_real_cpu_oom_is_diagnosed_with_its_rank(cpu_oom_run):
    run_dir = cpu_oom_run
    code = int((run_dir / "exit_code").read_text())
    failures = diagnose(run_dir / "log.txt", exit_code=code)
    assert failures and failures[0].kind == "host_oom", failures
    assert failures[0].rank in (0, 1) and "memory_limit_gb" in failures[0].hint
    assert parse_run(run_dir).iterations.empty
