"""The ``shuffledp`` command line: one sub-command per module.

Each command module exposes ``add_parser(subparsers)``, which registers its
sub-command and sets ``func`` (a callable taking the parsed ``argparse.Namespace``
and returning an exit code). Commands import their heavy dependencies lazily so
``shuffledp --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from shuffledp import __version__
from shuffledp.cli.extras import MissingExtraError, as_missing_extra, require_extras
from shuffledp.size_cap import apply_size_cap

#: Modules that provide sub-commands, in the order ``--help`` lists them.
COMMAND_MODULES = (
    "shuffledp.cli.simulate",
    "shuffledp.cli.vector",
    "shuffledp.cli.distribution",
    "shuffledp.cli.account",
    "shuffledp.cli.audit",
    "shuffledp.cli.services",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shuffledp",
        description="Differentially private statistics in the local and shuffle models.",
    )
    parser.add_argument("--version", action="version", version=f"shuffledp {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a command whose module is not built yet
            if exc.name != name:
                raise
            continue
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; a missing optional dependency is one line on stderr and exit status 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    apply_size_cap(args)  # SHUFFLEDP_SIZE_CAP=N: documented commands at a small size (shuffledp/size_cap.py)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    command = args.command or "?"
    try:
        require_extras(command)
        return int(args.func(args) or 0)
    except MissingExtraError as exc:
        print(exc, file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        missing = as_missing_extra(command, exc)
        if missing is None:
            raise
        print(missing, file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
