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

import numpy as np
import pytest

from shuffledp.analyzer.coordinator import NO_LIVENESS_MARGIN
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.deploy.deployment import Deployment
from shuffledp.deploy.fleet import Fleet
from shuffledp.protocol.transport.channel import receipts_topic
from shuffledp.protocol.wire.messages import HadamardRangeParams
from shuffledp.protocol.transport.mqtt_channel import MqttChannel
from shuffledp.protocol.mechanisms.randomness import SeededSource
from shuffledp.shuffler.spool import SqliteSpool
from tests.mqtt.child_shuffler import ChildShuffler

pytestmark = pytest.mark.mqtt

PARAMS = HadamardRangeParams(-4.0, 4.0, 0.5)
EPSILON0 = 0.5

async def _served(shuffler: ChildShuffler, timeout: float) -> None:
    """Wait until the running shuffler says it wrote an acknowledgement that served a batch."""
    line = await asyncio.wait_for(asyncio.to_thread(shuffler.process.stdout.readline), timeout)
    assert line.startswith("served "), f"the shuffler printed {line!r}, exit status {shuffler.process.poll()}"


async def _round_under_faults(broker, tmp_path, fault) -> tuple:
    """One round of ``n`` clients while ``fault(shuffler_process, receipts_seen)`` runs."""
    n = 600
    deployment = Deployment()
    shuffler = ChildShuffler(deployment, broker, tmp_path)
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
            await _served(shuffler, 30)  # the shuffler took the acknowledgement
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
    async def kill_three_times(shuffler: ChildShuffler, watch) -> None:
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
    async def restart_broker(shuffler: ChildShuffler, watch) -> None:
        await _wait_receipts(watch, 2)
        await asyncio.to_thread(fresh_broker.stop)
        await asyncio.sleep(0.5)
        await asyncio.to_thread(fresh_broker.restart)

    result = await _round_under_faults(fresh_broker, tmp_path, restart_broker)
    _check_exactly_once(*result)
    fleet = result[3]
    assert fleet.channel.reconnects >= 1  # the fleet's connection really went down and came back
    assert fresh_broker.starts == 2
