"""A small on-disk cache of accountant results, shared across processes.

Single-round bounds and session compositions take seconds (a variation-ratio pair at
n = 10^4–10^6, a PLD composition), and sweeps, tests and repeated ``shuffledp simulate``
runs ask the same questions again. :func:`cached` keeps each answer in an SQLite file,
keyed on

* the question (a kind and its parameters, as JSON with sorted keys; floats by ``repr``,
  so equal only when bit-for-bit equal), and
* a digest of the accountant's own source (every ``.py`` file of this package): any
  change to the code that computed an answer makes every stored answer unreachable, so
  a stale bound is never served.

Answers are JSON (floats round-trip exactly). The file is
``$SHUFFLEDP_ACCOUNTING_CACHE`` if set (``off`` disables the cache), else
``$XDG_CACHE_HOME/shuffledp/accounting.sqlite`` (``~/.cache/...``). A cache that cannot
be opened, read or written is skipped, never an error: the answer is computed.
Concurrent processes are fine (SQLite's own locking; a lost insert race is ignored).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable

_log = logging.getLogger(__name__)
ENV = "SHUFFLEDP_ACCOUNTING_CACHE"


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """SHA-256 of this package's Python sources (names and bytes, in name order)."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def cache_path() -> Path | None:
    """Where the cache lives, or None when disabled (``SHUFFLEDP_ACCOUNTING_CACHE=off``)."""
    configured = os.environ.get(ENV)
    if configured is not None:
        return None if configured.strip().lower() in ("", "off", "0", "no") else Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "shuffledp" / "accounting.sqlite"


def _connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    connection = sqlite3.connect(path, timeout=5.0)
    connection.execute("CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL NOT NULL)")
    return connection


def _plain(value: Any) -> Any:
    """numpy scalars as Python numbers (a question may carry them)."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"cannot key the accounting cache on {type(value).__name__}")


def key_of(kind: str, question: dict[str, Any]) -> str:
    """The cache key: the question, the kind and the accountant's source digest, hashed."""
    text = json.dumps({"kind": kind, "source": source_digest(), "question": question}, sort_keys=True,
                      allow_nan=False, default=_plain)
    return hashlib.sha256(text.encode()).hexdigest()


def cached(kind: str, question: dict[str, Any], compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``compute()``'s answer to ``question``, from the cache when it holds one (module docstring)."""
    path = cache_path()
    if path is None:
        return compute()
    key = key_of(kind, question)
    try:
        with _connect(path) as connection:
            row = connection.execute("SELECT value FROM answers WHERE key = ?", (key,)).fetchone()
        if row is not None:
            return json.loads(row[0])
    except (OSError, sqlite3.Error, ValueError) as exc:
        _log.debug("accounting cache unreadable (%s): computing", exc)
    answer = compute()
    try:
        text = json.dumps(answer, allow_nan=False)
        with _connect(path) as connection:
            connection.execute("INSERT OR IGNORE INTO answers VALUES (?, ?, ?)", (key, text, time.time()))
    except (OSError, sqlite3.Error, ValueError) as exc:  # unwritable, or an answer JSON cannot hold
        _log.debug("accounting cache not written (%s)", exc)
    return answer


__all__ = ["ENV", "cache_path", "cached", "key_of", "source_digest"]
