"""Fault tests over a real broker: the shuffler killed with SIGKILL several times mid-round,
and the broker restarted mid-round, under load.

The shuffler runs as its own OS process (the library's Shuffler over MqttChannel, on a
file-backed SQLite spool); the analyzer's coordinator and a fleet of enrolled clients
(:class:`shuffledp.deploy.fleet.Fleet`) run here, each on its own authenticated TLS
connection. The fleet keeps each envelope until a signed receipt names it and sends
lost ones again, byte for byte, as devices do. What must
hold afterwards: every admitted report is delivered, in exactly one batch, none twice;
every client is charged exactly once; the round ends served.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization

from shuffledp.analyzer.coordinator import NO_LIVENESS_MARGIN
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.deploy.deployment import Deployment
from shuffledp.deploy.fleet import Fleet
from shuffledp.protocol.transport.channel import receipts_topic
from shuffledp.protocol.wire.messages import HadamardRangeParams
from shuffledp.protocol.transport.mqtt_channel import MqttChannel
from shuffledp.protocol.mechanisms.randomness import SeededSource
from shuffledp.shuffler.spool import SqliteSpool

pytestmark = pytest.mark.mqtt

PARAMS = HadamardRangeParams(-4.0, 4.0, 0.5)
EPSILON0 = 0.5

_SHUFFLER = textwrap.dedent(
    """
    import asyncio, json, sys
    from shuffledp.protocol.wire.credentials import CredentialIssuer
    from shuffledp.protocol.transport.mqtt_channel import MqttChannel
    from shuffledp.protocol.wire.onion import ShufflerKeys
    from shuffledp.shuffler.service import Shuffler
    from shuffledp.shuffler.spool import SqliteSpool

    keys_path, spool_path, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    raw = open(keys_path, "rb").read()
    keys = ShufflerKeys.from_bytes(raw[:32], raw[32:64])
    issuer, analyzer_key, session = CredentialIssuer(raw[64:96]), raw[96:128], raw[128:144]

    class Telling(Shuffler):
        def _acknowledge(self, batch_id):
            served = super()._acknowledge(batch_id)
            if served:
                print("served", flush=True)  # the acknowledgement is in the spool
            return served

    async def main():
        async with MqttChannel(options.pop("host"), options.pop("port"), **options) as channel:
            shuffler = Telling(channel, session, analyzer_key, keys, issuer, spool=SqliteSpool(spool_path),
                               republish_interval=0.5)
            print("ready", flush=True)
            await shuffler.serve()

    asyncio.run(main())
    """
)


class ShufflerProcess:
    """The shuffler service as a child process that can be killed and restarted on the same spool."""

    def __init__(self, deployment: Deployment, broker, tmp_path) -> None:
        raw = serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        keys = deployment.shuffler_keys
        self.keys_path = tmp_path / "shuffler.keys"
        self.keys_path.write_bytes(
            keys.hpke_private.private_bytes(*raw)
            + keys.signing_private.private_bytes(*raw)
            + deployment.issuer.key
            + deployment.analyzer_signing_key
            + deployment.session_id
        )
        self.spool_path = tmp_path / "spool.db"
        options = {"host": broker.host, "port": broker.port, **broker.channel_options("shuffler")}
        self.options = json.dumps(options)
        self.process: subprocess.Popen | None = None
        self.kills = 0

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _SHUFFLER, str(self.keys_path), str(self.spool_path), self.options],
            stdout=subprocess.PIPE, text=True,
        )
        assert self.process.stdout.readline().strip() == "ready"

    async def served(self, timeout: float) -> None:
        """Wait until the running process says it wrote an acknowledgement that served a batch."""
        assert self.process is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.process.stdout.readline), timeout)
        assert line.strip() == "served", f"the shuffler printed {line!r}, exit status {self.process.poll()}"

    def kill(self) -> None:
        assert self.process is not None and self.process.poll() is None, "the shuffler died on its own"
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        self.kills += 1

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


async def _round_under_faults(broker, tmp_path, fault) -> tuple:
    """One round of ``n`` clients while ``fault(shuffler_process, receipts_seen)`` runs."""
    n = 600
    deployment = Deployment()
    shuffler = ShufflerProcess(deployment, broker, tmp_path)
    shuffler.start()
    clients = [deployment.client(np.array([0.01 * i]), PrivacyLedger(1.0)) for i in range(n)]
    host, port = broker.host, broker.port
    try:
        async with MqttChannel(host, port, **broker.channel_options("analyzer")) as analyzer_channel, MqttChannel(
            host, port, **broker.channel_options("client")
        ) as fleet_channel:
            # n honest clients, released the moment all n arrived: no liveness margin
            coordinator = deployment.coordinator(analyzer_channel, round_timeout=90.0, grace=10.0,
                                                 batch_margin=NO_LIVENESS_MARGIN)
            # devices trickling in over about three seconds, retrying what no receipt names
            fleet = Fleet(fleet_channel, deployment.session_id, clients, SeededSource(2), rate=200.0, retry_interval=0.5)
            watch = await fleet_channel.subscribe(receipts_topic(deployment.session_id, 0))
            pool_task = asyncio.create_task(fleet.serve(rounds=1))
            fault_task = asyncio.create_task(fault(shuffler, watch))
            record = await asyncio.wait_for(coordinator.run_round(PARAMS, EPSILON0, min_batch=n), 120)
            await asyncio.wait_for(pool_task, 60)
            await fault_task
            await shuffler.served(30)  # the shuffler took the acknowledgement
    finally:
        shuffler.stop()
    return n, deployment, clients, fleet, record, shuffler, coordinator


def _check_exactly_once(n, deployment, clients, fleet, record, shuffler_process, coordinator):
    # every report delivered, in one batch, none twice, all valid
    assert record.opened.size == n and sum(record.opened.rejected.values()) == 0
    assert len(record.batch_ids) == 1
    # every client charged exactly once for the one round
    assert all(c.ledger.spent_epsilon == EPSILON0 and len(c.ledger.answered) == 1 for c in clients)
    # each envelope was confirmed by a receipt, or its round closed (signed outcome) after a
    # receipt was lost to the outage; nothing was refused; the round was released
    state = fleet.rounds[0]
    assert state.admitted + state.unacknowledged == n and not state.refused and state.released
    # the spool says served, and holds no ciphertext any more
    spool = SqliteSpool(shuffler_process.spool_path)
    assert spool.round(deployment.session_id, 0).state == "served"
    assert spool.admitted(deployment.session_id, 0) == [] and spool.unacknowledged() == []


async def _wait_receipts(watch, at_least: int) -> None:
    seen = 0
    while seen < at_least:
        await asyncio.wait_for(watch.get(), 30)
        seen += 1


async def test_shuffler_killed_three_times_mid_round_loses_and_duplicates_nothing(fresh_broker, tmp_path):
    async def kill_three_times(shuffler: ShufflerProcess, watch) -> None:
        for _ in range(3):
            await _wait_receipts(watch, 2)  # admitting is under way
            shuffler.kill()
            await asyncio.sleep(0.3)
            shuffler.start()

    result = await _round_under_faults(fresh_broker, tmp_path, kill_three_times)
    _check_exactly_once(*result)
    fleet, shuffler = result[3], result[5]
    assert shuffler.kills == 3
    assert fleet.rounds[0].retransmitted > 0  # envelopes lost while it was down were sent again


async def test_broker_restarted_mid_round_loses_and_duplicates_nothing(fresh_broker, tmp_path):
    async def restart_broker(shuffler: ShufflerProcess, watch) -> None:
        await _wait_receipts(watch, 2)
        await asyncio.to_thread(fresh_broker.stop)
        await asyncio.sleep(0.5)
        await asyncio.to_thread(fresh_broker.restart)

    result = await _round_under_faults(fresh_broker, tmp_path, restart_broker)
    _check_exactly_once(*result)
    fleet = result[3]
    assert fleet.channel.reconnects >= 1  # the fleet's connection really went down and came back
    assert fresh_broker.starts == 2
