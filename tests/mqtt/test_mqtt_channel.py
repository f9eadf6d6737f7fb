"""The MQTT channel against a real mosquitto broker."""

from __future__ import annotations

import asyncio

import pytest

from shuffledp.population import Population
from shuffledp.protocol.channel import InProcessChannel
from shuffledp.protocol.mqtt_channel import MqttChannel
from shuffledp.simulation import SimulationConfig, parse_broker, run_simulation

pytestmark = pytest.mark.mqtt


async def _exchange(publisher, subscriber, topic: str, payloads: list[bytes]) -> list[bytes]:
    sub = await subscriber.subscribe(topic)
    for p in payloads:
        await publisher.publish(topic, p)
    got = [await asyncio.wait_for(sub.get(), timeout=10) for _ in payloads]
    await sub.close()
    return got


async def test_bytes_arrive_unchanged_and_in_order(mosquitto):
    host, port = parse_broker(mosquitto)
    payloads = [bytes([i % 256]) * (i + 1) for i in range(200)] + [bytes(range(256)) * 4096]
    async with MqttChannel(host, port) as a, MqttChannel(host, port) as b:
        got = await _exchange(a, b, "shuffledp/test/order", payloads)
    assert got == payloads
    # The in-process channel carries the same bytes the same way.
    channel = InProcessChannel()
    assert await _exchange(channel, channel, "t", payloads) == payloads


async def test_retained_message_reaches_a_late_subscriber(mosquitto):
    host, port = parse_broker(mosquitto)
    async with MqttChannel(host, port) as a:
        await a.publish("shuffledp/test/retained", b"spec-1", retain=True)
        await a.publish("shuffledp/test/retained", b"spec-2", retain=True)
        await asyncio.sleep(0.2)
    async with MqttChannel(host, port) as late:
        sub = await late.subscribe("shuffledp/test/retained")
        assert await asyncio.wait_for(sub.get(), timeout=10) == b"spec-2"


def test_protocol_over_mqtt_matches_in_process(mosquitto):
    """The full two-round protocol over a real broker gives exactly the in-process result.

    Both runs use the same simulation seed, so the report values are identical and the
    analyzer's estimate must agree to the last bit (only the permutation differs, and
    the mean is permutation-invariant up to float summation order: compare to 1e-12).
    """
    pop = Population("gaussian", 1.7, 1.0, 20.0, 50)
    results = [
        run_simulation(SimulationConfig(pop, 600, 1.0, path="messages", broker=broker, seed=3))
        for broker in (None, mosquitto)
    ]
    in_process, mqtt = results
    assert mqtt.extra["transport"].startswith("mqtt")
    assert mqtt.estimate == pytest.approx(in_process.estimate, abs=1e-12)
    assert mqtt.range_found == in_process.range_found
    for r_in, r_mq in zip(in_process.rounds, mqtt.rounds):
        assert r_mq["messages"] == r_in["messages"] == 600
        assert r_mq["envelope_bytes"] == r_in["envelope_bytes"]
        assert r_mq["rejected_at_analyzer"] == {}


async def test_unreachable_broker_is_a_typed_error():
    from shuffledp.protocol.errors import TransportError

    with pytest.raises(TransportError, match="cannot connect"):
        async with MqttChannel("127.0.0.1", 1):  # nothing listens on port 1
            pass
