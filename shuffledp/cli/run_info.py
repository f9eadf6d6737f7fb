"""What produced a JSON document: the shuffledp version, the command and its parameters.

Every JSON document a ``shuffledp`` command prints or writes carries this block under the
key ``"shuffledp"``, so a saved result says which build made it and with which options,
defaults included. The version names the build (``shuffledp.__version__``: setuptools-scm's
``0.1.devN+gHASH`` from the git commit it was built or installed from, ``0.0`` when unknown),
so results of two builds can be told apart. Benchmarks add the same version to their results.
"""

from __future__ import annotations

import argparse
import math
from pathlib import PurePath
from typing import Any

from shuffledp import __version__

#: The key under which documents carry the block.
KEY = "shuffledp"


def _plain(value: Any) -> Any:
    """``value`` as JSON can hold it (paths as strings, non-finite floats as strings)."""
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return repr(value)


def run_info(args: argparse.Namespace | None = None, command: str | None = None) -> dict[str, Any]:
    """The block: version, command (``args.command`` and its sub-command) and every parsed option."""
    parameters = {} if args is None else {
        k: _plain(v) for k, v in sorted(vars(args).items()) if not callable(v) and not k.startswith("_")
    }
    if command is None and args is not None:
        keys = ["command"] + sorted(k for k in parameters if k.endswith("_command"))
        command = " ".join(str(parameters.pop(k)) for k in keys if parameters.get(k)) or None
    return {"version": __version__, "command": command, "parameters": parameters}


def with_run_info(document: Any, args: argparse.Namespace | None = None, command: str | None = None) -> Any:
    """``document`` with the block in front (each element of a list gets it)."""
    info = run_info(args, command)
    if isinstance(document, list):
        return [{KEY: info, **d} if isinstance(d, dict) else d for d in document]
    return {KEY: info, **document}
