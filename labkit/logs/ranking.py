"""The order of a log's failures: the most likely root cause first (DESIGN.md section 5)."""

from __future__ import annotations

from labkit.logs.failures import Failure


def _priority(f: Failure) -> int:
    if f.kind in ("gpu_oom", "cuda_error", "node_failure", "disk_full", "bad_checkpoint") or (
            f.kind == "host_oom" and f.evidence != "signal"):
        return 0
    if f.kind == "python_exception" and f.evidence not in ("comm", "cut", "stopping"):
        return 1
    if f.kind in ("nccl_timeout", "hang"):
        return 2
    if f.kind in ("time_limit", "preempted", "cancelled"):
        return 3
    if f.kind == "host_oom":  # inferred from SIGKILL only
        return 4
    if f.kind == "python_exception":  # a communication error's, one whose exception line is cut, or
        # one raised while a signal stopped the process
        return 5
    return 6  # child_failed


def rank_failures(failures: list[Failure]) -> list[Failure]:
    """Most likely root cause first; a SIGKILL guess is dropped when a Slurm event explains it."""
    explained = any(f.kind in ("time_limit", "preempted", "cancelled", "node_failure")
                    or (f.kind == "host_oom" and f.evidence != "signal") for f in failures)
    kept = [f for f in failures if not (explained and f.evidence == "signal")]
    return sorted(kept, key=lambda f: (_priority(f), f.line if f.line is not None else 1 << 62))
