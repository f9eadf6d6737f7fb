"""The device fleet learns of a round lost after its release, end to end, with the real shuffler.

An analyzer that never acknowledges a released batch (it refused it, or is gone) makes the
shuffler give the batch up ``ack_timeout`` after the round's deadline: it signs a second
outcome for the round, ``failed`` (``not-acknowledged``), retained over the ``released`` one.
The fleet that ``shuffledp clients run`` and ``shuffledp up`` run (:class:`Fleet`) keeps
following the outcome of every round its devices answered while it serves, and its
``follow`` period after the last one; each device's ledger then records the round as lost
(still charged), and the fleet's round record says it was not released.

Real parties over a real broker (TLS, passwords, ACL by role): the shuffler
(:class:`Shuffler` with a short ``ack_timeout``) and the fleet each on their own account;
the "analyzer" only signs and announces specs, and never acknowledges anything.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from shuffledp.client.ledger import PrivacyLedger
from shuffledp.deploy.deployment import Deployment
from shuffledp.deploy.fleet import Fleet
from shuffledp.protocol.transport.channel import announce_topic, outcome_topic
from shuffledp.protocol.transport.mqtt_channel import MqttChannel
from shuffledp.protocol.wire.messages import RoundOutcome
from shuffledp.protocol.wire.onion import decode_verified

from parties import make_spec

pytestmark = pytest.mark.mqtt

USERS = 10
#: Seconds from a round's announcement to its deadline: the fleet answers well within it.
ROUND_SECONDS = 2.0
ACK_TIMEOUT = 0.3


def _channel(broker, role: str) -> MqttChannel:
    return MqttChannel(broker.host, broker.port, **broker.channel_options(role))


async def _failed_outcome(subscription, deployment) -> RoundOutcome:
    """The round's signed ``failed`` outcome, once the shuffler publishes it (the ``released`` one comes first)."""
    while True:
        outcome = decode_verified(await subscription.get(), RoundOutcome, deployment.shuffler_keys.signing_public)
        if outcome.outcome == "failed":
            return outcome


async def _announce(channel, deployment, round_id: int):
    spec = make_spec(round_id=round_id, min_batch=USERS, max_batch=USERS, deadline=time.time() + ROUND_SECONDS,
                     deployment=deployment)
    await channel.publish(announce_topic(deployment.session_id), deployment.analyzer().sign_spec(spec), retain=True)
    return spec


@pytest.mark.parametrize("rounds", [1, 2])
async def test_every_fleet_ledger_records_a_released_round_the_shuffler_then_gave_up(broker, rounds):
    """``rounds=1``: the lost round is the fleet's last, and its ``follow`` period sees the failure.
    ``rounds=2``: round 0 fails while the fleet waits for round 1 (no follow period needed)."""
    deployment = Deployment()
    ledgers = [PrivacyLedger(2.0) for _ in range(USERS)]
    clients = [deployment.client(np.array([0.1 * i]), ledger) for i, ledger in enumerate(ledgers)]
    sid = deployment.session_id
    async with _channel(broker, "shuffler") as shuffler_channel, _channel(broker, "analyzer") as analyzer_channel, \
            _channel(broker, "client") as fleet_channel:
        shuffler = deployment.shuffler(shuffler_channel, ack_timeout=ACK_TIMEOUT, republish_interval=0.05)
        # rounds=2 uses the fleet's defaults, as `clients run` and `up` do
        fleet = Fleet(fleet_channel, sid, clients, retry_interval=0.5, **({"follow": 30.0} if rounds == 1 else {}))
        outcomes = await analyzer_channel.subscribe(outcome_topic(sid, 0))
        serving = asyncio.create_task(shuffler.serve())
        fleet_task = asyncio.create_task(fleet.serve(rounds))
        try:
            await _announce(analyzer_channel, deployment, 0)
            failed = await asyncio.wait_for(_failed_outcome(outcomes, deployment), 30)
            if rounds == 2:
                await _announce(analyzer_channel, deployment, 1)  # announced only once round 0 was given up
            states = await asyncio.wait_for(fleet_task, 30)
        finally:
            fleet_task.cancel()
            serving.cancel()
            await asyncio.gather(fleet_task, serving, return_exceptions=True)
    assert (failed.outcome, failed.reason) == ("failed", "not-acknowledged") and shuffler.expired >= 1
    assert shuffler.rounds[0].outcome == "not-acknowledged"
    lost = [ledger for ledger in ledgers if ledger.lost_rounds() == [(sid, 0)]]
    assert len(lost) == USERS, [ledger.outcomes for ledger in ledgers]  # every device learned it
    assert all(ledger.outcomes[(sid, 0)] == "failed:not-acknowledged" for ledger in ledgers)
    assert all(ledger.spent_epsilon == 0.5 * rounds for ledger in ledgers)  # and stays charged
    assert all(c.sent[(sid, 0)].outcome == "failed:not-acknowledged" for c in clients)
    state = states[0]
    assert state.outcomes == {0: "failed:not-acknowledged"} and not state.released
    assert state.admitted == USERS and fleet.bad_messages == {}
