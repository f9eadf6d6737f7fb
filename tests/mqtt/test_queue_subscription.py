"""QueueSubscription: the optional bound, failing, and their interplay with get()."""

from __future__ import annotations

import asyncio

import pytest

from shuffledp.protocol.transport.channel import InProcessChannel, QueueSubscription
from shuffledp.protocol.errors import TransportError


async def test_unbounded_by_default():
    sub = QueueSubscription()
    assert all(sub.deliver(bytes([i % 256])) for i in range(10_000))
    assert sub.dropped == 0 and sub.qsize() == 10_000


async def test_bound_drops_and_counts_new_messages():
    sub = QueueSubscription(maxsize=5)
    results = [sub.deliver(bytes([i])) for i in range(20)]
    assert results == [True] * 5 + [False] * 15
    assert sub.dropped == 15
    assert await sub.get() == b"\x00"
    assert sub.deliver(b"room again")
    assert sub.get_nowait_all() == [bytes([i]) for i in range(1, 5)] + [b"room again"]


async def test_fail_wakes_every_waiter_after_the_queued_messages():
    sub = QueueSubscription()
    waiters = [asyncio.create_task(sub.get()) for _ in range(3)]
    await asyncio.sleep(0)
    sub.fail(TransportError("gone"))
    for w in waiters:
        with pytest.raises(TransportError, match="gone"):
            await asyncio.wait_for(w, 1)

    sub = QueueSubscription()
    sub.deliver(b"a")
    sub.deliver(b"b")
    sub.fail(TransportError("gone"))
    sub.fail(TransportError("second call ignored"))
    assert not sub.deliver(b"after the failure")
    assert sub.qsize() == 2 and sub.failed is not None
    assert await sub.get() == b"a"
    assert sub.get_nowait_all() == [b"b"]
    with pytest.raises(TransportError, match="gone"):
        await sub.get()
    with pytest.raises(TransportError, match="gone"):
        async for _ in sub:
            pass
    assert sub.dropped == 0


async def test_in_process_channel_is_unchanged():
    channel = InProcessChannel()
    sub = await channel.subscribe("t")
    for i in range(100):
        await channel.publish("t", bytes([i]))
    assert sub.get_nowait_all() == [bytes([i]) for i in range(100)]
    await sub.close()
    await channel.publish("t", b"x")
    assert sub.qsize() == 0
