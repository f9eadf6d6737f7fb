"""A simulated fleet of devices answering a session's rounds, and retransmitting what was not acknowledged.

:class:`Fleet` keeps each envelope until the shuffler's signed receipt names it and
sends the *same bytes* again if it seems lost, as a real device does, so a fleet
outlives a shuffler crash or a broker restart (the simulation's
:class:`~shuffledp.simulation.client_pool.ClientPool` is a ``Fleet`` too). Every
:class:`~shuffledp.client.Client` verifies, budget-checks, seals and wraps its own
report with ``answer_verified``:

* **Randomness.** By default every client draws its own report from its own source,
  as a device does (the OS CSPRNG unless the client was given another). A
  simulation may instead draw a round's reports for all clients at once: with
  ``draw`` (:func:`shuffledp.simulation.engine.seeded_draw`, the message engine's seeded draw,
  so a seeded fleet reports exactly what ``shuffledp simulate`` draws with that seed)
  or with a ``source`` (one vectorized call of the round's randomizer).

* **Answering.** For each new round on the session's spec topic (verified against
  the pinned analyzer key; re-delivered specs are ignored), every client answers
  once and publishes to its shuffler instance's reports topic (``Client.instance_for``).
  Publishing is windowed (``window`` publishes in flight) and, with ``rate`` > 0,
  paced to that many envelopes per second, as a fleet of devices trickles in. With
  ``pack`` > 1 the first transmissions go up to ``pack`` envelopes to a message, back to
  back (:mod:`~shuffledp.protocol.wire.envelope_packing`: the shuffler splits them and
  judges each on its own), as a gateway relaying many devices may send them; copies sent
  again go one by one.
  Clients refuse rounds their ledger cannot afford, expired ones, and rounds naming
  a shuffler other than the pinned one; refusals are counted by reason.
* **Receipts.** Signed receipts (checked once per message against the spec's
  shuffler key) mark envelopes admitted or refused. Each envelope is counted once,
  whatever the number of copies.
* **Retransmission.** An envelope with no receipt is sent again, byte for byte,
  once its wait is over (``retry_interval`` seconds, doubled after each copy up to
  8 times that) if either a receipt has since named an envelope
  sent *after* it on the same topic (MQTT keeps one publisher's order per topic,
  so it was lost), or no receipt at all arrived for ``retry_interval`` seconds (the
  shuffler is away or restarting). The shuffler admits an exact copy at most once
  (its nonce, in the spool across restarts) and acknowledges it again, so
  retransmission never counts a report twice.
* **Outcome.** A round ends for a client when its instance's signed outcome
  (retained) arrives: ``released`` or ``failed:<reason>``, recorded in the client's
  ledger (a lost round stays charged; ``client/ledger.py``). Unacknowledged
  envelopes of an ended round are dropped. Without an outcome the fleet gives up
  ``grace`` seconds after the round's deadline.
* **Lost after release.** ``released`` is not final: the shuffler gives up a batch the
  analyzer never acknowledges (its ``ack_timeout``) and then signs ``failed``
  (``not-acknowledged``) for the round, retained over ``released``. So while
  :meth:`Fleet.serve` runs, the fleet keeps following the outcome of every instance that
  released (the same subscription: nothing published meanwhile is missed), and for
  ``follow`` seconds after its last round ended (it stops early once every released round
  it follows has failed). A later ``failed`` outcome is verified like the first, then
  recorded in the round's :class:`FleetRound` (no longer ``released``) and in the ledger of
  every client that answered there. Outcomes are taken only forward
  (:func:`~shuffledp.client.ledger.outcome_moves_forward`): a failed outcome is final,
  and a ``released`` relayed again after it changes nothing. A failure signed after the
  fleet stopped following is not seen by it: the shuffler's ``ack_timeout`` (600 s by
  default) runs from the round's deadline, so ``follow`` must cover that for a fleet
  that stops after its rounds to learn of every loss.

A client that would answer a round whose instance already published its outcome
does not answer (and is not charged). Nothing here trusts the channel: every spec,
receipt and outcome is verified before it changes anything; anything else is
counted in :attr:`Fleet.bad_messages`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Protocol, Sequence

import numpy as np

from shuffledp.client.client import Client, PreparedRound, verified_spec
from shuffledp.client.ledger import outcome_moves_forward
from shuffledp.protocol.wire.envelope_packing import MAX_ENVELOPES_PER_MESSAGE
from shuffledp.client.mechanisms import randomize_reports
from shuffledp.protocol.transport.channel import Channel, outcome_topic, receipts_topic, reports_topic, spec_topic
from shuffledp.protocol.errors import ShuffleDPError
from shuffledp.protocol.wire.messages import AdmissionReceipts, RoundOutcome, RoundSpec
from shuffledp.protocol.wire.onion import decode_verified
from shuffledp.protocol.mechanisms.randomness import RandomSource
from shuffledp.protocol.wire.sealing import Sealer

_log = logging.getLogger(__name__)


class ReportValues(Protocol):
    """Every client's report values for a round, in the clients' order (an array of rows, or a list
    whose ``None`` entries mean the client draws its own)."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Any]: ...


@dataclass
class FleetRound:
    """What the fleet did in one round, and what the shuffler said of it."""

    round_id: int
    mechanism: str
    epsilon0: float
    #: Envelopes published (first transmissions).
    sent: int = 0
    #: Clients that declined to answer, by reason (budget, expired, untrusted-round, round-over, ...).
    declined: Counter = field(default_factory=Counter)
    #: Envelopes a signed receipt says were admitted (each counted once).
    admitted: int = 0
    #: Envelopes a signed receipt says were refused, by reason.
    refused: Counter = field(default_factory=Counter)
    #: Copies sent again because no receipt came.
    retransmitted: int = 0
    #: Envelopes still without a receipt when the round ended for them.
    unacknowledged: int = 0
    #: Publishes that failed (the envelope stayed pending and was retried).
    publish_errors: int = 0
    #: Shuffler instance -> "released" or "failed:<reason>", from signed outcomes.
    outcomes: dict[int, str] = field(default_factory=dict)
    #: Instances this fleet's clients are assigned to in the round.
    instances: tuple[int, ...] = ()

    @property
    def released(self) -> bool:
        """Whether every instance the fleet's clients use released its batch."""
        return bool(self.instances) and all(self.outcomes.get(i) == "released" for i in self.instances)

    def as_dict(self) -> dict[str, Any]:
        return {
            "round_id": self.round_id,
            "mechanism": self.mechanism,
            "epsilon0": self.epsilon0,
            "sent": self.sent,
            "declined": dict(sorted(self.declined.items())),
            "admitted": self.admitted,
            "refused": dict(sorted(self.refused.items())),
            "retransmitted": self.retransmitted,
            "unacknowledged": self.unacknowledged,
            "publish_errors": self.publish_errors,
            "outcomes": {str(k): v for k, v in sorted(self.outcomes.items())},
        }


@dataclass(slots=True)
class _Pending:
    """An envelope without a receipt: where it goes, when and in which order its last copy left."""

    envelope: bytes
    topic: str
    instance: int
    seq: int
    sent_at: float
    copies: int = 1

    def due(self, now: float, retry_interval: float) -> bool:
        """Whether its wait is over: ``retry_interval`` doubled per copy sent, at most 8 times."""
        return now - self.sent_at >= retry_interval * min(2 ** (self.copies - 1), 8)


class _Publisher:
    """At most ``window`` publishes in flight; a failure is counted, never raised (the envelope stays pending)."""

    def __init__(self, channel: Channel, window: int, state: FleetRound) -> None:
        self.channel = channel
        self.slots = asyncio.Semaphore(window)
        self.state = state
        self.tasks: set[asyncio.Task] = set()

    async def publish(self, topic: str, payload: bytes) -> None:
        await self.slots.acquire()
        task = asyncio.create_task(self._one(topic, payload))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _one(self, topic: str, payload: bytes) -> None:
        try:
            await self.channel.publish(topic, payload)
        except ShuffleDPError as exc:
            self.state.publish_errors += 1
            _log.warning("fleet: publish to %s failed: %s", topic, exc)
        finally:
            self.slots.release()

    async def flush(self) -> None:
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)

    async def cancel(self) -> None:
        await cancel_and_wait(list(self.tasks))


class Fleet:
    """Simulated devices (``clients``, sharing one pinned analyzer key) serving one session over ``channel``.

    Where report values come from (see the module docstring): ``draw(spec, local means)``
    returns every client's values for a round; else ``source`` draws them in one
    vectorized call (a :class:`~shuffledp.protocol.mechanisms.randomness.SeededSource` for
    simulations); with neither, each client draws its own from its own source (a
    device's: the OS CSPRNG). ``on_event`` receives one human-readable line per notable
    event (round answered, round ended, a released round lost). ``follow``: seconds
    :meth:`serve` keeps following released rounds' outcomes after its last round ended
    (see the module docstring: a released round may still turn failed).
    """

    def __init__(
        self,
        channel: Channel,
        session_id: bytes,
        clients: Sequence[Client],
        source: RandomSource | None = None,
        *,
        draw: Callable[[RoundSpec, np.ndarray], np.ndarray] | None = None,
        rate: float = 0.0,
        retry_interval: float = 2.0,
        grace: float = 10.0,
        window: int = 256,
        pack: int = 1,
        on_event: Callable[[str], None] | None = None,
        follow: float = 0.0,
    ) -> None:
        if not clients:
            raise ValueError("a fleet needs at least one client")
        if not 1 <= pack <= MAX_ENVELOPES_PER_MESSAGE:
            raise ValueError(f"pack must be in [1, {MAX_ENVELOPES_PER_MESSAGE}], got {pack}")
        if source is not None and draw is not None:
            raise ValueError("a fleet draws reports from a source or a draw function, not both")
        if rate < 0 or retry_interval <= 0 or grace < 0 or window < 1 or not follow >= 0:
            raise ValueError("need rate >= 0, retry_interval > 0, grace >= 0, window >= 1, follow >= 0")
        self.channel = channel
        self.session_id = session_id
        self.clients = list(clients)
        self.analyzer_signing_key = self.clients[0].analyzer_signing_key
        self.source = source
        self.draw = draw
        self.rate = rate
        self.retry_interval = retry_interval
        self.grace = grace
        self.window = window
        self.pack = pack
        self.on_event = on_event
        self.follow = follow
        self.rounds: dict[int, FleetRound] = {}
        #: (round id, instance) -> the task following a released instance's outcome, and its
        #: subscription; None outside :meth:`serve` (a round run on its own is not followed).
        self._followers: dict[tuple[int, int], tuple[asyncio.Task, Any]] | None = None
        #: Specs, receipts and outcomes that did not verify or were not for this session/round, by reason.
        self.bad_messages: Counter = Counter()
        self._local_means = np.array([c.local_mean for c in self.clients])

    def _event(self, line: str) -> None:
        if self.on_event is not None:
            self.on_event(line)

    async def serve(self, rounds: int) -> list[FleetRound]:
        """Answer ``rounds`` distinct rounds and follow each until its outcome (or deadline + grace);
        meanwhile, and for ``follow`` seconds after the last round ended, follow the outcome of every
        released round, to record one the shuffler later gives up (see the module docstring)."""
        specs = await self.channel.subscribe(spec_topic(self.session_id))
        tasks: list[asyncio.Task] = []
        self._followers = {}
        try:
            while len(self.rounds) < rounds:
                data = await specs.get()
                try:
                    spec = verified_spec(data, self.analyzer_signing_key)
                except ShuffleDPError as exc:
                    self.bad_messages[f"spec-{exc.reason}"] += 1
                    continue
                if spec.session_id != self.session_id:
                    self.bad_messages["spec-other-session"] += 1
                    continue
                if spec.round_id in self.rounds:
                    continue  # re-delivered (retained) spec, e.g. re-published by a restarted shuffler
                state = FleetRound(spec.round_id, spec.mechanism, spec.epsilon0)
                self.rounds[spec.round_id] = state
                tasks.append(asyncio.create_task(self.run_round(spec, state)))
            await asyncio.gather(*tasks)
            followers = [task for task, _ in self._followers.values()]
            if followers and self.follow > 0:  # each ends once its round failed: a released one may still
                await asyncio.wait(followers, timeout=self.follow)
        finally:
            await cancel_and_wait(tasks)
            await self._stop_following()
            await specs.close()
        return [self.rounds[r] for r in sorted(self.rounds)]

    async def _stop_following(self) -> None:
        """Stop following released rounds and close their outcome subscriptions."""
        followers, self._followers = self._followers or {}, None
        await cancel_and_wait([task for task, _ in followers.values()])
        for (round_id, instance), (task, _) in followers.items():
            if not task.cancelled() and task.exception() is not None:  # a bug: said, with its traceback
                _log.error("fleet: following round %d instance %d failed", round_id, instance, exc_info=task.exception())
        for _, subscription in followers.values():
            try:
                await subscription.close()
            except ShuffleDPError:
                pass  # the channel is gone: nothing left to unsubscribe from

    async def _follow_released(self, spec: RoundSpec, state: FleetRound, instance: int, subscription,
                               clients: list[Client]) -> None:
        """Read the outcome topic of an instance that released until its outcome turns failed (or the
        channel is gone: a lost broker connection is re-established by the channel, a dead one ends this)."""
        while state.outcomes.get(instance) == "released":
            try:
                data = await subscription.get()
            except ShuffleDPError as exc:
                _log.warning("fleet: round %d: stopped following instance %d's outcome: %s", spec.round_id, instance, exc)
                return
            self._take_outcome(spec, state, instance, data, {}, {instance: clients})

    async def run_round(self, spec: RoundSpec, state: FleetRound) -> FleetRound:
        """Answer one verified round with every client, then settle it (receipts, retransmission, outcome)."""
        try:
            values = self._values(spec)
            sealer = Sealer(spec.analyzer_key)
            assigned = [c.instance_for(spec) for c in self.clients]
        except ShuffleDPError as exc:  # a spec no client can answer: declined by all
            state.declined[exc.reason] += len(self.clients)
            self._event(f"round {spec.round_id}: declined by every client ({exc.reason}: {exc})")
            return state
        state.instances = tuple(sorted(set(assigned)))
        inbox: asyncio.Queue = asyncio.Queue()
        subscriptions: list[tuple[str, int, Any]] = []
        pumps: list[asyncio.Task] = []
        publisher = _Publisher(self.channel, self.window, state)
        pending: dict[bytes, _Pending] = {}
        answered: dict[int, list[Client]] = defaultdict(list)
        order = itertools.count()  # send order of every copy on this round's topics
        sender: asyncio.Task | None = None
        try:
            for instance in state.instances:  # subscribe before sending, so no receipt is missed
                for kind, topic in (("receipts", receipts_topic(spec.session_id, spec.round_id, instance)),
                                    ("outcome", outcome_topic(spec.session_id, spec.round_id, instance))):
                    subscription = await self.channel.subscribe(topic)
                    subscriptions.append((kind, instance, subscription))
                    pumps.append(asyncio.create_task(_pump(subscription, kind, instance, inbox)))
            pumps.append(asyncio.create_task(_tick(min(0.5, self.retry_interval / 2), inbox)))
            sender = asyncio.create_task(self._send(spec, state, values, sealer, assigned, pending, answered, publisher, order))
            await self._settle(spec, state, inbox, pending, answered, publisher, sender, order)
        finally:
            await cancel_and_wait([*pumps, *([sender] if sender is not None else [])])
            await publisher.cancel()
            while not inbox.empty():  # outcomes the pumps took but the settling loop did not (a failed after released)
                kind, instance, data = inbox.get_nowait()
                if kind == "outcome":
                    self._take_outcome(spec, state, instance, data, pending, answered)
            for kind, instance, subscription in subscriptions:
                if kind == "outcome" and self._followers is not None and state.outcomes.get(instance) == "released":
                    follower = asyncio.create_task(
                        self._follow_released(spec, state, instance, subscription, answered.get(instance, [])))
                    self._followers[(spec.round_id, instance)] = (follower, subscription)
                else:
                    await subscription.close()
        state.unacknowledged += len(pending)
        outcomes = ", ".join(f"instance {i}: {state.outcomes.get(i, 'no outcome')}" for i in state.instances)
        self._event(
            f"round {spec.round_id}: {outcomes}; {state.admitted} admitted, refused {dict(state.refused) or 'none'}, "
            f"{state.retransmitted} retransmitted, {state.unacknowledged} unacknowledged"
        )
        return state

    def _values(self, spec: RoundSpec) -> ReportValues:
        """Every client's report values for the round, or ``None`` each: every client draws its own."""
        if self.draw is not None:
            return self.draw(spec, self._local_means)
        if self.source is not None:
            return randomize_reports(spec, self._local_means, self.source)
        return [None] * len(self.clients)

    async def _send(self, spec, state, values, sealer, assigned, pending, answered, publisher, order) -> None:
        """First transmission: each client answers (charging its ledger) and publishes, paced by ``rate``."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        prepared = _prepared(spec, sealer)
        packs: dict[str, list[bytes]] = defaultdict(list)  # envelopes waiting to go, per reports topic

        async def send_packs() -> None:
            for topic, envelopes in packs.items():
                if envelopes:
                    await publisher.publish(topic, b"".join(envelopes))
            packs.clear()

        for index, (client, value) in enumerate(zip(self.clients, values)):
            instance = assigned[index]
            if instance in state.outcomes:
                state.declined["round-over"] += 1  # its instance already released or failed: do not spend budget
                continue
            try:
                envelopes = client.answer_verified(spec, sealer, value, prepared=prepared)
            except ShuffleDPError as exc:
                state.declined[exc.reason] += 1
                continue
            answered[instance].append(client)
            topic = reports_topic(spec.session_id, spec.round_id, instance)
            for nonce, envelope in zip(client.sent[(spec.session_id, spec.round_id)].nonces, envelopes):
                pending[nonce] = _Pending(envelope, topic, instance, next(order), loop.time())
                if self.pack == 1:
                    await publisher.publish(topic, envelope)
                else:
                    packs[topic].append(envelope)
                    if len(packs[topic]) == self.pack:
                        await publisher.publish(topic, b"".join(packs.pop(topic)))
                state.sent += 1
            if self.rate > 0:
                delay = start + state.sent / self.rate - loop.time()
                if delay > 0:
                    await send_packs()  # nothing waits in a pack while the fleet paces itself
                    await asyncio.sleep(delay)
            elif index % 32 == 31:
                await asyncio.sleep(0)  # let receipts in while sealing
        await send_packs()
        await publisher.flush()
        self._event(
            f"round {spec.round_id} ({spec.mechanism}, eps0 {spec.epsilon0:g}): {state.sent} envelope(s) sent"
            + (f", declined {dict(state.declined)}" if state.declined else "")
        )

    async def _settle(self, spec, state, inbox, pending, answered, publisher, sender, order) -> None:
        """Take receipts and outcomes; send again what seems lost; return once every instance has ended."""
        loop = asyncio.get_running_loop()
        give_up = spec.deadline + self.grace  # wall clock, as the spec's deadline
        last_receipt = loop.time()
        newest_receipted: dict[int, int] = defaultdict(lambda: -1)  # instance -> highest seq named in a receipt
        while True:
            if sender.done() and not sender.cancelled() and sender.exception() is not None:
                raise sender.exception()  # a bug in the sender: do not hide it behind a silent round
            if state.instances and all(i in state.outcomes for i in state.instances) and sender.done():
                return
            if time.time() > give_up:
                return
            # A plain get (ticks come from _tick): asyncio.wait_for could swallow a cancellation on 3.11.
            kind, instance, data = await inbox.get()
            if kind == "receipts":
                if self._take_receipts(spec, state, pending, data, newest_receipted):
                    last_receipt = loop.time()
                continue
            if kind == "outcome":
                self._take_outcome(spec, state, instance, data, pending, answered)
                continue
            now = loop.time()
            quiet = now - last_receipt >= self.retry_interval
            again = [
                (nonce, p) for nonce, p in pending.items()
                if p.due(now, self.retry_interval) and (quiet or p.seq < newest_receipted[p.instance])
            ]
            for nonce, p in again:
                p.sent_at, p.seq, p.copies = now, next(order), p.copies + 1
                await publisher.publish(p.topic, p.envelope)
                state.retransmitted += 1
            if again:
                _log.info("fleet: round %d: sent %d envelope(s) again", spec.round_id, len(again))

    def _take_receipts(self, spec, state, pending, data, newest_receipted) -> bool:
        try:
            receipts = decode_verified(data, AdmissionReceipts, spec.shuffler_signing_key)
        except ShuffleDPError as exc:
            self.bad_messages[f"receipts-{exc.reason}"] += 1
            return False
        if (receipts.session_id, receipts.round_id) != (spec.session_id, spec.round_id):
            self.bad_messages["receipts-other-round"] += 1
            return False
        if receipts.spec_digest != spec.digest:
            self.bad_messages["receipts-other-spec"] += 1
            return False
        for nonce in receipts.admitted:
            p = pending.pop(nonce, None)
            if p is not None:
                state.admitted += 1
                newest_receipted[p.instance] = max(newest_receipted[p.instance], p.seq)
        for nonce, reason in zip(receipts.refused, receipts.reasons):
            p = pending.pop(nonce, None)
            if p is not None:
                state.refused[reason] += 1
                newest_receipted[p.instance] = max(newest_receipted[p.instance], p.seq)
        return True

    def _take_outcome(self, spec, state, instance, data, pending, answered) -> None:
        try:
            outcome = decode_verified(data, RoundOutcome, spec.shuffler_signing_key)
        except ShuffleDPError as exc:
            self.bad_messages[f"outcome-{exc.reason}"] += 1
            return
        if (outcome.session_id, outcome.round_id, outcome.instance) != (spec.session_id, spec.round_id, instance):
            self.bad_messages["outcome-other-round"] += 1
            return
        if outcome.spec_digest != spec.digest:
            self.bad_messages["outcome-other-spec"] += 1
            return
        result = "released" if outcome.outcome == "released" else f"failed:{outcome.reason}"
        previous = state.outcomes.get(instance)
        if not outcome_moves_forward(previous, result):
            return  # the retained outcome again, or an older one replayed: a failed round stays failed
        state.outcomes[instance] = result
        key = (spec.session_id, spec.round_id)
        clients = answered.get(instance, ())
        for client in clients:
            client.ledger.record_outcome(spec.session_id, spec.round_id, result)  # forward only there too
            sent = client.sent.get(key)
            if sent is not None and outcome_moves_forward(sent.outcome, result):
                sent.outcome = result
        for nonce in [n for n, p in pending.items() if p.instance == instance]:
            del pending[nonce]
            state.unacknowledged += 1
        if previous is not None:
            _log.warning("fleet: round %d: instance %d released its batch, then signed %s: %d device(s) record the "
                         "round as lost", spec.round_id, instance, result, len(clients))
            self._event(f"round {spec.round_id}: instance {instance}: released, then {result} (the shuffler gave the "
                        f"batch up); {len(clients)} device(s) recorded the round as lost, still charged")


def _prepared(spec: RoundSpec, sealer: Sealer) -> PreparedRound | None:
    """The round's constants, computed once for every client; None if they cannot be (a key the
    suite refuses, say): then each client answers on its own and is refused as a device would be."""
    try:
        return PreparedRound(spec, sealer)
    except ShuffleDPError:
        return None


async def cancel_and_wait(tasks: Iterable[asyncio.Task], *, again_after: float = 0.5) -> None:
    """Cancel ``tasks`` and wait until every one of them is done, cancelling again if needed.

    On Python 3.11, ``asyncio.wait_for`` loses a cancellation that arrives in the
    loop iteration where the awaited future completes (CPython gh-86296, fixed in
    3.12), and code inside these tasks (the shuffler's admission loop, for one)
    awaits with ``wait_for``. So one ``cancel()`` may be swallowed: this cancels
    again every ``again_after`` seconds until the task really ends. Never raises
    the tasks' exceptions.
    """
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=again_after)


async def _tick(interval: float, inbox: asyncio.Queue) -> None:
    """Put a tick in the inbox every ``interval`` seconds (the settle loop's clock)."""
    while True:
        await asyncio.sleep(interval)
        inbox.put_nowait(("tick", -1, b""))


async def _pump(subscription, kind: str, instance: int, inbox: asyncio.Queue) -> None:
    """Forward a subscription's messages into a shared inbox, tagged with their kind and instance."""
    while True:
        inbox.put_nowait((kind, instance, await subscription.get()))


__all__ = ["Fleet", "FleetRound", "cancel_and_wait"]
