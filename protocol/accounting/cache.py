"""A small on-disk cache of accountant results, shared across processes, that cannot choose an answer.

Single-round bounds and session compositions take seconds (a variation-ratio pair at
n = 10^4–10^6, a PLD composition), and sweeps, tests and repeated ``shuffledp simulate``
runs ask the same questions again. :func:`cached` keeps each answer in an SQLite file,
keyed on

* the question (a kind and its parameters, as JSON with sorted keys; floats by ``repr``,
  so equal only when bit-for-bit equal), and
* a fingerprint of everything else the answer depends on (:func:`fingerprint`): a digest of
  the accountant's own source (every ``.py`` file of this package, and the block Hadamard
  response parameters it shares with the client, ``protocol/mechanisms/hadamard_response_params.py``
  and ``protocol/mechanisms/local_params.py``) and the versions of Python, numpy, scipy, dp-accounting
  and shuffledp. Any change to the code that computed an answer makes every stored answer
  unreachable, so a stale bound is never served.

A printed epsilon is a privacy claim, so whoever can write the cache must not be able to
choose it:

* **Private files.** The cache directory is created ``0700``, the database and its key
  ``0600`` (``os.open`` modes, whatever the umask; SQLite gives its journal, ``-wal`` and
  ``-shm`` files the database's mode). A directory, database, key or journal file owned by
  another user or writable by group or others is not used: one warning on stderr, and every
  answer is computed afresh. Files of ours with looser read bits are narrowed to ``0600`` /
  ``0700``. The checks cannot be raced: the directory is opened once (not through a symbolic
  link) and checked through its descriptor, the key, the database and its journal files are
  opened relative to that descriptor and checked through their own, and the file SQLite opens
  (by name) must be the database checked; so a directory swapped in by someone who can rename
  entries above the cache is never used.
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

import errno
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
from typing import Any, Callable, TypeVar

from shuffledp.protocol.held_files import FD_DIR, held_files

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
    paths = sorted(here.glob("*.py")) + [here.parent / "mechanisms" / name for name in EXTRA_SOURCES]
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


def _check_private(path: Path, st: os.stat_result, secret: bool, fd: int | None = None) -> None:
    """Raise :class:`UntrustedCache` unless ``path`` (its status ``st``, taken through ``fd`` when it is
    open) is ours and not writable by group or others (``secret``: not readable by them either); narrow
    our own file's looser read bits (through ``fd``). A directory's mode is never changed: it may be the
    user's own (``$HOME``, a project folder)."""
    if st.st_uid != os.geteuid():
        raise UntrustedCache(f"{path} is owned by another user (uid {st.st_uid})")
    if stat.S_IMODE(st.st_mode) & 0o022:
        raise UntrustedCache(f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})")
    if secret and stat.S_IMODE(st.st_mode) & 0o044:
        raise UntrustedCache(f"{path} is readable by group or others (mode {stat.S_IMODE(st.st_mode):04o})")
    if not stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) & ~0o600:
        if fd is not None:  # (never by path: the name may lead elsewhere by now)
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o600)


#: Flags of every check-then-use open: no symbolic link as the last component, no blocking on a FIFO,
#: not inherited by child processes.
_OPEN_FLAGS = os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def _os_error_as_untrusted(path: Path, exc: OSError) -> Exception:
    """A symbolic link or a non-directory met where the cache expects its own file: untrusted; else ``exc``."""
    if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and os.path.islink(path)):
        return UntrustedCache(f"{path} is a symbolic link")
    if exc.errno == errno.ENOTDIR:
        return UntrustedCache(f"{path} is not a directory")
    return exc


def _private_directory(directory: Path) -> int:
    """The cache directory, created 0700 if missing, opened (not through a symbolic link) and checked
    through its descriptor; the descriptor (every later file of the cache is opened relative to it, so
    a directory renamed or swapped in after the check is never used)."""
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
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | _OPEN_FLAGS)
    except OSError as exc:
        raise _os_error_as_untrusted(directory, exc) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):
            raise UntrustedCache(f"{directory} is not a directory")
        _check_private(directory, st, secret=False)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_private(directory_fd: int, path: Path, flags: int, secret: bool = False,
                  create: bool = False) -> tuple[int, os.stat_result] | None:
    """Open ``path``'s name in the checked directory (created 0600 if ``create``), not through a symbolic
    link, and check what was opened (:func:`_check_private`, through the descriptor): the descriptor and
    its status, or None when it does not exist and is not to be created."""
    try:
        fd = os.open(path.name, flags | _OPEN_FLAGS | (os.O_CREAT if create else 0), 0o600, dir_fd=directory_fd)
    except FileNotFoundError:
        if create:
            raise
        return None
    except OSError as exc:
        raise _os_error_as_untrusted(path, exc) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedCache(f"{path} is not a regular file")
        _check_private(path, st, secret, fd)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _load_key(directory_fd: int, path: Path) -> bytes:
    """The per-user secret key, created at first use, read from the checked directory."""
    target = key_path(path)
    opened = _open_private(directory_fd, target, os.O_RDONLY, secret=True)
    if opened is None:
        tmp = f"{target.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | _OPEN_FLAGS, 0o600, dir_fd=directory_fd)
        try:
            os.write(fd, secrets.token_bytes(KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:  # whole or not at all; a concurrent creator's key wins
            os.link(tmp, target.name, src_dir_fd=directory_fd, dst_dir_fd=directory_fd, follow_symlinks=False)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp, dir_fd=directory_fd)
        opened = _open_private(directory_fd, target, os.O_RDONLY, secret=True)
        if opened is None:
            raise UntrustedCache(f"{target} vanished while it was created")
    fd, _ = opened
    try:
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise UntrustedCache(f"{target} does not hold a {KEY_BYTES}-byte key")
    return key


class _Connection(sqlite3.Connection):
    """A connection that also closes the cache directory's descriptor it was opened through."""

    directory_fd = -1

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.directory_fd >= 0:
                fd, self.directory_fd = self.directory_fd, -1
                os.close(fd)


def _connect(directory_fd: int, path: Path, checked: os.stat_result) -> _Connection:
    """SQLite on the database file that was checked, or :class:`UntrustedCache`.

    SQLite opens by path name. It is given ``/proc/self/fd/<directory>/<name>``, which leads to the
    checked directory wherever it is now; but SQLite resolves that link back into a path name before
    it opens (3.40 does), so a directory swapped in that moment would still be opened. So the
    descriptors the connection opened must include the checked file's (device, inode). Where there is
    no ``/proc/self/fd`` the path is connected and re-checked (weaker: a swap back is not seen)."""
    before = held_files()
    target = f"{FD_DIR}/{directory_fd}/{path.name}" if before is not None else str(path)
    connection = sqlite3.connect(target, timeout=5.0, factory=_Connection)
    wanted = (checked.st_dev, checked.st_ino)
    try:
        if before is not None:
            after = held_files() or {}
            ok = any(identity == wanted for fd, identity in after.items() if before.get(fd) != identity)
        else:
            st = os.lstat(path)
            ok = (st.st_dev, st.st_ino) == wanted
        if not ok:
            raise UntrustedCache(f"{path} changed while it was opened (a directory above it was replaced?)")
    except BaseException:
        connection.close()
        raise
    connection.directory_fd = directory_fd  # closed with the connection (SQLite may still need the path)
    return connection


def _open(path: Path) -> tuple[sqlite3.Connection, bytes]:
    """A connection to a private cache and its key (:class:`UntrustedCache`, ``OSError``, ``sqlite3.Error``).

    The directory is opened once and checked through its descriptor; the key, the database and its
    journal files are opened and checked relative to it, and SQLite must hold the database checked
    (:func:`_connect`): a directory renamed or swapped in between is never read or written."""
    directory_fd = _private_directory(path.parent)
    connection = None
    try:
        key = _load_key(directory_fd, path)
        opened = _open_private(directory_fd, path, os.O_RDWR, create=True)
        assert opened is not None  # create=True: opened, or raised
        database_fd, checked = opened
        try:
            for suffix in SIDECARS:
                side = _open_private(directory_fd, path.with_name(path.name + suffix), os.O_RDONLY)
                if side is not None:
                    os.close(side[0])
            connection = _connect(directory_fd, path, checked)  # owns directory_fd from here
        finally:
            os.close(database_fd)
        connection.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} "
                           "(key TEXT PRIMARY KEY, value TEXT NOT NULL, tag TEXT NOT NULL, created REAL NOT NULL)")
    except BaseException:
        if connection is not None:
            connection.close()
        else:
            os.close(directory_fd)
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


_Answer = TypeVar("_Answer")


def cached(kind: str, question: dict[str, Any], compute: Callable[[], _Answer]) -> _Answer:
    """``compute()``'s answer to ``question``, from the cache when it holds an authentic one (module docstring).
    The answer is anything JSON holds (the cache stores it as JSON text)."""
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
