"""Many simulated clients in one process, answering rounds over a channel.

A real deployment runs one :class:`Client` per device; a simulation of thousands
of users runs them in a :class:`ClientPool`, which subscribes once to the session's
spec topic and, for each new round, lets every client verify, budget-check,
randomize, seal and publish its envelopes. The report values of all clients are
drawn in one vectorized call of the same randomizer a device uses, then each
client seals its own (so the bytes on the wire are exactly a device's).

The pool sends each envelope once and forgets it: enough for a simulation over a
reliable channel. A fleet that must survive a shuffler or broker restart keeps its
envelopes until signed receipts name them: :class:`shuffledp.fleet.Fleet`.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Sequence

import numpy as np

from shuffledp.client.client import Client, verified_spec
from shuffledp.client.mechanisms import randomize_reports
from shuffledp.protocol.channel import Channel, reports_topic, spec_topic
from shuffledp.protocol.errors import ShuffleDPError
from shuffledp.protocol.messages import RoundSpec
from shuffledp.protocol.randomness import RandomSource
from shuffledp.protocol.sealing import Sealer


class ClientPool:
    """Serves ``clients`` (who share one pinned analyzer key) on ``channel`` for one session."""

    def __init__(
        self,
        channel: Channel,
        session_id: bytes,
        clients: Sequence[Client],
        source: RandomSource | None,
        *,
        draw: Callable[[RoundSpec, np.ndarray], np.ndarray] | None = None,
        on_progress: Callable[[int], None] | None = None,
    ) -> None:
        self.channel = channel
        self.session_id = session_id
        self.clients = list(clients)
        #: The source of every round's draws, unless ``draw`` (spec, local data) -> reports is
        #: given: the engines pass one, so both draw a round's reports the same way.
        self.source = source
        self.draw = draw
        if source is None and draw is None:
            raise ValueError("a ClientPool needs a source or a draw function")
        self.on_progress = on_progress
        self.refused: Counter = Counter()
        self.answered_rounds: list[int] = []

    async def serve(self, rounds: int) -> None:
        """Answer ``rounds`` distinct rounds, then return."""
        specs = await self.channel.subscribe(spec_topic(self.session_id))
        try:
            while len(self.answered_rounds) < rounds:
                await self.answer_round(await specs.get())
        finally:
            await specs.close()

    async def answer_round(self, signed_spec: bytes) -> None:
        if not self.clients:
            return
        try:
            spec = verified_spec(signed_spec, self.clients[0].analyzer_signing_key)
        except ShuffleDPError as exc:
            self.refused[exc.reason] += 1
            return
        if spec.round_id in self.answered_rounds:
            return  # a re-delivered retained spec
        self.answered_rounds.append(spec.round_id)
        local_means = np.array([c.local_mean for c in self.clients])
        try:
            values = self.draw(spec, local_means) if self.draw is not None else randomize_reports(spec, local_means, self.source)
            sealer = Sealer(spec.analyzer_key)
        except ShuffleDPError as exc:  # a spec no client can answer: refused by all, the pool goes on
            self.refused[exc.reason] += len(self.clients)
            return
        for index, (client, value) in enumerate(zip(self.clients, values)):
            try:
                envelopes = client.answer_verified(spec, sealer, value)
            except ShuffleDPError as exc:
                self.refused[exc.reason] += 1
                continue
            topic = reports_topic(spec.session_id, spec.round_id, client.instance_for(spec))
            for envelope in envelopes:
                await self.channel.publish(topic, envelope)
            if self.on_progress is not None and index % 1024 == 1023:
                self.on_progress(1024)
        if self.on_progress is not None:
            self.on_progress(len(self.clients) % 1024)
