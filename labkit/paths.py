"""Where things live: the repository, its code/ and data/, the run root, the mini-cluster's state.

The run root is ``<repo>/runs`` unless ``LABKIT_RUN_ROOT`` says otherwise (a cluster profile's
shared file system, a test's temporary folder). The mini-cluster (``labkit cluster up``) keeps
its slurm.conf, logs and state under ``MINICLUSTER_DIR`` (``LABKIT_SLURM_DIR``, default
``/var/lib/labkit-slurm``), and while it is up, its cluster profile at ``MINICLUSTER_SITE``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from labkit.errors import ConfigError
from labkit.rules import NAME_RE
from labkit.validate import env_path

REPO_ROOT = Path(__file__).resolve().parents[1]
CODE_DIR = REPO_ROOT / "code"
DATA_DIR = REPO_ROOT / "data"
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
SLURM_DIR_DEFAULT = Path("/var/lib/labkit-slurm")


def _slurm_dir() -> tuple[Path, str | None]:
    try:
        return env_path("LABKIT_SLURM_DIR") or SLURM_DIR_DEFAULT, None
    except ConfigError as e:  # reported where it is used (check_slurm_dir), not at import
        return SLURM_DIR_DEFAULT, str(e)


MINICLUSTER_DIR, _SLURM_DIR_PROBLEM = _slurm_dir()
# Written by `labkit cluster up`, removed by `labkit cluster down`: the cluster profile that
# `cluster=None` resolves to while the mini-cluster runs (labkit.site.resolve_cluster).
MINICLUSTER_SITE = MINICLUSTER_DIR / "site.yaml"


def run_root() -> Path:
    """The folder that holds ``<name>/`` run directories. ``$LABKIT_RUN_ROOT``, when set, must
    be one line of text (an empty value is refused, not taken as the current directory)."""
    given = env_path("LABKIT_RUN_ROOT")
    root = (given or REPO_ROOT / "runs").resolve()
    if given is not None and root.exists() and not root.is_dir():
        raise ConfigError(f"$LABKIT_RUN_ROOT={given} is a file, not a folder; set it to the folder "
                          f"that holds your runs, or unset it for {REPO_ROOT / 'runs'}")
    return root


def check_slurm_dir() -> None:
    """ConfigError when ``$LABKIT_SLURM_DIR`` is set but cannot be used (empty: it would make
    a ``site.yaml`` in the current directory the mini-cluster's profile; several lines)."""
    if _SLURM_DIR_PROBLEM:
        raise ConfigError(_SLURM_DIR_PROBLEM)


def run_dir(name: str, root: str | Path | None = None) -> Path:
    """``<root>/<name>``: the one place a run's name is joined onto a run root, so a name that
    would lead out of it (``../x``, ``/etc``, ``a/b``) is refused here (ConfigError)."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ConfigError(f"run name {name!r:.80} must be 1-64 letters, digits, '.', '_' or '-', "
                          f"starting with a letter or digit (it names the folder runs/<name>/)")
    return (Path(root) if root is not None else run_root()) / name


def default_torchrun() -> str:
    """The torchrun next to this Python (a venv's), else ``torchrun`` from PATH."""
    exe = Path(sys.executable).parent / "torchrun"
    return str(exe) if exe.exists() else "torchrun"
