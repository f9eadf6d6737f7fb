"""Transport: a topic-based byte channel, in-process by default.

Parties publish bytes to topics and read what they subscribed to. The same
interface is implemented over asyncio queues (:class:`InProcessChannel`, the
default for simulation and tests) and over MQTT with a real broker
(:class:`shuffledp.protocol.mqtt_channel.MqttChannel`). Both carry exactly the
bytes they are given. Topics are per session and round (the ``*_topic`` functions).

The analyzer announces a round to the shuffler, which opens it (subscribes to its
reports) *before* passing the signed spec on to the clients, so no report can
arrive at a round the shuffler has not opened yet.

Semantics shared by both implementations:

* a subscriber receives the messages published after it subscribed, in order;
* a message published with ``retain=True`` is also delivered to later
  subscribers (the latest one per topic), as MQTT's retained messages are.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from typing import AsyncIterator, Protocol

TOPIC_ROOT = "shuffledp"


def announce_topic(session_id: bytes) -> str:
    """Analyzer -> shuffler: signed round specs of a session."""
    return f"{TOPIC_ROOT}/{session_id.hex()}/announce"


def spec_topic(session_id: bytes) -> str:
    """Shuffler -> clients: the signed spec of the round now open (retained)."""
    return f"{TOPIC_ROOT}/{session_id.hex()}/spec"


def reports_topic(session_id: bytes, round_id: int) -> str:
    """Clients -> shuffler: envelopes for one round."""
    return f"{TOPIC_ROOT}/{session_id.hex()}/{round_id}/reports"


def batch_topic(session_id: bytes, round_id: int) -> str:
    """Shuffler -> analyzer: the signed chunks of one round's shuffled batch."""
    return f"{TOPIC_ROOT}/{session_id.hex()}/{round_id}/batch"


def receipts_topic(session_id: bytes, round_id: int) -> str:
    """Shuffler -> clients: signed admission receipts (which nonces were admitted or refused)."""
    return f"{TOPIC_ROOT}/{session_id.hex()}/{round_id}/receipts"


def outcome_topic(session_id: bytes, round_id: int) -> str:
    """Shuffler -> clients and analyzer: the signed outcome of a round, released or failed (retained)."""
    return f"{TOPIC_ROOT}/{session_id.hex()}/{round_id}/outcome"


def acks_topic(session_id: bytes) -> str:
    """Analyzer -> shuffler: signed acknowledgements of the batches it has opened."""
    return f"{TOPIC_ROOT}/{session_id.hex()}/acks"


#: Who may do what on the broker, by role (MQTT topic filters; ``+`` matches one level).
#: The broker's ACL file is generated from this table (``shuffledp.broker``), so the
#: topic layout and its access rules cannot drift apart.
TOPIC_ACCESS: dict[str, dict[str, tuple[str, ...]]] = {
    "analyzer": {
        "write": (f"{TOPIC_ROOT}/+/announce", f"{TOPIC_ROOT}/+/acks"),
        "read": (f"{TOPIC_ROOT}/+/+/batch", f"{TOPIC_ROOT}/+/+/outcome", f"{TOPIC_ROOT}/+/spec"),
    },
    "shuffler": {
        "write": (f"{TOPIC_ROOT}/+/spec", f"{TOPIC_ROOT}/+/+/batch", f"{TOPIC_ROOT}/+/+/receipts", f"{TOPIC_ROOT}/+/+/outcome"),
        "read": (f"{TOPIC_ROOT}/+/announce", f"{TOPIC_ROOT}/+/+/reports", f"{TOPIC_ROOT}/+/acks"),
    },
    "client": {
        "write": (f"{TOPIC_ROOT}/+/+/reports",),
        "read": (f"{TOPIC_ROOT}/+/spec", f"{TOPIC_ROOT}/+/+/receipts", f"{TOPIC_ROOT}/+/+/outcome"),
    },
}


class Subscription(Protocol):
    """An open subscription: an async iterator of payloads, closed with :meth:`close`."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def get(self) -> bytes: ...

    async def close(self) -> None: ...


class Channel(Protocol):
    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None: ...

    async def subscribe(self, topic: str) -> Subscription: ...

    async def close(self) -> None: ...


class QueueSubscription:
    """A subscription backed by an unbounded asyncio queue."""

    def __init__(self, on_close=None) -> None:
        self._queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._on_close = on_close

    def deliver(self, payload: bytes) -> None:
        self._queue.put_nowait(payload)

    async def get(self) -> bytes:
        return await self._queue.get()

    def get_nowait_all(self) -> list[bytes]:
        """Everything already delivered, without waiting (used to drain bursts cheaply)."""
        items = []
        while not self._queue.empty():
            items.append(self._queue.get_nowait())
        return items

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[bytes]:
        while True:
            yield await self._queue.get()

    async def close(self) -> None:
        if self._on_close is not None:
            self._on_close(self)
            self._on_close = None


class InProcessChannel:
    """Publish/subscribe over asyncio queues inside one event loop (the default transport)."""

    def __init__(self) -> None:
        self._subscribers: dict[str, list[QueueSubscription]] = defaultdict(list)
        self._retained: dict[str, bytes] = {}
        self.bytes_by_topic: Counter = Counter()
        self.messages_by_topic: Counter = Counter()

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        if not isinstance(payload, bytes):
            raise TypeError(f"payload must be bytes, got {type(payload).__name__}")
        self.bytes_by_topic[topic] += len(payload)
        self.messages_by_topic[topic] += 1
        if retain:
            self._retained[topic] = payload
        for sub in self._subscribers.get(topic, ()):
            sub.deliver(payload)

    async def subscribe(self, topic: str) -> QueueSubscription:
        sub = QueueSubscription(on_close=lambda s: self._subscribers[topic].remove(s))
        self._subscribers[topic].append(sub)
        if topic in self._retained:
            sub.deliver(self._retained[topic])
        return sub

    async def close(self) -> None:
        self._subscribers.clear()
