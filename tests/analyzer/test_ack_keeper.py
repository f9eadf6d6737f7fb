"""A lost acknowledgement is sent again when the shuffler publishes the batch again.

The broker here takes the analyzer's first acknowledgement (the publish returns) and never
delivers it, as a cluster node killed before it routes the message does. Without the
acknowledgement keeper (``analyzer/ack_keeper.py``) the shuffler gives the batch up
``ack_timeout`` seconds later and signs the round ``failed: not-acknowledged`` although the
analyzer counted it; the second case shows that this is what happens when the coordinator stops
reading its round's batch topic at the acknowledgement.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from shuffledp.analyzer import ack_keeper
from shuffledp.analyzer.coordinator import NO_LIVENESS_MARGIN
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.deploy.deployment import Deployment
from shuffledp.protocol.transport.channel import InProcessChannel, acks_topic, batch_topic, reports_topic, spec_topic
from shuffledp.protocol.wire import codec
from shuffledp.protocol.wire.messages import HadamardRangeParams, RoundSpec, SignedRoundSpec

PARAMS = HadamardRangeParams(-4.0, 4.0, 0.5)
USERS = 6
#: The shuffler publishes an unacknowledged batch every REPUBLISH seconds and gives it up after
#: ACK_TIMEOUT: long enough for several re-publications, short enough for the suite.
REPUBLISH, ACK_TIMEOUT = 0.05, 1.5


class _LosesFirstAck(InProcessChannel):
    """A broker that takes the first acknowledgement and drops it."""

    def __init__(self) -> None:
        super().__init__()
        self.acks_dropped = 0

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        if topic.endswith("/acks") and not self.acks_dropped:
            self.acks_dropped += 1
            return
        await super().publish(topic, payload, retain=retain)


async def _answer(channel: InProcessChannel, deployment: Deployment, round_id: int = 0) -> None:
    specs = await channel.subscribe(spec_topic(deployment.session_id))
    while True:  # the spec topic retains the latest round's spec: wait for this round's
        signed = await specs.get()
        spec = codec.decode(codec.decode(signed, SignedRoundSpec).spec_bytes, RoundSpec)
        if spec.round_id == round_id:
            break
    await specs.close()
    clients = [deployment.client(np.array([0.1 * i]), PrivacyLedger(1.0)) for i in range(USERS)]
    for client in clients:
        await channel.publish(reports_topic(deployment.session_id, spec.round_id), client.answer(signed)[0])


async def _round_with_a_lost_ack(keep: bool, monkeypatch) -> tuple[str, object, int]:
    if not keep:  # the coordinator as it was: the batch topic closed at the acknowledgement
        async def closes_at_once(self, spec, acks, subscriptions):
            for subscription in subscriptions:
                await subscription.close()
        monkeypatch.setattr(ack_keeper.AcknowledgementKeeper, "keep", closes_at_once)
    deployment = Deployment()
    channel = _LosesFirstAck()
    shuffler = deployment.shuffler(channel, republish_interval=REPUBLISH, ack_timeout=ACK_TIMEOUT)
    serving = asyncio.create_task(shuffler.serve())
    acks = await channel.subscribe(acks_topic(deployment.session_id))
    try:
        async with deployment.coordinator(channel, round_timeout=0.5, grace=5.0,
                                          batch_margin=NO_LIVENESS_MARGIN) as coordinator:
            answering = asyncio.create_task(_answer(channel, deployment))
            record = await asyncio.wait_for(coordinator.run_round(PARAMS, 0.5, min_batch=USERS), 20)
            await answering
            # the shuffler settles the batch: served on an acknowledgement, failed at ack_timeout
            async with asyncio.timeout(20):
                while shuffler.spool.round(deployment.session_id, 0).state == "released":
                    await asyncio.sleep(0.01)
            resent = coordinator.ack_keeper.resent
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
    assert channel.acks_dropped == 1 and record.opened.size == USERS
    delivered = acks.get_nowait_all()
    return shuffler.spool.round(deployment.session_id, 0).state, delivered, resent


async def test_a_batch_published_again_is_acknowledged_again_and_served(monkeypatch):
    state, delivered, resent = await _round_with_a_lost_ack(True, monkeypatch)
    assert state == "served"
    assert resent >= 1 and len(delivered) == resent  # each re-sent acknowledgement reached the shuffler


async def test_without_the_keeper_the_counted_batch_is_given_up(monkeypatch):
    state, delivered, resent = await _round_with_a_lost_ack(False, monkeypatch)
    assert state == "failed" and delivered == [] and resent == 0


async def test_replayed_chunks_bring_at_most_one_acknowledgement_per_interval(monkeypatch):
    """Anyone may publish on a batch topic: a genuine chunk replayed a thousand times within one
    interval brings one re-sent acknowledgement, and a chunk the round's shuffler did not sign brings none."""
    monkeypatch.setattr(ack_keeper, "MIN_REACK_INTERVAL", 3600.0)  # the burst is within one interval however slow
    deployment = Deployment()
    channel = InProcessChannel()
    shuffler = deployment.shuffler(channel)
    serving = asyncio.create_task(shuffler.serve())
    chunks = await channel.subscribe(batch_topic(deployment.session_id, 0))
    try:
        async with deployment.coordinator(channel, round_timeout=0.5, grace=5.0,
                                          batch_margin=NO_LIVENESS_MARGIN) as coordinator:
            answering = asyncio.create_task(_answer(channel, deployment))
            await asyncio.wait_for(coordinator.run_round(PARAMS, 0.5, min_batch=USERS), 20)
            await answering
            genuine = (await asyncio.wait_for(chunks.get(), 5))
            acks = await channel.subscribe(acks_topic(deployment.session_id))
            forged = bytearray(genuine)
            forged[-1] ^= 1
            for _ in range(1000):
                await channel.publish(batch_topic(deployment.session_id, 0), genuine)
                await channel.publish(batch_topic(deployment.session_id, 0), bytes(forged))
            async with asyncio.timeout(5):
                while sum(coordinator.ack_keeper.ignored.values()) < 1000:
                    await asyncio.sleep(0.01)
            assert coordinator.ack_keeper.resent == 1
            assert len(acks.get_nowait_all()) == 1
        assert len(coordinator.ack_keeper) == 0  # closed with the coordinator
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)


@pytest.mark.parametrize("rounds", [ack_keeper.KEPT_ROUNDS + 3])
async def test_only_the_most_recent_rounds_are_kept(rounds):
    deployment = Deployment()
    channel = InProcessChannel()
    shuffler = deployment.shuffler(channel)
    serving = asyncio.create_task(shuffler.serve())
    try:
        async with deployment.coordinator(channel, round_timeout=0.5, grace=5.0,
                                          batch_margin=NO_LIVENESS_MARGIN) as coordinator:
            for round_id in range(rounds):
                answering = asyncio.create_task(_answer(channel, deployment, round_id))
                await asyncio.wait_for(coordinator.run_round(PARAMS, 0.5, min_batch=USERS), 20)
                await answering
            assert len(coordinator.ack_keeper) == ack_keeper.KEPT_ROUNDS
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
