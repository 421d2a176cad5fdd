"""The link between a job's nodes as the job had it, and the reference shown where there is none.

``job_link(run_dir, backend=..., cluster=...)`` reads the rate from the job: a local job's
``node_link.json`` (``labkit.nodenet``: its nodes were rootless network namespaces with a
shaped link, or shared loopback and why), the mini-cluster's recorded rate, or nothing on a
site whose network labkit cannot know. ``reference()`` is a committed measurement of shaped
nodes (its date, machine and how it was taken inside), which notebooks 02 and 03 show, labelled
as such, beside the student's own numbers where this machine could not build the link.
``ring_allreduce_ms`` is the time a ring all-reduce needs on a link of a given rate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from labkit import minicluster, nodenet
from labkit.paths import REPO_ROOT
from labkit.site import ClusterProfile

REFERENCE = REPO_ROOT / "baselines" / "link_reference.json"


@dataclass(frozen=True)
class JobLink:
    """``bits_per_s``: the shaped rate between the job's nodes (None: not known or not
    shaped); ``separate``: whether its nodes had a network between them at all; ``said``: one
    line on what the link was."""

    bits_per_s: float | None
    separate: bool
    said: str

    @property
    def gbit(self) -> float | None:
        return None if self.bits_per_s is None else self.bits_per_s / 1e9


def job_link(run_dir: str | Path, *, backend: str,
             cluster: ClusterProfile | None = None) -> JobLink:
    """What linked the nodes of the job in ``run_dir`` (see the module's docstring)."""
    if backend == "local":
        rec = nodenet.read_record(run_dir)
        if rec is None:
            return JobLink(None, False, "the job left no node_link.json (a run of an older "
                                        "labkit): its nodes shared this machine's loopback")
        if rec["namespaces"]:
            return JobLink(rec["rate_bits_per_s"], True,
                           f"local nodes as network namespaces, link {rec['described']}")
        return JobLink(None, False, f"local nodes on this machine's loopback ({rec['why_not']})")
    if cluster is not None and cluster.name.startswith("local-minicluster"):
        rate = minicluster.cluster_status().get("rate")
        bits = nodenet.Link(rate=rate).bits_per_s if rate else None
        return JobLink(bits, True, f"the mini-cluster's nodes, link tc tbf rate {rate}")
    return JobLink(None, True, f"the nodes of {cluster.name if cluster else 'the site'}: "
                               f"labkit does not know its network's rate")


def ring_allreduce_ms(nbytes: float, ranks: int, bits_per_s: float) -> float:
    """A ring all-reduce of ``nbytes`` among ``ranks`` whose ring crosses a link of
    ``bits_per_s`` once in each direction: each rank sends 2 (n-1)/n of the buffer."""
    return 2 * (ranks - 1) / ranks * nbytes * 8 / bits_per_s * 1000


def reference() -> dict:
    """The committed reference measurement (``baselines/link_reference.json``)."""
    return json.loads(REFERENCE.read_text())
