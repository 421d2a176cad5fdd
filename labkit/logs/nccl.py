"""NCCL_DEBUG=INFO lines: the version and which transport each rank pair's channel uses.

Transport lines changed shape three times; all are read:
    NCCL 2.3 - 2.4 ``Ring 00 : 0[0] -> 1[1] via P2P/IPC``                        (2018: lines of
                   two ranks may be printed into one, or a line may start at ``Ring``)
                   ``Ring 00 : 3 -> 4 [send] via NET/IB/0/GDRDMA``               (network hops:
                   no device after the ranks, net.cc's ``"Ring %02d : %d -> %d [send] via ..."``)
    NCCL <= 2.13   ``Channel 00 : 0[3d000] -> 1[3e000] via P2P/IPC/read``          (peer bus id)
    2.14 - 2.18    ``Channel 00/0 : 0[3d000] -> 1[3e000] via P2P/IPC/read``        (+ /connIndex)
    >= 2.19        ``Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read``              (cuda device)
    network hops   ``Channel 00/0 : 3[3] -> 4[0] [send] via NET/IB/0/GDRDMA``
Ring and tree lists (``Channel 00/02 :    0   1   2   3``, ``Ring 00 : 0 1 2 3``,
``Trees [0] ...``) name an order, not a transport, and are not counted.

The banner ``NCCL version 2.18.1+cuda12.1`` gives the version ``2.18.1``; the suffix after ``+``
(``cuda12.1``, the CUDA it was built for) is kept apart (``ParsedLog.nccl_build``). A vendor's build
names itself glued to the number (Azure's ``NCCL version 2.12.6azure3+cuda11.4``): that tag is part of
the version (``2.12.6azure3``), as the vendor's release is not NVIDIA's. RCCL, AMD's port, prints its
own banner, ``RCCL version 2.17.1+hip5.7 HEAD:cbbb3d8`` (2.21 and later: ``RCCL version :
2.21.5-HEAD:9a0e6a1``): the same field, read the same way.
"""

from __future__ import annotations

import re
from typing import Any

_VERSION = re.compile(r"[NR]CCL version(?: :)? (\d{1,3}\.\d{1,3}\.\d{1,4}(?:[a-z]{1,16}\d{0,8})?)"
                      r"(?:[+\-]([\w.]{1,30}))?")
_CHANNEL = re.compile(
    r"(?:Channel|Ring) (\d{1,4})(?:/(\d{1,4}))? : (\d{1,7})(?:\[[0-9a-fA-Fx]{1,16}\])? -> "
    r"(\d{1,7})(?:\[[0-9a-fA-Fx]{1,16}\])?"
    r"(?: \[(send|receive)\])? via (\S{1,80}(?: pointer| shared memory)?)")
CLASSES = ("P2P", "SHM", "NET")


def parse_version(text: str) -> tuple[str, str | None] | None:
    """``NCCL version 2.18.1+cuda12.1`` -> ``("2.18.1", "cuda12.1")``; the build part may be None;
    ``2.12.6azure3+cuda11.4`` -> ``("2.12.6azure3", "cuda11.4")``."""
    if "CCL version" not in text:
        return None
    m = _VERSION.search(text)
    return (m.group(1), m.group(2)) if m else None


def transport_class(via: str) -> str:
    """``P2P/CUMEM/read`` -> ``P2P``; ``NET/IBext/0/GDRDMA`` -> ``NET``; ``direct shared memory`` -> SHM."""
    head = via.split("/", 1)[0].upper()
    if head in CLASSES or head == "COLLNET":
        return head
    if "shared memory" in via:
        return "SHM"
    return head


def parse_channel(text: str) -> dict[str, Any] | None:
    """A transport line -> ``{channel, conn, src, dst, direction, via, transport}``."""
    if " -> " not in text or ("Channel" not in text and "Ring" not in text):
        return None
    m = _CHANNEL.search(text)
    if m is None:
        return None
    via = m.group(6)
    return {"channel": int(m.group(1)), "conn": int(m.group(2)) if m.group(2) else None,
            "src": int(m.group(3)), "dst": int(m.group(4)), "direction": m.group(5),
            "via": via, "transport": transport_class(via)}


def summarize(channels: list[dict[str, Any]]) -> dict[str, int] | None:
    """Connections per transport class (each unique channel/rank-pair/direction counted once)."""
    if not channels:
        return None
    counts = dict.fromkeys(CLASSES, 0)
    seen = set()
    for c in channels:  # a NET hop is printed twice ([send] and [receive]): one connection
        k = (c["channel"], c["conn"], c["src"], c["dst"])
        if k not in seen:
            seen.add(k)
            counts[c["transport"]] = counts.get(c["transport"], 0) + 1
    return counts
