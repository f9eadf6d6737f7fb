"""The analyzer's durable session state: every round it announced, and what each one gave.

A round id names one spec for ever. An analyzer that restarts with its round counter in
memory would sign a second spec for round 0 of a session whose first round-0 spec is
still being answered; the spec digest that binds every report and chunk
(:attr:`RoundSpec.digest`) already keeps the old batch out of the new spec, but the
session would still have two specs for one round, and clients that answered the first
would be charged for a round that never counts. So the coordinator writes each round
here *before* it announces it, and a restarted coordinator resumes from this file:

* a round recorded as **completed** is not run again: its result (the opened report
  values, the rejections, the batch sizes) is read back and fed to the protocol, which
  must ask for exactly the same round (else :class:`SessionMismatch`);
* a round recorded as **announced** but not completed is served again under the very
  same signed bytes (Ed25519 and the canonical encoding are deterministic), so the
  shuffler's re-published batch, or its signed outcome, can still complete it;
* a round recorded as **failed** ends the session (:class:`BatchTooSmall`), and is never
  announced again.

The file is SQLite (standard library), written in WAL mode with a commit per state
change, created 0600 in a directory no one else may write (:func:`_open_private`); a
resumed round's stored spec must still verify under the analyzer's own key. Nothing in it links a report to a client: the analyzer never
sees a credential; it holds the report values the analyzer opened anyway.

**A rolled-back file.** A copy of the file restored from before a round was recorded no
longer knows that round, and would let the coordinator sign a second spec for its id. So
the store also keeps a *round high-water mark* per session in a second, small file
(:data:`HIGH_WATER_FILE`; beside the state file by default, in the key directory for
``analyzer run``): the highest round id it recorded, written durably (a new file
fsynced, renamed over the old one, the directory fsynced) after the round is recorded
and before its spec leaves (:meth:`SessionStore.announce`, and
:meth:`SessionStore.advance_high_water` when a resumed round is served again). A new
round whose id is at or below the mark is refused (:class:`SessionMismatch`): the
state file was rolled back or replaced. The mark only grows, and restoring the state
file (with its ``-wal``/``-shm``) does not reach it; restoring both files together does,
which ``analyzer run``'s broker check covers while the broker retains the session's
spec (``shuffledp/cli/analyzer.py``).
"""

from __future__ import annotations

import io
import json
import os
import sqlite3
import stat
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shuffledp.protocol.wire import codec
from shuffledp.protocol.errors import BatchTooSmall, InvalidParameter, ShuffleDPError
from shuffledp.protocol.wire.messages import RoundSpec, SignedRoundSpec

ANNOUNCED, COMPLETED, FAILED = "announced", "completed", "failed"
#: The file of the round high-water marks (JSON: session id in hex -> highest round id recorded).
HIGH_WATER_FILE = "analyzer-high-water.json"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rounds (
    session_id BLOB NOT NULL,
    round_id INTEGER NOT NULL,
    signed_spec BLOB NOT NULL,
    state TEXT NOT NULL,
    result BLOB,
    PRIMARY KEY (session_id, round_id)
);
CREATE TABLE IF NOT EXISTS sessions (
    session_id BLOB PRIMARY KEY,
    config TEXT NOT NULL
);
"""


class SessionMismatch(ShuffleDPError):
    """A restarted analyzer asked for a round other than the one its session file recorded."""

    reason = "session-mismatch"


@dataclass(frozen=True)
class StoredRoundResult:
    """What a completed round gave, as the coordinator needs it to resume the protocol."""

    values: np.ndarray
    rejected: Counter
    batch_bytes: int
    batch_ids: tuple[bytes, ...]
    batch_sizes: tuple[int, ...]
    chunks: int
    failed_instances: int

    def encode(self) -> bytes:
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(self.values, dtype="<i8"), allow_pickle=False)
        meta = {
            "rejected": dict(self.rejected), "batch_bytes": self.batch_bytes,
            "batch_ids": [b.hex() for b in self.batch_ids], "batch_sizes": list(self.batch_sizes),
            "chunks": self.chunks, "failed_instances": self.failed_instances,
        }
        head = json.dumps(meta, sort_keys=True).encode()
        return len(head).to_bytes(4, "big") + head + buffer.getvalue()

    @classmethod
    def decode(cls, data: bytes) -> "StoredRoundResult":
        size = int.from_bytes(data[:4], "big")
        meta = json.loads(data[4 : 4 + size])
        values = np.load(io.BytesIO(data[4 + size :]), allow_pickle=False).astype(np.int64)
        return cls(values, Counter(meta["rejected"]), meta["batch_bytes"], tuple(bytes.fromhex(b) for b in meta["batch_ids"]),
                   tuple(meta["batch_sizes"]), meta["chunks"], meta["failed_instances"])


@dataclass(frozen=True)
class StoredAnalyzerRound:
    """One round of the session file: its signed spec, its state and, once completed, its result."""

    round_id: int
    signed_spec: bytes
    state: str
    result: StoredRoundResult | None

    @property
    def spec(self) -> RoundSpec:
        return codec.decode(codec.decode(self.signed_spec, SignedRoundSpec).spec_bytes, RoundSpec)


class SessionStore:
    """The rounds one analyzer announced, per session, in a private SQLite file (see the module docstring)."""

    def __init__(self, path: Path | str, *, high_water: Path | str | None = None) -> None:
        self.path = Path(path)
        #: The round high-water marks' file (None for an in-memory store): ``high_water``, else
        #: :data:`HIGH_WATER_FILE` beside the state file.
        self.high_water_path: Path | None = None
        if str(path) == ":memory:":
            self._db = sqlite3.connect(":memory:", isolation_level=None)
        else:
            self._db = _open_private(self.path)
            self.high_water_path = Path(high_water) if high_water is not None else self.path.parent / HIGH_WATER_FILE
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    # -- the session's configuration --------------------------------------------------------
    def check_config(self, session_id: bytes, config: dict) -> bool:
        """Record the session's configuration, or check it against the recorded one; whether the
        session already had one (a resumed session). :class:`SessionMismatch` if it differs."""
        text = json.dumps(config, sort_keys=True)
        row = self._db.execute("SELECT config FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
        if row is None:
            self._db.execute("INSERT INTO sessions (session_id, config) VALUES (?, ?)", (session_id, text))
            return False
        if row[0] != text:
            recorded, now = json.loads(row[0]), config
            changed = sorted(k for k in set(recorded) | set(now) if recorded.get(k) != now.get(k))
            raise SessionMismatch(
                f"session {session_id.hex()} was started with other parameters ({', '.join(changed)}); "
                "a session resumes only with the parameters it started with")
        return True

    # -- rounds -------------------------------------------------------------------------------
    def round(self, session_id: bytes, round_id: int) -> StoredAnalyzerRound | None:
        row = self._db.execute(
            "SELECT signed_spec, state, result FROM rounds WHERE session_id = ? AND round_id = ?", (session_id, round_id)
        ).fetchone()
        if row is None:
            return None
        result = StoredRoundResult.decode(row[2]) if row[2] is not None else None
        return StoredAnalyzerRound(round_id, row[0], row[1], result)

    def rounds(self, session_id: bytes) -> list[StoredAnalyzerRound]:
        ids = [r[0] for r in self._db.execute(
            "SELECT round_id FROM rounds WHERE session_id = ? ORDER BY round_id", (session_id,))]
        return [r for i in ids if (r := self.round(session_id, i)) is not None]  # a round deleted meanwhile is gone

    def announce(self, session_id: bytes, round_id: int, signed_spec: bytes) -> None:
        """Record a round before it is announced, then raise the session's high-water mark to it;
        refuses a round id already recorded, or one at or below the mark that this file does not
        record (the file was rolled back or replaced): a round id names one spec for ever."""
        self.check_unannounced(session_id, round_id)
        try:
            self._db.execute("INSERT INTO rounds (session_id, round_id, signed_spec, state) VALUES (?, ?, ?, ?)",
                             (session_id, round_id, signed_spec, ANNOUNCED))
        except sqlite3.IntegrityError:
            raise SessionMismatch(f"round {round_id} of session {session_id.hex()} was already announced") from None
        self.advance_high_water(session_id, round_id)

    def check_unannounced(self, session_id: bytes, round_id: int) -> None:
        """Refuse (:class:`SessionMismatch`) a round id this file records, or one at or below the session's
        high-water mark: the coordinator calls it before it signs a new spec."""
        if self.round(session_id, round_id) is not None:
            raise SessionMismatch(f"round {round_id} of session {session_id.hex()} was already announced")
        mark = self.high_water(session_id)
        if mark is not None and round_id <= mark:
            raise SessionMismatch(
                f"round {round_id} of session {session_id.hex()} was already announced (the high-water mark in "
                f"{self.high_water_path} is round {mark}) but the state file {self.path} does not record it: the file "
                "was rolled back or replaced, and a round id is never announced twice; start a new session")

    # -- the round high-water mark -------------------------------------------------------------
    def high_water(self, session_id: bytes) -> int | None:
        """The highest round id of the session this analyzer ever recorded (None: none, or an
        in-memory store). The file must be private (as the state file); an unreadable one is refused."""
        marks = self._read_marks()
        return marks.get(session_id.hex())

    def rolled_back(self, session_id: bytes) -> int | None:
        """The session's high-water round if this state file does not record it (the file was rolled
        back or replaced), else None."""
        mark = self.high_water(session_id)
        return mark if mark is not None and self.round(session_id, mark) is None else None

    def advance_high_water(self, session_id: bytes, round_id: int) -> None:
        """Raise the session's mark to ``round_id`` (never lower it), durably: a new private file,
        fsynced, renamed over the old one, then the directory fsynced."""
        if self.high_water_path is None:
            return
        marks = self._read_marks()
        key = session_id.hex()
        if marks.get(key, -1) >= round_id:
            return
        marks[key] = round_id
        _write_private(self.high_water_path, json.dumps(marks, sort_keys=True).encode())

    def _read_marks(self) -> dict[str, int]:
        if self.high_water_path is None:
            return {}
        data = _read_private(self.high_water_path, "the round high-water file")
        if data is None:
            return {}
        try:
            marks = json.loads(data)
            if not isinstance(marks, dict) or not all(
                    isinstance(k, str) and type(v) is int and v >= 0 for k, v in marks.items()):
                raise ValueError("not an object of round ids")
        except ValueError as exc:
            raise _refuse(self.high_water_path, f"the round high-water file is unreadable ({exc})") from None
        return marks

    def complete(self, session_id: bytes, round_id: int, result: StoredRoundResult) -> None:
        self._set(session_id, round_id, COMPLETED, result.encode())

    def fail(self, session_id: bytes, round_id: int) -> None:
        self._set(session_id, round_id, FAILED, None)

    def _set(self, session_id: bytes, round_id: int, state: str, result: bytes | None) -> None:
        cursor = self._db.execute(
            "UPDATE rounds SET state = ?, result = ? WHERE session_id = ? AND round_id = ? AND state = ?",
            (state, result, session_id, round_id, ANNOUNCED))
        if cursor.rowcount != 1:
            raise SessionMismatch(f"round {round_id} of session {session_id.hex()} is not an announced round")


def _refuse(path: Path, why: str) -> InvalidParameter:
    return InvalidParameter("analyzer state", f"{path}: {why}")


def _check_private(path: Path, info: os.stat_result, what: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise _refuse(path, f"{what} is not a regular file")
    if info.st_uid != os.geteuid():
        raise _refuse(path, f"{what} belongs to uid {info.st_uid}, not to this user")
    if info.st_mode & 0o077:
        raise _refuse(path, f"{what} must be readable by no one else (mode 0600; it is {stat.S_IMODE(info.st_mode):04o})")


def _open_private(path: Path) -> sqlite3.Connection:
    """The session file as a WAL-mode SQLite connection, after checking that no one else can have
    written it or its log: its directory is this user's and writable by no one else (else a local
    user could plant a ``-wal`` file that SQLite replays into the session); the file, its ``-wal``
    and ``-shm`` are regular files of this user, mode 0600, none a symbolic link; and the name still
    holds the checked file once SQLite has opened it. Since no one else may write the directory, no
    one else can swap the name in between (a swap of a directory above it needs write access there:
    a sticky ``/tmp`` refuses it)."""
    directory = path.parent if str(path.parent) else Path(".")
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise _refuse(path, f"cannot open its directory ({exc.strerror})") from None
    try:
        info = os.fstat(dir_fd)
        if info.st_uid not in (os.geteuid(), 0) or info.st_mode & 0o022:
            raise _refuse(path, f"its directory {directory} must be this user's and writable by no one else "
                                f"(chmod go-w {directory}), or name a file in such a directory")
        fd = os.open(path.name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        try:
            checked = os.fstat(fd)
            _check_private(path, checked, "the file")
        finally:
            os.close(fd)
        for suffix in ("-wal", "-shm"):
            try:
                side = os.stat(path.name + suffix, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            _check_private(path, side, f"its {suffix} file")
        db = sqlite3.connect(str(path), isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            now = os.stat(path.name, dir_fd=dir_fd, follow_symlinks=False)
            if (now.st_dev, now.st_ino) != (checked.st_dev, checked.st_ino):
                raise _refuse(path, "the file changed while it was opened")
        except BaseException:
            db.close()
            raise
        return db
    finally:
        os.close(dir_fd)


def _private_directory(path: Path) -> int:
    """An open descriptor of ``path``'s directory, checked as :func:`_open_private` checks it."""
    directory = path.parent if str(path.parent) else Path(".")
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise _refuse(path, f"cannot open its directory ({exc.strerror})") from None
    info = os.fstat(dir_fd)
    if info.st_uid not in (os.geteuid(), 0) or info.st_mode & 0o022:
        os.close(dir_fd)
        raise _refuse(path, f"its directory {directory} must be this user's and writable by no one else "
                            f"(chmod go-w {directory})")
    return dir_fd


def _read_private(path: Path, what: str) -> bytes | None:
    """The bytes of a private file of this user (None if it does not exist); a file someone else
    could have written (or a symbolic link) is refused."""
    dir_fd = _private_directory(path)
    try:
        try:
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _refuse(path, f"cannot open {what} ({exc.strerror})") from None
        with os.fdopen(fd, "rb") as handle:
            _check_private(path, os.fstat(handle.fileno()), what)
            return handle.read()
    finally:
        os.close(dir_fd)


def _write_private(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably, mode 0600."""
    dir_fd = _private_directory(path)
    temporary = f".{path.name}.{os.getpid()}.tmp"
    try:
        try:
            os.unlink(temporary, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        os.fsync(dir_fd)
    except OSError as exc:  # e.g. a full disk: nothing is announced until the mark is written
        raise _refuse(path, f"cannot write the round high-water file ({exc.strerror})") from None
    finally:
        os.close(dir_fd)


def failed_round(stored: StoredAnalyzerRound) -> BatchTooSmall:
    """The error a resumed session stops with at a round that failed before the restart."""
    return BatchTooSmall(f"round {stored.round_id} failed before this analyzer restarted; the session cannot go on "
                         "(a round id is never announced twice): start a new session")
