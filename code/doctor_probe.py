"""The per-node half of ``labkit doctor``: one process per node, in a Slurm job (or locally).

Each process writes what it finds to ``<out>/rank-<r>.json`` in the run root, after every
phase, so a probe killed half-way still says how far it got:

1. ``node``: host name, open-file limit, GPUs, network interfaces, NCCL/GLOO_SOCKET_IFNAME,
   and (with ``--data``) the dataset's ``.bin``/``.idx`` and the tokenizer files: present,
   readable from first to last byte, their sizes, the ``.idx`` header.
2. ``run_root``: write a file into the run root and read it back; rank 0 publishes its ports
   there (``ports.json``, later ``store.json``: each bound before it is published) and the
   others read them (a run root that is not shared stops them here).
3. ``master``: resolve MASTER_ADDR, find the interface the route to it leaves by, connect to a
   TCP port rank 0 listens on, and estimate the clock offset from rank 0 (NTP-style).
4. ``allreduce``: a tiny gloo all-reduce over all probes (the "does it hang" test).

    python code/doctor_probe.py --out DIR --rank R --world W [--master-addr A] [--port P] \
        [--data PREFIX --tokenizer DIR]

On Slurm it is the program of a job script rendered like any other (labkit.render), so it runs
with the site's modules, container, environment and sbatch options; rank and world come from
Slurm, and MASTER_ADDR is worked out from the job's nodes as the job script does.

It imports only the standard library and torch: the nodes need no labkit.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import struct
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any


def _write(out: Path, rank: int, rec: dict[str, Any]) -> None:
    tmp = out / f".rank-{rank}.json.tmp"
    tmp.write_text(json.dumps(rec, indent=1, sort_keys=True))
    tmp.replace(out / f"rank-{rank}.json")


def node_facts() -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    facts: dict[str, Any] = {
        "hostname": socket.gethostname(), "pid": os.getpid(), "python": sys.executable,
        "nofile_soft": soft, "nofile_hard": hard,
        "interfaces": sorted(name for _, name in socket.if_nameindex()),
        "ifname_env": {k: os.environ.get(k) for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")},
        "slurm_node": os.environ.get("SLURMD_NODENAME"),
    }
    try:
        facts["hostname_ip"] = socket.gethostbyname(facts["hostname"])
    except OSError as e:
        facts["hostname_ip"], facts["hostname_error"] = None, str(e)
    try:
        import torch

        facts["gpus"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as e:  # a node without torch is itself the finding
        facts["gpus"], facts["torch_error"] = None, f"{type(e).__name__}: {e}"
    try:  # the GPUs the node has, whether or not this job step may use them
        smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
        facts["gpus_installed"] = smi.stdout.count("GPU ") if smi.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        facts["gpus_installed"] = None
    return facts


# Megatron's indexed dataset: MMIDIDX + two NUL bytes, version (u64), dtype code (u8), sequences (u64).
IDX_MAGIC = b"MMIDIDX\x00\x00"
IDX_ITEMSIZE = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 4, 8: 2}  # dtype code -> bytes per token


def file_facts(path: Path) -> dict[str, Any]:
    """Present, readable (its first and last 4 KiB), its size; ``error`` says what is wrong."""
    rec: dict[str, Any] = {"path": str(path)}
    try:
        rec["size"] = path.stat().st_size
        with path.open("rb") as f:
            f.read(4096)
            if rec["size"] > 4096:
                f.seek(-4096, os.SEEK_END)
                f.read(4096)
        rec["readable"] = True
    except OSError as e:
        rec["readable"] = False
        rec["error"] = ("missing" if isinstance(e, FileNotFoundError) else "not readable") + \
            f" ({e.strerror or type(e).__name__})"
    return rec


def data_facts(prefix: str, tokenizer: str) -> dict[str, Any]:
    """The dataset (``PREFIX.bin``/``.idx``) and tokenizer (``vocab.json``, ``merges.txt``) as
    this node sees them: each file's facts, the tokens in ``.bin``, the vocabulary's size."""
    files = {"bin": Path(prefix + ".bin"), "idx": Path(prefix + ".idx"),
             "vocab": Path(tokenizer) / "vocab.json", "merges": Path(tokenizer) / "merges.txt"}
    out: dict[str, Any] = {k: file_facts(p) for k, p in files.items()}
    if out["idx"]["readable"]:
        head = files["idx"].read_bytes()[:34]
        code = head[17] if len(head) > 17 else None
        if head[:9] != IDX_MAGIC or code not in IDX_ITEMSIZE:
            out["idx"]["error"] = "not a Megatron indexed dataset (.idx header)"
        else:
            out["idx"]["itemsize"] = IDX_ITEMSIZE[code]
            out["idx"]["sequences"] = struct.unpack("<Q", head[18:26])[0]
            if out["bin"]["readable"]:
                out["bin"]["tokens"] = out["bin"]["size"] // IDX_ITEMSIZE[code]
    if out["vocab"]["readable"]:
        try:
            out["vocab"]["entries"] = len(json.loads(files["vocab"].read_text()))
        except (OSError, ValueError) as e:
            out["vocab"]["error"] = f"not a JSON vocabulary ({type(e).__name__})"
    return out


def head_node() -> tuple[str | None, str]:
    """The first node of this Slurm job and how to reach it (name, else Slurm's NodeAddr)."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodelist:
        return None, "none"
    try:
        names = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                               text=True, timeout=15).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return None, "none"
    return (names[0], "slurm head node") if names else (None, "none")


def node_addr(name: str) -> str | None:
    try:
        out = subprocess.run(["scontrol", "show", "node", name], capture_output=True, text=True,
                             timeout=15).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for tok in out.split():
        if tok.startswith("NodeAddr="):
            return tok.split("=", 1)[1]
    return None


def resolve_master(given: str | None) -> dict[str, Any]:
    rec: dict[str, Any] = {"master_addr": given, "master_how": "given" if given else None}
    name = given
    if not name:
        name, rec["master_how"] = head_node()
        rec["master_addr"] = name
    if not name:
        rec["master_error"] = "no MASTER_ADDR given and not inside a Slurm job"
        return rec
    try:
        rec["master_ip"] = socket.gethostbyname(name)
        rec["master_resolves"] = True
    except OSError as e:
        rec["master_ip"], rec["master_resolves"] = None, False
        rec["master_resolve_error"] = str(e)
    if not given and (rec["master_ip"] is None or rec["master_ip"].startswith("127.")):
        # Nodes that share one hostname (containers, the mini-cluster): Slurm knows the address.
        addr = node_addr(name)
        if addr:
            rec["master_nodeaddr"] = addr
            rec["master_ip"] = socket.gethostbyname(addr)
    if rec.get("master_ip"):
        rec["route_dev"] = route_dev(rec["master_ip"])
    return rec


def route_dev(ip: str) -> str | None:
    """The interface the kernel sends traffic for ``ip`` out of (``ip route get``)."""
    try:
        out = subprocess.run(["ip", "route", "get", ip], capture_output=True, text=True,
                             timeout=5).stdout.split()
        if out[:1] == ["local"]:
            # Our own address (the head node): name the interface that owns it, not lo.
            own = subprocess.run(["ip", "-o", "addr", "show", "to", ip], capture_output=True,
                                 text=True, timeout=5).stdout.split()
            if len(own) > 1:
                return own[1]
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out[out.index("dev") + 1] if "dev" in out else None


def serve(listener: socket.socket, clients: int, deadline: float) -> int:
    """Rank 0: answer each client's ping with this node's clock (8-byte double)."""
    served = 0
    while served < clients and time.time() < deadline:
        listener.settimeout(max(0.1, deadline - time.time()))
        try:
            conn, _ = listener.accept()
        except OSError:
            break
        with conn:
            conn.recv(1)
            conn.sendall(struct.pack("!d", time.time()))
        served += 1
    return served


def ping(ip: str, port: int, deadline: float) -> dict[str, Any]:
    """Connect to rank 0 (retrying until the deadline); RTT and this clock's offset from it."""
    err = None
    while time.time() < deadline:
        try:
            with socket.create_connection((ip, port), timeout=3) as s:
                t0 = time.time()
                s.sendall(b"p")
                data = s.recv(8)
                t1 = time.time()
            remote = struct.unpack("!d", data)[0]
            return {"ok": True, "rtt_ms": (t1 - t0) * 1e3, "skew_s": (t0 + t1) / 2 - remote}
        except OSError as e:
            err = f"{type(e).__name__}: {e}"
            time.sleep(0.3)
    return {"ok": False, "error": err or "deadline passed before a connection was tried"}


def wait_for(path: Path, deadline: float) -> dict[str, Any] | None:
    while time.time() < deadline:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            time.sleep(0.2)
    return None


def allreduce(ip: str, out: Path, rank: int, world: int, timeout: float) -> dict[str, Any]:
    """A gloo all-reduce over all probes. Rank 0 serves the process group's store on a port
    the OS gives it and publishes it in ``<out>/store.json``; the others read it there. (A port
    looked up first and bound later can be taken in between by another process.)"""
    import torch
    import torch.distributed as dist

    t0 = time.time()
    try:
        span = timedelta(seconds=timeout)
        if rank == 0:
            store = dist.TCPStore("0.0.0.0", 0, world, is_master=True, timeout=span,
                                  wait_for_workers=False)
            (out / "store.json").write_text(json.dumps({"port": store.port}))
        else:
            got = wait_for(out / "store.json", t0 + timeout)
            if got is None:
                return {"ok": False, "error": f"rank 0 published no store port in {out} within "
                        f"{timeout:.0f}s", "seconds": time.time() - t0}
            store = dist.TCPStore(ip, int(got["port"]), world, is_master=False, timeout=span)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=span)
        x = torch.ones(1024)
        dist.all_reduce(x)
        value = float(x[0])
        dist.destroy_process_group()
        return {"ok": value == world, "value": value, "expected": float(world),
                "seconds": time.time() - t0}
    except Exception as e:  # the message (timeout, connection refused) is the finding
        return {"ok": False, "error": f"{type(e).__name__}: {str(e)[:500]}",
                "seconds": time.time() - t0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder in the run root for the results")
    ap.add_argument("--rank", type=int, default=int(os.environ.get("SLURM_PROCID", 0)))
    ap.add_argument("--world", type=int, default=int(os.environ.get("SLURM_NTASKS", 1)))
    ap.add_argument("--master-addr", help="default: the head node of this Slurm job")
    ap.add_argument("--port", type=int, default=0, help="port to test on rank 0 (0: any free)")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds for each phase")
    ap.add_argument("--no-allreduce", action="store_true")
    ap.add_argument("--data", metavar="PREFIX", help="dataset prefix (without .bin/.idx) to check")
    ap.add_argument("--tokenizer", metavar="DIR", help="folder of vocab.json + merges.txt")
    a = ap.parse_args(argv)
    out, rank = Path(a.out), a.rank
    rec: dict[str, Any] = {"rank": rank, "world": a.world, "phase": "node", "start": time.time()}
    try:
        out.mkdir(parents=True, exist_ok=True)
        _write(out, rank, rec)
        rec["run_root_rw"] = json.loads((out / f"rank-{rank}.json").read_text())["rank"] == rank
    except OSError as e:  # cannot even report: say it on stderr for the job log
        print(f"doctor_probe rank {rank}: run root {out} not writable: {e}", file=sys.stderr)
        return 3
    rec.update(node_facts())
    rec["job_master_addr"] = os.environ.get("MASTER_ADDR")  # what the job script exported
    if a.data:
        rec["data"] = data_facts(a.data, a.tokenizer or str(Path(a.data).parent / "tokenizer"))
    rec["phase"] = "run_root"
    _write(out, rank, rec)

    deadline = time.time() + a.timeout
    listener = None
    if rank == 0:
        # the port asked for, else one the OS gives (bound at once: nothing can take it first)
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(("", a.port))
            rec["port_free"] = True
        except OSError as e:
            rec["port_free"], rec["port_error"] = False, f"port {a.port}: {e}"
            listener.bind(("", 0))
        listener.listen(max(8, a.world))
        got = listener.getsockname()[1]
        ports = {"ping": got, "wanted": a.port or got}
        (out / "ports.json").write_text(json.dumps(ports))
    else:
        ports = wait_for(out / "ports.json", deadline)
        if ports is None:
            rec["ports_seen"] = False
            rec["phase"] = "master"
            rec.update(resolve_master(a.master_addr))
            _write(out, rank, rec)
            return 4
    rec["ports_seen"] = True
    rec["ports"] = ports
    rec["phase"] = "master"
    rec.update(resolve_master(a.master_addr))
    _write(out, rank, rec)

    if rank == 0:
        rec["served"] = serve(listener, a.world - 1, deadline)
        listener.close()
        rec["ping"] = {"ok": True, "rtt_ms": 0.0, "skew_s": 0.0}
    elif rec.get("master_ip"):
        rec["ping"] = ping(rec["master_ip"], ports["ping"], deadline)
    else:
        rec["ping"] = {"ok": False, "error": "MASTER_ADDR did not resolve"}
    rec["phase"] = "allreduce"
    _write(out, rank, rec)
    if not a.no_allreduce and rec.get("master_ip"):
        # In a thread, so a collective that never returns (gloo's connect retries can outlast
        # the process-group timeout) is reported as a hang after --timeout seconds.
        box: dict[str, Any] = {}
        t = threading.Thread(target=lambda: box.update(allreduce(
            rec["master_ip"], out, rank, a.world, a.timeout)), daemon=True)
        t.start()
        t.join(a.timeout)
        rec["allreduce"] = box or {"ok": False, "hung": True, "seconds": a.timeout,
                                   "error": f"no result after {a.timeout:.0f}s (hang)"}
    rec["phase"] = "done"
    rec["end"] = time.time()
    _write(out, rank, rec)
    from engine_stop import end_process

    end_process(0)  # not sys.exit: it would wait for a hung collective's thread


if __name__ == "__main__":
    sys.exit(main())
