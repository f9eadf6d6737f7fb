"""Fixtures for the MQTT tests: real mosquitto brokers.

``broker`` is an authenticated TLS broker made by :class:`shuffledp.broker.Broker`
(ACL from TOPIC_ACCESS) shared by a module's tests; ``fresh_broker`` is a private one
for tests that stop and restart it. ``mosquitto`` is an anonymous plaintext broker,
kept only for the simulation test: ``shuffledp simulate --broker`` has no way to pass
credentials or a CA yet.

The MQTT tests are part of the suite: a missing broker is a failure, not a skip
(``scripts/test.sh`` installs mosquitto). Set SHUFFLEDP_SKIP_MQTT=1 to skip them on
a machine without one.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time

import pytest

from shuffledp.broker import Broker, BrokerError, BrokerUsers, find_binary, free_port

#: Accounts of the test brokers: the three roles, and two more client devices.
CLIENT_USERS = ("client", "device-2")


def _mosquitto_binary() -> str:
    try:
        return find_binary("mosquitto")
    except BrokerError as exc:
        if os.environ.get("SHUFFLEDP_SKIP_MQTT") == "1":
            pytest.skip(f"{exc} and SHUFFLEDP_SKIP_MQTT=1")
        pytest.fail(f"{exc}; or set SHUFFLEDP_SKIP_MQTT=1")


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


@pytest.fixture(scope="session")
def mosquitto(tmp_path_factory) -> str:
    """An anonymous plaintext mosquitto on a free loopback port; yields ``"127.0.0.1:PORT"``."""
    binary = _mosquitto_binary()
    port = free_port()
    directory = tmp_path_factory.mktemp("mosquitto")
    conf = directory / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
    log = directory / "mosquitto.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([binary, "-c", str(conf)], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                pytest.fail(f"mosquitto did not start on port {port}: {log.read_text(errors='replace')}")
            time.sleep(0.05)
    yield f"127.0.0.1:{port}"
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
