"""What a class on a shared cluster needs, set up on this machine for the class test (as root):
an interpreter every user can run (Debian's python3.11 with a venv of the project's pins,
outside root's home), a shared checkout with the data, and Unix users for the students.

The venv is built once and reused while the pins are the same (a stamp file holds them):
building it takes minutes. ``python tests/class_env.py`` builds it ahead of the tests.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = Path("/usr/bin/python3.11")
VENV = Path(os.environ.get("LABKIT_CLASS_VENV", "/opt/labkit-venv"))
STAMP = ".labkit-pins.json"
APT_HINT = "apt-get install python3.11 python3.11-venv (.ci/run does)"


def pins() -> list[str]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return sorted(data["project"]["dependencies"])


def venv_ready(venv: Path = VENV) -> bool:
    try:
        return json.loads((venv / STAMP).read_text()) == pins()
    except (OSError, ValueError):
        return False


def ensure_venv(venv: Path = VENV) -> Path:
    """The venv's python, built from Debian's python3.11 with the project's pins (torch first,
    as ``make setup`` does, so pip takes the CPU wheel); reused while the pins match."""
    if venv_ready(venv):
        return venv / "bin" / "python"
    if not SYSTEM_PYTHON.exists():
        raise RuntimeError(f"{SYSTEM_PYTHON} is missing: {APT_HINT}")
    if venv.exists():
        shutil.rmtree(venv)
    subprocess.run([str(SYSTEM_PYTHON), "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    torch = next(p for p in pins() if p.startswith("torch=="))
    pip = [py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, torch], check=True)
    subprocess.run([*pip, *pins()], check=True)
    subprocess.run([py, "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3"],
                   check=True, capture_output=True)
    (venv / STAMP).write_text(json.dumps(pins()))
    return venv / "bin" / "python"


def hub_pins() -> list[str]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return sorted(data["project"]["optional-dependencies"]["hub"])


def ensure_hub(venv: Path = VENV) -> None:
    """The ``hub`` extra (jupyterhub, batchspawner, ...) in the venv: the students' servers run
    ``batchspawner-singleuser jupyterhub-singleuser`` from it. Added beside the project's pins
    (nothing of theirs changes), so the venv is not rebuilt."""
    stamp = venv / ".labkit-hub-pins.json"
    try:
        if json.loads(stamp.read_text()) == hub_pins():
            return
    except (OSError, ValueError):
        pass
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                    "--disable-pip-version-check", *hub_pins()], check=True)
    stamp.write_text(json.dumps(hub_pins()))


def shared_checkout(dst: Path, venv: Path = VENV) -> Path:
    """This working tree's files (tracked and new, as git lists them) and data/, copied to
    ``dst`` (readable by all), and the venv pointed at it (a .pth file): the class's shared
    checkout after ``make data``."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for f in filter(None, files):
        src = REPO / f
        if src.is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / f)
    shutil.copytree(REPO / "data", dst / "data", dirs_exist_ok=True)
    for d in [dst, *dst.rglob("*")]:
        d.chmod(0o755 if d.is_dir() else 0o644)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "labkit-class-checkout.pth").write_text(f"{dst}\n")
    return dst


def write_site(path: Path, *, slurm_conf: Path, checkout: Path, shared: Path,
               extra: str = "") -> Path:
    """The class's site profile on the mini-cluster, as the instructor writes it
    (docs/INSTRUCTORS.md): the class's interpreter, the shared checkout, a run root per
    student under ``shared``; ``extra`` YAML lines go before the ``env`` block."""
    path.write_text(
        "# The class's site profile, as the instructor writes it (docs/INSTRUCTORS.md)\n"
        "name: class-minicluster\n"
        "partition: lab\n"
        "time_limit: \"00:20:00\"\n"
        "gpu_request: none\n"
        "master_addr_from: nodeaddr\n"
        f"slurm_conf: {slurm_conf}\n"
        f"torchrun: {VENV}/bin/torchrun\n"
        f"code_dir: {checkout}/code\n"
        f"run_root: {shared}/{{user}}/runs\n"
        f"{extra}"
        "env:\n"
        "  GLOO_SOCKET_IFNAME: eth0\n"
        "  OMP_NUM_THREADS: \"1\"\n")
    path.chmod(0o644)
    return path


def add_users(names: list[str], home_root: Path) -> None:
    for n in names:
        remove_user(n)
        home = home_root / n
        subprocess.run(["useradd", "--no-create-home", "--home-dir", str(home), "--shell",
                        "/bin/bash", n], check=True, capture_output=True)
        home.mkdir(parents=True)
        shutil.chown(home, n, n)


def remove_user(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return
    subprocess.run(["pkill", "-u", name], capture_output=True)  # processes of that user only
    subprocess.run(["userdel", name], capture_output=True)


def as_user(user: str, argv: list[str], *, env: dict[str, str], cwd: Path | None = None
            ) -> list[str]:
    """``runuser`` argv running ``argv`` as ``user`` with exactly ``env`` (no root variables)."""
    home = pwd.getpwnam(user).pw_dir
    base = {"HOME": home, "USER": user, "LOGNAME": user, "PATH": f"{VENV}/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"}
    words = [f"{k}={v}" for k, v in {**base, **env}.items()]
    pre = ["runuser", "-u", user, "--", "env", "-i", *words]
    return pre + (["sh", "-c", 'cd "$0" && exec "$@"', str(cwd), *argv] if cwd else argv)


if __name__ == "__main__":
    print(ensure_venv(Path(sys.argv[1]) if len(sys.argv) > 1 else VENV))
