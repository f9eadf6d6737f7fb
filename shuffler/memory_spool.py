"""A spool in memory, for simulations and tests that run the shuffler in one process.

:class:`MemorySpool` is the :class:`~shuffledp.shuffler.spool.Spool` the shuffler needs,
held in plain dicts, lists and sets: no database, no file, no SQLite insert on the
admission path. It holds everything in memory, so nothing survives the process (there is
no round to resume after a restart): never use it for a deployed shuffler, which needs
:class:`~shuffledp.shuffler.spool.SqliteSpool` on a file.

It keeps the SQLite spool's rules exactly, so the shuffler's admission is unchanged:

* a round's state only moves forward (``open -> released -> served``, ``open -> failed``,
  ``released -> failed`` only when its batch is given up by :meth:`MemorySpool.expire`),
  and :meth:`~MemorySpool.open_round` keeps an existing round's state and spec;
* a nonce or a sealed payload is admitted at most once per (session, round); an admission
  is all or none, the envelopes checked in order, each for its sealed payload first
  (:class:`DuplicateReport`, as SQLite checks the later ``UNIQUE`` constraint first) then
  its nonce (:class:`ReplayedReport`);
* a release stores the chunks and deletes the round's admitted envelopes (once the round
  is no longer open); an acknowledgement or expiry deletes the chunks and any admitted
  envelopes of the round, and a batch is finished only once (None after that).

Misuse the SQLite spool meets with :class:`sqlite3.Error` (a batch id stored twice, a call
after :meth:`~MemorySpool.close`) raises :class:`ValueError` here, with nothing changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shuffledp.protocol.errors import DuplicateReport, ReplayedReport
from shuffledp.shuffler.spool import (
    BATCH_ACKNOWLEDGED,
    BATCH_EXPIRED,
    BATCH_PENDING,
    NOT_ACKNOWLEDGED,
    AdmittedEnvelope,
    StoredBatch,
    StoredRound,
    states_before,
)

_Key = tuple[bytes, int]  # (session id, round id)


@dataclass
class _Round:
    signed_spec: bytes
    state: str = "open"
    reason: str | None = None


@dataclass
class _Admitted:
    """One round's admitted envelopes in order of admission, and the nonces and sealed payloads among them."""

    envelopes: list[AdmittedEnvelope] = field(default_factory=list)
    nonces: set[bytes] = field(default_factory=set)
    sealed: set[bytes] = field(default_factory=set)


@dataclass
class _Batch:
    key: _Key
    chunks: list[bytes]
    status: int = BATCH_PENDING


class MemorySpool:
    """:class:`~shuffledp.shuffler.spool.Spool` in memory, with :class:`~shuffledp.shuffler.spool.SqliteSpool`'s
    semantics and no durability (see the module's notes)."""

    def __init__(self) -> None:
        self._rounds: dict[_Key, _Round] = {}
        self._admitted: dict[_Key, _Admitted] = {}
        self._batches: dict[bytes, _Batch] = {}
        self._closed = False

    def open_round(self, session_id: bytes, round_id: int, signed_spec: bytes) -> StoredRound:
        """The stored round, created ``open`` if it is new (an existing round keeps its state and spec)."""
        self._check_open()
        self._rounds.setdefault((session_id, round_id), _Round(signed_spec))
        stored = self.round(session_id, round_id)
        assert stored is not None
        return stored

    def round(self, session_id: bytes, round_id: int) -> StoredRound | None:
        self._check_open()
        stored = self._rounds.get((session_id, round_id))
        return None if stored is None else StoredRound(session_id, round_id, stored.signed_spec, stored.state)

    def rounds(self, state: str) -> list[StoredRound]:
        """The rounds in ``state``, by round id (then in order of opening)."""
        self._check_open()
        found = [StoredRound(s, r, stored.signed_spec, stored.state)
                 for (s, r), stored in self._rounds.items() if stored.state == state]
        return sorted(found, key=lambda stored: stored.round_id)

    def admit(self, session_id: bytes, round_id: int, envelope: AdmittedEnvelope) -> None:
        """Admit one envelope, or raise :class:`ReplayedReport` / :class:`DuplicateReport` (nothing stored)."""
        self.admit_many(session_id, round_id, [envelope])

    def admit_many(self, session_id: bytes, round_id: int, envelopes: list[AdmittedEnvelope]) -> None:
        """Admit several envelopes, all or none, or raise as :meth:`admit`."""
        self._check_open()
        if not envelopes:
            return
        key = (session_id, round_id)
        held = self._admitted.get(key) or _Admitted()
        nonces: set[bytes] = set()
        sealed: set[bytes] = set()
        for envelope in envelopes:  # checked in full before anything is stored
            if envelope.sealed in held.sealed or envelope.sealed in sealed:
                raise DuplicateReport("sealed payload already admitted (spool)")
            if envelope.nonce in held.nonces or envelope.nonce in nonces:
                raise ReplayedReport("nonce already admitted (spool)")
            sealed.add(envelope.sealed)
            nonces.add(envelope.nonce)
        held.envelopes.extend(envelopes)
        held.nonces |= nonces
        held.sealed |= sealed
        self._admitted[key] = held

    def admitted(self, session_id: bytes, round_id: int) -> list[AdmittedEnvelope]:
        """The round's admitted envelopes, in order of admission."""
        self._check_open()
        held = self._admitted.get((session_id, round_id))
        return [] if held is None else list(held.envelopes)

    def release(self, session_id: bytes, round_id: int, batch_id: bytes, chunks: list[bytes]) -> None:
        """Store the batch's encoded chunks, mark the round released and delete its admitted envelopes."""
        self._check_open()
        if batch_id in self._batches:
            raise ValueError(f"batch {batch_id.hex()} is already stored")
        key = (session_id, round_id)
        self._batches[batch_id] = _Batch(key, list(chunks))
        self._advance(key, "released")
        if key in self._rounds and self._rounds[key].state != "open":
            self._admitted.pop(key, None)

    def fail(self, session_id: bytes, round_id: int, reason: str) -> None:
        """Mark an open round failed and delete its admitted envelopes (they will never be forwarded)."""
        self._check_open()
        key = (session_id, round_id)
        self._advance(key, "failed", reason)
        if key in self._rounds and self._rounds[key].state == "failed":
            self._admitted.pop(key, None)

    def acknowledge(self, batch_id: bytes) -> tuple[bytes, int] | None:
        """Mark a batch acknowledged and its round served, and delete its chunks; the batch's
        ``(session, round)``, or None for an unknown or repeated acknowledgement."""
        return self._finish(batch_id, BATCH_ACKNOWLEDGED, "served", None, None)

    def expire(self, batch_id: bytes, reason: str = NOT_ACKNOWLEDGED) -> tuple[bytes, int] | None:
        """Give up a released batch the analyzer never acknowledged (its round ``released -> failed``,
        ``reason`` recorded), delete its chunks; as :meth:`acknowledge` otherwise."""
        return self._finish(batch_id, BATCH_EXPIRED, "failed", reason, ("released",))

    def unacknowledged(self) -> list[StoredBatch]:
        """Released batches not acknowledged (nor given up), by round id, with their chunks in order."""
        self._check_open()
        pending = [StoredBatch(batch_id, *batch.key, list(batch.chunks))
                   for batch_id, batch in self._batches.items() if batch.status == BATCH_PENDING]
        return sorted(pending, key=lambda batch: batch.round_id)

    def close(self) -> None:
        """Drop everything held. Idempotent; the spool cannot be used afterwards."""
        self._rounds.clear()
        self._admitted.clear()
        self._batches.clear()
        self._closed = True

    def _finish(self, batch_id: bytes, status: int, state: str, reason: str | None,
                after: tuple[str, ...] | None) -> tuple[bytes, int] | None:
        """End a pending batch with ``status``, move its round to ``state``, and delete its chunks and
        any admitted envelopes of its round; the batch's ``(session, round)``, or None if not pending."""
        self._check_open()
        batch = self._batches.get(batch_id)
        if batch is None or batch.status != BATCH_PENDING:
            return None
        batch.status, batch.chunks = status, []
        self._advance(batch.key, state, reason, after)
        self._admitted.pop(batch.key, None)
        return batch.key

    def _advance(self, key: _Key, state: str, reason: str | None = None,
                 after: tuple[str, ...] | None = None) -> None:
        """Move a known round to ``state`` if that is later than its current state (as
        :meth:`SqliteSpool._advance <shuffledp.shuffler.spool.SqliteSpool._advance>`: ``failed`` only
        from ``open``, unless ``after`` names the states it may follow)."""
        stored = self._rounds.get(key)
        if stored is not None and stored.state in states_before(state, after):
            stored.state, stored.reason = state, reason

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the spool is closed")
