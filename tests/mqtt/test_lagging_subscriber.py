"""Messages the broker drops to a subscriber that lags are recovered: every report counts once.

mosquitto holds at most ``max_inflight_messages`` QoS 1 messages in flight to one client and
``max_queued_messages`` more in its queue; past that it drops what comes for that client (and
logs "Outgoing messages are being dropped for client ..."). The protocol does not rely on the
broker holding a lagging party's messages:

* envelopes dropped on their way to a shuffler that lags get no receipt, and each device sends
  its envelope again, byte for byte, until a signed receipt names it; the shuffler admits an
  exact copy once;
* batch chunks dropped on their way to an analyzer that lags are published again by the
  shuffler every ``republish_interval`` until the analyzer's signed acknowledgement; the
  analyzer takes each chunk index once.

Here the test broker's limits are small (8 in flight, 16 queued), the real shuffler runs as its
own process and is paused (SIGSTOP) while a fleet of devices sends every envelope of a round,
then the analyzer is held (its event loop blocked on its first chunk) while the shuffler
publishes the round's batch in 48 chunks. The broker's log shows that it dropped messages to
both; the round still ends with every device's report opened exactly once.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from shuffledp.client.ledger import PrivacyLedger
from shuffledp.deploy.broker import Broker, BrokerUsers
from shuffledp.deploy.deployment import Deployment
from shuffledp.deploy.fleet import Fleet
from shuffledp.protocol.mechanisms.randomness import SeededSource
from shuffledp.protocol.transport.channel import spec_topic
from shuffledp.protocol.transport.mqtt_channel import MqttChannel
from shuffledp.protocol.wire.messages import HadamardRangeParams
from shuffledp.shuffler.spool import SqliteSpool
from tests.mqtt.child_shuffler import ChildShuffler

pytestmark = pytest.mark.mqtt

PARAMS = HadamardRangeParams(-4.0, 4.0, 0.5)
EPSILON0 = 0.5
USERS = 96
#: The test broker's limits: far below what one round sends to the shuffler or the analyzer.
INFLIGHT, QUEUED = 8, 16
#: Reports per batch chunk: the round's batch is USERS / CHUNK = 48 chunks.
CHUNK = 2
#: Safety limit for every wait (each ends on an event: a message, a log line, a process's exit).
TIMEOUT = 60

@pytest.fixture
def small_queue_broker():
    broker = Broker(users=BrokerUsers.default(("client",)), max_inflight_messages=INFLIGHT, max_queued_messages=QUEUED)
    broker.start()
    yield broker
    broker.close()


def _dropped_for(broker: Broker, identifier: str) -> bool:
    return f"Outgoing messages are being dropped for client {identifier}." in broker.log_file.read_text(errors="replace")


async def test_messages_dropped_to_a_lagging_shuffler_and_analyzer_are_recovered_and_count_once(small_queue_broker, tmp_path):
    broker = small_queue_broker
    deployment = Deployment()
    clients = [deployment.client(np.array([0.01 * i]), PrivacyLedger(1.0)) for i in range(USERS)]
    shuffler = ChildShuffler(deployment, broker, tmp_path, tell=("published",), identifier="lagging-shuffler",
                             chunk_size=CHUNK)
    shuffler.start()
    published = shuffler.follow(lambda line: line.startswith("published 0 "))  # or the process ended
    host, port = broker.host, broker.port
    try:
        async with MqttChannel(host, port, identifier="lagging-analyzer", **broker.channel_options("analyzer")) as analyzer_channel, \
                MqttChannel(host, port, **broker.channel_options("client")) as fleet_channel:
            specs = await analyzer_channel.subscribe(spec_topic(deployment.session_id))
            coordinator = deployment.coordinator(analyzer_channel, round_timeout=TIMEOUT, grace=5.0)
            # the analyzer lags: its event loop is held on the round's first chunk until the shuffler has
            # published the whole batch (every chunk past what the broker holds for it is dropped)
            take_chunk, held = coordinator._take_chunk, []

            def lagging_take_chunk(*args):
                if not held:
                    held.append(published.wait(TIMEOUT))
                return take_chunk(*args)

            coordinator._take_chunk = lagging_take_chunk
            round_task = asyncio.create_task(coordinator.run_round(PARAMS, EPSILON0, min_batch=USERS, max_batch=USERS))
            await asyncio.wait_for(specs.get(), TIMEOUT)  # the shuffler opened the round and relayed its spec
            shuffler.pause()  # ... and now lags: it reads nothing
            sent = asyncio.Event()
            fleet = Fleet(fleet_channel, deployment.session_id, clients, SeededSource(3), retry_interval=0.25,
                          on_event=lambda line: sent.set() if "envelope(s) sent" in line else None)
            fleet_task = asyncio.create_task(fleet.serve(rounds=1))
            try:
                await asyncio.wait_for(sent.wait(), TIMEOUT)  # every envelope is at the broker, or dropped there
            finally:
                shuffler.resume()
            record = await asyncio.wait_for(round_task, TIMEOUT)
            (state,) = await asyncio.wait_for(fleet_task, TIMEOUT)
    finally:
        shuffler.stop()

    # the broker dropped messages to both parties that lagged
    assert _dropped_for(broker, "lagging-shuffler"), broker.log_tail()
    assert _dropped_for(broker, "lagging-analyzer"), broker.log_tail()
    assert held == [True]
    # every device's report was opened exactly once, in one batch, none refused
    assert record.opened.size == USERS and not record.opened.rejected and record.batch_sizes == (USERS,)
    assert record.chunks == USERS // CHUNK
    assert coordinator.rejected_batches["redelivered-chunk"] > 0  # the batch was published again
    assert state.sent == state.admitted == USERS and not state.refused and state.unacknowledged == 0
    assert state.retransmitted > 0 and state.released  # envelopes were sent again, and the round was released
    assert all(c.ledger.spent_epsilon == EPSILON0 and len(c.ledger.answered) == 1 for c in clients)
    spool = SqliteSpool(shuffler.spool_path)
    assert spool.round(deployment.session_id, 0).state in ("released", "served")
