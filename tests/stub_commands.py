"""Stub commands for running a job script in a sandbox: only the stubs are on PATH, and each call
logs its argv as one record, so a test sees exactly which commands the script ran, with what.

Each call writes its record to a file of its own in the ``$STUB_LOG`` folder, in one process and
one file, so calls that run side by side (``scontrol ... | head``) cannot interleave or merge their
records however long their arguments are. A file's name is the call's start time in microseconds
(bash's ``$EPOCHREALTIME``) and its pid: sorting by name puts calls made one after another in the
order they ran; calls made side by side may come in either order.
"""

from __future__ import annotations

from pathlib import Path

# The record: the command's name, then each argument, each ended by a NUL (which no argument can
# hold). A few stubs also act like the command, as much as the job scripts need.
STUB = r"""#!/bin/bash
printf '%s\0' "${0##*/}" "$@" > "$STUB_LOG/${EPOCHREALTIME/[.,]/}-$$"
case "${0##*/}" in
  scontrol) echo node1 ;;
  head) IFS= read -r line; printf '%s\n' "$line" ;;
  seq) i=$1; while [ "$i" -le "$2" ]; do echo "$i"; i=$((i + 1)); done ;;
esac
exit 0
"""

# Sourced through BASH_ENV: a command that is not a stub is logged as UNEXPECTED, and fails.
NOT_FOUND = (r"""command_not_found_handle() { printf '%s\0' UNEXPECTED "$@" """
             r""" > "$STUB_LOG/${EPOCHREALTIME/[.,]/}-$$-unexpected"; return 127; }""" "\n")


def install(bin_dir: Path, names: list[str]) -> None:
    """Put a stub named after each of ``names`` in ``bin_dir``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        (bin_dir / name).write_text(STUB)
        (bin_dir / name).chmod(0o755)


def records(log_dir: Path) -> list[list[str]]:
    """Every logged call as its argv (the command's name first), oldest first."""
    def start(p: Path) -> tuple[int, int]:
        micros, pid = p.name.split("-")[:2]
        return int(micros), int(pid)

    files = sorted(log_dir.iterdir(), key=start) if log_dir.is_dir() else []
    return [f.read_bytes().decode().split("\0")[:-1] for f in files]
