"""Every documented command runs as written, in a fresh checkout.

Commands are read from the fenced ``bash``/``console`` blocks (and ``$ `` lines) of README.md,
notebooks/README.md and docs/*.md, and from the runbook at the top of code/pretrain_gpt.py. Each
one runs in a clone of the repository (the venv and the prepared data linked in, as after
``make setup data``) with the venv's ``bin`` first on PATH. A ``$ command`` block that shows
output is compared with the real output. The few commands that cannot run here are listed in
``NOT_HERE`` with the reason and the test that covers them; a new documented command that is in
neither list simply runs, so a command that stops working fails this test.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

DOC_FILES = [REPO / "README.md", REPO / "notebooks" / "README.md",
             *sorted((REPO / "docs").glob("*.md"))]
RUNBOOK = REPO / "code" / "pretrain_gpt.py"
_FENCE = re.compile(r"^```(\w*)\s*$")
_RUNBOOK_CMD = re.compile(r"^\s{4}((?:\S+=\S+ )*(?:\.venv/bin/|make |sbatch |torchrun |labkit ).*)$")

# command (as documented) -> why it does not run inside this test, and what covers it instead.
NOT_HERE = {
    "make lab": "runs the whole series for ~10 minutes: tests/test_notebooks.py runs the same "
                "solved notebooks with papermill in make test",
    "make test": "this test is part of it",
    "make test-fast": "the pure and fake-Slurm tiers, which make test runs itself",
    "make test-repeat N=20 HOGS=2": "the fast tiers 20 times (hours here): "
                                    "tests/test_repeat_tests.py runs the same script on a few tests",
    ".venv/bin/pytest --shuffle 7": "the whole suite again, shuffled: tests/test_repeat_tests.py "
                                    "checks --shuffle",
    "make gpu-check": "needs a CUDA device (tests marked gpu)",
    "make jupyter": "a server that runs until stopped: test_make_jupyter_starts below",
}
# documented lines that are fragments of a job script, not commands a person types.
JOB_SCRIPT_LINES = ("$SLURM_NODEID", "$HEAD_NODE", "sbatch runs/")


def _blocks(path: Path) -> list[tuple[str, list[str]]]:
    """(language, lines) of each fenced block."""
    out, lang, cur = [], None, []
    for line in path.read_text().splitlines():
        m = _FENCE.match(line)
        if m and lang is None:
            lang, cur = m.group(1), []
        elif line.strip() == "```" and lang is not None:
            out.append((lang, cur))
            lang = None
        elif lang is not None:
            cur.append(line)
    return out


def _join(lines: list[str]) -> list[str]:
    cmds, cur = [], ""
    for line in lines:
        cur += line.rstrip()
        if cur.endswith("\\"):
            cur = cur[:-1].rstrip() + " "
            continue
        if cur.strip():
            cmds.append(cur.strip())
        cur = ""
    return cmds


def documented() -> list[tuple[str, str, str | None, str | None]]:
    """(where, cwd-relative cd prefix, command, expected output or None)."""
    found = []
    for path in DOC_FILES:
        rel = str(path.relative_to(REPO))
        for lang, lines in _blocks(path):
            if lines and lines[0].startswith("$ "):  # a console session: command then output
                cmd = lines[0][2:].strip()
                found.append((rel, cmd, "\n".join(lines[1:]).strip() or None))
            elif lang in ("bash", "sh", "shell"):
                cd = ""  # a `cd DIR` line holds for the rest of its block, as in a terminal
                for cmd in _join(lines):
                    if cmd.startswith("cd ") and "&&" not in cmd:
                        cd = f"{cmd} && "
                        continue
                    found.append((rel, cd + cmd, None))
    doc = ast.get_docstring(ast.parse(RUNBOOK.read_text())) or ""
    for cmd in _join(_runbook_lines(doc)):
        found.append(("code/pretrain_gpt.py", cmd, None))
    return found


def _runbook_lines(doc: str) -> list[str]:
    """Command lines of the runbook: a line starting a command, and its continuation lines."""
    lines, cont = [], False
    for line in doc.splitlines():
        if cont or _RUNBOOK_CMD.match(line):
            lines.append(line.strip())
            cont = line.rstrip().endswith("\\")
    return lines


def _strip_comment(cmd: str) -> str:
    return re.sub(r"\s+#\s.*$", "", cmd).strip()



DOCUMENTED = documented()


def test_the_docs_document_commands():
    where = {w for w, _, _ in DOCUMENTED}
    assert {"README.md", "notebooks/README.md", "code/pretrain_gpt.py"} <= where, where
    assert len(DOCUMENTED) >= 6


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A fresh clone of the committed repository, with the venv and data/ linked in."""
    if not (REPO / ".venv" / "bin" / "labkit").exists() or not (REPO / "data").is_dir():
        pytest.skip("run `make setup data` first (make test does)")
    clone = tmp_path_factory.mktemp("docs") / "labkit"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    # The linked venv is already installed: keep make from re-installing it for a newer clone.
    os.utime(clone / "pyproject.toml", (0, 0))
    (clone / ".venv").symlink_to(REPO / ".venv")
    (clone / "data").symlink_to(REPO / "data")
    return clone


def _env(clone: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LABKIT_", "PYTEST_", "SLURM_"))}
    env["PATH"] = f"{clone / '.venv' / 'bin'}:{env.get('PATH', '')}"
    # The venv's labkit is an editable install of the repository it was made in: make the
    # clone's own package the one that imports.
    env["PYTHONPATH"] = str(clone)
    return env


def _run(cmd: str, clone: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], cwd=clone, env=_env(clone), capture_output=True,
                          text=True, timeout=timeout)


def _skip_reason(plain: str) -> str | None:
    if plain in NOT_HERE:
        return NOT_HERE[plain]
    if any(s in plain for s in JOB_SCRIPT_LINES):
        return "a line of the rendered job script (tests/test_slurm.py runs job scripts)"
    return None


def _params():
    # A document with a command that trains (torchrun, papermill) is in the engine tier as a
    # whole: its commands run in order in one checkout, and make test runs the engine tier in
    # a pytest of its own, after the others.
    trains = {where for where, cmd, _ in DOCUMENTED if _skip_reason(_strip_comment(cmd)) is None
              and any(w in cmd for w in ("torchrun", "papermill"))}
    out = []
    for i, (where, cmd, expected) in enumerate(DOCUMENTED):
        plain = _strip_comment(cmd)
        why = _skip_reason(plain)
        marks = [pytest.mark.skip(reason=why)] if why else []
        if where in trains:
            marks.append(pytest.mark.engine)
        out.append(pytest.param(where, plain, expected, id=f"{where}:{i}:{plain[:40]}",
                                marks=marks))
    return out


@pytest.mark.parametrize("where,cmd,expected", _params())
def test_documented_command_runs(where, cmd, expected, checkout):
    # The commands of one document run in order, so a later one may use what an earlier made
    # (the runbook makes runs/tp2pp2 before training it).
    p = _run(cmd, checkout)
    out = (p.stdout + p.stderr).strip()
    if expected is None:
        assert p.returncode == 0, f"{where}: `{cmd}` exited {p.returncode}:\n{out[-3000:]}"
    else:
        # A documented example of output is the real output (line breaks may differ).
        assert " ".join(out.split()) == " ".join(expected.split()), (
            f"{where}: `{cmd}` prints something else than documented:\n--- documented\n"
            f"{expected}\n--- real\n{out}")


def test_make_jupyter_starts(checkout):
    """`make jupyter` starts JupyterLab, as root too (it passes --allow-root then)."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    proc = subprocess.Popen(["make", "jupyter"], cwd=checkout,
                            env={**_env(checkout), "BROWSER": "true"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if "http://127.0.0.1" in line or "http://localhost" in line:
                break
            if proc.poll() is not None:
                break
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)
    text = "".join(seen)
    assert "Running as root is not recommended" not in text or "--allow-root" in text
    assert "http://" in text, f"make jupyter did not start a server:\n{text[-2000:]}"
