"""The real shuffler service as a child process, telling its test what it did on stdout.

Tests that pause (SIGSTOP), kill (SIGKILL) or flood the shuffler run it in a process of its
own. :class:`ChildShuffler` writes the deployment's shuffler keys to a file, starts this file
as a script, and waits for its ``ready`` line. The script runs :class:`Shuffler` on a
:class:`SqliteSpool` (so a restarted process resumes from the same spool) and prints one line
per event the test asked for (``--tell``):

* ``served ROUND`` — an acknowledgement served a batch of that round (it is in the spool);
* ``expired ROUND`` — the shuffler gave up an unacknowledged batch of that round;
* ``published ROUND CHUNKS`` — it published that round's batch in that many chunks.

A test waits on those lines (events), never on a clock.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable

from cryptography.hazmat.primitives import serialization

#: The events the script can tell.
EVENTS = ("served", "expired", "published")


def write_shuffler_keys(deployment, path: Path) -> None:
    """The shuffler's private keys, the credential issuer's key, the analyzer's public key and
    the session id, concatenated raw (the script's first argument)."""
    raw = serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    keys = deployment.shuffler_keys
    path.write_bytes(keys.hpke_private.private_bytes(*raw) + keys.signing_private.private_bytes(*raw)
                     + deployment.issuer.key + deployment.analyzer_signing_key + deployment.session_id)


class ChildShuffler:
    """The shuffler service of ``deployment`` on ``broker``, in a child process.

    ``start`` (re)starts it on the same keys and spool and returns once it printed ``ready``;
    its later stdout lines are in ``self.process.stdout``.
    """

    def __init__(self, deployment, broker, tmp_path: Path, *, tell: tuple[str, ...] = ("served",),
                 identifier: str | None = None, ack_timeout: float | None = None,
                 chunk_size: int | None = None, control_connection: bool = False,
                 log: Path | None = None) -> None:
        unknown = set(tell) - set(EVENTS)
        if unknown:
            raise ValueError(f"unknown events {sorted(unknown)}; known: {EVENTS}")
        self.keys_path = tmp_path / "shuffler.keys"
        write_shuffler_keys(deployment, self.keys_path)
        self.spool_path = tmp_path / "spool.db"
        options = {"host": broker.host, "port": broker.port, **broker.channel_options("shuffler")}
        if identifier is not None:
            options["identifier"] = identifier
        self.arguments = [str(self.keys_path), str(self.spool_path), json.dumps(options), "--tell", ",".join(tell)]
        if ack_timeout is not None:
            self.arguments += ["--ack-timeout", str(ack_timeout)]
        if chunk_size is not None:
            self.arguments += ["--chunk-size", str(chunk_size)]
        if control_connection:
            self.arguments.append("--control-connection")
        #: Where the process's stderr (its log) goes: appended to this file, else inherited.
        self.log = log
        self.process: subprocess.Popen | None = None
        self.kills = 0
        #: The lines read by :meth:`follow`.
        self.lines: list[str] = []

    def start(self) -> None:
        log = open(self.log, "a") if self.log is not None else None
        try:
            self.process = subprocess.Popen([sys.executable, __file__, *self.arguments], stdout=subprocess.PIPE,
                                            stderr=log, text=True)
        finally:
            if log is not None:
                log.close()
        first = self.process.stdout.readline().strip()
        assert first == "ready", f"the shuffler printed {first!r}, exit status {self.process.poll()}"

    def follow(self, until: Callable[[str], bool]) -> threading.Event:
        """Read the running process's lines into ``self.lines`` on a thread. The event is set at
        the first line for which ``until`` holds, or when the process ends (whoever waits on it
        then finds out why)."""
        reached = threading.Event()
        process = self.process

        def read() -> None:
            for line in process.stdout:
                self.lines.append(line.strip())
                if until(line.strip()):
                    reached.set()
            reached.set()

        threading.Thread(target=read, daemon=True).start()
        return reached

    def pause(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def kill(self) -> None:
        assert self.process is not None and self.process.poll() is None, "the shuffler died on its own"
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        self.kills += 1

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.resume()
            self.process.kill()
            self.process.wait(10)


def _telling_shuffler_class(tell: set[str]):
    from shuffledp.shuffler.service import Shuffler

    class Telling(Shuffler):
        def _acknowledge(self, batch_id):
            rounds = {stored.batch_id: stored.round_id for stored in self.spool.unacknowledged()}
            served = super()._acknowledge(batch_id)
            if served and "served" in tell:
                print(f"served {rounds.get(batch_id)}", flush=True)
            return served

        async def _expire(self, session_id, round_id, batch_id):
            await super()._expire(session_id, round_id, batch_id)
            if "expired" in tell:
                print(f"expired {round_id}", flush=True)

        async def _publish_chunks(self, session_id, round_id, chunks):
            await super()._publish_chunks(session_id, round_id, chunks)
            if "published" in tell:
                print(f"published {round_id} {len(chunks)}", flush=True)

    return Telling


async def _serve(arguments: argparse.Namespace) -> None:
    from shuffledp.protocol.transport.mqtt_channel import MqttChannel
    from shuffledp.protocol.wire.credentials import CredentialIssuer
    from shuffledp.protocol.wire.onion import ShufflerKeys
    from shuffledp.shuffler.spool import SqliteSpool

    raw = Path(arguments.keys).read_bytes()
    keys = ShufflerKeys.from_bytes(raw[:32], raw[32:64])
    issuer, analyzer_key, session = CredentialIssuer(raw[64:96]), raw[96:128], raw[128:144]
    options = json.loads(arguments.options)
    tell = set(filter(None, arguments.tell.split(",")))
    service_options: dict = {"republish_interval": 0.5}
    if arguments.ack_timeout is not None:
        service_options["ack_timeout"] = arguments.ack_timeout
    if arguments.chunk_size is not None:
        service_options["chunk_size"] = arguments.chunk_size
    channel = MqttChannel(options.pop("host"), options.pop("port"), **options)
    # as `shuffler serve` does: the analyzer's messages on a connection of their own
    control = channel.companion("control") if arguments.control_connection else None
    async with channel:
        if control is not None:
            await control.connect()
        shuffler = _telling_shuffler_class(tell)(channel, session, analyzer_key, keys, issuer,
                                                  spool=SqliteSpool(arguments.spool), control_channel=control,
                                                  **service_options)
        print("ready", flush=True)
        await shuffler.serve()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("keys")
    parser.add_argument("spool")
    parser.add_argument("options", help="MqttChannel's host, port and options, as JSON")
    parser.add_argument("--tell", default="served", help=f"comma-separated events to print, of {EVENTS}")
    parser.add_argument("--ack-timeout", type=float, default=None)
    parser.add_argument("--chunk-size", type=int, default=None)
    parser.add_argument("--control-connection", action="store_true")
    asyncio.run(_serve(parser.parse_args()))
