"""The ``labkit`` logger (stderr, with a prefix) and a once-only warning helper."""

from __future__ import annotations

import logging

log = logging.getLogger("labkit")
if not log.handlers:
    _h = logging.StreamHandler()
    _h.setFormatter(logging.Formatter("[labkit] %(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    log.addHandler(_h)
    log.setLevel(logging.INFO)
    log.propagate = False

_seen: set[str] = set()


def warn_once(message: str) -> None:
    if message not in _seen:
        _seen.add(message)
        log.warning(message)
