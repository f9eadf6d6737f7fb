"""The analyzer's announcement and acknowledgements reach a shuffler whose report queue the broker drops.

mosquitto holds at most ``max_inflight_messages`` + ``max_queued_messages`` messages for one
MQTT session and drops the rest. Client accounts may publish anything (up to the envelope size)
on an open round's reports topic, so a flood while the shuffler lags fills the queue of the
session that reads that topic (here: the analyzer announces its next round, or acknowledges the
last batch, while the shuffler still reads a round's reports). Were the announcement dropped there,
the round would never open (it fails at its deadline); were the acknowledgement dropped, the
shuffler would give up a batch the analyzer already counted (signed ``failed: not-acknowledged``).
So the shuffler reads the announce and acks topics on a second connection of its own
(:meth:`MqttChannel.companion`), which no client account can publish to, and the analyzer
publishes its announcement again until the shuffler relays the round's spec.

Here the test broker's limits are small (8 in flight, 16 queued), the real shuffler runs as its
own process, is paused (SIGSTOP) while its round's reports topic is flooded with junk past what
the broker holds for it (the broker logs that it drops messages to it), and the analyzer's
message is published then (a subscriber on another connection sees the broker route it). The
rounds must still end released, each report counted once, and the batch served.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from shuffledp.client.ledger import PrivacyLedger
from shuffledp.deploy.broker import Broker, BrokerUsers
from shuffledp.deploy.deployment import Deployment
from shuffledp.deploy.fleet import Fleet
from shuffledp.protocol.mechanisms.randomness import SeededSource
from shuffledp.protocol.transport.channel import acks_topic, announce_topic, reports_topic, spec_topic
from shuffledp.protocol.transport.mqtt_channel import MqttChannel
from shuffledp.protocol.wire.messages import HadamardRangeParams
from shuffledp.protocol.wire.onion import verified_spec
from tests.mqtt.child_shuffler import ChildShuffler

pytestmark = pytest.mark.mqtt

PARAMS = HadamardRangeParams(-4.0, 4.0, 0.5)
EPSILON0 = 0.5
USERS = 12
#: The test broker's limits, and a flood well past them.
INFLIGHT, QUEUED, FLOOD = 8, 16, 48
#: Seconds from a round's announcement to its deadline: the acknowledgement test waits it out for
#: round 1 (held open past its users), whose pause, flood and retransmissions take well under a second.
ROUND_TIMEOUT = 3.0
#: Seconds the shuffler re-publishes an unacknowledged batch after its round's deadline.
ACK_TIMEOUT = 2.0
#: Safety limit for every wait (each ends on an event: a message, a line, a task's end).
TIMEOUT = 60

@pytest.fixture
def small_queue_broker():
    broker = Broker(users=BrokerUsers.default(("client",)), max_inflight_messages=INFLIGHT, max_queued_messages=QUEUED)
    broker.start()
    yield broker
    broker.close()


async def _round_spec(subscription, deployment: Deployment, round_id: int) -> bytes:
    """The next message on a spec or announce topic that is round ``round_id``'s signed spec."""
    while True:
        data = await subscription.get()
        if verified_spec(data, deployment.analyzer_signing_key).round_id == round_id:
            return data


async def _flood(channel: MqttChannel, topic: str) -> None:
    """Junk on a reports topic, more than the broker holds for a subscriber that reads nothing."""
    for i in range(FLOOD):
        await channel.publish(topic, b"junk %d" % i)


def _dropped_for(broker: Broker, identifier: str) -> bool:
    return f"Outgoing messages are being dropped for client {identifier}." in broker.log_file.read_text(errors="replace")


@pytest.fixture
def parties(small_queue_broker, tmp_path, request):
    deployment = Deployment()
    shuffler = ChildShuffler(deployment, small_queue_broker, tmp_path, tell=("served", "expired"),
                             identifier="lagging-shuffler", ack_timeout=ACK_TIMEOUT,
                             control_connection=getattr(request, "param", "control") == "control")
    shuffler.start()
    yield deployment, shuffler
    shuffler.stop()


def _fleet(channel, deployment: Deployment) -> tuple[Fleet, list]:
    clients = [deployment.client(np.array([0.01 * i]), PrivacyLedger(2.0)) for i in range(USERS)]
    return Fleet(channel, deployment.session_id, clients, SeededSource(5), retry_interval=0.25, grace=2.0), clients


@pytest.mark.parametrize("parties", ["control", "single"], indirect=True)
async def test_an_announcement_published_while_the_shuffler_lags_behind_a_flood_opens_its_round(small_queue_broker, parties, request):
    """Either mechanism suffices: ``control``, the shuffler reads announcements on a connection no client
    can flood (and the analyzer does not re-announce); ``single``, one connection for everything, and
    the analyzer publishes its announcement again until the shuffler relays the spec."""
    broker, (deployment, shuffler) = small_queue_broker, parties
    control = request.node.callspec.params["parties"] == "control"
    host, port = broker.host, broker.port
    async with MqttChannel(host, port, **broker.channel_options("analyzer")) as analyzer_channel, \
            MqttChannel(host, port, **broker.channel_options("client")) as fleet_channel, \
            MqttChannel(host, port, **broker.channel_options("shuffler")) as witness:
        specs = await analyzer_channel.subscribe(spec_topic(deployment.session_id))
        announcements = await witness.subscribe(announce_topic(deployment.session_id))
        coordinator = deployment.coordinator(analyzer_channel, round_timeout=ROUND_TIMEOUT, grace=2.0,
                                             reannounce_interval=3600 if control else 0.5)
        first = asyncio.create_task(coordinator.run_round(PARAMS, EPSILON0, min_batch=USERS, max_batch=USERS))
        await asyncio.wait_for(_round_spec(specs, deployment, 0), TIMEOUT)  # round 0 is open at the shuffler
        shuffler.pause()
        try:
            await _flood(fleet_channel, reports_topic(deployment.session_id, 0))
            # round 1 is announced now, while the broker drops what comes for the shuffler's report session
            second = asyncio.create_task(coordinator.run_round(PARAMS, EPSILON0, min_batch=USERS, max_batch=USERS))
            await asyncio.wait_for(_round_spec(announcements, deployment, 1), TIMEOUT)  # the broker routed it
        finally:
            shuffler.resume()
        fleet, clients = _fleet(fleet_channel, deployment)
        fleet_task = asyncio.create_task(fleet.serve(rounds=2))
        try:
            records = [await asyncio.wait_for(first, TIMEOUT), await asyncio.wait_for(second, TIMEOUT)]
            states = await asyncio.wait_for(fleet_task, TIMEOUT)
        finally:
            fleet_task.cancel()
            await asyncio.gather(fleet_task, return_exceptions=True)

    assert _dropped_for(broker, "lagging-shuffler"), broker.log_tail()
    assert [r.spec.round_id for r in records] == [0, 1]
    assert all(r.opened.size == USERS and r.batch_sizes == (USERS,) and not r.opened.rejected for r in records)
    assert all(s.admitted == USERS and s.released and s.unacknowledged == 0 for s in states)
    assert all(len(c.ledger.answered) == 2 for c in clients)
    assert (coordinator.reannounced == 0) if control else (coordinator.reannounced > 0)


async def test_an_acknowledgement_published_while_the_shuffler_lags_behind_a_flood_serves_its_batch(small_queue_broker, parties):
    broker, (deployment, shuffler) = small_queue_broker, parties
    settled = shuffler.follow(lambda line: line in ("served 0", "expired 0"))  # or the process ended
    host, port = broker.host, broker.port
    async with MqttChannel(host, port, **broker.channel_options("analyzer")) as analyzer_channel, \
            MqttChannel(host, port, **broker.channel_options("client")) as fleet_channel, \
            MqttChannel(host, port, **broker.channel_options("shuffler")) as witness:
        specs = await analyzer_channel.subscribe(spec_topic(deployment.session_id))
        acks = await witness.subscribe(acks_topic(deployment.session_id))
        coordinator = deployment.coordinator(analyzer_channel, round_timeout=ROUND_TIMEOUT, grace=2.0, reannounce_interval=3600)
        # the analyzer holds round 0's acknowledgement until round 1 is open and the shuffler lags behind a flood
        acknowledge, ready, go = coordinator._acknowledge, asyncio.Event(), asyncio.Event()

        async def held_acknowledge(spec, batch_ids):
            if spec.round_id == 0:
                ready.set()
                await go.wait()
            return await acknowledge(spec, batch_ids)

        coordinator._acknowledge = held_acknowledge
        fleet, clients = _fleet(fleet_channel, deployment)
        fleet_task = asyncio.create_task(fleet.serve(rounds=2))
        first = asyncio.create_task(coordinator.run_round(PARAMS, EPSILON0, min_batch=USERS, max_batch=USERS))
        await asyncio.wait_for(ready.wait(), TIMEOUT)  # round 0 released, its batch opened, not yet acknowledged
        # round 1 holds up to 8 more than its users send: it stays open (reading its reports) until its deadline
        second = asyncio.create_task(coordinator.run_round(PARAMS, EPSILON0, min_batch=USERS, max_batch=USERS + 8))
        await asyncio.wait_for(_round_spec(specs, deployment, 1), TIMEOUT)
        shuffler.pause()
        try:
            await _flood(fleet_channel, reports_topic(deployment.session_id, 1))
            go.set()
            await asyncio.wait_for(acks.get(), TIMEOUT)  # the broker routed round 0's acknowledgement
        finally:
            shuffler.resume()
        try:
            records = [await asyncio.wait_for(first, TIMEOUT), await asyncio.wait_for(second, TIMEOUT)]
            states = await asyncio.wait_for(fleet_task, TIMEOUT)
        finally:
            fleet_task.cancel()
            await asyncio.gather(fleet_task, return_exceptions=True)
        assert await asyncio.to_thread(settled.wait, TIMEOUT)

    assert _dropped_for(broker, "lagging-shuffler"), broker.log_tail()
    assert "served 0" in shuffler.lines and not any(line.startswith("expired") for line in shuffler.lines), shuffler.lines
    assert all(r.opened.size == USERS and r.batch_sizes == (USERS,) for r in records)
    assert all(s.admitted == USERS and s.released and s.unacknowledged == 0 for s in states)
    assert all(len(c.ledger.answered) == 2 for c in clients)
