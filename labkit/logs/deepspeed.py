"""DeepSpeed engine and launcher lines.

Engine (``[INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=0, lr=[0.0001], mom=[...]``)
and its throughput timer (``epoch=0/micro_step=10/global_step=10, RunningAvgSamplesPerSec=12.3,
CurrSamplesPerSec=12.5, MemAllocated=1.23GB, MaxMemAllocated=4.56GB``); the launcher prints the
hostfile's world (``WORLD INFO DICT: {'worker-0': [0, 1, 2, 3], ...}``) and
``dist_world_size=8``; the runner before it passes the same world base64-encoded
(``[runner.py:...] cmd = pdsh -S -f 1024 -w node1,node2 ... --world_info=eyJ...``). With pdsh every
line carries its host (``node1: [...] [INFO] [launch.py:146:main] ...``; lines.py removes it).

Its pipeline engine names every rank's coordinates (``Using topology: {ProcessCoord(pipe=0, data=0,
model=0): 0, ...}``), and gpt-neox's config its sizes by its own keys: both state the layout
(stated.py reads them with the other statements).

Steps numbers the records of one log: DeepSpeed's ``step=N`` lines, its timers, and the Hugging
Face Trainer's logging dicts (hf.py), which name no step of their own.
"""

from __future__ import annotations

import ast
import base64
import binascii
import json
import re
from typing import Any

from labkit.logs import hf, megatron
from labkit.logs.lines import Line

_STEP = re.compile(r"(?:\[Rank (\d{1,6})\] )?step=(\d{1,12}), skipped=(\d{1,12}), lr=\[([^\]]{0,400})\]")
_TIMER = re.compile(r"global_step=(\d{1,12}), RunningAvgSamplesPerSec=([0-9.eE+-]{1,30}), "
                    r"CurrSamplesPerSec=([0-9.eE+-]{1,30})")
# DeepSpeed <= 0.4: "0/10, SamplesPerSec=12.3"; 0.5 - 0.7: "0/10, RunningAvgSamplesPerSec=12.3,
# CurrSamplesPerSec=12.5" (epoch / global step), both with or without MemAllocated=.
_OLD_TIMER = re.compile(r"\] \d{1,9}/(\d{1,12}), (?:SamplesPerSec=([0-9.eE+-]{1,30})"
                        r"|RunningAvgSamplesPerSec=[0-9.eE+-]{1,30}, CurrSamplesPerSec=([0-9.eE+-]{1,30}))")
# The flops profiler's summary: "world size:      128", "data parallel size:      16"
_PROFILER = re.compile(r"^(world|data parallel) size:\s{1,80}(\d{1,9})\s{0,8}$")
_MEM = re.compile(r"MemAllocated=([0-9.]{1,20})GB, MaxMemAllocated=([0-9.]{1,20})GB")
_WORLD_INFO = re.compile(r"WORLD INFO DICT: (\{.{0,20000}\})")
_DIST_WS = re.compile(r"dist_world_size=(\d{1,9})")
_RUNNER_WORLD = re.compile(r"--world_info=([A-Za-z0-9_=+/-]{4,20000})")
_NNODES = re.compile(r"nnodes=(\d{1,6}), num_local_procs=(\d{1,6}), node_rank=(\d{1,6})")


def _f(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


MEMORY_KEYS = ("allocated_mb", "max_allocated_mb", "reserved_mb", "max_reserved_mb")


def take_memory(rec: dict[str, Any], rank: int | None) -> dict[str, Any] | None:
    """Move an iteration record's memory values (a DeepSpeed timer's, a Trainer dict's) into a
    memory row ``{rank, iteration, ...}``; None when it holds none."""
    mem = {k: rec.pop(k) for k in MEMORY_KEYS if k in rec}
    return {"rank": rec.get("rank", rank), "iteration": rec["iteration"], **mem} if mem else None


def parse_step(text: str) -> dict[str, Any] | None:
    """``step=10, skipped=0, lr=[...]`` -> iteration record (iteration, skipped, lr)."""
    if "step=" not in text and "SamplesPerSec=" not in text:
        return None
    m = _STEP.search(text)
    if m:
        first = m.group(4).split(",")[0]
        rec: dict[str, Any] = {"iteration": int(m.group(2)), "skipped": int(m.group(3)),
                               "lr": _f(first)}
        if m.group(1) is not None:
            rec["rank"] = int(m.group(1))
        return rec
    m = _TIMER.search(text)
    if m:
        rec = {"iteration": int(m.group(1)), "samples_per_sec": _f(m.group(3))}
    else:
        m = _OLD_TIMER.search(text)
        if m is None:
            return None
        # The count is the epoch's micro steps (one per forward/backward), the optimizer's
        # step only without gradient accumulation: Steps keeps it where a step= line says so.
        rec = {"iteration": int(m.group(1)), "samples_per_sec": _f(m.group(2) or m.group(3)),
               "micro_step": True}
    mm = _MEM.search(text, m.end())
    a, b = (_f(mm.group(1)), _f(mm.group(2))) if mm else (None, None)
    if a is not None and b is not None:  # DeepSpeed's GB are GiB; our MB are MiB, as Megatron's
        rec["allocated_mb"] = a * 1024
        rec["max_allocated_mb"] = b * 1024
    return rec


def starts_record(text: str) -> bool:
    """Whether a line is a step record of its own (a Megatron iteration line, a DeepSpeed ``step=``
    line or timer): it never continues another line's hard-wrapped record (SwissArmyTransformer
    prints its ``iteration N/M | ...`` records without Megatron's closing ``|``, the engine's next
    step and timer after them)."""
    return megatron.parse_iteration(text) is not None or (
        ("step=" in text or "SamplesPerSec=" in text) and parse_step(text) is not None)


def parse_launcher(text: str) -> dict[str, Any] | None:
    """Launcher world: ``{"world_size": n, "nodes": k}`` from whichever line says it."""
    if "WORLD INFO DICT" in text:
        m = _WORLD_INFO.search(text)
        if m:
            try:
                info = ast.literal_eval(m.group(1))
                slots = [s for v in info.values() for s in v]
                return {"world_size": len(slots), "nodes": len(info)}
            except (ValueError, SyntaxError, TypeError, AttributeError, MemoryError, RecursionError):
                return None
    if "world_info=" in text:
        world = _runner_world(text)
        if world is not None:
            return world
    if "dist_world_size=" in text:
        m = _DIST_WS.search(text)
        if m:
            return {"world_size": int(m.group(1))}
    if "nnodes=" in text:
        m = _NNODES.search(text)
        if m:
            return {"nodes": int(m.group(1)), "procs_per_node": int(m.group(2))}
    if " size:" in text:
        m = _PROFILER.match(text)
        if m:
            return {"world_size" if m.group(1) == "world" else "dp": int(m.group(2))}
    return None


def _runner_world(text: str) -> dict[str, int] | None:
    """The runner's ``--world_info=`` (urlsafe base64 of ``{"host": [slot, ...], ...}``)."""
    m = _RUNNER_WORLD.search(text)
    if m is None:
        return None
    try:
        info = json.loads(base64.urlsafe_b64decode(m.group(1)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(info, dict) or not all(isinstance(v, list) for v in info.values()):
        return None
    return {"world_size": sum(len(v) for v in info.values()), "nodes": len(info)}


class Steps:
    """Numbers the DeepSpeed and Trainer records of one log, never by guess.

    A ``step=N`` line is step N; a timer with ``global_step=N`` too, but after a ``step=M`` line of
    its process it is step M's (a resumed run's timers count from the resume). An old timer's ``E/N`` counts
    micro steps: it joins step N only right where a ``step=N`` line of the same process said N
    (no gradient accumulation), else it is no record. A Trainer dict naming no step takes the N
    of the ``step=N`` line its process printed just before it (the Trainer logs right after the
    optimizer step DeepSpeed printed); in a log without any step counter the dicts are numbered
    in order, 1, 2, ... per process (``numbered_in_order``, at the end of each file), and the
    same count from several processes is one step. Where the log counts steps, a dict that
    follows no step line (another node's copy, or a step DeepSpeed did not print) is left out.
    """

    def __init__(self) -> None:
        self.last: dict[tuple, int] = {}  # the last step=N of each process
        self.anchor: dict[tuple, int] = {}  # ... until a Trainer dict takes it
        self.counted = False
        self.unnumbered: list[tuple[tuple, dict[str, Any]]] = []
        self.memory: list[dict[str, Any]] = []  # the memory of timers that number no step

    def parse(self, line: Line) -> dict[str, Any] | None:
        """The line's iteration record, numbered; None if it is none (or not numbered yet)."""
        src = (line.rank, line.host)
        rec = parse_step(line.text)
        if rec is not None:
            if rec.pop("micro_step", False):
                if self.last.get(src) == rec["iteration"]:
                    return rec
                mem = take_memory(rec, line.rank)  # no step, but the memory it measured
                if mem is not None:
                    self.memory.append({**mem, "iteration": None})
                return None
            if "skipped" not in rec and src in self.last:  # a timer after its process's step=N line: that
                rec["iteration"] = self.last[src]  # step's (a resumed run's timer counts from its start)
            self.counted = self.counted or rec["iteration"] > 0  # step=0: the engine's build, no step yet
            if "skipped" in rec:
                self.last[src] = rec["iteration"]
                if rec["iteration"]:  # a Trainer dict follows an optimizer step: step=0 numbers none
                    self.anchor[src] = rec["iteration"]
            return rec
        rec = hf.parse_trainer_dict(line.text)
        if rec is None:
            return None
        if "iteration" in rec:
            self.counted = True
            return rec
        step = self.anchor.pop(src, None)
        if step is not None:
            rec["iteration"] = step
            return rec
        self.unnumbered.append((src, rec))
        return None

    def numbered_in_order(self) -> list[dict[str, Any]]:
        """At the end of a file: its Trainer dicts that no step counter numbered, 1, 2, ... per
        process; none where the log counts steps (their step is unknown)."""
        held, self.unnumbered = self.unnumbered, []
        if self.counted:
            return []
        seen: dict[tuple, int] = {}
        for src, rec in held:
            seen[src] = rec["iteration"] = seen.get(src, 0) + 1
        return [rec for _, rec in held]


# DeepSpeed's pipeline engine, on rank 0 of every pipelined run (Megatron-DeepSpeed, gpt-neox), names
# each rank's coordinates: ``Using topology: {ProcessCoord(pipe=0, data=0, model=0): 0, ...,
# ProcessCoord(pipe=1, data=7, model=0): 15}``; each axis's size is its largest coordinate + 1, and the
# ranks listed are the world. Read only where the line ends with its ``}`` (a line cut short lists a
# part of the world). An axis of another name (``sequence=``) of size above 1: no statement.
_TOPOLOGY = re.compile(r"Using topology: \{((?:ProcessCoord\([a-z=\d, ]{1,80}\): \d{1,7}(?:, |\}))+)\s*$")
_COORD = re.compile(r"ProcessCoord\(([a-z=\d, ]{1,80})\): (\d{1,7})")
_AXES = {"pipe": "pp", "data": "dp", "model": "tp"}


def topology(text: str) -> dict[str, int]:
    """The layout of DeepSpeed's ``Using topology: {...}`` line (_TOPOLOGY), else empty."""
    m = _TOPOLOGY.search(text)
    if m is None:
        return {}
    largest: dict[str, int] = {}
    ranks = set()
    for coord, rank in _COORD.findall(m.group(1)):
        ranks.add(int(rank))
        for axis, _, value in (part.partition("=") for part in coord.split(", ")):
            largest[axis] = max(largest.get(axis, 0), int(value or 0))
    out = {_AXES[a]: v + 1 for a, v in largest.items() if a in _AXES}
    if any(v > 0 for a, v in largest.items() if a not in _AXES) or len(out) != len(_AXES) \
            or out["pp"] * out["dp"] * out["tp"] != len(ranks) or ranks != set(range(len(ranks))):
        return {}
    return {**out, "world_size": len(ranks)}


# gpt-neox's config keys: ``pipe-parallel-size`` (or ``pipe_parallel_size``; 0 is its setting for no
# pipeline) and ``model-parallel-size``, its tensor parallel size, printed together in a dict, JSON or
# YAML (``'pipe-parallel-size': 1, 'model-parallel-size': 1``). Read only where one line names both:
# NeMo's model_parallel_size alone is TP x PP.
_NEOX = re.compile(r"""(?<![\w-])['"]?(pipe|model)[-_]parallel[-_]size['"]?\s{0,2}[:=]\s{0,2}"""
                   r"(\d{1,6})(?![\d.])")


def neox_sizes(text: str) -> dict[str, int]:
    """TP and PP from a gpt-neox config's keys on one line (_NEOX), else empty."""
    found = dict(_NEOX.findall(text))
    if set(found) != {"pipe", "model"}:
        return {}
    return {"pp": int(found["pipe"]) or 1, "tp": int(found["model"])}
