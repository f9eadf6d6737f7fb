"""No third-party traceback reaches a party's terminal when the broker restarts under it.

aiomqtt drives paho from two threads: paho's blocking ``connect`` runs on an executor thread
and calls back into aiomqtt, which then touches the event loop's selector from that thread.
Around a broker restart this races with the loop (``KeyError: '7 is not registered'`` from
the selector), and the exception surfaces in three places: out of aiomqtt's connect (the
channel's reconnection used to let it through, and its supervisor died with a traceback),
in a loop callback (asyncio's exception handler prints a traceback), or in aiomqtt's own
log (``logger.exception`` on a SUBACK or UNSUBACK for a message id it no longer tracks).
The race is timing-dependent, so these tests raise the same exceptions at the same
boundaries, deterministically:

* the channel takes any failure of a connection attempt as one more failed attempt (one
  line), and goes on reconnecting;
* aiomqtt and paho log through the channel's own logger, which writes one line per record
  (the exception's type and text, never its traceback);
* the services' event-loop exception handler turns a socket callback's error, and an
  aiomqtt future's exception nobody retrieved, into one debug line.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiomqtt
import pytest

from shuffledp.cli.common import _closed_socket_callbacks
from shuffledp.deploy.keys import init_keys
from shuffledp.protocol.transport.mqtt_channel import MqttChannel

pytestmark = pytest.mark.mqtt

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}

#: Runs a shuffledp command whose second broker connection fails inside aiomqtt as the selector race does.
FLAKY_SECOND_CONNECTION = """
import sys
import aiomqtt
original = aiomqtt.Client.__aenter__
attempts = [0]
async def flaky(self):
    attempts[0] += 1
    if attempts[0] == 2:
        raise KeyError("7 is not registered")
    return await original(self)
aiomqtt.Client.__aenter__ = flaky
from shuffledp.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


async def _until_async(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def _no_traceback(caplog) -> None:
    noisy = [r for r in caplog.records if r.exc_info or r.stack_info or "Traceback" in r.getMessage()]
    assert not noisy, [f"{r.name}: {r.getMessage()}" for r in noisy]


async def test_a_reconnection_attempt_that_fails_inside_aiomqtt_is_one_more_attempt(fresh_broker, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    original = aiomqtt.Client.__aenter__
    attempts = [0]

    async def flaky(self):
        attempts[0] += 1
        if attempts[0] == 2:  # the first reconnection attempt
            raise KeyError("7 is not registered")
        return await original(self)

    monkeypatch.setattr(aiomqtt.Client, "__aenter__", flaky)
    channel = MqttChannel(fresh_broker.host, fresh_broker.port, max_backoff=0.2, **fresh_broker.channel_options("analyzer"))
    await channel.connect()
    try:
        await asyncio.to_thread(fresh_broker.stop)
        await _until_async(lambda: not channel.connected, 10, "the loss")
        await asyncio.to_thread(fresh_broker.start)
        await _until_async(lambda: channel.connected or channel._dead is not None, 20, "the reconnection")
        assert channel._dead is None and channel.reconnects == 1 and attempts[0] >= 3
        subscription = await channel.subscribe("shuffledp/00/spec")  # the channel works
        await subscription.close()
    finally:
        await channel.close()
    _no_traceback(caplog)


async def test_aiomqtt_logs_one_line_without_a_traceback(broker, caplog):
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="shuffledp.mqtt")  # a service run in this process may have raised it
    async with MqttChannel(broker.host, broker.port, **broker.channel_options("analyzer")) as channel:
        client = channel._conn.client
        # a SUBACK and an UNSUBACK for message ids aiomqtt no longer tracks (their calls were cancelled)
        client._on_subscribe(client._client, None, 60001, [], None)
        client._on_unsubscribe(client._client, None, 60002, [], None)
    records = [r for r in caplog.records if "Unexpected message ID" in r.getMessage()]
    assert len(records) == 2 and all(not r.exc_info for r in records), records
    assert all(r.levelno <= logging.INFO for r in records)  # a call cancelled by the channel: benign
    _no_traceback(caplog)


def test_the_services_loop_handler_turns_socket_callback_errors_into_one_line(caplog):
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="shuffledp.mqtt")  # a service run in this process may have raised it
    loop = asyncio.new_event_loop()
    try:
        handle = asyncio.Handle(loop.add_writer, (7, print), loop)
        _closed_socket_callbacks(loop, {"message": "Exception in callback", "exception": KeyError("7 is not registered"),
                                        "handle": handle})
        future = loop.create_future()
        error = aiomqtt.MqttCodeError(128, "Unexpected disconnection")
        _closed_socket_callbacks(loop, {"message": "Future exception was never retrieved", "exception": error,
                                        "future": future})
    finally:
        loop.close()
    lines = [r for r in caplog.records if r.name == "shuffledp.mqtt"]
    assert len(lines) == 2 and all(r.levelno == logging.DEBUG and not r.exc_info for r in lines), lines
    _no_traceback(caplog)


def test_a_party_whose_reconnection_fails_inside_aiomqtt_logs_no_traceback(fresh_broker, tmp_path):
    init_keys(tmp_path / "keys", clients=4)
    options = fresh_broker.channel_options("shuffler")
    secret = tmp_path / "shuffler.password"
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"{options['password']}\n")
    command = ["shuffler", "serve", "--keys", str(tmp_path / "keys"), "--broker", f"{fresh_broker.host}:{fresh_broker.port}",
               "--ca-file", str(fresh_broker.ca_file), "--username", str(options["username"]),
               "--password-file", str(secret), "--spool", str(tmp_path / "spool.db")]
    log = tmp_path / "shuffler.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-c", FLAKY_SECOND_CONNECTION, *command], stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=ENV)
    text = lambda: Path(log).read_text(errors="replace")  # noqa: E731
    try:
        _until(lambda: "serving session" in text() or process.poll() is not None, 30, "the shuffler to serve")
        fresh_broker.stop()
        _until(lambda: "lost the broker" in text() or process.poll() is not None, 30, "the loss")
        fresh_broker.start()
        _until(lambda: "reconnected" in text() or process.poll() is not None, 30, "the reconnection")
        assert process.poll() is None, text()
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    content = text()
    assert "reconnected" in content and "Traceback" not in content and "never retrieved" not in content, content
