"""docs/INSTRUCTORS.md's `text` blocks name the site's files, so they cannot run here as
written (tests/test_docs.py runs the `sh` blocks): each `labkit ...` line in them must be a
command labkit's own parser accepts, with its options as spelled, and must be listed in
``RUN_BY`` with the test that runs it (on the mini-cluster, the class and hub tiers:
test_classroom_slurm, test_doctor_slurm, test_hub_slurm), or in ``NOT_HERE`` with why it
cannot run here and the test that runs the same path. The listed test must run the command's
subcommand and options: they are read from its source."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

from labkit.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "INSTRUCTORS.md"
SITE = "--cluster /shared/labkit/site.yaml"

# documented command (as in COMMANDS) -> the test (or fixture) that runs it
RUN_BY = {
    f"labkit class plan --students 30 {SITE}":
        "tests/test_hub_slurm.py::test_two_students_run_01_at_once_in_the_browser",
    f"labkit class hub up {SITE} --group workshop": "tests/test_hub_slurm.py::hub",
    "labkit class hub status --json":
        "tests/test_hub_slurm.py::test_two_students_servers_are_their_slurm_jobs",
    "labkit class handout --students alice bob":
        "tests/test_hub_slurm.py::test_two_students_servers_are_their_slurm_jobs",
    "labkit class hub down": "tests/test_hub_slurm.py::test_hub_down_ends_every_server_job",
    f"labkit check {SITE}": "tests/test_classroom.py::test_check_cluster_names_every_wrong_field",
    f"labkit doctor {SITE} --class --students 20":
        "tests/test_doctor_slurm.py::test_doctor_class_on_the_minicluster",
    f"labkit regress 01 02 {SITE}": "tests/test_classroom_slurm.py::test_regress_on_the_site",
    "labkit class status": "tests/test_classroom.py::test_class_status_lists_each_users_runs",
    "labkit class status --json": "tests/test_classroom_slurm.py::test_three_students_on_one_site",
    "labkit class cancel --all": "tests/test_classroom_slurm.py::test_three_students_on_one_site",
    "labkit class clean --dry-run": "tests/test_classroom_slurm.py::test_three_students_on_one_site",
    "labkit class clean": "tests/test_classroom_slurm.py::test_three_students_on_one_site",
}
# documented command -> (why it does not run here, the test that runs the same path)
NOT_HERE = {
    f"labkit regress 01 02 --profile gpu {SITE} --runs 3 --baseline baselines/mysite-gpu.json":
        ("the gpu profile needs GPUs; the same --runs N --baseline path on the cpu profile",
         "tests/test_regress_baseline.py::test_runs_n_write_the_first_baseline_and_a_slower_run_is_flagged"),
    f"labkit regress 01 02 --profile gpu {SITE} --baseline baselines/mysite-gpu.json":
        ("the gpu profile needs GPUs; a run against a baseline of several runs on the cpu profile",
         "tests/test_regress_baseline.py::test_runs_n_write_the_first_baseline_and_a_slower_run_is_flagged"),
}


def _text_commands() -> list[str]:
    out, inside = [], False
    for line in DOC.read_text().splitlines():
        if line.startswith("```"):
            inside = line.strip() == "```text" if not inside else False
            continue
        if inside:
            cmd = re.sub(r"\s+#\s.*$", "", line).strip()
            cmd = cmd[len("sudo "):] if cmd.startswith("sudo ") else cmd
            if cmd.startswith("labkit "):
                out.append(cmd)
    return out


COMMANDS = _text_commands()


def test_the_guide_names_the_class_commands():
    joined = "\n".join(COMMANDS)
    for needed in ("labkit class hub up", "labkit class hub status", "labkit class hub down",
                   "labkit class handout --students", "labkit class plan --students 30"):
        assert needed in joined, needed


@pytest.mark.parametrize("cmd", COMMANDS)
def test_documented_command_parses(cmd, capsys):
    try:
        build_parser().parse_args(shlex.split(cmd)[1:])
    except SystemExit as e:
        pytest.fail(f"docs/INSTRUCTORS.md: `{cmd}` is refused by labkit's parser (exit {e.code}):"
                    f"\n{capsys.readouterr().err}")


def _words(cmd: str) -> list[str]:
    """What a test must pass to run ``cmd``: its subcommand and positionals up to the first
    option, and the options' names (not the site's values: paths, users, numbers)."""
    out, options = [], False
    for w in shlex.split(cmd)[1:]:
        options = options or w.startswith("-")
        if w.startswith("-") or (not options and "/" not in w):
            out.append(w)
    return out


def _strings_of(ref: str) -> set[str]:
    """The string constants of the test function (or fixture) ``tests/file.py::name`` and of
    the functions of its module that it calls (a ``_doctor(...)`` helper that adds "doctor")."""
    path, name = ref.split("::")
    tree = ast.parse((REPO / path).read_text())
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert name in defs, f"{ref}: no such test or fixture"
    called = {c.func.id for c in ast.walk(defs[name]) if isinstance(c, ast.Call)
              and isinstance(c.func, ast.Name) and c.func.id in defs}
    return {n.value for fn in {name, *called} for n in ast.walk(defs[fn])
            if isinstance(n, ast.Constant) and isinstance(n.value, str)}


@pytest.mark.parametrize("cmd", sorted(set(COMMANDS)))
def test_documented_command_is_run_by_a_test(cmd):
    assert (cmd in RUN_BY) != (cmd in NOT_HERE), (
        f"docs/INSTRUCTORS.md: `{cmd}` must be in RUN_BY (the test that runs it) or in NOT_HERE "
        f"(why not here, and the test that runs the same path) of {__file__}")
    if cmd in RUN_BY:
        ref, need = RUN_BY[cmd], _words(cmd)
    else:
        ref, need = NOT_HERE[cmd][1], shlex.split(cmd)[1:2]
    missing = [w for w in need if w not in _strings_of(ref)]
    assert not missing, f"{ref} does not run `{cmd}`: its source never passes {missing}"


def test_the_lists_name_only_documented_commands():
    assert not (set(RUN_BY) | set(NOT_HERE)) - set(COMMANDS), sorted(
        (set(RUN_BY) | set(NOT_HERE)) - set(COMMANDS))
