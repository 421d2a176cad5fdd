"""The ``labkit`` logger and a once-only warning helper.

In a terminal, lines go to stderr with a prefix, the time and the level. Inside a notebook
kernel (Jupyter, or papermill under ``labkit regress``) they go to stdout as short plain lines
(``[labkit] message``, the level only from WARNING up) with the machine's paths shortened
(the repository to a relative path, the home folder to ``~``): stderr would render every
progress line as a red box, and a saved notebook must not carry the machine's paths.
"""

from __future__ import annotations

import logging
import os
import sys

from labkit.paths import REPO_ROOT


def in_notebook() -> bool:
    """True when this process's stdout is a notebook kernel's (ipykernel's OutStream)."""
    return "ipykernel" in sys.modules and type(sys.stdout).__module__.startswith("ipykernel")


def short_paths(text: str) -> str:
    """``text`` with the repository's absolute path made relative and the home folder as ``~``."""
    roots = [(str(REPO_ROOT) + os.sep, ""), (str(REPO_ROOT), ".")]
    home = os.path.expanduser("~")
    if home not in ("", "/", "~"):
        roots.append((home + os.sep, "~" + os.sep))
    for root, label in roots:
        text = text.replace(root, label)
    return text


class _Handler(logging.Handler):
    """stderr in a terminal; stdout and short plain lines in a notebook (decided per line)."""

    terminal = logging.Formatter("[labkit] %(asctime)s %(levelname)s %(message)s", "%H:%M:%S")

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if in_notebook():
                msg = short_paths(record.getMessage())
                level = "" if record.levelno < logging.WARNING else f"{record.levelname}: "
                stream, line = sys.stdout, f"[labkit] {level}{msg}"
            else:
                stream, line = sys.stderr, self.terminal.format(record)
            stream.write(line + "\n")
            stream.flush()
        except Exception:  # a logging failure must never break the caller
            self.handleError(record)


log = logging.getLogger("labkit")
if not log.handlers:
    log.addHandler(_Handler())
    log.setLevel(logging.INFO)
    log.propagate = False

_seen: set[str] = set()


def warn_once(message: str) -> None:
    if message not in _seen:
        _seen.add(message)
        log.warning(message)
