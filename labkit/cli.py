"""``labkit ...``: a thin shell over the Python API (DESIGN.md section 5).

Each subcommand parses its arguments here and calls one function of the module that owns it;
modules are imported only when their command runs, so ``labkit check`` stays fast. With
``--json`` stdout holds only the JSON document; progress and logs go to stderr.
Exit codes: 0 success, 2 invalid input (a ConfigError), 1 any other labkit error.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence

from labkit.errors import ConfigError, LabkitError

# subcommand -> "module:function"; the function takes the parsed args and returns an exit code.
HANDLERS = {
    "check": "labkit.cli:cmd_check",
    "plan": "labkit.planner.plan:cli_plan",
    "render": "labkit.render:cli_render",
    "parse": "labkit.logs:cli_parse",
    "submit": "labkit.backends:cli_submit",
    "status": "labkit.backends:cli_status",
    "cancel": "labkit.backends:cli_cancel",
    "logs": "labkit.backends:cli_logs",
    "cluster": "labkit.minicluster:cli_cluster",
    "regress": "labkit.regress:cli_regress",
    "doctor": "labkit.doctor.preflight:cli_doctor",
}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="labkit", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("check", help="validate a RunConfig JSON (exit 0 valid, 2 invalid)")
    p.add_argument("config")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("plan", help="memory / FLOPs / bubble of a config, or all layouts")
    p.add_argument("config", nargs="?")
    p.add_argument("--world-size", type=int)
    p.add_argument("--nodes", type=int)
    p.add_argument("--gpus-per-node", type=int)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--gpu-memory-gb", type=float)
    p.add_argument("--micro-batch-size", type=int)
    p.add_argument("--global-batch-size", type=int)
    p.add_argument("--device", choices=["cpu", "cuda"], help="layouts: default cpu")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], help="layouts: default fp32")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("render", help="print the job script of a config")
    p.add_argument("config")
    p.add_argument("--backend", choices=["local", "slurm"])
    p.add_argument("--profile", help="cluster profile YAML (Slurm)")
    p.add_argument("--hostfile", action="store_true", help="print a DeepSpeed-style hostfile")

    p = sub.add_parser("parse", help="parse training logs into the JSON contract")
    p.add_argument("logs", nargs="+")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("submit", help="submit a run (local backend or Slurm)")
    p.add_argument("config")
    p.add_argument("--backend", choices=["local", "slurm"])
    p.add_argument("--profile", help="cluster profile YAML (Slurm)")
    p.add_argument("--wait", action="store_true")
    p.add_argument("--timeout", type=float)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("status", help="this labkit's own jobs")
    p.add_argument("job", nargs="?")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("cancel", help="cancel one of this labkit's jobs (and nothing else)")
    p.add_argument("job")

    p = sub.add_parser("logs", help="print (or follow) a job's log")
    p.add_argument("job")
    p.add_argument("-f", "--follow", action="store_true")

    p = sub.add_parser("cluster", help="the local Slurm mini-cluster (root)")
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--cpus-per-node", type=int, default=2)
    p.add_argument("--rate", default="1gbit", help="inter-node link rate for tc tbf")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("regress", help="run the notebook series and compare with a baseline")
    p.add_argument("notebooks", nargs="*")
    p.add_argument("--profile", default="cpu", choices=["cpu", "gpu"])
    p.add_argument("--backend", choices=["local", "slurm"])
    p.add_argument("--baseline")
    p.add_argument("--out")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("doctor", help="preflight checks of this machine / cluster")
    p.add_argument("--profile", help="cluster profile YAML")
    p.add_argument("--backend", choices=["local", "slurm"],
                   help="probe nodes with srun or locally (default: srun when sinfo answers)")
    p.add_argument("--hostfile", help="DeepSpeed-style hostfile: check ssh/pdsh to its hosts")
    p.add_argument("--nodes", type=int, help="nodes for the probe job (default: all up, <= 8)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per probe phase")
    p.add_argument("--json", action="store_true")
    return ap


def cmd_check(args: argparse.Namespace) -> int:
    from labkit.config import RunConfig

    try:
        cfg = RunConfig.from_json(args.config)
    except ConfigError as e:
        if args.json:
            print(json.dumps({"valid": False, "errors": e.violations}, indent=2))
        else:
            print(f"INVALID {args.config}\n{e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"valid": True, "errors": []}, indent=2))
    else:
        print(f"OK {args.config}\n{cfg.summary()}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module, func = HANDLERS[args.command].split(":")
    try:
        handler = getattr(importlib.import_module(module), func)
        return int(handler(args) or 0)
    except ConfigError as e:
        print(f"labkit {args.command}: {e}", file=sys.stderr)
        return 2
    except LabkitError as e:
        print(f"labkit {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except (ModuleNotFoundError, AttributeError) as e:
        if module in str(e) or func in str(e):
            print(f"labkit {args.command}: not available in this version ({e})", file=sys.stderr)
            return 1
        raise
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
