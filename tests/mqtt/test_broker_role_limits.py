"""Per-role broker limits (the ``shuffledp_roles`` mosquitto plugin), through a real broker.

Each test pairs a refused message with a control that arrives over the same broker,
so it cannot pass because nothing gets through. Every limit test fails on a broker
without the plugin: run this file with ``SHUFFLEDP_TEST_ROLE_LIMITS=off`` to see it
(the fixture then starts the broker with ``role_limits=False``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl

import aiomqtt
import pytest

import shuffledp.deploy.broker as broker_module
from shuffledp.deploy.broker import ROLE_CONNECTIONS, Broker, BrokerError, BrokerUsers, default_role_limits, find_binary
from shuffledp.protocol.wire import codec
from shuffledp.protocol.transport.channel import announce_topic, batch_topic, reports_topic
from shuffledp.protocol.errors import TransportError
from shuffledp.protocol.transport.mqtt_channel import MqttChannel
from shuffledp.protocol.wire.envelope_packing import envelopes_per_message
from shuffledp.protocol.wire.onion import envelope_format
from shuffledp.protocol.wire.report_format import MECHANISMS
from shuffledp.shuffler.service import DEFAULT_CHUNK_SIZE

pytestmark = pytest.mark.mqtt

WAIT = 5.0  # seconds for a message that must arrive
SETTLE = 0.3  # seconds after the control during which a refused message would have shown up


@pytest.fixture(scope="module")
def limited():
    """A broker with the per-role limits (the plugin off with SHUFFLEDP_TEST_ROLE_LIMITS=off)."""
    try:
        find_binary("mosquitto")
    except BrokerError as exc:
        if os.environ.get("SHUFFLEDP_SKIP_MQTT") == "1":
            pytest.skip(f"{exc} and SHUFFLEDP_SKIP_MQTT=1")
        pytest.fail(f"{exc}; or set SHUFFLEDP_SKIP_MQTT=1")
    off = os.environ.get("SHUFFLEDP_TEST_ROLE_LIMITS") == "off"
    b = Broker(users=BrokerUsers.default(("client", "device-2")), role_limits=not off)
    b.start()
    yield b
    b.close()


def connect(broker: Broker, account: str, **kwargs) -> MqttChannel:
    return MqttChannel(broker.host, broker.port, **broker.channel_options(account), **kwargs)


async def get(subscription, timeout: float = WAIT) -> bytes:
    return await asyncio.wait_for(subscription.get(), timeout)


async def retained_on(broker: Broker, account: str, topics: list[str]) -> dict[str, list[bytes]]:
    """Retained messages a *new* subscription of ``account`` gets on each topic (raw MQTT).

    The subscriptions are made in order; the last topic must hold a retained control
    message, whose arrival means the earlier topics' retained messages (sent before
    it on this connection) have arrived too.
    """
    options = broker.channel_options(account)
    tls = ssl.create_default_context(cafile=str(broker.ca_file))
    found: dict[str, list[bytes]] = {t: [] for t in topics}
    async with aiomqtt.Client(
        broker.host, broker.port, username=options["username"], password=options["password"],
        tls_context=tls, identifier=f"probe-{os.urandom(4).hex()}",
    ) as probe:
        for topic in topics:
            await probe.subscribe(topic, qos=1)

        async def collect() -> None:
            async for message in probe.messages:
                if message.retain:
                    found[str(message.topic)].append(bytes(message.payload))
                if str(message.topic) == topics[-1]:
                    return

        await asyncio.wait_for(collect(), WAIT)
        await asyncio.sleep(SETTLE)
    return found


def test_the_plugin_is_built_and_loaded(limited):
    assert limited.role_limits_on, limited.role_limits_off_reason
    status = json.loads(limited.credentials_file.read_text())["role_limits"]
    assert status["on"] and status["limits"]["client"]["max_connections"] == ROLE_CONNECTIONS["client"] == 2
    assert "shuffledp_roles: role client: payload <= 4096 bytes" in limited.log_tail(50)


def test_the_client_limit_is_the_envelope_codec_limit_with_headroom():
    """Largest envelope of any mechanism today < 400 bytes; the codec refuses > 4096."""
    limits = default_role_limits()
    largest = max(envelope_format(2**63 - 1, mechanism).size for mechanism in MECHANISMS)
    assert limits["client"].max_payload == codec.MESSAGE_TYPES["envelope"][1] == 4096
    assert largest * 8 < limits["client"].max_payload
    # so a publisher may pack at least 8 envelopes of any mechanism in one message (envelope_packing)
    assert envelopes_per_message(largest, limits["client"].max_payload) >= 8
    assert limits["client"].retain == () and limits["analyzer"].retain == ("shuffledp/+/announce",)
    assert set(limits["shuffler"].retain) == {"shuffledp/+/spec", "shuffledp/+/+/+/outcome"}


async def test_a_client_cannot_retain_while_the_analyzer_can(limited):
    session = os.urandom(16)
    reports, announce = reports_topic(session, 1), announce_topic(session)
    async with connect(limited, "shuffler") as live, connect(limited, "client") as client, connect(limited, "analyzer") as analyzer:
        subscription = await live.subscribe(reports)
        await client.publish(reports, b"retained report", retain=True)
        await client.publish(reports, b"plain report")  # control: the client account can publish here
        assert await get(subscription) == b"plain report"  # (the retained one was dropped, not relayed live)
        await analyzer.publish(announce, b"retained spec", retain=True)
    found = await retained_on(limited, "shuffler", [reports, announce])
    assert found[announce] == [b"retained spec"]  # control: the analyzer's retained spec replays
    assert found[reports] == []  # the client's did not stay in the broker


async def test_an_oversized_client_publish_is_dropped_and_one_at_the_limit_arrives(limited):
    topic = reports_topic(os.urandom(16), 2)
    limit = codec.MESSAGE_TYPES["envelope"][1]
    async with connect(limited, "shuffler") as live, connect(limited, "client") as client:
        subscription = await live.subscribe(topic)
        await client.publish(topic, b"a" * limit)  # control: exactly at the limit
        await client.publish(topic, b"b" * (limit + 1))
        await client.publish(topic, b"c" * (1 << 20))
        await client.publish(topic, b"end")  # in order after the refused ones
        assert await get(subscription) == b"a" * limit
        assert await get(subscription) == b"end"
        await asyncio.sleep(SETTLE)
        assert subscription.get_nowait_all() == []


async def test_a_client_username_over_its_connection_limit_is_refused_while_the_others_work(limited):
    topic = reports_topic(os.urandom(16), 3)
    allowed = ROLE_CONNECTIONS["client"]
    async with connect(limited, "shuffler") as live, contextlib.AsyncExitStack() as stack:
        subscription = await live.subscribe(topic)
        # A failed login does not hold one of the username's slots.
        with pytest.raises(TransportError, match="not authorised"):
            async with MqttChannel(limited.host, limited.port, **(limited.channel_options("device-2") | {"password": "wrong"})):
                pass
        first, *others = [await stack.enter_async_context(connect(limited, "device-2")) for _ in range(allowed)]
        with pytest.raises(TransportError, match="not authorised"):
            async with connect(limited, "device-2", reconnect=False):
                pass
        await first.publish(topic, b"first still works")  # control
        assert await get(subscription) == b"first still works"
        async with connect(limited, "client") as other:  # another username has its own slots
            await other.publish(topic, b"another device")
            assert await get(subscription) == b"another device"
        await first.close()
        # A slot is free again once a connection closed.
        async with connect(limited, "device-2") as again:
            await again.publish(topic, b"after close")
            assert await get(subscription) == b"after close"


async def test_a_device_reconnecting_with_its_client_id_takes_over_its_slot(limited):
    """MQTT session takeover (same client id) is not one more connection, even at the limit."""
    options = limited.channel_options("device-2")
    tls = ssl.create_default_context(cafile=str(limited.ca_file))
    topic = reports_topic(os.urandom(16), 4)

    def device(identifier: str) -> aiomqtt.Client:
        return aiomqtt.Client(limited.host, limited.port, username=options["username"], password=options["password"],
                              tls_context=tls, identifier=identifier)

    async with connect(limited, "shuffler") as live, contextlib.AsyncExitStack() as stack:
        subscription = await live.subscribe(topic)
        for _ in range(ROLE_CONNECTIONS["client"] - 1):
            await stack.enter_async_context(connect(limited, "device-2"))
        old = device("device-2-phone")
        await old.__aenter__()  # the username is now at its limit
        try:
            async with device("device-2-phone") as new:  # the broker closes the old connection
                await new.publish(topic, b"after takeover", qos=1)
                assert await get(subscription) == b"after takeover"
                with pytest.raises(aiomqtt.MqttError, match="[Nn]ot authori[sz]ed"):
                    async with device("device-2-tablet"):  # still at the limit: refused
                        pass
        finally:
            try:
                await old.__aexit__(None, None, None)
            except aiomqtt.MqttError:
                pass


def raw_client(broker: Broker, account: str, identifier: str) -> aiomqtt.Client:
    """A plain aiomqtt client of ``account`` with the MQTT client id ``identifier``."""
    options = broker.channel_options(account)
    tls = ssl.create_default_context(cafile=str(broker.ca_file))
    return aiomqtt.Client(broker.host, broker.port, username=options["username"], password=options["password"],
                          tls_context=tls, identifier=identifier)


async def close_quietly(client: aiomqtt.Client) -> None:
    """Leave ``client``'s context; it may have been disconnected by a takeover meanwhile."""
    with contextlib.suppress(aiomqtt.MqttError):
        await client.__aexit__(None, None, None)


#: For each service role: a topic it reads and the account that publishes there.
SERVICE_INBOX = {
    "shuffler": (lambda session: reports_topic(session, 7), "client"),
    "analyzer": (lambda session: batch_topic(session, 7), "shuffler"),
}


@pytest.mark.parametrize("service", sorted(SERVICE_INBOX))
async def test_a_client_account_cannot_take_over_a_service_s_client_id(limited, service):
    """mosquitto closes the connection that holds a client id when another connects with it,
    whoever that is: with the plugin a client account is refused instead, and the service
    stays connected and keeps receiving."""
    topic_of, publisher = SERVICE_INBOX[service]
    topic = topic_of(os.urandom(16))
    identifier = f"shuffledp-{service}-{os.getpid()}-{os.urandom(3).hex()}"
    # reconnect=False: a service knocked off would be dead, not quietly reconnected.
    async with connect(limited, service, identifier=identifier, reconnect=False) as victim, \
            connect(limited, publisher) as source:
        inbox = await victim.subscribe(topic)
        await source.publish(topic, b"before")  # control: the service receives
        assert await get(inbox) == b"before"
        for account in ("client", "device-2"):
            for _ in range(3):  # a takeover loop gets nowhere either
                with pytest.raises(aiomqtt.MqttError, match="[Nn]ot authori[sz]ed"):
                    async with raw_client(limited, account, identifier):
                        pass
        async with raw_client(limited, "client", f"{identifier}-other") as own:  # control: the account works
            await own.publish(reports_topic(os.urandom(16), 7), b"own client id", qos=1)
        await source.publish(topic, b"after the attempts")
        assert await get(inbox) == b"after the attempts"
        assert victim.connected and victim.reconnects == 0


async def test_a_service_reconnecting_with_its_own_client_id_still_takes_over(limited):
    """The rule is per username: the shuffler's account replaces its own (stale) connection."""
    topic = reports_topic(os.urandom(16), 8)
    identifier = f"shuffledp-shuffler-{os.getpid()}-{os.urandom(3).hex()}"
    old = raw_client(limited, "shuffler", identifier)
    await old.__aenter__()
    try:
        with pytest.raises(aiomqtt.MqttError, match="[Nn]ot authori[sz]ed"):  # another username: refused
            async with raw_client(limited, "client", identifier):
                pass
        async with connect(limited, "shuffler", identifier=identifier, reconnect=False) as new, \
                connect(limited, "client") as client:
            inbox = await new.subscribe(topic)
            await client.publish(topic, b"to the new connection")
            assert await get(inbox) == b"to the new connection"
            # It was a takeover: the broker closed the old connection.
            assert f"Client {identifier} already connected, closing old connection." in limited.log_tail(200)
            assert new.connected and new.reconnects == 0
    finally:
        await close_quietly(old)


async def test_refused_and_same_user_takeovers_leave_the_connection_counts_right(limited):
    """Refused logins hold no slot; a takeover's closing of the old connection frees the old
    slot and only that: afterwards the limit admits exactly its number, and no more."""
    topic = reports_topic(os.urandom(16), 9)
    allowed = ROLE_CONNECTIONS["client"]
    service_id = f"shuffledp-shuffler-{os.getpid()}-{os.urandom(3).hex()}"
    async with connect(limited, "shuffler", identifier=service_id, reconnect=False) as live:
        inbox = await live.subscribe(topic)
        for _ in range(2 * allowed + 1):  # more refusals than the username has slots
            with pytest.raises(aiomqtt.MqttError, match="[Nn]ot authori[sz]ed"):
                async with raw_client(limited, "device-2", service_id):
                    pass
        async with contextlib.AsyncExitStack() as stack:
            # device-2 connects, then reconnects twice with the same client id (takeovers).
            old = raw_client(limited, "device-2", "device-2-a")
            await old.__aenter__()
            stack.push_async_callback(close_quietly, old)
            for _ in range(2):
                again = raw_client(limited, "device-2", "device-2-a")
                await again.__aenter__()
                stack.push_async_callback(close_quietly, again)
            await again.publish(topic, b"after takeovers", qos=1)  # control
            assert await get(inbox) == b"after takeovers"
            for n in range(1, allowed):  # the username's other slots are all free
                extra = raw_client(limited, "device-2", f"device-2-extra-{n}")
                await extra.__aenter__()
                stack.push_async_callback(close_quietly, extra)
                await extra.publish(topic, f"extra {n}".encode(), qos=1)
                assert await get(inbox) == f"extra {n}".encode()
            with pytest.raises(aiomqtt.MqttError, match="[Nn]ot authori[sz]ed"):  # and then it is full
                async with raw_client(limited, "device-2", "device-2-one-too-many"):
                    pass
            with pytest.raises(aiomqtt.MqttError, match="[Nn]ot authori[sz]ed"):  # full, and not its id
                async with raw_client(limited, "device-2", service_id):
                    pass
        await asyncio.sleep(SETTLE)  # the broker notices the closes
        # All closed: the username's whole allowance is free again.
        async with contextlib.AsyncExitStack() as stack:
            for n in range(allowed):
                await stack.enter_async_context(connect(limited, "device-2", reconnect=False))
            with pytest.raises(TransportError, match="not authorised"):
                async with connect(limited, "device-2", reconnect=False):
                    pass
        await asyncio.sleep(SETTLE)
        assert live.connected and live.reconnects == 0


async def test_each_service_role_s_largest_message_arrives_and_one_byte_more_does_not(limited):
    spec_limit = codec.MESSAGE_TYPES["signed-round-spec"][1]
    assert limited.role_limits is None or limited.role_limits["analyzer"].max_payload == spec_limit
    # The largest chunk a default shuffler publishes: DEFAULT_CHUNK_SIZE payloads of the
    # largest sealed report the codec admits (256-byte report + 48 bytes HPKE, 3-byte header).
    chunk = os.urandom(DEFAULT_CHUNK_SIZE * (codec.MESSAGE_TYPES["report"][1] + 48 + 3) + 200)
    session = os.urandom(16)
    announce, batch = announce_topic(session), batch_topic(session, 5)
    async with connect(limited, "shuffler") as shuffler, connect(limited, "analyzer") as analyzer:
        specs = await shuffler.subscribe(announce)
        batches = await analyzer.subscribe(batch)
        await analyzer.publish(announce, b"s" * (spec_limit + 1))
        await analyzer.publish(announce, b"s" * spec_limit)  # control
        assert await get(specs) == b"s" * spec_limit
        await shuffler.publish(batch, chunk)
        assert await get(batches, 30) == chunk
        await asyncio.sleep(SETTLE)
        assert specs.get_nowait_all() == []


async def test_the_plugin_narrows_the_acl_and_the_password_file_never_widens_them(limited):
    """With the plugin loaded, the ACL and the password file still refuse what they refuse."""
    assert limited.role_limits_on
    topic, foreign = reports_topic(os.urandom(16), 6), announce_topic(os.urandom(16))
    async with connect(limited, "shuffler") as live, connect(limited, "client") as client:
        reports, specs = await live.subscribe(topic), await live.subscribe(foreign)
        await client.publish(foreign, b"client on the analyzer's topic")  # the ACL refuses
        await client.publish(topic, b"control")
        assert await get(reports) == b"control"
        await asyncio.sleep(SETTLE)
        assert specs.get_nowait_all() == []
    with pytest.raises(TransportError, match="not authorised"):
        async with MqttChannel(limited.host, limited.port, **(limited.channel_options("analyzer") | {"password": "wrong"})):
            pass


def test_without_a_compiler_the_broker_runs_without_limits_and_says_so(tmp_path, monkeypatch, capfd, mosquitto):
    fake_cc = tmp_path / "cc"
    fake_cc.write_text("#!/bin/sh\necho 'fatal error: mosquitto_broker.h: No such file or directory' >&2\nexit 1\n")
    fake_cc.chmod(0o755)
    monkeypatch.setattr(broker_module, "_built_plugins", {})
    monkeypatch.setenv("CC", str(fake_cc))
    with Broker(tmp_path / "headers") as b:
        assert not b.role_limits_on and "mosquitto-dev" in b.role_limits_off_reason
        assert "plugin" not in b.conf_file.read_text()
    monkeypatch.setattr(broker_module, "find_compiler", lambda: None)
    with Broker(tmp_path / "nocc") as b:
        assert not b.role_limits_on and "no C compiler" in b.role_limits_off_reason
        assert json.loads(b.credentials_file.read_text())["role_limits"]["on"] is False
    lines = [line for line in capfd.readouterr().err.splitlines() if "per-role broker limits are OFF" in line]
    assert len(lines) == 2 and all("apt-get install mosquitto-dev libmosquitto-dev gcc" in line for line in lines)


def test_the_command_line_reports_whether_limits_are_on(tmp_path, mosquitto, capsys):
    assert broker_module.main([str(tmp_path / "on"), "--port", "0"]) == 0
    assert "per-role limits ON (" in capsys.readouterr().out
    assert broker_module.main([str(tmp_path / "off"), "--port", "0", "--no-role-limits"]) == 0
    assert "per-role limits OFF" in capsys.readouterr().out
