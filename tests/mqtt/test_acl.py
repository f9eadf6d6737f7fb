"""The broker's ACL, generated from TOPIC_ACCESS, is enforced for every role.

mosquitto drops a forbidden publish silently and never delivers to a subscriber
without read access, so a denial can only be observed as "nothing arrived". To keep
these tests from passing vacuously, every "nothing arrived" is checked only after a
control message, published right after on an allowed topic, *did* arrive, and after a
subscription round trip on every connection that must receive nothing (:func:`settled`):
the broker routes a publish before it acknowledges it, and answers a connection's packets
in order behind what it queued to that connection, so anything the denied message had
put in that connection's queue would have been delivered by then.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

import pytest
from aiomqtt import Topic

from shuffledp.deploy.broker import Broker, BrokerUsers
from shuffledp.protocol.transport import channel as ch
from shuffledp.protocol.transport.channel import TOPIC_ACCESS
from shuffledp.protocol.transport.mqtt_channel import MqttChannel

pytestmark = pytest.mark.mqtt

ROLES = ("analyzer", "shuffler", "client")
SESSION = os.urandom(8)
TOPICS = {
    "announce": ch.announce_topic(SESSION),
    "spec": ch.spec_topic(SESSION),
    "reports": ch.reports_topic(SESSION, 3),
    "batch": ch.batch_topic(SESSION, 3),
    "receipts": ch.receipts_topic(SESSION, 3),
    "outcome": ch.outcome_topic(SESSION, 3),
    "acks": ch.acks_topic(SESSION),
}
#: A topic of another session each role may read, for :func:`settled`'s round trips.
BARRIER_SESSION = os.urandom(8)
BARRIER = {"analyzer": ch.spec_topic(BARRIER_SESSION), "client": ch.spec_topic(BARRIER_SESSION),
           "shuffler": ch.announce_topic(BARRIER_SESSION)}


def may(role: str, access: str, kind: str) -> bool:
    return any(Topic(TOPICS[kind]).matches(f) for f in TOPIC_ACCESS[role][access])


def some(access: str, kind: str) -> str:
    """A role that may ``access`` topic ``kind`` (each topic has a writer and a reader)."""
    return next(r for r in ROLES if may(r, access, kind))


def test_the_table_says_what_the_protocol_needs():
    """Hand-written expectations, independent of the table, for the security-relevant cells."""
    assert [k for k in TOPICS if may("client", "write", k)] == ["reports"]
    assert not any(may(r, "read", "reports") for r in ("client", "analyzer"))
    assert [r for r in ROLES if may(r, "write", "batch")] == ["shuffler"]
    assert [r for r in ROLES if may(r, "write", "spec")] == ["shuffler"]
    assert [r for r in ROLES if may(r, "write", "announce")] == ["analyzer"]
    assert [r for r in ROLES if may(r, "write", "acks")] == ["analyzer"]
    assert [r for r in ROLES if may(r, "read", "batch")] == ["analyzer"]
    for kind in TOPICS:  # every topic is usable by someone
        some("write", kind), some("read", kind)


@contextlib.asynccontextmanager
async def channels(broker, *accounts: str):
    async with contextlib.AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(MqttChannel(broker.host, broker.port, **broker.channel_options(a)))
            for a in accounts
        ]


async def expect(sub, payload: bytes) -> None:
    assert await asyncio.wait_for(sub.get(), timeout=5) == payload


async def settled(*connections: tuple[str, MqttChannel]) -> None:
    """Return once each ``(role, channel)`` has been handed every message the broker queued to it
    before now: a SUBSCRIBE and an UNSUBSCRIBE answered on that connection
    (:meth:`MqttChannel.retained`), which the broker sends behind those messages."""
    for role, channel in connections:
        assert await channel.retained(BARRIER[role]) is None


@pytest.mark.parametrize("role", ROLES)
async def test_each_role_can_publish_where_allowed(broker, role):
    kinds = [k for k in TOPICS if may(role, "write", k)]
    assert kinds
    readers = {k: some("read", k) for k in kinds}
    async with channels(broker, role, *readers.values()) as (publisher, *subscribers):
        subs = {k: await s.subscribe(TOPICS[k]) for k, s in zip(kinds, subscribers)}
        for kind in kinds:
            await publisher.publish(TOPICS[kind], f"{role}->{kind}".encode())
        for kind in kinds:
            await expect(subs[kind], f"{role}->{kind}".encode())


@pytest.mark.parametrize("role", ROLES)
async def test_publishes_outside_a_roles_rights_are_not_delivered(broker, role):
    forbidden = [k for k in TOPICS if not may(role, "write", k)]
    allowed = next(k for k in TOPICS if may(role, "write", k))
    readers = [some("read", k) for k in forbidden] + [some("read", allowed)]
    async with channels(broker, role, *readers) as (publisher, *subscribers):
        subs = [await s.subscribe(TOPICS[k]) for k, s in zip(forbidden + [allowed], subscribers)]
        *forbidden_subs, control = subs
        for kind in forbidden:
            await publisher.publish(TOPICS[kind], b"forged " + kind.encode())  # acknowledged, then dropped
        await publisher.publish(TOPICS[allowed], b"control")
        await expect(control, b"control")
        await settled(*zip(readers, subscribers))
        leaked = {k: s.get_nowait_all() for k, s in zip(forbidden, forbidden_subs)}
        assert {k: v for k, v in leaked.items() if v} == {}


@pytest.mark.parametrize("role", ROLES)
async def test_subscriptions_outside_a_roles_rights_receive_nothing(broker, role):
    unreadable = [k for k in TOPICS if not may(role, "read", k)]
    assert unreadable
    writers = [some("write", k) for k in unreadable]
    readers = [some("read", k) for k in unreadable]
    async with channels(broker, role, *writers, *readers) as (spy, *rest):
        writer_channels, reader_channels = rest[: len(unreadable)], rest[len(unreadable):]
        spied = [await spy.subscribe(TOPICS[k]) for k in unreadable]  # mosquitto grants it ...
        legit = [await r.subscribe(TOPICS[k]) for k, r in zip(unreadable, reader_channels)]
        for kind, writer in zip(unreadable, writer_channels):
            await writer.publish(TOPICS[kind], b"secret " + kind.encode())
        for kind, sub in zip(unreadable, legit):
            await expect(sub, b"secret " + kind.encode())  # ... the message exists ...
        await settled((role, spy))
        got = {k: s.get_nowait_all() for k, s in zip(unreadable, spied)}
        assert {k: v for k, v in got.items() if v} == {}  # ... but never reaches the spy


async def test_a_client_does_not_see_other_clients_reports(broker):
    async with channels(broker, "client", "device-2", "shuffler") as (spy, device, shuffler):
        spied = await spy.subscribe(TOPICS["reports"])
        admitted = await shuffler.subscribe(TOPICS["reports"])
        await device.publish(TOPICS["reports"], b"device-2's sealed report")
        await expect(admitted, b"device-2's sealed report")
        await settled(("client", spy))
        assert spied.get_nowait_all() == []


async def test_the_analyzer_cannot_read_reports(broker):
    async with channels(broker, "analyzer", "client", "shuffler") as (analyzer, client, shuffler):
        spied = await analyzer.subscribe(TOPICS["reports"])
        admitted = await shuffler.subscribe(TOPICS["reports"])
        await client.publish(TOPICS["reports"], b"report")
        await expect(admitted, b"report")
        await settled(("analyzer", analyzer))
        assert spied.get_nowait_all() == []


async def test_a_client_cannot_forge_batches_specs_or_announcements(broker):
    async with channels(broker, "client", "analyzer", "shuffler", "device-2") as (forger, analyzer, shuffler, other):
        batch = await analyzer.subscribe(TOPICS["batch"])
        announce = await shuffler.subscribe(TOPICS["announce"])
        spec = await other.subscribe(TOPICS["spec"])
        reports = await shuffler.subscribe(TOPICS["reports"])
        for kind in ("batch", "announce", "spec"):
            await forger.publish(TOPICS[kind], b"forged")
        await forger.publish(TOPICS["reports"], b"control")
        await expect(reports, b"control")
        await settled(("analyzer", analyzer), ("shuffler", shuffler), ("client", other))
        assert (batch.get_nowait_all(), announce.get_nowait_all(), spec.get_nowait_all()) == ([], [], [])


async def test_a_retained_report_is_never_delivered_to_a_later_subscription(mosquitto):
    """Without the per-role broker limits (no C compiler or mosquitto headers where the broker
    runs), mosquitto 2.0 lets a client account publish retained on a reports topic and replays
    it to every later subscriber; the channel drops a report that arrives retained, counts
    it, and still delivers the live report published after it (the control message). This is
    the channel's own defence, so the broker here runs without the plugin."""
    topic = ch.reports_topic(SESSION, 7)
    async with Broker(users=BrokerUsers.default(("client", "device-2")), role_limits=False) as unlimited, \
            channels(unlimited, "client", "shuffler") as (client, shuffler):
        await client.publish(topic, b"planted, retained", retain=True)  # acknowledged: the broker holds it
        admitted = await shuffler.subscribe(topic)
        await client.publish(topic, b"a live report")
        await expect(admitted, b"a live report")
        await settled(("shuffler", shuffler))
        assert admitted.get_nowait_all() == []
        assert shuffler.dropped_retained[topic] == 1
        await client.publish(topic, b"", retain=True)  # clear the broker's retained copy
