"""megatron-core's optional-package warnings become one labkit line; other warnings pass."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

SCRIPT = """
import warnings
from labkit.quiet import quiet_megatron
with quiet_megatron():
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    import megatron.core.optimizer
    warnings.warn("a warning of our own")
with quiet_megatron():
    import megatron.core.optimizer.clip_grads
"""


def test_optional_package_warnings_are_said_once():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    err = out.stderr
    assert "UserWarning: Transformer Engine and Apex are not installed" not in err
    notes = err.count("Transformer Engine and Apex are not installed, so it uses")
    optional_installed = any(importlib.util.find_spec(m) for m in ("transformer_engine", "apex"))
    assert notes == 1 or (optional_installed and notes <= 1), err
    assert "a warning of our own" in err
