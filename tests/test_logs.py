"""Log parsers across formats and versions (fixtures in tests/fixtures/logs, see its README)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from labkit.errors import LabkitError
from labkit.logs import clean_line, parse_lines, parse_log
from labkit.logs import parse as parse_mod
from labkit.logs.parse import ITER_COLUMNS

FIX = Path(__file__).parent / "fixtures" / "logs"
ENGINE_LINE = (" [2026-11-22 03:30:01] iteration        5/      30 | consumed samples:           40 | "
               "elapsed time per iteration (ms): 812.3 | throughput per GPU (TFLOP/s/GPU): 0.0 | "
               "learning rate: 9.000000E-04 | global batch size:     8 | lm loss: 7.123456E+00 | "
               "loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | "
               "number of nan iterations:   0 |")


def _it(df: pd.DataFrame, i: int) -> dict:
    return df.set_index("iteration").loc[i].to_dict()


# --- layouts of every Megatron-LM generation ---------------------------------------------------
@pytest.mark.parametrize("fixture,layout", [
    ("megatron_lm_v1_2020.txt", {"world_size": 8, "tp": 2, "pp": 1, "dp": 4, "cp": None}),
    ("megatron_lm_v2_2021.txt", {"world_size": 16, "tp": 4, "pp": 2, "dp": 2, "cp": None}),
    ("megatron_lm_core_r0.5_2024.txt", {"world_size": 64, "tp": 4, "pp": 2, "dp": 4, "cp": 2}),
    ("megatron_lm_core_r0.10_2025.txt", {"world_size": 32, "tp": 4, "pp": 4, "dp": 2, "cp": 1}),
    ("labkit_engine_2026.txt", {"world_size": 4, "tp": 2, "pp": 2, "dp": 1, "cp": 1}),
    ("megatron_deepspeed_2022.txt", {"world_size": 384, "tp": 4, "pp": 12, "dp": 8, "cp": None}),
    ("deepspeed_0.14_engine.txt", {"world_size": 8, "tp": None, "pp": None, "dp": None, "cp": None}),
    ("nccl_2.21_transports.txt", {"world_size": None, "tp": None, "pp": None, "dp": None, "cp": None}),
])
def test_layout(fixture, layout):
    assert parse_log(FIX / fixture).to_dict()["layout"] == layout


_SPAWNED = ("[2025-12-28 05:01:38,135] [INFO] [launch.py:272:main] process 649291 spawned with command: "
            "['/usr/bin/python', '-u', 'pretrain_gpt.py', '--local_rank=0', {flags}]")


@pytest.mark.parametrize("flags, want", [
    ("'--tensor-model-parallel-size', '2', '--pipeline-model-parallel-size', '4'", (2, 4, None)),
    ("'--tensor-model-parallel-size=8', '--context-parallel-size=2'", (8, None, 2)),
    ("'--model-parallel-size', '4'", (4, None, None)),  # Megatron v1, gpt-neox: tensor parallel
    ("'--encoder-tensor-model-parallel-size', '2', '--expert-model-parallel-size', '8'", (None, None, None)),
])
def test_tp_and_pp_from_flags_on_a_launcher_command_line(flags, want, tmp_path):
    """A log with no ``using world size`` line and no argument block states its layout in the
    flags a launcher (or a shell's ``set -x``, or a harness) echoes; the layout line wins."""
    for prefix in ("", "stdout: ", "3: + "):
        d = parse_lines([prefix + _SPAWNED.format(flags=flags), ENGINE_LINE]).to_dict()
        assert (d["layout"]["tp"], d["layout"]["pp"], d["layout"]["cp"]) == want, prefix
    nemo = parse_lines(["trainer.devices=8 model.tensor_model_parallel_size=2 "
                        "model.pipeline_model_parallel_size=1", ENGINE_LINE]).to_dict()
    assert (nemo["layout"]["tp"], nemo["layout"]["pp"]) == (2, 1)
    stated = parse_lines(["using world size: 8, data-parallel size: 4, tensor-model-parallel size: 1, "
                          "pipeline-model-parallel size: 2", _SPAWNED.format(flags=flags)]).to_dict()
    assert (stated["layout"]["tp"], stated["layout"]["pp"]) == (1, 2)
    log = tmp_path / "log.txt"
    log.write_text("stdout: " + _SPAWNED.format(flags=flags) + "\n" + ENGINE_LINE + "\n")
    d = parse_log(log).to_dict()
    assert (d["layout"]["tp"], d["layout"]["pp"], d["layout"]["cp"]) == want


def test_megatron_deepspeed_pipeline_and_deepspeed_config_world_size():
    """Megatron-DeepSpeed prints Megatron v1's layout line (model parallel = tensor parallel) and
    its pipeline in the argument block; DeepSpeed prints its world size in its config dump."""
    v1 = "using world size: 64 and model-parallel size: 4 "
    args = ["------------------------ arguments ------------------------",
            "  model_parallel_size ............. 4", "  pipe_parallel_size .............. 16",
            "-------------------- end of arguments ---------------------"]
    d = parse_lines([v1, *args, ENGINE_LINE]).to_dict()
    assert d["layout"] == {"world_size": 64, "tp": 4, "pp": 16, "dp": 1, "cp": None}
    d = parse_lines([v1, ENGINE_LINE]).to_dict()  # v1 alone: no pipeline
    assert d["layout"] == {"world_size": 64, "tp": 4, "pp": 1, "dp": 16, "cp": None}
    ds = ("[2021-05-25 06:30:55,345] [INFO] [config.py:752:print]   world_size ................... 32",
          "[2021-05-25 06:30:55,343] [INFO] [logging.py:60:log_dist] [Rank 0] step=0, skipped=0, lr=[5e-05], "
          "mom=[[0.9, 0.999]]")
    d = parse_lines(list(ds)).to_dict()
    assert d["layout"] == {"world_size": 32, "tp": None, "pp": None, "dp": None, "cp": None}


def test_engine_format_line():
    p = parse_lines([ENGINE_LINE])
    row = _it(p.iterations, 5)
    assert row["train_iters"] == 30 and row["elapsed_ms"] == 812.3 and row["lm_loss"] == 7.123456
    assert row["lr"] == 9e-4 and row["global_batch_size"] == 8 and row["consumed_samples"] == 40
    assert row["grad_norm"] == 1.234 and row["skipped"] == 0 and row["nan"] == 0
    assert row["tflops_per_gpu"] == 0.0
    assert row["samples_per_sec"] == pytest.approx(8 / 0.8123)
    assert row["timestamp"] == pd.Timestamp("2026-11-22 03:30:01")
    assert list(p.iterations.columns[: len(ITER_COLUMNS)]) == ITER_COLUMNS


def test_skipped_iteration_has_null_loss_not_zero():
    its = parse_log(FIX / "megatron_lm_v2_2021.txt").iterations
    first = _it(its, 1)
    assert first["skipped"] == 1 and math.isnan(first["lm_loss"]) and math.isnan(first["grad_norm"])
    assert _it(its, 2)["lm_loss"] == pytest.approx(11.0052)
    assert _it(its, 2)["params_norm"] == pytest.approx(262.112)
    assert _it(its, 2)["tokens_per_sec"] == pytest.approx(512 / 4.0121 * 2048)  # seq_length from args


def test_nine_digit_train_iters_and_cp_without_comma():
    p = parse_log(FIX / "megatron_lm_core_r0.5_2024.txt")
    assert list(p.iterations["train_iters"]) == [123456789, 123456789]
    assert list(p.iterations["tflops_per_gpu"]) == [187.3, 188.1]
    assert p.theoretical_memory == {"weight_and_optimizer_mb": 28122.65}
    assert p.params.iloc[0].to_dict() == {"parameters": 1613271040, "tensor_rank": 3, "pipeline_rank": 1}


def test_microsecond_timestamps_extra_losses_and_validation():
    p = parse_log(FIX / "megatron_lm_core_r0.10_2025.txt")
    row = _it(p.iterations, 200)
    assert row["timestamp"] == pd.Timestamp("2025-03-04 05:09:28.654321")
    assert row["load_balancing_loss"] == pytest.approx(1.008811)
    assert row["mtp_1_loss"] == pytest.approx(3.8112)
    assert len(p.iterations) == 2  # validation lines are not training records
    v = p.validation.to_dict("records")
    assert v[0] == {"split": "validation", "iteration": 200, "lm_loss": 3.498811, "lm_loss_ppl": 33.07801}
    assert v[1]["iteration"] is None or math.isnan(v[1]["iteration"])
    assert p.theoretical_memory["total_mb"] == 60590.02
    assert p.params.iloc[0]["expert_rank"] == 0


def test_megatron_v1_param_line_and_rankless_memory():
    p = parse_log(FIX / "megatron_lm_v1_2020.txt")
    assert list(p.params["parameters"]) == [178100224, 178100224]
    assert p.memory.iloc[0]["iteration"] == 100 and pd.isna(p.memory.iloc[0]["rank"])
    assert p.args["seq_length"] == "1024"
    assert list(p.iterations["tokens_per_sec"].isna()) == [True, True]  # no global batch size: null


def test_megatron_deepspeed_seconds_and_tflops():
    its = parse_log(FIX / "megatron_deepspeed_2022.txt").iterations
    row = _it(its, 100)
    assert row["elapsed_ms"] == pytest.approx(105220.0) and row["tflops_per_gpu"] == 145.23
    assert row["samples_per_sec"] == 1.216 and row["consumed_tokens"] == 26214400
    assert row["tokens_per_sec"] == pytest.approx(1.216 * 2048)


def test_gpt_neox_samples_first_and_flops_units():
    p = parse_log(FIX / "gpt_neox_2023.txt")
    row = _it(p.iterations, 20)
    assert row["samples_per_sec"] == 68.554 and row["lm_loss"] == pytest.approx(9.78123)
    assert row["tflops_per_gpu"] == pytest.approx(122.1)
    assert p.validation.iloc[0]["lm_loss"] == pytest.approx(9.512301)


@pytest.mark.parametrize("fixture", ["deepspeed_0.14_engine.txt", "deepspeed_0.3_engine.txt"])
def test_deepspeed_engine(fixture):
    p = parse_log(FIX / fixture)
    assert list(p.iterations["iteration"]) == [10, 20]
    assert p.iterations["lr"].notna().all() and p.iterations["samples_per_sec"].notna().all()
    if "0.14" in fixture:
        assert list(p.iterations["skipped"]) == [0, 1]
        assert p.memory.iloc[0]["max_allocated_mb"] == pytest.approx(9.5 * 1024)


# --- prefixes, escapes, encodings --------------------------------------------------------------
@pytest.mark.parametrize("wrapped,rank", [
    ("[default3]:" + ENGINE_LINE, 3),
    ("[rank3]:" + ENGINE_LINE, 3),
    ("3: " + ENGINE_LINE, 3),
    ("  3: " + ENGINE_LINE, 3),
    ("node012: " + ENGINE_LINE, None),
    ("[1,3]<stdout>:" + ENGINE_LINE, 3),
    ("1: [default3]:" + ENGINE_LINE, 3),
    ("\x1b[32m" + ENGINE_LINE + "\x1b[0m", None),
    ("[default3]:\x1b[1m" + ENGINE_LINE, 3),
    ("progress 10%\rprogress 90%\r" + ENGINE_LINE + "\r\n", None),
    (ENGINE_LINE.replace("|", "&#124;"), None),
])
def test_prefixes_and_escapes(wrapped, rank):
    line = clean_line(wrapped)
    assert line.rank == rank
    p = parse_lines([wrapped])
    assert _it(p.iterations, 5)["lm_loss"] == 7.123456


def test_crlf_invalid_utf8_and_hard_wrap(tmp_path):
    data = (b"using world size: 4, data-parallel size: 1, context-parallel size: 1, tensor-model-parallel "
            b"size: 2, pipeline-model-parallel size: 2\r\n")
    data += b"\xff\xfe garbage \xc3\x28 bytes\r\n"
    wrapped = ENGINE_LINE.replace(" 5/", " 6/")
    data += (wrapped[:80] + "\r\n" + wrapped[80:160] + "\r\n" + wrapped[160:] + "\r\n").encode()
    data += ENGINE_LINE.replace(" 5/", " 7/").encode() + b"\r\n"
    log = tmp_path / "log.txt"
    log.write_bytes(data)
    p = parse_log(log)
    assert p.layout["tp"] == 2
    assert list(p.iterations["iteration"]) == [6, 7]
    assert p.iterations["lm_loss"].tolist() == [7.123456, 7.123456]
    assert p.iterations["nan"].tolist() == [0, 0]


def test_interleaved_ranks_keep_their_own_wrapped_pieces():
    a, b = ENGINE_LINE, ENGINE_LINE.replace(" 5/", " 6/").replace("7.123456E+00", "6.5E+00")
    lines = ["[default0]:" + a[:100], "[default1]:" + b[:120], "[default0]:" + a[100:],
             "[default1]:" + b[120:]]
    its = parse_lines(lines).iterations
    assert its.set_index("iteration")["lm_loss"].to_dict() == {5: 7.123456, 6: 6.5}


# --- the JSON contract -------------------------------------------------------------------------
def test_json_contract_keys_and_nulls():
    d = parse_log(FIX / "megatron_lm_v1_2020.txt").to_dict()
    assert list(d) == ["layout", "iterations", "memory", "nccl", "failures", "findings"]
    assert list(d["layout"]) == ["world_size", "tp", "pp", "dp", "cp"]
    assert list(d["iterations"][0]) == ["iteration", "train_iters", "elapsed_ms", "lm_loss", "lr",
                                        "global_batch_size", "consumed_samples", "loss_scale", "grad_norm",
                                        "skipped", "nan", "tflops_per_gpu", "samples_per_sec",
                                        "tokens_per_sec", "tokens_per_gpu_per_sec", "mfu"]
    assert d["iterations"][0]["consumed_samples"] is None and d["iterations"][0]["tflops_per_gpu"] is None
    assert list(d["memory"][0]) == ["rank", "iteration", "allocated_mb", "max_allocated_mb", "reserved_mb",
                                    "max_reserved_mb"]
    assert d["nccl"] == {"version": None, "transports": None, "channels": [], "tests": []}
    assert d["failures"] == []
    json.dumps(d, allow_nan=False)


def test_cli_parse_json_is_the_document_only(tmp_path):
    out = subprocess.run([sys.executable, "-m", "labkit", "parse", str(FIX / "labkit_engine_2026.txt"),
                          "--json"], capture_output=True, text=True, check=True)
    d = json.loads(out.stdout)
    assert d["layout"]["tp"] == 2 and len(d["iterations"]) == 2
    assert d["failures"][0]["kind"] == "host_oom" and d["failures"][0]["rank"] == 3
    assert "memory_limit_gb" in d["failures"][0]["hint"]


def test_cli_parse_missing_file_is_a_clear_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "labkit", "parse", str(tmp_path / "nope.txt")],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "no such log file" in out.stderr and out.stdout == ""


def test_parse_run_and_load_runs_join_config(run_root):
    from labkit.config import RunConfig
    from labkit.logs import load_runs, parse_run
    from labkit.rundir import prepare_run_dir

    for tp, pp in ((2, 1), (1, 2)):
        cfg = RunConfig(name=f"tp{tp}pp{pp}", nodes=1, gpus_per_node=2, tensor_model_parallel_size=tp,
                        pipeline_model_parallel_size=pp, global_batch_size=8, micro_batch_size=2)
        d = prepare_run_dir(cfg)
        (d / "log.txt").write_text(ENGINE_LINE + "\n" + ENGINE_LINE.replace(" 5/", " 6/") + "\n")
    p = parse_run(run_root / "tp2pp1")
    row = p.iterations.iloc[0]
    assert row["tp"] == 2 and row["pp"] == 1 and row["dp"] == 1 and row["name"] == "tp2pp1"
    assert row["tokens_per_sec"] == pytest.approx(8 / 0.8123 * 128)  # seq_length from config.json
    df = load_runs([run_root / "tp2pp1", run_root / "tp1pp2"])
    assert df.groupby(["tp", "pp"]).size().to_dict() == {(1, 2): 2, (2, 1): 2}
    assert len(load_runs(run_root)) == 4  # a run root expands to its runs


ALL_FIXTURES = sorted(FIX.glob("*.txt")) + sorted((FIX / "real").glob("*.txt"))


@pytest.mark.parametrize("fixture", ALL_FIXTURES, ids=[p.name for p in ALL_FIXTURES])
def test_fast_and_line_by_line_paths_agree(fixture, monkeypatch):
    """The fast path (fastscan.py), the line-by-line one and lines in memory: identical."""
    from labkit.logs import fastscan

    fast = parse_log(fixture).to_dict()
    monkeypatch.setattr(fastscan, "CHUNK", 256)  # chunk boundaries everywhere, long lines grow it
    monkeypatch.setattr(parse_mod, "_CHUNK_ROWS", 1)
    small = parse_log(fixture).to_dict()
    monkeypatch.setenv("LABKIT_NO_FASTSCAN", "1")
    slow = parse_log(fixture).to_dict()
    # split as a file is read (at b"\n" only): splitlines() would also split at a lone \r, which
    # tqdm bars leave mid-line, and number every line after it differently from grep -n
    lines = parse_lines(fixture.read_bytes().split(b"\n")).to_dict()
    assert fast == small == slow == lines


def test_fast_path_agrees_on_a_long_mixed_log(tmp_path, monkeypatch):
    """Thousands of lines: common-format iterations between every other kind of line, in chunks."""
    import random

    from labkit.logs import fastscan

    rng = random.Random(7)
    others = [ln for f in ALL_FIXTURES for ln in f.read_bytes().splitlines()]
    out = []
    for i in range(1, 3000):
        out.append(ENGINE_LINE.replace(" 5/", f" {i}/").encode())
        out += rng.sample(others, rng.randrange(4))
    log = tmp_path / "log.txt"
    log.write_bytes(b"\n".join(out))  # no newline at the end either
    monkeypatch.setattr(fastscan, "CHUNK", 1 << 14)
    monkeypatch.setattr(parse_mod, "_CHUNK_ROWS", 97)
    fast = parse_log(log).to_dict()
    monkeypatch.setenv("LABKIT_NO_FASTSCAN", "1")
    assert fast == parse_log(log).to_dict()
    assert len(fast["iterations"]) >= 2999


def test_chunked_iteration_records_give_the_same_frame(monkeypatch):
    names = ("deepspeed_0.14_engine.txt", "megatron_lm_v2_2021.txt")
    whole = {f: parse_log(FIX / f).to_dict() for f in names}
    monkeypatch.setattr(parse_mod, "_CHUNK_ROWS", 1)
    for f, d in whole.items():
        assert parse_log(FIX / f).to_dict() == d


def test_fast_iteration_path_agrees_with_the_general_one():
    from labkit.logs.megatron import _parse_common, _parse_general

    texts = [clean_line(ln).text for f in sorted(FIX.glob("*.txt")) for ln in f.read_text().splitlines()]
    texts += [ENGINE_LINE, ENGINE_LINE.replace(" lm loss: 7.123456E+00 |", ""),
              ENGINE_LINE.replace(" grad norm: 1.234 |", "").replace("[2026-11-22 03:30:01] ", "")]
    fast = [(t, _parse_common(t)) for t in texts]
    assert sum(r is not None for _, r in fast) >= 10
    for t, r in fast:
        if r is not None:
            assert r == _parse_general(t), t


def test_parse_log_takes_paths_and_parse_lines_takes_lines(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text(ENGINE_LINE + "\n")
    assert len(parse_log(log).iterations) == len(parse_log(str(log)).iterations) == 1
    assert parse_log([log, str(log)]).sources == [str(log), str(log)]
    assert len(parse_lines(iter([ENGINE_LINE.encode() + b"\r\n"])).iterations) == 1
    with pytest.raises(LabkitError, match="parse_lines"):
        parse_log(ENGINE_LINE)  # text is not a path: no guessing
    with pytest.raises(LabkitError, match="parse_lines"):
        parse_log([ENGINE_LINE])
    with pytest.raises(LabkitError, match="splitlines"):
        parse_lines(ENGINE_LINE + "\n")
