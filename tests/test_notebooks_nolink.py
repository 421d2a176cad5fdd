"""Notebooks 02 and 03 where user namespaces are refused: the local backend's nodes share
loopback (a fake ``unshare`` that fails, at the subprocess boundary, the kernel inherits it),
both notebooks still run to their end with every exercise right, and they show the committed
reference measurement labelled as a reference beside the student's own numbers.
"""

from __future__ import annotations

import json
import os

import nbformat
import pytest
from conftest import REPO

from labkit import regress
from labkit.measured.link import reference

pytestmark = [pytest.mark.notebooks, pytest.mark.timeout(900)]
SOLVED = REPO / "notebooks" / "solutions"


def _printed(nb) -> str:
    return "\n".join(o.get("text") or "" for c in nb.cells if c.cell_type == "code"
                     for o in c.get("outputs", []))


def test_02_and_03_show_the_reference_where_namespaces_are_refused(tmp_path, monkeypatch):
    if not (REPO / "data" / "corpus_text_document.idx").exists():
        pytest.fail("no dataset: run `make data` (code/prepare_data.py) first")
    fake = tmp_path / "bin" / "unshare"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("LABKIT_RUN_ROOT", str(tmp_path / "runs"))
    ref = reference()
    for stem in ("02_multi_node_data_parallel", "03_communication"):
        r = regress.run_notebook(SOLVED / f"{stem}.ipynb", tmp_path / "out",
                                 {"profile": "cpu", "backend": "local", "train_iters": 4})
        assert r.ok, r.error
        assert all(v is True for k, v in r.metrics.items() if k.startswith("exercise.")), r.metrics
        text = _printed(nbformat.read(r.output, as_version=4))
        assert "loopback" in text and "Operation not permitted" in text, text[-2000:]
        label = f"REFERENCE, not your machine ({ref['machine']}, {ref['date']}"
        assert label in text, text[-2000:]
    runs = tmp_path / "runs"
    for run in ("nb02_dp_2nodes", "nb03_busbw"):
        assert json.loads((runs / run / "node_link.json").read_text())["namespaces"] is False
