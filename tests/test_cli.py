"""The command line as a user meets it: help, `labkit new`, `check`'s output, `parse`'s errors and
per-file reports, the exit codes, and messages that speak in options."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.cli import build_parser, for_cli_users, main
from labkit.config import PRESETS, RunConfig

REPO = Path(__file__).resolve().parents[1]
LOG = REPO / "tests" / "fixtures" / "logs" / "labkit_engine_2026.txt"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_top_level_help_lists_every_command_in_one_line_and_the_first_steps(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    rc, out, _ = run(capsys, "--help")
    assert rc == 0
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    lines = out.splitlines()
    start = lines.index("  COMMAND") + 1
    listed = lines[start:start + len(sub.choices)]
    # one line each: the name, then what it does
    assert [ln.split()[0] for ln in listed] == list(sub.choices), listed
    assert all(len(ln.split()) > 2 for ln in listed) and lines[start + len(sub.choices)] == ""
    tail = out.rstrip().splitlines()[-3:]
    assert tail[0] == "first steps:" and all(ln.strip().startswith("labkit ") for ln in tail[1:])
    assert "DESIGN" not in out


def test_preset_help_lists_the_presets(capsys):
    for cmd in ("new", "plan"):
        rc, out, _ = run(capsys, cmd, "--help")
        assert rc == 0 and all(p in out for p in PRESETS), cmd


def test_check_prints_the_summary_or_the_readme_message(tmp_path):
    ok, bad = tmp_path / "ok.json", tmp_path / "bad.json"
    RunConfig.from_preset("gpt2-124m", name="demo", nodes=2, gpus_per_node=2,
                          tensor_model_parallel_size=2).to_json(ok)
    r = subprocess.run([sys.executable, "-m", "labkit", "check", str(ok)], capture_output=True,
                       text=True)
    assert r.returncode == 0 and r.stdout == RunConfig.from_json(ok).summary() + "\n"
    data = json.loads(ok.read_text())
    data["tensor_model_parallel_size"] = 3
    bad.write_text(json.dumps(data))
    r = subprocess.run([sys.executable, "-m", "labkit", "check", str(bad)], capture_output=True,
                       text=True)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == ("labkit check: invalid run config 'demo': TP x PP = 3 x 1 = 3 does not "
                        "divide world size 4 (= nodes 2 x gpus_per_node 2); choose TP x PP among "
                        "the divisors of 4: [1, 2, 4]\n"), r.stderr  # as README.md shows it


def test_new_writes_the_config_prints_its_summary_and_never_overwrites(run_root, capsys):
    rc, out, _ = run(capsys, "new", "tp2pp2", "--preset", "tiny", "--tp", "2", "--pp", "2")
    path = run_root / "tp2pp2" / "config.json"
    cfg = RunConfig.from_json(path)
    assert rc == 0 and (cfg.tp, cfg.pp, cfg.name) == (2, 2, "tp2pp2")
    assert (cfg.device, cfg.precision) == ("cpu", "fp32")  # tiny: the cpu profile
    assert str(path) in out and cfg.summary() in out
    before = path.read_text()
    rc, _, err = run(capsys, "new", "tp2pp2", "--preset", "tiny", "--tp", "4")
    assert rc == 1 and "--force" in err and path.read_text() == before
    rc, _, _ = run(capsys, "new", "tp2pp2", "--preset", "tiny", "--tp", "4", "--force")
    assert rc == 0 and RunConfig.from_json(path).tp == 4
    (path.parent / "log.txt").write_text("a run's log\n")  # a directory that holds a run
    rc, _, err = run(capsys, "new", "tp2pp2", "--force")
    assert rc == 1 and "already holds a run" in err and RunConfig.from_json(path).tp == 4


def test_new_follows_the_preset_and_the_shape_given(run_root, capsys):
    rc, _, _ = run(capsys, "new", "g", "--preset", "gpt2-124m", "--nodes", "2",
                   "--gpus-per-node", "4", "--tp", "2")
    cfg = RunConfig.from_json(run_root / "g" / "config.json")
    assert rc == 0 and (cfg.device, cfg.precision, cfg.nodes, cfg.gpus_per_node, cfg.dp) == (
        "cuda", "bf16", 2, 4, 4)
    rc, _, err = run(capsys, "new", "bad", "--preset", "tiny", "--tp", "3")
    assert rc == 2 and "3 x 1 = 3 does not divide world size 4" in err
    assert not (run_root / "bad").exists()
    rc, _, err = run(capsys, "new", "bad name", "--preset", "tiny")
    assert rc == 2 and "name" in err and not (run_root / "bad name").exists()


def test_parse_refuses_what_is_not_a_log(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    RunConfig(name="x").to_json(cfg)
    rc, out, err = run(capsys, "parse", str(cfg))
    assert rc == 1 and out == "" and "no training-log lines in" in err and str(cfg) in err


def test_parse_reports_each_log_unless_told_they_are_one_run(tmp_path, capsys):
    other = tmp_path / "b.log"
    other.write_text(LOG.read_text())
    rc, out, _ = run(capsys, "parse", str(LOG), str(other))
    assert rc == 0 and f"== {LOG}" in out and f"== {other}" in out
    assert out.count("layout:") == 2
    rc, out, _ = run(capsys, "parse", str(LOG), str(other), "--json")
    docs = json.loads(out)
    assert rc == 0 and list(docs) == [str(LOG), str(other)]
    rc, single, _ = run(capsys, "parse", str(LOG), "--json")
    assert docs[str(LOG)] == json.loads(single)
    rc, out, _ = run(capsys, "parse", str(LOG), str(other), "--one-run")
    assert rc == 0 and out.count("layout:") == 1


@pytest.mark.parametrize("argv", [["plan", "--world-size", "0"], ["new", "x", "--tp", "0"],
                                  ["plan", "--nodes", "two"], ["nosuch"], ["logs", "x", "--tail", "0"]])
def test_bad_options_exit_2_with_a_message(argv, capsys):
    rc, _, err = run(capsys, *argv)
    assert rc == 2 and err.strip() and "Traceback" not in err


def test_messages_for_cli_users_speak_in_options():
    msg = "Pick another name, pass resume=True to continue, or overwrite=True to move it aside."
    assert for_cli_users(msg) == ("Pick another name, pass --resume to continue, or --overwrite "
                                  "to move it aside.")


def test_submit_into_a_taken_run_directory_names_the_options(run_root, tmp_path, capsys):
    cfg = tmp_path / "c.json"
    RunConfig(name="taken", nodes=1, gpus_per_node=1).to_json(cfg)
    (run_root / "taken").mkdir()
    (run_root / "taken" / "log.txt").write_text("an earlier run\n")
    rc, _, err = run(capsys, "submit", str(cfg))
    assert rc == 1 and "--resume" in err and "--overwrite" in err and "=True" not in err


def test_watch_names_an_unknown_job(run_root, capsys):
    rc, _, err = run(capsys, "watch", "nosuch", "--hang-timeout", "5")
    assert rc == 1 and "no labkit job 'nosuch'" in err


@pytest.mark.engine
def test_watch_diagnoses_a_real_hang_and_cancels_the_job(run_root, capsys, monkeypatch):
    from labkit import jobs
    from labkit.run import JobState

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cfg = RunConfig(name="hang", nodes=1, gpus_per_node=2,
                    extra={"hang_at": 3, "hang_rank": 1, "pg_timeout": 300})
    job = jobs.submit(cfg, backend="local", program=REPO / "tests" / "programs" / "hang_job.py")
    try:
        # Start watching once the job is past its (load-dependent) start-up: the short hang
        # timeout then measures the hang, never how busy this machine is.
        from labkit.lab import wait_for_iteration

        wait_for_iteration(job, 2, timeout=240)
        rc, _, err = run(capsys, "watch", job.job_id, "--hang-timeout", "6", "--timeout", "240")
    finally:
        if not job.state().finished:
            job.cancel()
    assert rc == 1 and "looks hung" in err and "after iteration 2" in err, err
    assert job.wait(timeout=60, progress=False) is JobState.CANCELLED
    assert list(job.run_dir.glob("hang-*.txt"))


def test_a_config_from_new_is_submitted_in_place_and_nothing_else_is_taken_over(run_root, capsys):
    from labkit.errors import SubmissionError
    from labkit.rundir import prepare_run_dir

    assert run(capsys, "new", "demo", "--preset", "tiny", "--tp", "2")[0] == 0
    path = run_root / "demo" / "config.json"
    cfg = RunConfig.from_json(path)
    assert prepare_run_dir(cfg) == path.parent  # the run starts where labkit new put its config
    with pytest.raises(SubmissionError, match="already holds a run"):
        prepare_run_dir(cfg.replace(train_iters=cfg.train_iters + 1))
    assert RunConfig.from_json(path) == cfg


def test_plan_sweeps_a_config_file_on_another_shape_keeping_its_batch(run_root, capsys):
    assert run(capsys, "new", "pp", "--preset", "tiny", "--pp", "2")[0] == 0
    path = run_root / "pp" / "config.json"
    rc, out, _ = run(capsys, "plan", str(path), "--world-size", "8")
    first = out.splitlines()[0]
    assert rc == 0 and first.startswith(f"{path} on 4 node(s) x 2 process(es) = 8 ranks; device "
                                        f"cpu, precision fp32, global batch 8, micro batch 2")
    rows = [ln.split() for ln in out.splitlines()[3:]]
    assert ["1", "2", "4"] in [r[:3] for r in rows]  # the config's own layout, on 8 ranks


def test_logs_copies_a_block_at_a_time_and_finds_the_last_lines(tmp_path):
    """labkit logs: a log of any size costs one block of memory; --tail N starts N lines from the end."""
    import codecs
    import tracemalloc

    from labkit.cli import jobs

    log = tmp_path / "log.txt"
    log.write_bytes(b"first\n" + "é".encode() * (12 << 20) + b"\nsecond\nthird\n")  # 24 MB of text
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    with open(tmp_path / "out.txt", "w", encoding="utf-8") as out:
        tracemalloc.start()
        try:
            end = jobs.copy_log(log, 0, out, decoder)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert end == log.stat().st_size and peak < 8 * jobs._BLOCK, peak  # not the 24 MB log, nor its text
    assert (tmp_path / "out.txt").read_bytes() == log.read_bytes()  # no character split between blocks
    assert log.read_bytes()[jobs.tail_offset(log, 2):] == b"second\nthird\n"
    assert jobs.tail_offset(log, 3) == 6 and jobs.tail_offset(log, 4) == 0
    short = tmp_path / "short.txt"
    short.write_bytes(b"a\nb\nc")  # no final newline: "c" is the last line
    assert [jobs.tail_offset(short, n) for n in (1, 2, 3, 9)] == [4, 2, 0, 0]
    assert jobs.tail_offset(tmp_path / "missing.txt", 5) == 0
