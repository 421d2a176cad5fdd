"""Does an executed notebook show an exercise's answer before the student gives it?

Each check appends the value it checked to ``$LABKIT_EXERCISE_ANSWERS`` (``labkit.exercises``).
``given_away`` takes those values and the executed notebook, finds each exercise's answer cell
(the last cell holding ``# EXERCISE`` at or before the cell that printed the check's result)
and searches every cell before it, source and outputs, for the value:

- a number with decimals, in the ways a notebook prints one (``0.125``, ``12.5%``; for a value
  with at most two decimals also ``0.25`` and ``25%``);
- a whole number next to a word that names it (``2 microbatch(es)``, ``microbatches: 2``):
  a bare ``2`` is everywhere in a notebook;
- markdown headings are left out (``## 4 Nodes, ranks and ...`` numbers a section);
- choices (words) and layouts (tuples) are offered, not computed: not searched here
  (``tests/test_exercise_prompts.py`` checks that a choice is offered among others).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

# Words that name a whole-number answer, per check; a number within a few characters of one of
# them counts as shown.
NAMES = {
    "world_size": ("world size", "world_size", "ranks"),
    "num_microbatches": ("microbatch",),
    "max_micro_batch": ("micro batch", "micro_batch_size", "largest"),
}
NEAR = 24  # characters between a name and its number


def read_answers(path: str | Path) -> list[dict[str, Any]]:
    """The checks' values, in the order they ran (empty when no check ran)."""
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()]


def _text(cell: dict) -> str:
    source = "".join(cell.get("source", ""))
    if cell.get("cell_type") == "markdown":  # a heading's number is the section's, not a value
        source = "\n".join(ln for ln in source.splitlines() if not ln.lstrip().startswith("#"))
    parts = [source]
    for out in cell.get("outputs", []) or []:
        if "text" in out:
            parts.append("".join(out["text"]))
        for mime in ("text/plain", "text/markdown", "text/html"):
            data = (out.get("data") or {}).get(mime)
            if data:
                parts.append("".join(data))
    return "\n".join(parts)


def patterns(name: str, value: Any) -> list[str]:
    """The regexes that would show ``value`` (see the module's docstring); [] for choices."""
    if isinstance(value, bool) or value is None or isinstance(value, (str, list, tuple, dict)):
        return []
    if isinstance(value, int):
        v = rf"(?<![\d.]){value}(?![\d.])"
        words = NAMES.get(name, (name.replace("_", " "),))
        out = []
        for w in words:
            w = re.escape(w)
            out += [rf"{v}[^\n\d]{{0,{NEAR}}}?{w}", rf"{w}[^\n\d]{{0,{NEAR}}}?{v}"]
        return out
    if isinstance(value, float):
        shown = {f"{value:.3f}", f"{value * 100:.1f}\\s?%"}
        if round(value, 2) == value:
            shown |= {f"{value:.2f}", f"{value * 100:.0f}\\s?%"}
        return [rf"(?<![\d.]){s.replace('.', '[.]', 1)}(?![\d])" for s in sorted(shown)]
    return []


def given_away(cells: list[dict], answers: list[dict[str, Any]]) -> list[str]:
    """One line per exercise whose value is shown before its answer cell: which check, which
    value, the cell that shows it and the text around it."""
    found = []
    for a in answers:
        name, value = a["name"], a["value"]
        pats = patterns(name, value)
        if not pats:
            continue
        printed = [i for i, c in enumerate(cells) if c.get("cell_type") == "code"
                   and any(f"({name}):" in "".join(o.get("text", "")) for o in c.get("outputs", []))]
        if not printed:
            continue
        answer_cell = max((i for i in range(printed[0] + 1)
                           if "# EXERCISE" in "".join(cells[i].get("source", ""))), default=None)
        if answer_cell is None:
            continue
        for i in range(answer_cell):
            text = _text(cells[i])
            for pat in pats:
                m = re.search(pat, text)
                if m:
                    around = text[max(0, m.start() - 40):m.end() + 40].replace("\n", " ")
                    found.append(f"{name} = {value!r} is shown in cell {i} before its answer "
                                 f"(cell {answer_cell}): ...{around}...")
                    break
    return found
