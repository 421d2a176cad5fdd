"""ssh between the mini-cluster's nodes: one ``sshd`` per node namespace, keys, known_hosts.

As on a lab's 2-node cloud setup: a cluster key pair (``id_ed25519``) whose public half is every
node's authorized key, a host key per node, a ``known_hosts`` with every node's name and
address, and a client configuration (``/etc/ssh/ssh_config.d/labkit-minicluster.conf``) that
maps ``node1``, ``node2``, ... to their addresses, so that ``ssh node2 hostname`` and
``pdsh -R ssh -w node1,node2 hostname`` work from this machine and from every node (the nodes
share the file system). Each sshd runs inside its node's network namespace (``nsenter
--net``), so whatever a login starts runs on that node's network. ``stop`` ends the sshds and
removes the keys and the client configuration. Everything lives under ``SSH_DIR``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from labkit.errors import LabkitError
from labkit.paths import MINICLUSTER_DIR

SSH_DIR = MINICLUSTER_DIR / "ssh"
KEY = SSH_DIR / "id_ed25519"
KNOWN_HOSTS = SSH_DIR / "known_hosts"
AUTHORIZED_KEYS = SSH_DIR / "authorized_keys"
CLIENT_CONF = Path("/etc/ssh/ssh_config.d/labkit-minicluster.conf")
SSHD = "/usr/sbin/sshd"


class SshSetupError(LabkitError, RuntimeError):
    """sshd could not be started on a node."""


def _sh(*cmd: str) -> subprocess.CompletedProcess:
    p = subprocess.run(list(cmd), capture_output=True, text=True)
    if p.returncode:
        raise SshSetupError(f"`{' '.join(cmd)}` failed (exit {p.returncode}): "
                            f"{(p.stderr or p.stdout).strip()}")
    return p


def node_dir(name: str) -> Path:
    return SSH_DIR / name


def sshd_pidfile(name: str) -> Path:
    return node_dir(name) / "sshd.pid"


def packages_missing() -> list[str]:
    """Debian packages the ssh part needs and does not find (openssh-server, pdsh)."""
    return [pkg for pkg, exe in (("openssh-server", SSHD), ("openssh-client", "ssh"),
                                 ("pdsh", "pdsh")) if not shutil.which(exe)]


def _sshd_config(name: str, addr: str) -> str:
    d = node_dir(name)
    return "\n".join([
        f"# sshd of mini-cluster node {name}; written by `labkit cluster up`.",
        f"ListenAddress {addr}", "Port 22",
        f"HostKey {d / 'ssh_host_ed25519_key'}", f"PidFile {sshd_pidfile(name)}",
        f"AuthorizedKeysFile {AUTHORIZED_KEYS}",
        "PubkeyAuthentication yes", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password", "UsePAM no",
        "PrintMotd no", "X11Forwarding no", "MaxStartups 100:30:200", "LogLevel INFO", "",
    ])


def _client_config(nodes: list[tuple[str, str, str]]) -> str:
    names = " ".join(n for n, _, _ in nodes)
    addrs = " ".join(a for _, _, a in nodes)
    lines = ["# The mini-cluster's nodes (`labkit cluster up` writes this, `down` removes it).",
             f"Host {names} {addrs}", f"    IdentityFile {KEY}", "    IdentitiesOnly yes",
             f"    UserKnownHostsFile {KNOWN_HOSTS}", "    StrictHostKeyChecking yes",
             "    BatchMode yes", "    ConnectTimeout 5", "    LogLevel ERROR"]
    for name, _, addr in nodes:
        lines += [f"Host {name}", f"    HostName {addr}"]
    return "\n".join(lines) + "\n"


def start(nodes: list[tuple[str, str, str]]) -> dict[str, int]:
    """Keys, known_hosts, client config and one sshd per node; ``nodes`` is (name, netns, address)
    for each. Returns {``sshd-NAME``: pid}."""
    missing = packages_missing()
    if missing:
        raise SshSetupError(f"missing {missing}: apt-get install {' '.join(missing)}")
    shutil.rmtree(SSH_DIR, ignore_errors=True)  # fresh keys on every up
    SSH_DIR.mkdir(parents=True, mode=0o700)
    _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "labkit-minicluster", "-f", str(KEY))
    AUTHORIZED_KEYS.write_text(KEY.with_suffix(".pub").read_text())
    AUTHORIZED_KEYS.chmod(0o600)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder
    known, pids = [], {}
    for name, ns, addr in nodes:
        d = node_dir(name)
        d.mkdir(mode=0o700)
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{name}-host",
            "-f", str(d / "ssh_host_ed25519_key"))
        pub = (d / "ssh_host_ed25519_key.pub").read_text().split()
        known.append(f"{name},{addr} {pub[0]} {pub[1]}")
        (d / "sshd_config").write_text(_sshd_config(name, addr))
        _sh(SSHD, "-t", "-f", str(d / "sshd_config"))  # a config error is named here, not lost
        _sh("nsenter", f"--net=/run/netns/{ns}", SSHD, "-f", str(d / "sshd_config"),
            "-E", str(d / "sshd.log"))
        pids[f"sshd-{name}"] = _wait_pid(name)
    KNOWN_HOSTS.write_text("\n".join(known) + "\n")
    CLIENT_CONF.parent.mkdir(parents=True, exist_ok=True)
    CLIENT_CONF.write_text(_client_config(nodes))
    for name, _, _ in nodes:
        _wait_ssh(name)
    return pids


def _wait_pid(name: str, timeout: float = 10) -> int:
    end = time.time() + timeout
    while time.time() < end:
        try:
            pid = int(sshd_pidfile(name).read_text().split()[0])
            if Path(f"/proc/{pid}").exists():
                return pid
        except (OSError, ValueError, IndexError):
            pass
        time.sleep(0.1)
    log = node_dir(name) / "sshd.log"
    tail = log.read_text(errors="replace")[-800:] if log.exists() else "(no log)"
    raise SshSetupError(f"sshd of {name} did not start (no pid in {sshd_pidfile(name)}):\n{tail}")


def _wait_ssh(name: str, timeout: float = 15) -> None:
    end, err = time.time() + timeout, ""
    while time.time() < end:
        p = subprocess.run(["ssh", name, "true"], capture_output=True, text=True, timeout=20)
        if p.returncode == 0:
            return
        err = p.stderr.strip()
        time.sleep(0.3)
    raise SshSetupError(f"`ssh {name} true` still fails after {timeout:.0f} s: {err}; see "
                        f"{node_dir(name) / 'sshd.log'}")


def stop(pids: dict[str, int | None]) -> None:
    """End the sshds recorded in ``pids`` (and only sshds), remove keys and client config."""
    if CLIENT_CONF.exists() and "labkit" in CLIENT_CONF.read_text(errors="replace"):
        CLIENT_CONF.unlink()
    for key, pid in pids.items():
        if not key.startswith("sshd-") or not pid:
            continue
        try:
            if "sshd" not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                continue  # the pid was reused by something else: leave it alone
            os.kill(pid, signal.SIGTERM)
        except (OSError, ProcessLookupError):
            continue
    shutil.rmtree(SSH_DIR, ignore_errors=True)
