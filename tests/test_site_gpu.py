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


def test_cluster_none_reads_the_site_of_labkit_cluster(tmp_path, monkeypatch):
    y = tmp_path / "site.yaml"
    y.write_text("name: s\ngpu_memory_gb: 141\ngpus_per_node: 8\n")
    monkeypatch.setenv("LABKIT_CLUSTER", str(y))
    assert RunConfig.for_profile("gpu").gpu_memory_gb == 141.0
    assert RunConfig.for_profile("gpu", cluster=SITE).gpu_memory_gb == 80.0


@pytest.mark.parametrize("value", [0, -8, 2.5, True, "8"])
def test_a_wrong_gpus_per_node_is_refused_with_the_field_named(value):
    with pytest.raises(ConfigError, match="gpus_per_node"):
        ClusterProfile(gpus_per_node=value)
