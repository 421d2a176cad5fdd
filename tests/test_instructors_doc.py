"""docs/INSTRUCTORS.md's `text` blocks name the site's files, so they cannot run here as
written (tests/test_docs.py runs the `sh` blocks): each `labkit ...` line in them must at least
be a command labkit's own parser accepts, with its options as spelled. What each one does is
run on the mini-cluster by the class tiers (test_classroom_slurm, test_doctor_slurm,
test_hub_slurm)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from labkit.cli import build_parser

DOC = Path(__file__).resolve().parents[1] / "docs" / "INSTRUCTORS.md"


def _text_commands() -> list[str]:
    out, inside = [], False
    for line in DOC.read_text().splitlines():
        if line.startswith("```"):
            inside = line.strip() == "```text" if not inside else False
            continue
        if inside:
            cmd = re.sub(r"\s+#\s.*$", "", line).strip()
            cmd = cmd[len("sudo "):] if cmd.startswith("sudo ") else cmd
            if cmd.startswith("labkit "):
                out.append(cmd)
    return out


COMMANDS = _text_commands()


def test_the_guide_names_the_class_commands():
    joined = "\n".join(COMMANDS)
    for needed in ("labkit class hub up", "labkit class hub status", "labkit class hub down",
                   "labkit class handout --students", "labkit class plan --students 30"):
        assert needed in joined, needed


@pytest.mark.parametrize("cmd", COMMANDS)
def test_documented_command_parses(cmd, capsys):
    try:
        build_parser().parse_args(shlex.split(cmd)[1:])
    except SystemExit as e:
        pytest.fail(f"docs/INSTRUCTORS.md: `{cmd}` is refused by labkit's parser (exit {e.code}):"
                    f"\n{capsys.readouterr().err}")
