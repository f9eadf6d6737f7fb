"""Fixtures for the MQTT tests: real mosquitto brokers.

``broker`` is an authenticated TLS broker made by :class:`shuffledp.deploy.broker.Broker`
(ACL from TOPIC_ACCESS) shared by a module's tests; ``fresh_broker`` is a private one
for tests that stop and restart it. No test uses an anonymous broker: every party
connects with its role's password over TLS.

The MQTT tests are part of the suite: a missing broker is a failure, not a skip
(``scripts/test.sh`` installs mosquitto). Set SHUFFLEDP_SKIP_MQTT=1 to skip them on
a machine without one.
"""

from __future__ import annotations

import os

import pytest

from shuffledp.deploy.broker import Broker, BrokerError, BrokerUsers, find_binary

#: Accounts of the test brokers: the three roles, and two more client devices.
CLIENT_USERS = ("client", "device-2")


def _mosquitto_binary() -> str:
    """The mosquitto binary, or a failure (a skip with SHUFFLEDP_SKIP_MQTT=1)."""
    try:
        return find_binary("mosquitto")
    except BrokerError as exc:
        if os.environ.get("SHUFFLEDP_SKIP_MQTT") == "1":
            pytest.skip(f"{exc} and SHUFFLEDP_SKIP_MQTT=1")
        pytest.fail(f"{exc}; or set SHUFFLEDP_SKIP_MQTT=1")


@pytest.fixture
def mosquitto() -> str:
    """The mosquitto binary, for tests that start their own broker (a failure without one,
    unless SHUFFLEDP_SKIP_MQTT=1)."""
    return _mosquitto_binary()


def _start_broker() -> Broker:
    _mosquitto_binary()
    broker = Broker(users=BrokerUsers.default(CLIENT_USERS))
    broker.start()
    return broker


@pytest.fixture(scope="module")
def broker():
    """An authenticated TLS mosquitto for one test module (do not stop it)."""
    b = _start_broker()
    yield b
    b.close()


@pytest.fixture
def fresh_broker():
    """A private authenticated TLS mosquitto that the test may stop and restart."""
    b = _start_broker()
    yield b
    b.close()
