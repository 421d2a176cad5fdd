"""The instructors' answer key (notebooks/solutions/ANSWERS.md): it answers every exercise of
the notebooks' sources, and the students' hand-out never carries it."""

from __future__ import annotations

import re

from conftest import REPO

from labkit.cli import main

KEY = REPO / "notebooks" / "solutions" / "ANSWERS.md"
SRC = REPO / "notebooks" / "src"


def _sections() -> dict[str, str]:
    """The key's text per notebook number ("## 01 Single node" ... up to the next "## ")."""
    parts = re.split(r"^## (\d\d) .*$", KEY.read_text(), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_key_answers_every_exercise_of_each_notebook():
    sections = _sections()
    for src in sorted(SRC.glob("[0-9][0-9]_*.py")):
        nb = src.name[:2]
        names = re.findall(r"^\s*([A-Za-z_]\w*)\s*=.*# EXERCISE", src.read_text(), flags=re.M)
        assert names and nb in sections, f"{KEY}: no section '## {nb} ...' for {src.name}"
        missing = [n for n in names if f"`{n}" not in sections[nb]]
        assert not missing, f"{KEY}, section {nb}: no answer for {missing} ({src.name})"
        assert "Discussion:" in sections[nb], f"{KEY}, section {nb}: no discussion prompts"


def test_the_hand_out_never_carries_the_answer_key(tmp_path, capsys):
    dest = tmp_path / "labkit-notebooks"
    assert main(["class", "handout", "--to", str(dest)]) == 0
    given = sorted(p.name for p in dest.rglob("*") if p.is_file())
    assert "01_single_node.ipynb" in given
    assert "ANSWERS.md" not in given and not any("solution" in n for n in given), given
    assert not [p for p in dest.rglob("*") if p.is_file() and "Answer key" in p.read_text(
        errors="replace")]
