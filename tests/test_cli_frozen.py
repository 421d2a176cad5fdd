"""The command line is frozen: its subcommands, their options and positionals are compared with
``tests/golden/cli.txt``, so a renamed or dropped flag is a decision, not an accident.

Accept an intended change with ``LABKIT_REGEN_GOLDEN=1 .venv/bin/python -m pytest
tests/test_cli_frozen.py``, then review the diff of the golden file and commit it (and update
README.md's command table).
"""

from __future__ import annotations

import argparse

from labkit.cli import build_parser


def _subcommands(ap: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _describe(action: argparse.Action) -> str:
    if action.option_strings:
        words = ", ".join(action.option_strings)
        if action.nargs != 0:  # takes a value
            words += f" {action.metavar or action.dest.upper()}"
    else:
        words = f"{action.metavar or action.dest} (positional, nargs={action.nargs or 1})"
    if action.choices:
        words += " {" + ",".join(str(c) for c in action.choices) + "}"
    return words


def frozen_text() -> str:
    lines = []
    for name, p in _subcommands(build_parser()).items():
        lines.append(f"labkit {name}")
        lines += [f"  {_describe(a)}" for a in p._actions if not isinstance(a, argparse._HelpAction)]
    return "\n".join(lines) + "\n"


def test_the_command_line_is_frozen(assert_golden):
    assert_golden("cli.txt", frozen_text())


def test_every_option_and_positional_has_help_text():
    missing = [f"labkit {name}: {_describe(a)}"
               for name, p in _subcommands(build_parser()).items() for a in p._actions
               if not (a.help or "").strip()]
    assert not missing, "options without help text:\n" + "\n".join(missing)


def test_a_site_profile_is_always_cluster_and_profile_is_only_cpu_or_gpu():
    for name, p in _subcommands(build_parser()).items():
        for a in p._actions:
            if "--profile" in a.option_strings:
                assert set(a.choices) == {"cpu", "gpu"}, name
            if "--cluster" in a.option_strings:
                assert "SITE.yaml" in a.metavar and "LABKIT_CLUSTER" in a.help, name
