"""Collective bandwidth results -> DataFrame -> plot.

Reads what ``code/allreduce_bench.py`` writes (its ``--json-out`` JSON lines, or its printed
table) and the table printed by NVIDIA's nccl-tests (``all_reduce_perf`` and friends), whose
column layout the benchmark copies: ``size count type redop [root] time algbw busbw #wrong``,
then the same four for in-place. Bandwidths are GB/s (1e9 bytes per second), times microseconds.

    job = submit_bench("bw", nodes=2, gpus_per_node=2, backend="slurm", cluster=site)  # or "local"
    job.wait()
    df = read_busbw(job.run_dir)        # or a busbw.jsonl / a printed table / an nccl-tests log
    plot_busbw(df)                      # bus bandwidth vs message size, one line per op/scope
    peak_busbw(df)                      # the plateau per op/scope, e.g. intra vs inter node
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from labkit import jobs
from labkit.errors import ConfigError
from labkit.logs import nccltests, parse_log
from labkit.paths import CODE_DIR
from labkit.run.spec import JobSpec
from labkit.validate import text_problem

if TYPE_CHECKING:
    import matplotlib.pyplot as plt

    from labkit.backends.job import Job
    from labkit.site import ClusterProfile

BENCH = CODE_DIR / "allreduce_bench.py"

COLUMNS = ["op", "scope", "group_size", "nodes", "world_size", "backend", "dtype", "size_bytes",
           "count", "time_us", "algbw_gbps", "busbw_gbps", "wrong"]

# Our section header: "# op=all_reduce scope=inter group_size=2 ..."
_SECTION = re.compile(r"^#\s*op=(\S+)(.*)$")
_NCCL_TYPES = {"float": "float32", "half": "float16", "bfloat16": "bfloat16", "double": "float64"}


def parse_bench_text(text: str, *, op: str | None = None, scope: str = "world") -> pd.DataFrame:
    """Rows of a printed table (ours or nccl-tests'); ``op`` names the collective of an
    nccl-tests file (it does not print it), our own tables carry it in their headers."""
    rows: list[dict] = []
    section: dict = {"op": op, "scope": scope}
    columns: list[str] | None = None  # the last table header's (labkit.logs.nccltests reads both)
    for line in text.splitlines():
        m = _SECTION.match(line)
        if m:
            section = {"op": m.group(1), "scope": scope}
            for kv in m.group(2).split():
                k, _, v = kv.partition("=")
                section[k] = int(v) if v.isdigit() else v
            continue
        columns = nccltests.header_columns(line) or columns
        r = nccltests.parse_row(line, columns)
        if r is None or r.get("busbw_gbps") is None:
            continue
        row = {**section, **{k: r.get(k) for k in ("size_bytes", "count", "time_us", "algbw_gbps",
                                                    "busbw_gbps", "wrong")}}
        row.setdefault("dtype", _NCCL_TYPES.get(r.get("type"), r.get("type")))
        if r.get("inplace_busbw_gbps") is not None:
            row.update({k: r.get(k) for k in ("inplace_time_us", "inplace_algbw_gbps",
                                              "inplace_busbw_gbps", "inplace_wrong")})
        rows.append(row)
    return _frame(rows)


def read_busbw(path: str | Path, *, op: str | None = None) -> pd.DataFrame:
    """A results file -> one row per (op, scope, message size).

    ``.jsonl``/``.json`` files are the benchmark's ``--json-out``; a run directory means its
    ``busbw.jsonl``; anything else is read as a printed table (a job log that holds the
    benchmark's output, or an nccl-tests log).
    """
    p = Path(path)
    if p.is_dir():
        p = p / "busbw.jsonl"
    text = p.read_text()
    if p.suffix in (".jsonl", ".json"):
        return _frame([json.loads(line) for line in text.splitlines() if line.strip()])
    return parse_bench_text(text, op=op)


def _frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    for c in COLUMNS:
        if c not in df.columns:
            df[c] = None
    extra = [c for c in df.columns if c not in COLUMNS]
    return df[COLUMNS + extra]


def peak_busbw(df: pd.DataFrame) -> pd.DataFrame:
    """The highest bus bandwidth of each (op, scope) and the message size it was reached at."""
    idx = df.groupby(["op", "scope"], dropna=False)["busbw_gbps"].idxmax()
    out = df.loc[idx, ["op", "scope", "group_size", "size_bytes", "busbw_gbps"]]
    return out.reset_index(drop=True)


def plot_busbw(df: pd.DataFrame, *, by: tuple[str, ...] = ("op", "scope"),
               ax: plt.Axes | None = None) -> plt.Axes:
    """Bus bandwidth (GB/s) against message size (bytes, log scale), one line per ``by`` group.

    Intra-node (loopback / NVLink) and inter-node (the network) lines side by side show where
    a layout's traffic should go: the gap between them is why TP stays inside a node.
    """
    # matplotlib: only when a figure is drawn
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(6, 4))[1]
    keys = [k for k in by if k in df.columns]
    for key, g in df.groupby(keys, dropna=False) if keys else [("all", df)]:
        g = g.sort_values("size_bytes")
        label = " ".join(str(k) for k in key) if isinstance(key, tuple) else str(key)
        if "group_size" in g and g["group_size"].notna().all():
            label += f" (n={int(g['group_size'].iloc[0])})"
        ax.plot(g["size_bytes"], g["busbw_gbps"], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)",
           title="collective bus bandwidth")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(title=" / ".join(keys) if keys else None)
    return ax


def submit_bench(name: str = "busbw", *, nodes: int = 2, gpus_per_node: int = 2,
                 backend: str = "local", cluster: ClusterProfile | str | Path | None = None,
                 device: str = "cpu", ops: Sequence[str] = ("all_reduce",),
                 scopes: Sequence[str] = ("world", "intra", "inter"), min_bytes: str = "1K",
                 max_bytes: str = "4M", factor: int = 4, iters: int = 10, warmup: int = 2,
                 overwrite: bool = False) -> Job:
    """Submit ``code/allreduce_bench.py`` with its arguments as a labkit job (local or Slurm).

    The job is a program with arguments (a JobSpec), not a training run: its run directory
    holds ``job.sh``, ``log.txt`` and ``job.json``, and the results land in
    ``<run_dir>/busbw.jsonl`` (``read_busbw(job.run_dir)``). ``gpus_per_node`` processes per
    node: one per GPU with ``device="cuda"`` (NCCL), CPU processes otherwise (gloo). With NCCL
    the job exports ``NCCL_DEBUG=INFO`` and the benchmark adds ``NCCL_DEBUG_SUBSYS=INIT,NET``
    (``--nccl-debug``): its log shows which transport each channel took (``nccl_transports``).
    """
    texts = {"ops": ops, "scopes": scopes}
    problems = [f"{k}={v!r:.80} must be a list of names, e.g. ['all_reduce']"
                for k, v in texts.items() if isinstance(v, (str, bytes))]
    problems += [w for k, v in texts.items() if not isinstance(v, (str, bytes))
                 for i, x in enumerate(v) if (w := text_problem(f"{k}[{i}]", x))]
    problems += [w for k, v in {"min_bytes": min_bytes, "max_bytes": max_bytes}.items()
                 if (w := text_problem(k, v))]
    if problems:
        raise ConfigError("submit_bench(): " + "; ".join(problems))
    nccl = device == "cuda"  # its own transport lines in log.txt (NCCL_DEBUG=INFO)
    spec = JobSpec(name, nodes=nodes, gpus_per_node=gpus_per_node, device=device,
                   nccl_debug=nccl, layout=f"collective benchmark: {', '.join(ops)}")
    args = ["--ops", ",".join(ops), "--scopes", ",".join(scopes), "-b", min_bytes,
            "-e", max_bytes, "-f", str(factor), "-n", str(iters), "-w", str(warmup),
            "--backend", "nccl" if device == "cuda" else "gloo",
            "--json-out", "{run_dir}/busbw.jsonl", *(["--nccl-debug"] if nccl else [])]
    return jobs.submit(spec, backend=backend, cluster=cluster, overwrite=overwrite,
                           program=BENCH, program_args=args)


def nccl_transports(run_dir: str | Path) -> dict | None:
    """The NCCL section of a benchmark's (or a training run's) ``log.txt``: version and channel
    counts per transport (``{"version", "transports": {"P2P", "SHM", "NET"}, ...}``), or None
    when the log has no NCCL transport line (gloo, or NCCL_DEBUG unset)."""
    nccl = parse_log(Path(run_dir) / "log.txt").to_dict().get("nccl")
    return nccl if nccl and sum((nccl.get("transports") or {}).values()) else None
