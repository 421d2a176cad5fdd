"""The local backend's nodes as rootless network namespaces, run by a user who is not root.

A throwaway Unix user runs tests/programs/nodes_as_user.py (runuser, the shared venv of
tests/class_env.py, this tree's labkit on PYTHONPATH): the all-reduce benchmark on 2 nodes x
2 ranks with the link shaped to 100 Mbit/s, then two jobs at once on the same node addresses
(one launcher killed with -9, one cancelled), then a job that fails. Afterwards nothing of any
job runs, and no process anywhere is still in one of the jobs' network namespaces.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import class_env
import pytest
from conftest import REPO, skip_or_fail

pytestmark = [pytest.mark.users, pytest.mark.timeout(900)]
USER = "labkit-nodes1"


@pytest.fixture(scope="module")
def as_user():
    """(user, PYTHONPATH dir, run root): a throwaway user, a copy of labkit and the test
    programs every user can read, and a run root the user owns."""
    if os.geteuid() != 0:
        skip_or_fail("needs root to create a Unix user")
    if not all(shutil.which(t) for t in ("runuser", "useradd")):
        skip_or_fail("runuser/useradd are missing (util-linux, passwd)")
    try:
        class_env.ensure_venv()
    except (RuntimeError, subprocess.CalledProcessError) as e:
        skip_or_fail(f"no interpreter every user can run: {e}")
    base = Path(tempfile.mkdtemp(prefix="labkit-nodes-"))
    base.chmod(0o755)
    tree = base / "tree"
    for part in ("labkit", "code", "tests/programs"):
        shutil.copytree(REPO / part, tree / part,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for p in [tree, *tree.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    class_env.add_users([USER], base / "home")
    runs = base / "home" / USER / "runs"
    runs.mkdir()
    shutil.chown(runs, USER, USER)
    try:
        yield USER, tree, runs
    finally:
        class_env.remove_user(USER)
        shutil.rmtree(base, ignore_errors=True)


def _netns_in_use() -> set[str]:
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                out.add(os.readlink(f"/proc/{d}/ns/net"))
            except OSError:
                pass
    return out


def test_rootless_nodes_as_a_user(as_user):
    user, tree, runs = as_user
    env = {"PYTHONPATH": str(tree), "LABKIT_RUN_ROOT": str(runs), "LABKIT_LINK_RATE": "100mbit"}
    p = subprocess.run(class_env.as_user(user, [str(class_env.VENV / "bin/python"),
                                                str(tree / "tests/programs/nodes_as_user.py")],
                                         env=env, cwd=tree),
                       capture_output=True, text=True, timeout=840)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    if out["probe"]:
        skip_or_fail(f"rootless network namespaces are refused here: {out['probe']}")
    bench = out["bench"]
    assert bench["state"] == "COMPLETED" and bench["record"]["namespaces"], bench
    assert bench["record"]["rate_bits_per_s"] == 100e6, bench
    peak = bench["peak"]
    # The link is shaped: one rank per node across it stays below 100 Mbit/s = 0.0125 GB/s,
    # while the ranks of one node talk over its loopback.
    assert peak["inter"] < 0.0125 and peak["inter"] * 3 < peak["intra"], peak
    jobs = out["jobs"]
    assert out["both_running"], jobs  # two jobs on the same addresses ran side by side
    assert {n: j["state"] for n, j in jobs.items()} == {
        "ns_kill9": "FAILED", "ns_cancel": "CANCELLED", "ns_fail": "FAILED"}, jobs
    assert all(j["left"] == 0 for j in jobs.values()), jobs
    # Each job's ranks were in namespaces of their own (not this machine's, not each other's)...
    mine = os.readlink("/proc/self/ns/net")
    a, b = set(jobs["ns_kill9"]["netns"]), set(jobs["ns_cancel"]["netns"])
    assert len(a) >= 2 and len(b) >= 2 and not a & b and mine not in a | b, jobs
    # ...and nothing is left in them: no process of the user, no live namespace of the jobs.
    left = subprocess.run(["pgrep", "-u", user], capture_output=True, text=True).stdout.split()
    assert not left, left
    assert not (a | b) & _netns_in_use()
