"""The hosts of a site without Slurm: a profile's ``hosts:`` list or a DeepSpeed hostfile.

A cluster profile (``labkit.site.ClusterProfile``) for the hostfile backend lists its hosts in
order, the first one the head (it hosts the rendezvous, ``MASTER_ADDR``)::

    launcher: pdsh            # or deepspeed
    hosts:
      - {name: node1, address: 10.0.0.11, slots: 2}
      - {name: node2, address: 10.0.0.12, slots: 2}
      - {name: node3, slots: 1}          # address defaults to the name

or points at an existing DeepSpeed hostfile (``hostfile: /shared/hostfile``, lines
``worker-1 slots=8``). ``check_hosts`` is the profile's validation of these fields;
``cluster_hosts`` returns :class:`Host` objects from either form.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from labkit.errors import ConfigError

LAUNCHERS = ("pdsh", "deepspeed")
HOST_KEYS = ("name", "address", "slots")
_HOSTFILE_LINE = re.compile(r"^(\S+)\s+slots=(\d+)\s*(#.*)?$")
_EXAMPLE = "e.g. {name: node1, address: 10.0.0.11, slots: 8}"


class HostsOfSite(Protocol):
    """What this module reads of a site profile (``labkit.site.ClusterProfile`` has it)."""

    name: str
    hosts: tuple[dict[str, Any], ...]
    hostfile: str | None
    launcher: str


@dataclass(frozen=True)
class Host:
    """One host: ``name`` (written to the hostfile, dialled by ssh and pdsh), ``slots``
    (processes on it), ``address`` (what the rendezvous dials; the name when not given)."""

    name: str
    slots: int
    address: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "address": self.address, "slots": self.slots}


def _word(v: Any) -> bool:
    return isinstance(v, str) and bool(v) and len(v) <= 255 and not any(c.isspace() for c in v)


# A host name reaches ssh and pdsh as an argument: one starting with '-' would be an option
# (``-oProxyCommand=...`` runs a command). Names: letters, digits, '-', '_', '.'; addresses
# may also hold ':' (IPv6). Neither may start with '-' or '.'.
_HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}\Z")
_HOST_ADDRESS = re.compile(r"[A-Za-z0-9_:][A-Za-z0-9_.:-]{0,252}\Z")


def host_name_problem(what: str, v: Any, *, address: bool = False) -> str | None:
    """Why ``v`` cannot be a host name (or, ``address``, a host name or IP address), or None."""
    if isinstance(v, str) and (_HOST_ADDRESS if address else _HOST_NAME).fullmatch(v):
        return None
    allowed = "letters, digits, '-', '_', '.'" + (" and ':'" if address else "")
    return (f"{what}={v!r:.80} is not a host name: use {allowed}, not starting with '-' or '.' "
            f"(a name starting with '-' would reach ssh and pdsh as an option)")


def check_hosts(p: HostsOfSite) -> list[str]:
    """What is wrong with a profile's ``launcher``, ``hosts`` and ``hostfile`` (one line each)."""
    out = []
    if p.launcher not in LAUNCHERS:
        out.append(f"launcher={p.launcher!r:.40} is not one of {list(LAUNCHERS)}")
    if not isinstance(p.hosts, tuple):
        return out + [f"hosts must be a list of hosts, {_EXAMPLE}; got {type(p.hosts).__name__}"]
    if p.hosts and p.hostfile:
        out.append(f"give hosts ({len(p.hosts)} listed) or hostfile ({p.hostfile!r:.80}), not both")
    if p.hostfile is not None and not _word(p.hostfile):
        out.append(f"hostfile={p.hostfile!r:.80} must be the path of a DeepSpeed hostfile")
    names = []
    for i, h in enumerate(p.hosts, start=1):
        if not isinstance(h, dict):
            out.append(f"hosts[{i}]={h!r:.60} must be a mapping, {_EXAMPLE}")
            continue
        if set(h) - set(HOST_KEYS):
            out.append(f"hosts[{i}] has unknown keys {sorted(map(str, set(h) - set(HOST_KEYS)))}; "
                       f"valid: {', '.join(HOST_KEYS)}")
        name = h.get("name")
        if why := host_name_problem(f"hosts[{i}] name", name):
            out.append(f"{why}, {_EXAMPLE}")
        names.append(name)
        if h.get("address") is not None and (
                why := host_name_problem(f"hosts[{i}] ({name!s:.60}) address", h.get("address"),
                                         address=True)):
            out.append(why)
        s = h.get("slots")
        if isinstance(s, bool) or not isinstance(s, int) or not 0 < s <= 4096:
            out.append(f"hosts[{i}] ({name}) slots={s!r:.20} must be a positive integer "
                       f"(processes, one per GPU, on that host)")
    dup = sorted({n for n in names if isinstance(n, str) and names.count(n) > 1})
    if dup:
        out.append(f"hosts lists {dup} more than once; list each host once with its slots")
    return out


def parse_hostfile(text: str, source: str = "hostfile") -> list[Host]:
    """The hosts of a DeepSpeed hostfile (``name slots=N`` per line, ``#`` comments)."""
    hosts: list[Host] = []
    for n, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _HOSTFILE_LINE.match(line)
        if not m or int(m.group(2)) <= 0:
            raise ConfigError(f"{source} line {n}: {line[:80]!r} is not `NAME slots=N` (N > 0), "
                              f"e.g. `worker-1 slots=8`")
        if why := host_name_problem("host", m.group(1)):
            raise ConfigError(f"{source} line {n}: {why}")
        if any(h.name == m.group(1) for h in hosts):
            raise ConfigError(f"{source} line {n}: host {m.group(1)!r} is listed twice; list "
                              f"each host once with all its slots")
        hosts.append(Host(m.group(1), int(m.group(2)), m.group(1)))
    if not hosts:
        raise ConfigError(f"{source} lists no hosts; one line per host, e.g. `worker-1 slots=8`")
    return hosts


def cluster_hosts(cluster: HostsOfSite) -> list[Host]:
    """A profile's hosts (``hosts``, or its ``hostfile`` read); [] when it has neither."""
    if cluster.hosts:
        return [Host(h["name"], h["slots"], h.get("address") or h["name"]) for h in cluster.hosts]
    if cluster.hostfile:
        path = Path(cluster.hostfile).expanduser()
        try:
            text = path.read_text()
        except OSError as e:
            raise ConfigError(f"cluster profile {cluster.name!r}: cannot read hostfile {path}: "
                              f"{e.strerror}; fix the path, or list hosts: in the profile") from None
        return parse_hostfile(text, str(path))
    return []
