"""Transport: a topic-based byte channel, in-process by default.

Parties publish bytes to topics and read what they subscribed to. The same
interface is implemented over asyncio queues (:class:`InProcessChannel`, the
default for simulation and tests) and over MQTT with a real broker
(:class:`shuffledp.protocol.transport.mqtt_channel.MqttChannel`). Both carry exactly the
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
from typing import AsyncIterator, Callable, Protocol

TOPIC_ROOT = "shuffledp"


def announce_topic(session_id: bytes) -> str:
    """Analyzer -> shuffler: signed round specs of a session."""
    return f"{TOPIC_ROOT}/{session_id.hex()}/announce"


def spec_topic(session_id: bytes) -> str:
    """Shuffler -> clients: the signed spec of the round now open (retained)."""
    return f"{TOPIC_ROOT}/{session_id.hex()}/spec"


def reports_topic(session_id: bytes, round_id: int, instance: int = 0) -> str:
    # Per-round topics carry the shuffler instance (0 .. shuffler_instances - 1) that
    # serves them: a client publishes to the instance its credential is assigned to.
    """Clients -> shuffler: envelopes for one round."""
    return f"{TOPIC_ROOT}/{session_id.hex()}/{round_id}/{instance}/reports"


def batch_topic(session_id: bytes, round_id: int, instance: int = 0) -> str:
    """Shuffler -> analyzer: the signed chunks of one round's shuffled batch."""
    return f"{TOPIC_ROOT}/{session_id.hex()}/{round_id}/{instance}/batch"


def receipts_topic(session_id: bytes, round_id: int, instance: int = 0) -> str:
    """Shuffler -> clients: signed admission receipts (which nonces were admitted or refused)."""
    return f"{TOPIC_ROOT}/{session_id.hex()}/{round_id}/{instance}/receipts"


def outcome_topic(session_id: bytes, round_id: int, instance: int = 0) -> str:
    """Shuffler -> clients and analyzer: the signed outcome of a round, released or failed (retained)."""
    return f"{TOPIC_ROOT}/{session_id.hex()}/{round_id}/{instance}/outcome"


def acks_topic(session_id: bytes) -> str:
    """Analyzer -> shuffler: signed acknowledgements of the batches it has opened."""
    return f"{TOPIC_ROOT}/{session_id.hex()}/acks"


#: Who may do what on the broker, by role (MQTT topic filters; ``+`` matches one level).
#: The broker's ACL file is generated from this table (``shuffledp.deploy.broker``), so the
#: topic layout and its access rules cannot drift apart.
TOPIC_ACCESS: dict[str, dict[str, tuple[str, ...]]] = {
    "analyzer": {
        "write": (f"{TOPIC_ROOT}/+/announce", f"{TOPIC_ROOT}/+/acks"),
        "read": (f"{TOPIC_ROOT}/+/+/+/batch", f"{TOPIC_ROOT}/+/+/+/outcome", f"{TOPIC_ROOT}/+/spec"),
    },
    "shuffler": {
        "write": (f"{TOPIC_ROOT}/+/spec", f"{TOPIC_ROOT}/+/+/+/batch", f"{TOPIC_ROOT}/+/+/+/receipts", f"{TOPIC_ROOT}/+/+/+/outcome"),
        "read": (f"{TOPIC_ROOT}/+/announce", f"{TOPIC_ROOT}/+/+/+/reports", f"{TOPIC_ROOT}/+/acks"),
    },
    "client": {
        "write": (f"{TOPIC_ROOT}/+/+/+/reports",),
        "read": (f"{TOPIC_ROOT}/+/spec", f"{TOPIC_ROOT}/+/+/+/receipts", f"{TOPIC_ROOT}/+/+/+/outcome"),
    },
}


class Subscription(Protocol):
    """An open subscription: an async iterator of payloads, closed with :meth:`close`."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def get(self) -> bytes: ...

    def get_nowait_all(self, limit: int | None = None) -> list[bytes]: ...

    async def close(self) -> None: ...


class Channel(Protocol):
    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None: ...

    async def subscribe(self, topic: str) -> Subscription: ...

    async def close(self) -> None: ...


class QueueSubscription:
    """A subscription backed by an asyncio queue, optionally bounded, that can be failed.

    * ``maxsize`` (0 = unbounded, the default): when that many messages wait
      unread, a new one is **dropped** and counted in :attr:`dropped` instead of
      growing memory without bound; :meth:`deliver` returns whether it was queued.
    * :meth:`fail` ends the subscription with an exception: messages queued before
      it are still returned by :meth:`get`, then every ``get()`` (those already
      waiting included) raises that exception, and async iteration raises it too.
    * :meth:`close` detaches it from its channel (no further deliveries).

    Not thread-safe: deliver and get from the event loop's thread.
    """

    def __init__(self, on_close: Callable[["QueueSubscription"], None] | None = None, *, maxsize: int = 0) -> None:
        if maxsize < 0:
            raise ValueError(f"maxsize must be >= 0, got {maxsize}")
        # Unbounded underneath: the bound is enforced in deliver(), so the failure
        # sentinel always fits.
        self._queue: asyncio.Queue = asyncio.Queue()
        self._on_close = on_close
        self.maxsize = maxsize
        self.dropped = 0
        self._failure: BaseException | None = None

    def deliver(self, payload: bytes) -> bool:
        """Queue ``payload``; False (and :attr:`dropped` + 1) if the queue is full.

        Messages delivered after :meth:`fail` are ignored (and return False, uncounted).
        """
        if self._failure is not None:
            return False
        if self.maxsize and self._queue.qsize() >= self.maxsize:
            self.dropped += 1
            return False
        self._queue.put_nowait(payload)
        return True

    def fail(self, exc: BaseException) -> None:
        """End the subscription with ``exc``: after the messages already queued,
        every :meth:`get` raises it (waiting ones are woken). Only the first call counts."""
        if self._failure is not None:
            return
        self._failure = exc
        self._queue.put_nowait(_FAILED)

    @property
    def failed(self) -> BaseException | None:
        """The exception passed to :meth:`fail`, or None."""
        return self._failure

    def qsize(self) -> int:
        """Messages waiting to be read."""
        # Once failed, exactly one _FAILED marker stays queued (get re-queues it).
        return self._queue.qsize() - (1 if self._failure is not None else 0)

    async def get(self) -> bytes:
        """The next message, waiting for one; raises the :meth:`fail` exception once
        the messages queued before it are consumed."""
        item = await self._queue.get()
        if item is _FAILED:
            self._queue.put_nowait(_FAILED)  # wake the next waiter too
            assert self._failure is not None
            raise self._failure
        return item

    def get_nowait_all(self, limit: int | None = None) -> list[bytes]:
        """Everything already delivered (at most ``limit`` messages), without waiting.

        Used to drain bursts cheaply. Never raises the failure; a later :meth:`get` does."""
        items: list[bytes] = []
        while not self._queue.empty() and (limit is None or len(items) < limit):
            item = self._queue.get_nowait()
            if item is _FAILED:
                self._queue.put_nowait(_FAILED)
                break
            items.append(item)
        return items

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[bytes]:
        while True:
            yield await self.get()

    async def close(self) -> None:
        """Detach from the channel; idempotent. Queued messages stay readable."""
        if self._on_close is not None:
            self._on_close(self)
            self._on_close = None


#: Queue marker behind which a failed subscription's exception waits.
_FAILED = object()


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
