"""A small on-disk cache of accountant results, shared across processes, that cannot choose an answer.

Single-round bounds and session compositions take seconds (a variation-ratio pair at
n = 10^4–10^6, a PLD composition), and sweeps, tests and repeated ``shuffledp simulate``
runs ask the same questions again. :func:`cached` keeps each answer in an SQLite file,
keyed on

* the question (a kind and its parameters, as JSON with sorted keys; floats by ``repr``,
  so equal only when bit-for-bit equal), and
* a fingerprint of everything else the answer depends on (:func:`fingerprint`): a digest of
  the accountant's own source (every ``.py`` file of this package, and the block Hadamard
  response parameters it shares with the client, ``protocol/hadamard_response_params.py``
  and ``protocol/local_params.py``) and the versions of Python, numpy, scipy, dp-accounting
  and shuffledp. Any change to the code that computed an answer makes every stored answer
  unreachable, so a stale bound is never served.

A printed epsilon is a privacy claim, so whoever can write the cache must not be able to
choose it:

* **Private files.** The cache directory is created ``0700``, the database and its key
  ``0600`` (``os.open`` modes, whatever the umask; SQLite gives its journal, ``-wal`` and
  ``-shm`` files the database's mode). A directory, database, key or journal file owned by
  another user or writable by group or others is not used: one warning on stderr, and every
  answer is computed afresh. Files of ours with looser read bits are narrowed to ``0600`` /
  ``0700``.
* **Authenticated rows.** Every stored answer carries an HMAC-SHA256 tag over its key and
  value under a per-user secret key (32 bytes from :mod:`secrets`, in ``<database>.key``
  beside the database, created atomically at first use). A row whose tag does not verify
  (written by anything but this code with this key) is never returned: the answer is
  computed and stored over it, with one warning on stderr.

Answers are JSON (floats round-trip exactly). The file is ``$SHUFFLEDP_ACCOUNTING_CACHE`` if
set (``off`` disables the cache), else ``$XDG_CACHE_HOME/shuffledp/accounting.sqlite``
(``~/.cache/...``). A cache that cannot be opened, read or written is skipped, never an
error: the answer is computed. Concurrent processes are fine (SQLite's own locking; the key
is created with ``O_EXCL`` and linked into place whole).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import os
import platform
import secrets
import sqlite3
import stat
import sys
import time
from pathlib import Path
from typing import Any, Callable

_log = logging.getLogger(__name__)
ENV = "SHUFFLEDP_ACCOUNTING_CACHE"
#: Table of authenticated answers (``key``, JSON ``value``, hex HMAC ``tag``, ``created``).
TABLE = "answers_v2"
#: Bytes of the per-user secret key.
KEY_BYTES = 32
#: Files beside the database that SQLite may create (rollback journal, write-ahead log).
SIDECARS = ("-journal", "-wal", "-shm")
#: Sources outside this package that answers depend on (relative to the ``protocol`` package).
EXTRA_SOURCES = ("hadamard_response_params.py", "local_params.py")

_warned: set[tuple[str, str]] = set()


class UntrustedCache(Exception):
    """The cache's files are not private to this user: it is not used."""


def _warn(path: Path, problem: str) -> None:
    """One line on stderr, once per process for each (file, problem)."""
    if (str(path), problem) in _warned:
        return
    _warned.add((str(path), problem))
    print(f"shuffledp: warning: accounting cache {path}: {problem}", file=sys.stderr)


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """SHA-256 of the accountant's Python sources (this package's and :data:`EXTRA_SOURCES`; names and
    bytes, in name order)."""
    here = Path(__file__).parent
    paths = sorted(here.glob("*.py")) + [here.parent / name for name in EXTRA_SOURCES]
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def _dp_accounting_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("dp-accounting")
    except metadata.PackageNotFoundError:
        return "absent"


def library_versions() -> dict[str, str]:
    """The versions of the interpreter and of every library an answer is computed with."""
    import numpy
    import scipy

    import shuffledp

    return {"python": platform.python_version(), "numpy": numpy.__version__, "scipy": scipy.__version__,
            "dp-accounting": _dp_accounting_version(), "shuffledp": shuffledp.__version__}


def fingerprint() -> str:
    """What every key is bound to besides its question: :func:`source_digest` and :func:`library_versions`."""
    text = json.dumps({"source": source_digest(), "versions": library_versions()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def cache_path() -> Path | None:
    """Where the cache lives, or None when disabled (``SHUFFLEDP_ACCOUNTING_CACHE=off``)."""
    configured = os.environ.get(ENV)
    if configured is not None:
        return None if configured.strip().lower() in ("", "off", "0", "no") else Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "shuffledp" / "accounting.sqlite"


def key_path(path: Path) -> Path:
    """The secret key's file beside the database."""
    return path.with_name(path.name + ".key")


def _check_private(path: Path, st: os.stat_result, secret: bool) -> None:
    """Raise :class:`UntrustedCache` unless ``path`` is ours and not writable by group or others
    (``secret``: not readable by them either); narrow our own file's looser read bits. A
    directory's mode is never changed: it may be the user's own (``$HOME``, a project folder)."""
    if st.st_uid != os.geteuid():
        raise UntrustedCache(f"{path} is owned by another user (uid {st.st_uid})")
    if stat.S_IMODE(st.st_mode) & 0o022:
        raise UntrustedCache(f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})")
    if secret and stat.S_IMODE(st.st_mode) & 0o044:
        raise UntrustedCache(f"{path} is readable by group or others (mode {stat.S_IMODE(st.st_mode):04o})")
    if not stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) & ~0o600:
        os.chmod(path, stat.S_IMODE(st.st_mode) & 0o600)


def _private_directory(directory: Path) -> None:
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        directory.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedCache(f"{directory} is not a directory")
    _check_private(directory, st, secret=False)


def _private_file(path: Path, secret: bool = False) -> None:
    """Create ``path`` empty with mode 0600 if missing; check it (:func:`_check_private`)."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW, 0o600))
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise UntrustedCache(f"{path} is not a regular file")
    _check_private(path, st, secret)


def _load_key(path: Path) -> bytes | None:
    """The per-user secret key, created at first use; None when it cannot be had this time."""
    target = key_path(path)
    if not os.path.lexists(target):
        tmp = target.with_name(f"{target.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, secrets.token_bytes(KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, target)  # whole or not at all; a concurrent creator's key wins
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    st = os.lstat(target)
    if not stat.S_ISREG(st.st_mode):
        raise UntrustedCache(f"{target} is not a regular file")
    _check_private(target, st, secret=True)
    fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise UntrustedCache(f"{target} does not hold a {KEY_BYTES}-byte key")
    return key


def _open(path: Path) -> tuple[sqlite3.Connection, bytes]:
    """A connection to a private cache and its key (:class:`UntrustedCache`, ``OSError``, ``sqlite3.Error``)."""
    _private_directory(path.parent)
    key = _load_key(path)
    _private_file(path)
    for suffix in SIDECARS:
        side = path.with_name(path.name + suffix)
        if os.path.lexists(side):
            _private_file(side)
    connection = sqlite3.connect(path, timeout=5.0)
    try:
        connection.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} "
                           "(key TEXT PRIMARY KEY, value TEXT NOT NULL, tag TEXT NOT NULL, created REAL NOT NULL)")
    except BaseException:
        connection.close()
        raise
    return connection, key


def _plain(value: Any) -> Any:
    """numpy scalars as Python numbers (a question may carry them)."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"cannot key the accounting cache on {type(value).__name__}")


def key_of(kind: str, question: dict[str, Any]) -> str:
    """The cache key: the question, the kind and the :func:`fingerprint`, hashed."""
    text = json.dumps({"kind": kind, "fingerprint": fingerprint(), "question": question},
                      sort_keys=True, allow_nan=False, default=_plain)
    return hashlib.sha256(text.encode()).hexdigest()


def tag_of(secret: bytes, key: str, value: str) -> str:
    """HMAC-SHA256 of a row (its key and its value text) under the per-user secret."""
    return hmac.new(secret, key.encode() + b"\0" + value.encode(), hashlib.sha256).hexdigest()


def cached(kind: str, question: dict[str, Any], compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``compute()``'s answer to ``question``, from the cache when it holds an authentic one (module docstring)."""
    path = cache_path()
    if path is None:
        return compute()
    key = key_of(kind, question)
    secret = None
    try:
        connection, secret = _open(path)
        try:
            row = connection.execute(f"SELECT value, tag FROM {TABLE} WHERE key = ?", (key,)).fetchone()
        finally:
            connection.close()
        if row is not None:
            value, tag = row
            if (isinstance(value, str) and isinstance(tag, str)
                    and hmac.compare_digest(tag.encode("utf-8", "surrogatepass"), tag_of(secret, key, value).encode())):
                return json.loads(value)
            _warn(path, "an entry failed authentication and was not used; computing afresh")
    except UntrustedCache as exc:
        _warn(path, f"not used ({exc}); computing afresh")
        return compute()
    except (OSError, sqlite3.Error, ValueError) as exc:
        _log.debug("accounting cache unreadable (%s): computing", exc)
    answer = compute()
    if secret is None:
        return answer
    try:
        text = json.dumps(answer, allow_nan=False)
        connection, secret = _open(path)
        try:
            with connection:
                connection.execute(f"INSERT OR REPLACE INTO {TABLE} VALUES (?, ?, ?, ?)",
                                   (key, text, tag_of(secret, key, text), time.time()))
        finally:
            connection.close()
    except UntrustedCache as exc:
        _warn(path, f"not used ({exc}); computing afresh")
    except (OSError, sqlite3.Error, ValueError) as exc:  # unwritable, or an answer JSON cannot hold
        _log.debug("accounting cache not written (%s)", exc)
    return answer


__all__ = ["ENV", "UntrustedCache", "cache_path", "cached", "fingerprint", "key_of", "key_path", "library_versions",
           "source_digest", "tag_of"]
