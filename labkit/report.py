"""Small helpers the notebooks call between labkit's modules, so that cells stay short.

    versions()                         package versions as a table (the versions cell)
    launch(cfg, cluster=..., ...)      submit and wait, or reuse a finished identical run
    wait_for_iteration(job, n)         block until the log shows iteration n (kill-and-resume)
    run_allreduce_bench(cfg, ...)      code/allreduce_bench.py on the run's nodes -> DataFrame
    steady_median(df, column)          a median that leaves out the warm-up iterations
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pandas as pd

from labkit._logging import log
from labkit.config import RunConfig
from labkit.errors import JobFailedError, LabkitError
from labkit.paths import CODE_DIR, run_root

PACKAGES = ("labkit", "torch", "megatron-core", "pandas", "matplotlib", "tensorboard",
            "papermill", "ipywidgets")


def versions(packages: tuple[str, ...] = PACKAGES) -> pd.DataFrame:
    """Installed versions of the packages the lab uses ("missing" when not installed)."""
    rows = []
    for p in packages:
        try:
            rows.append({"package": p, "version": version(p)})
        except PackageNotFoundError:
            rows.append({"package": p, "version": "missing"})
    return pd.DataFrame(rows).set_index("package")


def _finished_same_run(cfg: RunConfig) -> Path | None:
    d = run_root() / cfg.name
    try:
        same = json.loads((d / "config.json").read_text()) == cfg.to_dict()
        ok = (d / "exit_code").read_text().strip() == "0"
    except (OSError, ValueError):
        return None
    return d if same and ok and (d / "job.json").exists() else None


def launch(cfg: RunConfig, *, cluster: Any = None, reuse: bool = True, wait: bool = True,
           progress: bool = True, timeout: float | None = None, resume: bool = False) -> Any:
    """Submit ``cfg`` (its own backend) and wait; returns the ``Job``.

    With ``reuse`` a run of the very same config that already finished with exit code 0 is
    returned instead of training again (notebook 02 reuses 01's run this way). Otherwise an
    earlier run directory of the same name is moved aside (never deleted) and the job starts.
    """
    from labkit.backends import Job, submit

    if reuse and not resume and (d := _finished_same_run(cfg)) is not None:
        log.info(f"reusing the finished run {d} (same config); pass reuse=False to train again")
        return Job.load(d)
    job = submit(cfg, profile=cluster, overwrite=not resume, resume=resume)
    if wait:
        job.wait(timeout=timeout, progress=progress)
    return job


def wait_for_iteration(job: Any, iteration: int, *, timeout: float = 600.0,
                       poll_s: float = 1.0) -> int:
    """Block until the job's log shows ``iteration`` (returns the last one seen).

    Raises JobFailedError if the job ends first, LabkitError on timeout.
    """
    from labkit.logs import parse_log

    t0 = time.monotonic()
    while True:
        last = 0
        if job.log_path.exists():
            its = parse_log(job.log_path).iterations
            last = int(its["iteration"].max()) if len(its) else 0
        if last >= iteration:
            return last
        st = job.state()
        if st.finished:
            raise job.failure_error(st) if str(st) != "COMPLETED" else LabkitError(
                f"job {job.job_id} completed at iteration {last} before reaching {iteration}; "
                f"raise train_iters")
        if time.monotonic() - t0 > timeout:
            raise LabkitError(f"job {job.job_id} shows iteration {last} after {timeout:.0f} s, "
                              f"waiting for {iteration}; see {job.log_path}")
        time.sleep(poll_s)


def steady_median(df: pd.DataFrame, column: str = "elapsed_ms", skip: int = 1) -> float:
    """Median of a column without the first ``skip`` iterations (start-up, not steady state)."""
    s = df[column].dropna()
    return float(s.iloc[skip:].median() if len(s) > skip else s.median())


# --- the all-reduce benchmark as a job -------------------------------------------------------
_CONFIG_ARGS = '--config "$RUN_DIR/config.json"'


def bench_script(cfg: RunConfig, run_dir: Path, bench_args: list[str], *,
                 cluster: Any = None) -> str:
    """The run's own launch script (local or sbatch) with the benchmark as the program.

    The launch scripts pass ``--config``; the benchmark takes its own flags instead, so they
    replace that one argument. A template without it is an error, not a silent no-op.
    """
    import shlex

    from labkit.render import render_local, render_sbatch

    bench = CODE_DIR / "allreduce_bench.py"
    if cfg.backend == "slurm":
        from labkit.cluster import resolve_profile
        text = render_sbatch(cfg, resolve_profile(cluster), run_dir, program=bench)
    else:
        text = render_local(cfg, run_dir, program=bench)
    if _CONFIG_ARGS not in text:
        raise LabkitError(f"the launch template no longer passes {_CONFIG_ARGS}; "
                          f"bench_script needs updating")
    quoted = [shlex.quote(a) for a in bench_args]
    if cfg.backend == "slurm" and quoted != list(bench_args):
        # the sbatch template runs the program inside bash -c '...': no nested quoting
        raise LabkitError(f"benchmark arguments {bench_args} need shell quoting; use a run "
                          f"root without spaces or quotes (LABKIT_RUN_ROOT)")
    return text.replace(_CONFIG_ARGS, " ".join(quoted))


def run_allreduce_bench(cfg: RunConfig, *, cluster: Any = None, min_bytes: str = "4K",
                        max_bytes: str = "4M", step_factor: int = 4,
                        scopes: str = "world,intra,inter", timeout: float = 600.0
                        ) -> pd.DataFrame:
    """Run code/allreduce_bench.py across ``cfg``'s nodes; returns its bus-bandwidth rows.

    Writes ``runs/<cfg.name>/{config.json, job.sh, log.txt, busbw.jsonl}`` (an earlier
    directory of that name is moved aside).
    """
    from labkit.comm import read_busbw
    from labkit.rundir import prepare_run_dir

    d = prepare_run_dir(cfg, overwrite=True)
    out = d / "busbw.jsonl"
    args = ["-b", min_bytes, "-e", max_bytes, "-f", str(step_factor), "--scopes", scopes,
            "--json-out", str(out)]
    script = d / "job.sh"
    script.write_text(bench_script(cfg, d, args, cluster=cluster))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if cfg.backend == "slurm":
        from labkit.cluster import resolve_profile
        prof = resolve_profile(cluster)
        if prof.slurm_conf:
            env["SLURM_CONF"] = prof.slurm_conf
        cmd = ["sbatch", "--wait", "--parsable", str(script)]
    else:
        from labkit.backends.local import free_port
        env["MASTER_PORT"] = str(free_port())
        cmd = ["bash", str(script)]
    with open(d / "log.txt", "ab") as logf:
        p = subprocess.run(cmd, stdout=logf, stderr=subprocess.STDOUT, cwd=d, env=env,
                           timeout=timeout)
    if p.returncode != 0 or not out.exists():
        tail = (d / "log.txt").read_text(errors="replace")[-2000:]
        raise JobFailedError(f"allreduce_bench in {d} failed (exit {p.returncode}); last "
                             f"lines:\n{tail}", state="FAILED", log_tail=tail)
    return read_busbw(out)
