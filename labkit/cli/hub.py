"""``labkit class hub up|down|status`` (the class's JupyterHub, root: ``labkit.hub``),
``labkit class handout`` (``labkit.handout``) and ``labkit class plan`` (``labkit.classplan``)."""

from __future__ import annotations

import argparse
import os

from labkit import minicluster
from labkit.classplan import class_plan
from labkit.cli.common import add_cluster, add_json, int_at_least, say, show_json, site_of
from labkit.handout import handout, handout_for
from labkit.site import CLUSTER_ENV


def add_parsers(csub: argparse._SubParsersAction) -> None:
    """``class hub ...`` under ``labkit class``."""
    p = csub.add_parser("hub", help="the class's JupyterHub: up, down, status (root)",
                        description="JupyterHub with batchspawner's SlurmSpawner: students log "
                                    "in with their Unix password and each one's JupyterLab "
                                    "runs as a Slurm job of theirs on a compute node, with "
                                    "LABKIT_CLUSTER set to the site. Config: code/hub/.")
    hsub = p.add_subparsers(dest="hub_action", required=True, metavar="ACTION")
    up = hsub.add_parser("up", help="start the hub (root)")
    up.add_argument("--cluster", metavar="SITE.yaml",
                    help="the class's site profile, readable by the students (default: "
                         "$LABKIT_CLUSTER)")
    up.add_argument("--config", metavar="FILE.py",
                    help="your copy of a hub config (default: code/hub/minicluster_config.py "
                         "while the mini-cluster is up, else code/hub/slurm_config.py)")
    up.add_argument("--ip", default="127.0.0.1",
                    help="the address students open (default 127.0.0.1; 0.0.0.0: all)")
    up.add_argument("--port", type=int_at_least(1), default=8000, help="its port (default 8000)")
    up.add_argument("--group", metavar="UNIX_GROUP",
                    help="only this Unix group's members may log in (the class)")
    up.add_argument("--cull-after", type=int_at_least(60), default=3600, metavar="S",
                    help="end a server nobody used for S seconds (default 3600)")
    up.add_argument("--notebook-dir", default="~/labkit-notebooks",
                    help="each student's JupyterLab root, where the hand-out goes "
                         "(default ~/labkit-notebooks)")
    add_json(up, "the hub's status")
    up.set_defaults(func=cmd_hub_up)
    down = hsub.add_parser("down", help="stop the hub and every student's server job (root)")
    add_json(down, "the server jobs cancelled after the hub stopped")
    down.set_defaults(func=cmd_hub_down)
    st = hsub.add_parser("status", help="the hub's URL, admin token file and server jobs")
    add_json(st, '{"up", "url", "api_token_file", "servers", ...}')
    st.set_defaults(func=cmd_hub_status)

    h = csub.add_parser("handout", help="copy the student notebooks into each student's folder",
                        description="Copy the student notebooks (never notebooks/solutions/) "
                                    "into your folder (--to), or as root into each of "
                                    "--students' own. A notebook the student edited is never "
                                    "overwritten: a newer version goes beside it, named "
                                    "NN_name.handout-YYYYMMDD.ipynb.")
    h.add_argument("--to", default="~/labkit-notebooks", metavar="DIR",
                   help="the folder (default ~/labkit-notebooks, the hub's notebook root)")
    h.add_argument("--students", nargs="+", metavar="USER",
                   help="root: hand out to these Unix users, as each of them")
    add_json(h, "what was copied, per file")
    h.set_defaults(func=cmd_handout)

    pl = csub.add_parser("plan", help="node-hours, peak nodes and disk for N students",
                         description="From a rehearsal of the series on the site (labkit "
                                     "regress --cluster SITE; make lab here): per notebook, "
                                     "node-hours per student and for the class (nodes x wall "
                                     "time, queue wait included), the most nodes one run "
                                     "holds, and the disk a student's runs take (checkpoints "
                                     "apart); the peak of nodes if everyone runs together.")
    pl.add_argument("--students", type=int_at_least(1), required=True, metavar="N")
    add_cluster(pl, "the class")
    pl.add_argument("--runs", metavar="DIR",
                    help="the rehearsal's run root (default: yours on the site, else runs/)")
    add_json(pl, "the plan")
    pl.set_defaults(func=cmd_plan)


def _show(doc: dict, as_json: bool) -> None:
    if as_json:
        show_json(doc)
        return
    if not doc["up"]:
        say("hub: down")
        return
    say(f"hub: up at {doc['url']} (pid {doc['pid']}; admin token in {doc['api_token_file']}, "
        f"root only)")
    say(f"  config {doc['config']}; site {doc['cluster']}; log {doc['log']}")
    for user, job in sorted(doc["servers"].items()):
        say(f"  {user:16} server job {job['job_id']} {job['state']}")


def cmd_hub_up(args: argparse.Namespace) -> int:
    from labkit.hub import hub_up  # the hub's start-up reads Slurm: off the CLI's start-up

    site = args.cluster or os.environ.get(CLUSTER_ENV)  # the students' servers get it as is
    _show(hub_up(site, minicluster=minicluster.is_up(), config=args.config, port=args.port,
                 ip=args.ip, group=args.group, cull_s=args.cull_after,
                 notebook_dir=args.notebook_dir), args.json)
    return 0


def cmd_hub_down(args: argparse.Namespace) -> int:
    from labkit.hub import hub_down  # the hub's start-up reads Slurm: off the CLI's start-up

    left = hub_down()
    if args.json:
        show_json({"cancelled": left})
    else:
        say(f"hub down{'; cancelled the server jobs it left: ' + ', '.join(left) if left else ''}")
    return 0


def cmd_hub_status(args: argparse.Namespace) -> int:
    from labkit.hub import hub_status  # the hub's start-up reads Slurm: off the CLI's start-up

    _show(hub_status(), args.json)
    return 0


def cmd_handout(args: argparse.Namespace) -> int:
    if args.students:
        doc = handout_for(args.students, args.to)
    else:
        doc = [c.to_dict() for c in handout(args.to)]
    if args.json:
        show_json(doc)
        return 0
    for user, rows in (doc.items() if isinstance(doc, dict) else [(None, doc)]):
        for r in rows:
            if r["action"] not in ("same", "edited"):
                say(f"{user + ': ' if user else ''}{r['action']:7} {r['path']}")
        say(f"{user + ': ' if user else ''}{len(rows)} notebook(s) handed out "
            f"({sum(r['action'] in ('same', 'edited') for r in rows)} unchanged)")
    return 0


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB" if n < 1e10 else f"{n / 1e9:,.1f} GB"


def cmd_plan(args: argparse.Namespace) -> int:
    doc = class_plan(args.students, site_of(args), args.runs)
    if args.json:
        show_json(doc)
        return 0
    n = doc["students"]
    say(f"class plan: {n} students on {doc['site'] or 'this machine'}"
        f"{' (partition ' + doc['partition'] + ')' if doc['partition'] else ''}, from the "
        f"rehearsal's runs in {doc['runs_from']}")
    say(f"{'NB':3} {'RUNS':>4} {'NODES':>5} {'NODE-H/STUDENT':>15} {'NODE-H/CLASS':>13} "
        f"{'DISK/STUDENT':>13} {'CHECKPOINTS':>12}")
    for r in doc["notebooks"]:
        say(f"{r['notebook']:3} {r['runs']:>4} {r['max_nodes']:>5} {r['node_hours']:>15.3f} "
            f"{r['node_hours'] * n:>13.2f} {_mb(r['disk_bytes']):>13} "
            f"{_mb(r['checkpoint_bytes']):>12}"
            + (f"  (not ended: {', '.join(r['unfinished'])})" if r["unfinished"] else ""))
    say(f"all {'':>10} {doc['node_hours_per_student']:>15.3f} {doc['node_hours_class']:>13.2f} "
        f"{_mb(doc['disk_bytes_per_student']):>13} {_mb(doc['checkpoint_bytes_per_student']):>12}")
    say(f"peak: {doc['peak_nodes']} nodes at once if all {n} run notebook {doc['peak_notebook']} "
        f"together{'' if doc['exclusive'] else ' (whole nodes; jobs that share nodes need fewer)'}"
        f", besides {doc['server_jobs']} JupyterLab server jobs (1 CPU each)")
    say(f"disk: {_mb(doc['disk_bytes_class'])} for the class, of which checkpoints "
        f"{_mb(doc['checkpoint_bytes_per_student'] * n)} (`labkit clean --keep-last 1` frees them)")
    return 0
