"""NCCL_DEBUG=INFO transport lines of NCCL <= 2.13, 2.14-2.18 and >= 2.19; rings are not transports."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.logs import parse_log
from labkit.logs.nccl import parse_channel, transport_class

FIX = Path(__file__).parent / "fixtures" / "logs"


@pytest.mark.parametrize("fixture,version,build,transports,n_lines", [
    ("nccl_2.10_transports.txt", "2.10.3", "cuda11.4", {"P2P": 1, "SHM": 1, "NET": 2}, 6),
    ("nccl_2.18_transports.txt", "2.18.5", "cuda12.2", {"P2P": 3, "SHM": 1, "NET": 1}, 6),
    ("nccl_2.21_transports.txt", "2.21.5", "cuda12.4", {"P2P": 4, "SHM": 1, "NET": 2}, 9),
])
def test_versions_and_transport_counts(fixture, version, build, transports, n_lines):
    p = parse_log(FIX / fixture)
    d = p.to_dict()["nccl"]
    assert d["version"] == version and p.nccl_build == build  # "2.10.3+cuda11.4": the CUDA part apart
    assert d["transports"] == transports
    assert len(d["channels"]) == n_lines  # one entry per distinct line ([send] and [receive] both kept)


@pytest.mark.parametrize("line,expected", [
    ("learnfair062:40509:40629 [3] NCCL INFO Ring 04 : 3[3] -> 2[2] via P2P/IPC",
     (4, None, 3, 2, None, "P2P/IPC", "P2P")),
    # NCCL 2.3-2.4 network hops print no device after the ranks (net.cc's "Ring %02d : %d -> %d
    # [send] via NET/%s/%d%s"): both directions of one hop, counted as one connection
    ("h:1:2 [0] NCCL INFO Ring 00 : 3 -> 4 [send] via NET/IB/0/GDRDMA",
     (0, None, 3, 4, "send", "NET/IB/0/GDRDMA", "NET")),
    ("h:1:2 [0] NCCL INFO Ring 01 : 15 -> 0 [receive] via NET/Socket/1",
     (1, None, 15, 0, "receive", "NET/Socket/1", "NET")),
    ("h:1:2 [0] NCCL INFO Channel 00 : 0[1b000] -> 1[1c000] via P2P/IPC",
     (0, None, 0, 1, None, "P2P/IPC", "P2P")),
    ("h:1:2 [0] NCCL INFO Channel 03/1 : 3[41000] -> 4[3d000] [send] via NET/Socket/0",
     (3, 1, 3, 4, "send", "NET/Socket/0", "NET")),
    ("h:1:2 [0] NCCL INFO Channel 00/0 : 2[2] -> 3[3] via P2P/direct pointer",
     (0, 0, 2, 3, None, "P2P/direct pointer", "P2P")),
    ("h:1:2 [0] NCCL INFO Channel 00/0 : 7[7] -> 8[0] [receive] via NET/IBext/0/GDRDMA",
     (0, 0, 7, 8, "receive", "NET/IBext/0/GDRDMA", "NET")),
    ("h:1:2 [0] NCCL INFO Channel 00 : 2[1a000] -> 3[1b000] via direct shared memory",
     (0, None, 2, 3, None, "direct shared memory", "SHM")),
    ("h:1:2 [0] NCCL INFO Channel 00/0 : 2[40000] -> 3[41000] via SHM/direct/direct",
     (0, 0, 2, 3, None, "SHM/direct/direct", "SHM")),
])
def test_transport_line_shapes(line, expected):
    c = parse_channel(line)
    assert (c["channel"], c["conn"], c["src"], c["dst"], c["direction"], c["via"], c["transport"]) == expected


@pytest.mark.parametrize("line", [
    "h:1:2 [0] NCCL INFO Channel 00/02 :    0   1   2   3",
    "h:1:2 [0] NCCL INFO Ring 00 : 3 -> 0 -> 1",
    "h:1:2 [0] NCCL INFO Trees [0] 1/-1/-1->0->-1 [1] 1/-1/-1->0->-1",
    "h:1:2 [0] NCCL INFO Connected all rings",
])
def test_rings_and_trees_are_not_transports(line):
    assert parse_channel(line) is None


def test_which_rank_pairs_cross_the_network():
    df = parse_log(FIX / "nccl_2.21_transports.txt").nccl
    net = df[df["transport"] == "NET"][["src", "dst"]].drop_duplicates()
    assert sorted(map(tuple, net.values.tolist())) == [(7, 8), (15, 0)]
    assert transport_class("COLLNET/Direct") == "COLLNET"
