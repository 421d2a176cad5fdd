"""Round eight's rules, each on real lines of the held-out sets 4p, 4q and 4s (their sources named
at each test; the whole logs are in tests/fixtures/logs/heldout4p/, 4q/, 4s/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.logs import parse_lines

HELD = Path(__file__).parent / "fixtures" / "logs"


def _lines(folder: str, stem: str) -> list[bytes]:
    (path,) = (HELD / folder).glob(f"*{stem}.txt")
    return path.read_bytes().split(b"\n")


def test_a_label_of_no_megatron_table_is_read_by_the_shared_names():
    """NeMo 2's ``TFLOPS_per_GPU`` and its memory in bytes, on a Lightning iteration line
    (https://github.com/NVIDIA-NeMo/Speech/issues/14850)."""
    p = parse_lines(_lines("heldout4p", "nemo14850"))
    assert p.iterations["tflops_per_gpu"].tolist() == [48.58, 85.8, 85.8, 85.8]
    # ``max_memory_allocated: 53930270720``: bytes (a petabyte, were it MiB)
    assert p.memory["max_allocated_mb"].tolist() == pytest.approx([53930270720 / 2**20] * 4)


def test_a_printed_rate_wins_over_the_derived_one():
    """A fork's ``iteration time: 270.125 s samples/sec: 3.8`` part (okoge-kaz/Megatron-LM,
    scripts/benchmarks/pytorch_profiler/README.md at b44abfa)."""
    p = parse_lines(_lines("heldout4p", "okoge"))
    assert p.iterations["samples_per_sec"].tolist() == [3.8]


def test_a_bare_exception_name_after_the_code_that_raised_it_ends_a_cut_traceback():
    """``[rank2]:     raise EOFError`` then ``[rank2]: EOFError``
    (https://github.com/NVIDIA-NeMo/Megatron-Bridge/issues/926)."""
    lines = _lines("heldout4p", "bridge926")
    p = parse_lines(lines[:2])
    assert p.failures[["kind", "rank"]].values.tolist() == [["python_exception", 2]]
    assert parse_lines(lines[1:2]).failures.empty  # the name alone, with no code line: none


def test_a_deepspeed_timer_that_numbers_no_step_still_gives_its_memory():
    """trlx's bars with DeepSpeed 0.8's ``[timer.py:197:stop] 0/116, ... MemAllocated=8.62GB,
    MaxMemAllocated=12.21GB`` glued behind them (https://github.com/LAION-AI/Open-Assistant/issues/2140)."""
    p = parse_lines(_lines("heldout4s", "openassistant2140"))
    assert len(p.iterations) == 0
    assert p.memory["max_allocated_mb"].tolist() == pytest.approx([12.21 * 1024, 12.21 * 1024, 12.21 * 1024])


def test_a_header_of_counters_then_bulleted_fields_is_one_record():
    """Coqui's ``--> STEP: 0/406 -- GLOBAL_STEP: 0`` over ``| > loss_disc: 5.96543  (5.96543)``
    lines; the fields above it, with no header, are none (https://github.com/coqui-ai/TTS/issues/1477)."""
    p = parse_lines(_lines("heldout4q", "tts1477"))
    assert p.iterations["iteration"].tolist() == [0]
    assert p.iterations["lm_loss"].tolist() == [5.96543]  # the first loss under the header


def test_a_line_with_a_step_time_alone_is_a_step():
    """ColossalAI's benchmark: ``INFO: Step time: 22.885`` between rich's wrapped logger lines, no
    counter: steps in order, seconds (https://github.com/hpcaitech/ColossalAI/issues/4551)."""
    p = parse_lines(_lines("heldout4s", "colossalai4551"))
    assert p.iterations["iteration"].tolist() == [1, 2]
    assert p.iterations["elapsed_ms"].tolist() == [22885.0, 19714.0]
