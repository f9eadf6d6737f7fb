"""The shuffler's durable spool: rounds, admitted envelopes and released batches.

An admitted envelope is written (and committed) to the spool before the shuffler
counts it as admitted, so a shuffler killed with ``kill -9`` and restarted on the
same spool resumes every open round with its admission state: the nonces and
sealed payloads already seen (so nothing is admitted twice), each client's quota,
and the payloads themselves. A round's state only moves forward
(``open -> released -> served``, ``open -> failed``, or ``released -> failed`` when
its batch is given up unacknowledged, :meth:`SqliteSpool.expire`), and ``served`` and
``failed`` are final, so a released, served or failed round is never re-opened,
whatever announcements are replayed to the shuffler.

A released batch (its signed chunks) stays in the spool, under its batch id, until
the analyzer acknowledges it or the shuffler gives it up (:meth:`SqliteSpool.expire`:
the round is recorded ``failed`` with its reason, never ``served``, and the batch is
never published again); a restarted shuffler publishes unacknowledged batches
again, and the analyzer takes one batch id per round and ignores chunks it already
holds: delivery is at least once on the wire and exactly once at the analyzer.

Data at rest. The spool's files never link a client to a report for longer than
the shuffler needs the link, and only its own user can read them:

* **Modes.** The database and its ``-wal`` and ``-shm`` files are mode 0600 from
  the moment they exist (the spool creates all three with :func:`os.open`, mode 0600,
  never through a symbolic link, before SQLite opens them; whatever SQLite creates
  itself it creates under a 0077 umask with the database's mode), in a directory of
  mode 0700 owned by the shuffler's user (created so if it is missing). A directory
  other users can read, search or write, or that belongs to another user, a spool
  file that is a symbolic link, not a regular file or another user's, is refused
  with :class:`SpoolAccessError`; spool files left with a looser mode (e.g. by an
  earlier version) are set to 0600.
* **The files checked are the files written.** The directory is opened once and
  every check goes through its descriptor, but SQLite opens by path (the database at
  the connect, the ``-wal`` file when WAL mode is switched on or at a new file's first
  write, the ``-shm`` file at the first read). So before anything of a client is
  written, the descriptors that appeared in the process during the connect
  (``/proc/self/fd``) must be the checked database and the ``-wal`` and ``-shm``
  files in the checked directory (by device and inode), else :class:`SpoolAccessError`:
  a directory above the spool renamed or swapped at one of those moments never gets
  the log of client-report links. Without ``/proc/self/fd`` (not Linux) the paths are
  checked again instead, which misses a swap undone before that check.
* **While a round is open** the spool holds, per admitted envelope, the client id
  (the credential's id, for the per-client quota), the nonce, the sealed report and
  the order of arrival: exactly what resuming the round needs.
* **At release** the round's admitted rows (client ids, nonces, arrival order) are
  deleted in the transaction that stores the permuted batch: from then on the spool
  holds the round's sealed reports only in the permuted, signed chunks, with no
  client id, no nonce and no arrival order.
* **At the acknowledgement** (or when a round fails, or its batch is given up) the
  chunks (or the admitted rows) are deleted too; only the round's state (and a failed
  round's reason), its signed spec and its batch id remain.
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

import errno
import logging
import os
import sqlite3
import stat
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal, NamedTuple, Protocol

from shuffledp.protocol.held_files import FD_DIR, held_files
from shuffledp.protocol.errors import DuplicateReport, ReplayedReport, ShuffleDPError

_log = logging.getLogger(__name__)

#: Round states; each may only move to a later one (``served`` and ``failed`` are final, and a
#: round fails only from ``open``, or from ``released`` when its batch is given up).
ROUND_STATES = ("open", "released", "served", "failed")
#: ``batches.acknowledged``: still to be delivered, acknowledged by the analyzer, given up unacknowledged.
BATCH_PENDING, BATCH_ACKNOWLEDGED, BATCH_EXPIRED = 0, 1, 2
#: The reason :meth:`SqliteSpool.expire` records for a round whose batch was given up.
NOT_ACKNOWLEDGED = "not-acknowledged"
#: Files SQLite keeps next to the database (WAL mode uses the first two; the last only while switching modes).
SIDE_FILES = ("-wal", "-shm", "-journal")
#: How long a checkpoint waits for another connection's reader before it is left for later.
CHECKPOINT_WAIT_MS = 100
#: Least seconds between two retries of a pending checkpoint made by admissions (so a reader that
#: stays does not slow every admission down).
SCRUB_RETRY_S = 5.0


def states_before(state: str, after: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The states a round may move to ``state`` from: the earlier ones of :data:`ROUND_STATES`
    (never backwards, never out of ``served`` or ``failed``); ``failed`` only from ``open``,
    unless ``after`` names the states it may follow. Every spool moves rounds by this rule."""
    if state == "failed":
        return after if after is not None else ("open",)
    return ROUND_STATES[: ROUND_STATES.index(state)]


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


class AdmittedEnvelope(NamedTuple):
    """One admitted envelope as the spool keeps it until its round is released (a named tuple: the
    shuffler makes one per envelope)."""

    client_id: bytes
    nonce: bytes
    sealed: bytes


@dataclass(frozen=True)
class StoredRound:
    session_id: bytes
    round_id: int
    signed_spec: bytes
    state: str

    @property
    def spec_digest(self) -> bytes:
        """The digest binding the round to the spec stored here (the bytes the shuffler verified)."""
        from shuffledp.protocol.wire import codec
        from shuffledp.protocol.wire.messages import SignedRoundSpec, spec_digest_of

        return spec_digest_of(codec.decode(self.signed_spec, SignedRoundSpec).spec_bytes)


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

    def expire(self, batch_id: bytes, reason: str = NOT_ACKNOWLEDGED) -> tuple[bytes, int] | None: ...

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
#: acknowledged or given-up batches.
_LEFTOVERS = (
    "DELETE FROM admitted WHERE EXISTS (SELECT 1 FROM rounds r WHERE r.session_id = admitted.session_id "
    "AND r.round_id = admitted.round_id AND r.state != 'open')",
    f"DELETE FROM chunks WHERE batch_id IN (SELECT batch_id FROM batches WHERE acknowledged != {BATCH_PENDING})",
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


#: Flags of every check-then-use open: no symbolic link as the last component, not inherited by
#: child processes, no blocking on a FIFO planted under a spool file's name.
_OPEN_FLAGS = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)


def _private_directory(directory: Path) -> tuple[Path, int]:
    """``directory`` resolved, created 0700 if missing, and opened (not through a symbolic link):
    :class:`SpoolAccessError` unless what was opened is a directory of this user that no other
    user can read, search or write (checked through the descriptor). The path and the descriptor
    (every spool file is opened and checked relative to it, so a directory swapped in after the
    check is never the one checked)."""
    directory = Path(os.path.realpath(directory))
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise SpoolAccessError(f"cannot create the spool directory {directory}: {exc.strerror}") from None
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _OPEN_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise SpoolAccessError(f"{directory} is not a directory (or is a symbolic link)") from None
        raise SpoolAccessError(f"cannot open the spool directory {directory}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
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
    except BaseException:
        os.close(fd)
        raise
    return directory, fd


def _private_file(directory_fd: int, path: Path, *, create: bool) -> os.stat_result | None:
    """Make sure ``path``'s name in the checked directory (if it exists, or ``create``: created 0600)
    is a regular file of this user with mode 0600; its status as checked (through the descriptor),
    or None if it does not exist."""
    flags = os.O_RDWR | _OPEN_FLAGS | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path.name, flags, 0o600, dir_fd=directory_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
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


def _held_name(fd: int) -> str:
    """The base name of the file descriptor ``fd`` was opened on (``/proc/self/fd``), or ""."""
    try:
        return os.path.basename(os.readlink(f"{FD_DIR}/{fd}").removesuffix(" (deleted)"))
    except OSError:
        return ""


def _new_files(before: dict[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """The descriptors of this process that appeared (or now hold another file) since ``before``."""
    after = held_files() or {}
    return {fd: identity for fd, identity in after.items() if before.get(fd) != identity}


def _identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of ``path`` itself (not following a link), or None if it is missing."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


class SqliteSpool:
    """:class:`Spool` on one SQLite file (or ``":memory:"`` for tests that need no restart).

    The file's directory must be private to this user (it is created with mode 0700 if
    it is missing); see the module's notes on data at rest. Raises :class:`SpoolAccessError`
    if it is not, :class:`SpoolStorageError` if a write fails."""

    def __init__(self, path: str | Path, *, durable_against_power_loss: bool = False) -> None:
        self.in_memory = str(path) == ":memory:"
        #: A checkpoint that could not truncate the write-ahead log yet (retried later).
        self.scrub_pending = False
        self._scrub_tried = 0.0
        self._closed = False
        if self.in_memory:
            self.path = ":memory:"
            self._db = sqlite3.connect(self.path, isolation_level=None)
            self._configure(durable_against_power_loss)
            return
        given = Path(path)
        directory, directory_fd = _private_directory(given.parent)
        self.path = str(directory / given.name)
        try:
            self._open_checked(directory_fd, durable_against_power_loss)
        finally:
            os.close(directory_fd)
        self._drop_leftovers()

    def _configure(self, durable_against_power_loss: bool) -> None:
        self._db.execute("PRAGMA secure_delete=ON")
        self._db.execute("PRAGMA temp_store=MEMORY")
        self._db.execute("PRAGMA journal_mode=WAL")  # SQLite opens (or creates) the -wal file by path now
        self._db.execute(f"PRAGMA synchronous={'FULL' if durable_against_power_loss else 'NORMAL'}")
        self._db.executescript(_SCHEMA)
        self._db.execute("SELECT COUNT(*) FROM rounds").fetchone()  # a read: the -shm file is open from here

    def _open_checked(self, directory_fd: int, durable_against_power_loss: bool) -> None:
        """Connect to the spool file in the checked directory, and make sure SQLite holds the very
        files that were checked, or :class:`SpoolAccessError` (the connection closed, nothing of a
        client written).

        Every check goes through the directory's descriptor; SQLite opens by path: the database at
        the connect, the ``-wal`` file when WAL mode is switched on (a new file's: at its first write,
        the empty tables), the ``-shm`` file at the first read. A local user who can rename directories above the spool could swap in a directory of
        their own at either moment, and the spool would write its client-report links (the log
        holds every admitted row until a checkpoint) into a file they chose. So the ``-wal`` and
        ``-shm`` files are created (0600, never through a link) in the checked directory before
        SQLite opens them, and the descriptors SQLite opened during this connect must be those
        files: :meth:`_check_opened_file_is_the_checked_one`, :meth:`_check_side_files`."""
        checked = _private_file(directory_fd, Path(self.path), create=True)  # SQLite must open this very file
        assert checked is not None
        for suffix in SIDE_FILES:  # the log and its index exist, private, before SQLite opens them by path
            _private_file(directory_fd, Path(self.path + suffix), create=suffix != "-journal")
        with _umask(0o077):  # whatever SQLite creates is private to this user
            before = held_files()
            self._db = sqlite3.connect(self.path, isolation_level=None)
            try:
                self._check_opened_file_is_the_checked_one(checked, before)
                self._configure(durable_against_power_loss)
                self._check_side_files(directory_fd, checked, before)
            except BaseException:
                self._db.close()
                raise

    def _refuse(self, what: str) -> SpoolAccessError:
        return SpoolAccessError(f"spool file {what} changed while it was opened (a directory above it was "
                                "replaced?): refusing to write client-report links into another file")

    def _check_opened_file_is_the_checked_one(self, checked: os.stat_result,
                                              before: dict[int, tuple[int, int]] | None) -> None:
        """:class:`SpoolAccessError` unless SQLite opened, in this connect, the very database file
        that was checked.

        With ``/proc/self/fd`` (Linux), every descriptor that appeared during the connect (``before``
        is the process's descriptors just before it) under the spool's file name must hold the
        checked file's (device, inode): another connection of this process to the same file, or
        any descriptor opened earlier, proves nothing about what this connect opened. If none
        appeared, SQLite reused a descriptor it keeps open for a file of this process, chosen by
        the (device, inode) it found at the path; that is accepted only if it is the checked file
        and the path still names it. Elsewhere (no ``/proc``) the path is
        re-checked instead, which is weaker: a directory swapped in for the connect and swapped
        back before this check is not seen."""
        wanted = (checked.st_dev, checked.st_ino)
        if before is not None:
            new = _new_files(before)
            named = {identity for fd, identity in new.items() if _held_name(fd) == os.path.basename(self.path)}
            if named:
                ok = named == {wanted}
            else:
                # No new descriptor for the database: SQLite reused one it keeps for a file this process
                # already has open. It chooses that descriptor by the (device, inode) it finds at the path
                # during the connect, so the file at the path then was the one it reuses; it must be ours.
                held = held_files() or {}
                ok = wanted in held.values() and _identity(self.path) == wanted
        else:
            ok = _identity(self.path) == wanted
        if not ok:
            raise self._refuse(self.path)

    def _check_side_files(self, directory_fd: int, checked: os.stat_result,
                          before: dict[int, tuple[int, int]] | None) -> None:
        """:class:`SpoolAccessError` unless the ``-wal`` and ``-shm`` files SQLite opened (by path, after
        the connect) are the ones in the checked directory (their (device, inode) through its descriptor).

        With ``/proc/self/fd``: the ``-wal`` file must be held by a descriptor that appeared during the
        connect; the ``-shm`` file too, or by one held before it (SQLite shares one ``-shm`` descriptor
        among a process's connections to a database, so a second connection opens none); and no
        descriptor that appeared names a file of the spool's (by its base name) that is not the
        checked one. Elsewhere the paths are re-checked (weaker, as for the database file)."""
        expected = {"": (checked.st_dev, checked.st_ino)}
        for suffix in SIDE_FILES:
            info = _private_file(directory_fd, Path(self.path + suffix), create=False)
            if info is not None:
                expected[suffix] = (info.st_dev, info.st_ino)
        if "-wal" not in expected or "-shm" not in expected:  # SQLite made them elsewhere (and ours were deleted)
            raise self._refuse(self.path + ("-wal" if "-wal" not in expected else "-shm"))
        if before is None:
            for suffix in ("-wal", "-shm"):
                if _identity(self.path + suffix) != expected[suffix]:
                    raise self._refuse(self.path + suffix)
            return
        new = _new_files(before)
        if expected["-wal"] not in new.values():
            raise self._refuse(self.path + "-wal")
        if expected["-shm"] not in new.values() and expected["-shm"] not in before.values():
            raise self._refuse(self.path + "-shm")
        name = Path(self.path).name
        ours = set(expected.values())
        for fd, identity in new.items():
            held = _held_name(fd)
            if identity not in ours and held in {name + suffix for suffix in ("", *SIDE_FILES)}:
                raise self._refuse(self.path + held[len(name):])

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
            if row is None or row[2] != BATCH_PENDING:
                return None
            self._db.execute("UPDATE batches SET acknowledged = ? WHERE batch_id = ?", (BATCH_ACKNOWLEDGED, batch_id))
            self._advance(row[0], row[1], "served")
            self._db.execute("DELETE FROM chunks WHERE batch_id = ?", (batch_id,))
            self._db.execute("DELETE FROM admitted WHERE session_id = ? AND round_id = ?", (row[0], row[1]))
        self._scrub()
        return row[0], row[1]

    def expire(self, batch_id: bytes, reason: str = NOT_ACKNOWLEDGED) -> tuple[bytes, int] | None:
        """Give up a released batch the analyzer never acknowledged: mark the batch given up and its
        round ``failed`` (``released -> failed``, ``reason`` recorded; never ``served``), delete its
        chunks and any admitted rows of the round, and truncate the log, as :meth:`acknowledge` does.
        The batch's ``(session, round)``, or None for an unknown, acknowledged or already given-up
        batch (nothing changes: ``served`` and ``failed`` are final)."""
        self._before_write()
        with _stored("expiry"), self._transaction():
            row = self._db.execute(
                "SELECT session_id, round_id, acknowledged FROM batches WHERE batch_id = ?", (batch_id,)
            ).fetchone()
            if row is None or row[2] != BATCH_PENDING:
                return None
            self._db.execute("UPDATE batches SET acknowledged = ? WHERE batch_id = ?", (BATCH_EXPIRED, batch_id))
            self._advance(row[0], row[1], "failed", reason, after=("released",))
            self._db.execute("DELETE FROM chunks WHERE batch_id = ?", (batch_id,))
            self._db.execute("DELETE FROM admitted WHERE session_id = ? AND round_id = ?", (row[0], row[1]))
        self._scrub()
        return row[0], row[1]

    def unacknowledged(self) -> list[StoredBatch]:
        """Released batches the analyzer has not acknowledged, with their encoded chunks in order."""
        with _stored("read"):
            rows = self._db.execute(
                "SELECT batch_id, session_id, round_id FROM batches WHERE acknowledged = ? ORDER BY round_id",
                (BATCH_PENDING,),
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

    def _advance(self, session_id: bytes, round_id: int, state: str, reason: str | None = None,
                 after: tuple[str, ...] | None = None) -> None:
        """Move a round to ``state`` if that is later than its current state (never backwards, never out of
        ``served`` or ``failed``); ``failed`` only from ``open``, unless ``after`` names the states it may follow."""
        earlier = states_before(state, after)
        assert set(earlier) <= {"open", "released"}, earlier
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

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
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

