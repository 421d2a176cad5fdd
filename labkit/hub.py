"""The class's JupyterHub: ``labkit class hub up | down | status`` (root).

``up`` runs ``jupyterhub -f CONFIG`` (``code/hub/minicluster_config.py`` while the mini-cluster
is up, else ``code/hub/slurm_config.py``; ``config=`` names an instructor's own copy) as a
background process with its state under ``HUB_DIR`` (root only: the database, the cookie
secret, the admin token, the log). Students log in with their Unix passwords (PAM); each
student's JupyterLab is a Slurm job of theirs on a compute node, started by batchspawner's
SlurmSpawner with ``LABKIT_CLUSTER`` set to the site (``labkit.hub_spawner``). The proxy is
configurable-http-proxy (npm, ``make setup`` installs it under the venv); an idle culler ends
servers nobody used for ``cull_s`` seconds. ``down`` stops the hub, which ends every server's
job first; a server job the hub left behind is cancelled by name (``labkit-hub-<user>``).

``hub_status()`` gives at least ``{"up", "url", "api_token_file"}``; the token file holds an
admin token of the hub's REST API (service ``labkit-admin``), readable by root only.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path
from typing import Any

from labkit import slurmcli
from labkit._logging import log
from labkit.errors import LabkitError
from labkit.paths import CODE_DIR, MINICLUSTER_DIR
from labkit.site import current_user, load_cluster

HUB_DIR = Path(os.environ.get("LABKIT_HUB_DIR") or "/var/lib/labkit-hub")
STARTED = HUB_DIR / "started.json"
TOKEN_FILE = HUB_DIR / "api_token"
LOG_FILE = HUB_DIR / "hub.log"
CONFIG_DIR = CODE_DIR / "hub"
JOB_PREFIX = "labkit-hub-"  # the server jobs' Slurm names (labkit.hub_spawner.BATCH_SCRIPT)
MINICLUSTER_HUB_IP = "10.77.0.1"  # the mini-cluster's bridge (labkit.minicluster)
# configurable-http-proxy as `make setup` installs it (npm, under the venv), else on PATH
PROXY_IN_VENV = Path(sys.prefix) / "node" / "node_modules" / ".bin" / "configurable-http-proxy"


class HubError(LabkitError, RuntimeError):
    """The hub could not be started, or is not there."""


def _read_started() -> dict | None:
    try:
        return json.loads(STARTED.read_text())
    except (OSError, ValueError):
        return None


def _alive(pid: int | None) -> bool:
    try:
        return bool(pid) and "jupyterhub" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(
            errors="replace")
    except OSError:
        return False


def proxy_command() -> str:
    """configurable-http-proxy: ``$LABKIT_HUB_PROXY``, the venv's (``make setup``), or PATH's."""
    given = os.environ.get("LABKIT_HUB_PROXY")
    found = given or (str(PROXY_IN_VENV) if PROXY_IN_VENV.exists() else
                      shutil.which("configurable-http-proxy"))
    if not found or not os.access(found, os.X_OK):
        raise HubError(f"configurable-http-proxy not found ({given or PROXY_IN_VENV} nor on "
                       f"PATH): `make setup` installs it with npm (apt-get install nodejs npm "
                       f"first), or set $LABKIT_HUB_PROXY to its path")
    return found


def _need_root() -> None:
    if os.geteuid() != 0:
        raise HubError(f"`labkit class hub` needs root ({current_user()} is not): the hub "
                       f"checks students' Unix passwords (PAM) and submits their server jobs "
                       f"as them. Run it with sudo")


def _check_packages() -> None:
    missing = []
    for mod in ("jupyterhub", "batchspawner", "jupyterhub_idle_culler"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        raise HubError(f"{', '.join(missing)} not installed in {sys.prefix}: pip install -e "
                       f"'.[hub]' (make setup does)")


def _site_path(site: str | Path | None) -> str | None:
    """The site profile as a file the students' servers can read (``$LABKIT_CLUSTER``)."""
    if site is None:
        return None
    p = Path(site)
    if not p.suffix and not p.exists():
        p = CODE_DIR / "clusters" / f"{site}.yaml"
    if not p.is_file():
        raise LabkitError(f"cluster profile {site}: no such file; give --cluster SITE.yaml, a "
                          f"profile the students' servers can read")
    return str(p.resolve())


def default_config(minicluster: bool) -> Path:
    return CONFIG_DIR / ("minicluster_config.py" if minicluster else "slurm_config.py")


def hub_up(cluster: str | Path | None, *, minicluster: bool = False,
           config: str | Path | None = None, port: int = 8000, ip: str = "127.0.0.1",
           group: str | None = None, cull_s: int = 3600, notebook_dir: str = "~/labkit-notebooks",
           timeout: float = 90) -> dict[str, Any]:
    """Start the hub (idempotent while it runs) and return ``hub_status()``.

    ``cluster``: the class's site profile, a file the students can read (the entry point
    resolves it); ``minicluster``: the site is labkit's mini-cluster (its network and
    SLURM_CONF, ``code/hub/minicluster_config.py``)."""
    _need_root()
    st = _read_started()
    if st and _alive(st.get("pid")):
        log.info("the hub already runs (pid %s): %s", st["pid"], st["url"])
        return hub_status()
    _check_packages()
    site = _site_path(cluster)
    if site is None:
        raise LabkitError("the hub needs the class's site profile, readable by the students: "
                          "--cluster /shared/labkit/site.yaml (or $LABKIT_CLUSTER)")
    profile = load_cluster(site)  # checked here: a wrong field is named before anything starts
    cfg = Path(config).resolve() if config else default_config(minicluster)
    if not cfg.is_file():
        raise LabkitError(f"hub config {cfg}: no such file (the shipped ones: "
                          f"{sorted(p.name for p in CONFIG_DIR.glob('*.py'))})")
    if cull_s < 60 or port < 1 or port > 65535:
        raise LabkitError(f"cull_s={cull_s} must be >= 60 and port={port} in 1..65535")
    HUB_DIR.mkdir(parents=True, exist_ok=True)
    HUB_DIR.chmod(0o700)  # the database, the cookie secret and the admin token: root only
    if not TOKEN_FILE.exists():
        fd = os.open(TOKEN_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
    TOKEN_FILE.chmod(0o600)
    from labkit.backends.local import free_port  # the backends: off the CLI's start-up

    url = f"http://{ip}:{port}"
    env = {**os.environ, "LABKIT_HUB_DIR": str(HUB_DIR), "LABKIT_HUB_SITE": site,
           "LABKIT_HUB_URL": url, "LABKIT_HUB_PROXY_API_PORT": str(free_port()),
           "LABKIT_HUB_PROXY": proxy_command(), "LABKIT_HUB_TOKEN_FILE": str(TOKEN_FILE),
           "LABKIT_HUB_CULL_S": str(cull_s), "LABKIT_HUB_NOTEBOOK_DIR": notebook_dir}
    if group:
        env["LABKIT_HUB_GROUP"] = group
    if profile.slurm_conf:  # the hub's sbatch/squeue/scancel (as the students) use the site's
        env["SLURM_CONF"] = profile.slurm_conf
    if minicluster:
        env.setdefault("SLURM_CONF", str(MINICLUSTER_DIR / "slurm.conf"))
        env["LABKIT_HUB_IP"] = MINICLUSTER_HUB_IP
    logf = open(LOG_FILE, "ab")  # noqa: SIM115 - the hub's own stdout/stderr, kept open by it
    proc = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(cfg)], cwd=HUB_DIR,
                            env=env, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    logf.close()
    record = {"pid": proc.pid, "url": url, "config": str(cfg), "cluster": site,
              "slurm_conf": env.get("SLURM_CONF"), "started_at": time.time()}
    STARTED.write_text(json.dumps(record))
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise HubError(f"jupyterhub exited with {proc.returncode} at start-up; "
                           f"{LOG_FILE}:\n{_log_tail()}")
        if _api_ok(url):
            log.info("hub up: %s (config %s, site %s)", url, cfg, site)
            _let_go(proc)
            return hub_status()
        time.sleep(0.5)
    hub_down()
    raise HubError(f"the hub did not answer on {url}/hub/api within {timeout:.0f} s; "
                   f"{LOG_FILE}:\n{_log_tail()}")


def _let_go(proc: subprocess.Popen) -> None:
    """The hub outlives this process on purpose: no 'still running' warning when it goes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        proc.returncode = 0  # never waited for here; `hub down` stops it by its pid
        del proc


def _log_tail(n: int = 25) -> str:
    try:
        return "\n".join(LOG_FILE.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _api_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/hub/api", timeout=5) as r:  # noqa: S310
            return r.status == 200
    except (OSError, urllib.error.URLError):
        return False


def api(path: str, method: str = "GET", body: dict | None = None, url: str | None = None
        ) -> Any:
    """The hub's REST API with the admin token (root): ``api("/users")``."""
    url = url or (_read_started() or {}).get("url")
    if not url:
        raise HubError("the hub is not up: `sudo labkit class hub up` first")
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"{url}/hub/api{path}", data=data, method=method,
                                 headers={"Authorization": f"token {TOKEN_FILE.read_text().strip()}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310 - the hub we started
        raw = r.read()
    return json.loads(raw) if raw else None


def server_jobs(conf: str | None) -> dict[str, dict[str, str]]:
    """{user: {"job_id", "state"}}: each student's newest server job Slurm knows (the job
    named ``labkit-hub-<user>`` and run by that user)."""
    out: dict[str, dict[str, str]] = {}
    jobs = slurmcli.all_jobs(conf)
    for job_id in sorted(jobs, key=lambda j: int(j) if j.isdigit() else -1):  # newest last
        state, name, uid = jobs[job_id]
        user = name[len(JOB_PREFIX):]
        if name.startswith(JOB_PREFIX) and user == _user_name(uid):
            out[user] = {"job_id": job_id, "state": state}
    return out


def with_servers(rows: list[dict[str, Any]], conf: str | None) -> list[dict[str, Any]]:
    """``class_status`` rows with each student's hub server (``{"job_id", "state"}`` of their
    newest server job, or None); a student with a server and no run yet gets a row too."""
    try:
        servers = server_jobs(conf)
    except slurmcli.SlurmError:
        return rows
    out = [{**r, "server": servers.get(r["user"])} for r in rows]
    known = {r["user"] for r in rows}
    for user in sorted(set(servers) - known):
        out.append({"user": user, "run_root": None, "runs": [], "last_notebook": None,
                    "jobs": {"PENDING": 0, "RUNNING": 0, "finished": 0}, "exercises": None,
                    "last_failure": None, "server": servers[user]})
    return sorted(out, key=lambda r: r["user"])


def _user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def hub_status() -> dict[str, Any]:
    """``{"up", "url", "api_token_file", "pid", "config", "cluster", "log", "servers"}``;
    ``servers``: {user: {"job_id", "state"}} of the server jobs in Slurm while the hub is up."""
    st = _read_started() or {}
    up = _alive(st.get("pid")) and _api_ok(st.get("url", ""))
    out = {"up": up, "url": st.get("url") if up else None, "api_token_file": str(TOKEN_FILE),
           "pid": st.get("pid") if up else None, "config": st.get("config"),
           "cluster": st.get("cluster"), "log": str(LOG_FILE), "servers": {}}
    if up:
        try:
            out["servers"] = server_jobs(st.get("slurm_conf"))
        except slurmcli.SlurmError as e:
            out["servers_error"] = f"squeue failed (exit {e.returncode}): {e.first_line}"
    return out


def hub_down(timeout: float = 90) -> list[str]:
    """Stop the hub (it ends every server's job first) and cancel any server job it left;
    returns the job ids cancelled here."""
    _need_root()
    st = _read_started()
    if not st:
        log.info("no hub recorded in %s: nothing to stop", STARTED)
        return []
    pid = st.get("pid")
    if _alive(pid):
        os.kill(pid, signal.SIGTERM)
        end = time.time() + timeout
        while _alive(pid) and time.time() < end:
            time.sleep(0.3)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    _stop_proxy()
    left = []
    try:
        for user, job in server_jobs(st.get("slurm_conf")).items():
            if job["state"] in ("PENDING", "RUNNING", "CONFIGURING", "SUSPENDED"):
                slurmcli.scancel(st.get("slurm_conf"), job["job_id"])
                left.append(job["job_id"])
                log.info("cancelled %s's server job %s, which the hub left", user, job["job_id"])
    except slurmcli.SlurmError as e:
        log.warning("cannot list the server jobs (squeue exit %s: %s); check `squeue -n "
                    "labkit-hub-*` by hand", e.returncode, e.first_line)
    STARTED.unlink(missing_ok=True)
    log.info("hub down")
    return left


def _stop_proxy() -> None:
    """configurable-http-proxy outlives a hub that was killed: end it by its pid file."""
    pidf = HUB_DIR / "jupyterhub-proxy.pid"
    try:
        pid = int(pidf.read_text().split()[0])
        if "configurable-http-proxy" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(
                errors="replace"):
            os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError, IndexError):
        pass
    pidf.unlink(missing_ok=True)


__all__ = ["HUB_DIR", "HubError", "TOKEN_FILE", "api", "hub_down", "hub_status", "hub_up",
           "server_jobs", "with_servers"]
