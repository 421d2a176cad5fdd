"""The hostfile backend without hosts: site profiles with hosts or a hostfile, the rendered
hostfile and launch scripts (golden files), and the checks made before anything starts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from labkit.config import RunConfig
from labkit.errors import ConfigError
from labkit.hosts import cluster_hosts, parse_hostfile
from labkit.render import job_hosts, render_hostfile_launch, render_site_hostfile
from labkit.run import JobSpec
from labkit.site import ClusterProfile

HOSTS = ({"name": "node1", "address": "10.0.0.11", "slots": 2},
         {"name": "node2", "address": "10.0.0.12", "slots": 2},
         {"name": "node3", "slots": 1})
SITE = ClusterProfile(name="lab-hosts", hosts=HOSTS, env={"GLOO_SOCKET_IFNAME": "eth0"},
                      gpu_request="none", torchrun="/opt/venv/bin/torchrun",
                      code_dir="/opt/labkit/code")
SPEC = JobSpec("tp2pp2", nodes=2, gpus_per_node=2, layout="TP=2 x PP=2 x DP=1")


def test_scripts_and_hostfile_golden(assert_golden, tmp_path):
    run_dir = Path("/shared/runs/tp2pp2")
    assert_golden("hostfile_site_3hosts.txt", render_site_hostfile(cluster_hosts(SITE)))
    pdsh = render_hostfile_launch(SPEC, SITE, run_dir)
    ds = render_hostfile_launch(SPEC, SITE.replace(launcher="deepspeed"), run_dir)
    assert_golden("hostfile_pdsh_tp2pp2.sh", pdsh)
    assert_golden("hostfile_deepspeed_tp2pp2.sh", ds)
    for text in (pdsh, ds):
        assert "HOSTS=node1,node2\n" in text and "export MASTER_ADDR=10.0.0.11" in text
        f = tmp_path / "job.sh"
        f.write_text(text)
        subprocess.run(["bash", "-n", str(f)], check=True)  # valid shell
    assert "--node_rank \"$2\" --nproc_per_node 2" in pdsh and "node %n" in pdsh
    assert "export DEEPSPEED=/opt/venv/bin/deepspeed" in ds and "--num_gpus 2" in ds


def test_mixed_slots_and_what_does_not_fit():
    assert [h.slots for h in cluster_hosts(SITE)] == [2, 2, 1]
    assert cluster_hosts(SITE)[2].address == "node3"  # the name when no address is given
    with pytest.raises(ConfigError, match=r"node3 has slots=1 < 2.*gpus_per_node <= 1"):
        job_hosts(JobSpec("x", nodes=3, gpus_per_node=2), SITE)
    with pytest.raises(ConfigError, match=r"needs 4 hosts.*has 3 \(node1 slots=2"):
        job_hosts(JobSpec("x", nodes=4, gpus_per_node=1), SITE)
    assert [h.name for h in job_hosts(JobSpec("x", nodes=3, gpus_per_node=1), SITE)] == [
        "node1", "node2", "node3"]
    with pytest.raises(ConfigError, match="lists no hosts"):
        job_hosts(SPEC, ClusterProfile())


@pytest.mark.parametrize("bad, message", [
    ({"hosts": [{"name": "a b", "slots": 2}]}, "'a b' is not a host name"),
    ({"hosts": [{"name": "n1", "slots": 0}]}, "slots=0 must be a positive integer"),
    ({"hosts": [{"name": "n1", "slots": True}]}, "slots=True must be a positive integer"),
    ({"hosts": [{"name": "n1", "slots": 2, "gpus": 2}]}, "unknown keys ['gpus']"),
    ({"hosts": [{"name": "n1", "slots": 2}, {"name": "n1", "slots": 1}]}, "more than once"),
    ({"hosts": [{"name": "n1", "slots": 2}], "hostfile": "/x"}, "not both"),
    ({"launcher": "mpirun"}, "launcher='mpirun' is not one of ['pdsh', 'deepspeed']"),
    ({"hosts": ["node1"]}, "must be a mapping"),
])
def test_bad_hosts_are_refused_with_the_fix(bad, message):
    with pytest.raises(ConfigError) as e:
        ClusterProfile.from_dict({"name": "bad", **bad})
    assert message in str(e.value)


def test_existing_deepspeed_hostfile(tmp_path):
    hf = tmp_path / "hostfile"
    hf.write_text("# from the gpt-neox guide\nworker-1 slots=8\n\nworker-2 slots=4  # smaller\n")
    site = ClusterProfile(name="ds", hostfile=str(hf))
    assert [(h.name, h.slots) for h in cluster_hosts(site)] == [("worker-1", 8), ("worker-2", 4)]
    with pytest.raises(ConfigError, match=r"line 2: 'worker-1 8' is not `NAME slots=N`"):
        parse_hostfile("w0 slots=1\nworker-1 8\n", "hf")
    with pytest.raises(ConfigError, match="listed twice"):
        parse_hostfile("w slots=1\nw slots=2\n")
    with pytest.raises(ConfigError, match="cannot read hostfile"):
        cluster_hosts(ClusterProfile(name="ds", hostfile=str(tmp_path / "missing")))
    assert ClusterProfile.from_dict(site.to_dict()) == site  # YAML round trip


def test_cli_renders_the_hostfile_backend_of_a_site(tmp_path, capsys):
    """`labkit render --backend hostfile --cluster SITE.yaml`: the launch script and the
    hostfile of the profile's hosts, as submit would write them."""
    from labkit.cli import main

    site = tmp_path / "site.yaml"
    site.write_text("name: two-hosts\nlauncher: pdsh\nrun_root: " + str(tmp_path / "runs")
                    + "\nhosts:\n  - {name: h1, address: 10.0.0.1, slots: 2}\n"
                      "  - {name: h2, address: 10.0.0.2, slots: 2}\n")
    cfg = tmp_path / "c.json"
    RunConfig(name="hf_cli", nodes=2, gpus_per_node=2).to_json(cfg)
    assert main(["render", str(cfg), "--backend", "hostfile", "--cluster", str(site)]) == 0
    out = capsys.readouterr().out
    assert "pdsh -S -R ssh" in out and "HOSTS=h1,h2" in out and "MASTER_ADDR=10.0.0.1" in out
    assert f"RUN_DIR={tmp_path / 'runs' / 'hf_cli'}" in out
    assert main(["render", str(cfg), "--backend", "hostfile", "--cluster", str(site),
                 "--hostfile"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == ["h1 slots=2  # 10.0.0.1",
                                                         "h2 slots=2  # 10.0.0.2"]


def test_doctor_on_a_hostfile_site_runs_the_host_checks_not_the_slurm_ones():
    from labkit.doctor import CHECKS, FAIL, run_doctor

    site = ClusterProfile(name="hosts-only", hosts=({"name": "no-such-host.invalid", "slots": 1},))
    some = [c for c in CHECKS if c[0] in ("slurm", "accounting", "hostfile")]
    results = run_doctor(cluster=site, checks=some)
    assert [r.name for r in results] == ["ssh / pdsh to hostfile hosts"], results
    assert results[0].status == FAIL and "no-such-host.invalid" in results[0].detail
    # --backend hostfile says so for a profile without hosts too: no Slurm check runs
    results = run_doctor(cluster=ClusterProfile(name="plain"), checks=some, backend="hostfile")
    assert [r.name for r in results] == ["ssh / pdsh to hostfile hosts"], results
