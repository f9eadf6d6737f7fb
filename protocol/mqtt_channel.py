"""The :class:`~shuffledp.protocol.channel.Channel` interface over MQTT (aiomqtt).

Each party opens its own connection to a broker (mosquitto in the tests). Payloads
are the exact bytes the in-process channel carries; messages go with QoS 1 (at
least once: a duplicate report is caught by the shuffler's nonce check), retained
ones with MQTT's retain flag. One router task reads the connection's message
stream and hands each message to the subscriptions of its topic.

aiomqtt is an optional dependency (``pip install shuffledp[mqtt]``) and is
imported only here, so devices that use another transport never load it.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter, defaultdict

import aiomqtt

from shuffledp.protocol.channel import QueueSubscription
from shuffledp.protocol.errors import TransportError


class MqttChannel:
    """Publish/subscribe through an MQTT broker; use as ``async with MqttChannel(host, port) as ch``."""

    def __init__(self, hostname: str = "127.0.0.1", port: int = 1883, *, identifier: str | None = None) -> None:
        self.hostname = hostname
        self.port = port
        self.identifier = identifier or f"shuffledp-{os.urandom(6).hex()}"
        self._client: aiomqtt.Client | None = None
        self._router: asyncio.Task | None = None
        self._subscribers: dict[str, list[QueueSubscription]] = defaultdict(list)
        self.bytes_by_topic: Counter = Counter()
        self.messages_by_topic: Counter = Counter()

    async def __aenter__(self) -> "MqttChannel":
        await self.connect()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def connect(self) -> None:
        self._client = aiomqtt.Client(
            self.hostname, self.port, identifier=self.identifier, max_queued_incoming_messages=0
        )
        try:
            await self._client.__aenter__()
        except aiomqtt.MqttError as exc:
            self._client = None
            raise TransportError(f"cannot connect to the MQTT broker at {self.hostname}:{self.port}: {exc}") from None
        self._router = asyncio.create_task(self._route())

    async def _route(self) -> None:
        assert self._client is not None
        async for message in self._client.messages:
            payload = message.payload
            data = bytes(payload) if isinstance(payload, (bytes, bytearray)) else b""
            for sub in list(self._subscribers.get(message.topic.value, ())):
                sub.deliver(data)

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        if not isinstance(payload, bytes):
            raise TypeError(f"payload must be bytes, got {type(payload).__name__}")
        if self._client is None:
            raise RuntimeError("MqttChannel is not connected")
        await self._client.publish(topic, payload, qos=1, retain=retain)
        self.bytes_by_topic[topic] += len(payload)
        self.messages_by_topic[topic] += 1

    async def subscribe(self, topic: str) -> QueueSubscription:
        if self._client is None:
            raise RuntimeError("MqttChannel is not connected")
        sub = QueueSubscription(on_close=lambda s: self._unsubscribe(topic, s))
        first = not self._subscribers[topic]
        self._subscribers[topic].append(sub)
        if first:
            await self._client.subscribe(topic, qos=1)
        return sub

    def _unsubscribe(self, topic: str, sub: QueueSubscription) -> None:
        subs = self._subscribers.get(topic, [])
        if sub in subs:
            subs.remove(sub)
        if not subs and self._client is not None:
            self._subscribers.pop(topic, None)
            asyncio.ensure_future(self._quiet_unsubscribe(topic))

    async def _quiet_unsubscribe(self, topic: str) -> None:
        try:
            await self._client.unsubscribe(topic)  # type: ignore[union-attr]
        except aiomqtt.MqttError:
            pass  # the connection is closing; nothing is left to unsubscribe from

    async def close(self) -> None:
        if self._router is not None:
            self._router.cancel()
            await asyncio.gather(self._router, return_exceptions=True)
            self._router = None
        if self._client is not None:
            client, self._client = self._client, None
            await client.__aexit__(None, None, None)
        self._subscribers.clear()
