"""The class's JupyterHub on the Slurm mini-cluster, for real (``labkit class hub``).

Two Unix users in one Unix group (the class), a shared checkout and a site profile written the
way an instructor writes one, with the class's Python (``/opt/labkit-venv``, with the ``hub``
extra) on PATH through its ``setup`` line. ``labkit class hub up`` (root) runs JupyterHub with
PAM, batchspawner's SlurmSpawner and configurable-http-proxy; the admin token of ``hub status
--json`` starts both students' servers through the hub's REST API. Each server is a Slurm job
run by that student on a compute node, with LABKIT_CLUSTER set to the site; it answers through
the hub and lists the hand-out (01_single_node, no solutions) at its root; stopping it through
the API ends its job, and ``hub down`` leaves no hub process behind.

Needs root, the mini-cluster (the session's ``slurm_cluster``), the class venv
(tests/class_env.py) and configurable-http-proxy (``make setup`` installs it with npm).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import class_env
import pytest
from conftest import REPO, skip_or_fail

pytestmark = [pytest.mark.slurm, pytest.mark.users, pytest.mark.timeout(900)]
STUDENTS = ["labkit-hub1", "labkit-hub2"]
GROUP = "labkit-hubclass"


def _labkit(*args: str, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labkit", *args], capture_output=True,
                          text=True, cwd=REPO, env={**os.environ, **env}, timeout=timeout)


@pytest.fixture(scope="module")
def klass(slurm_cluster):
    """(base dir, site YAML, {LABKIT_HUB_DIR}): the class, ready for a hub."""
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("runuser", "useradd", "chpasswd",
                                                               "groupadd")):
        skip_or_fail("needs root and runuser/useradd/chpasswd/groupadd (util-linux, passwd)")
    missing = [m for m in ("jupyterhub", "batchspawner", "jupyterhub_idle_culler")
               if importlib.util.find_spec(m) is None]
    if missing:
        skip_or_fail(f"{missing} not installed: make setup (the hub extra)")
    from labkit.hub import HubError, proxy_command

    try:
        proxy_command()
    except HubError as e:
        skip_or_fail(str(e))
    try:
        class_env.ensure_venv()
        class_env.ensure_hub()
    except (RuntimeError, subprocess.CalledProcessError) as e:
        skip_or_fail(f"no interpreter for the students: {e}")
    base = Path(tempfile.mkdtemp(prefix="labkit-hub-"))
    base.chmod(0o755)
    src = class_env.shared_checkout(base / "labkit")
    shared = base / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    site = base / "site.yaml"
    site.write_text(
        "# The class's site profile, as the instructor writes it (docs/INSTRUCTORS.md)\n"
        "name: class-minicluster\n"
        "partition: lab\n"
        "time_limit: \"00:20:00\"\n"
        "gpu_request: none\n"
        "master_addr_from: nodeaddr\n"
        f"slurm_conf: {slurm_cluster.slurm_conf}\n"
        f"torchrun: {class_env.VENV}/bin/torchrun\n"
        f"code_dir: {src}/code\n"
        f"run_root: {shared}/{{user}}/runs\n"
        "setup:\n"
        f"  - export PATH={class_env.VENV}/bin:$PATH\n"
        "env:\n"
        "  GLOO_SOCKET_IFNAME: eth0\n"
        "  OMP_NUM_THREADS: \"1\"\n")
    site.chmod(0o644)
    class_env.add_users(STUDENTS, base / "home")
    subprocess.run(["groupadd", "-f", GROUP], check=True, capture_output=True)
    for u in STUDENTS:
        subprocess.run(["usermod", "-aG", GROUP, u], check=True, capture_output=True)
        subprocess.run(["chpasswd"], input=f"{u}:pw-{u}\n", text=True, check=True)
    env = {"LABKIT_HUB_DIR": str(base / "hub-state")}
    try:
        yield base, site, env
    finally:
        _labkit("class", "hub", "down", env=env)
        for u in STUDENTS:
            subprocess.run(["scancel", "-u", u], env={**os.environ,
                           "SLURM_CONF": str(slurm_cluster.slurm_conf)}, capture_output=True)
            class_env.remove_user(u)
        subprocess.run(["groupdel", GROUP], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def hub(klass):
    """The hub, up: (status document, env of the hub commands)."""
    from labkit.backends.local import free_port

    base, site, env = klass
    p = _labkit("class", "hub", "up", "--cluster", str(site), "--port", str(free_port()),
                "--group", GROUP, "--json", env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    yield doc, env


def _api(doc: dict, path: str, method: str = "GET", prefix: str = "/hub/api") -> object:
    token = Path(doc["api_token_file"]).read_text().strip()
    req = urllib.request.Request(f"{doc['url']}{prefix}{path}", method=method,
                                 headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=60) as r:  # noqa: S310 - the test's own hub
        body = r.read()
    return json.loads(body) if body else None


def _wait(what: str, check, timeout: float = 240, every: float = 2):
    end = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > end:
            pytest.fail(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)


def _server_env(user: str) -> dict[str, str]:
    """The environment of ``user``'s jupyterhub-singleuser process (root reads /proc)."""
    pids = subprocess.run(["pgrep", "-u", user, "-f", "jupyterhub-singleuser"],
                          capture_output=True, text=True).stdout.split()
    for pid in pids:
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        return dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)
    return {}


def test_two_students_servers_are_their_slurm_jobs(hub, klass, slurm_cluster):
    doc, env = hub
    base, site, _ = klass
    assert doc["up"] and doc["url"].startswith("http://127.0.0.1:")
    token = Path(doc["api_token_file"])
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and token.stat().st_uid == 0
    assert stat.S_IMODE(token.parent.stat().st_mode) == 0o700

    for u in STUDENTS:
        _api(doc, f"/users/{u}", "POST")
        _api(doc, f"/users/{u}/server", "POST")

    def ready():
        users = {u: _api(doc, f"/users/{u}")["servers"].get("") for u in STUDENTS}
        return users if all(s and s["ready"] for s in users.values()) else None

    _wait("both servers ready through the hub", ready)
    p = _labkit("class", "hub", "status", "--json", env=env)
    assert p.returncode == 0, p.stderr
    status = json.loads(p.stdout)
    assert set(status["servers"]) == set(STUDENTS), status
    uids = {u: int(subprocess.run(["id", "-u", u], capture_output=True, text=True).stdout)
            for u in STUDENTS}
    from labkit import slurmcli

    jobs = slurmcli.all_jobs(str(slurm_cluster.slurm_conf))
    for u in STUDENTS:
        job_id = status["servers"][u]["job_id"]
        state, name, uid = jobs[job_id]
        assert (state, name, uid) == ("RUNNING", f"labkit-hub-{u}", uids[u]), jobs[job_id]
        server = _server_env(u)
        assert server.get("LABKIT_CLUSTER") == str(site), server.get("LABKIT_CLUSTER")
        assert server.get("SLURM_JOB_ID") == job_id
        assert "SLURM_EXPORT_ENV" not in server  # the student's own sbatch gets everything
        # through the hub (the proxy), the server lists the hand-out at its root
        names = sorted(c["name"] for c in _api(doc, "/api/contents", prefix=f"/user/{u}")["content"])
        assert "01_single_node.ipynb" in names, names
        assert not [n for n in names if "solution" in n], names
        assert all(n[:2].isdigit() and n.endswith(".ipynb") for n in names), names

    # stopping a server through the hub ends its Slurm job
    first = STUDENTS[0]
    job_id = status["servers"][first]["job_id"]
    _api(doc, f"/users/{first}/server", "DELETE")
    conf = str(slurm_cluster.slurm_conf)
    _wait(f"{first}'s server job {job_id} ended",
          lambda: _job_state(conf, job_id) not in ("RUNNING", "PENDING", "COMPLETING"),
          timeout=120)
    assert _job_state(conf, status["servers"][STUDENTS[1]]["job_id"]) == "RUNNING"



def _job_state(conf: str, job_id: str) -> str:
    from labkit import slurmcli

    return slurmcli.all_jobs(conf).get(job_id, ("gone",))[0]


def _start(doc: dict, user: str) -> None:
    if _user(doc, user) is None:
        _api(doc, f"/users/{user}", "POST")
    _api(doc, f"/users/{user}/server", "POST")
    _wait(f"{user}'s server ready", lambda: (_user(doc, user)["servers"].get("") or {}).get("ready"))


def _user(doc: dict, user: str) -> dict | None:
    try:
        return _api(doc, f"/users/{user}")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise


def _runs(pid: int) -> bool:
    """The process is there and not a zombie (the hub's parent, the CLI, has exited)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def test_hub_down_ends_every_server_job(hub, slurm_cluster):
    """Runs last in this module: the hub stops."""
    doc, env = hub
    conf = str(slurm_cluster.slurm_conf)
    user = STUDENTS[1]
    if not (_user(doc, user) or {}).get("servers", {}).get("", {}).get("ready"):
        _start(doc, user)
    from labkit.hub import server_jobs

    job_id = server_jobs(conf)[user]["job_id"]
    assert _job_state(conf, job_id) == "RUNNING"
    p = _labkit("class", "hub", "down", "--json", env=env)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"cancelled": []}  # the hub itself ended its server's job
    _wait(f"{user}'s server job {job_id} ended",
          lambda: _job_state(conf, job_id) not in ("RUNNING", "PENDING", "COMPLETING"), timeout=60)
    assert not _runs(doc["pid"]), "the hub still runs after down"
    p = _labkit("class", "hub", "status", "--json", env=env)
    assert p.returncode == 0 and json.loads(p.stdout)["up"] is False
