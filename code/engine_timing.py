"""What code/pretrain_gpt.py measures about itself: per-microbatch timings, tensor memory by
component, and the torch.profiler it runs with ``torch_profiler``.

Timeline: ``RUN_DIR/timeline/rank_N.jsonl``, one JSON line per forward or backward of one
microbatch of one model chunk on global rank N: ``{"iteration", "rank", "tp_rank", "pp_rank",
"dp_rank", "chunk", "microbatch", "phase": "forward"|"backward", "start", "end"}`` (wall-clock
seconds, ``time.time()``; on CUDA from CUDA events, synchronised once at the start and once at
the end of each step). It times megatron-core's own ``schedules.forward_step`` /
``backward_step`` (wrapped while a training step runs), so the pipeline's waits for
activations and gradients from its neighbours fall outside them: they are the idle time.

Memory: ``RUN_DIR/memory/rank_N.json``. The static tensors by component, counted from the
objects themselves (distinct storages, each once): ``weights`` (the model's parameters),
``gradients`` (megatron-core's DDP grad buffers, ``main_grad``), ``optimizer`` (the optimizer's
state and fp32 master weights), ``other`` (megatron-core's global memory buffer: the unfused
attention's score buffer). ``activations``: what autograd saves for backward, counted by a
``saved_tensors_hooks`` pack hook per microbatch (parameters and the buffers above excluded)
and held from the microbatch's forward to the end of its backward; the peak over a step is the
largest sum in flight, plus what a backward saves again when it recomputes (activation
recompute; counted from when it is saved to when backward first uses it).
Per iteration also the process's RSS (and, on CUDA, the allocator's
allocated and peak). At the end ``live_tensors``: every live tensor's storage
(``engine_memory.live_tensor_bytes``), the check that the components account for it.

Profiler: ``torch_profiler`` records 3 iterations after 1 skipped and 1 warm-up into
``RUN_DIR/profile/rankN.json`` (Chrome trace). With ``torch_profiler_memory`` it records
iterations 1-2 instead (the optimizer state appears in the first step) with
``profile_memory=True``: every allocation and free is then a ``[memory]`` event with the bytes
allocated so far, and the forward/backward of each microbatch a ``labkit forward|backward
chunk C microbatch M`` annotation (``labkit.measured.profiling.memory_timeline`` reads both). The
profiler's own categorised ``export_memory_timeline`` needs ``with_stack``: on the cpu
profile's tiny model that made a 135 MB trace and minutes of analysis for two steps.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch


def _storage(t: torch.Tensor) -> tuple[int, int]:
    st = t.untyped_storage()
    return st.data_ptr(), st.nbytes()


def _distinct(tensors, exclude: set[int] | None = None) -> tuple[int, set[int]]:
    """Bytes of the distinct storages of ``tensors`` (not in ``exclude``) and their pointers."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            ptr, n = _storage(t)
            if ptr and (exclude is None or ptr not in exclude):
                seen[ptr] = max(seen.get(ptr, 0), n)
    return sum(seen.values()), set(seen)


def _unpack(x: torch.Tensor) -> torch.Tensor:
    return x


class Recorder:
    """Times the training steps' forward and backward passes and counts their tensors."""

    def __init__(self, cfg: Any, run_dir: Path, model: list, optimizer: Any, on_cuda: bool,
                 iteration: int):
        from megatron.core import parallel_state as ps
        from megatron.core.pipeline_parallel import schedules

        self.model, self.optimizer, self.on_cuda, self.iteration = model, optimizer, on_cuda, iteration
        rank = torch.distributed.get_rank()
        self.ids = {"rank": rank, "tp_rank": ps.get_tensor_model_parallel_rank(),
                    "pp_rank": ps.get_pipeline_model_parallel_rank(),
                    "dp_rank": ps.get_data_parallel_rank()}
        for sub in ("timeline", "memory"):
            (run_dir / sub).mkdir(parents=True, exist_ok=True)
        self.timeline_path = run_dir / "timeline" / f"rank_{rank}.jsonl"
        self.memory_path = run_dir / "memory" / f"rank_{rank}.json"
        if iteration == 0:  # a fresh run: no lines of an earlier one
            self.timeline_path.unlink(missing_ok=True)
        self.rows: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.active = False
        self.live: dict[int, int] = {}  # output tensor id -> saved bytes of that microbatch
        self.meta: dict[int, tuple[int, int | None]] = {}  # output tensor id -> (chunk, mb)
        self.order: list[int] = []  # forward order, for a backward whose output is not known
        self.peak = self.now = 0
        self._static_ptrs: set[int] = set()
        self._orig = (schedules, schedules.forward_step, schedules.backward_step)
        schedules.forward_step = self._forward_step
        schedules.backward_step = self._backward_step

    # --- clocks ------------------------------------------------------------------------------
    def _mark(self) -> Any:
        if not self.on_cuda:
            return time.time()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def _wall(self, mark: Any) -> float:
        if not self.on_cuda:
            return mark
        return self._base_wall + self._base.elapsed_time(mark) / 1000.0

    # --- the wrapped schedule functions ---------------------------------------------------
    def _forward_step(self, *args, **kwargs):
        orig = self._orig[1]
        if not self.active:
            return orig(*args, **kwargs)
        saved: dict[int, int] = {}
        static = self._static_ptrs

        def pack(x: torch.Tensor) -> torch.Tensor:
            ptr, n = _storage(x)
            if ptr not in static:
                saved[ptr] = max(saved.get(ptr, 0), n)
            return x.detach()  # never the tensor itself: that would tie it to its own graph

        chunk, mb = kwargs.get("vp_stage") or 0, kwargs.get("current_microbatch")
        start = self._mark()
        with torch.autograd.graph.saved_tensors_hooks(pack, _unpack), \
                torch.profiler.record_function(f"labkit forward chunk {chunk} microbatch {mb}"):
            out = orig(*args, **kwargs)
        end = self._mark()
        key = id(out[0][0] if isinstance(out[0], list) else out[0])
        self.live[key] = sum(saved.values())
        self.meta[key] = (chunk, mb)  # ids are reused once a tensor dies: only live ones here
        self.order.append(key)
        self.now += self.live[key]
        self.peak = max(self.peak, self.now)
        self.events.append({"phase": "forward", "chunk": chunk, "microbatch": mb,
                            "start": start, "end": end})
        return out

    def _backward_step(self, input_tensor, output_tensor, *args, **kwargs):
        orig = self._orig[2]
        if not self.active:
            return orig(input_tensor, output_tensor, *args, **kwargs)
        key = id(output_tensor[0] if isinstance(output_tensor, list) else output_tensor)
        if key not in self.live and self.order:
            key = self.order[0]
        chunk, mb = self.meta.pop(key, (0, None))
        # Activation recompute saves a layer's tensors again inside backward; each is used (and
        # then freed) when backward reaches that layer: count it from pack to first unpack.
        redone: dict[int, int] = {}
        cur, top, static = [0], [0], self._static_ptrs

        def pack(x: torch.Tensor) -> torch.Tensor:
            ptr, n = _storage(x)
            if ptr not in static and ptr not in redone:
                redone[ptr] = n
                cur[0] += n
                top[0] = max(top[0], cur[0])
            return x.detach()

        def unpack(x: torch.Tensor) -> torch.Tensor:
            cur[0] -= redone.pop(x.untyped_storage().data_ptr(), 0)
            return x

        start = self._mark()
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack), \
                torch.profiler.record_function(f"labkit backward chunk {chunk} microbatch {mb}"):
            grad = orig(input_tensor, output_tensor, *args, **kwargs)
        end = self._mark()
        self.peak = max(self.peak, self.now + top[0])
        self.now -= self.live.pop(key, 0)
        if key in self.order:
            self.order.remove(key)
        self.events.append({"phase": "backward", "chunk": chunk, "microbatch": mb,
                            "start": start, "end": end})
        return grad

    # --- steps -------------------------------------------------------------------------------
    def wrap(self, fwd_bwd):
        """megatron-core's forward-backward function, timed when it trains (not in evaluation)."""

        def timed(*args, **kwargs):
            if kwargs.get("forward_only"):
                return fwd_bwd(*args, **kwargs)
            self._begin()
            try:
                return fwd_bwd(*args, **kwargs)
            finally:
                self._end()

        return timed

    def _begin(self) -> None:
        if self.rows:
            self.rows[-1].update(self.static())  # after the previous step's optimizer step
        self._static_ptrs = self._static_storages()
        if self.on_cuda:
            torch.cuda.synchronize()
            self._base, self._base_wall = self._mark(), time.time()
        self.events, self.live, self.meta, self.order, self.peak, self.now = [], {}, {}, [], 0, 0
        self.active = True

    def _end(self) -> None:
        self.active = False
        self.iteration += 1
        if self.on_cuda:
            torch.cuda.synchronize()
        lines = []
        for e in self.events:
            lines.append(json.dumps({"iteration": self.iteration, **self.ids, "chunk": e["chunk"],
                                     "microbatch": e["microbatch"], "phase": e["phase"],
                                     "start": self._wall(e["start"]), "end": self._wall(e["end"])}))
        with open(self.timeline_path, "a") as f:
            f.write("".join(line + "\n" for line in lines))
        row: dict[str, Any] = {"iteration": self.iteration, "activations_peak": self.peak,
                               "rss": _rss()}
        if self.on_cuda:
            row.update(cuda_allocated=torch.cuda.memory_allocated(),
                       cuda_max_allocated=torch.cuda.max_memory_allocated())
        self.rows.append(row)

    # --- memory ------------------------------------------------------------------------------
    def _components(self) -> dict[str, list[torch.Tensor]]:
        params = [p for m in self.model for p in m.parameters()]
        grads = [g for p in params for g in (getattr(p, "main_grad", None), p.grad)
                 if isinstance(g, torch.Tensor)]
        for m in self.model:  # megatron-core's DDP keeps the grads in contiguous buffers
            for buf in list(getattr(m, "buffers", None) or []) + \
                    list(getattr(m, "expert_parallel_buffers", None) or []):
                if isinstance(getattr(buf, "grad_data", None), torch.Tensor):
                    grads.append(buf.grad_data)
        opt: list[torch.Tensor] = []
        for o in getattr(self.optimizer, "chained_optimizers", None) or [self.optimizer]:
            inner = getattr(o, "optimizer", o)
            for state in getattr(inner, "state", {}).values():
                opt += [v for v in state.values() if isinstance(v, torch.Tensor)]
            for group in getattr(inner, "param_groups", []):
                opt += list(group["params"])  # master weights; model weights drop out below
        other: list[torch.Tensor] = []
        try:
            from megatron.core import parallel_state as ps

            other = list(ps.get_global_memory_buffer().buffer.values())
        except (AssertionError, AttributeError):
            pass
        return {"weights": params, "gradients": grads, "optimizer": opt, "other": other}

    def _static_storages(self) -> set[int]:
        ptrs: set[int] = set()
        for tensors in self._components().values():
            ptrs |= _distinct(tensors)[1]
        return ptrs

    def static(self) -> dict[str, int]:
        """Bytes of weights, gradients, optimizer state and other static buffers, each storage
        counted once, in that order of precedence."""
        out, seen = {}, set()
        for name, tensors in self._components().items():
            out[name], ptrs = _distinct(tensors, seen)
            seen |= ptrs
        return out

    def close(self) -> None:
        """Restore megatron-core's schedule functions and write ``memory/rank_N.json``."""
        schedules, fwd, bwd = self._orig
        schedules.forward_step, schedules.backward_step = fwd, bwd
        from engine_memory import live_tensor_bytes

        static = self.static()
        if self.rows:
            self.rows[-1].update(static)
        peak = max((r["activations_peak"] for r in self.rows), default=0)
        doc = {**self.ids, "device": "cuda" if self.on_cuda else "cpu", "bytes": "bytes",
               "static": static, "activations_peak": peak,
               "live_tensors": live_tensor_bytes(self.on_cuda), "iterations": self.rows}
        self.memory_path.write_text(json.dumps(doc, indent=1) + "\n")


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def profiler(cfg: Any, rank: int, run_dir: Path, on_cuda: bool):
    """torch.profiler on the chosen ranks (see the module docstring), or None."""
    if not cfg.torch_profiler or rank not in cfg.torch_profiler_ranks:
        return None
    from torch.profiler import ProfilerActivity, profile, schedule

    out = run_dir / "profile"
    out.mkdir(parents=True, exist_ok=True)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    memory = bool(getattr(cfg, "torch_profiler_memory", False))
    if memory:
        when = schedule(wait=0, warmup=0, active=max(1, min(2, cfg.train_iters)), repeat=1)
    else:
        when = schedule(wait=1, warmup=1, active=max(1, min(3, cfg.train_iters - 2)), repeat=1)

    return profile(activities=acts, schedule=when, profile_memory=memory,
                   on_trace_ready=lambda p: p.export_chrome_trace(str(out / f"rank{rank}.json")))
