"""labkit doctor for a class, without Slurm: the fit arithmetic, the GRES and queue-reason
tables, and the per-user run root check on real folders with real permissions."""

from __future__ import annotations

import pwd

import pytest

from labkit import doctor
from labkit.doctor.fit import NodeInfo, class_fit, gres_gpus, jobs_at_once, node_slots
from labkit.doctor.probe import queue_fix
from labkit.doctor.sitechecks import check_class_run_root
from labkit.site import ClusterProfile


@pytest.mark.parametrize("slots, k, want", [
    ([1, 1], 2, 1),          # the mini-cluster: one 2-node job at a time
    ([2, 2], 2, 2),
    ([1, 1], 1, 2),
    ([4, 1, 1], 2, 2),       # a big node cannot hold two tasks of one job
    ([4, 0], 2, 0),          # only one usable node for a 2-node job
    ([8] * 4, 1, 32),
    ([1, 1, 1], 4, 0),       # more nodes per job than the partition has
    ([3, 3, 3], 2, 4),       # 9 tasks, 2 per job: 4 jobs (8 tasks), never two on one node
])
def test_jobs_at_once(slots, k, want):
    assert jobs_at_once(slots, k) == want


def test_jobs_at_once_refuses_a_job_without_nodes():
    with pytest.raises(ValueError, match="nodes_per_job=0"):
        jobs_at_once([1, 1], 0)


def test_node_slots_count_cpus_gpus_and_state():
    n = NodeInfo("gpu1", cpus=64, gpus=8, state="idle")
    assert node_slots(n, cpus=32, gpus=4) == 2
    assert node_slots(n, cpus=8, gpus=2) == 4          # GPUs bind before CPUs (8 fit by CPUs)
    assert node_slots(n, cpus=8, gpus=0) == 8          # a CPU job ignores the GPUs
    assert node_slots(n, cpus=8, gpus=2, exclusive=True) == 1
    assert node_slots(NodeInfo("c1", 2, 0, "mix"), cpus=2, gpus=0) == 1
    assert node_slots(NodeInfo("c1", 2, 0, "drain"), cpus=1, gpus=0) == 0
    assert node_slots(NodeInfo("c1", 2, 0, "down*"), cpus=1, gpus=0) == 0


@pytest.mark.parametrize("gres, want", [("gpu:8", 8), ("gpu:a100:4(S:0-1)", 4), ("(null)", 0),
                                        ("gpu:2,shard:4", 2), ("gpu:h100:4,gpu:a100:2", 6)])
def test_gres_gpus(gres, want):
    assert gres_gpus(gres) == want


def test_class_fit_of_a_gpu_partition():
    """20 students, each job 2 nodes x 8 GPUs, on 4 nodes of 8 GPUs: 2 jobs at once."""
    nodes = [NodeInfo(f"g{i}", 64, 8, "idle") for i in range(4)]
    fit = class_fit(nodes, 20, nodes_per_job=2, cpus=32, gpus=8)
    assert (fit.at_once, fit.fits, fit.usable_nodes) == (2, False, 4)
    assert class_fit(nodes, 2, 2, 32, 8).fits
    assert class_fit(nodes, None, 1, 8, 1).at_once == 32


def test_queue_reasons_have_fixes():
    assert "State=UP" in queue_fix("PartitionDown", "lab") and "lab" in queue_fix("PartitionDown", "lab")
    assert "sinfo -R" in queue_fix("ReqNodeNotAvail, UnavailableNodes:node3", "lab")
    assert "--nodes" in queue_fix("Resources", "lab")
    assert "sacctmgr" in queue_fix("AssocGrpGRES", "lab")
    assert "'Weird'" in queue_fix("Weird", None)


# --- the per-user run root (real folders, real modes) -----------------------------------------
def _site(tmp_path, root: str) -> doctor.Context:
    return doctor.Context(profile=ClusterProfile(name="class", run_root=root))


def test_class_run_root_sticky_parent_passes_and_leaves_nothing(tmp_path):
    parent = tmp_path / "class"
    parent.mkdir()
    parent.chmod(0o1777)
    r = check_class_run_root(_site(tmp_path, f"{parent}/{{user}}/runs"))
    assert r.status == "PASS", r
    assert "world-writable and sticky" in r.detail and "created and removed" in r.detail
    assert list(parent.iterdir()) == []  # the probe folder and the per-user root it made are gone


def test_class_run_root_without_sticky_bit_warns(tmp_path):
    parent = tmp_path / "class"
    parent.mkdir()
    parent.chmod(0o777)
    r = check_class_run_root(_site(tmp_path, f"{parent}/{{user}}/runs"))
    assert r.status == "WARN" and "without the sticky bit" in r.detail
    assert r.fix == f"chmod +t {parent}"


def test_class_run_root_owner_only_parent_fails_unless_folders_are_precreated(tmp_path):
    parent = tmp_path / "class"
    parent.mkdir()
    parent.chmod(0o755)
    ctx = _site(tmp_path, f"{parent}/{{user}}/runs")
    r = check_class_run_root(ctx)
    assert r.status == "FAIL" and "mode 0755" in r.detail and "no per-user folder" in r.detail
    assert "chmod 1777" in r.fix
    me = pwd.getpwuid(parent.stat().st_uid).pw_name
    (parent / me).mkdir()  # an instructor's pre-created folder, owned by its user
    r = check_class_run_root(ctx)
    assert r.status == "PASS" and f"pre-created in {parent}" in r.detail and me in r.detail
    ctx.students = 3
    r = check_class_run_root(ctx)
    assert r.status == "WARN" and "fewer than 3 students" in r.detail


def test_class_run_root_without_user_placeholder_warns(tmp_path):
    r = check_class_run_root(_site(tmp_path, f"{tmp_path}/shared/runs"))
    assert r.status == "WARN" and "has no {user}" in r.detail and "{user}" in r.fix
    r = check_class_run_root(doctor.Context(profile=ClusterProfile(name="class")))
    assert r.status == "WARN" and "sets no run_root" in r.detail


def test_class_run_root_that_cannot_be_created_fails(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    r = check_class_run_root(_site(tmp_path, f"{blocker}/{{user}}/runs"))
    assert r.status == "FAIL" and "cannot create a folder in my run root" in r.detail
    assert str(blocker) in r.detail


def test_the_probe_and_fit_take_the_series_shape_from_the_site():
    """Nodes: the series' multi-node runs (2), or --nodes; per node: the site's GPUs on a GPU
    site (its gpus_per_node), the cpu profile's processes otherwise. Never 'up to 8'."""
    gpu_site = ClusterProfile(name="g", gpu_request="gres", gpus_per_node=4)
    assert doctor.Context(profile=gpu_site, wants_slurm=True).series_shape() == (2, 4)
    assert doctor.Context(profile=gpu_site, wants_slurm=True, nodes=3).series_shape() == (3, 4)
    cpu_site = ClusterProfile(name="c", gpu_request="none")
    assert doctor.Context(profile=cpu_site, wants_slurm=True).series_shape() == (2, 2)
    prefix, tok = doctor.Context(profile=ClusterProfile(name="s", code_dir="/shared/lk/code")
                                 ).data_location()
    assert (str(prefix), str(tok)) == ("/shared/lk/data/corpus_text_document", "/shared/lk/data/tokenizer")


def test_students_without_class_is_refused():
    from labkit.errors import ConfigError

    with pytest.raises(ConfigError, match="--class --students 3"):
        doctor.run_doctor(students=3, checks=[])


@pytest.fixture
def open_dir():
    """A folder every user may enter (pytest's own tmp_path is root's alone)."""
    import shutil
    import tempfile
    from pathlib import Path

    d = Path(tempfile.mkdtemp(prefix="labkit-doctor-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d)


def test_class_solutions_readable_by_students_is_a_warning(open_dir):
    from labkit.doctor.sitechecks import check_class_solutions

    checkout = open_dir / "labkit"
    sol = checkout / "notebooks" / "solutions"
    sol.mkdir(parents=True)
    (checkout / "code").mkdir()
    answer = sol / "01_single_node.ipynb"
    answer.write_text("{}")
    for d in (checkout, checkout / "notebooks", sol):
        d.chmod(0o755)
    answer.chmod(0o644)
    ctx = doctor.Context(profile=ClusterProfile(name="class", code_dir=str(checkout / "code")))
    r = check_class_solutions(ctx)
    assert r.status == "WARN" and str(sol) in r.detail and "1 notebook" in r.detail, r
    assert f"chmod -R o-rwx {sol}" in r.fix
    sol.chmod(0o750)
    answer.chmod(0o640)
    r = check_class_solutions(ctx)
    assert r.status == "PASS" and "not readable" in r.detail, r
    answer.chmod(0o644)  # a readable file in a folder others cannot enter stays closed
    assert check_class_solutions(ctx).status == "PASS"
    sol.chmod(0o751)  # ... but a folder others may enter opens it
    assert check_class_solutions(ctx).status == "WARN"
    assert "class_solutions" in [n for n, _ in doctor.CLASS_CHECKS]
