"""A client account's other ways around the per-role plugin's login rules.

Through a real mosquitto with the plugin and its WebSocket listener. The rules under test
(``shuffledp/deploy/broker_plugin/shuffledp_roles.c``): client accounts speak MQTT 3.1.1 or 3.1
with a clean session only, and hold at most ``max_connections`` connections per username. Each
refusal is paired with a control the broker accepts over the same path.

* MQTT 5 over the WebSocket listener (``per_listener_settings false``: the plugin binds it too);
* MQTT 3.1 (protocol version 3, ``MQIsdp``) with clean session off: a kept session by the older
  protocol, written by hand here (no client library speaks it any more);
* logins refused for a wrong password leave no connection on the books: someone who knows only
  a fleet's username cannot use up its connections;
* a will message on the reports topic over the role's payload limit, or retained, never
  reaches a reader when the connection drops.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl

import aiomqtt
import pytest
from aiomqtt.exceptions import MqttError

from shuffledp.deploy.broker import Broker, BrokerUsers, default_role_limits
from shuffledp.protocol.transport.channel import reports_topic
from shuffledp.protocol.transport.mqtt_channel import MqttChannel

pytestmark = pytest.mark.mqtt

WAIT = 5.0


@pytest.fixture(scope="module")
def ws_broker(tmp_path_factory):
    broker = Broker(tmp_path_factory.mktemp("ws-broker"), users=BrokerUsers.default(("client",)), websocket=True)
    broker.start()
    yield broker
    broker.close()


def _tls(broker: Broker) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(broker.ca_file))


def ws_client(broker: Broker, account: str, **options) -> aiomqtt.Client:
    credentials = broker.channel_options(account)
    return aiomqtt.Client(
        broker.host, broker.websocket_port, username=credentials["username"], password=credentials["password"],
        transport="websockets", websocket_path="/", tls_context=_tls(broker),
        identifier=f"ws-{account}-{os.urandom(6).hex()}", timeout=WAIT, **options,
    )


def refused(exc: MqttError) -> bool:
    return "authori" in str(exc).lower()


async def test_a_client_account_cannot_use_mqtt5_over_the_websocket_listener(ws_broker):
    with pytest.raises(MqttError) as excinfo:
        async with ws_client(ws_broker, "client", protocol=aiomqtt.ProtocolVersion.V5):
            pass
    assert refused(excinfo.value), excinfo.value
    async with ws_client(ws_broker, "client", protocol=aiomqtt.ProtocolVersion.V311, clean_session=True):
        pass  # control: MQTT 3.1.1 with a clean session over the same listener
    async with ws_client(ws_broker, "shuffler", protocol=aiomqtt.ProtocolVersion.V5):
        pass  # control: a service account may use MQTT 5 there


async def test_a_client_account_cannot_keep_a_session_over_the_websocket_listener(ws_broker):
    with pytest.raises(MqttError) as excinfo:
        async with ws_client(ws_broker, "client", protocol=aiomqtt.ProtocolVersion.V311, clean_session=False):
            pass
    assert refused(excinfo.value), excinfo.value


# --------------------------------------------------------------------------- hand-written CONNECTs


def _string(data: bytes) -> bytes:
    return len(data).to_bytes(2, "big") + data


def _length(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def connect_packet(client_id: str, username: str, password: str, *, version: int = 4, clean: bool = True,
                   will: tuple[str, bytes, bool] | None = None) -> bytes:
    """An MQTT 3.1 (``version`` 3) or 3.1.1 (4) CONNECT; ``will``: (topic, payload, retain) at QoS 1."""
    flags = 0x80 | 0x40 | (0x02 if clean else 0)
    payload = _string(client_id.encode())
    if will is not None:
        topic, message, retain = will
        flags |= 0x04 | 0x08 | (0x20 if retain else 0)
        payload += _string(topic.encode()) + _string(message)
    payload += _string(username.encode()) + _string(password.encode())
    variable = _string(b"MQIsdp" if version == 3 else b"MQTT") + bytes([version, flags]) + (60).to_bytes(2, "big")
    body = variable + payload
    return b"\x10" + _length(len(body)) + body


def _read_exactly(sock: ssl.SSLSocket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        more = sock.recv(n - len(data))
        if not more:
            return data
        data += more
    return data


def hand_connect(broker: Broker, packet: bytes) -> tuple[int | None, ssl.SSLSocket]:
    """Send ``packet`` over TLS; the CONNACK's return code (None: closed without one) and the socket."""
    raw = socket.create_connection((broker.host, broker.port), timeout=WAIT)
    sock = _tls(broker).wrap_socket(raw, server_hostname=broker.host)
    sock.sendall(packet)
    head = _read_exactly(sock, 4)
    return (head[3] if len(head) == 4 and head[0] == 0x20 else None), sock


def _password(broker: Broker, account: str) -> str:
    return str(broker.channel_options(account)["password"])


def test_a_client_account_cannot_keep_a_session_with_mqtt_3_1(ws_broker):
    ident = f"v31-{os.urandom(6).hex()}"
    code, sock = hand_connect(ws_broker, connect_packet(ident, "client", _password(ws_broker, "client"), version=3, clean=False))
    sock.close()
    assert code == 5, f"MQTT 3.1 with clean session off: CONNACK {code}"  # 5: not authorised
    code, sock = hand_connect(ws_broker, connect_packet(ident, "client", _password(ws_broker, "client"), version=3, clean=True))
    sock.close()
    assert code == 0, f"control, MQTT 3.1 with a clean session: CONNACK {code}"


async def test_refused_logins_under_a_client_username_use_up_none_of_its_connections(ws_broker):
    limit = default_role_limits()["client"].max_connections
    for i in range(limit + 2):  # someone who knows the username only
        code, sock = hand_connect(ws_broker, connect_packet(f"guess-{i}-{os.urandom(4).hex()}", "client", "wrong"))
        sock.close()
        assert code == 5
    channels = [MqttChannel(ws_broker.host, ws_broker.port, **ws_broker.channel_options("client")) for _ in range(limit)]
    try:
        for channel in channels:
            await channel.connect()  # the account's own connections, all of them
    finally:
        for channel in channels:
            await channel.close()


async def test_a_client_account_s_will_over_its_limit_or_retained_reaches_no_reader(ws_broker):
    limit = default_role_limits()["client"].max_payload
    topic = reports_topic(os.urandom(16), 1)
    async with MqttChannel(ws_broker.host, ws_broker.port, **ws_broker.channel_options("shuffler")) as reader:
        reports = await reader.subscribe(topic)
        wills = [(topic, b"w" * (limit + 1), False), (topic, b"r", True)]
        for i, will in enumerate(wills):
            for sent in (will, (topic, f"control {i}".encode(), False)):  # each refused will, then a control
                code, sock = hand_connect(
                    ws_broker, connect_packet(f"will-{os.urandom(6).hex()}", "client", _password(ws_broker, "client"), will=sent))
                assert code == 0
                sock.close()  # no DISCONNECT: the broker sends the will (if its ACL and the plugin allow it)
            assert await asyncio.wait_for(reports.get(), WAIT) == f"control {i}".encode()  # nothing came before it
        assert reports.get_nowait_all() == []
