"""``MqttChannel(..., failover=[...])`` moves to the next broker address when its own dies.

Two mosquitto brokers with the same accounts stand in for two nodes of a clustered broker
(they share nothing else: what matters here is where the channel connects, re-subscribes and
publishes). The cluster itself is tested in ``tests/mqtt/test_nats_cluster.py``.
"""

from __future__ import annotations

import asyncio

import pytest

from shuffledp.deploy.broker import Broker, BrokerUsers, free_port
from shuffledp.protocol.transport.channel import batch_topic
from shuffledp.protocol.transport.mqtt_channel import MqttChannel

pytestmark = pytest.mark.mqtt

SESSION = bytes.fromhex("00dd")


@pytest.fixture
def two_brokers(mosquitto):
    """Two brokers with one set of accounts, each with a plaintext loopback listener."""
    users = BrokerUsers.default()
    brokers = [Broker(users=users, plaintext=True, role_limits=False) for _ in range(2)]
    try:
        for broker in brokers:
            broker.start()
        yield brokers
    finally:
        for broker in brokers:
            broker.close()


def _account(broker: Broker, role: str) -> dict:
    options = broker.channel_options(role)
    return {"username": options["username"], "password": options["password"]}


async def test_a_channel_moves_to_the_next_address_when_its_broker_dies(two_brokers):
    first, second = two_brokers
    a, b = ("127.0.0.1", first.plaintext_port), ("127.0.0.1", second.plaintext_port)
    dead = ("127.0.0.1", free_port())
    # a dead address first, then a and b: the first connection skips the dead one
    async with MqttChannel(*dead, **_account(first, "analyzer"), failover=[a, b], max_backoff=0.2) as reader, \
            MqttChannel(*b, **_account(second, "shuffler")) as writer:
        assert reader.address == f"{a[0]}:{a[1]}" and reader.addresses == [dead, a, b]
        batches = await reader.subscribe(batch_topic(SESSION, 0))
        await asyncio.to_thread(first.stop)
        # a new subscription waits for the reconnection, which goes on from a to b
        later = await reader.subscribe(batch_topic(SESSION, 1))
        assert reader.address == f"{b[0]}:{b[1]}" and reader.reconnects == 1
        # both subscriptions, the one made before the loss included, are live on b
        await writer.publish(batch_topic(SESSION, 0), b"resumed")
        await writer.publish(batch_topic(SESSION, 1), b"new")
        assert await asyncio.wait_for(batches.get(), 10) == b"resumed"
        assert await asyncio.wait_for(later.get(), 10) == b"new"
        # a companion channel (a second connection) inherits the addresses
        assert reader.companion("control").addresses == reader.addresses


async def test_one_address_alone_is_what_it_always_was(two_brokers):
    first, _ = two_brokers
    channel = MqttChannel("127.0.0.1", first.plaintext_port, **_account(first, "client"))
    assert channel.addresses == [("127.0.0.1", first.plaintext_port)] and channel.subscribe_qos == 1
    async with channel:
        assert channel.address == f"127.0.0.1:{first.plaintext_port}"
    with pytest.raises(ValueError, match="subscribe_qos"):
        MqttChannel("127.0.0.1", first.plaintext_port, subscribe_qos=2)
