"""The channel survives a broker restart, and never hangs on a dead broker."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from shuffledp.protocol.transport.channel import batch_topic, outcome_topic
from shuffledp.protocol.errors import TransportError
from shuffledp.protocol.transport.mqtt_channel import MqttChannel

pytestmark = pytest.mark.mqtt

SESSION = bytes.fromhex("00cc")
BATCH = batch_topic(SESSION, 1)
OUTCOME = outcome_topic(SESSION, 1)


def channel(broker, role: str, **kwargs) -> MqttChannel:
    return MqttChannel(broker.host, broker.port, **broker.channel_options(role), **kwargs)


async def until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_subscriptions_resume_after_a_broker_restart(fresh_broker):
    async with channel(fresh_broker, "shuffler", max_backoff=0.5) as pub, channel(fresh_broker, "analyzer", max_backoff=0.5) as sub_ch:
        sub = await sub_ch.subscribe(BATCH)
        other = await sub_ch.subscribe(OUTCOME)
        await pub.publish(BATCH, b"before")
        assert await asyncio.wait_for(sub.get(), 5) == b"before"

        waiting = asyncio.create_task(sub.get())  # a reader blocked across the outage
        await asyncio.to_thread(fresh_broker.stop)
        await until(lambda: not sub_ch.connected and not pub.connected)
        await asyncio.to_thread(fresh_broker.start)  # same port
        await until(lambda: sub_ch.connected and pub.connected)
        assert sub_ch.reconnects == 1 and pub.reconnects == 1

        await pub.publish(BATCH, b"after")
        await pub.publish(OUTCOME, b"outcome")
        assert await asyncio.wait_for(waiting, 5) == b"after"
        assert await asyncio.wait_for(other.get(), 5) == b"outcome"
        # Subscribing anew on the new connection works too.
        late = await sub_ch.subscribe(batch_topic(SESSION, 2))
        await pub.publish(batch_topic(SESSION, 2), b"new topic")
        assert await asyncio.wait_for(late.get(), 5) == b"new topic"


async def test_publish_waits_for_the_reconnection(fresh_broker):
    async with channel(fresh_broker, "shuffler", max_backoff=0.2) as pub, channel(fresh_broker, "analyzer", max_backoff=0.2) as sub_ch:
        sub = await sub_ch.subscribe(BATCH)
        await asyncio.to_thread(fresh_broker.stop)
        await until(lambda: not pub.connected)
        publishing = asyncio.create_task(pub.publish(BATCH, b"queued while down"))
        await asyncio.sleep(0.3)
        assert not publishing.done()
        await asyncio.to_thread(fresh_broker.start)
        await asyncio.wait_for(publishing, 10)
        # The subscriber may reconnect after the publish went through (and then it is
        # lost: clean sessions); what it gets after both are back must arrive.
        await until(lambda: sub_ch.connected)
        await pub.publish(BATCH, b"after both are back")
        got = [await asyncio.wait_for(sub.get(), 5)]
        if got[0] != b"after both are back":
            got.append(await asyncio.wait_for(sub.get(), 5))
        assert got[-1] == b"after both are back"


async def test_publish_while_down_times_out_with_a_typed_error(fresh_broker):
    async with channel(fresh_broker, "shuffler", publish_timeout=0.5, max_backoff=0.2) as pub:
        await asyncio.to_thread(fresh_broker.stop)
        await until(lambda: not pub.connected)
        started = time.monotonic()
        with pytest.raises(TransportError, match=r"publish to .*not connected .* within 0.5 s \(last error: .*refused"):
            await pub.publish(BATCH, b"x")
        assert 0.4 < time.monotonic() - started < 2.0
        with pytest.raises(TransportError, match="subscribe to"):
            await pub.subscribe(OUTCOME)


async def test_without_reconnect_a_dead_broker_fails_waiting_gets_and_later_calls(fresh_broker):
    async with channel(fresh_broker, "analyzer", reconnect=False) as ch:
        sub = await ch.subscribe(BATCH)
        waiting = asyncio.create_task(sub.get())
        await asyncio.sleep(0.05)
        await asyncio.to_thread(fresh_broker.kill)  # a crash, not a clean shutdown
        with pytest.raises(TransportError, match="lost the connection"):
            await asyncio.wait_for(waiting, 5)
        with pytest.raises(TransportError, match="lost the connection"):
            await sub.get()  # and every later get
        with pytest.raises(TransportError, match="lost the connection"):
            await ch.publish(OUTCOME, b"x")
        with pytest.raises(TransportError, match="lost the connection"):
            await ch.subscribe(OUTCOME)
        await asyncio.to_thread(fresh_broker.start)
        await asyncio.sleep(0.3)
        assert ch.reconnects == 0 and not ch.connected


async def test_an_unacknowledged_publish_is_sent_again_after_reconnecting(fresh_broker):
    """Publishes in flight when the broker dies (SIGKILL: no PUBACK is flushed) complete
    on the next connection.

    The broker is frozen (SIGSTOP) first and killed only once every publish slot waits for a
    PUBACK. Acknowledgements already in the client's socket buffer when the broker froze can
    still free every slot before the kill lands, so on a loaded machine an attempt may see no
    publish in flight at the kill (republished == 0): such an attempt proves nothing either way
    and is made again, up to three times. Every attempt must deliver everything; at least one
    must have re-sent publishes that were in flight."""
    exercised = 0
    for _attempt in range(3):
        republished = await _kill_the_broker_mid_publish(fresh_broker)
        exercised += republished > 0
        if exercised:
            break
    assert exercised, "no attempt had a publish in flight when the broker was killed"


async def _kill_the_broker_mid_publish(fresh_broker) -> int:
    """One attempt: everything published and delivered across a broker kill; the publishes re-sent."""
    async with channel(fresh_broker, "shuffler", max_backoff=0.2) as pub, channel(fresh_broker, "analyzer", max_backoff=0.2) as sub_ch:
        sub = await sub_ch.subscribe(BATCH)
        # The broker is frozen once 100 are acknowledged; what is sent after that is bounded by the
        # publish slots (256) plus the acknowledgements already on their way (about 260 seen here),
        # so publishing is still under way at the kill with thousands to spare.
        payloads = [i.to_bytes(2, "big") for i in range(4000)]
        sending = asyncio.create_task(pub.publish_many(BATCH, payloads))
        await until(lambda: pub.messages_by_topic[BATCH] > 100)
        os.kill(fresh_broker.pid, signal.SIGSTOP)  # no more PUBACKs from here on
        await until(lambda: pub._publish_slots.locked())  # every slot holds an unacknowledged publish
        assert not sending.done()
        await asyncio.to_thread(fresh_broker.kill)
        await asyncio.to_thread(fresh_broker.start)
        assert await asyncio.wait_for(sending, 120) == len(payloads)
        assert pub.messages_by_topic[BATCH] == len(payloads)
        assert pub.reconnects == 1
        # What the subscriber got: a subset (clean sessions lose what was sent while it was
        # away), every message at least once, nothing it was not sent; and once both are back,
        # everything published, in order.
        await until(lambda: sub_ch.connected)
        after = [b"after-" + i.to_bytes(2, "big") for i in range(200)]
        assert await pub.publish_many(BATCH, after) == len(after)
        got = []
        while (item := await asyncio.wait_for(sub.get(), 10)) != after[-1]:
            got.append(item)
        before = [g for g in got if not g.startswith(b"after-")]
        assert set(before) <= set(payloads)
        assert [g for g in got if g.startswith(b"after-")] == after[:-1]
        return pub.republished
