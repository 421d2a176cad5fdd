"""The house rules, checked: no import cycle among labkit's modules (type-only and function-level
imports included), only the Slurm client runs Slurm's commands, one command line, modules
under 400 lines, every RunConfig field documented, and golden JSON for `plan` and `parse`."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "labkit"
MAX_LINES = 400


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _imports(path: Path, name: str) -> set[str]:
    """Every labkit module this one imports: at module level, inside functions and under
    ``if TYPE_CHECKING:`` alike (a type-only import ties two modules as much as any other)."""
    out: set[str] = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.add(sub if sub in MODULES else base)
    return {m for m in out if m in MODULES and m != name}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := dfs(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := dfs(n)):
            return found
    return None


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_type_only_and_function_level_imports_count(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from labkit.config "
                 "import RunConfig\ndef f():\n    from labkit.site import ClusterProfile\n")
    assert _imports(f, "labkit.m") == {"labkit.config", "labkit.site"}


def test_no_import_cycle_among_labkit_modules():
    graph = {}
    for name, path in MODULES.items():
        deps = _imports(path, name)
        # A package's own submodules import through it: an edge from a package to the modules
        # it re-exports is not a cycle with them.
        graph[name] = {d for d in deps if not (name != "labkit" and d.startswith(name + "."))
                       or d == name}
        graph[name] -= {"labkit"}  # the top package only re-exports config and errors
    cyc = _cycle(graph)
    assert cyc is None, "import cycle: " + " -> ".join(cyc)


def _reach(name: str, graph: dict[str, set[str]]) -> set[str]:
    """Every labkit module ``name`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        for m in graph.get(todo.pop(), set()) - seen:
            seen.add(m)
            todo.append(m)
    return seen


GRAPH = {name: _imports(path, name) for name, path in MODULES.items()}
# The run's own layer (labkit.run) sits below the renderer and the backends; the submission is
# put together above them (labkit.jobs), and everything that starts or reads runs sits above.
RUN_LAYER = {m for m in MODULES if m == "labkit.run" or m.startswith("labkit.run.")}
ABOVE_THE_RUN = ({"labkit.render", "labkit.backends", "labkit.jobs", "labkit.rundir",
                  "labkit.planner", "labkit.watchdog", "labkit.lab", "labkit.classroom",
                  "labkit.regress", "labkit.logs", "labkit.measured", "labkit.cli",
                  "labkit.doctor"})


def _under(m: str, tops: set[str]) -> bool:
    return any(m == t or m.startswith(t + ".") for t in tops)


def test_the_layer_check_sees_an_arrow_up():
    graph = {"labkit.run.spec": {"labkit.config"}, "labkit.config": {"labkit.render"},
             "labkit.render": set()}
    assert _reach("labkit.run.spec", graph) == {"labkit.config", "labkit.render"}
    assert _under("labkit.backends.local", {"labkit.backends"})
    assert not _under("labkit.backendsx", {"labkit.backends"})


def test_the_run_layer_imports_nothing_above_it():
    assert RUN_LAYER >= {"labkit.run", "labkit.run.spec", "labkit.run.state", "labkit.run.record"}
    offenders = {m: sorted(d for d in _reach(m, GRAPH) if _under(d, ABOVE_THE_RUN))
                 for m in sorted(RUN_LAYER)}
    offenders = {m: d for m, d in offenders.items() if d}
    assert not offenders, f"labkit.run imports what sits above it: {offenders}"


def test_render_and_the_backends_never_import_the_submission_above_them():
    """labkit.jobs puts a submission together (run directory, config.json, plan.json, record)
    and hands it to a backend: the renderer and the backends import downward only."""
    below = sorted(m for m in MODULES if _under(m, {"labkit.render", "labkit.backends"}))
    assert "labkit.backends.local" in below and "labkit.render" in below
    up = {"labkit.jobs", "labkit.rundir", "labkit.planner", "labkit.lab", "labkit.cli",
          "labkit.classroom", "labkit.regress"}
    offenders = {m: sorted(d for d in _reach(m, GRAPH) if _under(d, up)) for m in below}
    offenders = {m: d for m, d in offenders.items() if d}
    assert not offenders, f"render/backends import upward: {offenders}"
    assert "labkit.run.spec" in GRAPH["labkit.render"], "render takes the run layer's JobSpec"


# Imported inside a function only: these take long to import (or pull in what does), and the
# command line starts without them.
HEAVY = {"torch", "pandas", "numpy", "matplotlib", "tensorboard", "ipywidgets", "IPython",
         "papermill", "nbformat", "psutil", "tqdm"}


def _top_level_imports(path: Path, name: str) -> set[str]:
    """What a module imports when it is imported (not inside functions, not type-only)."""
    out: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.If) and _is_type_checking(node):
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and sub is not node:
                break
            if isinstance(sub, ast.Import | ast.ImportFrom):
                out |= _targets(sub, path, name)
    return out


def _targets(node: ast.Import | ast.ImportFrom, path: Path, name: str) -> set[str]:
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    base = node.module or ""
    if node.level:
        pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        pkg = pkg[: len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([base] if base else []))
    return {f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names}


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _heavy_modules() -> set[str]:
    """labkit's modules whose import pulls in a HEAVY package (directly or through another)."""
    top = {m: _top_level_imports(p, m) for m, p in MODULES.items()}
    heavy = {m for m, deps in top.items() if any(d.split(".")[0] in HEAVY for d in deps)}
    grew = True
    while grew:
        more = {m for m, deps in top.items() if m not in heavy and deps & heavy}
        grew, heavy = bool(more), heavy | more
    return heavy


def _lazy_imports(path: Path, name: str, heavy: set[str]) -> list[str]:
    """Imports inside functions that are not of a heavy module or do not say why (a comment
    on the line, or on the line above the block of imports it opens)."""
    lines = path.read_text().splitlines()
    out = []
    for fn in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            targets = _targets(node, path, name)
            if not any(t.split(".")[0] in HEAVY or t in heavy for t in targets):
                out.append(f"{node.lineno}: {sorted(targets)} is quick to import: import it at the top")
                continue
            first = node.lineno
            while first > 1 and lines[first - 2].strip().startswith(("import ", "from ")):
                first -= 1
            if "#" not in lines[node.lineno - 1] and not lines[first - 2].strip().startswith("#"):
                out.append(f"{node.lineno}: {sorted(targets)} imported in a function without a reason")
    return sorted(set(out))


def test_the_lazy_import_check_finds_both_faults(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    import json\n\n\ndef g():\n    import torch\n\n\n"
                 "def h():\n    # torch: only here\n    import torch\n    import numpy\n")
    assert _lazy_imports(f, "labkit.m", set()) == [
        "2: ['json'] is quick to import: import it at the top",
        "6: ['torch'] imported in a function without a reason"]


def test_imports_inside_functions_only_keep_heavy_ones_off_the_start_up():
    heavy = _heavy_modules()
    assert {"labkit.logs", "labkit.measured.plots"} <= heavy and "labkit.config" not in heavy
    offenders = [f"{p.relative_to(REPO)}:{x}" for m, p in MODULES.items()
                 for x in _lazy_imports(p, m, heavy)]
    assert not offenders, "\n".join(offenders)


def test_the_command_line_starts_without_heavy_packages():
    code = ("import sys, labkit.cli; print(','.join(sorted(m for m in sys.modules "
            f"if m.split('.')[0] in {sorted(HEAVY)!r})))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert p.stdout.strip() == "", f"labkit.cli imports {p.stdout.strip()} at start-up"


SLURM_COMMANDS = {"sbatch", "squeue", "scontrol", "sinfo", "scancel", "sacct"}
SLURM_CLIENT = PKG / "slurmcli.py"


def _slurm_processes(src: str) -> list[int]:
    """Lines that start a Slurm command: an argv list or tuple whose first item is one
    (``["squeue", ...]``), or a call whose first argument names one (``run("sinfo", ...)``,
    ``subprocess.run("squeue -u x", shell=True)``); ``shutil.which`` only looks."""
    out = []
    for node in ast.walk(ast.parse(src)):
        first = None
        if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
            first = node.elts[0]
        elif (isinstance(node, ast.Call) and node.args
              and getattr(node.func, "attr", getattr(node.func, "id", "")) != "which"):
            first = node.args[0]
        if (isinstance(first, ast.Constant) and isinstance(first.value, str)
                and first.value.split(" ", 1)[0] in SLURM_COMMANDS):
            out.append(node.lineno)
    return sorted(set(out))


def test_the_slurm_scan_finds_a_slurm_process():
    assert _slurm_processes('subprocess.run(["squeue", "-h"])\nrun(("sinfo",))\n'
                            'os.system("scancel 12")\n_sh("sacct", "-n")\n') == [1, 2, 3, 4]
    assert _slurm_processes('shutil.which("sbatch")\nx = ["srun", "sinfo"]\n') == []


def test_only_the_slurm_client_runs_slurm_commands():
    offenders = [f"{p.relative_to(REPO)}:{n}" for p in sorted(PKG.rglob("*.py"))
                 if p != SLURM_CLIENT for n in _slurm_processes(p.read_text())]
    assert _slurm_processes(SLURM_CLIENT.read_text()), "the scan must see the client's commands"
    assert not offenders, ("Slurm commands run outside labkit/slurmcli.py (ask the client "
                           "instead):\n" + "\n".join(offenders))


# The entry points resolve the site once and pass it down: the command line, the notebooks'
# labkit.lab, regress and the doctor's entry; site.py holds the rule, paths.py names the
# mini-cluster's profile file, minicluster.py writes it.
SITE_EDGE = {"labkit.site", "labkit.paths", "labkit.minicluster", "labkit.lab", "labkit.regress",
             "labkit.doctor.preflight"}
SITE_RULE = {"resolve_cluster", "named_cluster", "CLUSTER_ENV", "MINICLUSTER_SITE", "is_up"}


def _site_rule_uses(src: str) -> list[str]:
    """What in ``src`` resolves the default site: a call or import of the resolver, the
    ``$LABKIT_CLUSTER`` name, the mini-cluster's profile file or its is-up test."""
    out = []
    for node in ast.walk(ast.parse(src)):
        name = (node.id if isinstance(node, ast.Name) else node.attr
                if isinstance(node, ast.Attribute) else None)
        if isinstance(node, ast.ImportFrom):
            out += [f"{node.lineno}: import {a.name}" for a in node.names if a.name in SITE_RULE]
        elif name in SITE_RULE:
            out.append(f"{node.lineno}: {name}")
        elif isinstance(node, ast.Constant) and node.value == "LABKIT_CLUSTER":
            out.append(f"{node.lineno}: 'LABKIT_CLUSTER'")
    return out


def test_the_site_scan_finds_the_resolver():
    src = ("from labkit.site import resolve_cluster\nsite = resolve_cluster(None)\n"
           "os.environ.get('LABKIT_CLUSTER')\nminicluster.is_up()\n"
           "x = as_profile(c)  # resolve_cluster in a comment is fine\n")
    assert _site_rule_uses(src) == ["1: import resolve_cluster", "2: resolve_cluster",
                                    "3: 'LABKIT_CLUSTER'", "4: is_up"]


def test_only_the_entry_points_resolve_the_site():
    offenders = [f"{MODULES[m].relative_to(REPO)}:{use}" for m in sorted(MODULES)
                 if m not in SITE_EDGE and not m.startswith("labkit.cli")
                 for use in _site_rule_uses(MODULES[m].read_text())]
    assert not offenders, ("below the entry points, take the site as given (labkit.site."
                           "as_profile), never $LABKIT_CLUSTER or the mini-cluster:\n"
                           + "\n".join(offenders))


@pytest.mark.parametrize("path", sorted(
    [p for p in PKG.rglob("*.py")] + [p for p in (REPO / "code").glob("*.py")]),
    ids=lambda p: str(p.relative_to(REPO)))
def test_module_stays_under_the_line_budget(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(REPO)} has {n} lines (> {MAX_LINES}): two concerns?"


def _cli_files() -> set[Path]:
    cli = PKG / "cli"
    return {PKG / "cli.py", PKG / "__main__.py"} | (set(cli.rglob("*.py")) if cli.is_dir() else set())


# The notebook's own user interface: an exercise check answers in the cell's output, the job
# monitor leaves its last frame there. Like the CLI, they are where output belongs.
NOTEBOOK_UI = {PKG / "exercises.py", PKG / "widgets.py"}


def test_only_the_cli_parses_arguments_and_prints():
    offenders = []
    for path in sorted(PKG.rglob("*.py")):
        if path in _cli_files():
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if "argparse" in names:
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno} imports argparse")
            if isinstance(node, ast.FunctionDef) and node.name.startswith("cli_"):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} def {node.name}")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "print" and path not in NOTEBOOK_UI):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno} print(...)")
    assert not offenders, "only labkit/cli.py parses arguments and prints:\n" + "\n".join(offenders)


def test_every_runconfig_field_has_a_docstring():
    from dataclasses import fields

    from labkit.config import RunConfig

    names = [f.name for f in fields(RunConfig)]
    assert "profile" not in names, "'profile' means cpu|gpu; the trace switch is torch_profiler"
    src = Path(__import__("inspect").getsourcefile(RunConfig)).read_text()
    cls = next(n for n in ast.walk(ast.parse(src))
               if isinstance(n, ast.ClassDef) and n.name == "RunConfig")
    documented = set()
    body = cls.body
    for a, b in zip(body, body[1:], strict=False):
        if (isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name)
                and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)
                and isinstance(b.value.value, str) and b.value.value.strip()):
            documented.add(a.target.id)
    missing = [n for n in names if n not in documented]
    assert not missing, f"RunConfig fields without a docstring: {missing}"


# --- golden JSON of the two documented JSON contracts (DESIGN section 5) ------------------------
FIXED_CONFIG = {"name": "golden", "nodes": 2, "gpus_per_node": 2, "tensor_model_parallel_size": 2,
                "pipeline_model_parallel_size": 2, "micro_batch_size": 2, "global_batch_size": 8}
FIXED_LOG = REPO / "tests" / "fixtures" / "logs" / "labkit_engine_2026.txt"


def _round(x):
    """Floats to 9 significant digits, so a golden file does not pin the last ulp."""
    if isinstance(x, float):
        return float(f"{x:.9g}")
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_round(v) for v in x]
    return x


def _cli_json(argv: list[str], capsys) -> dict:
    from labkit.cli import main

    assert main(argv) == 0
    return _round(json.loads(capsys.readouterr().out))


def test_plan_json_golden(tmp_path, capsys, assert_golden):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(FIXED_CONFIG))
    doc = _cli_json(["plan", str(cfg), "--json"], capsys)
    assert_golden("plan_tp2pp2.json", json.dumps(doc, indent=2, sort_keys=True) + "\n")


def test_parse_json_golden(capsys, assert_golden):
    doc = _cli_json(["parse", str(FIXED_LOG), "--json"], capsys)
    text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
    assert not re.search(r"/work/|/tmp/", text), "no machine paths in the golden document"
    assert_golden("parse_labkit_engine_2026.json", text)
