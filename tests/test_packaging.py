"""pyproject.toml and environment.yml pin the same packages; the CLI entry points exist."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def _pins(lines):
    out = {}
    for line in lines:
        m = re.match(r"^\s*([A-Za-z0-9_.\-\[\]]+)\s*==\s*([^\s;]+)", line)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def test_environment_yml_matches_pyproject():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = pyproject["optional-dependencies"]
    pip_pins = _pins(pyproject["dependencies"] + extras["dev"] + extras["deepspeed"])
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    conda_pins = _pins(pip_section)
    assert conda_pins == pip_pins, (
        f"pins drifted: only in pyproject {set(pip_pins.items()) - set(conda_pins.items())}, "
        f"only in environment.yml {set(conda_pins.items()) - set(pip_pins.items())}")
    assert pip_pins["torch"] == "2.13.0" and pip_pins["megatron-core"] == "0.16.1"
    assert any(str(d).startswith("python=3.11") for d in env["dependencies"])


def test_installed_versions_are_the_pinned_ones():
    from importlib.metadata import version

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for name, pin in _pins(pyproject["dependencies"]).items():
        got = version(name)
        assert got.split("+")[0] == pin, f"{name}: installed {got}, pinned {pin}"


def test_python_dash_m_and_console_script():
    out = subprocess.run([sys.executable, "-m", "labkit", "--help"], capture_output=True,
                         text=True, check=True).stdout
    for cmd in ("check", "plan", "submit", "status", "parse", "cluster"):
        assert cmd in out
    exe = Path(sys.executable).with_name("labkit")
    assert exe.exists(), "console script `labkit` is not installed"
