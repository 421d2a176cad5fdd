"""Where things live: the repository, its code/ and data/, and the run root.

The run root is ``<repo>/runs`` unless ``LABKIT_RUN_ROOT`` says otherwise (a cluster profile's
shared file system, a test's temporary folder).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CODE_DIR = REPO_ROOT / "code"
DATA_DIR = REPO_ROOT / "data"
NOTEBOOK_DIR = REPO_ROOT / "notebooks"


def run_root() -> Path:
    """The folder that holds ``<name>/`` run directories."""
    return Path(os.environ.get("LABKIT_RUN_ROOT", REPO_ROOT / "runs")).resolve()


def run_dir(name: str, root: str | Path | None = None) -> Path:
    return (Path(root) if root is not None else run_root()) / name
