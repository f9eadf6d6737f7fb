"""The analyzer's coordinator: drives multi-round protocols over a channel.

For each round it builds a RoundSpec naming the analyzer's sealing key and the one
shuffler it trusts (that shuffler's sealing and signing keys), signs it, subscribes
to the round's batch and outcome topics, announces the spec, and assembles the
shuffled batch from its signed chunks, opening each as it arrives (until the round's
deadline plus a grace period). It accepts only chunks signed by the shuffler the
spec names, takes the first batch id to complete with at least ``min_batch`` valid
reports, and acknowledges it with a signed :class:`BatchAck` (again whenever the shuffler
publishes the batch again, until :meth:`Coordinator.close`: ``analyzer/ack_keeper.py``); a signed ``failed``
outcome from the shuffler ends the wait early. The announcement is published again every
``reannounce_interval`` seconds until the shuffler shows it opened the round (it relays the
signed spec on the spec topic) or every instance has sent a chunk or an outcome of the round: a
broker that drops the announcement to a shuffler that lags (its queue full) does not leave the
round unopened. With several shuffler instances the
round has one batch per instance, and a sealed report counts once in the round: a
copy of one that an earlier batch of the round counted (the same HPKE encapsulated
key) is dropped as ``duplicate-across-batches``, and does not count towards its
batch's ``min_batch`` or size. :meth:`Coordinator.run_protocol` runs any protocol
described as rounds (``analyzer/protocols.py``) this way.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import math
import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from shuffledp.analyzer.ack_keeper import AcknowledgementKeeper
from shuffledp.analyzer.protocols import Protocol
from shuffledp.analyzer.service import Analyzer, BatchOpening, OpenedBatch, read_signed_chunk
from shuffledp.analyzer.session_store import (
    COMPLETED,
    FAILED,
    SessionMismatch,
    SessionStore,
    StoredAnalyzerRound,
    StoredRoundResult,
    failed_round,
)
from shuffledp.protocol.wire import codec
from shuffledp.protocol.transport.channel import Channel, acks_topic, announce_topic, batch_topic, outcome_topic, spec_topic
from shuffledp.protocol.errors import BatchTooSmall, InvalidParameter, MalformedMessage, ShuffleDPError
from shuffledp.protocol.wire.messages import MAX_BATCH, SESSION_ID_BYTES, MechanismParams, RoundOutcome, RoundSpec, messages_per_user
from shuffledp.protocol.wire.onion import decode_verified, verified_spec
from shuffledp.protocol.wire.report_format import report_format

_log = logging.getLogger(__name__)
#: Seconds between re-publications of a round's announcement that no shuffler has answered yet.
REANNOUNCE_INTERVAL = 5.0


@dataclass(frozen=True)
class ShufflerIdentity:
    """The public keys of the shuffler a session trusts: sealing (X25519) and signing (Ed25519)."""

    hpke_public: bytes
    signing_public: bytes


@dataclass(frozen=True)
class RoundRecord:
    """One completed round: its spec, what was opened, the bytes its chunks took, and its batches.

    With several shuffler instances the round has one batch per instance that
    released: ``opened`` merges them, each sealed report once (a copy in a later
    batch is dropped and counted in ``opened.rejected`` as ``duplicate-across-batches``),
    ``batch_sizes`` gives each batch's number of valid reports the round counts, so
    copies excluded and ``sum(batch_sizes) == opened.size`` (the amplification of a
    report depends on the size of *its* batch, so the accountant must use the
    smallest), and ``failed_instances`` counts
    the instances whose signed outcome said they failed. ``signed_spec`` is the
    encoded :class:`SignedRoundSpec` the coordinator announced (empty for a spec it
    served without announcing): the bytes an auditor verifies the round's claim from.
    """

    spec: RoundSpec
    opened: OpenedBatch
    batch_bytes: int
    batch_id: bytes = b""
    chunks: int = 1
    batch_ids: tuple[bytes, ...] = ()
    batch_sizes: tuple[int, ...] = ()
    failed_instances: int = 0
    signed_spec: bytes = b""

    @property
    def smallest_batch(self) -> int:
        """The size the round's central guarantee must be accounted at."""
        return min(self.batch_sizes) if self.batch_sizes else self.opened.size


@dataclass(frozen=True)
class _Batch:
    """One completed batch of a round; ``keys``: the encapsulated keys of its counted reports
    (kept only in a round of several shuffler instances, where later batches are checked against them)."""

    batch_id: bytes
    opened: OpenedBatch
    bytes: int
    chunks: int
    keys: frozenset[builtins.bytes] = frozenset()


class _Claimed:
    """The encapsulated keys the round's completed batches counted (a view: nothing is copied)."""

    def __init__(self, batches) -> None:
        self.keys = [b.keys for b in batches]

    def __contains__(self, key: object) -> bool:
        return any(key in keys for keys in self.keys)


class _Assembly:
    """The chunks of one batch id received so far, opened as they came."""

    def __init__(self, chunks: int, total: int, opening: BatchOpening) -> None:
        self.chunks = chunks
        self.total = total
        self.opening = opening
        self.seen: set[int] = set()
        self.received = 0
        self.bytes = 0


#: The least liveness margin :func:`liveness_margin` gives a round.
MIN_LIVENESS_MARGIN = 8
#: ``Coordinator(batch_margin=NO_LIVENESS_MARGIN)``: the opt-out of the liveness margin. A round
#: then admits exactly the reports it needs, and one junk envelope from an enrolled credential
#: fails it; right only where every credential is held by a party that sends valid reports (the
#: in-process simulation, whose clients are all honest and simulated).
NO_LIVENESS_MARGIN = 0


def liveness_margin(min_batch: int) -> int:
    """Envelopes a round admits beyond ``min_batch``: ``max(8, ceil(min_batch / 100))``.

    With ``max_batch = min_batch + liveness_margin(min_batch)``, up to that many envelopes that
    do not open to a valid report (junk from enrolled credentials, which the shuffler cannot
    tell from reports) neither take an honest client's place (``round-full``) nor fail a round
    in which ``min_batch`` honest reports arrived before the deadline: the shuffler releases
    them all at the deadline, and the analyzer drops the junk and still counts ``min_batch``
    valid reports. The price: such a round is released at its deadline unless
    ``max_batch`` envelopes arrive first."""
    return max(MIN_LIVENESS_MARGIN, math.ceil(min_batch / 100))


def service_batch_bounds(users: int) -> tuple[int, int]:
    """``(min_batch, max_batch)`` of a deployed round when the operator sets neither.

    ``max_batch = users``: each enrolled credential may send one envelope, so the round is
    released the moment every user has answered. ``min_batch = users - margin`` with
    ``margin = min(liveness_margin(users), (users - 1) // 2)``: up to ``margin`` enrolled
    clients may send junk (or stay silent) and the round still completes with the valid
    reports of the others, while more than half of the users must always answer validly.
    The central guarantee is accounted at the valid reports the batch really holds."""
    if not isinstance(users, int) or users < 2:
        raise ValueError("users must be an integer >= 2")
    return protocol_batch_bounds(users)


def protocol_batch_bounds(messages: int, margin: int | None = None) -> tuple[int, int]:
    """``(min_batch, max_batch)`` of a round that waits for ``messages`` envelopes (every message
    of every user): ``max_batch = messages`` (released the moment all arrived) and ``min_batch =
    messages - margin``; ``margin`` None takes ``min(liveness_margin(messages), (messages - 1) // 2)``,
    the margin of :func:`service_batch_bounds`. :class:`InvalidParameter` if no envelope would be
    left to wait for."""
    if margin is None:
        margin = min(liveness_margin(messages), (messages - 1) // 2)
    if not messages > margin >= 0:
        raise InvalidParameter("batch_margin", f"a margin of {margin} leaves nothing of {messages} message(s) to wait for")
    return messages - margin, messages


def check_servable(spec: RoundSpec) -> None:
    """Refuse a round whose largest batch could not be encoded as one shuffled-batch message."""
    sealed = report_format(spec.round_id, spec.mechanism).sealed_size
    largest = spec.max_batch * (sealed + 3) + 256  # each payload: a 2-3 byte header and its bytes
    limit = codec.MESSAGE_TYPES["shuffled-batch"][1]
    if largest > limit:
        raise InvalidParameter(
            "max_batch", f"{spec.max_batch} reports of {sealed} bytes make a {largest}-byte batch, over {limit}"
        )


class Coordinator:
    """Runs rounds of one session against a shuffler reachable over ``channel``."""

    def __init__(
        self,
        channel: Channel,
        analyzer: Analyzer,
        shuffler: ShufflerIdentity,
        *,
        session_id: bytes | None = None,
        round_timeout: float = 60.0,
        grace: float = 5.0,
        on_progress: Callable[[int], None] | None = None,
        batch_margin: int | None = None,
        store: SessionStore | None = None,
        reannounce_interval: float = REANNOUNCE_INTERVAL,
    ) -> None:
        if batch_margin is not None and (not isinstance(batch_margin, int) or batch_margin < 0):
            raise ValueError("batch_margin must be None or a non-negative integer")
        if not 0 < reannounce_interval < math.inf:
            raise ValueError("reannounce_interval must be a positive number of seconds")
        #: Seconds between re-publications of an announcement no shuffler has answered (:meth:`receive_round`).
        self.reannounce_interval = reannounce_interval
        self.channel = channel
        #: ``max_batch - min_batch`` of the rounds this coordinator announces without an explicit
        #: ``max_batch``: None (the default) for the liveness margin ``analyzer run`` gives its rounds
        #: (:func:`liveness_margin` above ``min_batch`` in :meth:`run_round`, :func:`protocol_batch_bounds`
        #: below every user's messages in :meth:`run_protocol`), an int for that margin, or
        #: :data:`NO_LIVENESS_MARGIN` (0) to opt out: the exact population, released as soon as
        #: ``min_batch`` envelopes arrive, which suits only rounds whose every credential is held by
        #: a party that sends valid reports, as in the in-process simulation.
        self.batch_margin = batch_margin
        self.analyzer = analyzer
        self.shuffler = shuffler
        self.session_id = session_id if session_id is not None else os.urandom(SESSION_ID_BYTES)
        self.round_timeout = round_timeout
        self.grace = grace
        self._next_round = 0
        #: The durable record of the rounds this session announced (``analyzer/session_store.py``):
        #: with one, a round is written before it is announced, and a restarted coordinator
        #: resumes the session from it instead of announcing a round id twice; its round
        #: high-water mark, kept outside the file, refuses a new spec for a round id a
        #: rolled-back file no longer records.
        self.store = store
        self.on_progress = on_progress
        #: Bytes on a batch topic that were not a batch of the round, by reason.
        self.rejected_batches: Counter = Counter()
        #: Announcements published again because no shuffler had answered them yet.
        self.reannounced: int = 0
        #: Acknowledged rounds' batch topics, still read: a batch the shuffler publishes again is
        #: acknowledged again (its first acknowledgement was lost). :meth:`close` ends it.
        self.ack_keeper = AcknowledgementKeeper(self._publish_ack)

    async def run_round(
        self,
        params: MechanismParams,
        epsilon0: float,
        min_batch: int,
        *,
        delta0: float = 0.0,
        max_batch: int | None = None,
        shuffler_instances: int = 1,
    ) -> RoundRecord:
        """Announce one round; return its batches that open to at least ``min_batch`` valid reports each.

        ``max_batch`` defaults to ``min_batch`` plus the coordinator's ``batch_margin``
        (:func:`liveness_margin`, by default), at most ``MAX_BATCH``. With margin 0 (the
        opt-out, :data:`NO_LIVENESS_MARGIN`) the
        shuffler forwards as soon as it holds ``min_batch`` envelopes, and one junk envelope
        from an enrolled credential fails the round; with a margin, up to that many junk
        envelopes cannot (the batch is released at the deadline unless ``max_batch``
        envelopes arrive first). The analyzer counts only valid reports towards
        ``min_batch`` either way, and refuses a longer batch before opening it. With
        ``shuffler_instances`` > 1, each instance releases its own batch (or fails); the
        round ends when every instance has been heard from, or at the deadline plus the
        grace period with the batches complete by then.
        """
        if max_batch is None:
            margin = liveness_margin(min_batch) if self.batch_margin is None else self.batch_margin
            max_batch = max(min_batch, min(MAX_BATCH, min_batch + margin))
        round_id = self._next_round
        self._next_round += 1
        stored = self.store.round(self.session_id, round_id) if self.store is not None else None
        if stored is not None:
            asked = (params, epsilon0, delta0, min_batch, max_batch, shuffler_instances)
            return await self._resume_round(stored, asked)
        spec = RoundSpec(
            session_id=self.session_id,
            round_id=round_id,
            params=params,
            epsilon0=epsilon0,
            delta0=delta0,
            analyzer_key=self.analyzer.keys.hpke_public,
            shuffler_key=self.shuffler.hpke_public,
            shuffler_signing_key=self.shuffler.signing_public,
            messages_per_user=messages_per_user(params),
            min_batch=min_batch,
            max_batch=max_batch,
            deadline=time.time() + self.round_timeout,
            shuffler_instances=shuffler_instances,
        )
        check_servable(spec)
        if self.store is not None:
            self.store.check_unannounced(self.session_id, round_id)  # before anything is signed
            self.store.announce(self.session_id, round_id, self.analyzer.sign_spec(spec))  # before anyone sees it
        return await self._serve_recorded(spec)

    async def _serve_recorded(self, spec: RoundSpec) -> RoundRecord:
        """Announce and serve a round, and record how it ended in the session store (if any)."""
        def record_result(record: RoundRecord) -> None:  # before any acknowledgement: see receive_round
            if self.store is not None:
                self.store.complete(spec.session_id, spec.round_id, StoredRoundResult(
                    record.opened.values, record.opened.rejected, record.batch_bytes, record.batch_ids,
                    record.batch_sizes, record.chunks, record.failed_instances))

        try:
            return await self.receive_round(spec, announce=True, before_ack=record_result)
        except BatchTooSmall:
            if self.store is not None:
                self.store.fail(spec.session_id, spec.round_id)
            raise

    async def _resume_round(self, stored: StoredAnalyzerRound, asked: tuple) -> RoundRecord:
        """A round the session store holds from before a restart: its recorded result, or (announced,
        not completed) the same signed spec served again; never a new spec for its round id."""
        # The stored bytes must still be this analyzer's own signature: the file is checked private,
        # and this keeps a spec planted in it from ever being served or replayed.
        spec = verified_spec(stored.signed_spec, self.analyzer.keys.signing_public)
        if (spec.params, spec.epsilon0, spec.delta0, spec.min_batch, spec.max_batch, spec.shuffler_instances) != asked:
            raise SessionMismatch(
                f"round {spec.round_id} of session {spec.session_id.hex()} was announced with other parameters "
                "before the restart; a session resumes only with the protocol and data it started with")
        if stored.state == FAILED:
            raise failed_round(stored)
        if stored.state == COMPLETED:
            r = stored.result
            assert r is not None  # the store writes a completed round's state and result together
            # Acknowledged again (the same signed bytes): the process may have died between writing
            # the result and acknowledging it, and the shuffler must not give the batch up.
            await self._acknowledge(spec, r.batch_ids)
            return RoundRecord(spec, OpenedBatch(r.values, r.rejected), r.batch_bytes, r.batch_ids[0], r.chunks,
                               r.batch_ids, r.batch_sizes, r.failed_instances, stored.signed_spec)
        if self.analyzer.sign_spec(spec) != stored.signed_spec:
            raise SessionMismatch(f"round {spec.round_id} was signed with another analyzer key before the restart")
        # The mark may lag the file if the process died between recording the round and raising it:
        # raised before the spec leaves again, so a later rollback of the file cannot reach this round.
        assert self.store is not None  # the stored round came from it
        self.store.advance_high_water(spec.session_id, spec.round_id)
        return await self._serve_recorded(spec)

    async def receive_round(
        self, spec: RoundSpec, *, announce: bool = False, before_ack: Callable[[RoundRecord], None] | None = None
    ) -> RoundRecord:
        """Subscribe to a round's batch and outcome topics, (optionally) announce it, and
        collect, open and acknowledge its batches (see :meth:`_collect_batches`).

        ``announce=False`` serves a spec already announced (or opened at the shuffler
        directly, as the load benchmark does). ``before_ack`` is called with the round's
        record before any batch is acknowledged: the session store writes the round's
        result there, because an acknowledged batch is deleted by the shuffler, and a
        result not yet written when the process dies would be lost for good."""
        subscriptions = []
        signed_spec = b""
        kept = False  # whether the batch subscriptions went on to the acknowledgement keeper
        try:
            for instance in range(spec.shuffler_instances):
                subscriptions.append(("batch", instance, await self.channel.subscribe(batch_topic(spec.session_id, spec.round_id, instance))))
                subscriptions.append(("outcome", instance, await self.channel.subscribe(outcome_topic(spec.session_id, spec.round_id, instance))))
            if announce:
                signed_spec = self.analyzer.sign_spec(spec)
                # before the announcement: the shuffler's relay of it says the round is open
                subscriptions.append(("spec", -1, await self.channel.subscribe(spec_topic(spec.session_id))))
                await self.channel.publish(announce_topic(spec.session_id), signed_spec, retain=True)
            batches, failed = await self._collect_batches(spec, subscriptions, signed_spec)
            for kind, _, subscription in subscriptions:
                if kind != "batch":
                    await subscription.close()
            record = _record(spec, batches, failed, signed_spec)
            if before_ack is not None:
                before_ack(record)
            acks = await self._acknowledge(spec, record.batch_ids)
            # A batch published again after this means the acknowledgement was lost (analyzer/ack_keeper.py).
            await self.ack_keeper.keep(spec, acks, [s for kind, _, s in subscriptions if kind == "batch"])
            kept = True
        finally:
            if not kept:
                for _, _, subscription in subscriptions:
                    await subscription.close()
        return record

    async def close(self) -> None:
        """Stop answering re-published batches of acknowledged rounds (:attr:`ack_keeper`) and close
        their subscriptions. The channel stays open: it is the caller's."""
        await self.ack_keeper.close()

    async def __aenter__(self) -> "Coordinator":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _acknowledge(self, spec: RoundSpec, batch_ids: tuple[bytes, ...]) -> dict[bytes, bytes]:
        """Sign and publish an acknowledgement of each batch; return them, by batch id."""
        acks = {batch_id: self.analyzer.acknowledge(spec, batch_id) for batch_id in batch_ids}
        for ack in acks.values():
            await self._publish_ack(spec, ack)
        return acks

    async def _publish_ack(self, spec: RoundSpec, ack: bytes) -> None:
        await self.channel.publish(acks_topic(spec.session_id), ack)

    async def _collect_batches(self, spec: RoundSpec, subscriptions, signed_spec: bytes = b"") -> tuple[list[_Batch], int]:
        """Assemble and open the round's batches, signed by its shuffler, until every instance is heard from.

        With ``signed_spec`` (the round was announced here), the announcement is published again
        every :attr:`reannounce_interval` seconds until the spec topic carries those very bytes (the
        shuffler relays them when it opens the round; with one instance that settles it) or every
        instance has sent a chunk or an outcome of the round. A repeated announcement is the same
        signed bytes: a shuffler that has the round open, or served it, ignores it.

        Anyone who can publish to a batch topic can send bytes there; anything that is
        not a chunk of this round signed by the spec's shuffler is counted in
        :attr:`rejected_batches` by reason and ignored, before it costs more than one
        hash. Signed chunks are opened as they arrive; a chunk index already held is a
        re-delivery and is skipped, and a batch id counts once, so each batch counts
        exactly once, on whichever topic its chunks arrive. A report counts once in the
        round: a completing batch drops the copies of reports that batches completed
        before it counted (:meth:`BatchOpening.finish`), then must still hold
        ``min_batch`` valid reports.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.round_timeout + self.grace
        assemblies: dict[bytes, _Assembly] = {}
        completed: dict[bytes, _Batch] = {}
        failed: set[int] = set()
        heard: set[int] = set()  # instances that sent a chunk or an outcome of the round
        announcing = bool(signed_spec)
        reannounce_at = loop.time() + self.reannounce_interval
        inbox: asyncio.Queue = asyncio.Queue()
        pumps = [asyncio.create_task(_pump(sub, kind, instance, inbox)) for kind, instance, sub in subscriptions]
        try:
            while len(completed) + len(failed) < spec.shuffler_instances:
                now = loop.time()
                remaining = deadline - now
                if remaining <= 0:
                    break
                if announcing and now >= reannounce_at:
                    await self._reannounce(spec, signed_spec)
                    reannounce_at = loop.time() + self.reannounce_interval
                    continue
                wait = min(remaining, reannounce_at - now) if announcing else remaining
                try:
                    async with asyncio.timeout(wait):  # not wait_for: see Shuffler.run_round
                        kind, instance, data = await inbox.get()
                except TimeoutError:
                    continue  # the deadline or a re-announcement: the loop's head decides
                if kind == "spec":
                    if data == signed_spec and spec.shuffler_instances == 1:
                        announcing = False  # the shuffler opened the round
                    continue
                heard.add(instance)
                if len(heard) == spec.shuffler_instances:
                    announcing = False
                if kind == "outcome":
                    instance = self._failed_instance(spec, data)
                    if instance is not None:
                        failed.add(instance)
                    continue
                batch = self._take_chunk(spec, assemblies, completed, data)
                if batch is not None:
                    completed[batch.batch_id] = batch
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
        if not completed:
            why = f"the shuffler reports the round failed ({len(failed)} of {spec.shuffler_instances} instance(s))" if failed else "no batch by the deadline"
            raise BatchTooSmall(f"round {spec.round_id}: {why}; no batch of at least {spec.min_batch} reports")
        return list(completed.values()), len(failed)

    async def _reannounce(self, spec: RoundSpec, signed_spec: bytes) -> None:
        """Publish a round's announcement again (retained, the same bytes); a broker that does not take
        it is logged, and the next interval tries again."""
        try:
            await self.channel.publish(announce_topic(spec.session_id), signed_spec, retain=True)
            self.reannounced += 1
        except ShuffleDPError as exc:
            _log.warning("analyzer: round %d: announcement not published again (next try in %g s): %s",
                         spec.round_id, self.reannounce_interval, exc)

    def _failed_instance(self, spec: RoundSpec, data: bytes) -> int | None:
        """The instance whose signed outcome says the round failed there, else None."""
        try:
            outcome = decode_verified(data, RoundOutcome, spec.shuffler_signing_key)
        except ShuffleDPError as exc:
            self.rejected_batches[f"outcome-{exc.reason}"] += 1
            return None
        if (outcome.session_id, outcome.round_id) != (spec.session_id, spec.round_id) or outcome.outcome != "failed":
            return None
        if outcome.spec_digest != spec.digest:  # the shuffler's word on another spec of this round
            self.rejected_batches["outcome-other-spec"] += 1
            return None
        if outcome.instance >= spec.shuffler_instances:
            self.rejected_batches["outcome-unknown-instance"] += 1
            return None
        return outcome.instance

    def _take_chunk(self, spec: RoundSpec, assemblies: dict, completed: dict, data: bytes) -> _Batch | None:
        try:
            chunk = read_signed_chunk(data, spec)
            if chunk.batch_id in completed:
                self.rejected_batches["redelivered-chunk"] += 1
                return None
            assembly = assemblies.get(chunk.batch_id)
            if assembly is None:
                assembly = assemblies[chunk.batch_id] = _Assembly(
                    chunk.chunks, chunk.total, BatchOpening(self.analyzer, spec, self.on_progress)
                )
            if (chunk.chunks, chunk.total) != (assembly.chunks, assembly.total):
                raise MalformedMessage("chunk disagrees with its batch on the number of chunks or reports")
            if chunk.chunk in assembly.seen:
                self.rejected_batches["redelivered-chunk"] += 1
                return None
            assembly.opening.add(chunk.payloads)
        except ShuffleDPError as exc:
            self.rejected_batches[exc.reason] += 1
            return None
        assembly.seen.add(chunk.chunk)
        assembly.received += chunk.size
        assembly.bytes += len(data)
        if len(assembly.seen) < assembly.chunks:
            return None
        del assemblies[chunk.batch_id]
        if assembly.received != assembly.total:
            self.rejected_batches["incomplete-batch"] += 1
            return None
        # One sealing counts once per round, whichever instances' batches carry it: the
        # first batch the round accepts claims its reports' keys; a later one drops its copies.
        opened = assembly.opening.finish(_Claimed(completed.values()) if completed else None)
        if opened.size < spec.min_batch:
            # Not a result: the round was accounted for min_batch reports per batch, and a
            # short batch (say, junk that fails to open, or copies of another batch's
            # reports) would void that claim. It claims no key, so it knocks nothing out.
            self.rejected_batches[BatchTooSmall.reason] += 1
            return None
        keys = assembly.opening.counted if spec.shuffler_instances > 1 else frozenset()
        return _Batch(chunk.batch_id, opened, assembly.bytes, assembly.chunks, keys)

    async def run_protocol(self, protocol: Protocol, users: int) -> tuple[Any, list[RoundRecord]]:
        """Run every round of ``protocol`` for ``users`` clients; return its result and the round records.

        Each round waits for every message of every user (``users`` times the plan's
        messages per user: ``max_batch``), so it is released the moment all arrived. With the
        default liveness margin it needs ``min_batch`` = that minus the margin of
        :func:`protocol_batch_bounds` (``batch_margin`` None; an int margin likewise), as
        ``analyzer run`` does: up to that many users may send junk or stay silent and the round
        still completes, accounted at the valid reports it holds. A round whose mechanism has a
        floor of its own (``params.min_reports``: summation's noise is calibrated to every
        user's shares) never needs fewer. ``batch_margin=NO_LIVENESS_MARGIN``: every message of
        every user is needed, as before.
        """
        records: list[RoundRecord] = []
        rounds = protocol.rounds()
        plan = next(rounds)
        while True:
            messages = users * plan.messages_per_user
            if self.batch_margin == NO_LIVENESS_MARGIN:
                record = await self.run_round(plan.params, plan.epsilon0, messages, delta0=plan.delta0)
            else:
                min_batch, max_batch = protocol_batch_bounds(messages, self.batch_margin)
                min_batch = max(min_batch, min(messages, getattr(plan.params, "min_reports", 0)))
                record = await self.run_round(
                    plan.params, plan.epsilon0, min_batch, delta0=plan.delta0, max_batch=max_batch
                )
            records.append(record)
            try:
                plan = rounds.send(record.opened.values)
            except StopIteration as done:
                return done.value, records


async def _pump(subscription, kind: str, instance: int, inbox: asyncio.Queue) -> None:
    """Forward a subscription's messages into a shared inbox, tagged with their kind and instance."""
    while True:
        inbox.put_nowait((kind, instance, await subscription.get()))


def _record(spec: RoundSpec, batches: list[_Batch], failed: int, signed_spec: bytes = b"") -> RoundRecord:
    """One RoundRecord from the round's completed batches (merged values, per-batch sizes)."""
    values = np.concatenate([b.opened.values for b in batches]) if len(batches) > 1 else batches[0].opened.values
    rejected: Counter = Counter()
    for b in batches:
        rejected.update(b.opened.rejected)
    return RoundRecord(
        spec,
        OpenedBatch(values, rejected),
        sum(b.bytes for b in batches),
        batches[0].batch_id,
        sum(b.chunks for b in batches),
        tuple(b.batch_id for b in batches),
        tuple(b.opened.size for b in batches),
        failed,
        signed_spec,
    )
