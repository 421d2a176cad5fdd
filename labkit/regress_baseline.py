"""A site's first baseline: ``labkit regress --runs N --baseline FILE``.

The pre-check of a GPU site compares the series with a baseline taken on that site, not with
the CPU one in ``baselines/cpu.json``. ``measure_baseline`` runs the chosen notebooks N times
(``OUT/run-1`` ... ``OUT/run-N``, each with its ``metrics.json`` as ``labkit regress`` writes
it) and writes the baseline from all of them: each numeric metric's ``value`` is the median
and ``runs`` keeps every run's value, so the timing limits come from the spread the site
showed (``labkit.verdict``: median + max(2 x spread, 15 %) from three runs or more) instead of
the 3 x that a single run gets. A notebook that fails in any run writes no baseline.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from labkit._logging import log
from labkit.paths import REPO_ROOT
from labkit.regress import (
    BASELINE_DIR,
    RegressError,
    _set_aside,
    list_notebooks,
    preflight,
    run_series,
    write_baseline,
)
from labkit.verdict import SPREAD_MIN_RUNS

__all__ = ["measure_baseline"]


def measure_baseline(notebooks: list[str] | None, runs: int, *, profile: str = "gpu",
                     backend: str | None = None, cluster: str | None = None,
                     baseline: str | Path | None = None, out: str | Path | None = None,
                     parameters: dict[str, Any] | None = None) -> Path:
    """Run the series ``runs`` times and write the baseline file from them; its path.

    ``baseline`` defaults to ``baselines/PROFILE.json`` (an existing file is kept beside it,
    renamed); ratios of timings are judged against it later only when it was taken on a
    non-local backend (``judge_ratios``).
    """
    if not isinstance(runs, int) or isinstance(runs, bool) or runs < 1:
        raise RegressError(f"--runs {runs!r}: give the number of times to run the series, at "
                           f"least 1 ({SPREAD_MIN_RUNS} or more for limits from their spread)")
    path = Path(baseline) if baseline else BASELINE_DIR / f"{profile}.json"
    if path.is_dir():
        raise RegressError(f"--baseline {path} is a folder; give the path of the baseline file")
    list_notebooks(notebooks)  # the names first: a typo must not move anything aside
    preflight(profile, backend)
    if runs < SPREAD_MIN_RUNS:
        log.warning("regress: %d run(s) give no spread; timings will be judged against 3 x the "
                    "baseline (--runs %d or more for limits from the runs' spread)",
                    runs, SPREAD_MIN_RUNS)
    out = (Path(out) if out else REPO_ROOT / "runs" / "regress").resolve()
    _set_aside(out)
    params = {**(parameters or {}), **({"cluster": str(cluster)} if cluster is not None else {})}
    metrics_files: list[Path] = []
    for i in range(1, runs + 1):
        run_out = out / f"run-{i}"
        log.info("regress: baseline run %d of %d into %s", i, runs, run_out)
        results = run_series(notebooks, profile=profile, backend=backend, out=run_out,
                             parameters=params, stop_on_failure=True)
        doc = {"profile": profile, "backend": backend or "local",
               "cluster": None if cluster is None else str(cluster), "out": str(run_out),
               "ok": all(r.ok for r in results), "notebooks": [asdict(r) for r in results]}
        (run_out / "metrics.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
        failed = [r for r in results if not r.ok]
        if failed:
            raise RegressError(f"baseline run {i} of {runs}: {failed[0].error}; no baseline "
                               f"written (fix the notebook or the site, then run again)")
        metrics_files.append(run_out / "metrics.json")
    return write_baseline(metrics_files, path, judge_ratios=(backend or "local") != "local")
