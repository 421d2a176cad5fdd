"""``labkit ...``: the command line, a thin shell over the Python API.

Every subcommand is a ``cmd_*`` function here (``runs``, ``jobs``, ``tools``) that parses nothing
itself, calls the library and prints; the library returns values and raises. Library modules
are imported only when their command runs, so ``labkit check`` stays fast. With ``--json``
stdout holds only the JSON document; progress and messages go to stderr.
Exit codes: 0 success, 2 invalid input (a ConfigError or a bad option), 1 any other labkit
error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence

from labkit.cli import classroom, jobs, runs, tools
from labkit.cli.common import for_cli_users
from labkit.errors import ConfigError, LabkitError

FIRST_STEPS = """first steps:
  labkit doctor;  labkit new demo --preset tiny --tp 2 --pp 2
  labkit plan runs/demo/config.json;  labkit submit runs/demo/config.json --wait"""


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="labkit", description="labkit: plan, submit and read multi-node LLM training runs.",
        epilog=FIRST_STEPS, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND",
                            title="commands (labkit COMMAND --help for its options)")
    runs.add_parsers(sub)
    jobs.add_parsers(sub)
    tools.add_parsers(sub)
    classroom.add_parsers(sub)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help (0) or a bad option (2): argparse has said why
        return e.code if isinstance(e.code, int) else 2
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                return int(args.func(args) or 0)
            finally:  # a library warning (e.g. TP across nodes) as one line, not a source excerpt
                for msg in dict.fromkeys(str(w.message) for w in caught):
                    print(f"labkit {args.command}: warning: {msg}", file=sys.stderr)
    except ConfigError as e:
        print(f"labkit {args.command}: {for_cli_users(str(e))}", file=sys.stderr)
        return 2
    except LabkitError as e:
        print(f"labkit {args.command}: {for_cli_users(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
