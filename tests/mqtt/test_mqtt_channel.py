"""The MQTT channel against a real mosquitto broker (authenticated, TLS)."""

from __future__ import annotations

import asyncio

import pytest

from shuffledp.simulation.population import Population
from shuffledp.protocol.transport.channel import InProcessChannel, batch_topic, outcome_topic, spec_topic
from shuffledp.protocol.errors import TransportError
from shuffledp.protocol.transport.mqtt_channel import MqttChannel
from shuffledp.simulation import SimulationConfig, run_simulation

pytestmark = pytest.mark.mqtt

SESSION = bytes.fromhex("00aa")
#: Topics the shuffler may write and the analyzer may read (built by the topic
#: functions, so the tests follow the topic layout and its ACL).
BATCH = batch_topic(SESSION, 0)
OUTCOME = outcome_topic(SESSION, 0)


def channel(broker, role: str, **kwargs) -> MqttChannel:
    return MqttChannel(broker.host, broker.port, **broker.channel_options(role), **kwargs)


async def _exchange(publisher, subscriber, topic: str, payloads: list[bytes]) -> list[bytes]:
    sub = await subscriber.subscribe(topic)
    for p in payloads:
        await publisher.publish(topic, p)
    got = [await asyncio.wait_for(sub.get(), timeout=10) for _ in payloads]
    await sub.close()
    return got


async def test_bytes_arrive_unchanged_and_in_order(broker):
    payloads = [bytes([i % 256]) * (i + 1) for i in range(200)] + [bytes(range(256)) * 4096]
    async with channel(broker, "shuffler") as a, channel(broker, "analyzer") as b:
        got = await _exchange(a, b, BATCH, payloads)
        assert a.messages_by_topic[BATCH] == len(payloads)
        assert a.bytes_by_topic[BATCH] == sum(map(len, payloads))
    assert got == payloads
    # The in-process channel carries the same bytes the same way.
    in_process = InProcessChannel()
    assert await _exchange(in_process, in_process, "t", payloads) == payloads


async def test_a_batch_chunk_of_several_mib_passes(broker):
    """The broker's packet limit is sized for batch chunks (64 MiB); 8 MiB must pass."""
    chunk = bytes(range(256)) * (8 * 4096)
    async with channel(broker, "shuffler") as a, channel(broker, "analyzer") as b:
        # The receiver's read loop hands over a packet completed by paho's 100th read
        # (tests/protocol/test_mqtt_packet_read.py; without it, 1 in ~40 deliveries under load
        # waited for the 60 s keepalive).
        assert hasattr(b._conn.client._client.loop_read, "__wrapped__")
        sub = await b.subscribe(BATCH)
        await a.publish(BATCH, chunk)
        assert await asyncio.wait_for(sub.get(), timeout=20) == chunk


async def test_retained_message_reaches_a_late_subscriber(broker):
    topic = spec_topic(bytes.fromhex("00bb"))
    async with channel(broker, "shuffler") as a:
        await a.publish(topic, b"spec-1", retain=True)
        await a.publish(topic, b"spec-2", retain=True)
    async with channel(broker, "client") as late:
        sub = await late.subscribe(topic)
        assert await asyncio.wait_for(sub.get(), timeout=10) == b"spec-2"


async def test_retained_returns_the_retained_message_or_none_and_leaves_no_subscription(broker):
    """``retained`` gives the topic's retained message (one of many TLS records, as a signed spec of up
    to 25 KiB is), or None for a topic without one, every time, and unsubscribes."""
    held, empty = spec_topic(bytes.fromhex("00cc")), spec_topic(bytes.fromhex("00cd"))
    large = bytes(range(256)) * 100
    async with channel(broker, "shuffler") as a, channel(broker, "analyzer") as reader:
        await a.publish(held, large, retain=True)
        for _ in range(20):
            assert await reader.retained(held) == large
            assert await reader.retained(empty) is None
        assert held not in reader._subscribers and held not in reader._conn.topics
        sub = await reader.subscribe(held)  # a later subscription of the same topic still works
        assert await asyncio.wait_for(sub.get(), timeout=10) == large
        with pytest.raises(ValueError, match="already holds a subscription"):
            await reader.retained(held)
        await a.publish(held, b"", retain=True)  # clears it


async def test_concurrent_publishes_and_publish_many(broker):
    """Many publishes at once (gather) and a windowed publish_many all arrive, in order."""
    async with channel(broker, "shuffler") as a, channel(broker, "analyzer") as b:
        sub = await b.subscribe(BATCH)
        first = [i.to_bytes(4, "big") for i in range(3000)]
        await asyncio.gather(*(a.publish(BATCH, p) for p in first))
        second = [i.to_bytes(4, "big") for i in range(3000, 8000)]
        assert await a.publish_many(BATCH, second, window=200) == len(second)
        got = [await asyncio.wait_for(sub.get(), timeout=10) for _ in range(len(first) + len(second))]
    assert got == first + second
    assert a.messages_by_topic[BATCH] == 8000


async def test_subscription_queue_is_bounded(broker):
    """With queue_limit=5 and 20 unread messages, 15 are dropped and counted; the first 5 stay."""
    async with channel(broker, "shuffler") as a, channel(broker, "analyzer", queue_limit=5) as b:
        sub = await b.subscribe(BATCH)
        control = await b.subscribe(OUTCOME)
        await a.publish_many(BATCH, [bytes([i]) for i in range(20)])
        await a.publish(OUTCOME, b"done")  # after the 20, on the same connection
        assert await asyncio.wait_for(control.get(), timeout=10) == b"done"
        assert sub.dropped == 15
        assert b.dropped_by_topic == {BATCH: 15}
        assert sub.get_nowait_all() == [bytes([i]) for i in range(5)]
        # Reading frees room: the next message is queued again.
        await a.publish(BATCH, b"later")
        assert await asyncio.wait_for(sub.get(), timeout=10) == b"later"


async def test_closing_the_channel_wakes_a_waiting_get(broker):
    ch = channel(broker, "analyzer")
    await ch.connect()
    sub = await ch.subscribe(BATCH)
    waiter = asyncio.create_task(sub.get())
    await asyncio.sleep(0.05)
    await ch.close()
    with pytest.raises(TransportError, match="closed"):
        await asyncio.wait_for(waiter, timeout=5)
    with pytest.raises(TransportError, match="closed"):
        await ch.publish(BATCH, b"x")


async def test_unreachable_broker_is_a_typed_error():
    with pytest.raises(TransportError, match="cannot connect.*refused"):
        async with MqttChannel("127.0.0.1", 1):  # nothing listens on port 1
            pass


def test_protocol_over_mqtt_matches_in_process(broker):
    """The full two-round protocol over the authenticated TLS broker (each party with its
    own role's account, as ``shuffledp simulate --broker DIR`` runs it) gives exactly the
    in-process result.

    Both runs use the same simulation seed, so the report values are identical and the
    analyzer's estimate must agree to the last bit (only the permutation differs, and
    the mean is permutation-invariant up to float summation order: compare to 1e-12).
    """
    pop = Population("gaussian", 1.7, 1.0, 20.0, 50)
    results = [
        run_simulation(SimulationConfig(pop, 600, 1.0, path="messages", broker=b, seed=3))
        for b in (None, str(broker.directory))
    ]
    in_process, mqtt = results
    assert mqtt.extra["transport"].startswith("mqtt")
    assert mqtt.estimate == pytest.approx(in_process.estimate, abs=1e-12)
    assert mqtt.range_found == in_process.range_found
    for r_in, r_mq in zip(in_process.rounds, mqtt.rounds):
        assert r_mq["messages"] == r_in["messages"] == 600
        assert r_mq["envelope_bytes"] == r_in["envelope_bytes"]
        assert r_mq["rejected_at_analyzer"] == {}
