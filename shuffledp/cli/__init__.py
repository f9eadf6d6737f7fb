"""The ``shuffledp`` command line: one sub-command per module.

Each command module exposes ``add_parser(subparsers)``, which registers its
sub-command and sets ``func`` (a callable taking the parsed ``argparse.Namespace``
and returning an exit code). Commands import their heavy dependencies lazily so
``shuffledp --help`` stays fast. What the commands share (the parser class, deprecated
aliases, the default delta, errors and exit statuses, the services' broker options) is
in :mod:`shuffledp.cli.common`; the vocabulary is tabled in ``docs/cli.md``.

Errors are one line on stderr, ``shuffledp <command>: <message>``: exit status 2 for bad
usage or configuration, 1 for a failure of the command itself.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from typing import Sequence

from shuffledp import __version__
from shuffledp.cli.common import EXIT_INTERRUPTED, Parser, command_name, exit_status, fail, interrupted
from shuffledp.cli.extras import MissingExtraError, as_missing_extra, require_extras
from shuffledp.cli.preflight import refuse_before_work
from shuffledp.size_cap import apply_size_cap

#: Modules that provide sub-commands, in the order ``--help`` lists them.
COMMAND_MODULES = (
    "shuffledp.cli.simulate",
    "shuffledp.cli.vector",
    "shuffledp.cli.distribution",
    "shuffledp.cli.account",
    "shuffledp.cli.audit",
    "shuffledp.cli.keys",
    "shuffledp.cli.shuffler",
    "shuffledp.cli.analyzer",
    "shuffledp.cli.clients",
    "shuffledp.cli.up",
)


#: Each command name (and alias) -> the module that provides it.
COMMAND_OF: dict[str, str] = {name.rpartition(".")[2]: name for name in COMMAND_MODULES} | {"client": "shuffledp.cli.clients"}


def named_command(argv: Sequence[str] | None) -> str | None:
    """The command ``argv`` runs (its first word, when it names one), or None (``--help``, ``--version``,
    no command, or a word that is not a command)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0].startswith("-"):
        return None
    return args[0] if args[0] in COMMAND_OF else None


def build_parser(argv: Sequence[str] | None = ()) -> argparse.ArgumentParser:
    """The command-line parser. With ``argv`` naming a command, only that command's module is
    imported (a command loads only what it runs); otherwise every command's, so ``--help`` and a
    mistyped command list them all. ``argv=None`` reads ``sys.argv``."""
    command = named_command(argv)
    modules = (COMMAND_OF[command],) if command is not None else COMMAND_MODULES
    parser = Parser(
        prog="shuffledp",
        description="Differentially private statistics in the local and shuffle models.",
    )
    parser.add_argument("--version", action="version", version=f"shuffledp {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a command whose module is not built yet
            if exc.name != name:
                raise
            continue
        module.add_parser(sub)
    return parser


def console_main() -> int:
    """The ``shuffledp`` executable (and ``python -m shuffledp.cli``): :func:`main`, then the process ends.

    Once the command is done, what it made is frozen for the cyclic garbage collector
    (:func:`gc.freeze`), so the interpreter's collections at exit do not walk the objects it is
    about to drop anyway (a simulation leaves hundreds of thousands; about 30 ms at the default
    size). Nothing is lost: the command has returned, its output is flushed, and finalizers at
    exit were never promised for what is still alive."""
    status = main()
    if status == EXIT_INTERRUPTED:
        forget_unhandled_interrupt()
    gc.freeze()
    return status


def forget_unhandled_interrupt() -> None:
    """Let a command stopped by Ctrl-C end with its status 130 under ``python -m`` too.

    CPython (3.8 and later) sets a process-wide flag when a ``KeyboardInterrupt`` leaves code run
    through its ``PyRun_*`` C API (a library's embedded Python), even if the command catches it
    further up and prints its one line. With ``python -m``, the interpreter then ends the process
    by SIGINT after finalization (status -2, where a shell shows 130) instead of with the status
    the command returned; a parent that checks the status sees a death by signal. The command
    did handle the interrupt, so the flag is cleared. Interpreters without the flag are left as
    they are."""
    try:
        import ctypes

        ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt").value = 0
    except (ImportError, AttributeError, ValueError, OSError):
        pass


def single_threaded_blas() -> None:
    """Have numpy's OpenBLAS run on one thread in this process and the processes it starts, unless the
    environment already says otherwise (``OPENBLAS_NUM_THREADS``).

    The commands spread their work over processes (the message engine's workers), not BLAS threads,
    and OpenBLAS's thread pool costs each process that loads numpy about a tenth of a CPU-second of
    spinning threads on start; at a command's start that is a core taken from its own imports and
    its workers'. Takes effect only before numpy is first imported (the command modules import it
    lazily, so :func:`main` calls this first)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. A usage error, a bad configuration or a missing optional dependency is one
    line on stderr and exit status 2; a failure of the command (a typed ``ShuffleDPError``) one line
    and exit status 1; Ctrl-C (``KeyboardInterrupt``) the line ``shuffledp <command>: interrupted``
    and exit status 130 (the message engine's worker processes ignore SIGINT and leave the line to
    this process: ``protocol/wire/key_workers.py``). Before any work, sizes that cannot fit in memory
    and unwritable output paths are refused (:mod:`shuffledp.cli.preflight`, exit status 2)."""
    single_threaded_blas()
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    apply_size_cap(args)  # SHUFFLEDP_SIZE_CAP=N: documented commands at a small size (shuffledp/size_cap.py)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    command = args.command or "?"
    try:
        require_extras(command)
        refuse_before_work(args)  # sizes that cannot fit in memory, unwritable output paths: refused before any work
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return interrupted(command_name(args))
    except MissingExtraError as exc:
        print(exc, file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        missing = as_missing_extra(command, exc)
        if missing is None:
            raise
        print(missing, file=sys.stderr)
        return 2
    except Exception as exc:
        status = exit_status(exc)
        if status is None:
            raise
        return fail(command_name(args), exc, status)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
