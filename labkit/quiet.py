"""megatron-core's notes about optional packages, said once instead of once per module.

Importing megatron-core without Transformer Engine or Apex (always so on CPU) warns from four of
its modules that it falls back to its own implementations. In a notebook each becomes a red box.
``quiet_megatron()`` catches those notes around an import and says once, as one labkit log line,
what they mean; every other warning passes through unchanged.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from labkit._logging import warn_once

_OPTIONAL = re.compile(r"(Transformer Engine|Apex)( and Apex)? (is|are) not installed")
NOTE = ("megatron-core: Transformer Engine and Apex are not installed, so it uses its PyTorch "
        "fallbacks (expected on CPU; on GPUs install Transformer Engine for fused kernels)")


@contextmanager
def quiet_megatron() -> Iterator[None]:
    """Import megatron-core modules inside this block: its optional-package warnings become one
    log line per process (``NOTE``); other warnings are shown as usual."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    optional = False
    for w in caught:
        if _OPTIONAL.search(str(w.message)):
            optional = True
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if optional:
        warn_once(NOTE)
