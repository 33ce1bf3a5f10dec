"""Command-line interface: ``python -m pipeline <subcommand> ...``.

Each subcommand lives in its own module under ``pipeline/cli/`` and exposes

* ``HELP: str`` - one line for ``--help``;
* ``add_arguments(parser: argparse.ArgumentParser) -> None``;
* ``run(args: argparse.Namespace) -> int`` - the exit status.

To add a subcommand, write the module and append its name to :data:`SUBCOMMANDS`.

Every user error exits with status 1 and one ``error: ...`` line on stderr: usage errors
too (after that subcommand's usage; a misspelt option gets the closest one as a hint),
as kcat does. ``-L`` before any subcommand is kcat's metadata mode (``metadata``).
Subcommand modules are imported lazily (only the one being run), so a heavy import in one
(trio, pyspark, ...) does not slow down the others.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn, cast

__all__ = ["SUBCOMMANDS", "CliParser", "build_parser", "main"]

#: subcommand name -> module name under pipeline.cli
SUBCOMMANDS: dict[str, str] = {
    "broker": "broker",
    "produce": "produce",
    "consume": "consume",
    "metadata": "metadata",
    "topics": "topics",
    "export": "export",
    "bench": "bench",
}

#: the exit status of every user error, usage errors included (kcat's too)
EXIT_USAGE = 1


class CliParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors exit with status 1 (as every user
    error of this CLI does), after this parser's usage and one ``error:`` line, and
    suggest the option meant when one is misspelt."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)

    def unrecognized(self, extras: Sequence[str]) -> NoReturn:
        """Report arguments no option of this parser takes (with the closest option
        for each one that looks like a misspelt option)."""
        known = [o for action in self._actions for o in action.option_strings]
        hints = []
        for arg in extras:
            close = difflib.get_close_matches(arg.split("=")[0], known, n=1, cutoff=0.6)
            if arg.startswith("-") and close and close[0] != arg:
                hints.append(f"{arg} (did you mean {close[0]}?)")
            else:
                hints.append(arg)
        self.error("unrecognized arguments: " + " ".join(hints))


def _load(name: str) -> ModuleType:
    return importlib.import_module(f"pipeline.cli.{SUBCOMMANDS[name]}")


def build_parser(only: str | None = None) -> CliParser:
    """The full parser. ``only`` limits module imports to that subcommand (others get a
    stub parser, so ``--help`` still lists them)."""
    parser = CliParser(
        prog="python -m pipeline",
        description="pipeline: a trio-native Kafka producer (tools and test broker). "
        "kcat habits work: `python -m pipeline -L -b HOST:PORT` lists the metadata.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CliParser)
    for name in SUBCOMMANDS:
        if only is not None and name != only:
            sub.add_parser(name, help=_help_of(name))
            continue
        module = _load(name)
        sub_parser = sub.add_parser(name, help=module.HELP, description=module.HELP)
        sub_parser.set_defaults(_module=module, _parser=sub_parser)
        module.add_arguments(sub_parser)
    return parser


def _help_of(name: str) -> str:
    try:
        return cast(str, _load(name).HELP)
    except Exception:  # a broken optional subcommand must not break --help of the others
        return "(unavailable)"


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if "-L" in args_list and not any(a in SUBCOMMANDS for a in args_list):
        # kcat's metadata mode: `-L -b HOST [-t TOPIC] [-J]`
        args_list = ["metadata", *(a for a in args_list if a != "-L")]
    only = next((a for a in args_list if not a.startswith("-")), None)
    parser = build_parser(only if only in SUBCOMMANDS else None)
    args, extras = parser.parse_known_args(args_list)
    module = getattr(args, "_module", None)
    if extras:
        cast(CliParser, getattr(args, "_parser", parser)).unrecognized(extras)
    if module is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return cast(int, module.run(args))
