"""code/pretrain_gpt.py trains for real: megatron-core GPT, torchrun, gloo, the default corpus."""

from __future__ import annotations

import math
import re

import pytest
from engine_runs import ensure_data, kill_all, launch, losses, make_config, train, wait_for

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module", autouse=True)
def _data():
    ensure_data()


def _first_last(run_dir):
    ls = losses(run_dir)
    its = sorted(ls)
    return ls[its[0]], ls[its[-1]], its


# Each layout is trained once per module; the two tests below read the same runs. Every run logs
# every iteration (30, warm-up 2), so the agreement test compares its first 10 and the other
# checks the whole curve.
LAYOUTS = {
    "tp1": {},
    "tp2": dict(tensor_model_parallel_size=2),
    "pp2": dict(pipeline_model_parallel_size=2),
    "pp2vpp2": dict(pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=1),
    "tp2xpp2": dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=2),
    "dp2": dict(dp=2),
}


@pytest.fixture(scope="module")
def layout_run(tmp_path_factory):
    done: dict = {}

    def run(name):
        if name not in done:
            done[name] = train(tmp_path_factory.mktemp(name), name, train_iters=30, log_interval=1,
                               eval_interval=30, lr_warmup_iters=2, **LAYOUTS[name])
        return done[name]
    return run


@pytest.mark.parametrize("name", ["tp2", "pp2", "tp2xpp2", "dp2"])
def test_layout_trains_with_falling_loss(layout_run, name):
    layout = LAYOUTS[name]
    run_dir = layout_run(name)
    log = (run_dir / "log.txt").read_text()
    tp = layout.get("tensor_model_parallel_size", 1)
    pp = layout.get("pipeline_model_parallel_size", 1)
    dp = layout.get("dp", 1)
    assert (f"using world size: {tp * pp * dp}, data-parallel size: {dp}, context-parallel size: "
            f"1, tensor-model-parallel size: {tp}, pipeline-model-parallel size: {pp}") in log
    # One parameter line per (tensor, pipeline) rank, printed by DP rank 0 only.
    params = re.findall(r"model parallel rank \((\d+), (\d+)\): (\d+)", log)
    assert sorted((int(t), int(p)) for t, p, _ in params) == \
        sorted((t, p) for t in range(tp) for p in range(pp))
    first, last, its = _first_last(run_dir)
    assert its == list(range(1, 31))
    assert math.isfinite(last) and last < first - 0.5, (first, last)
    assert "validation loss at iteration 30 | lm loss value:" in log
    assert re.search(r"\[Rank 0\] \(after 1 iterations\) memory \(MB\) \| allocated: [\d.]+", log)
    assert (run_dir / "exit_code").read_text().strip() == "0"
    assert (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text() == "30\n"
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))


def test_layouts_agree_on_the_loss(layout_run):
    """Same seed and data: TP=1, TP=2, PP=2 (and interleaved) compute the same model and loss.
    At TP=2 only TP rank 0 reads the batches and broadcasts them (engine_data), so TP=2 matching
    TP=1 also shows that the broadcast batches are the ones TP=1 reads."""
    dirs = {name: layout_run(name) for name in ("tp1", "tp2", "pp2", "pp2vpp2")}
    runs = {name: losses(d) for name, d in dirs.items()}
    assert "TP rank 0 of each tensor-parallel group reads every micro batch" in \
        (dirs["tp2"] / "log.txt").read_text()
    ref = runs["tp1"]
    assert sorted(ref)[:10] == list(range(1, 11))
    for name in ("tp2", "pp2", "pp2vpp2"):
        assert runs[name][1] == pytest.approx(ref[1], rel=1e-5), name
        for it in range(1, 11):
            assert runs[name][it] == pytest.approx(ref[it], abs=2e-3), (name, it)


def test_resume_after_sigkill_continues_the_curve(tmp_path):
    # Interleaved PP x DP with the distributed optimizer: the hardest state to restore.
    layout = dict(pipeline_model_parallel_size=2, num_layers_per_virtual_pipeline_stage=1, dp=2,
                  use_distributed_optimizer=True, train_iters=20, save_interval=5,
                  log_interval=1)
    reference = losses(train(tmp_path, "straight", **layout))

    cfg, run_dir = make_config(tmp_path, "killed", **layout)
    proc = launch(cfg, run_dir)
    tracker = run_dir / "checkpoints" / "latest_checkpointed_iteration.txt"
    wait_for(tracker, proc=proc)
    kill_all(proc)  # SIGKILL: no chance to clean up, like a node failure
    saved = int(tracker.read_text())
    assert 5 <= saved < 20

    proc = launch(cfg, run_dir)
    assert proc.wait(timeout=600) == 0, (run_dir / "torchrun.out").read_text()[-3000:]
    log = (run_dir / "log.txt").read_text()
    assert f"resumed from {run_dir / 'checkpoints' / f'iter_{saved:07d}'} at iteration {saved}" \
        in log
    after = losses(run_dir)
    assert sorted(after) == list(range(1, 21))
    # Iterations after the checkpoint were (re)done by the resumed run: the curve must match.
    for it in range(saved + 1, 21):
        assert after[it] == pytest.approx(reference[it], abs=1e-4), it
    assert (run_dir / "exit_code").read_text().strip() == "0"


def test_memory_cap_is_a_real_out_of_memory(cpu_oom_run):
    run_dir = cpu_oom_run
    log = (run_dir / "log.txt").read_text()
    m = re.search(r"\[labkit\] out of memory on rank (\d) \(tensor, pipeline\) = \((\d), 0\) "
                  r"during (forward-backward|optimizer step) at iteration 1: tried to allocate "
                  r"(\d+) bytes \(memory_limit_gb=0.2\)", log)
    assert m, log[-3000:]
    assert int(m.group(4)) > 0
    assert "DefaultCPUAllocator: can't allocate memory" in log
    assert "iteration        1/" not in log
    assert int((run_dir / "exit_code").read_text()) != 0
