"""Commands for a class on a shared cluster: ``clean`` (a student's own runs) and ``class``
(the instructor's view: ``status``, ``cancel --all``, ``clean``)."""

from __future__ import annotations

import argparse

from labkit.classroom import cancel_all, class_cancel_all, class_clean, class_status, clean
from labkit.cli import hub
from labkit.cli.common import add_cluster, add_json, int_at_least, say, show_json, site_of, warn

_keep_last = int_at_least(0)


def _clean_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true",
                   help="only list what would be removed, and its size")
    p.add_argument("--keep-last", type=_keep_last, default=0, metavar="N",
                   help="leave the newest N finished runs as they are (default: 0)")
    p.add_argument("--runs", action="store_true",
                   help="remove whole run directories, not only their checkpoints/")
    add_cluster(p, "the run root to clean")
    add_json(p, "what was (or would be) removed")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("clean", help="free your finished runs' checkpoints (never a running one)",
                       description="Remove checkpoints/ (with --runs: the whole directory) of "
                                   "your own finished runs, under the run root and the "
                                   "cluster's per-user run root; a PENDING or RUNNING run is "
                                   "never touched. Prints what it freed.")
    _clean_options(p)
    p.set_defaults(func=cmd_clean)

    p = sub.add_parser("class", help="the instructor's view of a class: status, cancel, clean",
                       description="Every student's labkit runs under the cluster profile's "
                                   "run_root (e.g. /shared/labkit/{user}/runs). status needs "
                                   "read access to it; cancel and clean need root.")
    csub = p.add_subparsers(dest="action", required=True, metavar="ACTION",
                            help="status (read access), cancel --all or clean (root)")
    c = csub.add_parser("status", help="every student's jobs, progress and last failure",
                        description="Per student: jobs pending, running and finished, each "
                                    "run's iteration, the last notebook reached, exercise "
                                    "checks recorded, and the newest failure's diagnosis.")
    add_cluster(c, "the class")
    add_json(c, "one entry per student")
    c.set_defaults(func=cmd_class_status)
    c = csub.add_parser("cancel", help="cancel every student's labkit jobs (root)",
                        description="Cancel every PENDING or RUNNING labkit job of every "
                                    "student (only labkit's jobs; other Slurm jobs are left "
                                    "alone). Needs root.")
    c.add_argument("--all", action="store_true", required=True,
                   help="required: says that every student's jobs are meant")
    add_cluster(c, "the class")
    add_json(c, "the jobs cancelled")
    c.set_defaults(func=cmd_class_cancel)
    c = csub.add_parser("clean", help="free every student's finished checkpoints (root)",
                        description="labkit clean for every student (root, unless --dry-run).")
    _clean_options(c)
    c.set_defaults(func=cmd_class_clean)
    hub.add_parsers(csub)


def _show_freed(freed: list, as_json: bool, dry_run: bool) -> None:  # list of Freed
    if as_json:
        show_json({"dry_run": dry_run, "freed_bytes": sum(f.bytes for f in freed),
                   "removed": [f.to_dict() for f in freed]})
        return
    verb = "would remove" if dry_run else "removed"
    for f in freed:
        who = f"{f.user}: " if f.user else ""
        say(f"{verb} {who}{f.path} ({f.bytes / 1e6:.1f} MB)")
    say(f"{'would free' if dry_run else 'freed'} {sum(f.bytes for f in freed) / 1e6:.1f} MB "
        f"in {len(freed)} place(s)")


def cmd_clean(args: argparse.Namespace) -> int:
    freed = clean(site_of(args), dry_run=args.dry_run, keep_last=args.keep_last,
                  whole_runs=args.runs)
    _show_freed(freed, args.json, args.dry_run)
    return 0


def cmd_class_status(args: argparse.Namespace) -> int:
    from labkit.hub import with_servers  # the hub's servers: squeue, off the CLI's start-up

    site = site_of(args)
    rows = with_servers(class_status(site), site.slurm_conf)
    if args.json:
        show_json(rows)
        return 0
    say(f"{'USER':16} {'PEND':>4} {'RUN':>4} {'DONE':>4} {'NB':>3} {'EXERCISES':9}  LAST FAILURE")
    for r in rows:
        ex = r["exercises"]
        exs = f"{ex['passed']}/{ex['total']}" if ex else "-"
        fail = r["last_failure"]
        fails = f"{fail['name']} {fail['state']}: {fail['diagnosis'] or '?'}" if fail else "-"
        j = r["jobs"]
        say(f"{r['user']:16} {j.get('PENDING', 0):>4} {j.get('RUNNING', 0):>4} "
            f"{j.get('finished', 0):>4} {r['last_notebook'] or '-':>3} {exs:9}  {fails}")
        if r.get("server"):
            say(f"{'':16}   {r['server']['job_id']} JupyterLab server {r['server']['state']}")
        for run in r["runs"]:
            if run["state"] in ("PENDING", "RUNNING"):
                it = (f" iteration {run['iteration']}/{run['train_iters']}"
                      if run["iteration"] is not None else "")
                say(f"{'':16}   {run['job_id']} {run['name']} {run['state']}{it}")
    if not rows:
        say("(no student has a run under the class run root yet)")
    return 0


def _show_cancelled(rows: list[dict], as_json: bool) -> None:
    if as_json:
        show_json(rows)
        return
    for r in rows:
        say(f"cancelled {r['backend']} job {r['job_id']} ({r['name']}, {r['user']}), "
            f"was {r['state']}")
    say(f"{len(rows)} job(s) cancelled")


def cmd_class_cancel(args: argparse.Namespace) -> int:
    _show_cancelled(class_cancel_all(site_of(args)), args.json)
    return 0


def cmd_class_clean(args: argparse.Namespace) -> int:
    freed = class_clean(site_of(args), dry_run=args.dry_run, keep_last=args.keep_last,
                        whole_runs=args.runs)
    _show_freed(freed, args.json, args.dry_run)
    return 0


def cmd_cancel_all(args: argparse.Namespace) -> int:
    """``labkit cancel --all``: the caller's own PENDING/RUNNING labkit jobs."""
    rows = cancel_all(site_of(args))
    if not rows and not args.json:
        warn("no labkit job of yours is pending or running")
    _show_cancelled(rows, args.json)
    return 0
