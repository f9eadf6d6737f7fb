"""An announcement the broker dropped to the shuffler is published again until the shuffler opens the round.

The broker keeps the retained announcement, but a subscriber that lags (its queue full) loses its
copy and will never be sent it again. The coordinator publishes the same signed bytes again every
``reannounce_interval`` seconds until the shuffler relays the spec (it opened the round), so the
round opens and completes instead of failing at its deadline.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from shuffledp.client.ledger import PrivacyLedger
from shuffledp.deploy.deployment import Deployment
from shuffledp.protocol.transport.channel import InProcessChannel, announce_topic, reports_topic, spec_topic
from shuffledp.protocol.wire.messages import HadamardRangeParams
from shuffledp.protocol.wire.onion import verified_spec

PARAMS = HadamardRangeParams(-4.0, 4.0, 0.5)
USERS = 8


class _DropsFirstAnnouncement(InProcessChannel):
    """Keeps the first announcement retained but delivers it to no current subscriber, as a broker
    does to a subscriber whose queue is full."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0

    async def publish(self, topic, payload, *, retain=False):
        if topic.endswith("/announce") and not self.dropped:
            self.dropped += 1
            self.messages_by_topic[topic] += 1
            self._retained[topic] = payload
            return
        await super().publish(topic, payload, retain=retain)


async def test_a_dropped_announcement_is_published_again_and_the_round_completes():
    deployment = Deployment()
    channel = _DropsFirstAnnouncement()
    shuffler_task = asyncio.create_task(deployment.shuffler(channel).serve())
    clients = [deployment.client(np.array([0.1 * i]), PrivacyLedger(1.0)) for i in range(USERS)]

    async def answer() -> None:
        specs = await channel.subscribe(spec_topic(deployment.session_id))
        signed = await specs.get()
        spec = verified_spec(signed, deployment.analyzer_signing_key)
        for client in clients:
            for envelope in client.answer(signed):
                await channel.publish(reports_topic(spec.session_id, spec.round_id), envelope)

    answering = asyncio.create_task(answer())
    try:
        await asyncio.sleep(0)  # one turn of the loop: the shuffler subscribes to the announce topic
        assert channel._subscribers[announce_topic(deployment.session_id)]
        coordinator = deployment.coordinator(channel, round_timeout=20, grace=1.0, reannounce_interval=0.2)
        record = await asyncio.wait_for(coordinator.run_round(PARAMS, 0.5, min_batch=USERS, max_batch=USERS), 10)
        await asyncio.wait_for(answering, 5)
    finally:
        for task in (answering, shuffler_task):
            task.cancel()
        await asyncio.gather(answering, shuffler_task, return_exceptions=True)
    assert channel.dropped == 1 and coordinator.reannounced >= 1
    assert record.opened.size == USERS and record.batch_sizes == (USERS,)


def test_the_reannounce_interval_must_be_positive():
    deployment = Deployment()
    for bad in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="reannounce_interval"):
            deployment.coordinator(InProcessChannel(), reannounce_interval=bad)
