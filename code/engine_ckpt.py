"""Checkpoints of code/pretrain_gpt.py: megatron-core distributed checkpointing.

Layout (Megatron-LM's): ``checkpoints/iter_0000010/`` (one dist_checkpointing folder per save)
and ``checkpoints/latest_checkpointed_iteration.txt`` (written last, so a folder without it is
an unfinished save that resume ignores). Saved: model, optimizer, LR scheduler, iteration,
consumed samples, and each rank's RNG states.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from megatron.core import dist_checkpointing
from megatron.core import parallel_state as ps
from megatron.core.dist_checkpointing.mapping import ShardedObject

TRACKER = "latest_checkpointed_iteration.txt"
# Fully parallel save/load of the distributed optimizer's shards (reshardable over DP).
_OPT_META = {"distrib_optim_sharding_type": "dp_reshardable"}


def iter_dir(ckpt_root: Path, iteration: int) -> Path:
    return ckpt_root / f"iter_{iteration:07d}"


def latest_iteration(ckpt_root: Path) -> int | None:
    """The iteration of the last finished save, or None."""
    tracker = ckpt_root / TRACKER
    if not tracker.is_file():
        return None
    text = tracker.read_text().strip()
    return int(text) if text.isdigit() and iter_dir(ckpt_root, int(text)).is_dir() else None


def _rng_object() -> ShardedObject:
    state = {"random": random.getstate(), "np": np.random.get_state(),
             "torch": torch.get_rng_state(),
             "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None}
    pp, tp = ps.get_pipeline_model_parallel_world_size(), ps.get_tensor_model_parallel_world_size()
    dp = ps.get_data_parallel_world_size()
    return ShardedObject("rng_state", state, (pp, tp, dp),
                         (ps.get_pipeline_model_parallel_rank(),
                          ps.get_tensor_model_parallel_rank(), ps.get_data_parallel_rank()),
                         replica_id=0)


def _sharded_state(model: list[torch.nn.Module], optimizer: Any, scheduler: Any,
                   extra: dict[str, Any], is_loading: bool, with_rng: bool) -> dict[str, Any]:
    sd: dict[str, Any] = {}
    if len(model) == 1:
        sd["model"] = model[0].module.sharded_state_dict()
    else:
        for i, m in enumerate(model):
            sd[f"model{i}"] = m.module.sharded_state_dict()
    model_sd = {k: v for k, v in sd.items() if k.startswith("model")}
    if is_loading:
        _init_adam_state(optimizer)
    sd["optimizer"] = optimizer.sharded_state_dict(model_sd, is_loading=is_loading,
                                                   metadata=_OPT_META)
    sd["opt_param_scheduler"] = scheduler.state_dict()
    sd.update(extra)
    if with_rng:
        sd["rng_state"] = _rng_object()
    return sd


def needs_adam_step_fix(optimizer: Any) -> bool:
    """True for the one case the two step fixes below are written for: megatron-core's
    distributed optimizer over torch's Adam/AdamW (no Apex / Transformer Engine FusedAdam,
    whose step lives in the param group and is restored by megatron-core itself)."""
    if not getattr(optimizer.config, "use_distributed_optimizer", False):
        return False
    inner = [getattr(s, "optimizer", None)
             for s in getattr(optimizer, "chained_optimizers", [optimizer])]
    return bool(inner) and all(isinstance(o, torch.optim.Adam | torch.optim.AdamW)
                               for o in inner)


def _init_adam_state(optimizer: Any) -> None:
    """Give torch Adam empty moments *and* a step before loading into a distributed optimizer.

    Without Apex/Transformer Engine, megatron-core 0.16's state initialiser creates exp_avg and
    exp_avg_sq but no ``step``, and DistributedOptimizer.state_dict() then asserts that there is
    exactly one step value. A zero step fills the gap; loading replaces it.
    """
    if not needs_adam_step_fix(optimizer):
        return
    for sub in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = sub.optimizer
        for group in inner.param_groups:
            for p in group["params"]:
                st = inner.state[p]
                if not st:
                    st["exp_avg"] = torch.zeros_like(p.data)
                    st["exp_avg_sq"] = torch.zeros_like(p.data)
                st.setdefault("step", torch.tensor(0.0))


def _restore_adam_steps(optimizer: Any) -> None:
    """One correct ``step`` tensor per parameter after a load.

    Without Apex/Transformer Engine, megatron-core 0.16's distributed optimizer keeps torch
    Adam's step in ``param_groups[i]["step"]``; on load it gives every parameter *one shared*
    step tensor, which its bucket loader then overwrites with the template's value (0 here).
    torch's Adam would restart its bias correction and bump the shared tensor once per
    parameter. The group's step is the restored truth: give each parameter its own copy.
    """
    for sub in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(sub, "optimizer", None)
        if inner is None:
            continue
        for group in inner.param_groups:
            step = group.get("step")
            for p in group["params"]:
                st = inner.state.get(p)
                if not st or not isinstance(st.get("step"), torch.Tensor):
                    continue
                st["step"] = (torch.tensor(float(step), dtype=torch.float32)
                              if step is not None else st["step"].clone())


def save(ckpt_root: Path, iteration: int, consumed_samples: int, model: list[torch.nn.Module],
         optimizer: Any, scheduler: Any, layout: tuple[int, int, int]) -> Path:
    """Save on all ranks; the tracker file is written by rank 0 after every rank finished."""
    d = iter_dir(ckpt_root, iteration)
    if torch.distributed.get_rank() == 0:
        if d.exists() and latest_iteration(ckpt_root) != iteration:
            # A save that was killed before its tracker update: unusable, and in the way
            # (dist_checkpointing refuses a non-empty folder). Keep it aside, don't delete.
            d.rename(d.with_name(f"{d.name}.incomplete-{time.strftime('%Y%m%d-%H%M%S')}"))
        d.mkdir(parents=True, exist_ok=True)
    torch.distributed.barrier()
    extra = {"iteration": iteration, "consumed_samples": consumed_samples, "layout": list(layout)}
    sd = _sharded_state(model, optimizer, scheduler, extra, is_loading=False, with_rng=True)
    dist_checkpointing.save(sd, str(d))
    torch.distributed.barrier()
    if torch.distributed.get_rank() == 0:
        tmp = ckpt_root / (TRACKER + ".tmp")
        tmp.write_text(f"{iteration}\n")
        tmp.replace(ckpt_root / TRACKER)
    return d


def set_aside(ckpt_root: Path) -> Path | None:
    """Move an existing checkpoint folder aside (a run restarted with --no-resume)."""
    if not ckpt_root.is_dir() or not any(ckpt_root.iterdir()):
        return None
    aside = ckpt_root.with_name(f"{ckpt_root.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
    ckpt_root.rename(aside)
    return aside


def load(ckpt_root: Path, model: list[torch.nn.Module], optimizer: Any, scheduler: Any,
         layout: tuple[int, int, int]) -> tuple[int, int, Path] | None:
    """Load the latest checkpoint into model/optimizer/scheduler; (iteration, consumed, dir)."""
    it = latest_iteration(ckpt_root)
    if it is None:
        return None
    d = iter_dir(ckpt_root, it)
    common = dist_checkpointing.load_common_state_dict(str(d))
    # RNG states are per rank: only meaningful when the layout is the one that saved them.
    same_layout = list(common.get("layout", [])) == list(layout)
    extra = {"iteration": 0, "consumed_samples": 0, "layout": list(layout)}
    sd = _sharded_state(model, optimizer, scheduler, extra, is_loading=True,
                        with_rng=same_layout)
    state = dist_checkpointing.load(sd, str(d))
    if len(model) == 1:
        model[0].module.load_state_dict(state["model"])
    else:
        for i, m in enumerate(model):
            m.module.load_state_dict(state[f"model{i}"])
    with torch.no_grad():  # the distributed optimizer copies into leaf params in place
        optimizer.load_state_dict(state["optimizer"])
    if needs_adam_step_fix(optimizer):
        _restore_adam_steps(optimizer)
    scheduler.load_state_dict(state["opt_param_scheduler"])
    if same_layout and "rng_state" in state:
        rng = state["rng_state"]
        random.setstate(rng["random"])
        np.random.set_state(rng["np"])
        torch.set_rng_state(rng["torch"])
        if rng.get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
    return int(state["iteration"]), int(state["consumed_samples"]), d
