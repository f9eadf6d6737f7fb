"""A round's signed outcome the broker did not take is published again until it does.

Devices learn from the retained outcome whether their round was released or lost. The shuffler
publishes it when the round ends; if the broker is away longer than a publish waits, the outcome
stays pending and goes out at a later re-publishing pass (``republish_unacknowledged``), whether
the round was released or failed; the service never stops over it.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from shuffledp.client.ledger import PrivacyLedger
from shuffledp.protocol.errors import TransportError
from shuffledp.protocol.transport.channel import InProcessChannel, outcome_topic, reports_topic, spec_topic
from shuffledp.protocol.wire.messages import RoundOutcome
from shuffledp.protocol.wire.onion import decode_verified

from parties import DEPLOYMENT, SESSION, SHUFFLER_KEYS, make_spec

ANALYZER = DEPLOYMENT.analyzer()


class _OutcomesDown(InProcessChannel):
    """A channel whose first ``down`` publishes of round 0's outcome fail, as with a broker away."""

    def __init__(self, down: int) -> None:
        super().__init__()
        self.down = down

    async def publish(self, topic, payload, *, retain=False):
        if topic == outcome_topic(SESSION, 0) and self.down:
            self.down -= 1
            raise TransportError("broker away")
        await super().publish(topic, payload, retain=retain)


def _decoded(data: bytes) -> RoundOutcome:
    return decode_verified(data, RoundOutcome, SHUFFLER_KEYS.signing_public)


async def _resent_on_the_second_pass(shuffler, channel, outcomes) -> RoundOutcome:
    assert outcomes.get_nowait_all() == [] and channel.down == 1  # the round's own attempt failed
    await shuffler.republish_unacknowledged()  # the broker is still away
    assert outcomes.get_nowait_all() == [] and channel.down == 0
    await shuffler.republish_unacknowledged()  # it is back
    (data,) = outcomes.get_nowait_all()
    await shuffler.republish_unacknowledged()  # out once: not published again
    assert outcomes.get_nowait_all() == []
    return _decoded(data)


async def test_a_released_outcome_the_broker_did_not_take_is_published_again():
    spec = make_spec(round_id=0, min_batch=1, max_batch=1, deadline=time.time() + 30)
    signed = ANALYZER.sign_spec(spec)
    channel = _OutcomesDown(down=2)
    outcomes = await channel.subscribe(outcome_topic(SESSION, 0))
    specs = await channel.subscribe(spec_topic(SESSION))
    shuffler = DEPLOYMENT.shuffler(channel, republish_interval=3600)
    task = asyncio.create_task(shuffler.run_round(spec, signed))
    await asyncio.wait_for(specs.get(), 5)  # the round is open
    client = DEPLOYMENT.client(np.array([0.5]), PrivacyLedger(1.0))
    await channel.publish(reports_topic(SESSION, 0), client.answer(signed)[0])
    stats = await asyncio.wait_for(task, 5)
    assert stats.outcome == "forwarded" and stats.forwarded == 1
    published = await _resent_on_the_second_pass(shuffler, channel, outcomes)
    (stored,) = shuffler.spool.unacknowledged()
    assert (published.outcome, published.admitted, published.batch_id) == ("released", 1, stored.batch_id)


async def test_a_failed_outcome_the_broker_did_not_take_is_published_again_and_the_round_fails_quietly():
    spec = make_spec(round_id=0, min_batch=2, max_batch=4, deadline=time.time() + 0.05)
    channel = _OutcomesDown(down=2)
    outcomes = await channel.subscribe(outcome_topic(SESSION, 0))
    shuffler = DEPLOYMENT.shuffler(channel, republish_interval=3600)
    stats = await asyncio.wait_for(shuffler.run_round(spec, ANALYZER.sign_spec(spec)), 5)  # does not raise
    assert stats.outcome == "batch-too-small" and shuffler.spool.round(SESSION, 0).state == "failed"
    published = await _resent_on_the_second_pass(shuffler, channel, outcomes)
    assert (published.outcome, published.reason) == ("failed", "batch-too-small")
