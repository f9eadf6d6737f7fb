"""A service's first connection to the broker is retried with back-off, for a bounded time.

``shuffledp up`` starts mosquitto, then the shuffler, the fleet and the analyzer; a broker
that restarts (or is still coming up) while they make their first connection used to end
them at once ("connection refused", exit 1), and ``up`` with them. Each service now tries
its first connection again with jittered exponential back-off, for up to ``--connect-retry``
seconds (30 by default), logging one line per failed attempt. What cannot be a transient
outage is never retried: refused credentials, a certificate that fails verification.

The tests start each service before its broker exists, wait for the service's retry line,
start the broker, and wait for the line the service logs once connected (events, with a
safety timeout; no sleeps).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shuffledp.deploy.broker import Broker, BrokerUsers
from shuffledp.deploy.keys import init_keys
from shuffledp.protocol.errors import TransportError
from shuffledp.protocol.transport.mqtt_channel import MqttChannel

pytestmark = pytest.mark.mqtt

CLI = [sys.executable, "-m", "shuffledp.cli"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
USERS = 4

#: Each service: its command (after --keys and the broker options), its broker role, and the line it logs once connected.
SERVICES = {
    "shuffler serve": (["shuffler", "serve"], "shuffler", "serving session"),
    "clients run": (["clients", "run", "--users", str(USERS)], "client", "waiting for rounds"),
    "analyzer run": (["analyzer", "run", "--users", str(USERS), "--round-timeout", "60"], "analyzer", "scalar-mean with min_batch"),
}


def _options(broker: Broker, tmp_path: Path, role: str) -> list[str]:
    options = broker.channel_options(role)
    secret = tmp_path / f"{role}.password"
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"{options['password']}\n")
    return ["--broker", f"{broker.host}:{broker.port}", "--ca-file", str(broker.ca_file),
            "--username", str(options["username"]), "--password-file", str(secret)]


def _wait_for_line(process: subprocess.Popen, log: Path, text: str, timeout: float) -> str:
    """The log once it holds ``text``; fails at once if the process exits first (with its log)."""
    deadline = time.monotonic() + timeout
    while True:
        content = log.read_text(errors="replace")
        if text in content:
            return content
        if process.poll() is not None:
            raise AssertionError(f"the process exited with status {process.returncode} before logging {text!r}:\n{content}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {text!r} within {timeout} s:\n{content}")
        time.sleep(0.05)


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_a_service_started_before_its_broker_connects_once_the_broker_is_up(service, tmp_path, mosquitto):
    command, role, connected = SERVICES[service]
    broker = Broker(tmp_path / "broker", users=BrokerUsers.default())
    broker.write_files()  # keys, passwords and the CA exist; nothing listens on the port yet
    init_keys(tmp_path / "keys", clients=USERS)
    extra = ["--spool", str(tmp_path / "spool.db")] if service == "shuffler serve" else []
    log = tmp_path / "service.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([*CLI, *command, "--keys", str(tmp_path / "keys"), *_options(broker, tmp_path, role), *extra],
                                   stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=ENV)
    try:
        _wait_for_line(process, log, "trying again", 20)  # its first attempt failed, and it said so
        broker.start()  # returns once the TLS listener accepts connections
        content = _wait_for_line(process, log, connected, 30)
        process.send_signal(signal.SIGTERM)
        process.wait(30)
        content = log.read_text(errors="replace")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        broker.close()
    assert "connection refused" in content.lower() and "Traceback" not in content, content


async def test_refused_credentials_are_not_retried(broker):
    options = {**broker.channel_options("shuffler"), "password": "not the password"}
    channel = MqttChannel(broker.host, broker.port, first_connect_retry=30.0, **options)
    started = time.monotonic()
    with pytest.raises(TransportError, match="not authorised"):
        await asyncio.wait_for(channel.connect(), 20)
    assert time.monotonic() - started < 10  # refused at once, not retried for 30 s


async def test_a_channel_retries_its_first_connection_until_the_broker_listens(tmp_path, mosquitto):
    broker = Broker(tmp_path / "broker", users=BrokerUsers.default())
    broker.write_files()
    channel = MqttChannel(broker.host, broker.port, first_connect_retry=30.0, max_backoff=0.5,
                          **broker.channel_options("analyzer"))
    connecting = asyncio.create_task(channel.connect())
    try:
        deadline = time.monotonic() + 20
        while channel.last_error is None:  # until the first attempt failed: the broker is not there yet
            assert not connecting.done(), connecting.exception()
            assert time.monotonic() < deadline, "no failed first attempt"
            await asyncio.sleep(0.02)
        assert "refused" in channel.last_error
        await asyncio.to_thread(broker.start)
        await asyncio.wait_for(connecting, 30)
        assert channel.connected
    finally:
        connecting.cancel()
        await asyncio.gather(connecting, return_exceptions=True)
        await channel.close()
        broker.close()


async def test_a_first_connection_that_keeps_failing_gives_up_after_its_bound_with_one_line(tmp_path, mosquitto):
    broker = Broker(tmp_path / "broker", users=BrokerUsers.default())  # never started
    broker.write_files()
    channel = MqttChannel(broker.host, broker.port, first_connect_retry=0.5, max_backoff=0.2,
                          **broker.channel_options("analyzer"))
    with pytest.raises(TransportError) as refused:
        await asyncio.wait_for(channel.connect(), 20)
    message = str(refused.value)
    assert "refused" in message and "0.5 s" in message and "\n" not in message, message
    broker.close()
