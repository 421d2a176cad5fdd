"""What the subcommands share: the common options and the way results are shown."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from labkit.site import ClusterProfile, resolve_cluster

# The library speaks Python (keyword arguments); a command-line user types options.
_CLI_WORDS = {"resume=True": "--resume", "overwrite=True": "--overwrite",
              "backend='local'": "--backend local", "backend='slurm'": "--backend slurm",
              "backend='hostfile'": "--backend hostfile"}


def for_cli_users(message: str) -> str:
    """A library message with its Python spellings (``resume=True``) turned into options."""
    for py, flag in _CLI_WORDS.items():
        message = message.replace(py, flag)
    return message


def add_json(p: argparse.ArgumentParser, what: str = "the result") -> None:
    p.add_argument("--json", action="store_true",
                   help=f"print only {what} as JSON on stdout (progress and messages go to stderr)")


def add_cluster(p: argparse.ArgumentParser, what: str = "Slurm jobs") -> None:
    p.add_argument("--cluster", metavar="SITE.yaml|NAME",
                   help=f"the site profile for {what}: a YAML file or a name under code/clusters/ "
                        "(default: $LABKIT_CLUSTER, else the mini-cluster's when it is up, "
                        "else generic Slurm defaults)")


def site_of(args: argparse.Namespace) -> ClusterProfile:
    """The command's site, resolved once here and passed down: ``--cluster`` where the command
    has it, else $LABKIT_CLUSTER, else the mini-cluster's while it is up, else generic defaults."""
    return resolve_cluster(getattr(args, "cluster", None))


def add_backend(p: argparse.ArgumentParser, default: str = "the config's backend") -> None:
    p.add_argument("--backend", choices=["local", "slurm", "hostfile"],
                   help=f"local: processes on this machine; slurm: sbatch; hostfile: the "
                        f"--cluster profile's hosts over ssh (pdsh or deepspeed) "
                        f"(default: {default})")


def int_at_least(minimum: int):
    """An argparse type: a whole number of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum} (got {n})")
        return n

    return parse


positive_int = int_at_least(1)


def show_json(doc: Any) -> None:
    # Written in ~1 MB pieces: json.dump writes many tiny chunks (minutes on a big parse) and
    # json.dumps holds every piece of a big document at once (hundreds of MB for a 500 MB log).
    buf: list[str] = []
    size = 0
    encoder = json.JSONEncoder(indent=2, allow_nan=False, default=str)
    for piece in encoder.iterencode(doc):
        buf.append(piece)
        size += len(piece)
        if size >= 1 << 20:
            sys.stdout.write("".join(buf))
            buf, size = [], 0
    buf.append("\n")
    sys.stdout.write("".join(buf))


def say(text: str = "") -> None:
    """A line for the user on stdout."""
    print(text)


def warn(text: str) -> None:
    """A line for the user on stderr (next to the JSON on stdout, or before an error exit)."""
    print(text, file=sys.stderr)
