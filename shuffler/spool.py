"""The shuffler's durable spool: rounds, admitted envelopes and released batches.

An admitted envelope is written (and committed) to the spool before the shuffler
counts it as admitted, so a shuffler killed with ``kill -9`` and restarted on the
same spool resumes every open round with its admission state: the nonces and
sealed payloads already seen (so nothing is admitted twice), each client's quota,
and the payloads themselves. A round's state only moves forward
(``open -> released -> served``, or ``open -> failed``), so a released or served
round is never re-opened, whatever announcements are replayed to the shuffler.

A released batch (its signed chunks) stays in the spool, under its batch id, until
the analyzer acknowledges it; a restarted shuffler publishes unacknowledged batches
again, and the analyzer takes one batch id per round and ignores chunks it already
holds: delivery is at least once on the wire and exactly once at the analyzer.

Data at rest. The spool's files never link a client to a report for longer than
the shuffler needs the link, and only its own user can read them:

* **Modes.** The database and its ``-wal`` and ``-shm`` files are mode 0600 from
  the moment they exist (the database file is created by :func:`os.open` with mode
  0600 before SQLite opens it, SQLite creates its files under a 0077 umask and gives
  the ``-wal`` and ``-shm`` files the database's mode), in a directory of mode 0700
  owned by the shuffler's user (created so if it is missing). A directory other users can read, search or write, or that belongs
  to another user, a spool file that is a symbolic link, not a regular file or
  another user's, is refused with :class:`SpoolAccessError`; spool files left with
  a looser mode (e.g. by an earlier version) are set to 0600.
* **While a round is open** the spool holds, per admitted envelope, the client id
  (the credential's id, for the per-client quota), the nonce, the sealed report and
  the order of arrival: exactly what resuming the round needs.
* **At release** the round's admitted rows (client ids, nonces, arrival order) are
  deleted in the transaction that stores the permuted batch: from then on the spool
  holds the round's sealed reports only in the permuted, signed chunks, with no
  client id, no nonce and no arrival order.
* **At the acknowledgement** (or when a round fails) the chunks (or the admitted
  rows) are deleted too; only the round's state, its signed spec and its batch id
  remain.
* **No copies.** Every connection runs with ``PRAGMA secure_delete=ON`` (deleted
  rows and freed pages are overwritten with zeros) and ``temp_store=MEMORY`` (no
  temporary files), and every release, acknowledgement and failed round ends with
  ``PRAGMA wal_checkpoint(TRUNCATE)``: the zeroed pages are written to the
  database file and the write-ahead log, which held the deleted rows' earlier
  versions, is truncated to zero bytes. So once a round is acknowledged no byte of
  its client ids, nonces or sealed reports is left in the ``.db``, ``-wal`` or
  ``-shm`` file; once it is released, no client id and no nonce. A checkpoint that
  cannot complete (a reader in another process, a full disk) is retried at the next
  release, acknowledgement or failed round, at an admission at most every
  :data:`SCRUB_RETRY_S` seconds, and when the spool closes; and every opening of a
  spool first deletes what a finished round left behind (a process killed between
  the commit and the checkpoint, a spool written by an earlier version) and
  checkpoints. Not covered: blocks the file system or the disk keep after a file
  shrinks (use an encrypted file system against someone holding the disk), and
  reading the shuffler's memory.

Storage failures. A write the spool cannot make (disk full, I/O error, database
locked by another process) raises :class:`SpoolStorageError` (reason
``storage-error``) with SQLite's own error as its cause: the transaction was rolled
back, nothing of it is in the spool and everything committed before is intact.
The shuffler refuses the envelopes of such an admission without a receipt (their
clients send them again), retries a round's opening or release until it is written,
and keeps serving (:mod:`shuffledp.shuffler.service`).

:class:`SqliteSpool` is the embedded default: SQLite in WAL mode with
``synchronous=NORMAL`` (a commit survives the process being killed; surviving a
power loss needs ``synchronous=FULL``, pass ``durable_against_power_loss=True``).
Uniqueness of nonces and sealed payloads per round is enforced by the database
itself, so even two shuffler processes on one spool cannot admit a copy twice.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol

from shuffledp.protocol.errors import DuplicateReport, ReplayedReport, ShuffleDPError

_log = logging.getLogger(__name__)

#: Round states; each may only move to a later one.
ROUND_STATES = ("open", "released", "served", "failed")
#: Files SQLite keeps next to the database (WAL mode uses the first two; the last only while switching modes).
SIDE_FILES = ("-wal", "-shm", "-journal")
#: How long a checkpoint waits for another connection's reader before it is left for later.
CHECKPOINT_WAIT_MS = 100
#: Least seconds between two retries of a pending checkpoint made by admissions (so a reader that
#: stays does not slow every admission down).
SCRUB_RETRY_S = 5.0


class SpoolError(ShuffleDPError):
    """The spool cannot be used as asked."""

    reason = "spool"


class SpoolAccessError(SpoolError):
    """The spool's directory or files are open to other local users, belong to another user,
    or are not plain files: the spool refuses to use them (they would expose or let others
    change the link between clients and reports)."""

    reason = "spool-access"


class SpoolStorageError(SpoolError):
    """A spool write that could not be made (disk full, I/O error, database locked): it was
    rolled back, nothing of it is stored, and what was committed before is intact. The
    underlying :class:`sqlite3.Error` is the ``__cause__``."""

    reason = "storage-error"


@dataclass(frozen=True)
class AdmittedEnvelope:
    client_id: bytes
    nonce: bytes
    sealed: bytes


@dataclass(frozen=True)
class StoredRound:
    session_id: bytes
    round_id: int
    signed_spec: bytes
    state: str


@dataclass(frozen=True)
class StoredBatch:
    batch_id: bytes
    session_id: bytes
    round_id: int
    chunks: list[bytes]


class Spool(Protocol):
    """What the shuffler needs from durable storage."""

    def open_round(self, session_id: bytes, round_id: int, signed_spec: bytes) -> StoredRound: ...

    def round(self, session_id: bytes, round_id: int) -> StoredRound | None: ...

    def rounds(self, state: str) -> list[StoredRound]: ...

    def admit(self, session_id: bytes, round_id: int, envelope: AdmittedEnvelope) -> None: ...

    def admit_many(self, session_id: bytes, round_id: int, envelopes: list[AdmittedEnvelope]) -> None: ...

    def admitted(self, session_id: bytes, round_id: int) -> list[AdmittedEnvelope]: ...

    def release(self, session_id: bytes, round_id: int, batch_id: bytes, chunks: list[bytes]) -> None: ...

    def fail(self, session_id: bytes, round_id: int, reason: str) -> None: ...

    def acknowledge(self, batch_id: bytes) -> tuple[bytes, int] | None: ...

    def unacknowledged(self) -> list[StoredBatch]: ...

    def close(self) -> None: ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS rounds (
    session_id BLOB NOT NULL, round_id INTEGER NOT NULL, signed_spec BLOB NOT NULL,
    state TEXT NOT NULL, reason TEXT, PRIMARY KEY (session_id, round_id));
CREATE TABLE IF NOT EXISTS admitted (
    session_id BLOB NOT NULL, round_id INTEGER NOT NULL, seq INTEGER PRIMARY KEY AUTOINCREMENT,
    client_id BLOB NOT NULL, nonce BLOB NOT NULL, sealed BLOB NOT NULL,
    UNIQUE (session_id, round_id, nonce), UNIQUE (session_id, round_id, sealed));
CREATE TABLE IF NOT EXISTS batches (
    batch_id BLOB PRIMARY KEY, session_id BLOB NOT NULL, round_id INTEGER NOT NULL,
    acknowledged INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS chunks (
    batch_id BLOB NOT NULL, chunk INTEGER NOT NULL, encoded BLOB NOT NULL, PRIMARY KEY (batch_id, chunk));
"""

#: What a finished round may have left behind (a process killed before its checkpoint, or an
#: earlier version of the spool): admitted rows of rounds that are no longer open, chunks of
#: acknowledged batches.
_LEFTOVERS = (
    "DELETE FROM admitted WHERE EXISTS (SELECT 1 FROM rounds r WHERE r.session_id = admitted.session_id "
    "AND r.round_id = admitted.round_id AND r.state != 'open')",
    "DELETE FROM chunks WHERE batch_id IN (SELECT batch_id FROM batches WHERE acknowledged = 1)",
)


def _storage_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite failing to store (full, I/O, locked, corrupt), not a constraint or a bug."""
    return isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, (sqlite3.IntegrityError, sqlite3.ProgrammingError))


@contextmanager
def _stored(what: str) -> Iterator[None]:
    """Raise a storage failure of SQLite inside as :class:`SpoolStorageError` (the original as its cause)."""
    try:
        yield
    except sqlite3.Error as exc:
        if not _storage_failure(exc):
            raise
        code = getattr(exc, "sqlite_errorname", None)
        raise SpoolStorageError(f"{what} not written: {exc}" + (f" ({code})" if code else "")) from exc


@contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _private_directory(directory: Path) -> Path:
    """``directory`` resolved, created 0700 if missing; :class:`SpoolAccessError` unless it is
    a directory of this user that no other user can read, search or write."""
    directory = Path(os.path.realpath(directory))
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise SpoolAccessError(f"cannot create the spool directory {directory}: {exc.strerror}") from None
    info = os.stat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise SpoolAccessError(f"{directory} is not a directory")
    if info.st_uid != os.geteuid():
        raise SpoolAccessError(f"spool directory {directory} belongs to uid {info.st_uid}, not to this user ({os.geteuid()})")
    if info.st_mode & 0o077:
        raise SpoolAccessError(
            f"spool directory {directory} is open to other users (mode {stat.S_IMODE(info.st_mode):04o}); "
            f"the spool links clients to their reports: make it private (chmod 700 {directory}) "
            "or name a spool file in a private or new directory (created with mode 0700)"
        )
    return directory


def _private_file(path: Path, *, create: bool) -> os.stat_result | None:
    """Make sure ``path`` (if it exists, or ``create``) is a regular file of this user with mode 0600;
    its status as checked (through the descriptor), or None if it does not exist."""
    flags = os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if os.path.islink(path):
            raise SpoolAccessError(f"spool file {path} is a symbolic link: name the file itself") from None
        raise SpoolAccessError(f"cannot open spool file {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SpoolAccessError(f"spool file {path} is not a regular file")
        if info.st_uid != os.geteuid():
            raise SpoolAccessError(f"spool file {path} belongs to uid {info.st_uid}, not to this user ({os.geteuid()})")
        if info.st_mode & 0o077:
            os.fchmod(fd, 0o600)
            _log.warning("spool file %s had mode %04o: set to 0600", path, stat.S_IMODE(info.st_mode))
    finally:
        os.close(fd)
    return info


class SqliteSpool:
    """:class:`Spool` on one SQLite file (or ``":memory:"`` for tests that need no restart).

    The file's directory must be private to this user (it is created with mode 0700 if
    it is missing); see the module's notes on data at rest. Raises :class:`SpoolAccessError`
    if it is not, :class:`SpoolStorageError` if a write fails."""

    def __init__(self, path: str | Path, *, durable_against_power_loss: bool = False) -> None:
        self.in_memory = str(path) == ":memory:"
        if self.in_memory:
            self.path = ":memory:"
        else:
            given = Path(path)
            self.path = str(_private_directory(given.parent) / given.name)
            checked = _private_file(Path(self.path), create=True)  # SQLite must open this very file
            for suffix in SIDE_FILES:
                _private_file(Path(self.path + suffix), create=False)
        #: A checkpoint that could not truncate the write-ahead log yet (retried later).
        self.scrub_pending = False
        self._scrub_tried = 0.0
        self._closed = False
        with _umask(0o077):  # whatever SQLite creates is private to this user
            self._db = sqlite3.connect(self.path, isolation_level=None)
            self._db.execute("PRAGMA secure_delete=ON")
            self._db.execute("PRAGMA temp_store=MEMORY")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={'FULL' if durable_against_power_loss else 'NORMAL'}")
            self._db.executescript(_SCHEMA)
            self._db.execute("SELECT COUNT(*) FROM rounds").fetchone()  # reads: SQLite creates the -shm file now
        if not self.in_memory:
            for suffix in SIDE_FILES:
                _private_file(Path(self.path + suffix), create=False)
            self._check_opened_file_is_the_checked_one(checked)
            self._drop_leftovers()

    def _check_opened_file_is_the_checked_one(self, checked: os.stat_result) -> None:
        """:class:`SpoolAccessError` unless SQLite holds open the very file that was checked.

        The checks above go by path, and SQLite opens by path again: a local user who can
        rename directories above the spool could swap in a directory of their own in
        between, and the spool would write its client-report links into a file they read.
        So the connection's open files (``/proc/self/fd``, Linux) must include the checked
        file's (device, inode); elsewhere the path is re-checked instead."""
        wanted = (checked.st_dev, checked.st_ino)
        fd_dir = Path("/proc/self/fd")
        if fd_dir.is_dir():
            held = set()
            for entry in fd_dir.iterdir():
                try:
                    info = os.stat(entry)
                except OSError:
                    continue
                held.add((info.st_dev, info.st_ino))
            ok = wanted in held
        else:
            info = os.lstat(self.path)
            ok = (info.st_dev, info.st_ino) == wanted
        if not ok:
            self._db.close()
            raise SpoolAccessError(f"spool file {self.path} changed while it was opened (a directory above it was "
                                   "replaced?): refusing to write client-report links into another file")

    def _drop_leftovers(self) -> None:
        """Delete what finished rounds left behind, then truncate the log (:meth:`_scrub`)."""
        dropped = True
        try:
            with self._transaction():
                for statement in _LEFTOVERS:
                    self._db.execute(statement)
        except sqlite3.Error as exc:  # e.g. the disk is full: tried again later
            if not _storage_failure(exc):
                raise
            _log.warning("spool %s: finished rounds' rows not deleted yet: %s", self.path, exc)
            dropped = False
        self._scrub()
        self.scrub_pending = self.scrub_pending or not dropped

    def _scrub(self) -> None:
        """Copy the write-ahead log into the (securely deleted) database and truncate it to zero
        bytes, so no earlier version of a deleted row stays in the log."""
        if self.in_memory:
            return
        self._scrub_tried = time.monotonic()
        waited = self._db.execute("PRAGMA busy_timeout").fetchone()[0]
        self._db.execute(f"PRAGMA busy_timeout={CHECKPOINT_WAIT_MS}")  # a reader elsewhere must not stall the service
        try:
            busy = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        except sqlite3.Error as exc:
            if not _storage_failure(exc):
                raise
            _log.warning("spool %s: write-ahead log not truncated (retried later): %s", self.path, exc)
            busy = 1
        finally:
            self._db.execute(f"PRAGMA busy_timeout={int(waited)}")
        if busy:
            _log.info("spool %s: write-ahead log in use by another connection: truncated later", self.path)
        self.scrub_pending = bool(busy)

    def _before_write(self) -> None:
        if self.scrub_pending:
            self._drop_leftovers()

    def _after_admission(self) -> None:
        if self.scrub_pending and time.monotonic() - self._scrub_tried >= SCRUB_RETRY_S:
            self._drop_leftovers()

    def open_round(self, session_id: bytes, round_id: int, signed_spec: bytes) -> StoredRound:
        """The stored round, created ``open`` if it is new (an existing round keeps its state)."""
        with _stored("round"):
            self._db.execute(
                "INSERT OR IGNORE INTO rounds (session_id, round_id, signed_spec, state) VALUES (?, ?, ?, 'open')",
                (session_id, round_id, signed_spec),
            )
        stored = self.round(session_id, round_id)
        assert stored is not None
        return stored

    def round(self, session_id: bytes, round_id: int) -> StoredRound | None:
        with _stored("read"):
            row = self._db.execute(
                "SELECT signed_spec, state FROM rounds WHERE session_id = ? AND round_id = ?", (session_id, round_id)
            ).fetchone()
        return None if row is None else StoredRound(session_id, round_id, row[0], row[1])

    def rounds(self, state: str) -> list[StoredRound]:
        with _stored("read"):
            rows = self._db.execute(
                "SELECT session_id, round_id, signed_spec, state FROM rounds WHERE state = ? ORDER BY round_id", (state,)
            ).fetchall()
        return [StoredRound(*row) for row in rows]

    def admit(self, session_id: bytes, round_id: int, envelope: AdmittedEnvelope) -> None:
        """Commit one admitted envelope, or raise :class:`ReplayedReport` / :class:`DuplicateReport`
        (or :class:`SpoolStorageError`: nothing written)."""
        self.admit_many(session_id, round_id, [envelope])

    def admit_many(self, session_id: bytes, round_id: int, envelopes: list[AdmittedEnvelope]) -> None:
        """Commit several admitted envelopes in one transaction (all or none), or raise as :meth:`admit`."""
        try:
            with _stored("admission"), self._transaction():
                self._db.executemany(
                    "INSERT INTO admitted (session_id, round_id, client_id, nonce, sealed) VALUES (?, ?, ?, ?, ?)",
                    [(session_id, round_id, e.client_id, e.nonce, e.sealed) for e in envelopes],
                )
        except sqlite3.IntegrityError as exc:
            if "nonce" in str(exc):
                raise ReplayedReport("nonce already admitted (spool)") from None
            raise DuplicateReport("sealed payload already admitted (spool)") from None
        self._after_admission()

    def admitted(self, session_id: bytes, round_id: int) -> list[AdmittedEnvelope]:
        with _stored("read"):
            rows = self._db.execute(
                "SELECT client_id, nonce, sealed FROM admitted WHERE session_id = ? AND round_id = ? ORDER BY seq",
                (session_id, round_id),
            ).fetchall()
        return [AdmittedEnvelope(*row) for row in rows]

    def release(self, session_id: bytes, round_id: int, batch_id: bytes, chunks: list[bytes]) -> None:
        """Store the batch's encoded chunks, mark the round released and delete its admitted rows
        (client ids, nonces, order of arrival), in one transaction; then truncate the log."""
        self._before_write()
        with _stored("batch"), self._transaction():
            self._db.execute(
                "INSERT INTO batches (batch_id, session_id, round_id) VALUES (?, ?, ?)", (batch_id, session_id, round_id)
            )
            self._db.executemany(
                "INSERT INTO chunks (batch_id, chunk, encoded) VALUES (?, ?, ?)",
                [(batch_id, index, encoded) for index, encoded in enumerate(chunks)],
            )
            self._advance(session_id, round_id, "released")
            self._db.execute(
                "DELETE FROM admitted WHERE session_id = ? AND round_id = ? AND EXISTS (SELECT 1 FROM rounds "
                "WHERE session_id = ? AND round_id = ? AND state != 'open')",
                (session_id, round_id, session_id, round_id),
            )
        self._scrub()

    def fail(self, session_id: bytes, round_id: int, reason: str) -> None:
        """Mark an open round failed and delete its admitted reports (they will never be forwarded)."""
        self._before_write()
        with _stored("round failure"), self._transaction():
            self._advance(session_id, round_id, "failed", reason)
            self._db.execute(
                "DELETE FROM admitted WHERE session_id = ? AND round_id = ? AND EXISTS (SELECT 1 FROM rounds "
                "WHERE session_id = ? AND round_id = ? AND state = 'failed')",
                (session_id, round_id, session_id, round_id),
            )
        self._scrub()

    def acknowledge(self, batch_id: bytes) -> tuple[bytes, int] | None:
        """Mark a batch acknowledged and its round served, delete its chunks and truncate the log;
        the batch's ``(session, round)``, or None for an unknown or repeated acknowledgement."""
        self._before_write()
        with _stored("acknowledgement"), self._transaction():
            row = self._db.execute(
                "SELECT session_id, round_id, acknowledged FROM batches WHERE batch_id = ?", (batch_id,)
            ).fetchone()
            if row is None or row[2]:
                return None
            self._db.execute("UPDATE batches SET acknowledged = 1 WHERE batch_id = ?", (batch_id,))
            self._advance(row[0], row[1], "served")
            self._db.execute("DELETE FROM chunks WHERE batch_id = ?", (batch_id,))
            self._db.execute("DELETE FROM admitted WHERE session_id = ? AND round_id = ?", (row[0], row[1]))
        self._scrub()
        return row[0], row[1]

    def unacknowledged(self) -> list[StoredBatch]:
        """Released batches the analyzer has not acknowledged, with their encoded chunks in order."""
        with _stored("read"):
            rows = self._db.execute(
                "SELECT batch_id, session_id, round_id FROM batches WHERE acknowledged = 0 ORDER BY round_id"
            ).fetchall()
            return [
                StoredBatch(
                    batch_id,
                    session_id,
                    round_id,
                    [c for (c,) in self._db.execute("SELECT encoded FROM chunks WHERE batch_id = ? ORDER BY chunk", (batch_id,))],
                )
                for batch_id, session_id, round_id in rows
            ]

    def close(self) -> None:
        """Truncate a log left pending, then close. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.scrub_pending:
            try:
                self._drop_leftovers()
            except sqlite3.Error as exc:
                _log.warning("spool %s: closed with its write-ahead log not truncated: %s", self.path, exc)
        self._db.close()

    def _advance(self, session_id: bytes, round_id: int, state: str, reason: str | None = None) -> None:
        """Move a round to ``state`` if that is later than its current state (never backwards)."""
        earlier = ROUND_STATES[: ROUND_STATES.index(state)]
        if state == "failed":
            earlier = ("open",)
        marks = ",".join("?" * len(earlier))
        self._db.execute(
            f"UPDATE rounds SET state = ?, reason = ? WHERE session_id = ? AND round_id = ? AND state IN ({marks})",
            (state, reason, session_id, round_id, *earlier),
        )

    def _transaction(self):
        return _Transaction(self._db)


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, or ``ROLLBACK`` on an exception, which then propagates
    unchanged: SQLite may have rolled the transaction back itself (it does on a full disk), and a
    second ROLLBACK's own error must not replace the error that matters."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            try:
                self._db.execute("COMMIT")
                return False
            except BaseException:
                self._rollback()
                raise
        self._rollback()
        return False

    def _rollback(self) -> None:
        if not self._db.in_transaction:
            return
        try:
            self._db.execute("ROLLBACK")
        except sqlite3.Error as exc:  # logged, never raised: the caller's error is the one that counts
            _log.warning("spool: ROLLBACK failed: %s", exc)

