"""What a client account may leave in the broker: no MQTT 5 properties, no session after it leaves.

Through a real mosquitto with the per-role plugin (the ``broker`` fixture). Two ways a
client account could make the broker hold more than its payload limit and connection
limit allow:

* **MQTT 5 properties.** A PUBLISH carries user properties beside its payload, up to the
  broker's packet size; a payload limit that counts only the payload lets them through.
  Client accounts may not connect with MQTT 5 at all, and for the roles that may, the
  properties count toward the payload limit.
* **Offline sessions.** A session kept after its connection closes (MQTT 3.1.1 with clean
  session off, MQTT 5 with a session expiry) queues every message of its subscriptions;
  the connection limit counts only live connections. Client accounts get clean sessions
  only.

Each test pairs what it refuses with a control that arrives over the same broker.
"""

from __future__ import annotations

import asyncio
import os
import ssl

import aiomqtt
import pytest
from aiomqtt.exceptions import MqttError
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from shuffledp.deploy.broker import DEFAULT_MAX_QUEUED_BYTES, PERSISTENT_CLIENT_EXPIRATION, Broker, BrokerUsers, default_role_limits
from shuffledp.protocol.transport.channel import announce_topic, batch_topic, receipts_topic, reports_topic
from shuffledp.protocol.transport.mqtt_channel import MqttChannel

pytestmark = pytest.mark.mqtt

WAIT = 5.0  # seconds for a message that must arrive

#: Ways to ask the broker to keep a session after the connection closes: the options of the
#: connection that leaves it, and of the one that comes back for it.
_V5 = {"protocol": aiomqtt.ProtocolVersion.V5, "session_expiry": 3600}
PERSISTENT = {
    "mqtt311-clean-session-off": ({"clean_session": False}, {"clean_session": False}),
    "mqtt5-session-expiry": (_V5 | {"clean_start": False}, _V5 | {"clean_start": False}),
    # MQTT 5's clean start only discards an *earlier* session: the expiry keeps this one
    "mqtt5-clean-start-with-session-expiry": (_V5 | {"clean_start": True}, _V5 | {"clean_start": False}),
}


def raw(broker: Broker, account: str, identifier: str, *, session_expiry: int | None = None, **options) -> aiomqtt.Client:
    """A plain aiomqtt client of ``account`` (``options``: protocol, clean_session, clean_start)."""
    credentials = broker.channel_options(account)
    if session_expiry is not None:
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = session_expiry
        options["properties"] = properties
    return aiomqtt.Client(
        broker.host, broker.port, username=credentials["username"], password=credentials["password"],
        tls_context=ssl.create_default_context(cafile=str(broker.ca_file)), identifier=identifier, timeout=WAIT,
        **options,
    )


def v5(broker: Broker, account: str) -> aiomqtt.Client:
    return raw(broker, account, f"v5-{account}-{os.urandom(6).hex()}", protocol=aiomqtt.ProtocolVersion.V5)


def connect(broker: Broker, account: str, **options) -> MqttChannel:
    return MqttChannel(broker.host, broker.port, **broker.channel_options(account), **options)


def refused(exc: MqttError) -> bool:
    """Whether the broker refused the CONNECT as not authorised (MQTT 3.1.1 or 5 wording)."""
    return "authori" in str(exc).lower()


def user_properties(total: int, chunk: int = 60_000) -> Properties:
    """PUBLISH properties holding about ``total`` bytes of user properties (each at most ``chunk``)."""
    properties = Properties(PacketTypes.PUBLISH)
    pairs, left = [], total
    while left > 0:
        pairs.append((f"k{len(pairs)}", "v" * min(chunk, left)))
        left -= chunk
    properties.UserProperty = pairs
    return properties


def encoded_user_property(name: str, value: str) -> int:
    """Bytes of one user property in a PUBLISH: identifier, then two length-prefixed strings."""
    return 1 + 2 + len(name.encode()) + 2 + len(value.encode())


async def before(reader: aiomqtt.Client, control: bytes) -> list[bytes]:
    """Payloads ``reader`` receives before ``control`` (which must arrive within WAIT)."""
    seen: list[bytes] = []
    async with asyncio.timeout(WAIT):
        async for message in reader.messages:
            payload = bytes(message.payload)
            if payload == control:
                return seen
            seen.append(payload)
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------- properties


async def test_a_client_account_s_mqtt5_user_properties_reach_no_reader(broker):
    """1 byte of payload with 1.2 MB of user properties, from a client account, to a v5 reader."""
    topic = reports_topic(os.urandom(16), 1)
    async with v5(broker, "shuffler") as reader, connect(broker, "client") as control:
        await reader.subscribe(topic, qos=1)
        try:
            async with v5(broker, "client") as attacker:
                await attacker.publish(topic, b"x", qos=1, properties=user_properties(1_200_000))
        except MqttError as exc:  # refused at CONNECT: nothing of it can reach anyone
            assert refused(exc), exc
        await control.publish(topic, b"control")  # the client account reaches the reader over MQTT 3.1.1
        assert await before(reader, b"control") == []


async def test_a_client_account_connects_with_mqtt_3_1_1_and_a_clean_session_only(broker):
    topic = reports_topic(os.urandom(16), 2)
    with pytest.raises(MqttError) as excinfo:
        async with v5(broker, "client"):
            pass
    assert refused(excinfo.value), excinfo.value
    async with v5(broker, "shuffler") as reader:  # a service account may use MQTT 5
        await reader.subscribe(topic, qos=1)
        # what the device clients ask for (protocol/transport/mqtt_channel.py, js/src/transport/mqtt.ts):
        # MQTT 3.1.1 with a clean session
        async with raw(broker, "client", f"device-{os.urandom(6).hex()}", protocol=aiomqtt.ProtocolVersion.V311,
                       clean_session=True) as device:
            await device.publish(topic, b"control", qos=1)
        assert await before(reader, b"control") == []


async def test_mqtt5_properties_count_toward_a_role_s_payload_limit(broker):
    """The analyzer may use MQTT 5; its limit (the signed spec's, 25 KiB) bounds payload plus properties."""
    limit = default_role_limits()["analyzer"].max_payload
    topic = announce_topic(os.urandom(16))
    name, value = "trace", "t" * 1000
    at_limit = Properties(PacketTypes.PUBLISH)
    at_limit.UserProperty = [(name, value)]
    room = limit - encoded_user_property(name, value)
    async with v5(broker, "shuffler") as reader, v5(broker, "analyzer") as analyzer:
        await reader.subscribe(topic, qos=1)
        await analyzer.publish(topic, b"a", qos=1, properties=user_properties(4 * limit))
        await analyzer.publish(topic, b"b" * (room + 1), qos=1, properties=at_limit)  # one byte over
        await analyzer.publish(topic, b"c" * room, qos=1, properties=at_limit)  # control: exactly at the limit
        assert await before(reader, b"c" * room) == []


# --------------------------------------------------------------------------- sessions


async def leave_a_session(broker: Broker, identifier: str, topic: str, persistent: dict, account: str = "client") -> bool:
    """``account`` asks for a persistent session, subscribes to ``topic`` at QoS 1 and
    disconnects. False if the broker refused the connection."""
    try:
        async with raw(broker, account, identifier, **persistent) as device:
            await device.subscribe(topic, qos=1)
    except MqttError as exc:
        assert refused(exc), exc
        return False
    return True


async def come_back(broker: Broker, identifier: str, topic: str, persistent: dict, shuffler: MqttChannel,
                    account: str = "client") -> list[bytes] | None:
    """Reconnect with the same client id and persistence; the messages the broker kept for the
    session (those delivered before a live control). None if the broker refused the connection."""
    try:
        async with raw(broker, account, identifier, **persistent) as device:
            await device.subscribe(topic, qos=1)
            await shuffler.publish(topic, b"live control")
            return await before(device, b"live control")
    except MqttError as exc:
        assert refused(exc), exc
        return None


@pytest.mark.parametrize("how", sorted(PERSISTENT))
async def test_a_client_account_leaves_no_session_behind(broker, how):
    """Disconnect, the shuffler publishes receipts, reconnect: the broker kept nothing."""
    leave, back = PERSISTENT[how]
    session = os.urandom(16)
    topic = receipts_topic(session, 1)
    identifier = f"device-{os.urandom(6).hex()}"
    kept = await leave_a_session(broker, identifier, topic, leave)
    async with connect(broker, "shuffler") as shuffler:
        await shuffler.publish(topic, b"receipts while the device was away")
        queued = await come_back(broker, identifier, topic, back, shuffler)
        assert (kept, queued) == (False, None), "the broker kept a client account's session"
        # control: the same account and client id with a clean session receive live messages
        async with connect(broker, "client", identifier=identifier) as device:
            receipts = await device.subscribe(topic)
            await shuffler.publish(topic, b"live receipts")
            assert await asyncio.wait_for(receipts.get(), WAIT) == b"live receipts"


def test_the_config_bounds_every_session_in_bytes_and_kept_sessions_in_time(tmp_path):
    broker = Broker(tmp_path)
    broker.write_files()
    conf = broker.conf_file.read_text().splitlines()
    assert f"max_queued_bytes {DEFAULT_MAX_QUEUED_BYTES}" in conf and DEFAULT_MAX_QUEUED_BYTES > 0
    assert f"persistent_client_expiration {PERSISTENT_CLIENT_EXPIRATION}" in conf
    assert "plugin_opt_client_mqtt5 0" in conf and "plugin_opt_client_persistent_sessions 0" in conf
    assert "plugin_opt_shuffler_mqtt5 1" in conf and "plugin_opt_analyzer_persistent_sessions 1" in conf


async def test_a_session_holds_at_most_max_queued_bytes(tmp_path, mosquitto):
    """A service account may keep a session (the analyzer, here); what the broker queues for it
    while it is away stops at ``max_queued_bytes``, as for a live connection that does not read."""
    limit, chunk = 64 * 1024, 16 * 1024
    async with Broker(tmp_path, users=BrokerUsers.default(), max_queued_bytes=limit) as small:
        topic = batch_topic(os.urandom(16), 1)
        identifier = f"analyzer-{os.urandom(6).hex()}"
        persistent = PERSISTENT["mqtt311-clean-session-off"][0]
        assert await leave_a_session(small, identifier, topic, persistent, account="analyzer")
        async with connect(small, "shuffler") as shuffler:
            for i in range(10):
                await shuffler.publish(topic, bytes([i]) * chunk)
            queued = await come_back(small, identifier, topic, persistent, shuffler, account="analyzer")
    assert queued is not None and queued == [bytes([i]) * chunk for i in range(len(queued))]
    assert 0 < len(queued) * chunk <= limit  # the first ones were kept, up to the limit, and no more
