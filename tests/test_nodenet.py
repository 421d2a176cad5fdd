"""labkit.nodenet: the link settings, the commands both ways in share, and the local backend
where rootless namespaces are refused (a fake ``unshare`` that fails, at the subprocess
boundary): one log line with the reason, and the nodes share loopback as before. The rootless
nodes themselves, as a user who is not root, are in tests/test_nodenet_users.py.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from labkit import nodenet
from labkit.cli import main
from labkit.config import RunConfig
from labkit.errors import ConfigError
from labkit.jobs import submit
from labkit.measured.link import job_link, reference, ring_allreduce_ms
from labkit.site import ClusterProfile

PROGRAM = Path(__file__).parent / "programs" / "allreduce_job.py"
REFUSED = "unshare: unshare failed: Operation not permitted"


def test_link_settings():
    assert nodenet.link_settings(None, {}) == nodenet.Link("1gbit", "50ms")
    assert nodenet.link_settings(None, {nodenet.RATE_ENV: "200mbit"}).bits_per_s == 200e6
    assert nodenet.Link("1gbps").bits_per_s == 8e9  # tc: bps is bytes per second
    off = nodenet.link_settings(None, {nodenet.RATE_ENV: "off", nodenet.LATENCY_ENV: "5ms"})
    assert off.rate is None and off.bits_per_s is None and off.latency == "5ms"
    with pytest.raises(ConfigError, match=r"'1 gig'.*'200mbit'.*'off'.*LABKIT_LINK_RATE"):
        nodenet.link_settings(None, {nodenet.RATE_ENV: "1 gig"})
    with pytest.raises(ConfigError, match=r"'50'.*'50ms'"):
        nodenet.Link(latency="50")
    with pytest.raises(ConfigError, match=r"rate=None"):
        nodenet.Link(rate="off")


def test_the_site_profile_sets_the_link_and_the_environment_wins():
    site = ClusterProfile(local_link={"rate": "200mbit", "latency": "5ms"}).local_link
    assert nodenet.link_settings(site, {}) == nodenet.Link("200mbit", "5ms")
    assert nodenet.link_settings({"rate": "off"}, {}) == nodenet.Link(None, "50ms")
    env = {nodenet.RATE_ENV: "100mbit"}  # set: wins over the profile; latency still its
    assert nodenet.link_settings(site, env) == nodenet.Link("100mbit", "5ms")
    env = {nodenet.RATE_ENV: "", nodenet.LATENCY_ENV: " "}  # set but empty: the profile's
    assert nodenet.link_settings(site, env) == nodenet.Link("200mbit", "5ms")
    with pytest.raises(ConfigError, match=r"local_link rate '1 gig' is not a tc rate.*'200mbit'"):
        ClusterProfile(local_link={"rate": "1 gig"})
    with pytest.raises(ConfigError, match=r"local_link latency '5' is not a tc time.*'50ms'"):
        ClusterProfile(local_link={"latency": "5"})
    with pytest.raises(ConfigError, match=r"local_link=\{'speed'.*rate and/or latency"):
        ClusterProfile(local_link={"speed": "1gbit"})


def test_render_shows_the_script_submit_runs(tmp_path, monkeypatch, capsys):
    """``labkit render`` of a multi-node local config: the namespace script, shaped by the
    site profile's ``local_link``, or the loopback one where namespaces are refused."""
    monkeypatch.delenv(nodenet.RATE_ENV, raising=False)
    monkeypatch.delenv(nodenet.MODE_ENV, raising=False)
    monkeypatch.setattr(nodenet, "_PROBE", [None])  # this user may build namespaces
    cfg = tmp_path / "c.json"
    cfg.write_text('{"name": "two", "nodes": 2, "gpus_per_node": 1, "global_batch_size": 4}')
    site = tmp_path / "site.yaml"
    site.write_text("local_link: {rate: 300mbit, latency: 20ms}\n")
    assert main(["render", str(cfg), "--cluster", str(site)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("#!") and 'exec unshare --user' in out and "nsenter" in out
    assert "tbf rate 300mbit burst 256kb latency 20ms" in out
    assert "export MASTER_ADDR=10.77.0.11" in out
    monkeypatch.setattr(nodenet, "_PROBE", ["`unshare -Urnpm` refused: " + REFUSED, "logged"])
    assert main(["render", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "unshare" not in out and "export MASTER_ADDR=127.0.0.1" in out


def test_shaping_is_on_the_node_side_and_can_be_off():
    shaped = nodenet.node_commands(2, "lk-node2", "/run/netns/lk-node2", nodenet.Link("1gbit"))
    assert shaped[-1] == ["nsenter", "--net=/run/netns/lk-node2", "tc", "qdisc", "add", "dev",
                          "eth0", "root", "tbf", "rate", "1gbit", "burst", "256kb",
                          "latency", "50ms"]
    assert ["nsenter", "--net=/run/netns/lk-node2", "ip", "addr", "add", "10.77.0.12/24",
            "dev", "eth0"] in shaped
    unshaped = nodenet.node_commands(2, "lk-node2", "/run/netns/lk-node2", nodenet.Link(None))
    assert unshaped == shaped[:-1]
    parts = nodenet.shell_parts(2, nodenet.Link(None))
    assert "tbf" not in parts["node_net"] and parts["master_addr"] == "10.77.0.11"
    assert parts["env"]["GLOO_SOCKET_IFNAME"] == "eth0"


@pytest.fixture
def refused(tmp_path, monkeypatch):
    """An ``unshare`` that fails as a kernel that refuses user namespaces makes it fail."""
    fake = tmp_path / "bin" / "unshare"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho '{REFUSED}' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    monkeypatch.setattr(nodenet, "_PROBE", [])


def test_refused_namespaces_fall_back_to_loopback(refused, run_root, caplog, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with caplog.at_level(logging.WARNING, logger="labkit"):
        assert nodenet.local_link(2) == (None, f"`unshare -Urnpm` refused: {REFUSED}")
        assert nodenet.local_link(2)[0] is None
    said = [r.getMessage() for r in caplog.records if "loopback" in r.getMessage()]
    assert len(said) == 1 and REFUSED in said[0], said  # once, with the reason
    # The job starts as before, all nodes on loopback (tests/test_notebooks_nolink.py runs
    # notebooks 02 and 03 to their end this way); what it was told is on record.
    job = submit(RunConfig(name="loopback2", nodes=2, gpus_per_node=1, train_iters=3,
                           extra={"sleep": 60, "iters": 60}), program=PROGRAM)
    try:
        record = nodenet.read_record(job.run_dir)
        assert record["namespaces"] is False and REFUSED in record["why_not"], record
        script = (job.run_dir / "job.sh").read_text()
        assert "unshare" not in script and "export MASTER_ADDR=127.0.0.1" in script
        assert "GLOO_SOCKET_IFNAME=lo" in script and "nsenter" not in script
    finally:
        job.cancel()


def test_loopback_on_request_and_one_node(monkeypatch):
    monkeypatch.setattr(nodenet, "_PROBE", [None])
    assert nodenet.local_link(1) == (None, "a single node")
    monkeypatch.setenv(nodenet.MODE_ENV, "loopback")
    assert nodenet.local_link(2) == (None, f"{nodenet.MODE_ENV}=loopback")
    monkeypatch.delenv(nodenet.MODE_ENV)
    assert nodenet.local_link(2)[0] == nodenet.Link()


def test_the_link_is_read_from_the_job(tmp_path):
    nodenet.write_record(tmp_path, 2, nodenet.Link("200mbit"), None)
    link = job_link(tmp_path, backend="local")
    assert (link.bits_per_s, link.separate) == (200e6, True) and "200mbit" in link.said
    nodenet.write_record(tmp_path, 2, None, REFUSED)
    link = job_link(tmp_path, backend="local")
    assert (link.bits_per_s, link.separate) == (None, False) and REFUSED in link.said
    # 2 ranks send the whole 5 MB once: 40 Mbit at 1 Gbit/s; 4 ranks send 1.5 times as much
    assert ring_allreduce_ms(5e6, 2, 1e9) == pytest.approx(40.0)
    assert ring_allreduce_ms(5e6, 4, 1e9) == pytest.approx(60.0)
    ref = reference()  # what notebooks 02 and 03 show, labelled, where there is no link
    assert ref["machine"] and ref["date"] and ref["how"] and ref["link_bits_per_s"] > 0
    assert ref["nb03"]["busbw_inter_gbps"] * 3 < ref["nb03"]["busbw_intra_gbps"]
