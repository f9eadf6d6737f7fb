"""Checks a command makes before any work: sizes that cannot fit in memory, output paths that cannot be written.

Both would otherwise fail late: a user count too large for the machine as a ``MemoryError``
traceback (or minutes spent spawning seeds) partway in, an unwritable ``--plot`` only after
the whole run. :func:`refuse_before_work` refuses them at once with one line naming the bound
(:class:`~shuffledp.cli.common.UsageError`, exit status 2).

**The memory bound.** For each command that takes a user count, :func:`bytes_per_user` is a
*lower* bound on the memory the run holds at once per user, counted from the objects it
allocates (below); the run is refused when ``users x bytes_per_user`` exceeds
:func:`memory_limit`, the machine's physical memory (or a lower cgroup or ``RLIMIT_AS``
limit). A lower bound refuses only runs that certainly cannot fit; a run that passes may
still be too large for the memory free at the time.

* fast engine, scalar data (``simulate`` mean and sum, ``analyzer run``): one float64 per user
  (the users' local means, :func:`shuffledp.simulation.population.local_means`; the analyzer's
  opened reports): 8 B.
* fast engine, ``d``-dimensional data held whole (``simulate --protocol vector-sum`` and
  ``instance-optimal``): ``8 d`` B.
* ``distribution`` (fast): the frequency oracle's one symbol per user, an int64 array: 8 B.
* ``vector`` (fast) streams its users block by block: what it holds per user is the seed list
  (:func:`shuffledp.simulation.population.fixed_blocks`), one ``SeedSequence`` in a 3-tuple in a
  list per block of at most 2^16 users: ``sys.getsizeof`` of both plus a list slot, over 2^16.
* the message engine (``--messages``, ``--broker``, ``clients run``): one simulated device per
  user, holding at least its 48-byte credential (a ``bytes`` object and a list slot) and its
  local mean (8 B).
* ``keys init``, ``keys enroll`` and ``up`` (which runs ``keys init`` for its users): the issued
  credentials (``bytes`` objects in a list), their hex strings in a list, and the JSON text of
  ``credentials.json`` as a ``str`` and encoded, alive together while the file is made
  (:func:`shuffledp.deploy.keys._credentials_document`).

``account`` takes a batch size but allocates nothing per user (closed forms and a PLD in n).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
from pathlib import Path

from shuffledp.cli.common import UsageError
from shuffledp.protocol.wire.credentials import CREDENTIAL_BYTES

#: Most users in one seed block of the fast engines (``shuffledp.simulation.population.BLOCK_USERS``,
#: the cap of ``VectorPopulation.block_users``).
MAX_BLOCK_USERS = 1 << 16
#: Size of a list slot (a pointer).
_SLOT = 8
_FLOAT = 8

#: The output-file options the commands take (``argparse`` dests).
OUTPUT_OPTIONS = {"plot": "--plot", "output": "--output", "stats_file": "--stats-file"}


def memory_limit() -> int:
    """Bytes this process could ever hold: the physical memory, or a lower cgroup (v2
    ``memory.max``) or ``RLIMIT_AS`` limit."""
    limits = [os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")]
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        limits.append(soft)
    try:
        text = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if text.isdigit():
            limits.append(int(text))
    except OSError:
        pass
    return min(limits)


def _credential_bytes() -> float:
    return sys.getsizeof(bytes(CREDENTIAL_BYTES)) + _SLOT


def _device_bytes() -> float:
    """A simulated device: its credential and its local mean."""
    return _credential_bytes() + _FLOAT


def _credentials_file_bytes() -> float:
    """One credential while ``credentials.json`` is made: bytes, hex string, and its JSON line twice."""
    line = len(f'  "{"0" * 2 * CREDENTIAL_BYTES}",\n')
    return _credential_bytes() + sys.getsizeof("0" * 2 * CREDENTIAL_BYTES) + _SLOT + 2 * line


def _seed_block_bytes() -> float:
    """One user's share of the fast engine's seed list (one block of at most :data:`MAX_BLOCK_USERS`)."""
    import numpy as np

    block = sys.getsizeof(np.random.SeedSequence(0)) + sys.getsizeof((0, 0, None)) + _SLOT
    return block / MAX_BLOCK_USERS


def bytes_per_user(args: argparse.Namespace) -> tuple[float, str] | None:
    """A lower bound on the bytes the command of ``args`` holds at once per user, and what they
    are; None for a command that allocates nothing per user (see the module docstring)."""
    command = getattr(args, "command", None)
    protocol = getattr(args, "protocol", None)
    messages = getattr(args, "path", None) == "messages" or getattr(args, "broker", None) is not None
    if command in ("keys", "up"):
        return _credentials_file_bytes(), "each credential issued, as bytes, hex and JSON text"
    if command in ("clients", "client") or (messages and command in ("simulate", "vector", "distribution")):
        return _device_bytes(), "each simulated device's credential and local mean"
    if command == "analyzer":
        return _FLOAT, "one float64 per opened report"
    if command == "distribution":
        return _FLOAT, "the frequency oracle's one int64 symbol per user"
    if command == "vector" or (command == "simulate" and protocol in ("vector-mean", "distribution")):
        return _seed_block_bytes(), f"the seed list: one SeedSequence per block of at most {MAX_BLOCK_USERS:,} users"
    if command == "simulate" and protocol in ("vector-sum", "instance-optimal"):
        dim = getattr(args, "dim", 1)
        return _FLOAT * dim, f"each user's {dim} float64 local means"
    if command == "simulate":
        return _FLOAT, "one float64 local mean per user"
    return None


def _largest_user_count(args: argparse.Namespace) -> int | None:
    """The largest user count the command will run: ``--users``, or the largest of ``--sweep``."""
    sweep = getattr(args, "sweep", None)
    if sweep:
        try:
            return max(int(float(x)) for x in str(sweep).split(",") if x.strip())
        except ValueError:
            return None  # malformed: the command reports it in its own words
    users = getattr(args, "users", None)
    return users if isinstance(users, int) and not isinstance(users, bool) else None


def _size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if count < 1024 or unit == "PiB":
            return f"{count:.3g} {unit}" if unit != "B" else f"{count:.0f} B"
        count /= 1024
    raise AssertionError  # pragma: no cover


def check_memory(args: argparse.Namespace) -> None:
    """Refuse (:class:`UsageError`) a user count whose lower-bound memory exceeds :func:`memory_limit`."""
    users = _largest_user_count(args)
    per_user = bytes_per_user(args) if users else None
    if not users or per_user is None:
        return
    each, what = per_user
    limit = memory_limit()
    if users * each > limit:
        raise UsageError(
            f"--users: {users:,} users need at least {_size(users * each)} of memory ({each:.3g} B per user: {what}), "
            f"more than this machine's {_size(limit)}: at most {int(limit // each):,} users")


def check_output_paths(args: argparse.Namespace) -> None:
    """Refuse (:class:`UsageError`) an output file that cannot be written: its directory missing,
    not a directory or not writable, the path itself a directory, or (``--plot``) a file type
    matplotlib cannot write."""
    for dest, option in OUTPUT_OPTIONS.items():
        value = getattr(args, dest, None)
        if value is None or value == "":
            continue
        path = Path(value)
        parent = path.parent if str(path.parent) else Path(".")
        if path.is_dir():
            raise UsageError(f"{option}: {path} is a directory; name a file")
        if not parent.is_dir():
            raise UsageError(f"{option}: cannot write {path}: {parent} is not a directory")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise UsageError(f"{option}: cannot write {path}: no write permission on {parent}")
        if path.exists() and not os.access(path, os.W_OK):
            raise UsageError(f"{option}: cannot write {path}: no write permission on it")
        if dest == "plot":
            from matplotlib.backend_bases import FigureCanvasBase

            kinds = FigureCanvasBase.get_supported_filetypes()
            suffix = path.suffix.lstrip(".").lower()
            if suffix and suffix not in kinds:  # no suffix: matplotlib writes its default type
                raise UsageError(f"{option}: cannot draw {path}: name a file ending in one of "
                                 f"{', '.join('.' + k for k in sorted(kinds))}")


def refuse_before_work(args: argparse.Namespace) -> None:
    """The checks before any work (:func:`check_output_paths`, :func:`check_memory`)."""
    check_output_paths(args)
    check_memory(args)
