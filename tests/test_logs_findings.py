"""What a log shows as a whole (labkit/logs/findings.py): a log of only NCCL start-up lines is a
stopped or hung job, read and named, never refused; fp16 loss-scale steps; the tools a log holds."""

from __future__ import annotations

import json
from pathlib import Path

from labkit.cli import main
from labkit.logs import parse_lines, parse_log

REAL = Path(__file__).parent / "fixtures" / "logs" / "real"
HUNG = REAL / "nccl_2.1x_roce_long_bootstrap_nccl997.txt"  # NCCL start-up lines, no Init COMPLETE


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_nccl_only_log_is_read_and_says_where_it_stopped(capsys):
    p = parse_log(HUNG)
    assert p.iterations.empty and not p.failure_records and "NCCL" in p.tools
    (f,) = p.findings
    assert f["kind"] == "stopped_after_init" and f["line"] == 10
    assert "RoCE (9 HCAs)" in f["message"] and "no iteration logged" in f["message"]
    assert "during NCCL initialisation" in f["message"]  # no communicator reported Init COMPLETE
    rc, out, _ = _cli(capsys, "parse", str(HUNG), "--json")
    assert rc == 0 and json.loads(out)["findings"] == [f]
    rc, out, _ = _cli(capsys, "parse", str(HUNG))
    assert rc == 0 and "FINDING stopped_after_init (line 10): NCCL initialising on RoCE (9 HCAs)" in out


def test_channels_connected_means_initialised():
    p = parse_log(REAL / "nccl_2.2x_ibext_v8_nccl1814.txt")
    (f,) = p.findings
    assert f["message"].startswith("NCCL initialised on IBext_v8, no iteration logged")
    assert "after initialisation" in f["message"]


def test_a_log_with_iterations_or_a_failure_has_no_stop_finding():
    assert parse_log(REAL / "nccl_2.18.5_roce_banner_nccl1052.txt").findings  # only start-up lines
    for name in ("torchrun_srun_label_segfault_pytorch135486.txt", "megatron_deepspeed_2022_nccl_tp.txt"):
        if (REAL / name).is_file():
            assert not [f for f in parse_log(REAL / name).findings if f["kind"] == "stopped_after_init"]


def test_tool_lines_alone_are_a_log_and_prose_is_not(tmp_path, capsys):
    launcher = tmp_path / "launch.log"
    launcher.write_text("[2024-02-01 10:00:00,000] [INFO] [launch.py:256:main] process 4242 spawned "
                        "with command: ['python', '-u', 'train.py']\n"
                        "[2024-02-01 10:00:09,000] [INFO] [launch.py:315:sigkill_handler] Killing "
                        "subprocess 4242\n")
    rc, out, _ = _cli(capsys, "parse", str(launcher))
    assert rc == 0 and "FINDING no_iteration" in out and "DeepSpeed" in out
    prose = tmp_path / "notes.txt"
    prose.write_text("shopping list\neggs, milk\n")
    rc, out, err = _cli(capsys, "parse", str(prose))
    assert rc == 1 and "is it a log?" in err


def test_fp16_scale_goes_into_the_next_deepspeed_step():
    lines = ["[2023-04-28 06:51:30,648] [INFO] [loss_scaler.py:181:update_scale] [deepspeed] OVERFLOW! "
             "Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
             "[2023-04-28 06:52:01,001] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=1, "
             "lr=[0.0001], mom=[(0.9, 0.95)]"]
    p = parse_lines(lines)
    assert p.iterations["loss_scale"].tolist() == [32768.0]
    assert p.iterations["skipped"].tolist() == [1]
    (f,) = p.findings
    assert (f["kind"], f["skipped_steps"], f["loss_scale"]) == ("fp16_overflow", 1, 32768.0)


def test_megatron_2019_labels_without_colons():
    # Megatron-LM's 2019 training loop: ' learning rate {:.3E} |', ' lm loss {:.6E} |', ' loss scale {:.1f} |'
    lines = [" iteration      100/  300000 | elapsed time per iteration (ms): 1048.5 |"
             " learning rate 1.258E-04 | lm loss 4.799004E+00 | loss scale 32768.0 |",
             " iteration      200/  300000 | elapsed time per iteration (ms): 1020.9 |"
             " learning rate 5.257E-05 | lm loss NAN | loss scale 16384.0 |"]
    its = parse_lines(lines).to_dict()["iterations"]
    assert [(r["iteration"], r["lr"], r["lm_loss"], r["loss_scale"]) for r in its] == [
        (100, 1.258e-04, 4.799004, 32768.0), (200, 5.257e-05, None, 16384.0)]


def test_a_scale_that_is_no_number_stays_out_of_the_json():
    """A damaged overflow line (an exponent past float's range, 400 digits) is no reading: the
    JSON contract holds."""
    import json
    import math

    from labkit.logs import parse_lines

    lines = ["[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to "
             + "9" * 400,
             "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1e999, reducing to 9e999"]
    d = parse_lines(lines).to_dict()
    json.dumps(d, allow_nan=False)
    scales = [f["loss_scale"] for f in d["findings"] if f.get("loss_scale") is not None]
    assert all(math.isfinite(s) for s in scales), d["findings"]


def test_nccl_tests_header_without_its_hashes_is_an_nccl_log(capsys, tmp_path):
    """nccl-tests prints its header behind ``#``; pasted outside a code block, a page drops them
    (Markdown headings). The header alone (no NCCL INFO line) still names NCCL, never refused."""
    real = REAL / "nccl_tests_2024_hang_after_bootstrap_nccltests244.txt"
    header = [ln.lstrip("#") for ln in real.read_text().splitlines() if ln.startswith("#")]
    assert len(header) >= 4 and not any("NCCL" in ln for ln in header)
    p = parse_lines(header)
    assert p.tools == ["NCCL"] and p.iterations.empty, p.tools
    log = tmp_path / "nccl_tests.txt"
    log.write_text("\n".join(header) + "\n")
    rc, out, err = _cli(capsys, "parse", str(log), "--json")
    assert rc == 0, err
