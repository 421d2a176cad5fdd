"""Checkpoints of code/pretrain_gpt.py: megatron-core distributed checkpointing.

Layout (Megatron-LM's): ``checkpoints/iter_0000010/`` (one dist_checkpointing folder per save)
and ``checkpoints/latest_checkpointed_iteration.txt`` (written last, so a folder without it is
an unfinished save that resume ignores). Saved: model, optimizer, LR scheduler, iteration,
consumed samples, and each rank's RNG states.
"""

from __future__ import annotations

import errno
import pickle
import random
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from megatron.core import dist_checkpointing
from megatron.core import parallel_state as ps
from megatron.core.dist_checkpointing.mapping import ShardedObject
from torch.distributed.checkpoint.api import CheckpointException

TRACKER = "latest_checkpointed_iteration.txt"
MB = 1e6


class CheckpointError(RuntimeError):
    """A checkpoint that could not be written or read, explained: which folder, why, which
    checkpoint is still good, and what to do (pretrain_gpt logs it as one message)."""
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
    if not torch.cuda.is_available():
        _forked_results_queue()
    try:
        dist_checkpointing.save(sd, str(d))
        torch.distributed.barrier()
        if torch.distributed.get_rank() == 0:
            tmp = ckpt_root / (TRACKER + ".tmp")
            tmp.write_text(f"{iteration}\n")
            tmp.replace(ckpt_root / TRACKER)
    except (Exception, CheckpointException) as exc:  # the latter is a BaseException
        full = _disk_full(exc, ckpt_root, iteration,
                          _state_bytes(sd) * torch.distributed.get_world_size())
        if full is None:
            raise
        raise CheckpointError(full) from exc
    return d


def _forked_results_queue() -> None:
    """dist-checkpointing hands the write results of a save through a queue served by a
    multiprocessing manager, started at a rank's first save in a *spawn* context. A spawned
    process starts a fresh interpreter that re-runs the main script and unpickles torch objects:
    it imports torch and megatron-core again, 2-3 s of CPU per rank, waited for by the first save
    of every run (the save of a tiny TP=2 x PP=2 run took 3.2 s, 0.2 s with this). On CPU the
    manager is started here in a *fork* context, as dist-checkpointing forks its own writer
    processes; on CUDA its own choice stands. A megatron-core without that queue is left alone."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if getattr(filesystem_async, "_results_queue", "absent") is None:
        import multiprocessing

        # the queue's proxy keeps the manager (and its server process) alive for the rank's life
        filesystem_async._results_queue = multiprocessing.get_context("fork").Manager().Queue()


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc``, its causes and contexts, and the per-rank errors a torch CheckpointException
    carries (``failures``: {rank: exception})."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo and len(seen) < 50:
        e = todo.pop()
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [e.__cause__, e.__context__]
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):  # {rank: exception, or (exception, traceback)}
            for v in failures.values():
                v = v[0] if isinstance(v, tuple) and v else v
                if isinstance(v, BaseException):
                    todo.append(v)
    return seen


def _tree_bytes(path: Path) -> int:
    try:
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    except OSError:
        return 0


def _state_bytes(sd: Any) -> int:
    """Bytes of the tensors this rank saves (ShardedTensor.data and plain tensors)."""
    if isinstance(sd, dict):
        return sum(_state_bytes(v) for v in sd.values())
    if isinstance(sd, (list, tuple)):
        return sum(_state_bytes(v) for v in sd)
    t = sd if isinstance(sd, torch.Tensor) else getattr(sd, "data", None)
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _disk_full(exc: BaseException, ckpt_root: Path, iteration: int, estimate: int) -> str | None:
    """The message for a save that failed because its filesystem is full, or None when that is
    not why. torch's writer does not always keep the errno (a short write surfaces as
    "unexpected pos ..."), so the free space decides too: less than the save still needed."""
    d = iter_dir(ckpt_root, iteration)
    named = any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)
                or "No space left on device" in str(e) or "Disk quota exceeded" in str(e)
                for e in _causes(exc))
    try:
        free = shutil.disk_usage(d if d.exists() else ckpt_root).free
    except OSError:
        free = None
    prev = latest_iteration(ckpt_root)
    prev_dir = iter_dir(ckpt_root, prev) if prev is not None else None
    needed = (_tree_bytes(prev_dir) if prev_dir else 0) or estimate
    written = _tree_bytes(d)
    if not named and (free is None or free >= max(needed - written, 1 << 20)):
        return None
    where = f"{free / MB:.1f} MB free" if free is not None else "free space unknown"
    good = (f"{TRACKER} still names iteration {prev} ({prev_dir}), a complete checkpoint"
            if prev_dir else f"there is no earlier checkpoint in {ckpt_root}")
    again = (f"resume: the run continues from iteration {prev}" if prev_dir
             else "run again: it starts from iteration 0")
    return (f"checkpoint of iteration {iteration} could not be written to {d}: the disk is full "
            f"(ENOSPC, no space left on device): {where} on that filesystem, a checkpoint needs "
            f"about {needed / MB:.1f} MB. {good}. Fix: free space there (the unfinished {d.name} "
            f"holds {written / MB:.1f} MB and can be deleted; `labkit clean` removes your "
            f"finished runs' checkpoints) or save to a bigger disk (--save DIR), then {again} "
            f"(`labkit submit CONFIG --resume`; plain torchrun resumes unless --no-resume)")


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
    try:
        common = dist_checkpointing.load_common_state_dict(str(d))
        # RNG states are per rank: only meaningful when the layout is the one that saved them.
        same_layout = list(common.get("layout", [])) == list(layout)
        extra = {"iteration": 0, "consumed_samples": 0, "layout": list(layout)}
        sd = _sharded_state(model, optimizer, scheduler, extra, is_loading=True,
                            with_rng=same_layout)
        state = dist_checkpointing.load(sd, str(d))
    except (Exception, CheckpointException) as exc:  # the latter is a BaseException
        bad = damaged_files(d)
        if not bad and not any(isinstance(e, (EOFError, pickle.UnpicklingError))
                               for e in _causes(exc)):
            raise
        raise CheckpointError(_unreadable(ckpt_root, it, bad, exc)) from exc
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


def damaged_files(d: Path) -> list[str]:
    """What is wrong with the files of checkpoint folder ``d`` (empty when nothing is seen):
    missing files, and files shorter than the checkpoint's own index (``.metadata``) says."""
    from torch.distributed.checkpoint import FileSystemReader

    bad = [f"{n} is missing" for n in ("metadata.json", "common.pt", ".metadata")
           if not (d / n).is_file()]
    try:
        index = FileSystemReader(str(d)).read_metadata().storage_data
    except Exception as e:  # noqa: BLE001 - any unreadable index is the finding itself
        return bad or [f".metadata cannot be read ({type(e).__name__}: {str(e)[:80]})"]
    ends: dict[str, int] = {}
    for info in index.values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(ends.items()):
        size = (d / name).stat().st_size if (d / name).is_file() else None
        if size is None:
            bad.append(f"{name} is missing")
        elif size < end:
            bad.append(f"{name} is truncated: {size} bytes, the checkpoint's index says {end}")
    return bad


def _unreadable(ckpt_root: Path, it: int, bad: list[str], exc: BaseException) -> str:
    """The message for a checkpoint that cannot be loaded: the files, and the one before it."""
    d = iter_dir(ckpt_root, it)
    why = "; ".join(bad) if bad else f"{type(exc).__name__} while reading it"
    older = sorted((int(p.name[5:]) for p in ckpt_root.glob("iter_*")
                    if p.name[5:].isdigit() and int(p.name[5:]) < it), reverse=True)
    good = next((i for i in older if not damaged_files(iter_dir(ckpt_root, i))), None)
    head = f"checkpoint {d} is truncated or corrupt and cannot be loaded ({why})"
    if good is None:
        return (f"{head}; there is no earlier complete checkpoint in {ckpt_root}. Fix: start over "
                f"with --no-resume (labkit: `labkit submit CONFIG --overwrite`), which moves "
                f"{ckpt_root.name}/ aside")
    return (f"{head}. The previous checkpoint, iteration {good} ({iter_dir(ckpt_root, good)}), is "
            f"complete. Fix: resume from it: `echo {good} > {ckpt_root / TRACKER}`, then run "
            f"again (its save at iteration {it} moves the damaged {d.name} aside); or start over "
            f"with --no-resume")
