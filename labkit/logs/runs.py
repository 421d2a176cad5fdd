"""Run directories -> DataFrames with the RunConfig joined as columns.

``load_runs(dirs)`` is the scaling-study idiom: one frame of every run's iterations, with
``name, tp, pp, dp, world_size, micro_batch_size, ...`` on every row, so
``df.groupby(["tp", "pp"])`` works.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from labkit.config import RunConfig
from labkit.errors import LabkitError
from labkit.logs.parse import ParsedLog, parse_log

LOG_NAMES = ("log.txt", "log", "train.log")
DERIVED = ("world_size", "tp", "pp", "dp", "vpp", "num_microbatches", "tokens_per_iteration")


def config_columns(cfg: Any) -> dict[str, Any]:
    """The scalar RunConfig fields plus derived layout numbers, as one row of columns."""
    cols = {k: v for k, v in cfg.to_dict().items() if isinstance(v, (int, float, str, bool, type(None)))}
    for k in DERIVED:
        cols[k] = getattr(cfg, k)
    return cols


def find_logs(run_dir: Path) -> list[Path]:
    for name in LOG_NAMES:
        if (run_dir / name).is_file():
            return [run_dir / name]
    found = sorted(run_dir.glob("slurm-*.out")) or sorted(run_dir.glob("*.log"))
    return found


def _join(df: pd.DataFrame, cols: dict[str, Any]) -> pd.DataFrame:
    df = df.copy()
    for k, v in cols.items():
        if k not in df.columns:  # what the log says wins over what the config asked for
            df[k] = v
    return df


def parse_run(run_dir: str | Path) -> ParsedLog:
    """Parse ``run_dir``'s log and join its ``config.json`` fields as columns.

    Raises LabkitError if the directory has no log; a missing config.json only means no columns.
    """
    d = Path(run_dir)
    logs = find_logs(d)
    if not logs:
        raise LabkitError(f"no log in run directory {d} (looked for {', '.join(LOG_NAMES)}, slurm-*.out, "
                          f"*.log). Has the job started? `labkit status` shows its state.")
    parsed = parse_log(logs if len(logs) > 1 else logs[0])
    cfg_path = d / "config.json"
    cols: dict[str, Any] = {"run_dir": str(d)}
    if cfg_path.is_file():
        cfg = RunConfig.from_json(cfg_path)
        cols.update(config_columns(cfg))
        its = parsed.iterations
        if not its.empty and its["tokens_per_sec"].isna().all():
            its["tokens_per_sec"] = its["samples_per_sec"] * cfg.seq_length
        for k in ("world_size", "tp", "pp", "dp"):
            if parsed.layout.get(k) is None:
                parsed.layout[k] = getattr(cfg, k)
    else:
        cols["name"] = d.name
    parsed.iterations = _join(parsed.iterations, cols)
    parsed.memory = _join(parsed.memory, cols)
    parsed.validation = _join(parsed.validation, cols)
    return parsed


def _expand(run_dirs: Iterable[str | Path] | str | Path) -> list[Path]:
    if isinstance(run_dirs, (str, Path)):
        run_dirs = [run_dirs]
    out: list[Path] = []
    for p in map(Path, run_dirs):
        if (p / "config.json").exists() or find_logs(p):
            out.append(p)
        elif p.is_dir():  # a run root: every run directory under it
            out.extend(sorted(c.parent for c in p.glob("*/config.json")))
    return out


def load_runs(run_dirs: Iterable[str | Path] | str | Path, *, what: str = "iterations") -> pd.DataFrame:
    """Concatenate ``what`` (iterations, memory or validation) of many runs, config columns joined."""
    dirs = _expand(run_dirs)
    if not dirs:
        raise LabkitError(f"no run directories found in {run_dirs!r}: pass folders that hold config.json "
                          f"and a log (runs/<name>/), or the run root that contains them.")
    frames = [getattr(parse_run(d), what) for d in dirs]
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
