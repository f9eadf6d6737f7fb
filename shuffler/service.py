"""The shuffler service: admit, batch, strip, permute, forward.

For every round the analyzer announces (a signed spec on the session's announce
topic), the shuffler

1. verifies the analyzer's signature (announcements are retained, so a shuffler
   that starts late still sees the current round; a round it already served is
   skipped) and opens the round: it subscribes to the
   round's reports topic, then passes the signed spec on to the clients (so no
   report can reach a round it has not opened);
2. admits envelopes for that open round only, at most ``messages_per_user`` per
   admission token, rejecting replayed nonces, a sealed payload already admitted
   (however re-wrapped: new nonce, new token), a payload not of the round's fixed
   sealed size, foreign sessions or rounds and malformed bytes with a typed reason,
   counted in :attr:`RoundStats.rejected`;
3. once ``max_batch`` envelopes are admitted, or at the deadline, releases the round
   if it holds at least ``min_batch``: strips everything but the sealed payloads,
   permutes them with the OS CSPRNG (:func:`secure_permutation`) and forwards one
   :class:`ShuffledBatch`; a round below ``min_batch`` at its deadline is dropped
   (``BatchTooSmall``), because forwarding it would void the amplification the
   round was accounted for;
4. commits every admitted envelope to its spool (:mod:`shuffledp.shuffler.spool`)
   before counting it, so a restart resumes open rounds and never re-opens a
   released one.

Bad input never stops the service: admission raises only typed errors, and a
last-resort guard counts anything else as ``internal-error`` (a bug to fix, never
seen in the fuzz suite) instead of ending the task. The shuffler sees only sealed
payloads, all of one length per round: it cannot read a report, nor learn from
its size.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field

from shuffledp.protocol import codec
from shuffledp.protocol.channel import Channel, announce_topic, batch_topic, reports_topic, spec_topic
from shuffledp.protocol.errors import (
    BatchTooSmall,
    DuplicateReport,
    QuotaExceeded,
    ReplayedReport,
    ShuffleDPError,
    UnknownRound,
)
from shuffledp.protocol.messages import Envelope, RoundSpec, ShuffledBatch, SignedRoundSpec
from shuffledp.protocol.report_format import WrongSize, report_format
from shuffledp.protocol.sealing import verify
from shuffledp.shuffler.permutation import secure_permutation
from shuffledp.shuffler.spool import AdmittedEnvelope, SqliteSpool, Spool


_log = logging.getLogger(__name__)
#: Rejection reason counted when a service meets an exception that is not a typed ShuffleDPError.
INTERNAL_ERROR = "internal-error"


@dataclass
class RoundStats:
    """What happened in one round at the shuffler."""

    round_id: int
    admitted: int = 0
    rejected: Counter = field(default_factory=Counter)
    forwarded: int = 0
    outcome: str = "open"
    #: Envelopes reloaded from the spool when the round was resumed after a restart.
    resumed: int = 0


class RoundAdmission:
    """Admission state of one open round: the checks, and the spooled sealed payloads.

    With a ``spool``, every admitted envelope is committed there before it counts as
    admitted, and a new ``RoundAdmission`` on the same spool resumes the round: the
    nonces, sealed payloads and per-client counts already admitted are loaded back.
    """

    def __init__(self, spec: RoundSpec, spool: Spool | None = None) -> None:
        self.spec = spec
        self.spool = spool
        self.per_token: Counter = Counter()
        self.nonces: set[bytes] = set()
        self.sealed_seen: set[bytes] = set()
        self.payloads: list[bytes] = []
        self.sealed_size = report_format(spec.round_id, spec.mechanism).sealed_size
        self.stats = RoundStats(spec.round_id)
        if spool is not None:
            for stored in spool.admitted(spec.session_id, spec.round_id):
                self._record(stored.client_id, stored.nonce, stored.sealed)
            self.stats.resumed = self.stats.admitted

    def _record(self, client_id: bytes, nonce: bytes, sealed: bytes) -> None:
        self.nonces.add(nonce)
        self.sealed_seen.add(sealed)
        self.per_token[client_id] += 1
        self.payloads.append(sealed)
        self.stats.admitted += 1

    def admit(self, data: bytes) -> None:
        """Admit one encoded envelope or raise a typed :class:`ShuffleDPError`."""
        envelope = codec.decode(data, Envelope)
        spec = self.spec
        if envelope.session_id != spec.session_id or envelope.round_id != spec.round_id:
            raise UnknownRound(f"envelope for session {envelope.session_id.hex()} round {envelope.round_id}")
        if len(envelope.sealed) != self.sealed_size:
            raise WrongSize(f"sealed payload of {len(envelope.sealed)} bytes; this round's are {self.sealed_size}")
        if envelope.nonce in self.nonces:
            raise ReplayedReport("nonce already admitted")
        if envelope.sealed in self.sealed_seen:
            raise DuplicateReport("this sealed payload was already admitted (re-wrapped copy)")
        if self.per_token[envelope.token] >= spec.messages_per_user:
            raise QuotaExceeded(f"token already sent {spec.messages_per_user} report(s)")
        if len(self.payloads) >= spec.max_batch:
            raise QuotaExceeded(f"round already holds its maximum batch of {spec.max_batch}")
        if self.spool is not None:  # durable before it counts
            self.spool.admit(spec.session_id, spec.round_id, AdmittedEnvelope(envelope.token, envelope.nonce, envelope.sealed))
        self._record(envelope.token, envelope.nonce, envelope.sealed)

    def offer(self, data: bytes) -> None:
        """Admit or count the rejection; never raises for bad input."""
        try:
            self.admit(data)
        except ShuffleDPError as exc:
            self.stats.rejected[exc.reason] += 1
        except Exception:  # a bug, not an input class: count it loudly, keep serving
            self.stats.rejected[INTERNAL_ERROR] += 1
            _log.exception("shuffler admission: untyped exception on a %d-byte input", len(data))

    def shuffled_batch(self) -> ShuffledBatch:
        order = secure_permutation(len(self.payloads))
        payloads = tuple(self.payloads[i] for i in order)
        return ShuffledBatch(self.spec.session_id, self.spec.round_id, payloads)


class Shuffler:
    """An asyncio shuffler for one session, running over any :class:`Channel`.

    Batching policy (per round): admit until ``max_batch`` envelopes or the deadline,
    whichever comes first, then release the batch if it holds at least ``min_batch``;
    otherwise the round fails (``batch-too-small``) and nothing is forwarded. Honest
    clients who answer before the deadline are never dropped because ``min_batch``
    was reached early.

    Durability: with a file-backed ``spool`` (:class:`~shuffledp.shuffler.spool.SqliteSpool`),
    a shuffler restarted after ``kill -9`` resumes the session's open rounds with their
    admission state and never re-opens a released, served or failed round.
    """

    def __init__(
        self,
        channel: Channel,
        session_id: bytes,
        analyzer_signing_key: bytes,
        *,
        spool: Spool | None = None,
        clock=time.time,
    ) -> None:
        self.channel = channel
        self.session_id = session_id
        self.analyzer_signing_key = analyzer_signing_key
        self.spool = spool if spool is not None else SqliteSpool(":memory:")
        self.clock = clock
        self.rounds: dict[int, RoundStats] = {}
        self.rejected_announcements: Counter = Counter()

    async def serve(self) -> None:
        """Resume the session's open rounds from the spool, then serve announced rounds until cancelled."""
        announcements = await self.channel.subscribe(announce_topic(self.session_id))
        try:
            for stored in self.spool.rounds("open"):
                if stored.session_id == self.session_id and stored.round_id not in self.rounds:
                    await self._run_guarded(verified_round_spec(stored.signed_spec, self.analyzer_signing_key), stored.signed_spec)
            async for data in announcements:
                try:
                    spec = verified_round_spec(data, self.analyzer_signing_key)
                    if spec.session_id != self.session_id:
                        raise UnknownRound("spec for another session")
                except ShuffleDPError as exc:
                    self.rejected_announcements[exc.reason] += 1
                    continue
                except Exception:  # a bug, not an input class: count it, keep serving
                    self.rejected_announcements[INTERNAL_ERROR] += 1
                    _log.exception("shuffler announcement: untyped exception")
                    continue
                if spec.round_id in self.rounds:
                    continue  # a re-delivered (retained) announcement of a round served by this process
                stored = self.spool.round(spec.session_id, spec.round_id)
                if stored is not None and stored.state != "open":
                    continue  # served (or failed) before a restart: never re-opened
                await self._run_guarded(spec, data)
        finally:
            await announcements.close()

    async def _run_guarded(self, spec: RoundSpec, signed_spec: bytes) -> None:
        try:
            await self.run_round(spec, signed_spec)
        except ShuffleDPError as exc:  # e.g. a batch too large to encode: the round fails, the service goes on
            self.rounds[spec.round_id].outcome = exc.reason
            self.spool.fail(spec.session_id, spec.round_id, exc.reason)
            _log.warning("shuffler: round %d failed: %s", spec.round_id, exc)

    async def run_round(self, spec: RoundSpec, signed_spec: bytes) -> RoundStats:
        """Open (or resume) one round, admit until ``max_batch`` or the deadline, then release or fail."""
        self.spool.open_round(spec.session_id, spec.round_id, signed_spec)
        admission = RoundAdmission(spec, self.spool)
        self.rounds[spec.round_id] = admission.stats
        reports = await self.channel.subscribe(reports_topic(spec.session_id, spec.round_id))
        try:
            await self.channel.publish(spec_topic(spec.session_id), signed_spec, retain=True)
            while admission.stats.admitted < spec.max_batch:
                remaining = spec.deadline - self.clock()
                if remaining <= 0:
                    break
                try:
                    data = await asyncio.wait_for(reports.get(), timeout=remaining)
                except asyncio.TimeoutError:
                    break
                admission.offer(data)
        finally:
            await reports.close()
        stats = admission.stats
        if stats.admitted < spec.min_batch:
            stats.outcome = BatchTooSmall.reason
            self.spool.fail(spec.session_id, spec.round_id, BatchTooSmall.reason)
            return stats
        batch = admission.shuffled_batch()
        encoded = codec.encode(batch)
        self.spool.release(spec.session_id, spec.round_id, os.urandom(16), encoded)
        await self.channel.publish(batch_topic(spec.session_id, spec.round_id), encoded)
        stats.forwarded = batch.size
        stats.outcome = "forwarded"
        return stats


def verified_round_spec(signed_spec: bytes, analyzer_signing_key: bytes) -> RoundSpec:
    """The RoundSpec inside an encoded SignedRoundSpec, if the analyzer's signature verifies."""
    signed = codec.decode(signed_spec, SignedRoundSpec)
    verify(analyzer_signing_key, signed.spec_bytes, signed.signature)
    return codec.decode(signed.spec_bytes, RoundSpec)
