"""The broker's MQTT-over-WebSocket listener (``Broker(websocket=True)``, ``wss://``), through a real mosquitto.

Devices in web pages reach the broker over WebSocket with TLS. The listener must not be
a way around anything the TCP listener enforces: the same password file, ACL and per-role
limits apply on it (``per_listener_settings false`` makes them broker-wide). Each test
pairs a refused message with a control that arrives, so none can pass because nothing
gets through; the subscriber is a service on the TCP listener, so every control also
shows that messages cross between the two listeners.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl

import aiomqtt
import pytest
from aiomqtt.exceptions import MqttError

from shuffledp.deploy.broker import ROLE_CONNECTIONS, Broker, BrokerError, BrokerUsers, find_binary, mosquitto_conf
from shuffledp.protocol.transport.channel import announce_topic, batch_topic, reports_topic
from shuffledp.protocol.transport.mqtt_channel import MqttChannel
from shuffledp.protocol.wire import codec

pytestmark = pytest.mark.mqtt

WAIT = 5.0  # seconds for a message that must arrive
SETTLE = 0.3  # seconds after the control during which a refused message would have shown up


@pytest.fixture(scope="module")
def broker():
    """A broker with the WebSocket listener and the per-role limits."""
    try:
        find_binary("mosquitto")
    except BrokerError as exc:
        if os.environ.get("SHUFFLEDP_SKIP_MQTT") == "1":
            pytest.skip(f"{exc} and SHUFFLEDP_SKIP_MQTT=1")
        pytest.fail(f"{exc}; or set SHUFFLEDP_SKIP_MQTT=1")
    b = Broker(users=BrokerUsers.default(("client", "device-2")), websocket=True)
    b.start()
    yield b
    b.close()


def over_websocket(broker: Broker, account: str, *, password: str | None = None, tls: ssl.SSLContext | None = None,
                   identifier: str | None = None) -> aiomqtt.Client:
    """A raw MQTT client of ``account`` on the WebSocket listener (TLS verified against the broker's CA)."""
    options = broker.channel_options(account)
    return aiomqtt.Client(
        broker.host, broker.websocket_port, username=options["username"],
        password=password if password is not None else options["password"],
        tls_context=tls if tls is not None else ssl.create_default_context(cafile=str(broker.ca_file)),
        transport="websockets", identifier=identifier or f"ws-{os.urandom(8).hex()}",
    )


def over_tcp(broker: Broker, account: str) -> MqttChannel:
    return MqttChannel(broker.host, broker.port, **broker.channel_options(account))


async def get(subscription, timeout: float = WAIT) -> bytes:
    return await asyncio.wait_for(subscription.get(), timeout)


def test_the_listener_is_written_only_when_asked_with_the_main_listener_s_tls(tmp_path):
    off = Broker(tmp_path / "off")
    off.write_files()
    assert off.websocket_port is None and off.websocket_url is None
    assert "websockets" not in off.conf_file.read_text()

    on = Broker(tmp_path / "on", websocket=True)
    on.write_files()
    conf = on.conf_file.read_text()
    assert "per_listener_settings false" in conf.splitlines()  # auth, ACL and plugin are broker-wide
    block = conf.split(f"listener {on.websocket_port} 127.0.0.1\n")[1].split("\n\n")[0].splitlines()
    assert block == ["protocol websockets", f"cafile {on.ca_file}", f"certfile {on.directory / 'server.crt'}",
                     f"keyfile {on.directory / 'server.key'}", "require_certificate false", "tls_version tlsv1.2"]
    assert on.websocket_url == f"wss://127.0.0.1:{on.websocket_port}/"
    assert '"websocket_url"' in on.credentials_file.read_text()

    fixed = Broker(tmp_path / "fixed", websocket=18443)
    assert fixed.websocket_port == 18443
    with pytest.raises(ValueError):
        Broker(tmp_path / "bad", websocket=70000)


def test_conf_without_a_websocket_port_has_no_websocket_listener(tmp_path):
    broker = Broker(tmp_path / "b")
    broker.write_files()
    tls = broker._tls
    text = mosquitto_conf(host="127.0.0.1", port=1, tls=tls, password_file=tmp_path / "p", acl_file=tmp_path / "a")
    assert "websockets" not in text
    text = mosquitto_conf(host="127.0.0.1", port=1, tls=tls, password_file=tmp_path / "p", acl_file=tmp_path / "a",
                          websocket_port=2)
    assert "listener 2 127.0.0.1\nprotocol websockets\n" in text


async def test_a_client_account_connects_over_wss_and_its_report_reaches_the_shuffler_over_tcp(broker):
    topic = reports_topic(os.urandom(16), 1)
    async with over_tcp(broker, "shuffler") as shuffler, over_websocket(broker, "client") as device:
        subscription = await shuffler.subscribe(topic)
        await device.publish(topic, b"report over wss", qos=1)
        assert await get(subscription) == b"report over wss"


async def test_a_bad_password_and_an_unknown_ca_are_refused_over_wss(broker):
    with pytest.raises(MqttError) as refused:
        async with over_websocket(broker, "client", password="wrong"):
            pass
    assert "not authori" in str(refused.value).lower() or "bad user" in str(refused.value).lower(), str(refused.value)
    with pytest.raises(MqttError):  # the system's CAs do not know the broker's: the certificate does not verify
        async with over_websocket(broker, "client", tls=ssl.create_default_context()):
            pass
    async with over_websocket(broker, "client"):  # control: the right password and CA connect
        pass


async def test_an_oversized_publish_over_wss_is_dropped_and_one_at_the_limit_arrives(broker):
    assert broker.role_limits_on, broker.role_limits_off_reason
    topic = reports_topic(os.urandom(16), 2)
    limit = codec.MESSAGE_TYPES["envelope"][1]
    async with over_tcp(broker, "shuffler") as shuffler, over_websocket(broker, "client") as device:
        subscription = await shuffler.subscribe(topic)
        await device.publish(topic, b"a" * limit, qos=1)  # control: exactly at the limit
        await device.publish(topic, b"b" * (limit + 1), qos=1)
        await device.publish(topic, b"c" * (1 << 20), qos=1)
        await device.publish(topic, b"end", qos=1)  # in order after the refused ones
        assert await get(subscription) == b"a" * limit
        assert await get(subscription) == b"end"
        await asyncio.sleep(SETTLE)
        assert subscription.get_nowait_all() == []


async def test_the_acl_binds_a_client_over_wss(broker):
    session = os.urandom(16)
    reports, announce, batch = reports_topic(session, 3), announce_topic(session), batch_topic(session, 3)
    async with over_tcp(broker, "shuffler") as shuffler, over_tcp(broker, "analyzer") as analyzer, \
            over_websocket(broker, "client") as device:
        announces = await shuffler.subscribe(announce)
        reported = await shuffler.subscribe(reports)
        await device.subscribe(batch, qos=1)  # a client may not read batches: the broker never delivers them
        await device.publish(announce, b"forged spec", qos=1)  # a client may not write announcements
        await device.publish(reports, b"retained report", qos=1, retain=True)  # nor retain anything
        await device.publish(reports, b"control", qos=1)
        assert await get(reported) == b"control"
        await shuffler.publish(batch, b"a batch chunk")
        await analyzer.publish(announce, b"real spec")  # control: the analyzer may announce
        assert await get(announces) == b"real spec"

        async def first_on_device() -> str:
            async for message in device.messages:
                return str(message.topic)

        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(first_on_device(), SETTLE)
        await asyncio.sleep(SETTLE)
        assert reported.get_nowait_all() == []  # the retained publish was dropped, not relayed


async def test_connections_over_both_listeners_share_one_username_s_limit(broker):
    """The plugin counts connections per username broker-wide: WebSocket ones are not extra slots."""
    allowed = ROLE_CONNECTIONS["client"]
    topic = reports_topic(os.urandom(16), 4)
    async with over_tcp(broker, "shuffler") as shuffler, contextlib.AsyncExitStack() as stack:
        subscription = await shuffler.subscribe(topic)
        held = [await stack.enter_async_context(over_tcp(broker, "device-2")) for _ in range(allowed)]
        with pytest.raises(MqttError):
            async with over_websocket(broker, "device-2"):
                pass
        await held[0].publish(topic, b"held still works")  # control
        assert await get(subscription) == b"held still works"
        await held[0].close()
        async with over_websocket(broker, "device-2") as device:  # a slot is free again
            await device.publish(topic, b"wss after close", qos=1)
            assert await get(subscription) == b"wss after close"
