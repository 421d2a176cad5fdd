"""The engine's log lines are Megatron-LM's format, character for character (pure, fast)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "code"))

import engine_log as L  # noqa: E402


def test_world_size_and_parameter_lines():
    assert L.world_size_line(4, 1, 2, 2) == (
        "using world size: 4, data-parallel size: 1, context-parallel size: 1, "
        "tensor-model-parallel size: 2, pipeline-model-parallel size: 2")
    assert L.params_line(0, 1, 123456) == (
        " > number of parameters on (tensor, pipeline) model parallel rank (0, 1): 123456")


def test_iteration_line_matches_megatron_format():
    line = L.iteration_line(iteration=5, train_iters=30, consumed=40, elapsed_ms=812.34,
                            tflops=0.04, lr=9e-4, gbs=8, loss=7.123456, loss_scale=1.0,
                            grad_norm=1.2341, skipped=0, nan=0)
    stamp = re.match(r" \[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\]", line).group(1)
    assert line == (
        f" [{stamp}] iteration        5/      30 | consumed samples:           40 | "
        "elapsed time per iteration (ms): 812.3 | throughput per GPU (TFLOP/s/GPU): 0.0 | "
        "learning rate: 9.000000E-04 | global batch size:     8 | lm loss: 7.123456E+00 | "
        "loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | "
        "number of nan iterations:   0 |")


def test_validation_and_memory_lines():
    rule, body, rule2 = L.validation_lines(10, 6.5)
    assert body.startswith(" validation loss at iteration 10 | lm loss value: 6.500000E+00 | "
                           "lm loss PPL: 6.6")
    assert rule == rule2 and set(rule) == {"-"}
    line = L.MemoryMeter(on_cuda=False).line(rank=3, iteration=5)
    assert re.fullmatch(r"\[Rank 3\] \(after 5 iterations\) memory \(MB\) \| allocated: [\d.]+ \| "
                        r"max allocated: [\d.]+ \| reserved: [\d.]+ \| max reserved: [\d.]+", line)


def test_flops_formula_is_the_planners_or_korthikanti():
    from labkit.config import RunConfig

    cfg = RunConfig.from_preset("tiny")
    b, s, n, h, v = 8, 128, 4, 128, 4096
    assert L.model_flops_per_iteration(cfg) == 72.0 * b * s * n * h * h * (
        1 + s / (6 * h) + v / (12 * n * h))
