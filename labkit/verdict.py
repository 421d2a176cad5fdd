"""The verdict of ``labkit regress``: each recorded metric against its baseline.

Deterministic outcomes are judged strictly: a notebook that fails, an exercise check that is
not true, a baseline metric that is missing, a diagnosis or an OOM outcome that changed, a loss
outside its tolerance, an arithmetic figure (the bubble fraction) that moved.

Timings are judged one-sided and noise-aware. Slower is a regression, faster never is. A
timing is the median of the steady iterations (``labkit.record.record_run``). Against a
baseline of one run its limit is the metric's tolerance (3 x). Against a baseline of at least
three runs (``"runs": [...]``, the median as ``value``) the limit comes from their spread: the
median plus the larger of SPREAD_K x the slowest run's distance from the median and
SPREAD_FLOOR of the median, so a 25 % slowdown on a site whose runs agree within a few percent
fails. Either limit is multiplied by the machine's load measured around the notebook in the
same regress run (``labkit.regress.machine_load``: 2.0 when other work holds half of the
cores), relative to the load recorded with the baseline.

Ratios of two noisy timings (weak-scaling efficiency, communication share, speedups) are
reported, not judged: on the local backend both "nodes" share one machine's cores, and the
ratio moves with whatever else runs. They are judged (one-sided) only when the baseline says
``"judge_ratios": true`` and was taken on the same non-local backend and cluster as this run.

Every metric gets a row with its verdict (``judged`` or ``reported``) and status.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FAILING = ("REGRESSION", "FAILED", "MISSING")
# A limit from baseline runs: median x (1 + max(SPREAD_K x (slowest / median - 1), SPREAD_FLOOR)),
# taken from at least SPREAD_MIN_RUNS runs (fewer say little about the spread: the tolerance holds)
SPREAD_K = 2.0
SPREAD_FLOOR = 0.15
SPREAD_MIN_RUNS = 3

# (metric-name suffix, kind, direction, tolerance), first match wins. "up": a rise beyond
# tol x baseline is a regression; "down": a fall below baseline / tol; "both": a relative
# change beyond tol either way; "equal": must equal the baseline.
RULES: list[tuple[str, str, str, float]] = [
    ("_ms", "time", "up", 3.0),
    ("_s", "time", "up", 3.0),
    ("_per_sec", "time", "down", 3.0),
    ("_gbps", "time", "down", 3.0),
    ("_mb", "memory", "up", 1.5),
    ("_gb", "memory", "up", 1.5),
    ("efficiency", "ratio", "down", 1.5),
    ("speedup", "ratio", "down", 1.5),
    ("_share", "ratio", "up", 1.5),
    ("_ratio", "ratio", "both", 1.5),
    ("loss", "value", "both", 0.15),
    ("fraction", "value", "both", 0.05),  # arithmetic (the planner's bubble): tight
    ("_iterations", "value", "equal", 0.0),
]


@dataclass(frozen=True)
class Rule:
    kind: str  # exercise | equal | time | memory | ratio | value
    direction: str  # up | down | both | equal
    tol: float


@dataclass
class Row:
    notebook: str
    metric: str
    value: Any
    baseline: Any
    rule: str
    verdict: str  # judged | reported
    status: str  # ok | REGRESSION | FAILED | MISSING | new | -


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def rule_for(metric: str, spec: dict[str, Any] | None = None) -> Rule:
    """The rule for a metric, by its name; a baseline entry may override direction and tol."""
    spec = spec or {}
    leaf = metric.split(".")[-1]
    if metric.startswith("exercise.") or leaf.startswith("exercise"):
        return Rule("exercise", "equal", 0.0)
    if "value" in spec and not _number(spec["value"]):  # a diagnosis, a bool, a string
        return Rule("equal", "equal", 0.0)
    kind, direction, tol = next(((k, d, t) for suffix, k, d, t in RULES if leaf.endswith(suffix)),
                                ("value", "both", 0.25))
    return Rule(spec.get("kind", kind), spec.get("direction", direction),
                float(spec.get("tol", tol)))


def ratios_judged(baseline: dict[str, Any], backend: str | None,
                  cluster: str | None) -> tuple[bool, str]:
    """Whether ratios of timings are judged in this run, and why (for the rule column)."""
    backend = backend or "local"
    if not baseline.get("judge_ratios"):
        return False, "ratio of timings: reported"
    b_backend = baseline.get("backend") or "local"
    if backend == "local" or b_backend == "local":
        return False, "ratio of timings on the local backend: reported"
    if (b_backend, _cluster_name(baseline.get("cluster"))) != (backend, _cluster_name(cluster)):
        return False, (f"ratio of timings: reported (baseline from {b_backend}/"
                       f"{baseline.get('cluster')}, this run {backend}/{cluster})")
    return True, ""


def _cluster_name(c: Any) -> str | None:
    return None if c is None else Path(str(c)).stem


def _limit(base: float, rule: Rule, runs: list[float] | None, load: float) -> tuple[float, str]:
    """(limit factor, its description) of a one-sided timing rule."""
    factor, why = rule.tol, f"{rule.tol:g}"
    nums = [float(v) for v in runs or () if _number(v) and v > 0]
    if len(nums) >= SPREAD_MIN_RUNS:
        med = statistics.median(nums)
        worst = max(nums) / med if rule.direction == "up" else med / min(nums)
        factor = 1.0 + max(SPREAD_K * (worst - 1.0), SPREAD_FLOOR)
        why = (f"{factor:.2f} (spread of {len(nums)} runs: median + max({SPREAD_K:g} x spread, "
               f"{SPREAD_FLOOR:.0%}))")
    if load > 1.0:
        factor *= load
        why += f" x load {load:.2f}"
    return factor, why


def judge(value: Any, base: Any, rule: Rule, *, runs: list[float] | None = None,
          load: float = 1.0) -> tuple[bool, str]:
    """(passes, the rule as text) of one metric present in both the run and the baseline."""
    if rule.kind == "exercise":
        return value is True, "must be true"
    if rule.direction == "equal" or not _number(base):
        return value == base, "== baseline"
    if not _number(value):
        return False, "a number"
    if rule.kind in ("time", "ratio") and rule.direction in ("up", "down"):
        factor, why = _limit(float(base), rule, runs, load if rule.kind == "time" else 1.0)
        if rule.direction == "up":
            return value <= base * factor, f"<= {why} x baseline; faster never fails"
        return value >= base / factor, f">= baseline / ({why}); faster never fails"
    if rule.direction == "up":
        return value <= base * rule.tol, f"<= {rule.tol:g} x baseline"
    if rule.direction == "down":
        return value >= base / rule.tol, f">= baseline / {rule.tol:g}"
    return abs(value - base) <= rule.tol * abs(base), f"within {rule.tol:.0%}"


def compare(results: list[Any], baseline: dict[str, Any], *, backend: str | None = None,
            cluster: str | None = None) -> list[Row]:
    """One row per metric of each notebook result (and one per failed notebook).

    ``results`` are ``labkit.regress.NotebookResult``-like (``notebook``, ``ok``, ``metrics``,
    ``load``); ``baseline`` is a baseline document (``baselines/cpu.json``).
    """
    base_nbs: dict[str, dict[str, Any]] = baseline.get("notebooks", {})
    base_loads: dict[str, float] = baseline.get("loads", {})
    judge_ratios, ratio_note = ratios_judged(baseline, backend, cluster)
    rows: list[Row] = []
    for r in results:
        if not r.ok:
            rows.append(Row(r.notebook, "(notebook)", "failed", "ran", "runs to the end",
                            "judged", "FAILED"))
        base = base_nbs.get(r.notebook, {})
        load = max(1.0, float(getattr(r, "load", 1.0) or 1.0)
                   / float(base_loads.get(r.notebook, 1.0) or 1.0))
        for metric in sorted(set(r.metrics) | set(base)):
            spec = base.get(metric)
            spec = spec if isinstance(spec, dict) else {"value": spec}
            rule = rule_for(metric, spec)
            value = r.metrics.get(metric)
            if metric not in base:
                if rule.kind == "exercise" and value is not True:
                    rows.append(Row(r.notebook, metric, value, None, "must be true", "judged",
                                    "FAILED"))
                else:
                    rows.append(Row(r.notebook, metric, value, None, "not in the baseline",
                                    "reported", "new"))
            elif metric not in r.metrics:
                reason = "recorded by the baseline run" if r.ok else "the notebook failed first"
                rows.append(Row(r.notebook, metric, None, spec["value"], reason, "judged",
                                "MISSING" if r.ok else "FAILED"))
            elif spec.get("value") is None and rule.kind != "exercise":
                rows.append(Row(r.notebook, metric, value, None, "no baseline value (not finite)",
                                "reported", "-"))
            elif rule.kind == "ratio" and not judge_ratios:
                rows.append(Row(r.notebook, metric, value, spec["value"], ratio_note, "reported",
                                "-"))
            else:
                ok, text = judge(value, spec["value"], rule, runs=spec.get("runs"), load=load)
                rows.append(Row(r.notebook, metric, value, spec["value"], text, "judged",
                                "ok" if ok else "REGRESSION"))
    return rows


def passed(rows: list[Row]) -> bool:
    return not any(r.status in FAILING for r in rows)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def _change(r: Row) -> str:
    if _number(r.value) and _number(r.baseline) and r.baseline:
        return f"x{r.value / r.baseline:.2f}"
    return ""


def render_table(rows: list[Row]) -> str:
    """A markdown table of the comparison, every metric with its verdict (pure)."""
    head = ("| notebook | metric | value | baseline | change | rule | verdict | status |\n"
            "|---|---|---|---|---|---|---|---|")
    body = [f"| {r.notebook} | {r.metric} | {_fmt(r.value)} | {_fmt(r.baseline)} | {_change(r)} "
            f"| {r.rule} | {r.verdict} | {r.status} |" for r in rows]
    return "\n".join([head, *body])
