"""Which files this process holds open: how a party checks that SQLite opened the file it checked.

SQLite opens its database (and its write-ahead log) by path. A party that has checked a
private file through a directory descriptor (owner, mode, no symbolic link) cannot make
SQLite use that descriptor, so it checks afterwards instead: the descriptors that
appeared while SQLite opened the file must hold the checked file (the same device and
inode). Linux only (``/proc/self/fd``); elsewhere :func:`held_files` returns None and the
caller falls back to re-checking the path, which a swap undone in time escapes.
Used by the shuffler's spool and the accountant's cache.
"""

from __future__ import annotations

import os

FD_DIR = "/proc/self/fd"


def held_files() -> dict[int, tuple[int, int]] | None:
    """Every open descriptor of this process and the (device, inode) it holds; None where there
    is no ``/proc/self/fd``."""
    try:
        names = os.listdir(FD_DIR)
    except OSError:
        return None
    held = {}
    for name in names:
        try:
            info = os.stat(f"{FD_DIR}/{name}")
        except (OSError, ValueError):
            continue  # closed meanwhile (the listing's own descriptor, another thread's)
        held[int(name)] = (info.st_dev, info.st_ino)
    return held
