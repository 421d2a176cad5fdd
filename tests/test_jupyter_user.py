"""`make jupyter` as a user who is not root (a student on a shared machine): the target passes
--allow-root only to root, and JupyterLab started by make as that user answers on its port.

Needs root (to create the throwaway Unix user) and an interpreter every user can run: root's
own venv lives under /root, which other users cannot enter, so make runs with
``VENV=/opt/labkit-venv`` (tests/class_env.py builds it once, as for the class test). ``-o setup
-o data`` leaves out the set-up steps (the venv and data are there); the recipe is the target's own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import class_env
import pytest
from conftest import REPO, skip_or_fail

from labkit.backends.local import free_port

pytestmark = [pytest.mark.users, pytest.mark.timeout(300)]
USER = "labkit-jup1"


@pytest.fixture(scope="module")
def student():
    """(user, checkout dir): a throwaway Unix user and a checkout it can read (the Makefile and
    the notebooks), with the shared venv."""
    if os.geteuid() != 0:
        skip_or_fail("needs root to create a Unix user")
    if not all(shutil.which(t) for t in ("runuser", "useradd", "make")):
        skip_or_fail("runuser/useradd/make are missing (util-linux, passwd, make)")
    try:
        class_env.ensure_venv()
    except (RuntimeError, subprocess.CalledProcessError) as e:
        skip_or_fail(f"no interpreter every user can run: {e}")
    base = Path(tempfile.mkdtemp(prefix="labkit-jupyter-"))
    base.chmod(0o755)
    checkout = base / "labkit"
    checkout.mkdir()
    shutil.copy2(REPO / "Makefile", checkout / "Makefile")
    shutil.copytree(REPO / "notebooks", checkout / "notebooks")
    for p in [checkout, *checkout.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    class_env.add_users([USER], base / "home")
    try:
        yield USER, checkout
    finally:
        class_env.remove_user(USER)
        shutil.rmtree(base, ignore_errors=True)


def _make(user: str | None, checkout: Path, *args: str, env: dict[str, str] | None = None,
          **kw) -> list[str]:
    argv = ["make", f"VENV={class_env.VENV}", "-o", "setup", "-o", "data", *args, "jupyter"]
    if user is None:
        return argv
    return class_env.as_user(user, argv, env=env or {}, cwd=checkout)


def test_allow_root_only_for_root(student):
    user, checkout = student
    as_root = subprocess.run(_make(None, checkout, "-n"), cwd=checkout, capture_output=True,
                             text=True, check=True).stdout
    as_user = subprocess.run(_make(user, checkout, "-n"), capture_output=True, text=True,
                             check=True).stdout
    assert "jupyter lab notebooks" in as_root and "--allow-root" in as_root
    assert "jupyter lab notebooks" in as_user and "--allow-root" not in as_user, as_user


def test_make_jupyter_serves_as_a_user(student):
    user, checkout = student
    # A free port outside the ephemeral range; should it be taken meanwhile, JupyterLab moves on
    # to another (its port_retries) and the address it prints is the one read below.
    port = free_port()
    proc = subprocess.Popen(_make(user, checkout, env={"BROWSER": "true",
                                                      "JUPYTER_PORT": str(port)}),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    seen: list[str] = []
    url = None
    try:
        deadline = time.monotonic() + 180
        for line in proc.stdout:
            seen.append(line)
            m = re.search(r"http://127\.0\.0\.1:(\d+)/lab\?token=(\w+)", line)
            if m:
                url = f"http://127.0.0.1:{m.group(1)}/api/status?token={m.group(2)}"
                break
            if time.monotonic() > deadline:
                break
        text = "".join(seen)
        assert url, f"make jupyter as {user} did not start a server on {port}:\n{text[-3000:]}"
        status = _get_json(url)
        assert isinstance(status, dict) and "started" in status, f"{status}\n{text[-3000:]}"
        assert "allow-root" not in text and "Running as root" not in text
        mine = subprocess.run(["pgrep", "-u", user, "-f", "jupyter.lab"], capture_output=True,
                              text=True).stdout.split()
        assert mine, f"no JupyterLab process of {user}"  # the server runs as the user
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)



def _get_json(url: str, tries: int = 30) -> object:
    """The JSON at ``url``, asked once a second until it answers (the server may print its
    address a moment before it accepts connections); the last error when it never does."""
    err: object = None
    for _ in range(tries):
        try:
            with urllib.request.urlopen(url, timeout=30) as r:  # noqa: S310 - loopback only
                return json.loads(r.read())
        except OSError as e:
            err = e
            time.sleep(1)
    return err
