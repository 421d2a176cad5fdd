"""A class on the Slurm mini-cluster, for real: three Unix users run notebook 01 with
papermill at the same time, with the same run names, on a site profile written the way an
instructor writes one (partition, run_root shared with {user}, gpu_memory_gb, env).

Then: three complete, separate run directories per notebook (nothing moved aside); a
student's ``labkit cancel`` of another's job is refused by labkit and by Slurm; ``labkit class
status --json`` (the instructor, root) lists all three with their progress; ``labkit cancel
--all`` as one student leaves the others' jobs running; ``labkit clean`` frees the caller's
checkpoints only. ``test_regress_on_the_site`` runs ``labkit regress --cluster site.yaml`` on a
subset of the series (01 and 02; the whole series takes 6-10 minutes here).

Needs root, the mini-cluster and an interpreter every user can run: Debian's python3.11 with a
venv of the pins at /opt/labkit-venv (tests/class_env.py builds it once and reuses it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import class_env
import pytest
from conftest import REPO, skip_or_fail

pytestmark = [pytest.mark.slurm, pytest.mark.users, pytest.mark.timeout(1500)]
STUDENTS = ["labkit-s1", "labkit-s2", "labkit-s3"]
NOTEBOOKS = ["01_single_node"]


@pytest.fixture(scope="module")
def klass(slurm_cluster):
    """(base dir, site YAML path, venv python): a shared checkout, the site, the users."""
    if shutil.which("runuser") is None or shutil.which("useradd") is None:
        skip_or_fail("runuser/useradd are missing (util-linux, passwd)")
    try:
        py = class_env.ensure_venv()
    except (RuntimeError, subprocess.CalledProcessError) as e:
        skip_or_fail(f"no interpreter for the students: {e}")
    base = Path(tempfile.mkdtemp(prefix="labkit-class-"))
    base.chmod(0o755)
    src = class_env.shared_checkout(base / "labkit")
    shared = base / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # each student's {user} folder is made by labkit, as that student
    site = class_env.write_site(base / "site.yaml", slurm_conf=slurm_cluster.slurm_conf,
                                checkout=src, shared=shared, extra="gpu_memory_gb: 80\n")
    class_env.add_users(STUDENTS, base / "home")
    try:
        yield base, site, py
    finally:
        for u in STUDENTS:
            subprocess.run(["scancel", "-u", u], env={**os.environ,
                           "SLURM_CONF": str(slurm_cluster.slurm_conf)}, capture_output=True)
            class_env.remove_user(u)
        shutil.rmtree(base, ignore_errors=True)


def _run(user: str, argv: list[str], site: Path, *, cwd: Path | None = None,
         timeout: float = 900, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    cmd = class_env.as_user(user, argv, env={"LABKIT_CLUSTER": str(site), **(env or {})},
                            cwd=cwd)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _labkit(user: str, site: Path, *args: str) -> subprocess.CompletedProcess:
    return _run(user, [str(class_env.VENV / "bin" / "python"), "-m", "labkit", *args], site)


def _notebooks(user: str, base: Path, site: Path) -> list[str]:
    """Run the class's notebooks as ``user``, in order; the failures, if any."""
    out = base / "home" / user
    failed = []
    for nb in NOTEBOOKS:
        p = _run(user, [str(class_env.VENV / "bin" / "python"), "-m", "papermill",
                        f"solutions/{nb}.ipynb", str(out / f"{nb}.ipynb"), "-p", "backend",
                        "slurm", "-p", "profile", "cpu", "--no-progress-bar"],
                 site, cwd=base / "labkit" / "notebooks")
        if p.returncode:
            failed.append(f"{user} {nb}: exit {p.returncode}\n{p.stderr[-3000:]}")
            break
    return failed


def _root(base: Path, user: str) -> Path:
    return base / "shared" / user / "runs"


def _state(run_dir: Path, conf: str) -> str:
    job_id = json.loads((run_dir / "job.json").read_text())["job_id"]
    p = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True,
                       env={**os.environ, "SLURM_CONF": conf})
    return next((w.split("=", 1)[1] for w in p.stdout.split() if w.startswith("JobState=")), "?")


def _long_config(user: str, base: Path, site: Path) -> Path:
    """A 1-node run long enough to still be PENDING or RUNNING during the checks."""
    path = base / "home" / user / "long.json"
    p = _run(user, [str(class_env.VENV / "bin" / "python"), "-c",
                    "import sys; from labkit.config import RunConfig; RunConfig.for_profile("
                    "'cpu', name='long', backend='slurm', nodes=1, train_iters=100000)"
                    ".to_json(sys.argv[1])", str(path)], site)
    assert p.returncode == 0, p.stderr
    return path


def test_three_students_on_one_site(klass, slurm_cluster):
    base, site, _ = klass
    conf = str(slurm_cluster.slurm_conf)
    with ThreadPoolExecutor(len(STUDENTS)) as pool:
        failures = sum(pool.map(lambda u: _notebooks(u, base, site), STUDENTS), [])
    assert not failures, "\n".join(failures)

    # three complete, separate run directories per notebook; nothing moved aside
    job_ids = set()
    names = {u: sorted(p.name for p in _root(base, u).iterdir() if p.is_dir()) for u in STUDENTS}
    runs = names[STUDENTS[0]]
    assert {"nb01_dp", "nb01_micro1"} <= set(runs) and not [n for n in runs if ".old" in n]
    assert all(n == runs for n in names.values()), names
    for u in STUDENTS:
        root = _root(base, u)
        for run in (root / n for n in runs):
            rec = json.loads((run / "job.json").read_text())
            assert (run / "exit_code").read_text().strip() == "0", run
            assert (run / "job.json").stat().st_uid == int(
                subprocess.run(["id", "-u", u], capture_output=True, text=True).stdout), run
            assert Path(rec["run_dir"]).resolve() == run.resolve()
            if run.name == "nb01_dp":
                assert "iteration" in (run / "log.txt").read_text()
            job_ids.add(rec["job_id"])
    # one job per run directory: no student's run was another's
    assert len(job_ids) == len(runs) * len(STUDENTS)

    # long jobs, one per student, to act on
    for u in STUDENTS:
        cfg = _long_config(u, base, site)
        p = _labkit(u, site, "submit", str(cfg), "--cluster", str(site), "--json")
        assert p.returncode == 0, p.stderr
    longs = {u: _root(base, u) / "long" for u in STUDENTS}
    s1, s2, s3 = STUDENTS
    other_id = json.loads((longs[s2] / "job.json").read_text())["job_id"]

    # a student cannot cancel another's job: labkit refuses, and so does Slurm
    p = _labkit(s1, site, "cancel", str(longs[s2]))
    assert p.returncode == 1 and "your own jobs" in p.stderr, p.stderr
    p = _labkit(s1, site, "cancel", other_id)
    assert p.returncode == 1 and other_id in p.stderr, p.stderr
    p = _run(s1, ["scancel", other_id], site, env={"SLURM_CONF": conf})
    assert p.returncode != 0 or "denied" in p.stderr.lower(), (p.returncode, p.stderr)
    assert _state(longs[s2], conf) in ("PENDING", "RUNNING")

    # the instructor's view (root): all three, with their progress
    end = time.time() + 120
    while True:
        p = subprocess.run([sys.executable, "-m", "labkit", "class", "status", "--json",
                            "--cluster", str(site)], capture_output=True, text=True, cwd=REPO)
        assert p.returncode == 0, p.stderr
        rows = {r["user"]: r for r in json.loads(p.stdout)}
        running = [r for r in rows.values() if r["jobs"]["RUNNING"]]
        if running and any(x["iteration"] for r in running for x in r["runs"]
                           if x["state"] == "RUNNING") or time.time() > end:
            break
        time.sleep(3)
    assert set(rows) == set(STUDENTS)
    for r in rows.values():
        assert r["last_notebook"] == "01", r
        assert r["jobs"]["finished"] == len(runs) and r["jobs"]["PENDING"] + r["jobs"]["RUNNING"] == 1
        done = {x["name"]: x for x in r["runs"]}
        assert done["nb01_dp"]["state"] == "COMPLETED"
        assert done["nb01_dp"]["iteration"] == done["nb01_dp"]["train_iters"] == 10
    assert any(x["iteration"] for r in running for x in r["runs"] if x["state"] == "RUNNING"), \
        "no running job showed its progress (iteration) within 120 s"

    # cancel --all as s1: s1's job only
    p = _labkit(s1, site, "cancel", "--all", "--json")
    assert p.returncode == 0, p.stderr
    assert [r["name"] for r in json.loads(p.stdout)] == ["long"]
    end = time.time() + 60
    while _state(longs[s1], conf) not in ("CANCELLED", "?") and time.time() < end:
        time.sleep(1)
    assert _state(longs[s1], conf) == "CANCELLED"
    assert _state(longs[s2], conf) in ("PENDING", "RUNNING")
    assert _state(longs[s3], conf) in ("PENDING", "RUNNING")

    # clean as s1: s1's checkpoints only
    before = {u: (_root(base, u) / "nb01_dp" / "checkpoints").exists() for u in STUDENTS}
    assert all(before.values())
    p = _labkit(s1, site, "clean", "--json")
    assert p.returncode == 0, p.stderr
    removed = [Path(r["path"]) for r in json.loads(p.stdout)["removed"]]
    assert removed and all(_root(base, s1) in r.parents for r in removed), removed
    assert not (_root(base, s1) / "nb01_dp" / "checkpoints").exists()
    assert (_root(base, s2) / "nb01_dp" / "checkpoints").exists()
    assert (_root(base, s3) / "nb01_dp" / "checkpoints").exists()

    # end of the day: a student may not, the instructor (root) may
    p = _labkit(s2, site, "class", "cancel", "--all")
    assert p.returncode == 1 and "root" in p.stderr, p.stderr
    p = subprocess.run([sys.executable, "-m", "labkit", "class", "cancel", "--all", "--json",
                        "--cluster", str(site)], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0, p.stderr
    assert sorted(r["user"] for r in json.loads(p.stdout)) == [s2, s3]
    # the instructor frees the class's checkpoints: listed first, then removed (s1 had freed
    # theirs); never a run still running (the cancelled jobs may still be ending)
    kept = {u: (_root(base, u) / run / "checkpoints").resolve()
            for u, run in ((s2, "nb01_dp"), (s3, "nb01_dp"))}
    for extra in (["--dry-run"], []):
        p = subprocess.run([sys.executable, "-m", "labkit", "class", "clean", *extra, "--json",
                            "--cluster", str(site)], capture_output=True, text=True, cwd=REPO)
        assert p.returncode == 0, p.stderr
        paths = [Path(r["path"]).resolve() for r in json.loads(p.stdout)["removed"]]
        assert set(kept.values()) <= set(paths), paths
        assert not [q for q in paths if _root(base, s1).resolve() in q.parents], paths
        assert all(d.exists() for d in kept.values()) == bool(extra)


def test_regress_on_the_site(klass, slurm_cluster, tmp_path):
    """``labkit regress --cluster site.yaml`` (as root): 01 and 02 (two nodes; it reuses 01's
    run) on Slurm, in the site's run root, against the cpu baseline."""
    base, site, _ = klass
    out = tmp_path / "regress"
    p = subprocess.run([sys.executable, "-m", "labkit", "regress", "01", "02", "--cluster",
                        str(site), "--out", str(out), "--json"], capture_output=True, text=True,
                       cwd=REPO, timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert doc["ok"] and doc["backend"] == "slurm" and len(doc["notebooks"]) == 2
    runs = _root(base, "root")
    assert (runs / "nb01_dp" / "job.json").exists()
    assert json.loads((runs / "nb01_dp" / "job.json").read_text())["backend"] == "slurm"
