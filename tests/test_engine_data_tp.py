"""Data loading and DP communication as Megatron-LM does them, on CPU (gloo).

- TP rank 0 of each tensor-parallel group alone reads the dataset and broadcasts each micro
  batch to the group (two real gloo processes); in the engine the other TP ranks do not even
  build the dataset, and TP=2 trains to TP=1's losses (tests/test_engine.py,
  test_layouts_agree_on_the_loss).
- The distributed optimizer's parameter all-gather overlapped with the next forward pass gives
  the same losses (training, validation, and after a checkpoint) as the synchronous gather.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "code"))

SEQ, MBS, STEPS = 8, 2, 3


class CountingSamples:
    """GPTDataset-shaped samples (dtypes as megatron-core's) that count the reads made."""

    def __init__(self, n: int, seed: int):
        import torch

        g = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, 1000, (n, SEQ + 1), generator=g)
        self.reads = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict:
        import torch

        self.reads += 1
        text = self.tokens[i]
        return {"tokens": text[:-1].clone(), "labels": text[1:].clone(),
                "loss_mask": torch.ones(SEQ, dtype=torch.float32),
                "position_ids": torch.arange(SEQ, dtype=torch.int64)}


def _tp_worker(rank: int, port: int, out: str) -> None:
    os.environ.update(OMP_NUM_THREADS="1")
    sys.path.insert(0, str(REPO / "code"))
    sys.path.insert(0, str(REPO))
    import cpu_compat
    import torch

    cpu_compat.apply()
    store = torch.distributed.TCPStore("127.0.0.1", port, 2, is_master=False)
    torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=2)
    import engine_data
    from megatron.core import parallel_state as ps

    ps.initialize_model_parallel(2, 1)
    data = CountingSamples(32, seed=rank)  # each rank's own numbers: what it returns tells whose
    it = engine_data.tp_batches(data, 0, MBS, SEQ, on_cuda=False)
    got = [next(it) for _ in range(STEPS)]
    Path(out, f"rank{rank}.json").write_text(json.dumps({
        "reads": data.reads,
        "batches": [{k: v.tolist() for k, v in b.items()} for b in got],
        "dtypes": {k: str(v.dtype) for k, v in got[0].items()},
        "expected": [{k: torch.stack([data.tokens[i][:-1] if k == "tokens" else
                                      data.tokens[i][1:] for i in range(s * MBS, (s + 1) * MBS)])
                      .tolist() for k in ("tokens", "labels")} for s in range(STEPS)],
    }))
    torch.distributed.destroy_process_group()
    from engine_stop import end_process

    end_process(0)


def test_tp_rank_0_alone_reads_and_broadcasts(tmp_path):
    import torch.distributed as dist
    import torch.multiprocessing as mp

    # the store on a port the OS gives, held here until both ranks are done (nothing can take it)
    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    mp.start_processes(_tp_worker, args=(store.port, str(tmp_path)), nprocs=2,
                       start_method="spawn")
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["reads"] == STEPS * MBS and r1["reads"] == 0
    assert r1["batches"] == r0["batches"]  # rank 1 holds rank 0's samples, not its own
    for s in range(STEPS):
        assert r0["batches"][s]["tokens"] == r0["expected"][s]["tokens"]
        assert r0["batches"][s]["labels"] == r0["expected"][s]["labels"]
        assert r1["batches"][s]["tokens"] != r1["expected"][s]["tokens"]
    assert r1["dtypes"] == {"tokens": "torch.int64", "labels": "torch.int64",
                            "loss_mask": "torch.float32", "position_ids": "torch.int64"}


def test_param_gather_overlaps_only_with_the_distributed_optimizer_and_dp(monkeypatch):
    import engine_model

    from labkit.config import RunConfig

    base = RunConfig(name="x", gpus_per_node=2, use_distributed_optimizer=True)  # DP 2
    for cfg, want in ((base, True), (base.replace(use_distributed_optimizer=False), False),
                      (base.replace(gpus_per_node=1), False)):
        d = engine_model.ddp_config(cfg)
        assert d.overlap_param_gather is want, cfg
        assert not want or d.overlap_grad_reduce  # megatron-core needs both
    assert "parameter all-gather overlapped" in engine_model.overlap_line(base)
    monkeypatch.setenv("LABKIT_OVERLAP_PARAM_GATHER", "0")
    assert engine_model.ddp_config(base).overlap_param_gather is False
    assert "parameter all-gather synchronous" in engine_model.overlap_line(base)


@pytest.mark.engine
def test_overlapped_param_gather_gives_the_same_losses(tmp_path):
    from engine_runs import ensure_data, launch, losses, make_config

    ensure_data()
    fields = dict(dp=2, use_distributed_optimizer=True, train_iters=6, log_interval=1,
                  lr_warmup_iters=2, eval_interval=3, eval_iters=1, save_interval=3)
    runs = {}
    for name, flag in (("overlap", "1"), ("sync", "0")):
        cfg, run_dir = make_config(tmp_path, name, **fields)
        proc = launch(cfg, run_dir, env={"LABKIT_OVERLAP_PARAM_GATHER": flag})
        assert proc.wait(timeout=600) == 0, (run_dir / "torchrun.out").read_text()[-3000:]
        runs[name] = run_dir
    logs = {n: (d / "log.txt").read_text() for n, d in runs.items()}
    assert "parameter all-gather overlapped with the next forward" in logs["overlap"]
    assert "parameter all-gather synchronous" in logs["sync"]
    assert losses(runs["overlap"]) == losses(runs["sync"])
    assert sorted(losses(runs["overlap"])) == list(range(1, 7))

    def validation(text):
        return [ln.split("lm loss value:")[1].split("|")[0].strip()
                for ln in text.splitlines() if "validation loss at iteration" in ln]

    assert validation(logs["overlap"]) == validation(logs["sync"]) and validation(logs["sync"])
    # The checkpoint at iteration 3 (gathered before saving) resumes to the same curve.
    cfg, run_dir = make_config(tmp_path, "overlap", **fields)
    shutil.rmtree(run_dir / "checkpoints" / "iter_0000006", ignore_errors=True)
    (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("3\n")
    proc = launch(cfg, run_dir)
    assert proc.wait(timeout=600) == 0, (run_dir / "torchrun.out").read_text()[-3000:]
    assert losses(run_dir) == losses(runs["sync"])
