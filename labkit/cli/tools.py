"""Commands around the runs: ``parse``, ``doctor``, ``cluster``, ``regress``."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from labkit import minicluster, regress
from labkit.cli.common import (
    add_backend,
    add_cluster,
    add_json,
    for_cli_users,
    positive_int,
    say,
    show_json,
    warn,
)
from labkit.doctor import FAIL, doctor_json, render_table, run_doctor
from labkit.errors import LabkitError
from labkit.regress_baseline import measure_baseline
from labkit.run.attempts import Attempt, attempts
from labkit.run.attempts import summary as attempts_summary
from labkit.site import named_cluster


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("parse", help="read training logs: layout, iterations, NCCL, failures",
                       description="Parse training logs (Megatron-LM, Megatron-DeepSpeed, "
                                   "gpt-neox, DeepSpeed, NCCL, torchrun, Slurm). Several logs "
                                   "are reported one by one unless --one-run says they are "
                                   "parts of one run (e.g. per-rank logs).")
    p.add_argument("logs", nargs="+", metavar="LOG", help="a training log, e.g. runs/NAME/log.txt")
    p.add_argument("--one-run", action="store_true",
                   help="read several LOGs as parts of one run (one report)")
    add_json(p, "the parsed log (with several LOGs: an object keyed by path)")
    p.set_defaults(func=cmd_parse)

    p = sub.add_parser("doctor", help="preflight checks of this machine or cluster",
                       description="Preflight checks before a lab, each PASS, WARN or FAIL with "
                                   "a fix (SKIP where a check does not apply); exit 1 when any "
                                   "check FAILs.")
    add_cluster(p, "the Slurm checks and the probe job")
    p.add_argument("--backend", choices=["local", "slurm", "hostfile"],
                   help="probe the nodes with srun (slurm) or two local processes (local); "
                        "hostfile: the ssh, pdsh, port and interface checks of the profile's "
                        "hosts instead of the Slurm ones (default: hostfile for a profile "
                        "with hosts, else slurm when sinfo answers)")
    p.add_argument("--hostfile", metavar="FILE",
                   help="DeepSpeed-style hostfile: check passwordless ssh/pdsh to its hosts")
    p.add_argument("--nodes", type=positive_int, metavar="N",
                   help="nodes for the probe job (default: as many as the series' multi-node "
                        "runs use)")
    p.add_argument("--timeout", type=positive_int, default=120, metavar="S",
                   help="seconds to wait for the probe job, queue included; then its state and "
                        "queue reason are shown and it is cancelled (default: 120)")
    p.add_argument("--class", dest="for_class", action="store_true",
                   help="instructor: also check the per-user run roots and that --students "
                        "jobs fit the partition at once")
    p.add_argument("--students", type=positive_int, metavar="N",
                   help="with --class: the number of students")
    add_json(p, '{"checks": [{"name", "status", "detail", "fix"}]}')
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("cluster", help="a Slurm mini-cluster on this machine: up, down, status",
                       description="A real Slurm cluster on this machine: one slurmctld, one "
                                   "slurmd per node, each node in its own network namespace.")
    p.add_argument("action", choices=["up", "down", "status"],
                   help="up: start it (installs slurm-wlm and munge if missing); down: remove "
                        "everything up made; status: its nodes")
    p.add_argument("--nodes", type=positive_int, default=2, metavar="N",
                   help="up: number of nodes (default: 2)")
    p.add_argument("--cpus-per-node", type=positive_int, default=2, metavar="N",
                   help="up: CPUs of each node (default: 2)")
    p.add_argument("--rate", default="1gbit", metavar="RATE",
                   help="up: inter-node link rate for tc tbf (default: 1gbit)")
    add_json(p, "the status")
    p.set_defaults(func=cmd_cluster)

    p = sub.add_parser("regress", help="run the notebooks and compare with a baseline",
                       description="Run the solved notebooks with papermill, compare what they "
                                   "recorded with baselines/PROFILE.json and write a report; "
                                   "exit 1 on a regression or a failed notebook.")
    p.add_argument("notebooks", nargs="*", metavar="NOTEBOOK",
                   help="notebooks to run, e.g. 01 or 01_single_node (default: all)")
    p.add_argument("--profile", default="cpu", choices=["cpu", "gpu"],
                   help="cpu: tiny GPT on CPU processes; gpu: GPT-2 on GPUs (default: cpu)")
    add_backend(p, "slurm with a --cluster or $LABKIT_CLUSTER, else local")
    add_cluster(p, "the notebooks' Slurm jobs")
    p.add_argument("--baseline", metavar="FILE",
                   help="baseline to compare with (default: baselines/PROFILE.json); with "
                        "--write-baseline, the file to write")
    p.add_argument("--out", metavar="DIR",
                   help="where executed notebooks, metrics.json and report.md go "
                        "(default: runs/regress; an earlier one is moved aside)")
    p.add_argument("--write-baseline", metavar="METRICS_JSON", nargs="+",
                   help="run nothing: write a baseline from regress runs' metrics.json (several: "
                        "the timing limits come from their spread)")
    p.add_argument("--runs", type=positive_int, metavar="N",
                   help="run the series N times and write --baseline FILE from them, comparing "
                        "nothing (a site's first baseline; 3 or more: limits from their spread)")
    add_json(p, "the summary")
    p.set_defaults(func=cmd_regress)


# --- handlers ----------------------------------------------------------------------------------
def cmd_parse(args: argparse.Namespace) -> int:
    # labkit.logs brings pandas: off the CLI's start-up
    from labkit.logs import found_nothing, parse_log, summary

    missing = [p for p in args.logs if not Path(p).is_file()]
    if missing:
        what = {p: "a directory" if Path(p).is_dir() else "not a regular file (a FIFO, device "
                "or socket)" if Path(p).exists() else "no such log file" for p in missing}
        raise LabkitError("; ".join(f"{p}: {w}" for p, w in what.items()) + ". Pass the path of "
                          "a training log file (e.g. runs/<name>/log.txt).")
    if args.one_run and len(args.logs) > 1:
        parsed = {" + ".join(args.logs): parse_log([Path(p) for p in args.logs])}
    else:
        parsed = {p: parse_log(Path(p)) for p in args.logs}
    empty = [name for name, pl in parsed.items() if found_nothing(pl)]
    if empty:
        raise LabkitError(f"no training-log lines in {', '.join(empty)} (no line of NCCL, torch, "
                          f"DeepSpeed, Megatron/NeMo, Hugging Face, Slurm or CUDA): is it a log? "
                          f"Pass a training log, e.g. runs/<name>/log.txt; a run config is read "
                          f"by labkit check or labkit plan.")
    runs = {name: [] if args.one_run and len(args.logs) > 1 else _attempts(Path(name))
            for name in parsed}
    if args.json:
        docs = {name: {**pl.to_dict(), **({"attempts": [a.to_dict() for a in runs[name]]}
                                          if runs[name] else {})} for name, pl in parsed.items()}
        show_json(next(iter(docs.values())) if len(docs) == 1 else docs)
        return 0
    for i, (name, pl) in enumerate(parsed.items()):
        if len(parsed) > 1 or args.one_run:
            say(("\n" if i else "") + f"== {name}")
        say(for_cli_users(summary(pl)))
        if runs[name]:
            say(for_cli_users("attempts (Slurm ran this job more than once):\n"
                              + attempts_summary(runs[name])))
    return 0


_ATTEMPT_LINES = ("[job]", "***", "[labkit] stopped", "[labkit] resumed", "iteration")


def _attempts(path: Path) -> list[Attempt]:
    """The attempts of a requeued labkit Slurm job in its log (``labkit.run.attempts``); [] for
    any other log (its first 64 KiB name no attempt: the rest is not read)."""
    try:
        with open(path, "rb") as f:
            if b"[job] attempt " not in f.read(1 << 16):
                return []
            f.seek(0)
            kept = [ln for ln in (raw.decode(errors="replace") for raw in f)
                    if any(w in ln for w in _ATTEMPT_LINES)]
    except OSError:
        return []
    runs = attempts("".join(kept))
    return runs if len(runs) > 1 or any(a.reason != "completed" for a in runs) else []


def cmd_doctor(args: argparse.Namespace) -> int:
    results = run_doctor(args.cluster, hostfile=args.hostfile, nodes=args.nodes,
                         timeout_s=args.timeout, backend=args.backend, for_class=args.for_class,
                         students=args.students)
    if args.json:
        show_json(doctor_json(results))
    else:
        say(render_table(results, width=shutil.get_terminal_size((110, 20)).columns))
    return 1 if any(r.status == FAIL for r in results) else 0


def cmd_cluster(args: argparse.Namespace) -> int:
    if args.action == "up":
        minicluster.cluster_up(args.nodes, args.cpus_per_node, args.rate)
    elif args.action == "down":
        minicluster.cluster_down()
        say("mini-cluster down")
        return 0
    st = minicluster.cluster_status()
    if args.json:
        show_json(st)
    else:
        say(f"mini-cluster: {'up' if st['up'] else 'down'} (SLURM_CONF={st['slurm_conf']})")
        for n in st["nodes"]:
            say(f"  {n['name']:8} {n['addr']:12} {n['state']:8} cpus={n['cpus']}")
        if not st["up"]:
            warn("  start it with `sudo labkit cluster up`, or use the local backend")
    return 0 if st["up"] or args.action == "status" else 1


def cmd_regress(args: argparse.Namespace) -> int:
    if args.write_baseline:
        say(str(regress.write_baseline(args.write_baseline, args.baseline)))
        return 0
    # a site profile (--cluster or $LABKIT_CLUSTER) means the series runs there, on Slurm
    site = named_cluster(args.cluster)
    backend = args.backend or ("slurm" if site is not None else None)
    if args.runs is not None:
        say(str(measure_baseline(args.notebooks or None, args.runs, profile=args.profile,
                                 backend=backend, cluster=args.cluster, baseline=args.baseline,
                                 out=args.out)))
        return 0
    doc = regress.regress(args.notebooks or None, profile=args.profile, backend=backend,
                          baseline=args.baseline, out=args.out,
                          parameters={"cluster": args.cluster} if args.cluster else None)
    if args.json:
        show_json(doc)
    else:
        say(regress.render_table([regress.Row(**x) for x in doc["rows"]]))
        for nb in doc["notebooks"]:
            if nb["error"]:
                warn(f"FAILED: {nb['error']}")
        say(f"\nreport: {Path(doc['out']) / 'report.md'}")
    return 0 if doc["ok"] else 1
