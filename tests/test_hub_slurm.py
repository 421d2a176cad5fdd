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

import contextlib
import importlib.util
import json
import os
import re
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
    # the setup line puts the class's Python (with the hub extra) on the server jobs' PATH
    site = class_env.write_site(base / "site.yaml", slurm_conf=slurm_cluster.slurm_conf,
                                checkout=src, shared=shared,
                                extra=f"setup:\n  - export PATH={class_env.VENV}/bin:$PATH\n")
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
    # the instructor's copy of the configs, next to the site profile (docs/INSTRUCTORS.md)
    shutil.copytree(REPO / "code" / "hub", base / "hub-config")
    config = base / "hub-config" / "minicluster_config.py"
    p = _labkit("class", "hub", "up", "--cluster", str(site), "--config", str(config),
                "--port", str(free_port()), "--group", GROUP, "--json", env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert doc["config"] == str(config)
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

    # the hand-out ahead of the class, as root for both (as each of them): nothing to add
    p = _labkit("class", "handout", "--students", *STUDENTS, "--json", env=env)
    assert p.returncode == 0, p.stderr
    given = json.loads(p.stdout)
    assert sorted(given) == STUDENTS and all(r["action"] == "same" for u in STUDENTS
                                             for r in given[u]), given

    # TensorBoard of a student, on their server's node, reached through the hub's proxy and
    # the server's jupyter-server-proxy (no port of a login node shared by the class)
    _tensorboard_through_the_hub(doc, STUDENTS[1], status["servers"][STUDENTS[1]]["job_id"],
                                 str(slurm_cluster.slurm_conf))

    # stopping a server through the hub ends its Slurm job
    first = STUDENTS[0]
    job_id = status["servers"][first]["job_id"]
    _api(doc, f"/users/{first}/server", "DELETE")
    conf = str(slurm_cluster.slurm_conf)
    _wait(f"{first}'s server job {job_id} ended",
          lambda: _job_state(conf, job_id) not in ("RUNNING", "PENDING", "COMPLETING"),
          timeout=120)
    assert _job_state(conf, status["servers"][STUDENTS[1]]["job_id"]) == "RUNNING"



def _tensorboard_through_the_hub(doc: dict, user: str, job_id: str, conf: str) -> None:
    from labkit.backends.local import free_port

    port = free_port()
    logdir = pwd_home(user)
    tb = subprocess.Popen(class_env.as_user(user, [
        "srun", f"--jobid={job_id}", "--overlap", "-N1", "-n1",
        str(class_env.VENV / "bin" / "tensorboard"), "--logdir", logdir, "--port", str(port)],
        env={"SLURM_CONF": conf}), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        def answers():
            try:
                return _api(doc, "/data/logdir", prefix=f"/user/{user}/proxy/{port}")
            except (OSError, ValueError):
                return None
        got = _wait(f"{user}'s TensorBoard through the hub", answers, timeout=120)
        assert got["logdir"] == logdir, got
    finally:
        os.killpg(tb.pid, 15)
        tb.wait(timeout=60)


def pwd_home(user: str) -> str:
    import pwd

    return pwd.getpwnam(user).pw_dir


# --- the browser: two students at once ----------------------------------------------------------
NOTEBOOK = "01_single_node.ipynb"


def _login(browser, doc: dict, user: str):
    """A student's own browser session: the hub's login form (PAM), then their JupyterLab."""
    import test_browser as tb

    page = browser.new_context(viewport=tb.VIEW).new_page()
    page.goto(f"{doc['url']}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", f"pw-{user}")
    page.click("#login_submit")
    page.wait_for_url(f"**/user/{user}/lab**", timeout=240_000)  # the server job started
    page.goto(f"{doc['url']}/user/{user}/lab/tree/{NOTEBOOK}")
    page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").first.wait_for(timeout=120_000)
    return page


def _lab(doc: dict, user: str, home: Path):
    """test_browser's view of one student's JupyterLab (its API with the admin token)."""
    import test_browser as tb

    token = Path(doc["api_token_file"]).read_text().strip()
    return tb.Lab(f"{doc['url']}/user/{user}", token, home / "labkit-notebooks", home, home, None)


def _lab_settings(home: Path, user: str) -> None:
    """test_browser's JupyterLab settings (every cell in the page, the kernel started without
    asking), as the student's own user settings."""
    import test_browser as tb

    for rel, value in tb.LAB_SETTINGS.items():
        f = home / ".jupyter" / "lab" / "user-settings" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(value))
    subprocess.run(["chown", "-R", f"{user}:{user}", str(home / ".jupyter")], check=True)


@pytest.mark.browser
def test_two_students_run_01_at_once_in_the_browser(hub, klass, slurm_cluster):
    """Both log in in Chromium, their servers are their Slurm jobs, each runs 01 from their
    hand-out to the end at the same time; the instructor's class status shows both servers
    and their runs; a student's Stop My Server ends the job."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        skip_or_fail("playwright is not installed (.venv/bin/pip install -e '.[dev]')")
    import test_browser as tb

    from labkit import slurmcli

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not os.access(chromium, os.X_OK):
        skip_or_fail("Debian's chromium is not installed (apt-get install chromium)")
    doc, env = hub
    base, site, _ = klass
    conf = str(slurm_cluster.slurm_conf)
    homes = {u: base / "home" / u for u in STUDENTS}
    for u in STUDENTS:
        _lab_settings(homes[u], u)
    with sync_playwright() as pw, _logs_on_failure(doc, homes):
        browser = pw.chromium.launch(executable_path=chromium)
        try:
            pages = {u: _login(browser, doc, u) for u in STUDENTS}
            labs = {u: _lab(doc, u, homes[u]) for u in STUDENTS}
            for u in STUDENTS:  # both kernels up, then Run All in both: the runs overlap
                _wait(f"{u}'s kernel idle", lambda u=u: (k := _kernel(labs[u]))
                      and k["kernel"]["execution_state"] == "idle", timeout=180)
            for u in STUDENTS:
                tb._click_menu(pages[u], "Run", "Run All Cells")
            started, idle = time.monotonic(), {"polls": 0}

            def done() -> bool:  # idle at two polls in a row: Run All has nothing left
                ok = all(_finished(pages[u], labs[u]) for u in STUDENTS)
                idle["polls"] = idle["polls"] + 1 if ok else 0
                return idle["polls"] >= 2

            _wait("01 ran to the end in both students' pages", done, timeout=600, every=3)
            elapsed = time.monotonic() - started
            for u in STUDENTS:
                saved, cells = _save(pages[u], labs[u])
                found = tb.problems(saved, cells)
                assert not found, f"{u}'s 01 in JupyterLab through the hub:\n  " + "\n  ".join(found)

            # the instructor's view: both servers and both runs
            p = _labkit("class", "status", "--json", "--cluster", str(site), env=env)
            assert p.returncode == 0, p.stderr
            rows = {r["user"]: r for r in json.loads(p.stdout)}
            jobs = slurmcli.all_jobs(conf)
            for u in STUDENTS:
                server = rows[u]["server"]
                assert server and server["state"] == "RUNNING", rows[u]
                assert jobs[server["job_id"]][1] == f"labkit-hub-{u}"
                runs = {x["name"]: x for x in rows[u]["runs"]}
                assert runs["nb01_dp"]["state"] == "COMPLETED", rows[u]
                assert runs["nb01_dp"]["iteration"] == runs["nb01_dp"]["train_iters"], rows[u]

            # the plan for 30 from a rehearsal: here one student's 01, as documented
            p = subprocess.run(class_env.as_user(STUDENTS[1], [
                str(class_env.VENV / "bin" / "python"), "-m", "labkit", "class", "plan",
                "--students", "30", "--cluster", str(site), "--json"], env={}),
                capture_output=True, text=True, timeout=120)
            assert p.returncode == 0, p.stderr
            plan = json.loads(p.stdout)
            assert [r["notebook"] for r in plan["notebooks"]] == ["01"], plan
            one = plan["notebooks"][0]
            assert one["runs"] >= 2 and one["node_hours"] > 0 and one["checkpoint_bytes"] > 0
            assert plan["peak_nodes"] == 30 and plan["runs_from"].startswith(str(base))

            # a student stops their server from the hub's home page: its Slurm job ends
            u = STUDENTS[0]
            job_id = rows[u]["server"]["job_id"]
            pages[u].goto(f"{doc['url']}/hub/home")
            pages[u].click("#stop")
            _wait(f"{u}'s server job {job_id} ended after Stop My Server",
                  lambda: _job_state(conf, job_id) not in ("RUNNING", "PENDING", "COMPLETING"),
                  timeout=120)
        finally:
            browser.close()
    print(f"01 in two students' browsers at once: {elapsed:.0f} s")


@contextlib.contextmanager
def _logs_on_failure(doc: dict, homes: dict[str, Path]):
    """A failure says what the hub and each student's server logged last."""
    try:
        yield
    except BaseException as e:
        tails = [f"--- {doc['log']}", _tail(Path(doc["log"]))]
        for home in homes.values():
            logs = sorted(home.glob("labkit-jupyter-*.log"), key=lambda f: f.stat().st_mtime)
            if logs:
                tails += [f"--- {logs[-1]}", _tail(logs[-1])]
        raise AssertionError(f"{e}\n" + "\n".join(tails)) from e


def _tail(path: Path, n: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(none)"


def _finished(page, lab) -> bool:
    import test_browser as tb

    cells = page.evaluate(tb.CELLS_JS)
    started = any(re.search(r"\[\d+\]", c["prompt"]) for c in cells)
    busy = any("*" in c["prompt"] for c in cells)
    k = _kernel(lab)
    return started and not busy and bool(k) and k["kernel"]["execution_state"] == "idle"


def _kernel(lab) -> dict | None:
    """The notebook's session, None while the server does not answer (a 502/503 of the proxy
    while the hub moves the route of a server that just started)."""
    import test_browser as tb

    try:
        return tb._kernel(lab, NOTEBOOK)
    except urllib.error.HTTPError as e:
        if e.code in (502, 503):
            return None
        raise


def _save(page, lab):
    import nbformat
    import test_browser as tb

    path = lab.root / NOTEBOOK
    before = path.stat().st_mtime_ns
    tb._click_menu(page, "File", "Save Notebook")
    _wait(f"{path} saved", lambda: path.stat().st_mtime_ns != before, timeout=30, every=0.5)
    time.sleep(0.5)
    return nbformat.read(path, as_version=4), page.evaluate(tb.CELLS_JS)


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


def _running_server_job(doc: dict, conf: str, user: str) -> str:
    """The Slurm job of ``user``'s server, started through the hub if it is not up."""
    if not (_user(doc, user) or {}).get("servers", {}).get("", {}).get("ready"):
        _start(doc, user)
    from labkit.hub import server_jobs

    job_id = server_jobs(conf)[user]["job_id"]
    assert _job_state(conf, job_id) == "RUNNING"
    return job_id


def test_the_idle_culler_ends_a_forgotten_server(hub, slurm_cluster):
    """A started server nobody uses: jupyterhub-idle-culler, the hub's culler service, run with
    the admin token and a 5 s timeout (the hub's own waits an hour, --cull-after), stops it
    through the hub, and its Slurm job ends."""
    doc, _ = hub
    conf = str(slurm_cluster.slurm_conf)
    user = STUDENTS[1]
    job_id = _running_server_job(doc, conf, user)
    token = Path(doc["api_token_file"]).read_text().strip()
    culler = subprocess.Popen(
        [sys.executable, "-m", "jupyterhub_idle_culler", f"--url={doc['url']}/hub/api",
         "--timeout=5", "--cull-every=2"], env={**os.environ, "JUPYTERHUB_API_TOKEN": token},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait(f"{user}'s forgotten server job {job_id} ended",
              lambda: _job_state(conf, job_id) not in ("RUNNING", "PENDING", "COMPLETING"),
              timeout=120)
    finally:
        culler.terminate()
        said = culler.communicate(timeout=30)[0]
    assert f"Culling server {user} (inactive for" in said, said[-2000:]
    _wait(f"the hub no longer lists {user}'s server",
          lambda: (_user(doc, user) or {}).get("servers", {}) == {}, timeout=60)


def test_hub_down_ends_every_server_job(hub, slurm_cluster):
    """Runs last in this module: the hub stops."""
    doc, env = hub
    conf = str(slurm_cluster.slurm_conf)
    user = STUDENTS[1]
    job_id = _running_server_job(doc, conf, user)
    p = _labkit("class", "hub", "down", "--json", env=env)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"cancelled": []}  # the hub itself ended its server's job
    _wait(f"{user}'s server job {job_id} ended",
          lambda: _job_state(conf, job_id) not in ("RUNNING", "PENDING", "COMPLETING"), timeout=60)
    assert not _runs(doc["pid"]), "the hub still runs after down"
    p = _labkit("class", "hub", "status", "--json", env=env)
    assert p.returncode == 0 and json.loads(p.stdout)["up"] is False
