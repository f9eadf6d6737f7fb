"""Many simulated clients in one process, answering rounds over a channel.

A real deployment runs one :class:`Client` per device; a simulation of thousands
of users runs them in a :class:`ClientPool`, which subscribes once to the session's
spec topic and, for each new round, lets every client verify, budget-check,
randomize, seal and publish its envelopes. The report values of all clients are
drawn in one vectorized call of the same randomizer a device uses (a ``source``, or
the engines' ``draw``), then each client seals its own (so the bytes on the wire are
exactly a device's).

The pool is a :class:`shuffledp.deploy.fleet.Fleet`, so it delivers as the service fleet
does: it keeps each envelope until the shuffler's signed receipt names it and sends
it again, byte for byte, if it seems lost (a broker restart drops what it had not yet
delivered; the shuffler admits an exact copy once). What it adds for the simulation
engines: a progress callback while sealing, :meth:`ClientPool.answer_round` (returns
once a round's envelopes are sent; receipts and copies follow in the background), and
the pool's counters (:attr:`ClientPool.refused`, :attr:`ClientPool.answered_rounds`), and
sealing on worker processes (:class:`SealingWorkers`): each client still checks the round and
its budget and is charged here, while blocks of users' messages are padded, sealed and wrapped
on the workers, each message on its own, as the device's own code does.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Callable, Iterator, Sequence

import numpy as np

from shuffledp.client.client import Client, PreparedRound, verified_spec
from shuffledp.deploy.fleet import Fleet, FleetRound, ReportValues, _Pending as _PendingEnvelope, cancel_and_wait
from shuffledp.protocol.transport.channel import Channel, InProcessChannel, reports_topic, spec_topic
from shuffledp.protocol.wire.key_workers import WorkerProcesses
from shuffledp.protocol.wire.envelope_packing import MAX_ENVELOPES_PER_MESSAGE, pack_envelopes
from shuffledp.protocol.wire.sealing import Sealer
from shuffledp.shuffler.parallel_open import WORKER_BURST
from shuffledp.protocol.errors import ShuffleDPError
from shuffledp.protocol.wire.messages import RoundSpec
from shuffledp.protocol.mechanisms.randomness import RandomSource

#: Clients per progress report while a round is sealed.
PROGRESS_STEP = 1024
#: Users per block a sealing worker seals at once (:class:`SealingWorkers`), until the round's end nears.
SEAL_BLOCK = 1024


def seal_block_users(remaining: int, workers: int) -> int:
    """Users in the next block sent to the sealing workers, with ``remaining`` users of the round
    still to be taken: :data:`SEAL_BLOCK`, tapering over the round's last ``2 * workers`` blocks'
    worth of users, so the workers finish the round together (the last block one worker seals while
    the other waits is small), down to the shuffler's smallest burst opened on its own workers
    (:data:`~shuffledp.shuffler.parallel_open.WORKER_BURST`): the last blocks still open there, not
    in the process that decides admissions."""
    return min(SEAL_BLOCK, max(WORKER_BURST, remaining // (2 * workers)))

#: Envelopes to a message on the in-process channel when the devices seal on workers (the most a message may carry).
IN_PROCESS_PACK = MAX_ENVELOPES_PER_MESSAGE
#: Envelopes the simulated devices keep in flight on the in-process channel when they seal on workers.
IN_PROCESS_WINDOW = 4096


_worker_rounds: dict[bytes, PreparedRound] = {}


def _seal_block(spec: RoundSpec, credentials: list[bytes], messages: list[list[tuple[int, ...]]]) -> list[tuple]:
    """In a sealing worker: each user's ``("ok", envelopes, nonces)`` or ``("error", reason, message)``.

    The round's constants (:class:`PreparedRound`: ranges, layout, parsed keys, HPKE ``info``)
    are computed once per worker and round (keyed by the spec's digest), then every message is
    padded, sealed and wrapped on its own, exactly as :meth:`Client.answer_verified` does."""
    prepared = _worker_rounds.get(spec.digest)
    if prepared is None:
        _worker_rounds.clear()  # one round at a time: an earlier round's constants are done with
        prepared = _worker_rounds[spec.digest] = PreparedRound(spec, Sealer(spec.analyzer_key))
    out: list[tuple] = []
    for credential, user_messages in zip(credentials, messages):
        try:
            envelopes, nonces = prepared.seal(credential, user_messages)
            out.append(("ok", envelopes, nonces))
        except ShuffleDPError as exc:
            out.append(("error", exc.reason, str(exc)))
    return out


def _as_int_tuples(values: np.ndarray) -> Iterator[list[tuple[int, ...]]]:
    """Each user's messages of an int ``(users, messages, width)`` array as tuples of Python ints (what
    :meth:`Client.begin_round` makes of a user's rows), converted a block of users at a time, so the
    first block goes to the workers without waiting for the rest."""
    for start in range(0, len(values), SEAL_BLOCK):
        for user in values[start : start + SEAL_BLOCK].tolist():
            yield [tuple(message) for message in user]


class SealingWorkers(WorkerProcesses):
    """``workers`` processes that seal blocks of simulated users' reports (:func:`_seal_block`).

    What a device does alone (pad, seal to the analyzer, wrap for the shuffler, each message
    with a fresh HPKE encapsulation and nonce) runs here for blocks of :data:`SEAL_BLOCK` users
    at once; every check that can refuse a round and every charge to a ledger stays with the
    client objects in the pool's process (:meth:`Client.begin_round`, :meth:`Client.finish_round`).
    The workers hold no private key. Started on first use (``forkserver``, as the key workers),
    stopped by :meth:`close`."""

    def submit(self, spec: RoundSpec, credentials: list[bytes], messages: list[list[tuple[int, ...]]]) -> asyncio.Future:
        """Seal one block on a worker; an asyncio future of :func:`_seal_block`'s result."""
        return asyncio.wrap_future(self.executor().submit(_seal_block, spec, credentials, messages))


class _Progress:
    """A round's report values, telling ``on_progress`` every :data:`PROGRESS_STEP` clients as
    the fleet's sender takes them (each value is taken when the previous client is done)."""

    def __init__(self, values: ReportValues, on_progress: Callable[[int], None]) -> None:
        self.values = values
        self.on_progress = on_progress
        self.reported = 0

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self) -> Iterator[np.ndarray | None]:
        for index, value in enumerate(self.values):
            if index and index % PROGRESS_STEP == 0:
                self.on_progress(PROGRESS_STEP)
                self.reported += PROGRESS_STEP
            yield value

    def finish(self) -> None:
        """Report the clients not yet reported (the round's sending is over)."""
        self.on_progress(len(self.values) - self.reported)
        self.reported = len(self.values)


class ClientPool(Fleet):
    """Serves ``clients`` (who share one pinned analyzer key) on ``channel`` for one session.

    Every round's report values come from ``source`` (one vectorized randomizer call)
    or from ``draw(spec, local means)``; ``on_progress(k)`` hears of every ``k`` clients
    that answered. ``retry_interval``, ``grace`` and ``window`` are the fleet's
    (:class:`~shuffledp.deploy.fleet.Fleet`): an envelope without a receipt is sent again after
    ``retry_interval`` seconds (``math.inf``: never, for a channel that loses nothing).
    """

    def __init__(
        self,
        channel: Channel,
        session_id: bytes,
        clients: Sequence[Client],
        source: RandomSource | None,
        *,
        draw: Callable[[RoundSpec, np.ndarray], np.ndarray] | None = None,
        on_progress: Callable[[int], None] | None = None,
        retry_interval: float = 2.0,
        grace: float = 10.0,
        window: int = 256,
        sealing: SealingWorkers | None = None,
    ) -> None:
        if source is None and draw is None:
            raise ValueError("a ClientPool needs a source or a draw function")
        # ``draw`` wins over ``source``: the engines pass one, so both draw a round's reports the same way.
        super().__init__(
            channel, session_id, clients, None if draw is not None else source, draw=draw,
            retry_interval=retry_interval, grace=grace, window=window,
        )
        self.on_progress = on_progress
        #: Worker processes that seal blocks of users' reports (None: every client seals in this process).
        self.sealing = sealing
        self._tasks: list[asyncio.Task] = []
        self._sending: dict[int, asyncio.Event] = {}
        self._progress: dict[int, _Progress] = {}

    @property
    def answered_rounds(self) -> list[int]:
        """The rounds answered (each verified spec once, in order; possibly refused by every client)."""
        return list(self.rounds)

    @property
    def refused(self) -> Counter:
        """Refusals by reason: of specs that did not verify, and of clients that declined a round."""
        refused: Counter = Counter()
        for reason, count in self.bad_messages.items():
            if reason.startswith("spec-"):
                refused[reason[len("spec-"):]] += count
        for state in self.rounds.values():
            refused.update(state.declined)
        return refused

    async def serve(self, rounds: int) -> list[FleetRound]:
        """Answer ``rounds`` distinct rounds, and follow each until its outcome (or deadline + grace)."""
        specs = await self.channel.subscribe(spec_topic(self.session_id))
        try:
            while len(self.rounds) < rounds:
                await self.answer_round(await specs.get())
            await asyncio.gather(*self._tasks)
        finally:
            await cancel_and_wait(self._tasks)
            await specs.close()
        return [self.rounds[r] for r in sorted(self.rounds)]

    async def answer_round(self, signed_spec: bytes) -> None:
        """Answer one signed round with every client; return once its envelopes are sent.

        The round's receipts, retransmissions and outcome are followed in the background
        (by :meth:`serve`'s end, or until cancelled); a re-delivered spec is ignored."""
        try:
            spec = verified_spec(signed_spec, self.analyzer_signing_key)
        except ShuffleDPError as exc:
            self.bad_messages[f"spec-{exc.reason}"] += 1
            return
        if spec.session_id != self.session_id:
            self.bad_messages["spec-other-session"] += 1
            return
        if spec.round_id in self.rounds:
            return  # a re-delivered retained spec
        state = self.rounds[spec.round_id] = FleetRound(spec.round_id, spec.mechanism, spec.epsilon0)
        sent = self._sending[spec.round_id] = asyncio.Event()
        task = asyncio.create_task(self.run_round(spec, state))
        self._tasks.append(task)
        waiting = asyncio.create_task(sent.wait())
        try:
            await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await cancel_and_wait([waiting])
            self._sending.pop(spec.round_id, None)
        if task.done() and not task.cancelled():
            failure = task.exception()
            if failure is not None:
                raise failure

    def _values(self, spec: RoundSpec) -> ReportValues:
        values = super()._values(spec)
        if self.on_progress is None:
            return values
        progress = self._progress[spec.round_id] = _Progress(values, self.on_progress)
        return progress

    async def _send(self, spec, state, *rest) -> None:
        try:
            if self.sealing is not None:
                await self._send_sealed_elsewhere(spec, state, *rest)
            else:
                await super()._send(spec, state, *rest)
        finally:
            progress = self._progress.pop(spec.round_id, None)
            if progress is not None:
                progress.finish()
            sent = self._sending.pop(spec.round_id, None)
            if sent is not None:
                sent.set()

    async def _send_sealed_elsewhere(self, spec, state, values, sealer, assigned, pending, answered, publisher, order) -> None:
        """The fleet's first transmission (:meth:`Fleet._send`) with the sealing on :attr:`sealing`'s workers.

        Every client checks the round first (:meth:`Client.begin_round`: deadline, pinned
        shuffler, crowd floor, budget; nothing charged); the accepted users' messages go to the
        workers in blocks, all submitted at once, so the workers seal while this process admits
        and publishes; each block's users are then charged (:meth:`Client.finish_round`) and their
        envelopes published, in the clients' order, as a device would after sealing. A user
        whose instance ended meanwhile, or whose sealing failed, is declined and not charged."""
        try:
            prepared = PreparedRound(spec, sealer)
        except ShuffleDPError:  # a key the suite refuses: each client is refused as a device would be
            prepared = None
        if prepared is None:
            await Fleet._send(self, spec, state, values, sealer, assigned, pending, answered, publisher, order)
            return
        progress = values if isinstance(values, _Progress) else None
        raw = progress.values if progress is not None else values
        if isinstance(raw, np.ndarray) and raw.dtype.kind in "iu":
            raw = _as_int_tuples(raw)
        blocks: list[tuple[list[int], asyncio.Future]] = []
        indices: list[int] = []
        credentials: list[bytes] = []
        messages: list[list[tuple[int, ...]]] = []

        sealing = self.sealing
        assert sealing is not None  # called only where the fleet has sealing workers (_send)
        workers = sealing.workers
        block = seal_block_users(len(self.clients), workers)

        def submit() -> None:
            blocks.append((list(indices), sealing.submit(spec, list(credentials), list(messages))))
            indices.clear()
            credentials.clear()
            messages.clear()

        for index, (client, value) in enumerate(zip(self.clients, raw)):
            if assigned[index] in state.outcomes:
                state.declined["round-over"] += 1
                continue
            try:
                user_messages = client.begin_round(spec, value, prepared)
            except ShuffleDPError as exc:
                state.declined[exc.reason] += 1
                continue
            indices.append(index)
            credentials.append(client.credential)
            messages.append(user_messages)
            if len(indices) >= block:
                submit()
                block = seal_block_users(len(self.clients) - index - 1, workers)
        if indices:
            submit()
        loop = asyncio.get_running_loop()
        # The in-process channel delivers at once and never blocks: publish without a task per envelope,
        # a block's envelopes packed IN_PROCESS_PACK to a message per reports topic (the shuffler splits
        # them and judges each on its own: protocol/wire/envelope_packing.py).
        direct = isinstance(self.channel, InProcessChannel)
        packs: dict[str, list[bytes]] = {}
        topics: dict[int, str] = {}
        try:
            for block_indices, future in blocks:
                results = await future
                now = loop.time()
                for index, result in zip(block_indices, results):
                    instance = assigned[index]
                    if result[0] != "ok":
                        state.declined[result[1]] += 1
                        continue
                    if instance in state.outcomes:
                        state.declined["round-over"] += 1  # its instance already ended: do not spend budget
                        continue
                    client = self.clients[index]
                    _, envelopes, nonces = result
                    try:
                        client.finish_round(spec, nonces)
                    except ShuffleDPError as exc:  # its ledger was spent meanwhile (a shared ledger)
                        state.declined[exc.reason] += 1
                        continue
                    answered[instance].append(client)
                    topic = topics.get(instance)
                    if topic is None:
                        topic = topics[instance] = reports_topic(spec.session_id, spec.round_id, instance)
                    for nonce, envelope in zip(nonces, envelopes):
                        pending[nonce] = _PendingEnvelope(envelope, topic, instance, next(order), now)
                        if direct:
                            packs.setdefault(topic, []).append(envelope)
                        else:
                            await publisher.publish(topic, envelope)
                        state.sent += 1
                if direct:
                    for topic, envelopes in packs.items():
                        for payload in pack_envelopes(envelopes, IN_PROCESS_PACK):
                            await self._publish_now(topic, payload, state)
                    packs.clear()
                if progress is not None:
                    progress.on_progress(len(block_indices))
                    progress.reported += len(block_indices)
                if direct:
                    await asyncio.sleep(0)  # let the shuffler take the block before the next
        finally:
            for _, future in blocks:
                future.cancel()
        await publisher.flush()
        self._event(
            f"round {spec.round_id} ({spec.mechanism}, eps0 {spec.epsilon0:g}): {state.sent} envelope(s) sent"
            + (f", declined {dict(state.declined)}" if state.declined else "")
        )

    async def _publish_now(self, topic: str, envelope: bytes, state: FleetRound) -> None:
        """Publish on the in-process channel, counting a failure as the fleet's publisher does."""
        try:
            await self.channel.publish(topic, envelope)
        except ShuffleDPError:
            state.publish_errors += 1
