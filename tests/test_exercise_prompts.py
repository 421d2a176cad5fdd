"""Every notebook's exercises need thought: neither the prompt a student reads nor the hint a
wrong answer gets contains the answer.

Prompts are read from the built student notebooks as rendered (markdown and code from the
exercise's heading to its FIXME cell) and compared with the solved notebooks' answers. Hints are
the checks' own messages (``str`` and the markdown a notebook renders) for a wrong answer and for
a FIXME left in place, with the expected value worked out by the check itself.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from labkit import exercises as ex
from labkit import exercises_reading as exr
from labkit.exercises import FIXME

REPO = Path(__file__).resolve().parents[1]
NB = REPO / "notebooks"
SERIES = sorted(p.name for p in NB.glob("0[0-8]_*.ipynb"))
ANSWER = re.compile(r"^\s*(?P<lhs>[A-Za-z_]\w*)\s*=\s*(?P<rhs>.+?)\s*# EXERCISE", re.M)
# The rule of an exercise written as its answer (what a prompt once said), per notebook.
FORMULAS = {
    "00": [r"nodes\s*[x×*]\s*(gpus|GPUs)", r"world_size\s*=\s*nodes"],
    "01": [r"global_batch_size\s*//", r"global\s*/\s*\(\s*micro"],
    "02": [r"t1\s*/\s*t2", r"t2\s*/\s*t1"],
    "06": [r"\(\s*pp?\s*-\s*1\s*\)\s*/", r"p\s*-\s*1\s*\)\s*/\s*\(?\s*v"],
}


def _cells(name: str) -> list[dict]:
    return json.loads((NB / name).read_text())["cells"]


def _text(cell: dict) -> str:
    return "".join(cell["source"])


def _prompts(name: str) -> list[str]:
    """For each FIXME cell: the cells from the markdown that opens the exercise (the closest
    one before it that names an exercise, else the closest markdown) to the FIXME cell."""
    cells = _cells(name)
    out = []
    for i, c in enumerate(cells):
        if c["cell_type"] != "code" or "= FIXME" not in _text(c):
            continue
        md = [j for j in range(i) if cells[j]["cell_type"] == "markdown"]
        named = [j for j in md if "exercise" in _text(cells[j]).lower()]
        start = named[-1] if named and named[-1] >= (md[-2] if len(md) > 1 else 0) else md[-1]
        out.append("\n".join(_text(cells[j]) for j in range(start, i + 1)))
    return out


def _answers(name: str) -> list[tuple[str, str]]:
    return [(m["lhs"], m["rhs"]) for c in _cells(f"solutions/{name}")
            if c["cell_type"] == "code" for m in ANSWER.finditer(_text(c))]


def _squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


@pytest.mark.parametrize("name", SERIES)
def test_every_notebook_has_an_exercise_and_its_prompt_holds_no_answer(name):
    prompts, answers = _prompts(name), _answers(name)
    assert prompts and answers, f"{name}: no exercise (a FIXME cell and its solved answer)"
    cells = _cells(name)
    last = max(i for i, c in enumerate(cells) if c["cell_type"] == "code" and "= FIXME" in _text(c))
    student = "\n".join(_text(c) for c in cells[:last + 1])  # what is read before answering
    for lhs, rhs in answers:
        literal = re.fullmatch(r"""(["'])\w+\1|-?\d+(\.\d+)?""", rhs)
        if literal and rhs[0] in "\"'":
            # A choice: the prompt offers it among others, it does not single it out.
            options = set(re.findall(r'"(\w+)"', "\n".join(prompts)))
            assert rhs.strip("\"'") in options and len(options) >= 3, (name, lhs, options)
        elif not literal:
            # A computed answer: its expression is nowhere before the exercises are done.
            assert _squeeze(rhs) not in _squeeze(student), f"{name}: {lhs} = {rhs} is given away"
    for pattern in FORMULAS.get(name[:2], []):
        for p in prompts:
            assert not re.search(pattern, p), f"{name}: the prompt states the rule as a formula " \
                                              f"({pattern}):\n{p}"


# --- hints --------------------------------------------------------------------------------------
def _renderings(v) -> list[str]:
    if isinstance(v, str):
        return [v]
    if isinstance(v, bool) or v is None:
        return []
    if isinstance(v, int):
        return [rf"(?<![\d.]){v}(?![\d.])"]
    return [re.escape(f"{v:{f}}") for f in (".2f", ".3f", ".4f", ".0%", ".1%")] + [re.escape(repr(v))]


def _assert_hint_hides(res, expected, *, what: str) -> None:
    assert not res.passed, (what, str(res))
    for text in (str(res), res._repr_markdown_()):
        for e in expected if isinstance(expected, tuple) else (expected,):
            for pattern in _renderings(e):
                assert not re.search(pattern if not isinstance(e, str) else re.escape(pattern), text), \
                    f"{what}: the hint shows the answer {e!r}: {text}"


BREAKDOWN = pd.DataFrame({"rank": [0, 1], "compute_ms": [310.0, 290.0],
                          "communication_ms": [120.0, 150.0], "memcpy_ms": [3.0, 2.0],
                          "idle_ms": [40.0, 60.0]})


class _Failure:
    kind, line, rank, message = "python_exception", 57, 1, "ValueError: boom"


# Per notebook: (check, its keyword arguments, a wrong answer, the expected value(s) to hide).
HINTS = {
    "00": (ex.check_world_size, dict(nodes=3, gpus_per_node=2), 5, 6),
    "01": (ex.check_num_microbatches, dict(global_batch_size=24, micro_batch_size=2, dp=2), 12, 6),
    "02": (ex.check_scaling_efficiency, dict(time_1=111.9, time_n=246.2, n=2), 2.2, 111.9 / 246.2),
    "03": (exr.check_crossing_axis, dict(tp=2, pp=2, nodes=2, gpus_per_node=2), "tp", "pp"),
    "04": (exr.check_profile_reading, dict(breakdown=BREAKDOWN), ("idle", "overlap"),
           ("compute", "more_ranks")),
    "05": (ex.check_max_micro_batch,
           dict(peak_gb_by_micro_batch={1: 0.31, 2: 0.42, 4: 0.63, 16: 1.9}, limit_gb=0.7), 16, 4),
    "06": (ex.check_bubble, dict(pp=2, num_microbatches=8), 0.5, 1 / 8),
    "07": (exr.check_fits_budget,
           dict(peak_gb={"accumulation": 5.1, "recompute": 4.9, "distributed_optimizer": 3.3},
                budget_gb=4.1, baseline={"weights": 1.2, "gradients": 1.2, "optimizer": 2.5,
                                         "activations": 0.6}),
           "recompute", "distributed_optimizer"),
    "08": (exr.check_diagnosis, dict(failures=[_Failure()]), "hang", "python_exception"),
}


@pytest.mark.parametrize("nb", sorted(HINTS))
def test_a_wrong_answer_or_a_fixme_gets_a_hint_without_the_answer(nb, monkeypatch):
    monkeypatch.delenv(ex.STRICT_ENV, raising=False)
    monkeypatch.delenv("LABKIT_METRICS_FILE", raising=False)
    check, kw, wrong, expected = HINTS[nb]
    args = wrong if isinstance(wrong, tuple) else (wrong,)
    _assert_hint_hides(check(*args, **kw), expected, what=f"{nb} {check.__name__}({wrong!r})")
    fixme = tuple(FIXME for _ in args)
    _assert_hint_hides(check(*fixme, **kw), expected, what=f"{nb} {check.__name__}(FIXME)")


def test_check_value_says_too_high_or_too_low_never_the_value(monkeypatch):
    monkeypatch.delenv(ex.STRICT_ENV, raising=False)
    hint = "combine the two iteration times printed above"
    low = ex.check_value("speedup", 1.2, 1.87, hint=hint)
    high = ex.check_value("speedup", 2.6, 1.87, hint=hint)
    assert "too low" in str(low) and "too high" in str(high) and hint in str(low)
    for res in (low, high):
        _assert_hint_hides(res, 1.87, what="check_value")
    word = ex.check_value("phase", "idle", "compute", hint="the largest bar")
    _assert_hint_hides(word, "compute", what="check_value (a word)")
    assert ex.check_value("speedup", 1.88, 1.87, hint=hint).passed


# --- what an executed notebook shows before an answer --------------------------------------------
def _executed(*cells: tuple[str, str]) -> list[dict]:
    """Cells as an executed notebook holds them: (source, printed output)."""
    return [{"cell_type": "code", "source": src, "outputs": [{"name": "stdout", "text": out}]}
            for src, out in cells]


def test_an_answer_printed_before_its_exercise_is_found_and_one_printed_after_is_not():
    from labkit.exercises_audit import given_away

    answers = [{"name": "bubble", "value": 0.25}, {"name": "num_microbatches", "value": 2}]
    before = _executed(
        ("layout = check_hybrid(...)", "Correct (hybrid): TP=2 x PP=2; bubble (PP-1)/m = 0.25."),
        ("print(cfg.summary())", "batch: global 8 = micro 2 x DP 2 x 2 microbatch(es)"),
        ("m = 2  # EXERCISE", ""),
        ("check_num_microbatches(m)", "Correct (num_microbatches): 8 / (2 x 2) = 2 microbatches"),
        ("bubble = 0.25  # EXERCISE", ""),
        ("check_bubble(bubble)", "Correct (bubble): (2 - 1) / (4) = 0.250"))
    found = given_away(before, answers)
    assert len(found) == 2 and "bubble = 0.25" in found[0] and "cell 0" in found[0], found
    assert "num_microbatches = 2" in found[1] and "cell 1" in found[1], found
    after = [before[2], before[3], before[4], before[5], before[1], before[0]]
    assert given_away(after, answers) == []
    # a bare 2 is not an answer shown: it needs a word that names it; a heading's number is
    # the section's
    heading = {"cell_type": "markdown", "source": "## 2 Microbatches\nMore microbatches: fewer idle slots"}
    assert given_away(_executed(("gpus_per_node = 2", "2")) + [heading] + after[:2], answers[1:]) == []
    heading["source"] += "; 2 microbatches here"
    assert given_away([heading] + after[:2], answers[1:]) != []


@pytest.mark.parametrize("name", SERIES)
def test_exercises_are_numbered_by_their_notebook_in_order(name):
    """One scheme across the series: "Exercise NN.k", NN the notebook, k = 1, 2, ... in order."""
    md = "\n".join(_text(c) for c in _cells(name) if c["cell_type"] == "markdown")
    numbers = re.findall(r"\*{0,2}Exercise (\d+)\.(\d+)", md)
    assert numbers, f"{name}: no numbered exercise"
    assert all(nb == name[:2] for nb, _ in numbers), f"{name}: {numbers}"
    assert [int(k) for _, k in numbers] == list(range(1, len(numbers) + 1)), f"{name}: {numbers}"
    assert len(numbers) >= len(_prompts(name)), (name, numbers)  # every FIXME cell has its number
