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
the pool's counters (:attr:`ClientPool.refused`, :attr:`ClientPool.answered_rounds`).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Callable, Iterator, Sequence

import numpy as np

from shuffledp.client.client import Client, verified_spec
from shuffledp.deploy.fleet import Fleet, FleetRound, cancel_and_wait
from shuffledp.protocol.transport.channel import Channel, spec_topic
from shuffledp.protocol.errors import ShuffleDPError
from shuffledp.protocol.wire.messages import RoundSpec
from shuffledp.protocol.mechanisms.randomness import RandomSource

#: Clients per progress report while a round is sealed.
PROGRESS_STEP = 1024


class _Progress:
    """A round's report values, telling ``on_progress`` every :data:`PROGRESS_STEP` clients as
    the fleet's sender takes them (each value is taken when the previous client is done)."""

    def __init__(self, values: Sequence[np.ndarray | None], on_progress: Callable[[int], None]) -> None:
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
    ) -> None:
        if source is None and draw is None:
            raise ValueError("a ClientPool needs a source or a draw function")
        # ``draw`` wins over ``source``: the engines pass one, so both draw a round's reports the same way.
        super().__init__(
            channel, session_id, clients, None if draw is not None else source, draw=draw,
            retry_interval=retry_interval, grace=grace, window=window,
        )
        self.on_progress = on_progress
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
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()

    def _values(self, spec: RoundSpec) -> Sequence[np.ndarray | None]:
        values = super()._values(spec)
        if self.on_progress is None:
            return values
        progress = self._progress[spec.round_id] = _Progress(values, self.on_progress)
        return progress

    async def _send(self, spec, state, *rest) -> None:
        try:
            await super()._send(spec, state, *rest)
        finally:
            progress = self._progress.pop(spec.round_id, None)
            if progress is not None:
                progress.finish()
            sent = self._sending.pop(spec.round_id, None)
            if sent is not None:
                sent.set()
