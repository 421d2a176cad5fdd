"""Which cluster profile ``cluster=None`` means: $LABKIT_CLUSTER, the running mini-cluster, or the
defaults; and the site side imports neither the mini-cluster nor the renderer."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
import yaml

from labkit import site
from labkit.errors import ConfigError
from labkit.site import CLUSTER_DIR, ClusterProfile, load_cluster, resolve_cluster


@pytest.fixture
def no_minicluster(tmp_path, monkeypatch):
    """No $LABKIT_CLUSTER and no mini-cluster profile file, whatever this machine runs."""
    monkeypatch.delenv("LABKIT_CLUSTER", raising=False)
    path = tmp_path / "state" / "site.yaml"
    monkeypatch.setattr(site, "MINICLUSTER_SITE", path)
    return path


def test_labkit_cluster_path_is_what_none_resolves_to(tmp_path, monkeypatch, no_minicluster):
    yml = tmp_path / "my site.yaml"
    yml.write_text("partition: a100\naccount: physics\ntime_limit: '02:00:00'\n")
    monkeypatch.setenv("LABKIT_CLUSTER", str(yml))
    got = resolve_cluster(None)
    assert got == load_cluster(yml)
    assert (got.name, got.partition, got.account, got.time_limit) == (
        "my site", "a100", "physics", "02:00:00")
    # An explicit cluster= still wins over the variable.
    assert resolve_cluster("generic-gres").name == "generic-gres"


def test_labkit_cluster_by_name(monkeypatch, no_minicluster):
    monkeypatch.setenv("LABKIT_CLUSTER", "pyxis-container")
    assert resolve_cluster(None) == load_cluster(CLUSTER_DIR / "pyxis-container.yaml")


@pytest.mark.parametrize("content, needle", [
    (None, "cannot read cluster profile"),
    ("partition: [gpu\n", "not valid YAML"),
    ("partiton: gpu\n", "unknown cluster profile key(s): ['partiton']"),
    ("time_limit: soon\n", "time_limit='soon'"),
])
def test_bad_labkit_cluster_names_the_variable_and_the_file(tmp_path, monkeypatch,
                                                            no_minicluster, content, needle):
    yml = tmp_path / "site.yaml"
    if content is not None:
        yml.write_text(content)
    monkeypatch.setenv("LABKIT_CLUSTER", str(yml))
    with pytest.raises(ConfigError) as e:
        resolve_cluster(None)
    msg = str(e.value)
    assert "$LABKIT_CLUSTER" in msg and str(yml) in msg and needle in msg, msg
    assert "unset it" in msg


def test_minicluster_file_then_defaults(no_minicluster):
    assert resolve_cluster(None) == ClusterProfile()
    no_minicluster.parent.mkdir()
    mini = load_cluster("local-minicluster").replace(torchrun="/venv/bin/torchrun",
                                                     slurm_conf="/state/slurm.conf")
    no_minicluster.write_text(yaml.safe_dump(mini.to_dict()))
    assert resolve_cluster(None) == mini
    no_minicluster.unlink()  # `labkit cluster down`
    assert resolve_cluster(None) == ClusterProfile()


def _imports(path: Path) -> set[str]:
    """Every labkit module a file imports, at module level or inside functions."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("labkit"):
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("labkit"))
    return out


def test_site_and_minicluster_import_no_renderer_or_backend():
    def file_of(mod: str) -> Path:
        return Path(importlib.util.find_spec(mod).origin)

    site_imports = _imports(file_of("labkit.site"))
    assert not {m for m in site_imports if "minicluster" in m or "render" in m}, site_imports
    mini = _imports(file_of("labkit.minicluster"))
    assert not {m for m in mini if "render" in m or "backends" in m}, mini
    assert {"labkit.site", "labkit.paths"} <= mini
