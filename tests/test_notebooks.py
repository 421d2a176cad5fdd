"""The notebook series: built from source, committed without outputs, parameters that CI
overrides declared, and (marked ``notebooks``) every solved notebook executed with papermill.

The executed series runs on the real Slurm mini-cluster (backend ``slurm``, the
``slurm_cluster`` fixture) when it can start, else on the local backend
(``LABKIT_NOTEBOOK_BACKEND=local|slurm`` forces one); the executed copies are kept under
``runs/ci/notebooks/`` (``BACKEND`` says which was used) and a failure names the notebook and
the cell.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import papermill as pm
import pytest

from labkit import regress
from labkit.exercises import ANSWERS_ENV
from labkit.exercises_audit import given_away, read_answers

REPO = Path(__file__).resolve().parents[1]
NB_DIR = REPO / "notebooks"
STUDENT = sorted(NB_DIR.glob("[0-9][0-9]_*.ipynb"))
SOLVED = sorted((NB_DIR / "solutions").glob("[0-9][0-9]_*.ipynb"))
# What CI / regress / make lab pass with -p; every notebook must declare each of them.
CI_OVERRIDES = ("profile", "backend", "cluster", "nodes", "gpus_per_node", "train_iters")
SERIES = [f"{i:02d}" for i in range(9)]


def test_the_whole_series_exists_in_both_versions():
    assert [p.name[:2] for p in STUDENT] == SERIES
    assert [p.name for p in SOLVED] == [p.name for p in STUDENT]


def test_notebooks_are_built_from_their_sources():
    r = subprocess.run([sys.executable, str(NB_DIR / "build_notebooks.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("path", STUDENT + SOLVED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_committed_notebooks_have_no_outputs(path):
    nb = nbformat.read(path, as_version=4)
    dirty = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count"))]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs; rebuild with build_notebooks.py"


@pytest.mark.parametrize("path", STUDENT + SOLVED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_ci_overrides_are_declared_parameters(path):
    params = pm.inspect_notebook(str(path))
    missing = [p for p in CI_OVERRIDES if p not in params]
    assert not missing, f"{path.name} does not declare {missing} in its parameters cell"
    nb = nbformat.read(path, as_version=4)
    first_code = next(c for c in nb.cells if c.cell_type == "code")
    assigned = [ln.split("=")[0].strip() for ln in first_code.source.splitlines()
                if ln.strip() and not ln.startswith("#")]
    unreadable = [n for n in assigned if n not in params]
    assert not unreadable, f"{path.name}: papermill cannot read parameters {unreadable}"
    undocumented = [n for n, p in params.items() if not p["help"]]
    assert not undocumented, f"{path.name}: parameters without a comment: {undocumented}"
    assert "parameters" in first_code.metadata.get("tags", [])
    assert nb.cells[0].source.startswith(f"# {path.name[:2]} ")
    assert "What you will learn" in nb.cells[0].source
    assert any(c.source.startswith("## Summary") for c in nb.cells if c.cell_type == "markdown")


@pytest.mark.parametrize("student", STUDENT, ids=lambda p: p.stem)
def test_students_get_fixme_where_solutions_have_answers(student):
    solved = NB_DIR / "solutions" / student.name
    s_text, a_text = student.read_text(), solved.read_text()
    n_fixme = s_text.count("= FIXME  # EXERCISE")
    assert "= FIXME" not in a_text
    assert n_fixme == a_text.count("# EXERCISE")
    if n_fixme:
        assert "import FIXME" in s_text or "FIXME," in s_text


def test_a_student_fixme_gets_a_hint_not_a_crash(tmp_path, monkeypatch):
    """Run the exercise cell of a student notebook: the unanswered FIXME is named."""
    nb = nbformat.read(NB_DIR / "00_setup_and_cluster.ipynb", as_version=4)
    cell = next(c for c in nb.cells if "check_world_size(" in c.source)
    monkeypatch.delenv("LABKIT_EXERCISES_STRICT", raising=False)
    monkeypatch.setenv(regress.METRICS_ENV, str(tmp_path / "m.json"))
    ns: dict = {"nodes": 2, "gpus_per_node": 2}
    exec(cell.source, ns)  # noqa: S102 - our own committed notebook cell
    assert ns["world_size"] is ns["FIXME"]


# --- executing the series --------------------------------------------------------------------
@pytest.fixture(scope="module")
def series_env(request):
    """Backend and output folder shared by the notebooks of one session (02 reuses 01's run)."""
    backend = os.environ.get("LABKIT_NOTEBOOK_BACKEND")
    if backend is None:
        try:
            request.getfixturevalue("slurm_cluster")
            backend = "slurm"
        except pytest.skip.Exception:
            backend = "local"
    out = REPO / "runs" / "ci" / "notebooks"
    if out.exists():  # keep an earlier session's copies: moved aside, never deleted
        out.rename(out.with_name(f"notebooks.old-{time.strftime('%Y%m%d-%H%M%S')}"))
    out.mkdir(parents=True)
    (out / "BACKEND").write_text(backend + "\n")
    print(f"\nnotebook series: backend {backend}, executed copies in {out}")
    old = os.environ.get("LABKIT_RUN_ROOT")
    os.environ["LABKIT_RUN_ROOT"] = str(out / "runs")
    yield backend, out
    if old is None:
        os.environ.pop("LABKIT_RUN_ROOT", None)
    else:
        os.environ["LABKIT_RUN_ROOT"] = old


@pytest.mark.notebooks
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", SOLVED, ids=lambda p: p.stem)
def test_solved_notebook_runs(path, series_env):
    if not (REPO / "data" / "corpus_text_document.idx").exists():
        pytest.fail("no dataset: run `make data` (code/prepare_data.py) first")
    if shutil.which("bash") is None:
        pytest.fail("bash is needed by the launch scripts")
    backend, out = series_env
    answers = out / f"{path.stem}.answers.jsonl"
    answers.unlink(missing_ok=True)
    os.environ[ANSWERS_ENV] = str(answers)  # the kernel inherits it: each check writes its value
    try:
        r = regress.run_notebook(path, out, {"profile": "cpu", "backend": backend})
    finally:
        os.environ.pop(ANSWERS_ENV, None)
    assert r.ok, r.error  # names the notebook, the cell and the error
    assert not [k for k, v in r.metrics.items() if k.startswith("exercise.") and v is not True]
    # Every exercise's answer is nowhere before it, in the sources or in what the cells printed.
    shown = given_away(nbformat.read(r.output, as_version=4).cells, read_answers(answers))
    assert not shown, "\n".join(shown)


@pytest.mark.notebooks
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", STUDENT, ids=lambda p: p.stem)
def test_student_notebook_runs_with_its_fixmes_left_in(path, series_env, monkeypatch):
    """A student who runs the notebook without answering sees each check's "not answered yet"
    and the notebook goes on to its end (no traceback); the solved notebooks ran before in
    this session, so their runs are reused."""
    backend, out = series_env
    monkeypatch.delenv("LABKIT_EXERCISES_STRICT", raising=False)  # a student's kernel: lenient
    monkeypatch.setenv(regress.METRICS_ENV, str(out / f"{path.stem}.student.metrics.json"))
    executed = out / f"{path.stem}.student.ipynb"
    pm.execute_notebook(str(path), str(executed), parameters={"profile": "cpu", "backend": backend},
                        cwd=str(NB_DIR), kernel_name="python3", progress_bar=False,
                        execution_timeout=900, log_output=False)  # raises, naming the cell, on error
    cells = nbformat.read(executed, as_version=4).cells
    fixme = [i for i, c in enumerate(cells) if c.cell_type == "code" and "= FIXME" in c.source]
    said = [i for i, c in enumerate(cells) if c.cell_type == "code" and any(
        "not answered yet" in (o.get("text") or "") for o in c.get("outputs", []))]
    assert fixme and len(said) >= len(fixme), (fixme, said)
    errors = [i for i, c in enumerate(cells) if c.cell_type == "code"
              and any(o.get("output_type") == "error" for o in c.get("outputs", []))]
    assert not errors, f"{path.name}: cells {errors} raised"
    # What the page would show wrong (the browser tier renders some notebooks; these checks read
    # the outputs of every one): a figure drawn but not shown as an image, or shown as text.
    code = [(i, c) for i, c in enumerate(cells) if c.cell_type == "code"]
    no_image = [i for i, c in code if "plt.show()" in c.source
                and not any("image/png" in o.get("data", {}) for o in c.outputs)]
    as_text = [i for i, c in code if any(  # a figure's own output carries its image beside it
        "<Figure size" in str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", ""))
        and "image/png" not in o.get("data", {}) for o in c.outputs)]
    assert not no_image and not as_text, \
        f"{path.name}: figures not shown as images in cells {no_image}, as text in cells {as_text}"
