"""Training logs -> DataFrames and a diagnosis (Megatron-LM, Megatron-DeepSpeed, gpt-neox,
DeepSpeed and its launcher, the Hugging Face Trainer, NCCL, torchrun, Slurm).

    parse_log(path) -> ParsedLog              .iterations .memory .validation .params .nccl
                                               .failures (DataFrames), .layout, .to_dict();
                                               a list of paths is one run (e.g. per-rank logs)
    parse_lines(lines) -> ParsedLog           the same from lines already in memory
    parse_run(run_dir) -> ParsedLog           the same, RunConfig fields joined as columns
    load_runs(run_dirs) -> DataFrame          iterations of many runs (groupby(["tp", "pp"]))
    diagnose(log, exit_code=, job_state=)     list[Failure], most likely root cause first
    detect_hang(log, timeout_s=, now=)        Failure("hang") or None, while a job runs
"""

from __future__ import annotations

import pandas as pd

from labkit.logs.diagnosis import detect_hang, diagnose, last_progress
from labkit.logs.failures import KINDS, Failure
from labkit.logs.findings import found_nothing
from labkit.logs.lines import Line, clean_line, iter_lines
from labkit.logs.parse import ParsedLog, parse_lines, parse_log
from labkit.logs.runs import load_runs, parse_run

__all__ = ["KINDS", "Failure", "Line", "ParsedLog", "clean_line", "detect_hang", "diagnose",
           "found_nothing", "iter_lines", "last_progress", "load_runs", "parse_lines", "parse_log",
           "parse_run", "summary"]


def summary(p: ParsedLog) -> str:
    """A few human lines about a parsed log (what ``labkit parse`` prints without ``--json``)."""
    lay = ", ".join(f"{k}={v}" for k, v in p.layout.items() if v is not None) or "unknown"
    out = [f"layout: {lay}"]
    its = p.iterations
    if not its.empty:
        last = its.iloc[-1]
        of = f"/{last['train_iters']}" if pd.notna(last["train_iters"]) else ""
        parts = [f"iterations: {len(its)} (last {last['iteration']}{of})"]
        for col, fmt in (("elapsed_ms", "median {:.1f} ms/iteration"),
                         ("tokens_per_sec", "median {:,.0f} tokens/s"),
                         ("tokens_per_gpu_per_sec", "median {:,.0f} tokens/s/GPU"),
                         ("mfu", "median MFU {:.2f} %")):
            if col in its and its[col].notna().any():
                parts.append(fmt.format(its[col].median()))
        parts.append(f"last lm loss {last['lm_loss']}")
        out.append(", ".join(parts))
    if not p.memory.empty:
        peaks = [f"peak {c.replace('_mb', '').replace('_', ' ')} {p.memory[c].max():.1f} MB"
                 for c in ("max_allocated_mb", "max_reserved_mb", "reserved_mb") if p.memory[c].notna().any()]
        out.append(f"memory reports: {len(p.memory)}" + (f" ({', '.join(peaks)})" if peaks else ""))
    if p.nccl_version or not p.nccl.empty:
        out.append(f"NCCL {p.nccl_version}: {p.to_dict()['nccl']['transports']}")
    for t in p.nccl_tests:
        bw = ", ".join(f"{r['size_bytes']} B {r['busbw_gbps']:g}" for r in t["rows"][:40]
                       if r["busbw_gbps"] is not None)
        out.append(f"nccl-tests {t['op'] or '(collective not named)'}: ranks {t['ranks'] or '?'}, "
                   f"{len(t['rows'])} sizes" + (f", busbw GB/s by size: {bw}" if bw else ""))
    for f in p.failure_records:
        where = f"rank {f.rank}, " if f.rank is not None else ""
        out.append(f"FAILURE {f.kind} ({where}line {f.line}): {f.message}\n  hint: {f.hint}")
    if not p.failure_records:
        out.append("failures: none found")
    for f in p.findings:
        out.append(f"FINDING {f['kind']} (line {f['line']}): {f['message']}")
    return "\n".join(out)
