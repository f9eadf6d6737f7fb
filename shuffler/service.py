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
3. once ``min_batch`` reports are admitted, or at the deadline, strips everything
   but the sealed payloads, permutes them with the OS CSPRNG
   (:func:`secure_permutation`) and forwards one :class:`ShuffledBatch`; a round
   that reaches its deadline below ``min_batch`` is dropped (``BatchTooSmall``),
   because forwarding it would void the amplification the round was accounted for.

Bad input never stops the service: admission raises only typed errors, and a
last-resort guard counts anything else as ``internal-error`` (a bug to fix, never
seen in the fuzz suite) instead of ending the task. The shuffler sees only sealed
payloads, all of one length per round: it cannot read a report, nor learn from
its size.
"""

from __future__ import annotations

import asyncio
import logging
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


class RoundAdmission:
    """Admission state of one open round: the checks, and the spool of sealed payloads."""

    def __init__(self, spec: RoundSpec) -> None:
        self.spec = spec
        self.per_token: Counter = Counter()
        self.nonces: set[bytes] = set()
        self.sealed_seen: set[bytes] = set()
        self.payloads: list[bytes] = []
        self.sealed_size = report_format(spec.round_id, spec.mechanism).sealed_size
        self.stats = RoundStats(spec.round_id)

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
        self.nonces.add(envelope.nonce)
        self.sealed_seen.add(envelope.sealed)
        self.per_token[envelope.token] += 1
        self.payloads.append(envelope.sealed)
        self.stats.admitted += 1

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
    """An asyncio shuffler for one session, running over any :class:`Channel`."""

    def __init__(self, channel: Channel, session_id: bytes, analyzer_signing_key: bytes, *, clock=time.time) -> None:
        self.channel = channel
        self.session_id = session_id
        self.analyzer_signing_key = analyzer_signing_key
        self.clock = clock
        self.rounds: dict[int, RoundStats] = {}
        self.rejected_announcements: Counter = Counter()

    async def serve(self) -> None:
        """Serve announced rounds one after another until cancelled."""
        announcements = await self.channel.subscribe(announce_topic(self.session_id))
        try:
            async for data in announcements:
                try:
                    signed = codec.decode(data, SignedRoundSpec)
                    verify(self.analyzer_signing_key, signed.spec_bytes, signed.signature)
                    spec = codec.decode(signed.spec_bytes, RoundSpec)
                    if spec.session_id != self.session_id:
                        raise UnknownRound("spec for another session")
                    if spec.round_id in self.rounds:
                        continue  # a re-delivered (retained) announcement of a round already served
                except ShuffleDPError as exc:
                    self.rejected_announcements[exc.reason] += 1
                    continue
                except Exception:  # a bug, not an input class: count it, keep serving
                    self.rejected_announcements[INTERNAL_ERROR] += 1
                    _log.exception("shuffler announcement: untyped exception")
                    continue
                try:
                    await self.run_round(spec, data)
                except ShuffleDPError as exc:  # e.g. a batch too large to encode: the round fails, the service goes on
                    self.rounds[spec.round_id].outcome = exc.reason
                    _log.warning("shuffler: round %d failed: %s", spec.round_id, exc)
        finally:
            await announcements.close()

    async def run_round(self, spec: RoundSpec, signed_spec: bytes) -> RoundStats:
        """Open one round, admit until the batch is full or the deadline passes, then forward."""
        admission = RoundAdmission(spec)
        self.rounds[spec.round_id] = admission.stats
        reports = await self.channel.subscribe(reports_topic(spec.session_id, spec.round_id))
        try:
            await self.channel.publish(spec_topic(spec.session_id), signed_spec, retain=True)
            while admission.stats.admitted < spec.min_batch:
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
            return stats
        batch = admission.shuffled_batch()
        await self.channel.publish(batch_topic(spec.session_id, spec.round_id), codec.encode(batch))
        stats.forwarded = batch.size
        stats.outcome = "forwarded"
        return stats

