"""Who may connect: credentials and TLS are enforced, and refusals are typed errors."""

from __future__ import annotations

import time

import pytest

from shuffledp.protocol.errors import TransportError
from shuffledp.protocol.transport.mqtt_channel import MqttChannel

pytestmark = pytest.mark.mqtt


async def connect(broker, **options) -> None:
    async with MqttChannel(broker.host, broker.port, **options):
        pass


async def test_right_credentials_connect(broker):
    for role in ("analyzer", "shuffler", "client"):
        await connect(broker, **broker.channel_options(role))
    await connect(broker, **broker.channel_options("device-2"))


async def test_wrong_password_is_not_authorised(broker):
    options = broker.channel_options("analyzer") | {"password": "not-the-password"}
    with pytest.raises(TransportError, match="cannot connect.*not authorised"):
        await connect(broker, **options)


async def test_unknown_user_is_not_authorised(broker):
    _, password = broker.credentials("analyzer")
    with pytest.raises(TransportError, match="not authorised"):
        await connect(broker, username="mallory", password=password, tls_ca_file=broker.ca_file)


async def test_anonymous_is_not_authorised(broker):
    with pytest.raises(TransportError, match="not authorised"):
        await connect(broker, tls_ca_file=broker.ca_file)


async def test_plaintext_client_on_the_tls_port_fails(broker):
    username, password = broker.credentials("client")
    started = time.monotonic()
    with pytest.raises(TransportError, match="no answer to CONNECT.*tls_ca_file"):
        await connect(broker, username=username, password=password, connect_timeout=1.0)
    assert time.monotonic() - started < 5


async def test_broker_not_signed_by_our_ca_is_refused(broker, tmp_path):
    from shuffledp.deploy.broker import generate_tls

    other = generate_tls(tmp_path)  # a different CA
    options = broker.channel_options("client") | {"tls_ca_file": other.ca_file}
    with pytest.raises(TransportError, match="TLS certificate verification failed"):
        await connect(broker, **options)


async def test_missing_ca_file_is_a_typed_error(broker, tmp_path):
    options = broker.channel_options("client") | {"tls_ca_file": tmp_path / "nope.crt"}
    with pytest.raises(TransportError, match="CA file"):
        await connect(broker, **options)
