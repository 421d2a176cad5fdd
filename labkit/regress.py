"""``labkit regress``: run the notebook series with papermill and compare its metrics.

Instructors run it on their cluster before a workshop; CI and ``make lab`` run it on the cpu
profile. For each solved notebook (``notebooks/solutions/NN_*.ipynb``, in number order) it

1. executes the notebook with papermill (cwd = ``notebooks/``, ``-p profile/backend``),
   keeping the executed copy under ``OUT/notebooks/``;
2. collects the metrics the notebook recorded with ``record(name, value)`` (iteration time,
   final loss, peak memory, throughput, exercise checks) into ``OUT/metrics.json``;
3. compares them with a committed baseline (``baselines/<profile>.json``) within tolerances,
   prints a table, writes ``OUT/report.md`` with the key plots, and exits non-zero on a
   regression or a failed notebook. A failure names the notebook and the cell.

The verdicts (``labkit.verdict``): deterministic outcomes strictly; timings one-sided
(slower fails, faster never) against a limit widened by the baseline's spread and by the
machine's load measured around each notebook (``machine_load``); ratios of two timings
reported, judged only on the cluster a ``"judge_ratios": true`` baseline was taken on.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from labkit._logging import log
from labkit.backends.job import Job
from labkit.backends.ownership import refuse_if_live
from labkit.errors import LabkitError
from labkit.paths import NOTEBOOK_DIR, REPO_ROOT, run_root
from labkit.record import METRICS_ENV
from labkit.validate import read_json
from labkit.verdict import Row, compare, passed, render_table

__all__ = ["METRICS_ENV", "NotebookResult", "RegressError", "Row", "compare", "load_baseline",
           "machine_load", "regress", "render_report", "render_table", "run_notebook",
           "run_series", "write_baseline"]

BASELINE_DIR = REPO_ROOT / "baselines"
SOLUTIONS_DIR = NOTEBOOK_DIR / "solutions"


class RegressError(LabkitError, RuntimeError):
    """A notebook failed to run (names the notebook and the cell)."""


# --- running the series ----------------------------------------------------------------------
@dataclass
class NotebookResult:
    notebook: str
    ok: bool
    seconds: float
    output: str
    error: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    load: float = 1.0  # machine_load() around the notebook: how much slower a core ran


# A CPU-bound loop that prints wall time / CPU time: 1.0 on idle cores, 2.0 when each worker
# got half a core. No imports beyond time: it must start fast and measure only the scheduler.
_PROBE = ("import time\nw, c = time.perf_counter(), time.process_time()\nx = 0\n"
          "for i in range({loops}):\n    x += i * i\n"
          "print((time.perf_counter() - w) / max(time.process_time() - c, 1e-9))")


def machine_load(loops: int = 1_500_000, workers: int | None = None) -> float:
    """How much slower a core runs now than idle (>= 1.0), measured, not read from loadavg.

    One busy-loop worker per core (at most 4) measures wall time / CPU time: the share of a
    core the scheduler gives it. Two other busy processes on a 2-core machine read 2.0. Taken
    while no run of ours is going, so it sees only the load from other work (~0.1 s idle).
    """
    n = workers or max(1, min(len(os.sched_getaffinity(0)), 4))
    code = _PROBE.format(loops=int(loops))
    procs = [subprocess.Popen([sys.executable, "-S", "-c", code], stdout=subprocess.PIPE,
                              text=True) for _ in range(n)]
    factors = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        try:
            factors.append(float(out.strip()))
        except ValueError:  # a worker killed by the OOM killer, say: no figure, not a crash
            continue
    return round(max(1.0, statistics.median(factors)), 2) if factors else 1.0


def list_notebooks(names: list[str] | None = None, src: Path | None = None) -> list[Path]:
    """The solved notebooks in number order, or those whose name starts with one of ``names``."""
    src = src or SOLUTIONS_DIR
    all_nbs = sorted(p for p in src.glob("[0-9][0-9]_*.ipynb"))
    if not names:
        return all_nbs
    picked = [p for p in all_nbs if any(p.name.startswith(n) or p.stem == n for n in names)]
    missing = [n for n in names if not any(p.name.startswith(n) for p in all_nbs)]
    if missing:
        raise RegressError(f"no notebook matches {missing} in {src}; there are: "
                           f"{', '.join(p.stem for p in all_nbs)}")
    return picked


def _describe_failure(nb_name: str, err: Exception, executed: Path) -> str:
    cell = getattr(err, "cell_index", None)
    count = getattr(err, "exec_count", None)
    ename, evalue = getattr(err, "ename", type(err).__name__), getattr(err, "evalue", str(err))
    # cell_index counts the cells of the executed copy (papermill inserts one for parameters)
    where = (f"cell {cell} (In [{count}]) of {executed}" if cell is not None
             else "before any cell ran")
    src = (getattr(err, "source", "") or "").strip().splitlines()
    first = f"; the cell starts: {src[0][:100]!r}" if src else ""
    return f"{nb_name} failed at {where}: {ename}: {str(evalue)[:800]}{first}"


def run_notebook(nb: Path, out_dir: Path, parameters: dict[str, Any], *,
                 cwd: Path = NOTEBOOK_DIR, timeout_s: int | None = 1800) -> NotebookResult:
    """Execute one notebook with papermill; never raises for a failing cell (see ``error``)."""
    # papermill: only when the series runs
    import papermill as pm

    out_dir = out_dir.resolve()  # the kernel runs in notebooks/: relative paths would move
    out_dir.mkdir(parents=True, exist_ok=True)
    out_nb = out_dir / nb.name
    metrics_file = out_dir / f"{nb.stem}.metrics.json"
    metrics_file.unlink(missing_ok=True)
    old = {k: os.environ.get(k) for k in (METRICS_ENV, "LABKIT_EXERCISES_STRICT",
                                          "OMP_NUM_THREADS")}
    # The kernel inherits this process's environment: that is how a notebook finds its metrics
    # file and learns that a wrong exercise answer must fail the cell.
    os.environ.update({METRICS_ENV: str(metrics_file), "LABKIT_EXERCISES_STRICT": "1",
                       "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    load_before = machine_load()
    t0 = time.monotonic()
    error = None
    try:
        pm.execute_notebook(str(nb), str(out_nb), parameters=parameters, cwd=str(cwd),
                            kernel_name="python3", progress_bar=False,
                            execution_timeout=timeout_s, log_output=False)
    except Exception as e:  # papermill's execution error, a dead kernel, a timeout
        error = _describe_failure(nb.name, e, out_nb)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    seconds = time.monotonic() - t0
    load = max(load_before, machine_load())
    metrics = json.loads(metrics_file.read_text()) if metrics_file.exists() else {}
    return NotebookResult(nb.stem, error is None, seconds, str(out_nb), error, metrics, load)


def run_series(notebooks: list[str] | None = None, *, profile: str = "cpu",
               backend: str | None = None, out: str | Path | None = None,
               parameters: dict[str, Any] | None = None, stop_on_failure: bool = False
               ) -> list[NotebookResult]:
    """Run the (chosen) solved notebooks in order; the run root is ``OUT/runs``."""
    out = Path(out) if out else run_root() / "regress"
    params = {"profile": profile, **({"backend": backend} if backend else {}),
              **(parameters or {})}
    nbs = list_notebooks(notebooks)
    old_root = os.environ.get("LABKIT_RUN_ROOT")
    os.environ["LABKIT_RUN_ROOT"] = str((out / "runs").resolve())
    results: list[NotebookResult] = []
    try:
        for nb in nbs:
            log.info("regress: running %s (%s)", nb.name,
                     " ".join(f"-p {k} {v}" for k, v in params.items()))
            r = run_notebook(nb, out / "notebooks", params)
            log.info("regress: %s %s in %.0f s (machine load %.2f)", nb.stem,
                     "ok" if r.ok else "FAILED", r.seconds, r.load)
            results.append(r)
            if not r.ok:
                log.error(r.error)
                if stop_on_failure:
                    break
    finally:
        if old_root is None:
            os.environ.pop("LABKIT_RUN_ROOT", None)
        else:
            os.environ["LABKIT_RUN_ROOT"] = old_root
    return results


# --- baselines and the report ---------------------------------------------------------------
def baseline_from(runs: Sequence[list[NotebookResult]], profile: str, *,
                  backend: str | None = None, cluster: str | None = None,
                  judge_ratios: bool = False) -> dict[str, Any]:
    """A baseline document from one or several regress runs of the same series.

    With several runs each numeric metric's ``value`` is the median and ``runs`` keeps every
    value: the timing limits widen to the spread they show. ``loads`` keeps the machine load
    of each notebook (the highest over the runs), so a loaded baseline run is not held against
    a later quiet one. ``judge_ratios`` says the ratios of timings are worth judging here (a
    real cluster, not the local backend).
    """
    per_nb: dict[str, dict[str, list[Any]]] = {}
    loads: dict[str, float] = {}
    for results in runs:
        for r in results:
            if not r.ok:
                continue
            loads[r.notebook] = max(loads.get(r.notebook, 1.0), float(r.load or 1.0))
            for k, v in r.metrics.items():
                per_nb.setdefault(r.notebook, {}).setdefault(k, []).append(v)
    notebooks: dict[str, dict[str, Any]] = {}
    for nb, metrics in sorted(per_nb.items()):
        notebooks[nb] = {}
        for k, vs in sorted(metrics.items()):
            nums = [v for v in vs if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if len(vs) > 1 and len(nums) == len(vs):
                notebooks[nb][k] = {"value": statistics.median(nums), "runs": nums}
            else:
                notebooks[nb][k] = {"value": vs[-1]}
    return {"profile": profile, "backend": backend or "local", "cluster": cluster,
            "judge_ratios": bool(judge_ratios), "created": time.strftime("%Y-%m-%d"),
            "runs": len(runs), "loads": loads, "notebooks": notebooks}


def load_baseline(path: str | Path | None, profile: str) -> dict[str, Any]:
    """The baseline document, checked (RegressError naming the file and the fix); a missing
    default baseline is an empty one, a missing ``path`` an error."""
    p = Path(path) if path else BASELINE_DIR / f"{profile}.json"
    if not path and not p.exists():
        log.warning("regress: no baseline at %s; every metric is reported as 'new'", p)
        return {"notebooks": {}}
    doc = read_json(p, "baseline")
    nbs = doc.get("notebooks", {}) if isinstance(doc, dict) else None
    loads = doc.get("loads", {}) if isinstance(doc, dict) else None
    if not (isinstance(nbs, dict) and all(isinstance(v, dict) for v in nbs.values())
            and isinstance(loads, dict) and all(type(v) in (int, float) for v in loads.values())):
        raise RegressError(f"{p} is not a regress baseline (an object with 'notebooks': {{name: "
                           f"{{metric: spec}}}} and 'loads': {{name: number}}); write one with "
                           f"labkit regress --write-baseline METRICS.json")
    return doc


def render_report(results: list[NotebookResult], rows: list[Row], profile: str,
                  figures: dict[str, list[str]]) -> str:
    """The markdown report: notebooks and wall times, failures, metrics table, key plots."""
    total = sum(r.seconds for r in results)
    bad = [r for r in rows if r.status in ("REGRESSION", "FAILED")]
    ex = [r for r in rows if r.metric.startswith("exercise.")]
    lines = [f"# labkit regress: profile `{profile}`", "",
             f"{sum(r.ok for r in results)}/{len(results)} notebooks ran to the end in "
             f"{total / 60:.1f} min; {len(bad)} regression(s) or failure(s); exercise checks passed: "
             f"{sum(1 for r in ex if r.value is True)}/{len(ex)}.", "",
             "| notebook | result | wall time (s) |", "|---|---|---|"]
    lines += [f"| {r.notebook} | {'ok' if r.ok else 'FAILED'} | {r.seconds:.0f} |"
              for r in results]
    for r in results:
        if r.error:
            lines += ["", f"**{r.notebook}**: `{r.error}`"]
    lines += ["", "## Metrics", "", render_table(rows), "", "## Key plots", ""]
    for nb, figs in figures.items():
        for f in figs:
            lines.append(f"![{nb}]({f})")
    return "\n".join(lines) + "\n"


def extract_figures(executed_nb: str | Path, fig_dir: Path, limit: int = 3) -> list[Path]:
    """Save the first ``limit`` matplotlib figures of an executed notebook as PNG files."""
    # nbformat: only when figures are saved
    import nbformat

    p = Path(executed_nb)
    if not p.exists():
        return []
    nb = nbformat.read(p, as_version=4)
    saved: list[Path] = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            data = o.get("data", {}) if "data" in o else {}
            png = data.get("image/png")
            # matplotlib figures only, not the static diagrams the notebooks display
            if png and str(data.get("text/plain", "")).startswith("<Figure") and len(saved) < limit:
                fig_dir.mkdir(parents=True, exist_ok=True)
                f = fig_dir / f"{p.stem}_{len(saved) + 1}.png"
                f.write_bytes(base64.b64decode(png))
                saved.append(f)
    return saved


def check_out(out: Path) -> None:
    """RegressError unless ``out`` can be the output folder: a folder (or nothing yet), not the
    run root or above it, holding no live job and no job record labkit cannot read."""
    if out.exists() and not out.is_dir():
        raise RegressError(f"--out {out} is a file; give a folder for the report and its runs")
    root = run_root()
    if out == root or out in root.parents:
        raise RegressError(f"--out {out} holds the run root {root}: moving it aside would hide "
                           f"your jobs from status and cancel; give a folder of its own")
    records = [p for pat in ("job.json", "*/job.json", "*/*/job.json") for p in out.glob(pat)]
    for rec in sorted(records):
        try:
            job = Job.load(rec.parent)
        except LabkitError as e:
            raise RegressError(f"{out} holds a job record labkit cannot read ({e}); labkit will "
                               f"not move it aside: give another --out") from None
        refuse_if_live(job, rec.parent, f"move {out} aside for labkit regress")


def _set_aside(out: Path) -> None:
    """An earlier regress output is moved aside, never overwritten or deleted."""
    check_out(out)
    if out.exists() and any(out.iterdir()):
        aside = out.with_name(f"{out.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
        out.rename(aside)
        log.info("regress: moved the earlier %s aside to %s", out, aside)


def preflight(profile: str, backend: str | None) -> None:
    """Refuse at once what cannot run on this machine, before the first notebook starts."""
    problems = []
    if profile not in ("cpu", "gpu"):
        problems.append(f"profile {profile!r} is not one of ['cpu', 'gpu']")
    if backend == "slurm" and shutil.which("sbatch") is None:
        problems.append("backend slurm: there is no sbatch on PATH here (run on the cluster's "
                        "login node, or start the mini-cluster with `labkit cluster up` as root)")
    if profile == "gpu" and (backend or "local") == "local":
        # torch takes seconds to import: only a gpu run on this machine asks
        import torch

        if not torch.cuda.is_available():
            problems.append("profile gpu on the local backend trains on this machine's GPUs, "
                            "and torch sees none; use --backend slurm on a GPU cluster, or "
                            "--profile cpu")
    if problems:
        raise RegressError("labkit regress cannot run here: " + "; ".join(problems))


def regress(notebooks: list[str] | None = None, *, profile: str = "cpu",
            backend: str | None = None, cluster: str | None = None,
            baseline: str | Path | None = None, out: str | Path | None = None,
            parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run, compare and report; returns the JSON summary (``ok`` is False on any problem).

    ``cluster`` (a site name or YAML path) goes to the notebooks as their ``cluster``
    parameter; with ``backend`` it says where the run was measured, which decides whether a
    ``"judge_ratios": true`` baseline's ratios are judged.
    """
    list_notebooks(notebooks)  # the names first: a typo must not move anything aside
    preflight(profile, backend)
    base = load_baseline(baseline, profile)  # checked before the notebooks run
    out = (Path(out) if out else REPO_ROOT / "runs" / "regress").resolve()
    _set_aside(out)
    out.mkdir(parents=True, exist_ok=True)
    cluster = cluster if cluster is not None else (parameters or {}).get("cluster")
    params = {**(parameters or {}), **({"cluster": str(cluster)} if cluster is not None else {})}
    results = run_series(notebooks, profile=profile, backend=backend, out=out,
                         parameters=params)
    rows = compare(results, base, backend=backend, cluster=cluster)
    figures = {r.notebook: [str(f.relative_to(out)) for f in
                            extract_figures(r.output, out / "figures")] for r in results}
    (out / "report.md").write_text(render_report(results, rows, profile, figures))
    doc = {"profile": profile, "backend": backend or "local",
           "cluster": None if cluster is None else str(cluster), "out": str(out),
           "ok": all(r.ok for r in results) and passed(rows),
           "notebooks": [asdict(r) for r in results], "rows": [asdict(x) for x in rows]}
    (out / "metrics.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return doc


def write_baseline(metrics_json: str | Path | Sequence[str | Path], out: str | Path | None = None,
                   *, judge_ratios: bool = False) -> Path:
    """A baseline file from one or several regress runs' ``metrics.json`` (notebooks that ran
    to the end). Several runs give each timing a spread (see ``baseline_from``)."""
    paths = [metrics_json] if isinstance(metrics_json, (str, Path)) else list(metrics_json)
    if not paths:
        raise RegressError("write_baseline needs at least one metrics.json of a regress run")
    docs = [read_json(p, "regress metrics file") for p in paths]
    try:
        runs = [[NotebookResult(**n) for n in d["notebooks"]] for d in docs]
        where = {(d["profile"], d.get("backend", "local"), d.get("cluster")) for d in docs}
    except (AttributeError, KeyError, TypeError):
        raise RegressError(f"not the metrics.json of a regress run: {', '.join(map(str, paths))} "
                           f"(give OUT/metrics.json of `labkit regress --out OUT`)") from None
    if len(where) > 1:
        raise RegressError(f"the runs were taken in different places {sorted(where, key=str)}; "
                           "a baseline combines runs of one profile, backend and cluster")
    profile, backend, cluster = where.pop()
    path = Path(out) if out else BASELINE_DIR / f"{profile}.json"
    if path.is_dir():
        raise RegressError(f"--baseline {path} is a folder; give the path of the baseline file")
    if path.exists():  # the committed baseline is a user's file too: keep the old one
        path.rename(path.with_name(f"{path.stem}.old-{time.strftime('%Y%m%d-%H%M%S')}.json"))
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = baseline_from(runs, profile, backend=backend, cluster=cluster, judge_ratios=judge_ratios)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path
