"""Build the notebooks from one source each: the student version and the solved version.

    .venv/bin/python notebooks/build_notebooks.py          # writes notebooks/NN_*.ipynb and
                                                           # notebooks/solutions/NN_*.ipynb
    .venv/bin/python notebooks/build_notebooks.py --check  # exit 1 if a built file is stale

Sources are ``notebooks/src/NN_name.py`` in the "percent" format:

    # %% [markdown]            a markdown cell; each line starts with "# "
    # %% tags=["parameters"]   a code cell with tags (papermill's parameters cell)
    # %%                       a code cell

An answer line ends with ``# EXERCISE``: the solved notebook keeps the answer, the student
notebook gets ``name = FIXME``. Built notebooks carry no outputs (a test enforces it).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
SRC = HERE / "src"
SOLUTIONS = HERE / "solutions"
CELL_RE = re.compile(r"^# %%(?P<md> \[markdown\])?(?: tags=(?P<tags>\[.*\]))?\s*$")
EXERCISE_RE = re.compile(r"^(?P<lhs>\s*[A-Za-z_][\w, ]*=\s*)(?P<answer>.+?)\s*# EXERCISE(?P<note>.*)$")
KERNEL = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def parse_source(text: str) -> list[dict]:
    """The cells of a source file: ``{"kind": "markdown"|"code", "tags": [...], "lines": [...]}``."""
    cells: list[dict] = []
    for line in text.splitlines():
        m = CELL_RE.match(line)
        if m:
            cells.append({"kind": "markdown" if m["md"] else "code",
                          "tags": json.loads(m["tags"]) if m["tags"] else [], "lines": []})
        elif cells:
            cells[-1]["lines"].append(line)
    for c in cells:
        while c["lines"] and not c["lines"][-1].strip():
            c["lines"].pop()
        while c["lines"] and not c["lines"][0].strip():
            c["lines"].pop(0)
        if c["kind"] == "markdown":
            c["lines"] = [ln[2:] if ln.startswith("# ") else ln.lstrip("#") for ln in c["lines"]]
    return [c for c in cells if c["lines"]]


def _code(lines: list[str], solved: bool) -> str:
    out = []
    for ln in lines:
        m = EXERCISE_RE.match(ln)
        if not m:
            out.append(ln)
        elif solved:
            out.append(f"{m['lhs']}{m['answer']}  # EXERCISE{m['note']}")
        else:
            note = m["note"].strip(" :") or "replace FIXME with your answer"
            out.append(f"{m['lhs']}FIXME  # EXERCISE: {note}")
    return "\n".join(out)


def build(src: Path, solved: bool) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = KERNEL
    nb.metadata["language_info"] = {"name": "python"}
    for i, c in enumerate(parse_source(src.read_text())):
        if c["kind"] == "markdown":
            cell = nbformat.v4.new_markdown_cell("\n".join(c["lines"]))
        else:
            cell = nbformat.v4.new_code_cell(_code(c["lines"], solved))
        if c["tags"]:
            cell.metadata["tags"] = c["tags"]
        cell["id"] = f"{src.stem[:2]}-{i:03d}"  # stable ids keep git diffs small
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def targets(src: Path) -> tuple[Path, Path]:
    return HERE / f"{src.stem}.ipynb", SOLUTIONS / f"{src.stem}.ipynb"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only check that the built files are "
                    "up to date")
    args = ap.parse_args(argv)
    stale = []
    SOLUTIONS.mkdir(exist_ok=True)
    for src in sorted(SRC.glob("[0-9][0-9]_*.py")):
        for path, solved in zip(targets(src), (False, True), strict=True):
            text = nbformat.writes(build(src, solved)) + "\n"
            if args.check:
                if not path.exists() or path.read_text() != text:
                    stale.append(path)
            elif not path.exists() or path.read_text() != text:
                path.write_text(text)
                print(f"wrote {path.relative_to(HERE.parent)}")
    if stale:
        print("stale notebooks (run notebooks/build_notebooks.py): "
              + ", ".join(str(p.relative_to(HERE.parent)) for p in stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
