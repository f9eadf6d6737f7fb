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
Once a batch is acknowledged, or a round fails, its sealed reports are deleted:
the shuffler keeps ciphertexts no longer than it needs them.

:class:`SqliteSpool` is the embedded default: SQLite in WAL mode with
``synchronous=NORMAL`` (a commit survives the process being killed; surviving a
power loss needs ``synchronous=FULL``, pass ``durable_against_power_loss=True``).
Uniqueness of nonces and sealed payloads per round is enforced by the database
itself, so even two shuffler processes on one spool cannot admit a copy twice.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from shuffledp.protocol.errors import DuplicateReport, ReplayedReport

#: Round states; each may only move to a later one.
ROUND_STATES = ("open", "released", "served", "failed")


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


class SqliteSpool:
    """:class:`Spool` on one SQLite file (or ``":memory:"`` for tests that need no restart)."""

    def __init__(self, path: str | Path, *, durable_against_power_loss: bool = False) -> None:
        self.path = str(path)
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={'FULL' if durable_against_power_loss else 'NORMAL'}")
        self._db.executescript(_SCHEMA)

    def open_round(self, session_id: bytes, round_id: int, signed_spec: bytes) -> StoredRound:
        """The stored round, created ``open`` if it is new (an existing round keeps its state)."""
        self._db.execute(
            "INSERT OR IGNORE INTO rounds (session_id, round_id, signed_spec, state) VALUES (?, ?, ?, 'open')",
            (session_id, round_id, signed_spec),
        )
        stored = self.round(session_id, round_id)
        assert stored is not None
        return stored

    def round(self, session_id: bytes, round_id: int) -> StoredRound | None:
        row = self._db.execute(
            "SELECT signed_spec, state FROM rounds WHERE session_id = ? AND round_id = ?", (session_id, round_id)
        ).fetchone()
        return None if row is None else StoredRound(session_id, round_id, row[0], row[1])

    def rounds(self, state: str) -> list[StoredRound]:
        rows = self._db.execute(
            "SELECT session_id, round_id, signed_spec, state FROM rounds WHERE state = ? ORDER BY round_id", (state,)
        )
        return [StoredRound(*row) for row in rows]

    def admit(self, session_id: bytes, round_id: int, envelope: AdmittedEnvelope) -> None:
        """Commit one admitted envelope, or raise :class:`ReplayedReport` / :class:`DuplicateReport`."""
        try:
            self._db.execute(
                "INSERT INTO admitted (session_id, round_id, client_id, nonce, sealed) VALUES (?, ?, ?, ?, ?)",
                (session_id, round_id, envelope.client_id, envelope.nonce, envelope.sealed),
            )
        except sqlite3.IntegrityError as exc:
            if "nonce" in str(exc):
                raise ReplayedReport("nonce already admitted (spool)") from None
            raise DuplicateReport("sealed payload already admitted (spool)") from None

    def admit_many(self, session_id: bytes, round_id: int, envelopes: list[AdmittedEnvelope]) -> None:
        """Commit several admitted envelopes in one transaction (all or none), or raise as :meth:`admit`."""
        try:
            with self._transaction():
                self._db.executemany(
                    "INSERT INTO admitted (session_id, round_id, client_id, nonce, sealed) VALUES (?, ?, ?, ?, ?)",
                    [(session_id, round_id, e.client_id, e.nonce, e.sealed) for e in envelopes],
                )
        except sqlite3.IntegrityError as exc:
            if "nonce" in str(exc):
                raise ReplayedReport("nonce already admitted (spool)") from None
            raise DuplicateReport("sealed payload already admitted (spool)") from None

    def admitted(self, session_id: bytes, round_id: int) -> list[AdmittedEnvelope]:
        rows = self._db.execute(
            "SELECT client_id, nonce, sealed FROM admitted WHERE session_id = ? AND round_id = ? ORDER BY seq",
            (session_id, round_id),
        )
        return [AdmittedEnvelope(*row) for row in rows]

    def release(self, session_id: bytes, round_id: int, batch_id: bytes, chunks: list[bytes]) -> None:
        """Store the batch's encoded chunks and mark the round released, in one transaction."""
        with self._transaction():
            self._db.execute(
                "INSERT INTO batches (batch_id, session_id, round_id) VALUES (?, ?, ?)", (batch_id, session_id, round_id)
            )
            self._db.executemany(
                "INSERT INTO chunks (batch_id, chunk, encoded) VALUES (?, ?, ?)",
                [(batch_id, index, encoded) for index, encoded in enumerate(chunks)],
            )
            self._advance(session_id, round_id, "released")

    def fail(self, session_id: bytes, round_id: int, reason: str) -> None:
        """Mark an open round failed and delete its admitted reports (they will never be forwarded)."""
        with self._transaction():
            self._advance(session_id, round_id, "failed", reason)
            self._db.execute(
                "DELETE FROM admitted WHERE session_id = ? AND round_id = ? AND EXISTS (SELECT 1 FROM rounds "
                "WHERE session_id = ? AND round_id = ? AND state = 'failed')",
                (session_id, round_id, session_id, round_id),
            )

    def acknowledge(self, batch_id: bytes) -> tuple[bytes, int] | None:
        """Mark a batch acknowledged and its round served; the batch's ``(session, round)``,
        or None for an unknown or repeated acknowledgement."""
        with self._transaction():
            row = self._db.execute(
                "SELECT session_id, round_id, acknowledged FROM batches WHERE batch_id = ?", (batch_id,)
            ).fetchone()
            if row is None or row[2]:
                return None
            self._db.execute("UPDATE batches SET acknowledged = 1 WHERE batch_id = ?", (batch_id,))
            self._advance(row[0], row[1], "served")
            self._db.execute("DELETE FROM chunks WHERE batch_id = ?", (batch_id,))
            self._db.execute("DELETE FROM admitted WHERE session_id = ? AND round_id = ?", (row[0], row[1]))
            return row[0], row[1]

    def unacknowledged(self) -> list[StoredBatch]:
        """Released batches the analyzer has not acknowledged, with their encoded chunks in order."""
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
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type, exc, tb) -> None:
        self._db.execute("COMMIT" if exc_type is None else "ROLLBACK")
