"""Checks for the exercises that read a measurement: which groups of a layout cross nodes, what a
profiler breakdown says, which option fits a memory budget, what a failed run's log says.

They follow ``labkit.exercises``: a FIXME left in place gets the "replace FIXME" hint, a wrong
answer a hint with the student's own numbers and the rule (never the answer), and each outcome
is recorded for ``labkit regress``. ``CheckResult.value`` is what the notebook goes on with.
"""

from __future__ import annotations

from typing import Any

from labkit.exercises import CheckResult, _finish, _unfilled
from labkit.planner.grid import rank_grid


def check_crossing_axis(answer: Any, *, tp: int, pp: int, nodes: int,
                        gpus_per_node: int) -> CheckResult:
    """Which parallelism's groups span two nodes (``"tp"``, ``"dp"``, ``"pp"`` or a list)."""
    grid = rank_grid(nodes * gpus_per_node, tp=tp, pp=pp, gpus_per_node=gpus_per_node)
    crossing = grid.groups_crossing_nodes()
    want = sorted(a for a in ("tp", "dp", "pp") if crossing[a])
    reference = want[0] if len(want) == 1 else want
    if (r := _unfilled("crossing_axis", reference, crossing_axis=answer)) is not None:
        return r
    given = [answer] if isinstance(answer, str) else list(answer) if isinstance(
        answer, (list, tuple, set)) else [answer]
    named = sorted({str(a).lower() for a in given})
    problems = []
    unknown = [a for a in named if a not in ("tp", "dp", "pp")]
    if unknown:
        problems.append(f"{', '.join(map(repr, unknown))}: answer with \"tp\", \"dp\" or \"pp\" "
                        f"(or a list of them).")
    elif named != want:
        groups = grid.groups()
        for a in named:
            g = groups[a][0]
            where = ", ".join(f"rank {r} on node {grid.node_of(r)}" for r in g)
            stays = "stays inside one node" if not crossing[a] else "spans two nodes"
            problems.append(f"{a.upper()} group {g}: {where}; it {stays}.")
        problems.append(f"A group crosses the boundary when its ranks sit on different nodes; "
                        f"rank r sits on node r // {gpus_per_node}. Check the other groups of the "
                        f"grid the same way.")
    return _finish("crossing_axis", problems, f"{' and '.join(a.upper() for a in want)} groups "
                   f"span two nodes: their traffic uses the inter-node link.", answer, reference)


# Remedies for the phases of a profiler breakdown, and the phase each one shortens.
REMEDIES = {
    "more_ranks": ("compute", "split the same global batch over more ranks (strong scaling: a "
                              "larger DP or TP), so that each rank computes less"),
    "bf16": ("compute", "train in bf16 on GPUs: tensor cores run faster matmuls"),
    "overlap": ("communication", "overlap the gradient all-reduce with the backward pass"),
    "tp_inside_node": ("communication", "keep the chattiest groups on the fast link inside a node"),
    "more_microbatches": ("idle", "more microbatches per iteration, so a pipeline waits less"),
    "balance_stages": ("idle", "even out the work of the ranks, so none waits for a straggler"),
    "pinned_memory": ("memcpy", "pinned host memory and batches copied ahead of their use"),
}
_PHASES = ("compute", "communication", "memcpy", "idle")


def check_profile_reading(phase: Any, remedy: Any, *, breakdown: Any) -> CheckResult:
    """Which phase of a ``labkit.measured.profiling.profile_breakdown`` frame takes the most time (summed
    over ranks), and a remedy from ``REMEDIES`` that shortens that phase."""
    totals = {ph: float(breakdown[f"{ph}_ms"].sum()) for ph in _PHASES}
    whole = sum(totals.values()) or 1.0
    want = max(totals, key=totals.get)
    ref_remedy = next(k for k, (ph, _) in REMEDIES.items() if ph == want)
    if (r := _unfilled("profile_reading", (want, ref_remedy), phase=phase,
                       remedy=remedy)) is not None:
        return r
    problems = []
    if phase not in totals:
        problems.append(f"phase {phase!r}: answer with one of {', '.join(map(repr, _PHASES))}.")
    elif phase != want:
        problems.append(f"phase {phase!r} takes {totals[phase]:.1f} ms, {totals[phase] / whole:.0%} "
                        f"of the profiled time of all ranks; the dominant phase is the one with "
                        f"the largest share: compare the columns of the breakdown (or the bars).")
    if remedy not in REMEDIES:
        problems.append(f"remedy {remedy!r}: answer with one of {', '.join(map(repr, REMEDIES))}.")
    elif phase in totals and REMEDIES[remedy][0] != phase:
        problems.append(f"remedy {remedy!r} ({REMEDIES[remedy][1]}) shortens "
                        f"{REMEDIES[remedy][0]}, not {phase}.")
    return _finish("profile_reading", problems,
                   f"{want} takes {totals[want] / whole:.0%} of the profiled time; "
                   f"{REMEDIES.get(remedy, ('', ''))[1]} shortens it.", (phase, remedy),
                   (want, ref_remedy))


def _size(gb: float) -> str:
    return f"{gb:.3f} GB" if gb >= 1 else f"{gb * 1e3:.2f} MB"


def check_fits_budget(answer: Any, *, peak_gb: dict[str, float], budget_gb: float,
                      baseline: dict[str, float] | None = None) -> CheckResult:
    """Which option's predicted peak per rank fits under ``budget_gb``; ``baseline`` (the
    baseline's memory per component, GB) goes into the hint."""
    fitting = sorted(k for k, gb in peak_gb.items() if gb <= budget_gb)
    reference = fitting[0] if fitting else None
    if (r := _unfilled("fits_budget", reference, option=answer)) is not None:
        return r
    problems = []
    if answer not in peak_gb:
        problems.append(f"option {answer!r}: answer with one of {', '.join(map(repr, peak_gb))}.")
    elif answer not in fitting:
        parts = ""
        if baseline:
            big = sorted(baseline.items(), key=lambda kv: -kv[1])
            parts = " The baseline's memory per rank: " + ", ".join(
                f"{k} {_size(v)}" for k, v in big) + ". Which option shrinks the largest part, and by " \
                "how much?"
        problems.append(f"option {answer!r} is planned at {_size(peak_gb[answer])} per rank, over "
                        f"the budget of {_size(budget_gb)}.{parts}")
    return _finish("fits_budget", problems,
                   f"{answer!r} is planned at {_size(peak_gb.get(answer, 0.0))} per rank, within "
                   f"the budget of {_size(budget_gb)}.", answer, reference)


# What each failure kind leaves in a log (the rule a reader applies, for the hints).
SIGNS = {
    "gpu_oom": "'CUDA out of memory' / torch.OutOfMemoryError",
    "host_oom": "the CPU allocator's 'can't allocate memory', or a worker killed with SIGKILL (-9)",
    "nccl_timeout": "a collective's watchdog timeout ('Watchdog caught collective operation timeout')",
    "cuda_error": "'CUDA error: ...' from a kernel or the driver",
    "time_limit": "Slurm's 'CANCELLED ... DUE TO TIME LIMIT'",
    "preempted": "Slurm's 'DUE TO PREEMPTION'",
    "node_failure": "Slurm's 'DUE TO NODE FAILURE'",
    "child_failed": "torchrun's 'ChildFailedError' summary, which only repeats a worker's failure",
    "python_exception": "a Python traceback ending in an exception raised by the program itself",
    "cancelled": "a cancel (scancel, SIGTERM) with no error before it",
    "hang": "no new iteration line for a long time, and no error",
}


def check_diagnosis(answer: Any, *, failures: list[Any]) -> CheckResult:
    """The failure kind of a run read from its log (``labkit.logs.KINDS``) against
    ``labkit.logs.diagnose``'s first (most likely root-cause) failure."""
    want = failures[0].kind if failures else None
    if (r := _unfilled("diagnosis", want, cause=answer)) is not None:
        return r
    problems = []
    if answer not in SIGNS:
        problems.append(f"cause {answer!r}: answer with one of {', '.join(map(repr, SIGNS))}.")
    elif answer != want:
        first = failures[0] if failures else None
        where = (f" The first error the log shows is at line {first.line}"
                 f"{f' (rank {first.rank})' if first.rank is not None else ''}: read the last "
                 f"line of its traceback." if first is not None and first.line else "")
        problems.append(f"a {answer} leaves {SIGNS[answer]} in the log, and this log shows none."
                        f"{where}")
    return _finish("diagnosis", problems, f"{want}: {failures[0].message if failures else ''}",
                   answer, want)
