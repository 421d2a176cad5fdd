"""A job script's Megatron-LM flags edited by hand, checked by labkit before it is submitted.

The sanctioned path from a rendered job script to a run whose flags you chose yourself:

    copy = editable_copy(cfg, cluster=...)    labkit renders cfg's job script and writes a copy
    ... change a flag in the copy (an editor, or Python) ...
    edit = read_edit(cfg, copy)               the flags read back: what changed, as RunConfig
                                              fields, validated by the same rules as any config
    job, edit = submit_edit(cfg, copy)        that config submitted; the job script labkit
                                              renders for it carries exactly your flags

Only the flags of the script's ``<GROUP>_ARGS=( ... )`` arrays are read (``script_flags``), the
way the training script reads them. Everything else in the script (``#SBATCH`` lines, the
launcher, paths) is rendered from the RunConfig and the site profile: an edit there is refused
with the field to change instead, and so are the flags that say what labkit's engine always does
(``labkit.megatron_args.ENGINE_FLAGS``) and the data flags (``data_path`` in the RunConfig).
"""

from __future__ import annotations

import difflib
import re
import shlex
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from labkit.backends.local import job_script
from labkit.config import MEGATRON_FLAGS, RunConfig
from labkit.errors import ConfigError
from labkit.exercises import CheckResult, _finish, _unfilled
from labkit.lab import launch, run_dir_of, shown
from labkit.megatron_args import ENGINE_FLAGS, PRECISION_FLAGS, RECOMPUTE_FULL, SWITCHES
from labkit.render import render_hostfile_launch, render_sbatch
from labkit.run import JobSpec
from labkit.site import as_profile

_ARRAY = re.compile(r"^\s*([A-Z][A-Z0-9_]*)_ARGS=\(\s*$")
_FIELD_OF = {flag: name for name, flag in MEGATRON_FLAGS.items()}
_FIELD_OF.update({flag: "precision" for flag in PRECISION_FLAGS.values()})
_RENDERED_ONLY = {"--save", "--load"}  # the run directory's checkpoints: labkit's, not a choice
_FIXED_VALUE = {**{f: v for g in ENGINE_FLAGS.values() for f, v in g.items()},
                RECOMPUTE_FULL[0]: RECOMPUTE_FULL[1], RECOMPUTE_FULL[2]: RECOMPUTE_FULL[3]}
_FIXED = set(_FIXED_VALUE)
_DATA = {"--data-path", "--vocab-file", "--merge-file"}


def render_script(cfg: RunConfig, *, cluster: Any = None) -> str:
    """The job script ``launch`` would submit for ``cfg`` (its backend's), for its run
    directory (``labkit.lab.run_dir_of``); ``cluster``: the site as resolved by the caller."""
    d, spec = run_dir_of(cfg, cluster=cluster), JobSpec.from_config(cfg)
    if cfg.backend == "local":  # as submit renders it (a multi-node job's nodes as namespaces)
        return job_script(spec, d, cluster=as_profile(cluster), quiet=True)[0]
    site = as_profile(cluster)
    if site is None:
        raise ConfigError(f"a {cfg.backend} job script needs the site: pass cluster= the site's "
                          f"profile (labkit.site.resolve_cluster(cluster) in a notebook)")
    return (render_sbatch if cfg.backend == "slurm" else render_hostfile_launch)(spec, site, d)


def _arrays(script: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(lines inside the flag arrays, the other lines), each as (line number, text)."""
    inside, outside, current = [], [], None
    for no, line in enumerate(script.splitlines(), 1):
        if current is None:
            m = _ARRAY.match(line)
            (outside if not m or m.group(1) == "MEGATRON" else inside).append((no, line))
            current = m.group(1) if m and m.group(1) != "MEGATRON" else None
        elif line.strip() == ")":
            inside.append((no, line))
            current = None
        else:
            inside.append((no, line))
    return inside, outside


def script_flags(script: str) -> dict[str, str | None]:
    """The Megatron-LM flags of a job script's ``<GROUP>_ARGS=( ... )`` arrays, in order:
    ``{flag: value}`` (None for a switch such as ``--bf16``). ``"$DATA_DIR"/x`` reads as
    ``$DATA_DIR/x``. A flag given twice, or a value without its flag, is a ConfigError naming
    the line."""
    flags: dict[str, str | None] = {}
    for no, line in _arrays(script)[0]:
        if _ARRAY.match(line) or line.strip() in (")", "") or line.lstrip().startswith("#"):
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError as e:
            raise ConfigError(f"line {no} of the job script, {line.strip()!r}: {e} (a quote "
                              f"left open?)") from None
        last = None
        for w in words:
            if w.startswith("--"):
                if w in flags:
                    raise ConfigError(f"line {no}: {w} is given twice in the job script; keep "
                                      f"one")
                flags[w], last = None, w
            elif last is not None and flags[last] is None:
                flags[last] = w
            else:
                raise ConfigError(f"line {no} of the job script, {line.strip()!r}: {w!r} is not "
                                  f"a flag (--name) nor the value of the one before it")
    return flags


def _number(text: str) -> int | float | str:
    """A flag's value as the training script reads it (code/engine_args.py): int, float, text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


@dataclass(frozen=True)
class ScriptEdit:
    """What an edited job script asks for: ``config`` (``base`` with the edited fields) and
    ``changes``, field -> (before, after), the Megatron-LM flag beside each in ``flags``;
    ``script`` is the edited text."""

    base: RunConfig
    config: RunConfig
    changes: dict[str, tuple[Any, Any]]
    flags: dict[str, str]
    script: str

    def __str__(self) -> str:
        if not self.changes:
            return "no flag changed: the edited script is the run as rendered"
        return "\n".join(f"{self.flags[k]} {b!r} -> {a!r} ({k})"
                         for k, (b, a) in self.changes.items())


def _text(edited: str | Path) -> str:
    if isinstance(edited, Path):
        return edited.read_text()
    if not isinstance(edited, str):
        raise ConfigError(f"the edited job script must be its text or its path, not "
                          f"{type(edited).__name__} {edited!r:.60}")
    return edited


def _outside_changes(original: str, edited: str) -> list[str]:
    before = [t for _, t in _arrays(original)[1]]
    after = [t for _, t in _arrays(edited)[1]]
    if before == after:
        return []
    diff = [ln for ln in difflib.unified_diff(before, after, lineterm="", n=0)
            if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    return diff[:6]


def read_edit(cfg: RunConfig, edited: str | Path, *, cluster: Any = None) -> ScriptEdit:
    """The run an edited copy of ``cfg``'s job script asks for (``editable_copy``).

    Each changed flag becomes its RunConfig field (the value read as the training script reads
    it), and the new config is validated by the same rules as any other: a ConfigError names
    every problem with the numbers and the fix. Refused, with what to change instead: lines
    outside the flag arrays, the engine's fixed flags, the data flags, unknown flags.
    """
    text = _text(edited)
    original = render_script(cfg, cluster=cluster)
    outside = _outside_changes(original, text)
    if outside:
        raise ConfigError("the edited script changes lines outside its Megatron-LM flag arrays ("
                          + "; ".join(outside) + "). labkit reads only the flags; the rest is "
                          "rendered from the RunConfig (nodes, gpus_per_node, name, ...) and the "
                          "site profile: change those there and render again")
    before, after = script_flags(original), script_flags(text)
    problems, changes, shown_flags = [], {}, {}
    for flag in dict.fromkeys([*before, *after]):
        b, a = before.get(flag, "<absent>"), after.get(flag, "<absent>")
        if b == a or flag in _RENDERED_ONLY and a == "<absent>":
            continue
        if flag in _RENDERED_ONLY or flag in _DATA:
            what, where = (("checkpoint folder", "the run name") if flag in _RENDERED_ONLY
                           else ("data paths", "data_path"))
            problems.append(f"{flag} {a}: labkit renders the run's {what} itself; set {where} in "
                            f"the RunConfig instead")
        elif flag in _FIXED:
            if a not in ("<absent>", _FIXED_VALUE[flag]):
                problems.append(f"{flag} {a}: labkit's engine always uses {flag} "
                                f"{_FIXED_VALUE[flag]}; it is not a choice of the run")
        elif flag in SWITCHES:
            continue  # implied by the field's own flag
        elif flag not in _FIELD_OF:
            near = difflib.get_close_matches(flag, [*_FIELD_OF, *_FIXED], n=1)
            problems.append(f"{flag}: not a flag labkit's engine reads for a run"
                            + (f"; did you mean {near[0]}?" if near else ""))
        else:
            field = _FIELD_OF[flag]
            if field == "precision":
                value = next((p for p, f in PRECISION_FLAGS.items() if f in after), "fp32")
                flag = "/".join(PRECISION_FLAGS.values())
            elif isinstance(getattr(cfg, field), bool):
                if a not in (None, "<absent>"):
                    problems.append(f"{flag} {a}: a switch takes no value (write {flag} alone, "
                                    f"or delete the line)")
                    continue
                value = a is None
            elif a == "<absent>":  # read as the training script reads a missing flag
                value = next(f.default for f in fields(RunConfig) if f.name == field)
            elif a is None:
                problems.append(f"{flag} has no value (it was {b})")
                continue
            else:
                value = _number(a)
            if value != getattr(cfg, field):
                changes[field] = (getattr(cfg, field), value)
                shown_flags[field] = flag
    if problems:
        raise ConfigError("the edited job script cannot be submitted: " + "; ".join(problems))
    try:
        new = cfg.replace(**{k: a for k, (_, a) in changes.items()})
    except ConfigError as e:
        asked = ", ".join(f"{shown_flags[k]} {a}" for k, (_, a) in changes.items())
        raise ConfigError(f"your edited flags ({asked}) break a rule of the run: "
                          + "; ".join(e.violations)) from None
    return ScriptEdit(cfg, new, changes, shown_flags, text)


def editable_copy(cfg: RunConfig, *, cluster: Any = None, path: str | Path | None = None) -> Path:
    """Render ``cfg``'s job script and write it to ``path`` (default ``<name>.job.sh`` beside the
    run directory ``launch`` would use: a site's per-user run root on Slurm): the copy to edit
    before ``submit_edit``. An existing copy is replaced (render again = start again)."""
    p = Path(path) if path is not None else \
        run_dir_of(cfg, cluster=cluster).parent / f"{cfg.name}.job.sh"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render_script(cfg, cluster=cluster))
    return p


def submit_edit(cfg: RunConfig, edited: str | Path | ScriptEdit, *, cluster: Any = None,
                **launch_args: Any) -> tuple[Any, ScriptEdit]:
    """``read_edit`` (unless ``edited`` is one already), then ``labkit.lab.launch`` of the run
    it asks for; returns (job, edit).

    The job script labkit renders for that run is compared with the edited one: their flags
    must be the same (the only difference allowed is a flag the engine implies, such as
    ``--recompute-method uniform`` beside ``--recompute-granularity full``)."""
    edit = edited if isinstance(edited, ScriptEdit) else read_edit(cfg, edited, cluster=cluster)
    job = launch(edit.config, cluster=cluster, **launch_args)
    ran = script_flags((job.run_dir / "job.sh").read_text())
    asked = script_flags(edit.script)
    implied = set(RECOMPUTE_FULL[::2]) | set(SWITCHES)
    changed = sorted(f for f, v in ran.items() if asked.get(f, "<absent>") != v and f not in implied)
    missing = sorted(f for f in asked if f not in ran and f not in _RENDERED_ONLY)
    if changed or missing:
        raise ConfigError(f"the submitted job script ({shown(job.run_dir / 'job.sh')}) differs from "
                          f"the edit: flags {changed} differ, {missing} missing")
    return job, edit


def check_script_edit(edited: Any, *, base: RunConfig, want: dict[str, Any], cluster: Any = None,
                      task: str = "") -> CheckResult:
    """An edited copy of ``base``'s job script (its text or path) that changes exactly the
    fields of ``want`` to those values, and passes the rules. ``task`` says what the exercise
    asks, in words, for the hint. The value is the ``ScriptEdit`` (once it passes; else the
    one the exercise asks for)."""
    target = base.replace(**want)
    reference = ScriptEdit(base, target, {k: (getattr(base, k), v) for k, v in want.items()},
                           {k: MEGATRON_FLAGS.get(k, k) for k in want},
                           render_script(target, cluster=cluster))
    if (r := _unfilled("script_edit", reference, edited_script=edited)) is not None:
        return r
    try:
        edit = read_edit(base, edited, cluster=cluster)
    except ConfigError as e:
        return _finish("script_edit", [f"labkit refused your edit: {'; '.join(e.violations)}."],
                       "", reference=reference)
    got = {k: a for k, (_, a) in edit.changes.items()}
    problems = []
    if not got:
        problems.append(f"no flag of the script changed yet. {task}".strip())
    elif got != want:
        said = ", ".join(f"{edit.flags[k]} {b!r} -> {a!r}" for k, (b, a) in edit.changes.items())
        extra = [edit.flags[k] for k in got if k not in want]
        problems.append(f"your edit changes {said}." + (
            f" {', '.join(extra)} should stay as rendered." if extra else "")
            + f" {task} Which flag says that, and what must it read?")
    return _finish("script_edit", problems, f"labkit read your edit, {'; '.join(str(edit).splitlines())}"
                   f", and the run it asks for passes every rule.", edit, reference)
