"""Collective bandwidth benchmark: an nccl-tests analog in PyTorch (NCCL on GPUs, gloo on CPUs).

Measures all-reduce, all-gather and reduce-scatter over a range of message sizes and reports
algorithm bandwidth and bus bandwidth exactly as nccl-tests defines them:

    algbw = size / time                        (size: the whole buffer, in bytes)
    busbw = algbw * 2 (n-1) / n                 all-reduce
    busbw = algbw * (n-1) / n                   all-gather, reduce-scatter

busbw is the number to compare with the link's speed: it does not depend on the number of ranks.

Run it (one node, 4 processes, CPU):

    torchrun --nproc_per_node=4 code/allreduce_bench.py -b 1K -e 16M -f 4

Two nodes (run the same line on each node, or let Slurm's srun start it):

    torchrun --nnodes=2 --nproc_per_node=2 --rdzv_backend=c10d --rdzv_endpoint=HEAD:29500 \\
        code/allreduce_bench.py --scopes world,intra,inter --json-out runs/bw/busbw.jsonl

`--scopes` picks who talks: `world` (every rank), `intra` (the ranks of one node: loopback, the
NVLink of a CPU box) and `inter` (one rank per node: the network between nodes). Rank 0 prints
a table in nccl-tests' column layout; `--json-out` also writes one JSON object per row, which
`labkit.measured.comm.read_busbw` turns into a DataFrame for `labkit.measured.comm.plot_busbw`.

Inside a labkit job (local backend or Slurm), `labkit.measured.comm.submit_bench(...)` submits this
script as the job's program with these arguments, `--json-out` pointing into the run directory.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from datetime import timedelta

# torch is imported in main(), after the arguments are checked: a typo fails in milliseconds.
torch = dist = None

OPS = ("all_reduce", "all_gather", "reduce_scatter")
SCOPES = ("world", "intra", "inter")
DTYPES = {"float32": "float", "float16": "half", "bfloat16": "bfloat16"}  # name -> nccl-tests
# nccl-tests' bus-bandwidth factor per collective, as a function of the group size n.
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n,
              "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n}


def parse_size(text: str) -> int:
    """'8', '1K', '64M', '1G' -> bytes (powers of 1024, as nccl-tests' -b/-e)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().rstrip("B")
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(t)


def message_sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    sizes, s = [], max(1, min_bytes)
    while s <= max_bytes:
        sizes.append(s)
        s *= factor
    return sizes


def build_groups(scope: str, nodes: list[str]) -> tuple[list[list[int]], list[int] | None]:
    """Rank lists for a scope (every group), and the one this rank belongs to."""
    rank = dist.get_rank()
    order = list(dict.fromkeys(nodes))  # node keys in first-seen order
    by_node = [[r for r, n in enumerate(nodes) if n == key] for key in order]
    if scope == "world":
        groups = [list(range(len(nodes)))]
    elif scope == "intra":
        groups = by_node
    else:  # inter: the i-th rank of every node
        depth = min(len(g) for g in by_node)
        groups = [[g[i] for g in by_node] for i in range(depth)]
    mine = next((g for g in groups if rank in g), None)
    return groups, mine


def run_op(op: str, out: torch.Tensor, inp: torch.Tensor, group) -> None:
    if op == "all_reduce":
        dist.all_reduce(out, group=group)
    elif op == "all_gather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(out, inp, group=group)
    else:
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        scatter(out, inp, group=group)


def buffers(op: str, count: int, n: int, dtype, device, fill: float):
    """(out, inp) for a collective whose whole buffer holds `count` elements."""
    if op == "all_reduce":
        return torch.full((count,), fill, dtype=dtype, device=device), None
    if op == "all_gather":
        return (torch.empty(count, dtype=dtype, device=device),
                torch.full((count // n,), fill, dtype=dtype, device=device))
    return (torch.empty(count // n, dtype=dtype, device=device),
            torch.full((count,), fill, dtype=dtype, device=device))


def count_wrong(op: str, count: int, group_ranks: list[int], dtype, device, group) -> int:
    """Run the collective once on known values; the number of elements that came back wrong."""
    n, me = len(group_ranks), group_ranks.index(dist.get_rank())
    out, inp = buffers(op, count, n, dtype, device, fill=float(me + 1))
    run_op(op, out, inp, group)
    if op == "all_gather":  # block j holds rank j's fill value j+1
        expected = torch.arange(1, n + 1, dtype=dtype, device=device).repeat_interleave(count // n)
    else:  # sums of 1..n
        expected = torch.full_like(out, n * (n + 1) / 2)
    return int((out != expected).sum().item())


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(op, count, group_ranks, group, dtype, device, iters, warmup) -> tuple[float, int]:
    """Average time of one collective in microseconds on this rank, and the #wrong count."""
    wrong = count_wrong(op, count, group_ranks, dtype, device, group)
    # Zeros keep repeated in-place sums finite; the cost does not depend on the values.
    out, inp = buffers(op, count, len(group_ranks), dtype, device, fill=0.0)
    for _ in range(warmup):
        run_op(op, out, inp, group)
    sync(device)
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        run_op(op, out, inp, group)
    sync(device)
    return (time.perf_counter() - t0) / iters * 1e6, wrong


def world_mean(value: float, device) -> float:
    # Every rank times its own group; like nccl-tests' default (-a 1) we report the average.
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def parse_args(argv=None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-b", "--min-bytes", default="1K", help="smallest message (8, 1K, 64M)")
    ap.add_argument("-e", "--max-bytes", default="4M", help="largest message")
    ap.add_argument("-f", "--step-factor", type=int, default=4, help="multiply size by this")
    ap.add_argument("-n", "--iters", type=int, default=10, help="timed iterations per size")
    ap.add_argument("-w", "--warmup-iters", type=int, default=2)
    ap.add_argument("--ops", default="all_reduce", help=f"comma list of {','.join(OPS)}")
    ap.add_argument("--scopes", default="world", help=f"comma list of {','.join(SCOPES)}")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"],
                    help="auto: nccl when CUDA is available, else gloo")
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="seconds before a stuck collective is an error (process group timeout)")
    ap.add_argument("--json-out", help="also write one JSON object per row to this file")
    ap.add_argument("--nccl-debug", action="store_true",
                    help="with NCCL: NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET (unless set) so "
                         "the log shows the transport of every channel (P2P, SHM, NET)")
    args = ap.parse_args(argv)
    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    args.scopes = [s.strip() for s in args.scopes.split(",") if s.strip()]
    bad = [o for o in args.ops if o not in OPS] + [s for s in args.scopes if s not in SCOPES]
    if bad:
        ap.error(f"unknown op/scope {bad}; ops are {list(OPS)}, scopes are {list(SCOPES)}")
    if args.step_factor < 2:
        ap.error(f"--step-factor {args.step_factor} must be >= 2")
    return args


def nccl_debug_env(env: dict[str, str]) -> dict[str, str]:
    """NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=INIT,NET, except where ``env`` sets them already.

    NCCL prints a channel's transport (``Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read``, ``via
    SHM/direct/direct``, ``[send] via NET/IB/0``) at INFO level in its INIT subsystem (with P2P,
    SHM or NET); NET adds which network it picked (``NET/IB : Using [0]mlx5_0:1``).
    """
    return {k: env.get(k) or v for k, v in (("NCCL_DEBUG", "INFO"),
                                             ("NCCL_DEBUG_SUBSYS", "INIT,NET"))}


def main(argv=None) -> int:
    global torch, dist
    args = parse_args(argv)
    if "RANK" not in os.environ:
        sys.exit("allreduce_bench: start it with torchrun (RANK/WORLD_SIZE are not set), e.g. "
                 "torchrun --nproc_per_node=2 code/allreduce_bench.py")
    import torch
    import torch.distributed as dist
    backend = args.backend if args.backend != "auto" else (
        "nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl" and args.nccl_debug:
        os.environ.update(nccl_debug_env(os.environ))  # read by NCCL when it initialises
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype, type_name = getattr(torch, args.dtype), DTYPES[args.dtype]
    esize = torch.tensor([], dtype=dtype).element_size()

    # Which node every rank is on: torchrun's node rank, else the host name.
    host = socket.gethostname()
    key = f"node{os.environ['GROUP_RANK']}" if "GROUP_RANK" in os.environ else host
    info: list = [None] * world
    dist.all_gather_object(info, (key, host, os.getpid()))
    nodes = [i[0] for i in info]
    n_nodes = len(set(nodes))
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"# labkit allreduce_bench: backend {backend}, world size {world}, {n_nodes} node(s), "
        f"dtype {args.dtype}, iters {args.iters}, warmup {args.warmup_iters}")
    for r, (k, h, pid) in enumerate(info):
        say(f"#  Rank {r:2d} Group  0 Pid {pid:6d} on {h} ({k}) device {device.type}")
    jsonl = open(args.json_out, "a") if (rank == 0 and args.json_out) else None

    for scope in args.scopes:
        groups, mine = build_groups(scope, nodes)
        # new_group is collective: every rank creates every group, in the same order.
        handles = [dist.new_group(g) if len(g) < world else dist.group.WORLD for g in groups]
        n = len(mine) if mine else 1
        if n < 2 or any(len(g) != n for g in groups):
            say(f"# skipping scope {scope}: group sizes {[len(g) for g in groups]} (needs >= 2 "
                f"ranks in every group; intra needs >1 rank per node, inter needs >1 node)")
            continue
        group = handles[groups.index(mine)]
        for op in args.ops:
            say(f"#\n# op={op} scope={scope} group_size={n} groups={len(groups)} "
                f"nodes={n_nodes} world_size={world} backend={backend} dtype={args.dtype}")
            say("#       size         count      type   redop    root     time   algbw   busbw"
                " #wrong\n#        (B)    (elements)                               (us)  (GB/s)"
                "  (GB/s)")
            busbws = []
            for size in message_sizes(parse_size(args.min_bytes), parse_size(args.max_bytes),
                                      args.step_factor):
                count = max(n, size // esize // n * n)  # whole buffer, divisible by n
                t_us, wrong = measure(op, count, mine, group, dtype, device, args.iters,
                                      args.warmup_iters)
                t_us = world_mean(t_us, device)
                wrong = int(world_mean(wrong, device) * world)
                nbytes = count * esize
                algbw = nbytes / t_us / 1e3  # GB/s (1e9 bytes per second)
                busbw = algbw * BUS_FACTOR[op](n)
                busbws.append(busbw)
                redop = "sum" if op != "all_gather" else "none"
                say(f"{nbytes:12d}  {count:12d}  {type_name:>8s}  {redop:>6s}  {-1:6d}  "
                    f"{t_us:7.1f}  {algbw:6.3f}  {busbw:6.3f}  {wrong:5d}")
                if jsonl:
                    jsonl.write(json.dumps({
                        "op": op, "scope": scope, "group_size": n, "groups": len(groups),
                        "nodes": n_nodes, "world_size": world, "backend": backend,
                        "dtype": args.dtype, "size_bytes": nbytes, "count": count,
                        "time_us": round(t_us, 3), "algbw_gbps": algbw, "busbw_gbps": busbw,
                        "wrong": wrong}) + "\n")
            say(f"# Avg bus bandwidth    : {sum(busbws) / max(1, len(busbws)):.4f} GB/s")
    if jsonl:
        jsonl.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from engine_stop import end_process

    end_process(main())
