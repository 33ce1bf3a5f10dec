"""Command-line interface: ``python -m pipeline <subcommand> ...``.

Each subcommand lives in its own module under ``pipeline/cli/`` and exposes

* ``HELP: str`` - one line for ``--help``;
* ``add_arguments(parser: argparse.ArgumentParser) -> None``;
* ``run(args: argparse.Namespace) -> int`` - the exit status.

To add a subcommand, write the module and append its name to :data:`SUBCOMMANDS`.
Subcommand modules are imported lazily (only the one being run), so a heavy import in one
(trio, pyspark, ...) does not slow down the others.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import cast

__all__ = ["SUBCOMMANDS", "build_parser", "main"]

#: subcommand name -> module name under pipeline.cli
SUBCOMMANDS: dict[str, str] = {
    "broker": "broker",
    "produce": "produce",
    "consume": "consume",
    "export": "export",
    "bench": "bench",
}


def _load(name: str) -> ModuleType:
    return importlib.import_module(f"pipeline.cli.{SUBCOMMANDS[name]}")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser. ``only`` limits module imports to that subcommand (others get a
    stub parser, so ``--help`` still lists them)."""
    parser = argparse.ArgumentParser(
        prog="python -m pipeline",
        description="pipeline: a trio-native Kafka producer (tools and test broker)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        if only is not None and name != only:
            sub.add_parser(name, help=_help_of(name))
            continue
        module = _load(name)
        sub_parser = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(sub_parser)
        sub_parser.set_defaults(_module=module)
    return parser


def _help_of(name: str) -> str:
    try:
        return cast(str, _load(name).HELP)
    except Exception:  # a broken optional subcommand must not break --help of the others
        return "(unavailable)"


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    only = next((a for a in args_list if not a.startswith("-")), None)
    parser = build_parser(only if only in SUBCOMMANDS else None)
    args = parser.parse_args(args_list)
    module = getattr(args, "_module", None)
    if module is None:
        parser.print_help()
        return 2
    return cast(int, module.run(args))
