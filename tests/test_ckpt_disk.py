"""Checkpoints on a full disk and truncated checkpoints, for real (tiny preset, one process).

A full disk: the run's checkpoint folder is a small tmpfs (root) that holds the save of
iteration 5 but not the one of iteration 10. The training log then says, in one message, that
the checkpoint could not be written, where, how much space was free and needed, that the
latest-checkpoint pointer still names iteration 5, and the fix; the diagnosis is ``disk_full``.

A truncated checkpoint: the last save's shard file cut in half. Resuming says which file is
short, that the checkpoint is truncated, and which earlier checkpoint to resume from and how;
following that advice resumes from it.
"""

from __future__ import annotations

import os
import subprocess

import engine_runs
import pytest
from conftest import skip_or_fail

from labkit.config import RunConfig
from labkit.jobs import submit
from labkit.logs import parse_log
from labkit.presets import PRESETS

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]
RUN = dict(train_iters=10, save_interval=5, log_interval=5, micro_batch_size=2,
           global_batch_size=4, gpus_per_node=1, nodes=1)
TRACKER = "latest_checkpointed_iteration.txt"


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 24 MB tmpfs: the tiny preset's checkpoint at one process is about 16 MB (weights and
    two Adam moments in fp32), so the first save fits and the second does not."""
    if os.geteuid() != 0:
        skip_or_fail("mounting a tmpfs needs root")
    mnt = tmp_path / "ckpt"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if p.returncode:
        skip_or_fail(f"mount -t tmpfs failed: {p.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_during_a_save_is_named(small_tmpfs, run_root):
    engine_runs.ensure_data()
    cfg = RunConfig.from_preset("tiny", name="diskfull", backend="local", **RUN)
    job = submit(cfg, program_args=["--config", "{run_dir}/config.json", "--save",
                                    str(small_tmpfs)])
    st = job.wait(timeout=600, progress=False)
    log = job.log_path.read_text()
    assert str(st) == "FAILED" and job.exit_code() == 1, log[-3000:]
    assert (small_tmpfs / "iter_0000005" / "metadata.json").is_file()  # the first save fit
    assert (small_tmpfs / TRACKER).read_text().strip() == "5"  # the pointer did not move
    msg = next(ln for ln in log.splitlines() if "could not be written" in ln)
    assert f"checkpoint of iteration 10 could not be written to {small_tmpfs}/iter_0000010" in msg
    assert "the disk is full (ENOSPC" in msg and " MB free on that filesystem" in msg
    assert "a checkpoint needs about 1" in msg  # ~16 MB: the size of iteration 5's save
    assert f"{TRACKER} still names iteration 5 ({small_tmpfs}/iter_0000005)" in msg
    assert "labkit clean" in msg and "--resume" in msg and "continues from iteration 5" in msg
    # One message, not the checkpoint writer's traceback (megatron-core's writer prints its own
    # "unexpected pos" line before it, torchrun's failure table follows it).
    assert "CheckpointException" not in log and "Traceback (most recent call last): (RANK" not in log
    failures = parse_log(job.log_path).failure_records
    assert failures and failures[0].kind == "disk_full", failures
    assert "df -h" in failures[0].hint


def test_truncated_checkpoint_names_the_file_and_the_previous_one(tmp_path):
    tiny = dict(PRESETS["tiny"])
    run = {**RUN, "train_iters": 10}
    run.pop("nodes")
    d = engine_runs.train(tmp_path, "trunc", **tiny, **run)
    ckpt = d / "checkpoints"
    assert (ckpt / TRACKER).read_text().strip() == "10"
    shard = ckpt / "iter_0000010" / "__0_0.distcp"
    size = shard.stat().st_size
    with open(shard, "r+b") as f:  # a save cut short
        f.truncate(size // 2)
    run["train_iters"] = 15
    d = engine_runs.train(tmp_path, "trunc", check=False, **tiny, **run)
    log = (d / "log.txt").read_text()
    assert (d / "exit_code").read_text().strip() == "1"
    msg = next(ln for ln in log.splitlines() if "truncated or corrupt" in ln)
    assert f"checkpoint {ckpt}/iter_0000010 is truncated or corrupt" in msg
    assert f"__0_0.distcp is truncated: {size // 2} bytes, the checkpoint's index says {size}" in msg
    assert f"The previous checkpoint, iteration 5 ({ckpt}/iter_0000005), is complete" in msg
    fix = f"`echo 5 > {ckpt / TRACKER}`"
    assert fix in msg and "EOFError" not in log and "Traceback" not in log
    assert parse_log(d / "log.txt").failure_records[0].kind == "bad_checkpoint"
    # The advice works: point the tracker at iteration 5 and run again.
    (ckpt / TRACKER).write_text("5\n")
    d = engine_runs.train(tmp_path, "trunc", **tiny, **run)
    log = (d / "log.txt").read_text()
    assert f"resumed from {ckpt}/iter_0000005 at iteration 5" in log
    assert engine_runs.losses(d).keys() >= {10, 15}
    assert any(p.name.startswith("iter_0000010.incomplete-") for p in ckpt.iterdir())
    assert (ckpt / TRACKER).read_text().strip() == "15"
