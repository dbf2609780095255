"""``ncdlr`` command line: a thin dispatcher over ``ncdlr.commands``.

Every module in ``ncdlr/commands/`` that defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int`` becomes a subcommand (``ncdlr NAME --help``). Keeping one module per command
lets the data plane, the trainer and the tools add commands without touching this file.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

import ncdlr.commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ncdlr",
        description="Novel class discovery on long-tailed data: prepare datasets, train, evaluate, report.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(ncdlr.commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"ncdlr.commands.{info.name}")
        cmd = sub.add_parser(
            module.NAME,
            help=module.HELP,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
