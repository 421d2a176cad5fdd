"""Nodes as network namespaces joined by a shaped link: one builder, two ways in.

Every node is a network namespace with one interface, ``eth0``, at ``10.77.0.(10+i)``; the
``eth0`` is one end of a veth pair whose other end sits on the bridge ``lkbr0`` (10.77.0.1).
Each node's outgoing link is shaped with ``tc tbf`` (1 Gbit/s by default), so traffic between
nodes crosses a slow link while the ranks of one node talk over its own loopback, like the
NVLink inside a node and the Ethernet between nodes. ``netem`` (added delay) is not used: the
kernels met here lack it. ``latency`` is tbf's: how long a packet may wait in the queue.

Two ways in build the same commands (``bridge_commands``, ``node_commands``):

- **root** (``labkit.minicluster``): the nodes are named namespaces (``ip netns add``) in the
  host's network, where slurmctld listens on the bridge.
- **rootless** (the local backend, ``shell_parts``): the job script re-executes itself inside a
  new user, network, PID and mount namespace (``unshare -Urnpm --fork --kill-child``, no root
  needed where unprivileged user namespaces are allowed), holds the bridge there, and gives
  every node a holder process in a network namespace of its own; each node's torchrun is
  started in it with ``nsenter``. The job script is PID 1 of that PID namespace: when it ends,
  or when its launcher is killed (even with ``kill -9``: ``--kill-child``), the kernel kills
  every process inside, and the namespaces, veths and bridge vanish with their last process.
  Two jobs at once each have their own namespaces, so neither sees the other's addresses.

``probe()`` tries the rootless way once per process; where it is refused (a sysctl, AppArmor,
a container, missing tools) the local backend logs the reason once and its nodes share this
machine's loopback as before. The link's settings, read when a job is submitted: the site
profile's ``local_link: {rate: 1gbit, latency: 50ms}`` (tc units; rate ``off``: namespaces
without shaping), and over it the environment variables ``LABKIT_LINK_RATE`` and
``LABKIT_LINK_LATENCY``: an environment variable that is set wins over the profile, the
profile over the defaults (1gbit, 50ms). ``LABKIT_LOCAL_NODES=loopback``: no namespaces.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from labkit._logging import log
from labkit.errors import ConfigError

BRIDGE, SUBNET, IFNAME = "lkbr0", "10.77.0", "eth0"
RATE_ENV, LATENCY_ENV, MODE_ENV = "LABKIT_LINK_RATE", "LABKIT_LINK_LATENCY", "LABKIT_LOCAL_NODES"
RECORD = "node_link.json"  # in a local job's run directory: what its nodes were
UNSHARE = ("unshare", "--user", "--map-root-user", "--net", "--pid", "--mount", "--fork",
           "--kill-child", "--mount-proc")
_RATE = re.compile(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)\Z")
_TIME = re.compile(r"\d+(?:\.\d+)?(us|ms|s)\Z")
_UNIT_BITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
              "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}


@dataclass(frozen=True)
class Link:
    """The link from each node into the bridge: tbf ``rate`` (None: not shaped), ``latency``
    (tbf's queueing limit) and ``burst``."""

    rate: str | None = "1gbit"
    latency: str = "50ms"
    burst: str = "256kb"

    def __post_init__(self) -> None:
        problems = link_problems("off" if self.rate is None else self.rate, self.latency)
        if isinstance(self.rate, str) and self.rate.lower() in _OFF:
            problems.append(f"Link(rate={self.rate!r}): an unshaped link is rate=None")
        if problems:
            raise ConfigError(problems)

    @property
    def bits_per_s(self) -> float | None:
        """The shaped rate in bits per second; None when the link is not shaped."""
        m = _RATE.fullmatch(self.rate or "")
        return float(m.group(1)) * _UNIT_BITS[m.group(2)] if m else None

    def tc(self, dev: str = IFNAME) -> list[str]:
        return ["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", str(self.rate),
                "burst", self.burst, "latency", self.latency]


_OFF = ("off", "none", "0")


def link_problems(rate: object, latency: object, where: str = "link") -> list[str]:
    """What is wrong with a link's ``rate`` and ``latency`` (tc words), each naming the value
    and the fix; [] when both are good."""
    out = []
    if not isinstance(rate, str) or not (rate.lower() in _OFF or _RATE.fullmatch(rate)):
        out.append(f"{where} rate {rate!r:.40} is not a tc rate: use e.g. '1gbit' or '200mbit' "
                   f"(bits per second), or 'off' for no shaping")
    if not isinstance(latency, str) or not _TIME.fullmatch(latency):
        out.append(f"{where} latency {latency!r:.40} is not a tc time: use e.g. '50ms', "
                   f"'500us' or '1s'")
    return out


def link_settings(site: dict | None = None, env: dict[str, str] | None = None) -> Link:
    """The local nodes' link: ``LABKIT_LINK_RATE`` / ``LABKIT_LINK_LATENCY`` where set, else
    the site profile's ``local_link`` (``{rate, latency}``), else 1gbit and 50ms; a rate of
    ``off`` (or ``none``, ``0``) builds the namespaces unshaped."""
    env = os.environ if env is None else env
    site = site or {}
    rate = (env.get(RATE_ENV, "").strip() or str(site.get("rate") or "1gbit")).lower()
    latency = (env.get(LATENCY_ENV, "").strip() or str(site.get("latency") or "50ms")).lower()
    if problems := link_problems(rate, latency):
        raise ConfigError([f"{p} ({RATE_ENV}/{LATENCY_ENV} where set, else the site profile's "
                           f"local_link)" for p in problems])
    return Link(rate=None if rate in _OFF else rate, latency=latency)


def node_addr(i: int) -> str:
    """Node ``i``'s address (nodes count from 1)."""
    return f"{SUBNET}.{10 + i}"


def bridge_commands(bridge: str = BRIDGE) -> list[list[str]]:
    """The bridge every node's veth joins, with the address ``SUBNET.1``."""
    return [["ip", "link", "add", bridge, "type", "bridge"],
            ["ip", "addr", "add", f"{SUBNET}.1/24", "dev", bridge],
            ["ip", "link", "set", bridge, "up"]]


def node_commands(i: int, target: str, netns_path: str, link: Link,
                  bridge: str = BRIDGE) -> list[list[str]]:
    """Node ``i``: a veth pair with its ``eth0`` end moved into the node's namespace (``target``:
    a name under /run/netns or a pid, as ``ip link ... netns`` takes it; ``netns_path``: the
    file ``nsenter --net=`` enters), its address, loopback up, and the shaped egress."""
    veth, enter = f"lkv{i}", ["nsenter", f"--net={netns_path}"]
    cmds = [["ip", "link", "add", veth, "type", "veth", "peer", "name", IFNAME, "netns", target],
            [*enter, "ip", "addr", "add", f"{node_addr(i)}/24", "dev", IFNAME],
            [*enter, "ip", "link", "set", IFNAME, "up"],
            [*enter, "ip", "link", "set", "lo", "up"],
            ["ip", "link", "set", veth, "master", bridge, "up"]]
    if link.rate is not None:  # what crosses nodes is shaped; a node's loopback is not
        cmds.append([*enter, *link.tc()])
    return cmds


# --- the rootless way in ----------------------------------------------------------------------
_PROBE: list[str | None] = []  # [reason refused, or None]: probed once per process
_TOOLS = ("unshare", "nsenter", "ip", "tc")
SBIN = "/usr/sbin:/sbin"  # where ip and tc live on Debian; not on an ordinary user's PATH


def _path() -> str:
    return f"{os.environ.get('PATH', '/usr/bin:/bin')}:{SBIN}"


def probe() -> str | None:
    """None when this user can build rootless nodes here (a user + network namespace with a
    veth pair and a tbf qdisc, tried once per process); else the reason, in one line."""
    if not _PROBE:
        _PROBE.append(_probe())
    return _PROBE[0]


def _probe() -> str | None:
    missing = [t for t in _TOOLS if not shutil.which(t, path=_path())]
    if missing:
        return f"{', '.join(missing)} not found (util-linux and iproute2 provide them)"
    test = ("ip link add lkprobe0 type veth peer name lkprobe1 && "
            f"{shlex.join(Link().tc('lkprobe0'))}")
    try:
        p = subprocess.run([*UNSHARE, "sh", "-c", test], capture_output=True, text=True,
                           timeout=20, env={**os.environ, "PATH": _path()})
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`unshare -Urnpm` could not run: {e}"
    if p.returncode:
        why = (p.stderr or p.stdout).strip().splitlines()
        return f"`unshare -Urnpm` refused: {why[-1] if why else f'exit {p.returncode}'}"
    return None


def local_link(nodes: int, site: dict | None = None, *, quiet: bool = False
               ) -> tuple[Link | None, str | None]:
    """(the link of a local job's nodes, None) when it gets namespaces; (None, why not)
    otherwise. ``site``: the site profile's ``local_link``. A one-node job has no link to
    build; the refusal is logged once here (never with ``quiet``)."""
    if nodes < 2:
        return None, "a single node"
    if os.environ.get(MODE_ENV, "").strip().lower() == "loopback":
        return None, f"{MODE_ENV}=loopback"
    link = link_settings(site)
    reason = probe()
    if reason:
        if len(_PROBE) == 1 and not quiet:
            log.warning(f"local nodes share this machine's loopback (no shaped link between "
                        f"them): rootless network namespaces are unavailable: {reason}")
            _PROBE.append(reason)  # logged: once per process
        return None, reason
    return link, None


def _word(w: str) -> str:
    return f'"{w}"' if "$" in w else shlex.quote(w)


def shell_parts(nodes: int, link: Link) -> dict[str, str]:
    """The pieces of a local job script whose ``nodes`` are rootless namespaces: ``reexec``
    (the script enters its own namespaces), ``node_net`` (bridge, holders, veths, shaping),
    ``node_enter`` (the prefix that starts node ``$node_rank``'s torchrun inside its node),
    ``master_addr`` and the interface variables for gloo and NCCL."""
    reexec = (
        "# Nodes as network namespaces (labkit.nodenet): this script runs as PID 1 of its own\n"
        "# user, network, PID and mount namespaces; when it ends or its launcher is killed, the\n"
        "# kernel ends every process inside and the namespaces vanish with them.\n"
        'if [ "$$" != 1 ]; then\n'
        f'  exec {shlex.join(UNSHARE)} bash "$0" "$@"\n'
        "fi\n")
    lines = ["# One network namespace per node, held by a sleeping process, joined by a bridge;",
             f"# each node's link is shaped: {describe(link)}.",
             "net() { \"$@\" || { echo \"labkit: building the nodes' network failed: $*\" >&2;",
             '  echo 1 > "$RUN_DIR/exit_code"; exit 1; }; }',
             f'PATH="$PATH:{SBIN}"  # ip and tc',
             "net ip link set lo up"]
    lines += ["net " + " ".join(map(_word, c)) for c in bridge_commands()]
    for i in range(1, nodes + 1):
        lines += ["unshare --net sleep infinity &", f"P{i}=$!",
                  f'for _ in $(seq 500); do [ "$(readlink /proc/$P{i}/ns/net)" != '
                  f'"$(readlink /proc/$$/ns/net)" ] && break; sleep 0.01; done']
        lines += ["net " + " ".join(map(_word, c))
                  for c in node_commands(i, f"$P{i}", f"/proc/$P{i}/ns/net", link)]
    lines.append("NODE_NET=(" + " ".join(f'"/proc/$P{i}/ns/net"' for i in range(1, nodes + 1))
                 + ")")
    return {"reexec": reexec, "node_net": "\n".join(lines) + "\n",
            "node_enter": 'nsenter --net="${NODE_NET[$node_rank]}" ',
            "master_addr": node_addr(1),
            "env": {"GLOO_SOCKET_IFNAME": IFNAME, "NCCL_SOCKET_IFNAME": IFNAME}}


def describe(link: Link | None) -> str:
    if link is None:
        return "no link: the nodes share this machine's loopback"
    if link.rate is None:
        return "not shaped (link rate off)"
    return f"tc tbf rate {link.rate} (latency {link.latency}, burst {link.burst})"


# --- what a job's nodes were ------------------------------------------------------------------
def write_record(run_dir: Path, nodes: int, link: Link | None, reason: str | None) -> None:
    """``run_dir/node_link.json``: whether the job's nodes were namespaces, and their link."""
    rec = {"nodes": nodes, "namespaces": link is not None,
           "link": asdict(link) if link else None,
           "rate_bits_per_s": link.bits_per_s if link else None,
           "why_not": reason, "described": describe(link)}
    (Path(run_dir) / RECORD).write_text(json.dumps(rec, indent=1) + "\n")


def read_record(run_dir: str | Path) -> dict | None:
    """What ``write_record`` wrote for a local job (None for other backends or older runs)."""
    try:
        return json.loads((Path(run_dir) / RECORD).read_text())
    except (OSError, ValueError):
        return None
