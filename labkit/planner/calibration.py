"""The time estimate calibrated from what this machine or cluster measured.

The planner's ``HARDWARE`` figures are typical ones; on a 2-core laptop or a real cluster they
can rank layouts in the wrong order (on CPU processes a tensor-parallel all-reduce costs
milliseconds of latency that no bandwidth figure shows). The series measures what the estimate
needs, and each measurement is stored with its run as ``<run dir>/calibration.json``:

* ``save_compute_calibration(run_dir, cfg, iteration_ms)``: a training run's median iteration
  time (notebook 01). One rank's compute speed is its hardware FLOPs over the time left when
  the estimated communication of that very run is taken off; on CPU processes it is the time
  per layer and microbatch instead (per-operator overhead, not FLOPs, dominates there: a TP
  rank runs as many operators as a whole model, each half as large).
* ``save_link_calibration(run_dir, busbw, ...)``: the all-reduce benchmark's rows (notebook 03):
  per scope (``intra`` a node, ``inter`` across nodes) the best bus bandwidth and the fixed
  latency of a small message.

``calibrated_hardware(cfg)`` reads the newest of each for the config's device back (``labkit
plan`` does, and notebook 06) and returns a ``Hardware``; without measurements it returns the
typical figures, whose ``calibrated`` is False and whose estimate says UNCALIBRATED.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from labkit.config import RunConfig
from labkit.errors import LabkitError
from labkit.paths import run_root
from labkit.planner.flops import (
    HARDWARE,
    Hardware,
    bubble_fraction,
    estimate_iteration_time,
    flops_per_iteration,
    hardware_flops_per_iteration,
    ranks_per_host,
)

CALIBRATION_FILE = "calibration.json"
_SMALL_MESSAGES = 3  # the latency is read from the benchmark's smallest messages


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _write(run_dir: str | Path, key: str, entry: dict[str, Any]) -> dict[str, Any]:
    path = Path(run_dir) / CALIBRATION_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text()) if path.is_file() else {}
    data[key] = entry
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return entry


def default_hardware(device: str) -> Hardware:
    """The typical (uncalibrated) figures for a device: ``h100-80gb`` on cuda, else ``cpu-lab``."""
    return HARDWARE["h100-80gb" if device == "cuda" else "cpu-lab"]


def save_compute_calibration(run_dir: str | Path, cfg: RunConfig, iteration_ms: float) -> dict[str, Any]:
    """Store a finished run's median iteration time (ms) with its config, for the estimate."""
    if not iteration_ms or not iteration_ms > 0:
        raise LabkitError(f"iteration_ms must be a positive time in ms (got {iteration_ms!r}); "
                          f"pass the run's median iteration time, e.g. lab.steady_median(...)")
    entry = {"run": Path(run_dir).name, "device": cfg.device, "precision": cfg.precision,
             "backend": cfg.backend, "iteration_s": iteration_ms / 1e3,
             "ranks_per_host": ranks_per_host(cfg),
             "cores_per_host": os.cpu_count() if cfg.device == "cpu" else None,
             "host": socket.gethostname(), "measured_at": _now(), "config": cfg.to_dict()}
    return _write(run_dir, "compute", entry)


def _records(busbw: Any) -> list[Mapping[str, Any]]:
    if hasattr(busbw, "to_dict"):  # a DataFrame of labkit.measured.comm.read_busbw
        return list(busbw.to_dict("records"))
    return list(busbw)


def link_figures(busbw: Any) -> dict[str, dict[str, float]]:
    """Per scope (``intra``, ``inter``) of all-reduce rows, the two figures of a link: a fixed
    ``latency_s`` per collective (the median time of the smallest messages) and the bus bandwidth
    ``gbps`` the largest message moved at once that latency is paid. Rows need ``scope``,
    ``size_bytes``, ``time_us``, ``busbw_gbps`` (``labkit.measured.comm.read_busbw``)."""
    out: dict[str, dict[str, float]] = {}
    rows = [r for r in _records(busbw) if r.get("op", "all_reduce") in (None, "all_reduce")]
    for scope in ("intra", "inter"):
        mine = sorted((r for r in rows if r.get("scope") == scope and r.get("time_us")
                       and r.get("busbw_gbps")), key=lambda r: r["size_bytes"])
        if not mine:
            continue
        # what each rank moved: busbw x time (= 2 (n-1)/n x the message for an all-reduce)
        moved = [float(r["busbw_gbps"]) * 1e9 * r["time_us"] * 1e-6 for r in mine]
        times = [r["time_us"] * 1e-6 for r in mine]
        small = times[:_SMALL_MESSAGES] if len(mine) > 1 else times
        latency = statistics.median(small)
        if len(mine) > 1 and times[-1] > latency:
            gbps = moved[-1] / (times[-1] - latency) / 1e9
        else:  # the largest message was no slower than the small ones: noise, keep the best seen
            gbps = max(float(r["busbw_gbps"]) for r in mine)
        latency = max(0.0, statistics.median(
            t - m / (gbps * 1e9) for t, m in zip(small, moved, strict=False)))
        out[scope] = {"gbps": gbps, "latency_s": latency,
                      "group_size": int(mine[0].get("group_size") or 0)}
    return out


def save_link_calibration(run_dir: str | Path, busbw: Any, *, device: str, backend: str
                          ) -> dict[str, Any]:
    """Store the all-reduce benchmark's link figures (``link_figures``) with its run."""
    figures = link_figures(busbw)
    if not figures:
        raise LabkitError("no all-reduce rows of scope 'intra' or 'inter' with a time and a bus "
                          "bandwidth; pass the benchmark's rows (labkit.measured.comm.read_busbw)")
    entry = {"run": Path(run_dir).name, "device": device, "backend": backend, **figures,
             "host": socket.gethostname(), "measured_at": _now()}
    return _write(run_dir, "links", entry)


def load_calibration(device: str, *, precision: str | None = None,
                     root: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """The newest ``compute`` (of that device and precision) and ``links`` (of that device)
    measurements under the run root (``runs/*/calibration.json``); a key is absent when none."""
    base = Path(root) if root is not None else run_root()
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(base.glob(f"*/{CALIBRATION_FILE}")) if base.is_dir() else []:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a file being written, or not ours: the estimate stays uncalibrated
        for key, entry in data.items():
            if key not in ("compute", "links") or not isinstance(entry, dict):
                continue
            if entry.get("device") != device:
                continue
            if key == "compute" and precision is not None and entry.get("precision") != precision:
                continue
            if key not in found or entry.get("measured_at", "") >= found[key].get("measured_at", ""):
                found[key] = entry
    return found


def hardware_from(measured: Mapping[str, Mapping[str, Any]], device: str) -> Hardware:
    """A Hardware from ``load_calibration``'s entries; what was not measured stays typical."""
    hw = default_hardware(device)
    fields: dict[str, Any] = {"name": hw.name, "peak_tflops": hw.peak_tflops,
                              "efficiency": hw.efficiency,
                              "intra_node_gbps": hw.intra_node_gbps,
                              "inter_node_gbps": hw.inter_node_gbps}
    sources = []
    links = measured.get("links")
    if links:
        for scope, prefix in (("intra", "intra_node"), ("inter", "inter_node")):
            if scope in links:
                fields[f"{prefix}_gbps"] = float(links[scope]["gbps"])
                fields[f"{prefix}_latency_s"] = float(links[scope]["latency_s"])
        sources.append(f"links: {links.get('run', '?')}")
    compute = measured.get("compute")
    if compute:
        cfg = RunConfig.from_dict(compute["config"])
        t = float(compute["iteration_s"])
        # the run's own communication, on the links as measured (or typical), is not compute
        comm = sum(estimate_iteration_time(cfg, Hardware(**fields))["comm_s"].values())
        busy = max(t - comm, 0.2 * t) / (1 + bubble_fraction(cfg))
        fields.update(peak_tflops=hardware_flops_per_iteration(cfg) / cfg.world_size / busy / 1e12,
                      efficiency=1.0, measured_ranks_per_host=int(compute["ranks_per_host"]),
                      cores_per_host=compute.get("cores_per_host"))
        if device == "cpu":  # per-operator overhead, not FLOPs, sets a CPU rank's time
            recompute = hardware_flops_per_iteration(cfg) / flops_per_iteration(cfg)
            units = cfg.num_microbatches * cfg.num_layers / cfg.pp * recompute
            fields["layer_microbatch_s"] = busy / units
        sources.insert(0, f"compute: {compute.get('run', '?')}")
    if sources:
        fields["name"] = f"measured ({device})"
    return Hardware(**fields, calibrated_from=tuple(sources))


def calibrated_hardware(cfg: RunConfig, *, root: str | Path | None = None) -> Hardware:
    """The figures for ``cfg``'s device: measured on this machine or cluster where the series
    stored measurements under the run root, else typical (``Hardware.calibrated`` is False)."""
    return hardware_from(load_calibration(cfg.device, precision=cfg.precision, root=root),
                         cfg.device)


def describe(hw: Hardware) -> str:
    """One line for a notebook or ``labkit plan``: what the time estimate rests on."""
    if hw.calibrated:
        return f"time estimate calibrated from {', '.join(hw.calibrated_from)}"
    return (f"time estimate UNCALIBRATED: typical figures of {hw.name}; measure this machine "
            f"with notebooks 01 (compute) and 03 (links)")


def order_by_estimate(configs: Iterable[RunConfig], hw: Hardware) -> list[tuple[RunConfig, float]]:
    """The configs with their estimated iteration time (s), fastest first."""
    return sorted(((c, estimate_iteration_time(c, hw)["iteration_s"]) for c in configs),
                  key=lambda x: x[1])
