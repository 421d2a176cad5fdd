"""The doctor on hosts reached by ssh (a hostfile, or a cluster profile's ``hosts``).

What the pdsh and DeepSpeed launchers need before training: passwordless ssh from here to every
host and from every host to every other (N x N, each to itself included: the LMFlow guide's
test), pdsh over ssh, the rendezvous port on the head host reachable from the others, and the
inter-node interface (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME) present on each host and on the
route to the head. Each function returns ``(status, detail, fix)``, naming the host and the fix;
``labkit.doctor.checks`` turns them into Results.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from labkit.errors import ConfigError
from labkit.hosts import Host, cluster_hosts, parse_hostfile

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
# '--': the host name that follows is never read as an option
SSH = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "--"]
DEFAULT_PORT = 29500
Outcome = tuple[str, str, str]


def hosts_of(hostfile: Path | None, profile) -> tuple[list[Host] | None, str]:
    """(hosts, where they come from); (None, why) when there are none or they cannot be read."""
    if hostfile is not None:
        try:
            return parse_hostfile(Path(hostfile).read_text(), str(hostfile)), f"hostfile {hostfile}"
        except OSError as e:
            return None, f"cannot read hostfile {hostfile}: {e.strerror}"
        except ConfigError as e:
            return None, str(e)
    if profile is not None:
        try:
            hosts = cluster_hosts(profile)
        except ConfigError as e:
            return None, str(e)
        if hosts:
            return hosts, f"cluster profile {profile.name!r}"
    return None, ""


def _run(cmd: list[str], timeout: float = 30, stdin: str | None = None):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, input=stdin)
    except (OSError, subprocess.TimeoutExpired):
        return None


def ssh_fix(host: str, why: str) -> str:
    """The fix for one failed ``ssh host``, from ssh's own message."""
    w = why.lower()
    if "host key verification failed" in w or "no ed25519 host key is known" in w:
        return (f"{host}'s host key is not in known_hosts: check its fingerprint, then "
                f"ssh-keyscan {host} >> ~/.ssh/known_hosts (the mini-cluster: labkit cluster up)")
    if "remote host identification has changed" in w:
        return f"{host}'s host key changed: ssh-keygen -R {host}, then add the new key once checked"
    if "connection refused" in w:
        return (f"nothing listens for ssh on {host}: start sshd there (systemctl start ssh; the "
                f"mini-cluster: labkit cluster down && labkit cluster up)")
    if "permission denied" in w:
        return f"your key is not authorized on {host}: ssh-copy-id {host}"
    return (f"make `ssh {host} true` work without a password: ssh-keygen -t ed25519 (empty "
            f"passphrase), ssh-copy-id {host}, accept its host key once; check DNS for {host}")


def _last(p) -> str:
    return ((p.stderr or p.stdout).strip().splitlines() or [f"exit {p.returncode}"])[-1] if p \
        else "no answer in time"


def ssh_mesh(hosts: list[Host]) -> Outcome:
    """ssh from here to every host, from every host to every host, then pdsh -R ssh to all."""
    bad, fixes = [], []
    reachable = []
    for h in hosts:
        p = _run([*SSH, h.name, "true"])
        if p is None or p.returncode:
            bad.append(f"here -> {h.name}: {_last(p)}")
            fixes.append(ssh_fix(h.name, _last(p)))
        else:
            reachable.append(h)
    names = " ".join(shlex.quote(h.name) for h in hosts)
    probe = (f"for h in {names}; do if out=$({shlex.join(SSH)} \"$h\" true 2>&1); then "
             f"echo \"OK $h\"; else echo \"FAIL $h ${{out##*$'\\n'}}\"; fi; done")
    for src in reachable:
        p = _run([*SSH, src.name, "bash", "-s"], timeout=20 + 10 * len(hosts), stdin=probe)
        if p is None:
            bad.append(f"{src.name} -> *: no answer in time")
            continue
        for line in p.stdout.splitlines():
            parts = line.split(" ", 2)
            if parts[0] == "FAIL" and len(parts) >= 2:
                why = parts[2] if len(parts) > 2 else "?"
                bad.append(f"{src.name} -> {parts[1]}: {why}")
                fixes.append(f"on {src.name}: " + ssh_fix(parts[1], why))
    n = len(hosts)
    if bad:
        return (FAIL, f"passwordless ssh fails for {len(bad)} of {n + n * n} connections (here to "
                f"{n} host(s), then {n} x {n} between them): " + "; ".join(bad),
                "; ".join(dict.fromkeys(fixes)))
    pdsh = shutil.which("pdsh")
    if not pdsh:
        return (WARN, f"ssh works here -> {n} host(s) and {n} x {n} between them, but pdsh is "
                "not installed (the pdsh and DeepSpeed launchers need it)",
                "apt-get install pdsh, or launch with --launcher openmpi / slurm")
    p = _run([pdsh, "-R", "ssh", "-w", ",".join(h.name for h in hosts), "true"], timeout=60)
    if p is None or p.returncode:
        return (FAIL, f"pdsh -R ssh to {n} host(s) failed: "
                f"{((p.stderr.strip() if p else '') or 'no answer in time')[-300:]}",
                "export PDSH_RCMD_TYPE=ssh; check that pdsh is installed on every host")
    return (PASS, f"ssh works here -> {n} host(s) and {n} x {n} between them (each to itself "
            f"too); pdsh -R ssh reaches all: {', '.join(h.name for h in hosts)}", "")


# Listens until its stdin closes (the doctor is done) or ``wait`` seconds pass.
_LISTEN = ("import select,socket,sys,time\ns=socket.socket()\n"
           "s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
           "try:\n s.bind(('0.0.0.0',{port}))\nexcept OSError as e:\n print('BUSY',e,flush=True)\n"
           " sys.exit(0)\ns.listen(64)\nprint('LISTEN',flush=True)\n"
           "end=time.time()+{wait}\nwhile time.time()<end:\n"
           " r=select.select([s,sys.stdin],[],[],1)[0]\n if sys.stdin in r:\n  break\n"
           " if s in r:\n  s.accept()[0].close()\n")


def port_reachable(hosts: list[Host], port: int = DEFAULT_PORT, wait: float = 60) -> Outcome:
    """A listener on the head's rendezvous port, connections to it from every other host."""
    head, others = hosts[0], hosts[1:] or hosts[:1]
    where = f"port {port} on the head {head.name} ({head.address})"
    listener = subprocess.Popen([*SSH, head.name, sys.executable, "-c",
                                 shlex.quote(_LISTEN.format(port=port, wait=wait))],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        first = listener.stdout.readline().strip() if listener.stdout else ""
        if first.startswith("BUSY"):
            return (WARN, f"{where} is taken ({first[5:]}): another job or user holds it",
                    "give each job its own MASTER_PORT (labkit's hostfile backend picks one)")
        if first != "LISTEN":
            return (FAIL, f"could not listen on {where}: {first or listener.stderr.read()[-200:]}",
                    f"check `ssh {head.name} {sys.executable} -V`: the hosts need the same "
                    f"Python environment at the same path")
        bad = []
        for h in others:
            cmd = f"timeout 5 bash -c 'exec 3<>/dev/tcp/{head.address}/{port}' 2>&1"
            p = _run([*SSH, h.name, cmd], timeout=30)
            if p is None or p.returncode:
                why = _last(p) if p and (p.stdout or p.stderr).strip() else (
                    "timed out (packets dropped)" if p and p.returncode == 124 else _last(p))
                bad.append(f"{h.name}: {why}")
    finally:
        if listener.stdin:
            listener.stdin.close()  # the listener on the head stops
        try:
            listener.wait(timeout=10)
        except subprocess.TimeoutExpired:
            listener.kill()
            listener.wait()
        for pipe in (listener.stdout, listener.stderr):
            if pipe:
                pipe.close()
    if bad:
        return (FAIL, f"{where} (the rendezvous, MASTER_PORT) is not reachable from: "
                + "; ".join(bad),
                f"open TCP port {port} (and the range your jobs use) into {head.name}: look at "
                f"`nft list ruleset` / `iptables -L INPUT -n` on {head.name}, or the cloud's "
                f"security group; then rerun the doctor")
    return (PASS, f"{where} reached from {', '.join(h.name for h in others)}", "")


def interface_on_hosts(hosts: list[Host], var: str, ifname: str | None) -> Outcome:
    """``ifname`` exists with an IPv4 address on every host and carries the route to the head."""
    head = hosts[0]
    problems, seen = [], []
    for h in hosts:
        p = _run([*SSH, h.name, f"ip -o -4 addr show; echo ROUTE; ip route get {head.address}"])
        if p is None or p.returncode:
            problems.append(f"{h.name}: cannot ask ({_last(p)})")
            continue
        addrs, _, route = p.stdout.partition("ROUTE")
        ifs = [ln.split()[1] for ln in addrs.splitlines() if len(ln.split()) > 1]
        dev = route.split(" dev ")[1].split()[0] if " dev " in route else None
        if ifname and not any(i.startswith(n) for n in ifname.lstrip("^=").split(",") for i in ifs):
            problems.append(f"{h.name}: {var}={ifname} but its interfaces are {ifs}")
        elif ifname and h is not head and dev and not dev.startswith(ifname.lstrip("=")):
            problems.append(f"{h.name}: {var}={ifname} but the route to {head.address} leaves by "
                            f"{dev}")
        seen.append(f"{h.name}: route to head via {dev}")
    if problems:
        return (FAIL, "; ".join(problems),
                f"set {var} in the profile's env to the interface of the inter-node network "
                f"(the one `ip route get {head.address}` names on the other hosts)")
    note = f"{var}={ifname}" if ifname else f"{var} unset (gloo/NCCL pick by hostname)"
    return PASS, f"{note}; " + "; ".join(seen), ""

