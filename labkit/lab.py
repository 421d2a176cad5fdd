"""Small helpers the notebooks call between labkit's modules, so that cells stay short.

    versions()                         package versions as a table (the versions cell)
    launch(cfg, cluster=..., ...)      submit and wait, or reuse a finished identical run
    run_dir_of(cfg, cluster=...)       the run directory launch/submit use (render it there)
    wait_for_iteration(job, n)         block until the log shows iteration n (kill-and-resume)
    run_allreduce_bench(cfg, ...)      code/allreduce_bench.py on the run's nodes -> DataFrame
    steady_median(df, column)          a median that leaves out the warm-up iterations
    shown(path_or_text)                paths as a notebook prints them: relative, not this machine's
    throughput(df, gpu_model=...)      tokens/s (per device), model TFLOP/s and MFU per run
"""

from __future__ import annotations

import json
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pandas as pd

from labkit import jobs
from labkit._logging import log
from labkit.backends.diagnosis import failure_error
from labkit.backends.job import Job
from labkit.backends.ownership import NotOwnedError, verify_owned
from labkit.config import RunConfig, require_config
from labkit.errors import LabkitError, SubmissionError
from labkit.logs import parse_log
from labkit.measured.comm import read_busbw, submit_bench
from labkit.measured.metrics import add_throughput, mfu
from labkit.paths import REPO_ROOT, run_root
from labkit.run.record import JOB_FILE
from labkit.site import resolve_cluster

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


def run_dir_of(cfg: RunConfig, *, cluster: Any = None) -> Path:
    """The run directory ``launch``/``submit`` use for ``cfg``: under the cluster profile's
    ``run_root`` (``{user}`` filled in) for a Slurm run, else under ``labkit.paths.run_root()``.
    Render the job script for this directory, and look for earlier runs here."""
    if cfg.backend == "slurm":
        root = resolve_cluster(cluster).run_root_path()
        if root is not None:
            return (root / cfg.name).absolute()
    return run_root() / cfg.name


def _finished_same_run(cfg: RunConfig, d: Path) -> Path | None:
    try:
        same = json.loads((d / "config.json").read_text()) == cfg.to_dict()
        ok = (d / "exit_code").read_text().strip() == "0"
    except (OSError, ValueError):
        return None
    return d if same and ok and (d / "job.json").exists() else None


def _check_args(where: str, *, flags: dict[str, Any], seconds: dict[str, Any],
                counts: dict[str, Any] | None = None) -> None:
    """One LabkitError naming every argument of the wrong kind (before anything is submitted)."""
    bad = [f"{k}={v!r} must be True or False" for k, v in flags.items() if not isinstance(v, bool)]
    bad += [f"{k}={v!r} must be a number of seconds > 0 (e.g. 600), or None"
            for k, v in seconds.items() if v is not None and (
                isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"))]
    bad += [f"{k}={v!r} must be a whole number >= 1" for k, v in (counts or {}).items()
            if isinstance(v, bool) or not isinstance(v, int) or v < 1]
    if bad:
        raise LabkitError(f"{where}: " + "; ".join(bad))


def launch(cfg: RunConfig, *, cluster: Any = None, reuse: bool = True, wait: bool = True,
           progress: bool = True, timeout: float | None = None, resume: bool = False,
           hang_timeout: float | None = None, cancel_on_interrupt: bool = True) -> Any:
    """Submit ``cfg`` (its own backend) and wait; returns the ``Job``.

    With ``reuse`` a run of the very same config that already finished with exit code 0 is
    returned instead of training again (notebooks 05 and 07 reuse 01's run this way). Otherwise an
    earlier run directory of the same name is moved aside (never deleted) and the job starts;
    one whose job is still PENDING or RUNNING, or that belongs to another user, is refused
    (SubmissionError naming the job and how to cancel it). The directory is ``run_dir_of(cfg,
    cluster=cluster)``: the cluster's per-user run root for a Slurm run.
    ``hang_timeout`` (seconds) waits with the hang watchdog (``Job.wait``). Interrupting the
    wait cancels the job unless ``cancel_on_interrupt=False``.
    """
    cfg = require_config(cfg, "launch()")
    _check_args("launch()", flags={"reuse": reuse, "wait": wait, "progress": progress,
                                   "resume": resume, "cancel_on_interrupt": cancel_on_interrupt},
                seconds={"timeout": timeout, "hang_timeout": hang_timeout})
    if cfg.backend != "local" or cluster is not None:  # the site, resolved once here
        cluster = resolve_cluster(cluster)
    d = run_dir_of(cfg, cluster=cluster)
    if (d / JOB_FILE).exists():
        old = Job.load(d)
        try:
            verify_owned(old, [d.parent.resolve()])
        except NotOwnedError as e:
            raise SubmissionError(f"{e}. Use another run name, or give each user a run root "
                                  f"(run_root: /shared/labkit/{{user}}/runs in the cluster "
                                  f"profile)") from None
        if reuse and not resume and _finished_same_run(cfg, d) is not None:
            log.info(f"reusing the finished run {d} (same config); pass reuse=False to train "
                     f"again")
            return old
    job = jobs.submit(cfg, cluster=cluster, overwrite=not resume, resume=resume)
    if wait:
        # A local job's state is read from /proc: poll it every second at most, so that a short
        # run is not waited for seconds after it ended; a Slurm job's costs the controller an
        # squeue, so those polls back off to 5 s.
        job.wait(timeout=timeout, progress=progress, hang_timeout=hang_timeout,
                 cancel_on_interrupt=cancel_on_interrupt,
                 max_interval=1.0 if cfg.backend == "local" else 5.0)
    return job


def wait_for_iteration(job: Any, iteration: int, *, timeout: float = 600.0,
                       poll_s: float = 1.0) -> int:
    """Block until the job's log shows ``iteration`` (returns the last one seen).

    Raises JobFailedError if the job ends first, LabkitError on timeout.
    """
    _check_args("wait_for_iteration()", flags={}, seconds={"timeout": timeout, "poll_s": poll_s},
                counts={"iteration": iteration})
    if not hasattr(job, "log_path"):
        raise LabkitError(f"wait_for_iteration() needs the Job that launch()/submit() returned, "
                          f"got {type(job).__name__} {repr(job)[:60]}")
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
            raise failure_error(job, st) if str(st) != "COMPLETED" else LabkitError(
                f"job {job.job_id} completed at iteration {last} before reaching {iteration}; "
                f"raise train_iters")
        if timeout is not None and time.monotonic() - t0 > timeout:
            raise LabkitError(f"job {job.job_id} shows iteration {last} after {timeout:.0f} s, "
                              f"waiting for {iteration}; see {job.log_path}")
        time.sleep(poll_s)


def shown(what: str | Path) -> str:
    """A path, or a text holding paths, as a notebook prints it: the run root and the
    repository written relatively (``runs/nb01_dp/...``, ``code/pretrain_gpt.py``); a run root
    outside the repository as ``$LABKIT_RUN_ROOT``. What the path means stays readable, where
    this machine keeps it does not leak into a shared notebook."""
    text = str(what)
    root, repo = str(run_root()), str(REPO_ROOT.resolve())
    if not root.startswith(repo + "/"):
        text = text.replace(root, "$LABKIT_RUN_ROOT")
    return text.replace(repo + "/", "").replace(repo, ".")


def steady_median(df: pd.DataFrame, column: str = "elapsed_ms", skip: int = 1) -> float:
    """Median of a column without the first ``skip`` iterations (start-up, not steady state)."""
    s = df[column].dropna()
    return float(s.iloc[skip:].median() if len(s) > skip else s.median())


def throughput(df: pd.DataFrame, *, by: str = "name", gpu_model: str | None = None,
               skip: int = 1) -> pd.DataFrame:
    """Per run (or per ``by`` value): median tokens/s, tokens/s per device, model TFLOP/s per
    device and MFU, without the first ``skip`` iterations of each run.

    ``df``: iterations from ``labkit.logs.load_runs`` (config columns joined). MFU is model
    FLOP/s per device over the device's dense peak (``labkit.measured.hardware.PEAK_TFLOPS``, for the
    run's precision), a GPU figure: it is left empty for runs on ``device="cpu"`` (a CPU has no
    peak in that table), and for GPU runs when the GPU model is unknown. ``gpu_model`` names it
    (e.g. ``"H100"``); None: the GPU this Python process sees, if any.
    """
    d = add_throughput(df)
    if skip and "iteration" in d.columns:
        d = d[d.groupby("run_dir")["iteration"].rank(method="first") > skip]
    rows = []
    for key, g in d.groupby(by, sort=False):
        world, device = int(g["world_size"].iloc[0]), g["device"].iloc[0]
        tokens, tflops = float(g["tokens_per_sec"].median()), float(g["tflops_per_gpu"].median())
        gpu = (gpu_model or _visible_gpu()) if device == "cuda" else None
        rows.append({by: key, "world_size": world, "device": device,
                     "tokens_per_sec": tokens, "tokens_per_sec_per_device": tokens / world,
                     "model_tflops_per_device": tflops,
                     "mfu": mfu(tflops, device=gpu, precision=g["precision"].iloc[0])
                     if gpu else float("nan")})
    return pd.DataFrame(rows).set_index(by)


def _visible_gpu() -> str | None:
    try:
        # torch takes seconds to import: only to name the GPU
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # no CUDA here (a login node): MFU stays empty rather than guessed
        return None


# --- the all-reduce benchmark as a job -------------------------------------------------------
def run_allreduce_bench(cfg: RunConfig, *, cluster: Any = None, min_bytes: str = "4K",
                        max_bytes: str = "4M", step_factor: int = 4,
                        scopes: str = "world,intra,inter", timeout: float = 600.0
                        ) -> pd.DataFrame:
    """Run code/allreduce_bench.py across ``cfg``'s nodes as a labkit job; its busbw rows.

    The job is submitted through the same backend as training (``labkit.measured.comm.submit_bench``),
    so it is recorded in ``runs/<cfg.name>/`` and cancellable like any other; an earlier
    directory of that name is moved aside, never deleted.
    """
    if cfg.backend != "local" or cluster is not None:  # the site, resolved once here
        cluster = resolve_cluster(cluster)
    job = submit_bench(cfg.name, nodes=cfg.nodes, gpus_per_node=cfg.gpus_per_node,
                       backend=cfg.backend, cluster=cluster, device=cfg.device,
                       scopes=tuple(scopes.split(",")), min_bytes=min_bytes,
                       max_bytes=max_bytes, factor=step_factor, overwrite=True)
    job.wait(timeout=timeout, progress=False, raise_on_failure=True)
    return read_busbw(job.run_dir)
