"""``SHUFFLEDP_SIZE_CAP=N``: run the documented commands and examples at a small size.

With the environment variable set to a positive integer ``N``, every count of users,
every list of user counts or of samples per user, and every count of seeds or
training steps that a ``shuffledp`` command or an example script takes is capped at
``N`` (a list keeps its values up to ``N``, the larger ones become ``N``, duplicates
dropped), and ``shuffledp audit`` runs at its ``--quick`` size. The commands, their
flags and every other parameter stay as typed; one line on stderr says what was
capped. Unset (or empty), nothing changes.

It exists so that a test can run every command of the README exactly as a reader
types it, in seconds rather than hours (``tests/docs/test_docs_run.py``). Estimates made
under a cap are those of the smaller run, not of the documented size.

Standard library only: the example scripts call it too, the device one included.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Iterable

#: The environment variable.
ENV = "SHUFFLEDP_SIZE_CAP"

#: Per command (``args.command``, aliases included): the parsed arguments that are sizes.
#: A value is an integer count, or a comma-separated list of counts (``--sweep``, ``-m``).
SIZE_ARGUMENTS: dict[str, tuple[str, ...]] = {
    "simulate": ("users", "seeds"),
    "vector": ("users", "sweep"),
    "distribution": ("users", "samples"),
    "clients": ("users",),
    "client": ("users",),
    "analyzer": ("users",),
    "up": ("users",),
}
#: Commands whose work is set by a ``--quick`` flag rather than by a size: the cap turns it on.
QUICK_COMMANDS = ("audit",)


def size_cap() -> int | None:
    """The cap ``N`` from :data:`ENV`, or None when it is unset or empty.

    Raises :class:`ValueError` if it is set to anything but a positive integer."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{ENV} must be a positive integer, got {text!r}") from None
    if value < 1:
        raise ValueError(f"{ENV} must be a positive integer, got {text!r}")
    return value


def capped(value: int) -> int:
    """``value``, or the cap if one is set and ``value`` exceeds it."""
    cap = size_cap()
    return value if cap is None or value <= cap else cap


def capped_list(values: Iterable[int]) -> list[int]:
    """Each value capped, duplicates dropped, order kept."""
    out: list[int] = []
    for v in values:
        c = capped(v)
        if c not in out:
            out.append(c)
    return out


def _capped_csv(text: str) -> str:
    try:
        values = [int(float(x)) for x in text.split(",") if x.strip()]
    except ValueError:
        return text  # malformed: the command reports it in its own words
    return ",".join(str(v) for v in capped_list(values))


def apply_size_cap(args: Any, prog: str = "shuffledp") -> list[str]:
    """Cap the size arguments of a parsed ``shuffledp`` command line in place.

    Returns the changes made (``"--users 20000 -> 500"``, ...) and prints them as one
    line on stderr; returns ``[]`` and changes nothing without a cap."""
    try:
        cap = size_cap()
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    command = getattr(args, "command", None)
    if cap is None or command is None:
        return []
    changes: list[str] = []
    for name in SIZE_ARGUMENTS.get(command, ()):
        value = getattr(args, name, None)
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int):
            new: Any = capped(value)
        elif isinstance(value, str):
            new = _capped_csv(value)
        else:
            continue
        if new != value:
            setattr(args, name, new)
            changes.append(f"--{name.replace('_', '-')} {value} -> {new}")
    if command in QUICK_COMMANDS and getattr(args, "quick", True) is False:
        args.quick = True
        changes.append("--quick sizes")
    if changes:
        print(f"{prog}: {ENV}={cap}: {', '.join(changes)}", file=sys.stderr, flush=True)
        # recorded with the run's parameters (run_info), so a saved result says it was capped
        args.size_cap = {"cap": cap, "changes": changes}
    return changes


def note(changes: list[str], prog: str) -> None:
    """Print an example script's capped sizes as one line on stderr (nothing if none)."""
    if changes:
        print(f"{prog}: {ENV}={size_cap()}: {', '.join(changes)}", file=sys.stderr, flush=True)


__all__ = ["ENV", "apply_size_cap", "capped", "capped_list", "note", "size_cap"]
