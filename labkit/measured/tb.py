"""TensorBoard event files -> a DataFrame of scalars.

``code/pretrain_gpt.py`` writes ``lm-loss``, ``learning-rate``, ``iteration-time``,
``throughput``, ``mem-max-allocated`` and ``batch-size`` under ``RUN_DIR/tb/`` with
step = iteration. This reads them with TensorBoard's own event loader (both the old
``simple_value`` scalars and the newer tensor-encoded ones).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

import pandas as pd

from labkit.errors import LabkitError
from labkit.paths import REPO_ROOT, run_root

COLUMNS = ["tag", "step", "value", "wall_time"]


def _event_dirs(root: Path) -> list[Path]:
    return sorted({p.parent for p in root.rglob("*tfevents*") if p.is_file()})


def _scalars_of(directory: Path) -> list[tuple[str, int, float, float]]:
    # tensorboard: only when event files are read
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.util import tensor_util

    acc = ea.EventAccumulator(str(directory), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    rows = [(tag, e.step, float(e.value), e.wall_time) for tag in acc.Tags()["scalars"]
            for e in acc.Scalars(tag)]
    for tag in acc.Tags().get("tensors", []):  # scalars written as rank-0 tensors (TF2 style)
        for e in acc.Tensors(tag):
            arr = tensor_util.make_ndarray(e.tensor_proto)
            if arr.size == 1:
                rows.append((tag, e.step, float(arr.reshape(())), e.wall_time))
    return rows


def read_scalars(tb_dir: str | Path) -> pd.DataFrame:
    """Every scalar under ``tb_dir`` (searched recursively) as ``tag, step, value, wall_time``.

    With event files in several sub-folders a ``run`` column names the sub-folder. Raises
    LabkitError when the folder is missing or holds no event file.
    """
    root = Path(tb_dir)
    if not root.is_dir():
        raise LabkitError(f"no TensorBoard folder {root}: runs write it as RUN_DIR/tb/ once the first "
                          f"iteration is logged. Is this the right run directory?")
    dirs = _event_dirs(root)
    if not dirs:
        raise LabkitError(f"{root} holds no TensorBoard event file (*tfevents*); the run may not have "
                          f"logged an iteration yet.")
    frames = []
    for d in dirs:
        df = pd.DataFrame(_scalars_of(d), columns=COLUMNS)
        if len(dirs) > 1:
            df["run"] = str(d.relative_to(root)) if d != root else "."
        frames.append(df)
    out = pd.concat(frames, ignore_index=True)
    out = out.sort_values(["tag", "step", "wall_time"], kind="stable").reset_index(drop=True)
    out["step"] = out["step"].astype("int64")
    return out


def scalars_wide(tb_dir: str | Path) -> pd.DataFrame:
    """One row per step, one column per tag (the last value written for a step wins)."""
    df = read_scalars(tb_dir)
    return df.pivot_table(index="step", columns="tag", values="value", aggfunc="last").reset_index()


def tensorboard_command(logdir: str | Path | None = None, *, port: int = 6006,
                        host: str = "localhost") -> list[str]:
    """The command line that serves ``logdir`` (default: the run root, absolute) in TensorBoard.

    TensorBoard lists each ``<run>/tb`` folder under it as a run. ``host`` is the address it
    listens on: ``localhost`` for a browser on this machine or an ssh tunnel to it.
    """
    if logdir is None:
        logdir = run_root()
    exe = Path(sys.executable).with_name("tensorboard")
    prog = str(exe) if exe.exists() else (shutil.which("tensorboard") or "tensorboard")
    return [prog, "--logdir", str(Path(logdir).resolve()), "--port", str(port), "--host", host]


def tensorboard_command_line(*, port: int = 6006, host: str = "localhost") -> str:
    """``tensorboard_command`` on the run root as a student types it in a terminal opened in the
    repository: ``"$LABKIT_RUN_ROOT"`` when that variable sets the run root, else the run root
    and the venv's tensorboard relative to the repository (no absolute path of this machine)."""
    def typed(path: str) -> str:
        rel = os.path.relpath(path, REPO_ROOT)
        return path if rel.startswith("..") else rel

    cmd = tensorboard_command(port=port, host=host)
    prog = typed(cmd[0]) if os.sep in cmd[0] else cmd[0]
    logdir = '"$LABKIT_RUN_ROOT"' if os.environ.get("LABKIT_RUN_ROOT") else shlex.quote(typed(cmd[2]))
    return " ".join([shlex.quote(prog), "--logdir", logdir, *map(shlex.quote, cmd[3:])])
