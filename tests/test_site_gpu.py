"""What a site profile says about its GPUs reaches the runs built for it: the gpu profile's
memory budget and GPUs per node come from the site (``gpu_memory_gb``, ``gpus_per_node``); the
profile's 80 GB and 8 GPUs are only the defaults of a site that says nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.config import PROFILES, RunConfig
from labkit.errors import ConfigError
from labkit.planner import plan
from labkit.site import ClusterProfile, load_cluster

SITE = Path(__file__).parent / "fixtures" / "sites" / "gpu-class.yaml"


def test_the_fixture_site_loads_with_its_gpus():
    site = load_cluster(SITE)
    assert (site.gpu_memory_gb, site.gpus_per_node) == (80, 8)
    assert site.run_root_path("ada") == Path("/shared/labkit/ada/runs")
    assert site.env["NCCL_IB_HCA"] == "mlx5"


def test_gpu_profile_takes_the_sites_memory_and_gpus_per_node():
    site = ClusterProfile(name="h100-40", gpu_memory_gb=40, gpus_per_node=4)
    cfg = RunConfig.for_profile("gpu", cluster=site)
    assert (cfg.gpu_memory_gb, cfg.gpus_per_node) == (40.0, 4)
    assert plan(cfg).gpu_memory_gb == 40.0  # the planner's budget is the site's device memory
    # what the caller gives wins over the site
    assert RunConfig.for_profile("gpu", cluster=site, gpus_per_node=2).gpus_per_node == 2
    assert RunConfig.for_profile("gpu", cluster=site, gpu_memory_gb=24).gpu_memory_gb == 24


def test_a_site_that_says_nothing_keeps_the_profiles_defaults():
    cfg = RunConfig.for_profile("gpu", cluster=ClusterProfile())
    assert cfg.gpu_memory_gb == PROFILES["gpu"]["gpu_memory_gb"] == 80.0
    assert cfg.gpus_per_node == PROFILES["gpu"]["gpus_per_node"]


def test_cpu_runs_ignore_the_sites_gpus():
    site = ClusterProfile(gpu_memory_gb=40, gpus_per_node=4)
    assert RunConfig.for_profile("cpu", cluster=site) == RunConfig.for_profile("cpu")


def test_the_site_of_labkit_cluster_comes_from_the_entry_point_not_from_for_profile(
        tmp_path, monkeypatch):
    """``for_profile`` takes the site the entry point resolved (``resolve_cluster``, as the
    notebooks pass it); with ``cluster=None`` it reads no site, whatever $LABKIT_CLUSTER says."""
    from labkit.site import resolve_cluster

    y = tmp_path / "site.yaml"
    y.write_text("name: s\ngpu_memory_gb: 141\ngpus_per_node: 8\n")
    monkeypatch.setenv("LABKIT_CLUSTER", str(y))
    assert RunConfig.for_profile("gpu", cluster=resolve_cluster(None)).gpu_memory_gb == 141.0
    assert RunConfig.for_profile("gpu").gpu_memory_gb == RunConfig.for_profile(
        "gpu", cluster=ClusterProfile()).gpu_memory_gb == 80.0
    assert RunConfig.for_profile("gpu", cluster=SITE).gpu_memory_gb == 80.0


@pytest.mark.parametrize("value", [0, -8, 2.5, True, "8"])
def test_a_wrong_gpus_per_node_is_refused_with_the_field_named(value):
    with pytest.raises(ConfigError, match="gpus_per_node"):
        ClusterProfile(gpus_per_node=value)


# --- labkit plan / check with --cluster -------------------------------------------------------
def _gpu_config(tmp_path, **kw) -> Path:
    p = tmp_path / "gpu.json"
    RunConfig.for_profile("gpu", cluster=ClusterProfile(), name="g", **kw).to_json(p)
    return p


def _site(tmp_path, text: str) -> Path:
    y = tmp_path / "site.yaml"
    y.write_text(text)
    return y


def test_plan_takes_the_budget_from_the_site(tmp_path, capsys, monkeypatch):
    import json

    from labkit.cli import main

    monkeypatch.delenv("LABKIT_CLUSTER", raising=False)
    cfg = _gpu_config(tmp_path)
    site = _site(tmp_path, "name: small\ngpu_memory_gb: 24\n")
    assert main(["plan", str(cfg), "--cluster", str(site), "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["gpu_memory_gb"] == 24.0
    assert "site profile small's gpu_memory_gb" in out.err
    assert main(["plan", str(cfg), "--cluster", str(site), "--gpu-memory-gb", "40",
                 "--json"]) == 0  # the flag wins over the site
    assert json.loads(capsys.readouterr().out)["gpu_memory_gb"] == 40.0
    monkeypatch.setenv("LABKIT_CLUSTER", str(site))  # the class's one setting
    assert main(["plan", "--preset", "gpt2-124m", "--nodes", "1", "--gpus-per-node", "8"]) == 0
    assert "24 GB per GPU" in capsys.readouterr().out


def test_check_refuses_a_gpu_config_the_sites_gpus_cannot_hold(tmp_path, capsys):
    import json

    from labkit.cli import main

    big = _gpu_config(tmp_path, micro_batch_size=64, global_batch_size=1024)
    site = _site(tmp_path, "name: small\ngpu_memory_gb: 24\ngpus_per_node: 4\n")
    assert main(["check", str(big), "--cluster", str(site), "--json"]) == 2
    errors = json.loads(capsys.readouterr().out)["errors"]
    assert any("gpus_per_node=8" in e and "have 4 GPUs" in e for e in errors), errors
    assert any("GB per GPU" in e and "have 24 GB" in e for e in errors), errors
    ok = _gpu_config(tmp_path, nodes=4, gpus_per_node=4)
    assert main(["check", str(ok), "--cluster", str(site), "--json"]) == 0, capsys.readouterr()
    assert main(["check", str(ok), "--cluster", str(SITE)]) == 0  # 80 GB x 8: fits as well


def test_new_writes_a_gpu_config_with_the_sites_memory(tmp_path, run_root, capsys):
    from labkit.cli import main

    site = _site(tmp_path, f"name: small\ngpu_memory_gb: 24\nrun_root: {tmp_path}/{{user}}/r\n")
    assert main(["new", "g", "--preset", "gpt2-124m", "--cluster", str(site)]) == 0
    written = next((tmp_path).glob("*/r/g/config.json"))
    cfg = RunConfig.from_json(written)
    assert (cfg.device, cfg.gpu_memory_gb, cfg.backend) == ("cuda", 24.0, "slurm")
