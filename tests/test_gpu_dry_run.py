"""The ``gpu`` profile checked without a GPU: every notebook dry-run on a GPU site.

Each notebook's solved code runs in this process with papermill's parameters as a class on a
GPU site would give them (``profile="gpu"``, ``backend="slurm"``, ``cluster=`` the site YAML in
``tests/fixtures/sites/``, 8 GPUs per node). Nothing reaches Slurm and nothing trains: the one
door every notebook submits through, ``labkit.jobs.submit``, is replaced by a dry submit that
does what can be done without a job (the run directory the real submit would use, the sbatch
script rendered by labkit's own renderer and parsed by ``bash -n``, the plan) and returns a job
whose outputs do not exist. A cell that reads a job's outputs stops there, and so do the later
cells that need what it would have defined; any other error fails the test (a config that does
not validate, an exercise check that fails, a plan that does not fit). Checked: every config
the notebooks submit is valid for the site, renders and fits its GPUs (the notebook's own
out-of-memory demo excepted, and that one must not fit); the run directory of the rendered
script is the one submit uses (the site's per-user root); every exercise that needs no trained
run has an answer and passes its check; the memory budget is the site's ``gpu_memory_gb``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from labkit.config import RunConfig
from labkit.errors import LabkitError
from labkit.run import JobSpec
from labkit.site import current_user, load_cluster, resolve_cluster, slurm_job_name

NB_DIR = Path(__file__).resolve().parents[1] / "notebooks"
SITE_YAML = Path(__file__).parent / "fixtures" / "sites" / "gpu-class.yaml"
sys.path.insert(0, str(NB_DIR))
import build_notebooks  # noqa: E402

NOTEBOOKS = sorted(p.stem for p in (NB_DIR / "src").glob("[0-9][0-9]_*.py"))
# The exercises that read the student's own trained run (timings, a trace, a crashed log):
# a dry run has no run to read. Every other exercise must be answered in the dry run.
NEEDS_A_RUN = {"02_multi_node_data_parallel", "04_monitoring_and_profiling",
               "08_launchers_and_failures"}
# The runs a notebook submits on purpose knowing they do not fit (it asserts the planner said so).
MEANT_NOT_TO_FIT = {"nb05_oom"}


class DryRunStop(Exception):
    """A cell needed a job's outputs (or Slurm itself): a dry run has neither."""


class DryJob:
    """What the dry submit returns: a name, and no outputs (reading any raises DryRunStop)."""

    def __init__(self, name: str) -> None:
        self.__dict__["name"] = name

    def wait(self, *args: Any, **kwargs: Any) -> None:
        """launch() waits on the job; in a dry run there is nothing to wait for."""

    def __getattr__(self, attr: str) -> Any:
        raise DryRunStop(f"job {self.name!r}.{attr}: the dry run trained nothing")


@dataclass
class Submitted:
    spec: RunConfig | JobSpec
    run_dir: Path
    script: str
    plan: Any = None


@dataclass
class DryRun:
    ns: dict[str, Any]
    submitted: list[Submitted] = field(default_factory=list)
    ran: list[int] = field(default_factory=list)
    skipped: dict[int, str] = field(default_factory=dict)
    exercise_cells: dict[int, list[str]] = field(default_factory=dict)


def _assigned(source: str) -> set[str]:
    """The names a cell binds (assignments, loops, imports, functions)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return out


def _exercise_names(source: str) -> list[str]:
    names = []
    for line in source.splitlines():
        if m := build_notebooks.EXERCISE_RE.match(line):
            names += [n.strip() for n in m["lhs"].rstrip(" =").split(",") if n.strip()]
    return names


def dry_run(stem: str, monkeypatch, **params: Any) -> DryRun:
    """Run the solved notebook ``stem`` with ``params`` injected after its parameters cell."""
    import labkit.backends.local
    import labkit.backends.slurm
    import labkit.jobs
    from labkit.lab import run_dir_of
    from labkit.paths import run_dir as paths_run_dir
    from labkit.planner import plan
    from labkit.render import render_sbatch

    run = DryRun(ns={"__name__": "__main__"})

    def dry_submit(cfg, *, backend=None, cluster=None, overwrite=False, resume=False,
                   program=None, program_args=None):
        is_run = isinstance(cfg, RunConfig)
        backend = backend or (cfg.backend if is_run else "local")
        assert backend == "slurm", f"{cfg.name}: submitted to backend {backend!r}, not slurm"
        site = resolve_cluster(cluster)
        d = paths_run_dir(cfg.name, site.run_root_path())  # what the real submit claims
        if is_run:
            assert run_dir_of(cfg, cluster=cluster) == d, "render and submit disagree on the dir"
        args = None if program_args is None else [str(a).replace("{run_dir}", str(d))
                                                   for a in program_args]
        spec = JobSpec.from_config(cfg) if is_run else cfg
        script = render_sbatch(spec, site, d, program=program, program_args=args)
        p = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
        assert p.returncode == 0, f"{cfg.name}: bash -n: {p.stderr}"
        run.submitted.append(Submitted(cfg, d, script, plan(cfg) if is_run else None))
        return DryJob(cfg.name)

    def no_slurm(cmd, **kw):
        raise DryRunStop(f"{cmd[0]}: the dry run asks Slurm nothing")

    def no_local(*a, **kw):
        raise AssertionError("the dry run submitted to the local backend")

    monkeypatch.setattr(labkit.jobs, "submit", dry_submit)
    monkeypatch.setattr(labkit.slurmcli, "run", no_slurm)
    monkeypatch.setattr(labkit.backends.local, "submit", no_local)
    monkeypatch.setenv("LABKIT_EXERCISES_STRICT", "1")  # a wrong answer raises
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.chdir(NB_DIR)

    nb = build_notebooks.build(NB_DIR / "src" / f"{stem}.py", solved=True)
    tainted: set[str] = set()
    outputs = ""  # the site's run root, where a dry run leaves nothing to read
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        src = cell.source
        if names := _exercise_names(src):
            run.exercise_cells[i] = names
        try:
            exec(compile(src, f"{stem}[cell {i}]", "exec"), run.ns)
        except DryRunStop as e:
            run.skipped[i] = str(e)
            tainted |= _assigned(src)
            continue
        except NameError as e:
            if e.name not in tainted:
                raise
            run.skipped[i] = f"needs {e.name!r}, which a cell that read a job's outputs defines"
            tainted |= _assigned(src)
            continue
        except (LabkitError, OSError) as e:
            if not outputs or outputs not in str(e):
                raise
            run.skipped[i] = f"reads a run's outputs under {outputs}: {e}"
            tainted |= _assigned(src)
            continue
        run.ran.append(i)
        if "parameters" in cell.metadata.get("tags", []):
            known = set(_assigned(src))
            run.ns.update({k: v for k, v in params.items() if k in known})
            outputs = str(resolve_cluster(run.ns.get("cluster")).run_root_path() or "")
    return run


@pytest.fixture
def site_env(run_root, monkeypatch):
    """The class's site as an instructor sets it: $LABKIT_CLUSTER and the notebooks' parameter."""
    monkeypatch.setenv("LABKIT_CLUSTER", str(SITE_YAML))
    monkeypatch.delenv("LABKIT_METRICS_FILE", raising=False)
    return load_cluster(SITE_YAML)


def _gpu_params(site_path: str | Path) -> dict[str, Any]:
    return dict(profile="gpu", backend="slurm", cluster=str(site_path), gpus_per_node=8,
                run_doctor=False)


@pytest.mark.parametrize("stem", NOTEBOOKS)
def test_notebook_dry_runs_on_a_gpu_site(stem, site_env, monkeypatch):
    site = site_env
    run = dry_run(stem, monkeypatch, **_gpu_params(SITE_YAML))
    me = current_user()
    for s in run.submitted:
        assert s.run_dir == site.run_root_path() / s.spec.name  # the student's own run root
        assert f"#SBATCH --job-name={slurm_job_name(s.spec.name, me)}\n" in s.script
        assert "#SBATCH --partition=gpu\n" in s.script and "#SBATCH --account=llm-workshop\n" in s.script
        assert f"#SBATCH --output={s.run_dir}/log.txt\n" in s.script
        if isinstance(s.spec, RunConfig):
            cfg = s.spec
            assert (cfg.device, cfg.backend) == ("cuda", "slurm"), cfg.name
            assert cfg.gpu_memory_gb == site.gpu_memory_gb, cfg.name
            assert cfg.gpus_per_node == site.gpus_per_node, cfg.name
            assert f"#SBATCH --gpus-per-node={cfg.gpus_per_node}\n" in s.script
            fits = s.plan.fits
            assert fits is (cfg.name not in MEANT_NOT_TO_FIT), (cfg.name, s.plan.summary())
    for i, names in run.exercise_cells.items():
        if stem in NEEDS_A_RUN and i in run.skipped:
            continue
        assert i in run.ran, f"{stem}: exercise cell {i} did not run: {run.skipped.get(i)}"
        for n in names:
            assert run.ns.get(n) is not None, f"{stem}: exercise {n} has no answer on gpu"
    if stem not in ("00_setup_and_cluster", "03_communication"):  # 00 submits nothing
        assert any(isinstance(s.spec, RunConfig) for s in run.submitted), stem


def test_notebook_05_budget_is_the_sites_device_memory(site_env, monkeypatch, tmp_path):
    """On a site with 141 GB GPUs the micro batch exercise's budget is 141 GB: its answer is the
    largest planned size under it, the sizes stop at the first that does not fit, and the
    boundary runs are planned against 141 GB."""
    y = tmp_path / "h200.yaml"
    y.write_text(SITE_YAML.read_text().replace("gpu_memory_gb: 80", "gpu_memory_gb: 141"))
    monkeypatch.setenv("LABKIT_CLUSTER", str(y))
    run = dry_run("05_batch_size_and_oom", monkeypatch, **_gpu_params(y))
    ns = run.ns
    assert ns["budget_gb"] == 141.0 and ns["base"].gpu_memory_gb == 141.0
    need = ns["need"]
    assert ns["largest_fitting"] == max(m for m, gb in need.items() if gb <= 141.0)
    assert max(need) == 2 * ns["largest_fitting"] and need[max(need)] > 141.0
    edge = [s for s in run.submitted if s.spec.name.startswith("nb05_edge_mbs")]
    assert edge and edge[0].spec.micro_batch_size == ns["largest_fitting"] and edge[0].plan.fits
    assert all(s.plan.gpu_memory_gb == 141.0 for s in edge)


def test_the_dry_run_refuses_a_config_a_site_cannot_hold(site_env, monkeypatch, tmp_path):
    """The harness can fail: a site whose nodes have 6 GPUs cannot take the gpu profile's global
    batch of 64 on 8 ranks x micro batch 4 (it does not divide), and notebook 01 says so."""
    from labkit.errors import ConfigError

    with pytest.raises(ConfigError, match="global_batch_size"):
        dry_run("01_single_node", monkeypatch, **{**_gpu_params(SITE_YAML), "gpus_per_node": 6})
