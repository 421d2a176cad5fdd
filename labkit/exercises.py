"""Checks for the ``FIXME`` exercise cells of the notebooks (NVIDIA DLI style).

A student notebook holds ``tp = FIXME``; the cell below it calls a check such as
``check_layout(tp, pp, dp, world_size=4)``. A wrong answer gets a hint that carries the
numbers ("TP x PP x DP = 2 x 1 x 1 = 2, but the job has 4 ranks"), a right one a confirmation.

Every check returns a ``CheckResult`` (truthy when passed) and records its outcome through
``labkit.record.record`` so ``labkit regress`` can report "exercise checks passed".
With ``LABKIT_EXERCISES_STRICT=1`` (set by ``labkit regress`` for the solved notebooks) a wrong
answer raises ``ExerciseError``, so a broken solution fails the notebook at that very cell.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

from labkit.errors import LabkitError
from labkit.planner import plan
from labkit.record import record
from labkit.validate import env_path


class _Fixme:
    """The placeholder students replace.

    A student notebook must run to its end with every FIXME left in place, each check printing
    its "replace FIXME" hint. So arithmetic on FIXME gives FIXME (like NaN: ``FIXME * 2`` and
    ``t1 / FIXME`` are FIXME) and formatting it prints ``FIXME``. Only what must give a real
    Python value (``bool``, ``int``, ``float``, an index, an order comparison) raises
    ExerciseError, naming the FIXME.
    """

    _instance: _Fixme | None = None

    def __new__(cls) -> _Fixme:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "FIXME"

    def __format__(self, spec: str) -> str:
        return "FIXME"

    def _same(self, *_: Any) -> _Fixme:
        return self

    def _refuse(self, *_: Any) -> Any:
        raise ExerciseError("a value is still FIXME: replace FIXME with your answer and re-run "
                            "the cell")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _same
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _same
    __pow__ = __rpow__ = __neg__ = __pos__ = __abs__ = __round__ = _same
    __bool__ = __int__ = __float__ = __index__ = _refuse
    __lt__ = __le__ = __gt__ = __ge__ = _refuse
    __hash__ = object.__hash__
    __array_ufunc__ = None  # numpy defers to the operators above: np.float64(2) * FIXME is FIXME


FIXME = _Fixme()
STRICT_ENV = "LABKIT_EXERCISES_STRICT"
ANSWERS_ENV = "LABKIT_EXERCISE_ANSWERS"
"""A file each check appends its checked value to (one JSON line: name, value); the notebook
tests read it to search what a student sees before answering for that value."""


class ExerciseError(LabkitError, ValueError):
    """A FIXME left in place, or (in strict mode) a wrong answer."""


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one exercise check; truthy when the answer is right.

    ``value`` is what the notebook goes on with: the student's answer once it passes, else a
    correct one worked out by the check, so that a notebook with its FIXMEs left in place still
    runs to the end (the check's message never shows it).
    """

    name: str
    passed: bool
    message: str
    value: Any = None

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        return f"{'Correct' if self.passed else 'Not yet'} ({self.name}): {self.message}"

    def _repr_markdown_(self) -> str:
        mark = "✅ **Correct**" if self.passed else "❌ **Not yet**"
        return f"{mark} ({self.name}): {self.message}"


# Outcomes of this process's checks, in order (the notebook's kernel keeps them).
RESULTS: list[CheckResult] = []


def _finish(name: str, problems: list[str], ok_message: str, answer: Any = None,
            reference: Any = None) -> CheckResult:
    res = CheckResult(name, not problems, ok_message if not problems else " ".join(problems),
                      answer if not problems else reference)
    RESULTS.append(res)
    try:  # regress is optional here: a check must work in a bare notebook too
        record(f"exercise.{name}", bool(res.passed))
    except ImportError:
        pass
    answers = env_path(ANSWERS_ENV)  # set but empty: refused
    if answers is not None:
        with open(answers, "a") as fh:
            fh.write(json.dumps({"name": name, "value": res.value}, default=str) + "\n")
    print(res)
    if not res.passed and os.environ.get(STRICT_ENV, "") not in ("", "0"):
        raise ExerciseError(str(res))
    return res


def _holds_fixme(v: Any) -> bool:
    if v is FIXME:
        return True
    if isinstance(v, dict):
        return any(_holds_fixme(x) for x in (*v.keys(), *v.values()))
    if isinstance(v, (list, tuple, set, frozenset)):
        return any(_holds_fixme(x) for x in v)
    return False


def _unfilled(name: str, reference: Any = None, **answers: Any) -> CheckResult | None:
    """The hint for answers still FIXME (also inside a list, tuple or dict), else None."""
    left = [k for k, v in answers.items() if _holds_fixme(v)]
    if not left:
        return None
    return _finish(name, [f"not answered yet: {', '.join(left)} still FIXME: replace FIXME with "
                          f"your answer and re-run the cell."], "", reference=reference)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_world_size(answer: Any, *, nodes: int, gpus_per_node: int) -> CheckResult:
    """World size = nodes x processes (GPUs) per node."""
    want = nodes * gpus_per_node
    if (r := _unfilled("world_size", want, world_size=answer)) is not None:
        return r
    problems = [] if answer == want else [
        f"world_size = {answer!r}. The job has {nodes} node(s) with {gpus_per_node} GPU(s) "
        f"each, and every GPU (on CPU: every training process) runs exactly one rank. Count the "
        f"ranks on all the nodes."]
    return _finish("world_size", problems, f"{nodes} x {gpus_per_node} = {want} ranks.", answer,
                   want)


def check_layout(tp: Any, pp: Any, dp: Any, world_size: int) -> CheckResult:
    """TP x PP x DP must equal the number of ranks."""
    if (r := _unfilled("layout", tp=tp, pp=pp, dp=dp)) is not None:
        return r
    problems = []
    bad = [f"{k}={v!r}" for k, v in (("tp", tp), ("pp", pp), ("dp", dp))
           if not _is_int(v) or v < 1]
    if bad:
        problems.append(f"{', '.join(bad)}: each degree is a whole number >= 1.")
    elif tp * pp * dp != world_size:
        problems.append(f"TP x PP x DP = {tp} x {pp} x {dp} = {tp * pp * dp}, but the job has "
                        f"{world_size} ranks. One model replica takes TP x PP ranks; DP is how "
                        f"many replicas the ranks hold.")
    return _finish("layout", problems,
                   f"TP x PP x DP = {tp} x {pp} x {dp} = {world_size} ranks.", (tp, pp, dp))


def check_num_microbatches(answer: Any, *, global_batch_size: int, micro_batch_size: int,
                           dp: int) -> CheckResult:
    """Gradient accumulation steps = global / (micro x DP)."""
    per_step = micro_batch_size * dp
    want = global_batch_size // per_step
    if (r := _unfilled("num_microbatches", want, num_microbatches=answer)) is not None:
        return r
    problems = []
    if global_batch_size % per_step:
        problems.append(f"global batch {global_batch_size} is not divisible by micro "
                        f"{micro_batch_size} x DP {dp} = {per_step}: no whole number of "
                        f"microbatches exists; change the batch sizes first.")
    elif answer != want:
        problems.append(f"num_microbatches = {answer!r}. In one round of microbatches each of "
                        f"the {dp} data-parallel rank(s) takes {micro_batch_size} sample(s); the "
                        f"iteration is done when the rounds add up to the global batch of "
                        f"{global_batch_size} samples. How many rounds is that?")
    return _finish("num_microbatches", problems,
                   f"{global_batch_size} / ({micro_batch_size} x {dp}) = {want} microbatches "
                   f"(gradient accumulation steps) per iteration.", answer, want)


def check_bubble(answer: Any, *, pp: int, num_microbatches: int, vpp: int = 1,
                 rel_tol: float = 0.02) -> CheckResult:
    """Pipeline bubble relative to ideal compute: (p - 1) / (v x m)."""
    want = (pp - 1) / (vpp * num_microbatches)
    if (r := _unfilled("bubble", want, bubble=answer)) is not None:
        return r
    ok = isinstance(answer, (int, float)) and math.isclose(answer, want, rel_tol=rel_tol,
                                                          abs_tol=1e-9)
    chunks = f", each in {vpp} model chunks" if vpp > 1 else ""
    problems = [] if ok else [
        f"bubble = {answer!r}. With {pp} pipeline stages the last stage waits while the first "
        f"microbatch passes the {pp - 1} stage(s) before it, and the first stage idles as long at "
        f"the end of the backward pass; meanwhile each stage computes {num_microbatches} "
        f"microbatch slot(s){chunks}. The bubble is the idle slots relative to the computing "
        f"ones (a fraction, not a percentage)."]
    return _finish("bubble", problems, f"({pp} - 1) / ({vpp * num_microbatches}) = {want:.3f} "
                   f"of the ideal compute time is spent idle in the pipeline bubble.", answer, want)


def check_scaling_efficiency(answer: Any, *, time_1: float, time_n: float, n: int = 2,
                             weak: bool = True, abs_tol: float = 0.02) -> CheckResult:
    """Scaling efficiency from iteration times on 1 and n nodes.

    Weak scaling (same work per rank, n times the global batch): t1 / tn.
    Strong scaling (same global batch): t1 / (n x tn).
    """
    want = time_1 / time_n if weak else time_1 / (n * time_n)
    if (r := _unfilled("scaling_efficiency", want, efficiency=answer)) is not None:
        return r
    formula = (f"t1 / t{n} = {time_1:.1f} / {time_n:.1f}" if weak
               else f"t1 / ({n} x t{n}) = {time_1:.1f} / ({n} x {time_n:.1f})")
    ok = isinstance(answer, (int, float)) and abs(answer - want) <= abs_tol
    ideal = ("each rank does the same work on 1 and on {n} nodes, so the ideal {n}-node time is "
             "the 1-node time" if weak else
             "the same global batch is split over {n} times the ranks, so the ideal {n}-node time "
             "is the 1-node time divided by {n}").format(n=n)
    problems = [] if ok else [
        f"efficiency = {answer!r}. Efficiency is the ideal time over the measured time; here "
        f"{ideal}. Measured: 1 node {time_1:.1f} ms, {n} nodes {time_n:.1f} ms per iteration."
        + (" A value above 1 would mean the larger job beat the ideal: which time belongs on "
           "top?" if isinstance(answer, (int, float)) and answer > 1 and want <= 1 else "")]
    return _finish("scaling_efficiency", problems, f"{formula} = {want:.3f} "
                   f"({want:.0%} of ideal {'weak' if weak else 'strong'} scaling).", answer, want)


def _reference_hybrid(nodes: int, gpus_per_node: int, num_layers: int, num_attention_heads: int,
                      want_tp: int | None, want_pp: int | None) -> tuple[int, int, int, int] | None:
    """A layout that passes ``check_hybrid``: (tp, pp, micro 1, global batch of 2 x PP
    microbatches), or None when the rules admit none."""
    ws = nodes * gpus_per_node
    for tp in [want_tp] if want_tp else range(1, gpus_per_node + 1):
        for pp in [want_pp] if want_pp else range(1, num_layers + 1):
            if (tp <= gpus_per_node and ws % (tp * pp) == 0 and num_layers % pp == 0
                    and num_attention_heads % tp == 0):
                return tp, pp, 1, ws // (tp * pp) * (2 * pp if pp > 1 else 1)
    return None


def check_hybrid(tp: Any, pp: Any, micro_batch_size: Any, global_batch_size: Any, *,
                 nodes: int, gpus_per_node: int, num_layers: int, num_attention_heads: int,
                 want_tp: int | None = None, want_pp: int | None = None,
                 min_pp: int = 1) -> CheckResult:
    """A hybrid TP x PP x DP layout for ``nodes`` x ``gpus_per_node`` ranks.

    Every rule is checked at once and every number is named; ``want_tp``/``want_pp`` pin the
    layout the exercise asks for (e.g. TP=2 x PP=2 on 2 nodes); ``min_pp`` asks for a pipeline
    of at least that many stages and leaves the rest to the student.
    """
    ref = _reference_hybrid(nodes, gpus_per_node, num_layers, num_attention_heads, want_tp,
                            want_pp or (min_pp if min_pp > 1 else None))
    if (r := _unfilled("hybrid", ref, tp=tp, pp=pp, micro_batch_size=micro_batch_size,
                       global_batch_size=global_batch_size)) is not None:
        return r
    ws = nodes * gpus_per_node
    vals = dict(tp=tp, pp=pp, micro_batch_size=micro_batch_size,
                global_batch_size=global_batch_size)
    bad = [f"{k}={v!r}" for k, v in vals.items() if not _is_int(v) or v < 1]
    if bad:
        return _finish("hybrid", [f"{', '.join(bad)}: each must be a whole number >= 1."], "",
                       reference=ref)
    p: list[str] = []
    if want_tp is not None and tp != want_tp:
        p.append(f"the exercise asks for TP={want_tp}, you have TP={tp}.")
    if want_pp is not None and pp != want_pp:
        p.append(f"the exercise asks for PP={want_pp}, you have PP={pp}.")
    if pp < min_pp:
        p.append(f"PP={pp}: the exercise asks for a pipeline of at least {min_pp} stages.")
    if ws % (tp * pp):
        p.append(f"TP x PP = {tp} x {pp} = {tp * pp} does not divide the {ws} ranks "
                 f"({nodes} nodes x {gpus_per_node}).")
        return _finish("hybrid", p, "", reference=ref)
    dp = ws // (tp * pp)
    if tp > gpus_per_node:
        p.append(f"TP={tp} > {gpus_per_node} GPUs per node: a TP group would cross nodes; keep "
                 f"TP <= {gpus_per_node}.")
    if num_layers % pp:
        p.append(f"{num_layers} layers do not split into PP={pp} equal stages.")
    if num_attention_heads % tp:
        p.append(f"{num_attention_heads} attention heads do not split over TP={tp}.")
    if global_batch_size % (micro_batch_size * dp):
        k = micro_batch_size * dp
        p.append(f"global batch {global_batch_size} is not divisible by micro "
                 f"{micro_batch_size} x DP {dp} = {k}: each microbatch round takes {k} samples.")
    elif pp > 1 and global_batch_size // (micro_batch_size * dp) < pp:
        m = global_batch_size // (micro_batch_size * dp)
        p.append(f"only {m} microbatch(es) for PP={pp} stages: the pipeline never fills; it "
                 f"needs at least one microbatch per stage, each of micro {micro_batch_size} x "
                 f"DP {dp} samples.")
    return _finish("hybrid", p, f"TP={tp} x PP={pp} x DP={dp} = {ws} ranks, micro batch "
                   f"{micro_batch_size}, global batch {global_batch_size}: a valid layout.",
                   (tp, pp, micro_batch_size, global_batch_size), ref)


def check_max_micro_batch(answer: Any, *, peak_gb_by_micro_batch: dict[int, float],
                          limit_gb: float) -> CheckResult:
    """The largest micro batch whose predicted peak memory fits under ``limit_gb``."""
    fits = sorted(m for m, gb in peak_gb_by_micro_batch.items() if gb <= limit_gb)
    want = fits[-1] if fits else None
    if (r := _unfilled("max_micro_batch", want, micro_batch_size=answer)) is not None:
        return r
    if answer == want:
        problems = []
    elif answer not in peak_gb_by_micro_batch:
        problems = [f"micro batch {answer!r} is not one of the planned sizes "
                    f"{sorted(peak_gb_by_micro_batch)}; pick one of them."]
    else:
        gb = peak_gb_by_micro_batch[answer]
        why = ("does not fit" if gb > limit_gb else "fits, but it is not the largest size in the "
               "list that does")
        problems = [f"micro batch {answer!r} needs {gb:.3f} GB per rank against a limit of "
                    f"{limit_gb:.3f} GB: it {why}. Compare each size's need with the limit."]
    return _finish("max_micro_batch", problems,
                   f"micro batch {want} peaks at {peak_gb_by_micro_batch.get(want, 0):.2f} GB "
                   f"<= {limit_gb:.2f} GB; the next size up does not fit.", answer, want)


def check_time_from_flops(answer: Any, *, base: Any, option: Any,
                          rel_tol: float = 0.01) -> CheckResult:
    """How many times ``base``'s iteration time ``option`` takes if time followed the planner's
    hardware FLOPs per iteration (recompute counts its second forward pass)."""
    want = plan(option).hardware_flops_per_iteration / plan(base).hardware_flops_per_iteration
    return check_value("time_factor", answer, want, rel_tol=rel_tol, hint=(
        "Time that follows FLOPs grows by the same factor as the FLOPs: compare the two runs' "
        "hardware FLOPs per iteration (a factor, 1 = no change)."))


def check_save_interval(answer: Any, *, checkpoint_s: float, mtbf_s: float, iteration_s: float,
                        rel_tol: float = 0.1) -> CheckResult:
    """Iterations between checkpoints by Young's rule: the interval that loses the least time,
    sqrt(2 x checkpoint cost x mean time between failures) seconds, in iterations."""
    want = math.sqrt(2 * checkpoint_s * mtbf_s) / iteration_s
    return check_value("save_interval", answer, want, rel_tol=rel_tol, hint=(
        "Young's interval is sqrt(2 x checkpoint cost x mean time between failures), both in "
        "seconds; divide it by the seconds one iteration takes."))


def check_value(name: str, answer: Any, expected: Any, *, hint: str,
                rel_tol: float = 0.05) -> CheckResult:
    """A generic check: a number within ``rel_tol`` (or an exact match for anything else).

    A wrong answer gets ``hint`` (which must guide without the result: which numbers to
    combine, the rule) and, for a number, whether it is too high or too low; never the
    expected value."""
    if (r := _unfilled(name, expected, **{name: answer})) is not None:
        return r
    numeric = isinstance(expected, (int, float)) and not isinstance(expected, bool)
    if numeric:
        ok = isinstance(answer, (int, float)) and math.isclose(answer, expected, rel_tol=rel_tol)
    else:
        ok = answer == expected
    if ok:
        problems = []
    elif numeric and isinstance(answer, (int, float)) and not isinstance(answer, bool):
        side = "too high" if answer > expected else "too low"
        problems = [f"{name} = {answer!r} is {side}. {hint}"]
    else:
        problems = [f"{name} = {answer!r} is not it. {hint}"]
    shown = f"{expected:.4g}" if isinstance(expected, float) else repr(expected)
    return _finish(name, problems, f"{name} = {shown}.", answer, expected)


def summary() -> dict[str, int]:
    """How many checks ran and passed in this kernel."""
    return {"checks": len(RESULTS), "passed": sum(r.passed for r in RESULTS)}
