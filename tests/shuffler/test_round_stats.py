"""A round's statistics at the shuffler say what the spool says, whenever they are read.

A round's batch is released when the spool records it (its chunks stored, its round
``released``); from then on it is published, and published again until acknowledged. The
statistics used to be written only after the chunks' publishes returned: with the broker's
acknowledgement late (a loaded machine), the analyzer could open the batch, acknowledge it
and finish its protocol while the round still read ``forwarded 0`` (and a run that stopped
the shuffler then, as the message engine does when the protocol ends, kept that 0), and the
acknowledgement's ``served`` was then overwritten with ``forwarded``. A publish that failed
after the release made the round ``failed`` with a signed ``failed`` outcome, though its
batch stayed in the spool and was re-published and counted.
"""

from __future__ import annotations

import asyncio

import numpy as np

from shuffledp.client.ledger import PrivacyLedger
from shuffledp.deploy.deployment import Deployment
from shuffledp.protocol.errors import TransportError
from shuffledp.protocol.transport.channel import InProcessChannel, batch_topic, outcome_topic, spec_topic
from shuffledp.protocol.wire.messages import RoundOutcome
from shuffledp.protocol.wire.onion import decode_verified

from parties import PARAMS

N = 6


class LateAcknowledgements(InProcessChannel):
    """An in-process channel whose publishes on batch topics are delivered at once, but return only when
    the test lets them (a broker whose PUBACK is late), or raise (a broker that never answered)."""

    def __init__(self, *, fail: bool = False) -> None:
        super().__init__()
        self.fail = fail
        self.puback = asyncio.Event()
        self.batch_published = asyncio.Event()

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        if topic.endswith("/batch") and not self.puback.is_set():
            self.batch_published.set()
            if self.fail:  # lost on the way; the broker answers again from now on
                self.puback.set()
                raise TransportError(f"publish to {topic}: timed out")
            await super().publish(topic, payload, retain=retain)
            await self.puback.wait()
            return
        await super().publish(topic, payload, retain=retain)


async def _answer(channel, deployment: Deployment, clients) -> None:
    specs = await channel.subscribe(spec_topic(deployment.session_id))
    signed = await specs.get()
    await specs.close()
    from shuffledp.protocol.transport.channel import reports_topic
    from shuffledp.protocol.wire.onion import verified_spec

    spec = verified_spec(signed, deployment.analyzer_signing_key)
    for client in clients:
        await channel.publish(reports_topic(spec.session_id, spec.round_id), client.answer(signed)[0])


def _parties(channel, **shuffler_options):
    deployment = Deployment()
    coordinator = deployment.coordinator(channel, round_timeout=30.0, grace=5.0)
    shuffler = deployment.shuffler(channel, **shuffler_options)
    clients = [deployment.client(np.array([0.25 * i]), PrivacyLedger(1.0)) for i in range(N)]
    acked = asyncio.Event()
    handle_ack = shuffler.handle_ack

    def handle_and_tell(data: bytes) -> bool:
        served = handle_ack(data)
        acked.set()
        return served

    shuffler.handle_ack = handle_and_tell
    return deployment, coordinator, shuffler, clients, acked


async def test_a_round_reads_forwarded_once_released_even_before_the_broker_acknowledges_the_batch():
    channel = LateAcknowledgements()
    deployment, coordinator, shuffler, clients, acked = _parties(channel)
    outcomes = await channel.subscribe(outcome_topic(deployment.session_id, 0))
    shuffler_task = asyncio.create_task(shuffler.serve())
    try:
        answering = asyncio.create_task(_answer(channel, deployment, clients))
        # the analyzer opens the batch and acknowledges it while the shuffler still waits for its PUBACK
        record = await asyncio.wait_for(coordinator.run_round(PARAMS, 0.5, min_batch=N, max_batch=N), 20)
        await answering
        await asyncio.wait_for(acked.wait(), 5)
        assert record.opened.size == N
        stats = shuffler.rounds[0]
        # what a run that ends here (the protocol is done) reads: the released round, served
        assert (stats.admitted, stats.forwarded, stats.chunks, stats.outcome) == (N, N, 1, "served")
        channel.puback.set()  # the broker's acknowledgement arrives at last
        released = decode_verified(await asyncio.wait_for(outcomes.get(), 5), RoundOutcome,
                                   deployment.shuffler_keys.signing_public)
        assert released.outcome == "released"
        assert (stats.forwarded, stats.outcome) == (N, "served")  # not overwritten by the late publish
        assert shuffler.stats()["rounds"][0]["forwarded"] == N
    finally:
        shuffler_task.cancel()
        await asyncio.gather(shuffler_task, return_exceptions=True)


async def test_a_publish_failing_after_the_release_leaves_the_round_released_and_re_published():
    channel = LateAcknowledgements(fail=True)
    deployment, coordinator, shuffler, clients, acked = _parties(channel, republish_interval=0.05)
    outcomes = await channel.subscribe(outcome_topic(deployment.session_id, 0))
    batches = await channel.subscribe(batch_topic(deployment.session_id, 0))
    shuffler_task = asyncio.create_task(shuffler.serve())
    try:
        answering = asyncio.create_task(_answer(channel, deployment, clients))
        # the first publish of the batch is lost and fails; the periodic re-publishing sends it again
        record = await asyncio.wait_for(coordinator.run_round(PARAMS, 0.5, min_batch=N, max_batch=N), 20)
        await answering
        assert channel.batch_published.is_set()
        stats = shuffler.rounds[0]
        await asyncio.wait_for(acked.wait(), 5)
        assert record.opened.size == N
        assert (stats.forwarded, stats.outcome) == (N, "served")
        assert shuffler.spool.round(deployment.session_id, 0).state == "served"
        signed = [decode_verified(d, RoundOutcome, deployment.shuffler_keys.signing_public) for d in outcomes.get_nowait_all()]
        assert "failed" not in [o.outcome for o in signed]  # no client is told its counted round was lost
        assert len(batches.get_nowait_all()) >= 1  # the first publish was lost: these are the re-published ones
    finally:
        shuffler_task.cancel()
        await asyncio.gather(shuffler_task, return_exceptions=True)


async def test_an_announcement_delivered_again_after_the_release_keeps_the_round_s_statistics():
    """A retained announcement re-delivered (a reconnection, a re-subscription) never opens the round
    again nor replaces its statistics."""
    from shuffledp.protocol.transport.channel import announce_topic

    channel = InProcessChannel()
    deployment, coordinator, shuffler, clients, acked = _parties(channel)
    announced = await channel.subscribe(announce_topic(deployment.session_id))
    shuffler_task = asyncio.create_task(shuffler.serve())
    try:
        answering = asyncio.create_task(_answer(channel, deployment, clients))
        await asyncio.wait_for(coordinator.run_round(PARAMS, 0.5, min_batch=N, max_batch=N), 20)
        await answering
        await asyncio.wait_for(acked.wait(), 5)
        stats = shuffler.rounds[0]
        signed = await announced.get()
        specs = await channel.subscribe(spec_topic(deployment.session_id))
        await specs.get()  # the retained relay of round 0
        marker_read = asyncio.Event()
        verify = shuffler.verified_spec

        def verify_and_tell(data: bytes):
            if data == b"":
                marker_read.set()
            return verify(data)

        shuffler.verified_spec = verify_and_tell
        await channel.publish(announce_topic(deployment.session_id), signed, retain=True)
        await channel.publish(announce_topic(deployment.session_id), b"")  # a marker behind it
        await asyncio.wait_for(marker_read.wait(), 5)  # the marker was read: so was the copy before it
        assert shuffler.rounds[0] is stats
        assert (stats.admitted, stats.forwarded, stats.outcome) == (N, N, "served")
        assert specs.get_nowait_all() == []  # the round was not opened again
    finally:
        shuffler_task.cancel()
        await asyncio.gather(shuffler_task, return_exceptions=True)
