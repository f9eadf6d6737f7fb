"""The shuffler service: authenticate, admit, spool, batch, permute, sign, forward.

For every round the analyzer announces (a signed spec on the session's announce
topic), the shuffler

1. verifies the analyzer's signature, checks that the spec names *this* shuffler
   (its sealing and signing keys), and opens the round: it subscribes to the round's
   reports topic, then passes the signed spec on to the clients (so no report can
   reach a round it has not opened). Announcements are retained, so a shuffler that
   starts late still sees the current round; a round it served, or that failed, is
   never re-opened;
2. splits a message of several envelopes packed back to back
   (:mod:`~shuffledp.protocol.wire.envelope_packing`), then opens each envelope's outer layer
   (:class:`~shuffledp.protocol.wire.onion.EnvelopeOpener`)
   and admits the :class:`~shuffledp.protocol.wire.messages.Admission` inside only if its
   credential verifies (the issuer's HMAC, :mod:`shuffledp.protocol.wire.credentials`), the
   credential is under the round's ``messages_per_user`` quota, the nonce is new, the
   sealed report was not admitted before (however re-wrapped), it has the round's
   fixed size and the round is under ``max_batch``. Each refusal has a typed reason
   and a counter (:attr:`RoundStats.rejected`);
3. commits admitted envelopes to its durable spool (:mod:`shuffledp.shuffler.spool`)
   *before* acknowledging them: a signed :class:`AdmissionReceipts` on the round's
   receipts topic names the nonces admitted and refused (refusals of a credential that
   does not verify only up to ``UNVERIFIED_REFUSALS_PER_ROUND`` per round, so forged
   credentials cannot buy signed answers in bulk). An exact retransmission of
   an admitted envelope is acknowledged again (up to ``RETRANSMISSION_ACKS`` times a
   round, so neither can a valid credential resending it), never counted twice;
4. once ``max_batch`` envelopes are admitted, or at the deadline, releases the round
   if it holds at least ``min_batch``: keeps only the sealed reports, permutes them
   with the OS CSPRNG (:func:`secure_permutation`), cuts the batch into signed chunks
   of at most ``chunk_size`` reports under a fresh batch id, spools the chunks (and,
   in the same transaction, deletes the round's admitted envelopes: from then on the
   spool holds no client id, nonce or arrival order of the round), and publishes
   them and a signed ``released`` :class:`RoundOutcome`. A round below
   ``min_batch`` at its deadline fails: its reports are deleted, never forwarded
   (that would void the amplification the round was accounted for), and a signed
   ``failed`` outcome tells its clients;
5. marks a round served when the analyzer's signed :class:`BatchAck` arrives, and
   re-publishes unacknowledged batches after a restart and every
   ``republish_interval`` seconds: at least once on the wire, exactly once at the
   analyzer (which takes one batch id per round). A batch still unacknowledged
   ``ack_timeout`` seconds after its round's deadline (or after this process released
   or, after a restart, first re-published it, if later) is given up: the analyzer
   refused it (e.g. fewer than ``min_batch`` of its reports were valid) or is gone
   (the analyzer accepts batches only until the deadline plus its grace period, which
   ``ack_timeout`` must exceed). Its chunks are deleted from
   the spool, it is never published again, and a signed ``failed`` outcome (reason
   ``not-acknowledged``) tells its clients.

Every signed round outcome (``released`` or ``failed``) the broker does not take is published
again at each re-publishing pass until it is out (:meth:`Shuffler._announce_outcome`). The
analyzer's announcements and acknowledgements are read on ``control_channel`` when one is given
(``shuffler serve`` gives a second MQTT connection), so no client traffic shares their broker
queue (see :class:`Shuffler`).

Bad input never stops the service: admission raises only typed errors, and a
last-resort guard counts anything else as ``internal-error`` (a bug to fix, never
seen in the fuzz suite) instead of ending the task. Neither does a spool that cannot
be written (a full disk, an I/O error): envelopes whose admission could not be
committed are refused without a receipt, so their clients send them again, and
counted as ``storage-error``; a round's opening and its release are retried every
``storage_retry_interval`` seconds until they are written (a batch is published only
once it is in the spool); an acknowledgement that cannot be written is retried with
the periodic re-publishing; a round that fails while its failure cannot be written
stays open in the spool, and fails again (its reports deleted) when it is next
resumed. Every such failure is logged with SQLite's own error and counted
(``storage-error`` rejections, :attr:`Shuffler.storage_errors`). The shuffler never
sees a value (reports are sealed to the analyzer), and every sealed report of a
round has one length.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from shuffledp.protocol.transport.channel import (
    Channel,
    acks_topic,
    announce_topic,
    batch_topic,
    outcome_topic,
    receipts_topic,
    reports_topic,
    spec_topic,
)
from shuffledp.protocol.wire.credentials import CLIENT_ID_BYTES, CredentialIssuer, assigned_instance
from shuffledp.protocol.errors import (
    INTERNAL_ERROR,
    BatchTooSmall,
    DuplicateReport,
    QuotaExceeded,
    RateLimited,
    ReplayedReport,
    RoundFull,
    ShuffleDPError,
    UnknownRound,
    WrongInstance,
)
from shuffledp.protocol.wire.messages import (
    BATCH_ID_BYTES,
    MAX_RECEIPTS,
    AdmissionReceipts,
    BatchAck,
    SPEC_DIGEST_BYTES,
    RoundOutcome,
    RoundSpec,
    ShuffledBatch,
)
from shuffledp.protocol.wire.envelope_packing import unpack_envelopes
from shuffledp.protocol.wire.onion import EnvelopeOpener, OpenedFields, ShufflerKeys, decode_verified, signed_encoding, verified_spec
from shuffledp.shuffler.parallel_open import OuterLayerPool
from shuffledp.shuffler.permutation import secure_permutation
from shuffledp.shuffler.spool import AdmittedEnvelope, SpoolStorageError, SqliteSpool, Spool

_log = logging.getLogger(__name__)
#: Reports per batch chunk by default: about 2 MiB of sealed reports per MQTT message.
DEFAULT_CHUNK_SIZE = 16384
#: Refusals one credential may cause in a round before its later envelopes are dropped unanswered.
REFUSALS_PER_CREDENTIAL = 8
#: Refusals whose credential does not verify (forged, another issuer's, revoked) that a round's
#: receipts name; later ones are dropped unanswered. They have no client id to be charged to, so
#: they are charged together, as one credential: a flood of forged credentials gets this many
#: signed refusals per round, not one each. An honest device holds a valid credential, so its
#: refusals are charged to its own client id, never here.
UNVERIFIED_REFUSALS_PER_ROUND = REFUSALS_PER_CREDENTIAL
#: Times one admitted envelope's exact retransmission is named again in a round's receipts (its client
#: may have missed the receipt); later copies are dropped unanswered (still counted as retransmitted).
#: Every receipt is signed and reaches every device of the round, so without this bound one valid
#: credential would buy signed answers without limit by resending its admitted envelope.
RETRANSMISSION_ACKS = REFUSALS_PER_CREDENTIAL
#: Most envelopes admitted (and spooled) in one group commit, and named in one receipts message.
BURST = 4096
#: Seconds between attempts to write a round's opening or release the spool could not write.
STORAGE_RETRY_INTERVAL = 1.0
#: Seconds a released batch is re-published while unacknowledged before the shuffler gives it up.
ACK_TIMEOUT = 600.0
#: The signed ``failed`` outcome's reason for a batch given up unacknowledged.
NOT_ACKNOWLEDGED = "not-acknowledged"


@dataclass
class RoundStats:
    """What happened in one round at the shuffler."""

    round_id: int
    admitted: int = 0
    rejected: Counter = field(default_factory=Counter)
    forwarded: int = 0
    chunks: int = 0
    outcome: str = "open"
    #: Envelopes reloaded from the spool when the round was resumed after a restart.
    resumed: int = 0
    #: Exact retransmissions of admitted envelopes, acknowledged again but not counted.
    retransmitted: int = 0
    #: Receipts messages that could not be published.
    receipts_unsent: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "round_id": self.round_id,
            "outcome": self.outcome,
            "admitted": self.admitted,
            "forwarded": self.forwarded,
            "chunks": self.chunks,
            "resumed": self.resumed,
            "retransmitted": self.retransmitted,
            "receipts_unsent": self.receipts_unsent,
            "rejected": dict(sorted(self.rejected.items())),
        }


@dataclass
class Receipts:
    """Nonces admitted and refused (with reasons) since the last receipts message."""

    admitted: list[bytes] = field(default_factory=list)
    refused: list[bytes] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.admitted or self.refused)


class RoundAdmission:
    """Admission state of one open round: the checks, and the spooled sealed reports.

    With a ``spool``, admitted envelopes are committed there before they count as
    admitted (and before any receipt names them); a new ``RoundAdmission`` on the same
    spool resumes the round with its nonces, sealed reports and per-credential counts.
    """

    def __init__(
        self,
        spec: RoundSpec,
        keys: ShufflerKeys,
        issuer: CredentialIssuer,
        spool: Spool | None = None,
        *,
        revoked: frozenset[bytes] = frozenset(),
        instance: int = 0,
        opener_pool: OuterLayerPool | None = None,
    ) -> None:
        self.spec = spec
        self.instance = instance
        #: Opens large bursts' outer layers on worker processes (None: all in this process).
        self.opener_pool = opener_pool
        self.issuer = issuer
        self.revoked = revoked
        self.spool = spool
        self.opener = EnvelopeOpener(keys.hpke_private, spec)
        self.per_client: Counter = Counter()
        self.refusals: Counter = Counter()
        #: Refusals named in receipts whose credential did not verify (UNVERIFIED_REFUSALS_PER_ROUND at most).
        self.unverified_refusals = 0
        #: Times each admitted nonce was named again for a retransmission (RETRANSMISSION_ACKS at most).
        self.reacknowledged: Counter = Counter()
        self.nonces: dict[bytes, bytes] = {}  # nonce -> sealed report
        self.sealed_seen: set[bytes] = set()
        self.payloads: list[bytes] = []
        self.stats = RoundStats(spec.round_id)
        # The round's limits, read once (the per-envelope checks use them).
        self._instances = spec.shuffler_instances
        self._quota = spec.messages_per_user
        self._max_batch = spec.max_batch
        if spool is not None:
            self._record(spool.admitted(spec.session_id, spec.round_id))
            self.stats.resumed = self.stats.admitted

    @property
    def full(self) -> bool:
        return len(self.payloads) >= self.spec.max_batch

    def _record(self, batch: list[AdmittedEnvelope]) -> None:
        """Count committed envelopes as admitted: their nonces, sealed reports and credentials' quotas."""
        nonces, sealed_seen, per_client, payloads = self.nonces, self.sealed_seen, self.per_client, self.payloads
        for client_id, nonce, sealed in batch:
            nonces[nonce] = sealed
            sealed_seen.add(sealed)
            per_client[client_id] = per_client.get(client_id, 0) + 1  # a Counter's +=, without __missing__
            payloads.append(sealed)
        self.stats.admitted += len(batch)

    def _check(self, data: bytes, pending: "_Pending") -> tuple[bytes, AdmittedEnvelope | None]:
        """The nonce and the envelope to admit (None: an exact retransmission), or a typed error.

        An error raised after the outer layer opened carries the envelope's nonce
        (``exc.nonce``), so the receipts can name the refusal: always when the credential
        verified, and when it did not only for the round's first
        ``UNVERIFIED_REFUSALS_PER_ROUND`` such refusals (the rest are refused unanswered).
        """
        return self._check_opened(self.opener.open_fields(data), pending)

    def _check_opened(self, opened: OpenedFields, pending: "_Pending") -> tuple[bytes, AdmittedEnvelope | None]:
        """:meth:`_check` after the outer layer opened (its admission's ``(credential, nonce, sealed)``)."""
        credential, nonce, sealed = opened
        client_id = None
        try:
            client_id = self.issuer.verify(credential, self.revoked)
            if self._instances > 1 and assigned_instance(client_id, self._instances, self.spec.digest) != self.instance:
                raise WrongInstance(f"this credential is assigned to another of the round's {self._instances} instances")
            if self.refusals.get(client_id, 0) >= REFUSALS_PER_CREDENTIAL:
                raise RateLimited(f"credential refused {REFUSALS_PER_CREDENTIAL} times this round")
            known = self.nonces.get(nonce, pending.nonces.get(nonce))
            if known is not None:
                if known == sealed:
                    return nonce, None  # the same envelope again (a client retrying): acknowledge, count once
                raise ReplayedReport("nonce already admitted")
            if sealed in self.sealed_seen or sealed in pending.sealed:
                raise DuplicateReport("this sealed report was already admitted (re-wrapped copy)")
            if self.per_client.get(client_id, 0) + pending.per_client.get(client_id, 0) >= self._quota:
                raise QuotaExceeded(f"credential already sent {self._quota} report(s) this round")
            if len(self.payloads) + len(pending.envelopes) >= self._max_batch:
                raise RoundFull(f"round already holds its maximum batch of {self._max_batch}")
        except ShuffleDPError as exc:
            if client_id is not None:
                self.refusals[client_id] += 1
            elif self.unverified_refusals < UNVERIFIED_REFUSALS_PER_ROUND:
                self.unverified_refusals += 1
            else:
                raise  # no nonce: no receipt names it (a forged credential cannot buy signed refusals)
            exc.nonce = nonce  # type: ignore[attr-defined]
            raise
        return nonce, AdmittedEnvelope(client_id, nonce, sealed)

    def offer_many(self, items: list[bytes]) -> Receipts:
        """Process received messages, each one envelope or several packed back to back
        (:mod:`~shuffledp.protocol.wire.envelope_packing`: every envelope then judged on its own);
        spool the admitted ones in one transaction; return the receipts.

        Never raises for bad input: each refusal is counted by reason, and refused
        envelopes whose outer layer opened are named (by nonce) in the receipts,
        except ``rate-limited`` ones and, past the round's first
        ``UNVERIFIED_REFUSALS_PER_ROUND``, those whose credential does not verify, which
        are dropped unanswered. An exact retransmission of an admitted envelope is named
        admitted again up to ``RETRANSMISSION_ACKS`` times a round, then dropped unanswered.
        """
        return self._admit_opened(self._open_all(unpack_envelopes(items, self.opener.format.size)))

    async def offer_many_async(self, items: list[bytes]) -> Receipts:
        """:meth:`offer_many`, with a large burst's outer layers opened on the worker processes while
        the event loop serves other tasks (the service's receive loop). Every admission decision is
        still made here, in arrival order, after the opening: the same receipts as :meth:`offer_many`."""
        refused, envelopes = self._split(unpack_envelopes(items, self.opener.format.size))
        pool = self.opener_pool
        if pool is not None and self._on_workers(envelopes):
            opened = await pool.open_many_async(self.spec, envelopes)
        else:
            opened = self._open_here(envelopes)
        return self._admit_opened(self._merged(refused, opened))

    def _admit_opened(self, opened_items: list[OpenedFields | Exception]) -> Receipts:
        """Judge each opened envelope (or the exception its opening raised) in order, spool the admitted
        ones in one transaction, and return the receipts (:meth:`offer_many`)."""
        receipts = Receipts()
        clean = self._admissible_burst(opened_items)
        if clean is not None:  # every envelope is admitted: the same decisions, taken for the burst at once
            self._commit(clean, receipts)
            return receipts
        pending = _Pending()
        retransmitted: list[bytes] = []
        for opened in opened_items:
            try:
                if isinstance(opened, Exception):
                    raise opened
                nonce, admitted = self._check_opened(opened, pending)
            except ShuffleDPError as exc:
                self.stats.rejected[exc.reason] += 1
                refused_nonce: bytes | None = getattr(exc, "nonce", None)
                if refused_nonce is not None and not isinstance(exc, RateLimited):
                    receipts.refused.append(refused_nonce)
                    receipts.reasons.append(exc.reason)
                continue
            except Exception:  # a bug, not an input class: count it loudly, keep serving
                self.stats.rejected[INTERNAL_ERROR] += 1
                _log.exception("shuffler admission: untyped exception")
                continue
            if admitted is None:
                retransmitted.append(nonce)
            else:
                pending.add(admitted)
        if pending.envelopes:
            self._commit(pending.envelopes, receipts)  # a storage failure is counted and logged there
        reacknowledged = self.reacknowledged
        for nonce in retransmitted:  # named admitted only once its original is committed
            if nonce in self.nonces:
                self.stats.retransmitted += 1
                if reacknowledged[nonce] < RETRANSMISSION_ACKS:  # then unanswered: signed answers stay bounded
                    reacknowledged[nonce] += 1
                    receipts.admitted.append(nonce)
        return receipts

    def _admissible_burst(self, opened_items: list) -> list[AdmittedEnvelope] | None:
        """The burst's envelopes to admit if :meth:`_check_opened` would admit every one of them in
        order, else None (the caller then judges them one by one).

        That is so exactly when each opened, one instance serves the round, every nonce and every
        sealed report is unseen (in the round and in the burst), no credential is rate-limited or
        goes over its quota, the round has room for all, and every credential verifies and is not
        revoked; each condition but the last is checked for the whole burst with set operations, on
        the client ids the credentials name, and the credentials' tags last, one by one, so a burst
        that is judged one by one after all has had few or none of its tags computed here."""
        if not opened_items or self._instances > 1 or len(self.payloads) + len(opened_items) > self._max_batch:
            return None
        if any(isinstance(item, Exception) for item in opened_items):
            return None
        nonces = {nonce for _, nonce, _ in opened_items}
        sealed = {report for _, _, report in opened_items}
        if len(nonces) != len(opened_items) or len(sealed) != len(opened_items) or not self.sealed_seen.isdisjoint(sealed) \
                or not self.nonces.keys().isdisjoint(nonces):
            return None
        senders = Counter(credential[:CLIENT_ID_BYTES] for credential, _, _ in opened_items)
        per_client, refusals, quota = self.per_client, self.refusals, self._quota
        for client_id, count in senders.items():
            if per_client.get(client_id, 0) + count > quota or refusals.get(client_id, 0) >= REFUSALS_PER_CREDENTIAL:
                return None
        verify, revoked = self.issuer.verify, self.revoked
        try:
            return [AdmittedEnvelope(verify(credential, revoked), nonce, report) for credential, nonce, report in opened_items]
        except Exception:  # a forged or revoked credential (or a bug): judged one by one, and counted there
            return None

    def _open_all(self, items: list) -> list[OpenedFields | Exception]:
        """Each item's opened admission (``(credential, nonce, sealed)``) or the exception its opening
        raised, in order (an item that already is an exception, a refused packed message, stays one)."""
        refused, envelopes = self._split(items)
        pool = self.opener_pool
        opened = pool.open_many(self.spec, envelopes) if pool is not None and self._on_workers(envelopes) else self._open_here(envelopes)
        return self._merged(refused, opened)

    @staticmethod
    def _split(items: list) -> tuple[dict[int, Exception], list]:
        """The items that already are exceptions, by position, and the envelopes to open."""
        refused = {i: item for i, item in enumerate(items) if isinstance(item, Exception)}
        return refused, ([item for item in items if not isinstance(item, Exception)] if refused else items)

    def _on_workers(self, envelopes: list) -> bool:
        """Whether these envelopes are opened on the worker processes (a pool, and a large burst)."""
        return self.opener_pool is not None and len(envelopes) >= self.opener_pool.threshold

    def _open_here(self, envelopes: list) -> list[OpenedFields | Exception]:
        opened: list[OpenedFields | Exception] = []
        for data in envelopes:
            try:
                opened.append(self.opener.open_fields(data))
            except Exception as exc:  # typed refusals, and bugs (counted as internal-error by the caller)
                opened.append(exc)
        return opened

    @staticmethod
    def _merged(refused: dict[int, Exception], opened: list) -> list:
        """``opened`` with the refused items put back at their positions."""
        if not refused:
            return opened
        rest = iter(opened)
        return [refused[i] if i in refused else next(rest) for i in range(len(opened) + len(refused))]

    def _commit(self, batch: list[AdmittedEnvelope], receipts: Receipts) -> SpoolStorageError | None:
        """Spool ``batch`` and record what was committed; the storage failure, if any.

        Envelopes the spool could not write (:class:`SpoolStorageError`: a full disk, an
        I/O error) are not admitted and get no receipt, so their clients send them again;
        they are counted as ``storage-error``, not held against their credentials."""
        spec = self.spec
        failure: SpoolStorageError | None = None
        unwritten = 0
        if self.spool is not None:
            try:
                self.spool.admit_many(spec.session_id, spec.round_id, batch)
            except SpoolStorageError as exc:
                failure, unwritten, batch = exc, len(batch), []
            except ShuffleDPError:  # another process on the spool admitted one of them: go one by one
                kept = []
                for envelope in batch:
                    try:
                        self.spool.admit(spec.session_id, spec.round_id, envelope)
                        kept.append(envelope)
                    except SpoolStorageError as exc:
                        failure, unwritten = exc, unwritten + 1
                    except ShuffleDPError as exc:
                        self.stats.rejected[exc.reason] += 1
                        receipts.refused.append(envelope.nonce)
                        receipts.reasons.append(exc.reason)
                batch = kept
        if failure is not None:
            self.stats.rejected[SpoolStorageError.reason] += unwritten
            _log.error(
                "shuffler: round %d: %d envelope(s) not admitted, no receipt sent (their clients send them again): %s",
                spec.round_id, unwritten, failure,
            )
        self._record(batch)
        receipts.admitted.extend([envelope.nonce for envelope in batch])
        return failure

    def admit(self, data: bytes) -> None:
        """Admit one encoded envelope or raise its typed :class:`ShuffleDPError` (tests and tools)."""
        _, admitted = self._check(data, _Pending())
        if admitted is not None:
            failure = self._commit([admitted], Receipts())
            if failure is not None:
                raise failure

    def offer(self, data: bytes) -> None:
        """Admit or count the rejection; never raises for bad input."""
        self.offer_many([data])

    def shuffled_payloads(self) -> list[bytes]:
        """The admitted sealed reports in a uniformly random order (OS CSPRNG)."""
        order = secure_permutation(len(self.payloads))
        return [self.payloads[i] for i in order]


class _Pending:
    """Envelopes checked in the current burst but not yet committed to the spool."""

    def __init__(self) -> None:
        self.envelopes: list[AdmittedEnvelope] = []
        self.nonces: dict[bytes, bytes] = {}
        self.sealed: set[bytes] = set()
        self.per_client: Counter = Counter()

    def add(self, envelope: AdmittedEnvelope) -> None:
        self.envelopes.append(envelope)
        self.nonces[envelope.nonce] = envelope.sealed
        self.sealed.add(envelope.sealed)
        self.per_client[envelope.client_id] = self.per_client.get(envelope.client_id, 0) + 1


def batch_releasable(admitted: int, spec: RoundSpec) -> bool:
    """Whether a round holding ``admitted`` reports may be released: at least ``min_batch``.

    A batch below the minimum would void the amplification the round was accounted
    for (the accountant's ``n`` is the batch size), so it is never forwarded."""
    return admitted >= spec.min_batch


def batch_chunks(
    spec: RoundSpec, keys: ShufflerKeys, batch_id: bytes, payloads: list[bytes], chunk_size: int
) -> list[bytes]:
    """The encoded, signed chunks of one shuffled batch, in order."""
    total = len(payloads)
    starts = range(0, total, chunk_size)
    chunks = len(starts)
    return [
        signed_encoding(
            keys.signing_private,
            ShuffledBatch(spec.session_id, spec.round_id, spec.digest, batch_id, index, chunks, total,
                          tuple(payloads[s : s + chunk_size])),
        )
        for index, s in enumerate(starts)
    ]


class Shuffler:
    """An asyncio shuffler for one session, running over any :class:`Channel`.

    ``keys`` are its sealing and signing keys (the analyzer names their public halves
    in every spec), ``issuer`` verifies client credentials, ``analyzer_signing_key``
    authenticates specs and batch acknowledgements. Batching policy (per round):
    admit until ``max_batch`` envelopes or the deadline, whichever comes first, then
    release the batch if it holds at least ``min_batch``, else fail the round. Honest
    clients who answer before the deadline are never dropped because ``min_batch``
    was reached early.

    The analyzer's messages: its announcement of a round and its acknowledgement of a batch
    reach the shuffler once each (the announcement is re-sent only to a new subscription, as
    a retained message). Over MQTT the broker holds a bounded queue per connection and drops
    what comes past it for a party that lags; a connection that also reads an open round's
    reports topic, where every client account may publish, can have that queue filled by a
    flood, and then an announcement dropped there leaves its round unopened (it fails at its
    deadline), and an acknowledgement dropped there makes the shuffler give up a batch the
    analyzer counted. So ``control_channel``, when given (``shuffler serve`` gives one:
    :meth:`~shuffledp.protocol.transport.mqtt_channel.MqttChannel.companion`, a second
    connection), carries the announce and acks subscriptions and nothing else: only the
    analyzer's account may publish there (``TOPIC_ACCESS``), so no client traffic shares its
    queue. Reports, receipts, batches and outcomes stay on ``channel``, and each is recovered
    end to end if the broker drops it: devices send an envelope again until a receipt names
    it, batches are re-published until acknowledged, and outcomes until the broker takes them.

    Durability: with a file-backed ``spool`` (:class:`~shuffledp.shuffler.spool.SqliteSpool`),
    a shuffler restarted after ``kill -9`` resumes the session's open rounds with their
    admission state, re-publishes unacknowledged batches and never re-opens a
    released, served or failed round.
    """

    def __init__(
        self,
        channel: Channel,
        session_id: bytes,
        analyzer_signing_key: bytes,
        keys: ShufflerKeys,
        issuer: CredentialIssuer,
        *,
        spool: Spool | None = None,
        revoked: frozenset[bytes] = frozenset(),
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        republish_interval: float = 30.0,
        instance: int = 0,
        workers: int = 1,
        storage_retry_interval: float = STORAGE_RETRY_INTERVAL,
        ack_timeout: float = ACK_TIMEOUT,
        clock=time.time,
        control_channel: Channel | None = None,
    ) -> None:
        if not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError("chunk_size must be a positive integer")
        if not isinstance(instance, int) or instance < 0:
            raise ValueError("instance must be a non-negative integer")
        #: Which of a round's ``shuffler_instances`` this process is (its topics and its clients).
        self.instance = instance
        #: With ``workers`` > 1, large bursts' outer layers are opened on that many processes.
        self.opener_pool = OuterLayerPool(keys.hpke_private, workers) if workers > 1 else None
        self.channel = channel
        #: Where the analyzer's announcements and acknowledgements are read (``channel`` if None):
        #: see the class docstring.
        self.control_channel = control_channel if control_channel is not None else channel
        self.session_id = session_id
        self.analyzer_signing_key = analyzer_signing_key
        self.keys = keys
        self.issuer = issuer
        self.revoked = frozenset(revoked)
        self.spool = spool if spool is not None else SqliteSpool(":memory:")
        self.chunk_size = chunk_size
        self.republish_interval = republish_interval
        #: Seconds a released batch is re-published unacknowledged before it is given up.
        self.ack_timeout = ack_timeout
        self.storage_retry_interval = storage_retry_interval
        self.clock = clock
        self.rounds: dict[int, RoundStats] = {}
        self.rejected_announcements: Counter = Counter()
        self.rejected_acks: Counter = Counter()
        self.acknowledged: int = 0
        self.republished: int = 0
        #: Spool writes that failed (disk full, I/O error), by operation: ``open-round``, ``release``,
        #: ``fail``, ``acknowledge``. (Envelopes whose admission could not be written are counted
        #: as their round's ``storage-error`` rejections.)
        self.storage_errors: Counter = Counter()
        #: Acknowledged batches whose acknowledgement the spool could not write yet (retried).
        self._acks_unwritten: set[bytes] = set()
        #: Batches given up unacknowledged (``ack_timeout``), each with a signed ``failed`` outcome.
        self.expired: int = 0
        #: From when (``clock``) each unacknowledged batch's ``ack_timeout`` runs: its round's deadline,
        #: or when this process released or first re-published it, whichever is later.
        self._published_at: dict[bytes, float] = {}
        #: Signed round outcomes the broker has not taken yet, the latest of each round, by (session id, round id).
        self._outcomes_unannounced: dict[tuple[bytes, int], tuple] = {}
        #: Rounds (session id, round id) whose ``failed`` outcome this process announced: final, nothing follows it.
        self._failed_outcomes: set[tuple[bytes, int]] = set()
        self.started = time.time()

    # ------------------------------------------------------------------ serving
    async def serve(self) -> None:
        """Resume from the spool, then serve announced rounds and acknowledgements until cancelled."""
        announcements = await self.control_channel.subscribe(announce_topic(self.session_id))
        acks = await self.control_channel.subscribe(acks_topic(self.session_id))
        ack_task = asyncio.create_task(self._serve_acks(acks))
        republish_task = asyncio.create_task(self._republish_periodically())
        try:
            await self.republish_unacknowledged()
            for resumed in self.spool.rounds("open"):
                if resumed.session_id == self.session_id and resumed.round_id not in self.rounds:
                    try:
                        spec = self.verified_spec(resumed.signed_spec)
                    except ShuffleDPError as exc:  # e.g. keys rotated since: the round cannot be served
                        try:
                            self.spool.fail(resumed.session_id, resumed.round_id, exc.reason)
                        except SpoolStorageError as failure:  # still open in the spool: failed again next time
                            self.storage_errors["fail"] += 1
                            _log.error("shuffler: round %d: failure not written to the spool: %s", resumed.round_id, failure)
                        continue
                    await self._run_guarded(spec, resumed.signed_spec)
            async for data in announcements:
                try:
                    spec = self.verified_spec(data)
                except ShuffleDPError as exc:
                    self.rejected_announcements[exc.reason] += 1
                    continue
                except Exception:  # a bug, not an input class: count it, keep serving
                    self.rejected_announcements[INTERNAL_ERROR] += 1
                    _log.exception("shuffler announcement: untyped exception")
                    continue
                stored = self.spool.round(spec.session_id, spec.round_id)
                if stored is not None and stored.spec_digest != spec.digest:
                    # The analyzer signed two specs for one round (e.g. it restarted and lost its
                    # round counter): the round keeps the spec its admitted envelopes were sealed under.
                    self.rejected_announcements["round-respecified"] += 1
                    _log.warning("shuffler: round %d announced again under another spec: ignored", spec.round_id)
                    continue
                if spec.round_id in self.rounds:
                    continue  # a re-delivered (retained) announcement of a round served by this process
                if stored is not None and stored.state != "open":
                    continue  # served (or failed) before a restart: never re-opened
                await self._run_guarded(spec, data)
        finally:
            for task in (ack_task, republish_task):
                task.cancel()
            await asyncio.gather(ack_task, republish_task, return_exceptions=True)
            await announcements.close()
            await acks.close()
            self.close()

    def close(self) -> None:
        """Stop the worker processes, if any (``serve`` does it on exit)."""
        if self.opener_pool is not None:
            self.opener_pool.close()

    def verified_spec(self, signed_spec: bytes) -> RoundSpec:
        """The spec inside a signed announcement, if the analyzer signed it for this session and this shuffler."""
        spec = verified_spec(signed_spec, self.analyzer_signing_key)
        if spec.session_id != self.session_id:
            raise UnknownRound("spec for another session")
        if spec.shuffler_key != self.keys.hpke_public or spec.shuffler_signing_key != self.keys.signing_public:
            raise UnknownRound("spec names another shuffler")
        if self.instance >= spec.shuffler_instances:
            raise UnknownRound(f"spec has {spec.shuffler_instances} shuffler instance(s); this is instance {self.instance}")
        return spec

    async def _run_guarded(self, spec: RoundSpec, signed_spec: bytes) -> None:
        try:
            await self.run_round(spec, signed_spec)
        except ShuffleDPError as exc:  # e.g. a batch too large to encode: the round fails, the service goes on
            stats = self.rounds.setdefault(spec.round_id, RoundStats(spec.round_id))
            stats.outcome = exc.reason
            self._fail_round(spec, exc.reason)
            await self._publish_outcome(spec, "failed", exc.reason, stats.admitted)
            _log.warning("shuffler: round %d failed: %s", spec.round_id, exc)

    def _fail_round(self, spec: RoundSpec, reason: str) -> None:
        """Mark the round failed in the spool (deleting its reports); if the spool cannot be written,
        log and count it: the round stays open there, and fails again when it is next resumed."""
        try:
            self.spool.fail(spec.session_id, spec.round_id, reason)
        except SpoolStorageError as exc:
            self.storage_errors["fail"] += 1
            _log.error("shuffler: round %d: failure not written to the spool (its reports are deleted when "
                       "the round is next resumed): %s", spec.round_id, exc)

    async def _until_written(self, what: str, round_id: int, write, *args, deadline: float | None = None):
        """``write(*args)``, retried every ``storage_retry_interval`` seconds while the spool cannot
        write it (each failure logged and counted); re-raises once ``deadline`` (clock time) passed."""
        while True:
            try:
                return write(*args)
            except SpoolStorageError as exc:
                self.storage_errors[what] += 1
                if deadline is not None and self.clock() >= deadline:
                    raise
                _log.error("shuffler: round %d: %s not written to the spool, retrying in %g s: %s",
                           round_id, what, self.storage_retry_interval, exc)
                await asyncio.sleep(self.storage_retry_interval)

    async def run_round(self, spec: RoundSpec, signed_spec: bytes) -> RoundStats:
        """Open (or resume) one round, admit until ``max_batch`` or the deadline, then release or fail."""
        await self._until_written("open-round", spec.round_id, self.spool.open_round, spec.session_id, spec.round_id,
                                  signed_spec, deadline=spec.deadline)
        admission = RoundAdmission(
            spec, self.keys, self.issuer, self.spool, revoked=self.revoked, instance=self.instance, opener_pool=self.opener_pool
        )
        self.rounds[spec.round_id] = admission.stats
        reports = await self.channel.subscribe(reports_topic(spec.session_id, spec.round_id, self.instance))
        try:
            await self.channel.publish(spec_topic(spec.session_id), signed_spec, retain=True)
            while not admission.full:
                remaining = spec.deadline - self.clock()
                if remaining <= 0:
                    break
                try:
                    # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
                    # that arrives together with a message, and the service would not stop
                    async with asyncio.timeout(remaining):
                        first = await reports.get()
                except TimeoutError:
                    break
                burst = [first, *reports.get_nowait_all(BURST - 1)]
                receipts = await admission.offer_many_async(burst)
                if receipts:
                    await self._publish_receipts(spec, receipts, admission.stats)
        finally:
            await reports.close()
        stats = admission.stats
        if not batch_releasable(stats.admitted, spec):
            stats.outcome = BatchTooSmall.reason
            self._fail_round(spec, BatchTooSmall.reason)
            await self._publish_outcome(spec, "failed", BatchTooSmall.reason, stats.admitted)
            _log.info("shuffler: round %d failed with %d of %d reports", spec.round_id, stats.admitted, spec.min_batch)
            return stats
        batch_id = os.urandom(BATCH_ID_BYTES)
        chunks = batch_chunks(spec, self.keys, batch_id, admission.shuffled_payloads(), self.chunk_size)
        # published only once spooled: until then the round stays open in the spool, with its reports
        await self._until_written("release", spec.round_id, self.spool.release, spec.session_id, spec.round_id, batch_id, chunks)
        self._published_at[batch_id] = max(self.clock(), spec.deadline)
        # Released from here on: the spool holds the batch, and it is published now and again until
        # acknowledged (republish_unacknowledged), whatever becomes of the publishes below. So the round's
        # statistics say so before any publish waits for the broker: an acknowledgement that lands while
        # a publish still waits marks the round served, and nothing below undoes it; and a publish that
        # fails does not fail a round whose batch will still be delivered and counted.
        stats.forwarded = stats.admitted
        stats.chunks = len(chunks)
        stats.outcome = "forwarded"
        try:
            await self._publish_chunks(spec.session_id, spec.round_id, chunks)
        except ShuffleDPError as exc:  # e.g. the broker away longer than a publish waits
            _log.warning("shuffler: round %d released, its batch not published yet (published again every %g s "
                         "until acknowledged): %s", spec.round_id, self.republish_interval, exc)
        await self._publish_outcome(spec, "released", "", stats.admitted, batch_id)
        _log.info("shuffler: round %d released %d reports in %d chunk(s)", spec.round_id, stats.admitted, len(chunks))
        return stats

    # ------------------------------------------------------------------ publishing
    async def _publish_chunks(self, session_id: bytes, round_id: int, chunks: list[bytes]) -> None:
        topic = batch_topic(session_id, round_id, self.instance)
        for chunk in chunks:
            await self.channel.publish(topic, chunk)

    async def _publish_receipts(self, spec: RoundSpec, receipts: Receipts, stats: RoundStats) -> None:
        """Publish signed receipts (one message per burst; a burst larger than a message can hold is split).

        A receipt that cannot be published (the broker is away) is counted and logged,
        never fatal: the envelopes are admitted and spooled whatever their receipts'
        fate, and a client that hears nothing learns the round's fate from its outcome.
        """
        half = MAX_RECEIPTS // 2
        try:
            for start in range(0, max(len(receipts.admitted), len(receipts.refused)), half):
                message = AdmissionReceipts(
                    spec.session_id,
                    spec.round_id,
                    spec.digest,
                    tuple(receipts.admitted[start : start + half]),
                    tuple(receipts.refused[start : start + half]),
                    tuple(receipts.reasons[start : start + half]),
                )
                await self.channel.publish(
                    receipts_topic(spec.session_id, spec.round_id, self.instance), signed_encoding(self.keys.signing_private, message)
                )
        except ShuffleDPError as exc:
            stats.receipts_unsent += 1
            _log.warning("shuffler: round %d: receipts not published: %s", spec.round_id, exc)

    async def _publish_outcome(
        self, spec: RoundSpec, outcome: str, reason: str, admitted: int, batch_id: bytes = bytes(BATCH_ID_BYTES)
    ) -> None:
        """Sign and publish a round's outcome (:meth:`_announce_outcome`: never raises, re-sent until out)."""
        await self._announce_outcome((spec.session_id, spec.round_id, spec.digest, outcome, reason, admitted, batch_id))

    async def _announce_outcome(self, outcome: tuple) -> None:
        """Publish a round's signed outcome (the arguments of :meth:`_publish_round_outcome`), now if the
        broker takes it, else at every re-publishing pass (every ``republish_interval`` seconds) until
        it does: a device learns its round's fate from it, so a ``released`` or ``failed`` outcome
        the broker refused (it was away longer than a publish waits) is never left unsent. A round
        has one outcome pending at a time, its latest: a given-up batch's ``failed`` outcome takes the
        place of its round's ``released`` one not yet out, so the retained outcome the broker ends up
        holding is the round's last word. Outcomes go only forward, as devices take them: once a
        round's ``failed`` outcome is announced (or pending), a ``released`` one for it is dropped, so
        a round given up while its own task still waited to publish its batch and ``released``
        outcome is never announced released after it failed. Never raises: the round's state is in
        the spool whatever becomes of its announcement."""
        key = (outcome[0], outcome[1])
        if key in self._failed_outcomes:
            return  # a failed outcome is final: nothing follows it
        if outcome[3] != "released":
            self._failed_outcomes.add(key)
        self._outcomes_unannounced[key] = outcome
        await self._announce_outcomes()

    async def _publish_round_outcome(
        self, session_id: bytes, round_id: int, spec_digest: bytes, outcome: str, reason: str, admitted: int,
        batch_id: bytes = bytes(BATCH_ID_BYTES),
    ) -> None:
        message = signed_encoding(
            self.keys.signing_private,
            RoundOutcome(session_id, round_id, spec_digest, outcome, reason, admitted, batch_id, self.instance),
        )
        await self.channel.publish(outcome_topic(session_id, round_id, self.instance), message, retain=True)

    async def republish_unacknowledged(self) -> int:
        """Publish again every released batch of this session the analyzer has not acknowledged;
        give up (:meth:`_expire`) those unacknowledged for ``ack_timeout`` seconds."""
        count = 0
        now = self.clock()
        await self._announce_outcomes()
        for stored in self.spool.unacknowledged():
            if stored.session_id == self.session_id and stored.batch_id not in self._acks_unwritten:
                since = self._published_at.get(stored.batch_id)
                if since is None:
                    since = self._published_at[stored.batch_id] = max(now, self._deadline(stored.session_id, stored.round_id))
                if now - since >= self.ack_timeout:
                    await self._expire(stored.session_id, stored.round_id, stored.batch_id)
                    continue
                await self._publish_chunks(stored.session_id, stored.round_id, stored.chunks)
                count += 1
        self.republished += count
        return count

    def _deadline(self, session_id: bytes, round_id: int) -> float:
        """The deadline of a stored round's signed spec (``-inf`` if it cannot be read)."""
        try:
            stored = self.spool.round(session_id, round_id)
            return self.verified_spec(stored.signed_spec).deadline if stored is not None else float("-inf")
        except ShuffleDPError:
            return float("-inf")

    async def _expire(self, session_id: bytes, round_id: int, batch_id: bytes) -> None:
        """Give up a batch the analyzer never acknowledged: first record its round ``failed`` (reason
        ``not-acknowledged``, never ``served``) in the spool and delete its chunks there
        (:meth:`~shuffledp.shuffler.spool.SqliteSpool.expire`: the round is never re-opened, it is never
        re-published, and a late acknowledgement does not make it served), then sign and publish (retained)
        the round's ``failed`` outcome.

        The spool decides, the outcome follows: an acknowledgement that lands while the outcome is being
        published finds the round already ``failed`` (and is refused as a late one), so what clients read
        is what the spool holds; one that landed before the expiry wins (``expire`` returns None), and then
        nothing is published or counted: the round was served. If the spool cannot be written, nothing
        changes and the next pass tries again. If the outcome cannot be published (the broker is away),
        the round stays ``failed`` in the spool and the outcome is published again at every re-publishing
        pass (every ``republish_interval`` seconds) until it is out (a repeated outcome is the same
        retained message). Across a restart that announcement is lost: the spool records the round
        ``failed`` but not whether its outcome went out, and the broker keeps the round's retained
        ``released`` outcome (the analyzer, which never acknowledged it, has given it up too)."""
        stats = self.rounds.get(round_id) if session_id == self.session_id else None
        admitted = stats.admitted if stats is not None else 0
        stored = self.spool.round(session_id, round_id)
        digest = stored.spec_digest if stored is not None else bytes(SPEC_DIGEST_BYTES)
        try:
            expired = self.spool.expire(batch_id, NOT_ACKNOWLEDGED)
        except SpoolStorageError as exc:
            self.storage_errors["expire"] += 1
            _log.error("shuffler: round %d: unacknowledged batch not deleted from the spool (retried): %s", round_id, exc)
            return
        self._published_at.pop(batch_id, None)
        if expired is None:  # acknowledged (or given up) first: served stays served, and nothing says otherwise
            _log.info("shuffler: round %d: batch %s was acknowledged before it was given up", round_id, batch_id.hex())
            return
        self.expired += 1
        if stats is not None:
            stats.outcome = NOT_ACKNOWLEDGED
        _log.warning("shuffler: round %d: batch %s not acknowledged %g s after the round's deadline: given up, deleted",
                     round_id, batch_id.hex(), self.ack_timeout)
        await self._announce_outcome((session_id, round_id, digest, "failed", NOT_ACKNOWLEDGED, admitted, batch_id))

    async def _announce_outcomes(self) -> None:
        """Publish every round outcome not announced yet (:meth:`_announce_outcome`), oldest first; at the
        first the broker does not take, stop: they stay pending for the next pass (``republish_unacknowledged``)."""
        for key, outcome in list(self._outcomes_unannounced.items()):
            try:
                await self._publish_round_outcome(*outcome)
            except Exception as exc:  # noqa: BLE001 - the round's state is final: its outcome must still go out
                _log.error("shuffler: round %d: its %s outcome not published (retried every %g s): %s",
                           outcome[1], outcome[3], self.republish_interval, exc, exc_info=not isinstance(exc, ShuffleDPError))
                return
            if self._outcomes_unannounced.get(key) is outcome:  # not replaced by a later outcome meanwhile
                del self._outcomes_unannounced[key]

    async def _republish_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.republish_interval)
            for batch_id in sorted(self._acks_unwritten):
                try:
                    self._acknowledge(batch_id)
                except SpoolStorageError:
                    break  # still not writable: next time
            try:
                await self.republish_unacknowledged()
            except ShuffleDPError as exc:  # e.g. the broker is away: try again next time
                _log.warning("shuffler: re-publishing unacknowledged batches failed: %s", exc)

    # ------------------------------------------------------------------ acknowledgements
    async def _serve_acks(self, acks) -> None:
        async for data in acks:
            self.handle_ack(data)

    def handle_ack(self, data: bytes) -> bool:
        """Mark a batch served on the analyzer's signed acknowledgement; count anything else by reason."""
        try:
            ack = decode_verified(data, BatchAck, self.analyzer_signing_key)
            if ack.session_id != self.session_id:
                raise UnknownRound("acknowledgement for another session")
            stored = self.spool.round(ack.session_id, ack.round_id)
            if stored is not None and ack.spec_digest != stored.spec_digest:
                raise UnknownRound("acknowledgement under another spec of the round")
        except ShuffleDPError as exc:
            self.rejected_acks[exc.reason] += 1
            return False
        except Exception:  # a bug, not an input class
            self.rejected_acks[INTERNAL_ERROR] += 1
            _log.exception("shuffler acknowledgement: untyped exception")
            return False
        try:
            if self._acknowledge(ack.batch_id):
                return True
        except SpoolStorageError as exc:
            self.rejected_acks[exc.reason] += 1
            self._acks_unwritten.add(ack.batch_id)
            _log.error("shuffler: acknowledgement of batch %s not written to the spool (retried): %s", ack.batch_id.hex(), exc)
            return False
        self.rejected_acks["unknown-batch"] += 1
        return False

    def _acknowledge(self, batch_id: bytes) -> bool:
        """Write an authenticated acknowledgement to the spool; whether it served a released batch."""
        try:
            served = self.spool.acknowledge(batch_id)
        except SpoolStorageError:
            self.storage_errors["acknowledge"] += 1
            raise
        self._acks_unwritten.discard(batch_id)
        self._published_at.pop(batch_id, None)
        if served is None:
            return False
        self.acknowledged += 1
        stats = self.rounds.get(served[1]) if served[0] == self.session_id else None  # the batch's round, not the ack's word
        if stats is not None:
            stats.outcome = "served"
        return True

    # ------------------------------------------------------------------ operator view
    def stats(self) -> dict[str, Any]:
        """Everything an operator reads: per-round admission and rejection counts by reason, acks, re-publishing."""
        rejected: Counter = Counter()
        for r in self.rounds.values():
            rejected.update(r.rejected)
        return {
            "session_id": self.session_id.hex(),
            "uptime_s": round(time.time() - self.started, 3),
            "rounds": [r.as_dict() for r in sorted(self.rounds.values(), key=lambda r: r.round_id)],
            "admitted_total": sum(r.admitted for r in self.rounds.values()),
            "rejected_total": dict(sorted(rejected.items())),
            "rejected_announcements": dict(self.rejected_announcements),
            "rejected_acks": dict(self.rejected_acks),
            "acknowledged_batches": self.acknowledged,
            "republished_batches": self.republished,
            "expired_batches": self.expired,
            "storage_errors": dict(sorted(self.storage_errors.items())),
        }


__all__ = ["RoundAdmission", "RoundStats", "Shuffler", "batch_chunks", "batch_releasable"]
