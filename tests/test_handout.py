"""The hand-out (``labkit class handout``): the student notebooks, never the solutions, into a
student's own folder; an edited notebook is never overwritten."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from labkit.errors import LabkitError
from labkit.handout import MANIFEST, handout, student_notebooks


@pytest.fixture
def source(tmp_path) -> Path:
    """A checkout's notebooks/: two student notebooks and the solutions folder."""
    src = tmp_path / "notebooks"
    (src / "solutions").mkdir(parents=True)
    for name in ("00_setup.ipynb", "01_single_node.ipynb"):
        (src / name).write_text(json.dumps({"cells": [], "v": 1, "name": name}))
        (src / "solutions" / name).write_text("the answers")
    (src / "README.md").write_text("not a notebook")
    return src


def _actions(rows) -> dict[str, str]:
    return {r.name: r.action for r in rows}


def test_the_students_notebooks_only(source, tmp_path):
    dest = tmp_path / "home" / "labkit-notebooks"
    rows = handout(dest, source)
    assert _actions(rows) == {"00_setup.ipynb": "new", "01_single_node.ipynb": "new"}
    assert sorted(p.name for p in dest.iterdir()) == sorted(["00_setup.ipynb",
                                                             "01_single_node.ipynb", MANIFEST])
    assert (dest / "01_single_node.ipynb").read_bytes() == \
        (source / "01_single_node.ipynb").read_bytes()
    assert (dest.stat().st_mode & 0o077) == 0  # the student's own folder
    # again: nothing changes
    assert set(_actions(handout(dest, source)).values()) == {"same"}


def test_an_edited_notebook_is_never_overwritten(source, tmp_path):
    dest = tmp_path / "nb"
    handout(dest, source)
    mine = dest / "01_single_node.ipynb"
    mine.write_text("my work")
    # nothing newer: the edited copy is kept, nothing is added
    assert _actions(handout(dest, source))["01_single_node.ipynb"] == "edited"
    assert mine.read_text() == "my work" and len(list(dest.glob("*.ipynb"))) == 2
    # a newer version: beside the edited one, named; the unedited 00 is updated in place
    (source / "01_single_node.ipynb").write_text("version 2")
    (source / "00_setup.ipynb").write_text("version 2 of 00")
    rows = {r.name: r for r in handout(dest, source)}
    assert rows["01_single_node.ipynb"].action == "beside"
    assert rows["00_setup.ipynb"].action == "updated"
    beside = Path(rows["01_single_node.ipynb"].path)
    assert beside.parent == dest and beside.name.startswith("01_single_node.handout-")
    assert beside.read_text() == "version 2" and mine.read_text() == "my work"
    assert (dest / "00_setup.ipynb").read_text() == "version 2 of 00"
    # the same newer version again: not a second copy
    assert _actions(handout(dest, source))["01_single_node.ipynb"] == "same"
    assert len(list(dest.glob("01_single_node*.ipynb"))) == 2


def test_a_notebook_there_before_any_hand_out_is_kept(source, tmp_path):
    dest = tmp_path / "nb"
    dest.mkdir()
    (dest / "00_setup.ipynb").write_text("written before")
    assert _actions(handout(dest, source))["00_setup.ipynb"] == "beside"
    assert (dest / "00_setup.ipynb").read_text() == "written before"


def test_symlinks_are_never_followed(source, tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(LabkitError, match="symlink"):
        handout(link, source)
    dest = tmp_path / "nb"
    dest.mkdir()
    (dest / "01_single_node.ipynb").symlink_to(target / "victim")
    rows = _actions(handout(dest, source))
    assert rows["01_single_node.ipynb"].startswith("skipped")
    assert not (target / "victim").exists()


def test_bad_places_are_named(source, tmp_path):
    with pytest.raises(LabkitError, match="no student notebooks"):
        handout(tmp_path / "nb", tmp_path)
    with pytest.raises(LabkitError, match="inside the checkout"):
        handout(source / "solutions", source)


def test_the_shipped_series_and_the_cli(tmp_path):
    names = [p.name for p in student_notebooks()]
    assert "01_single_node.ipynb" in names and len(names) >= 9
    dest = tmp_path / "mine"
    p = subprocess.run([sys.executable, "-m", "labkit", "class", "handout", "--to", str(dest),
                        "--json"], capture_output=True, text=True, cwd=REPO,
                       env={**os.environ, "HOME": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    assert sorted(r["name"] for r in json.loads(p.stdout)) == names
    assert not list(dest.rglob("*solution*"))
