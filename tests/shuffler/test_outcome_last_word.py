"""The shuffler's signed outcomes of a round go only forward, as devices take them.

A round's ``released`` outcome is published after its batch's chunks. If those publishes wait
(the broker away or slow) past ``ack_timeout`` after the deadline, the re-publishing pass gives
the batch up first and signs the round ``failed: not-acknowledged``. The ``released`` word
that the round's own task publishes afterwards must not follow it: it would be the retained
outcome every later device reads (or replace a ``failed`` one still pending), so the round
would read as released although its batch was deleted unacknowledged.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from shuffledp.client.ledger import PrivacyLedger
from shuffledp.protocol.transport.channel import InProcessChannel, batch_topic, outcome_topic, reports_topic, spec_topic
from shuffledp.protocol.wire.messages import RoundOutcome
from shuffledp.protocol.wire.onion import decode_verified

from parties import DEPLOYMENT, SESSION, SHUFFLER_KEYS, make_spec

ANALYZER = DEPLOYMENT.analyzer()
DEADLINE = time.time() + 3600  # the shuffler's clock is the test's; the device's is the real one
ACK_TIMEOUT = 10.0


class _SlowBatch(InProcessChannel):
    """A channel whose first publish to round 0's batch topic waits until the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = asyncio.Event()
        self.go = asyncio.Event()
        self.held = False

    async def publish(self, topic, payload, *, retain=False):
        if topic == batch_topic(SESSION, 0) and not self.held:
            self.held = True
            self.waiting.set()
            await self.go.wait()
        await super().publish(topic, payload, retain=retain)


def _word(data: bytes) -> str:
    outcome = decode_verified(data, RoundOutcome, SHUFFLER_KEYS.signing_public)
    return outcome.outcome if outcome.outcome == "released" else f"failed:{outcome.reason}"


async def test_a_round_given_up_while_its_batch_was_being_published_is_never_announced_released_after():
    now = [DEADLINE - 5]
    spec = make_spec(round_id=0, min_batch=1, max_batch=1, deadline=DEADLINE)
    signed = ANALYZER.sign_spec(spec)
    channel = _SlowBatch()
    outcomes = await channel.subscribe(outcome_topic(SESSION, 0))
    specs = await channel.subscribe(spec_topic(SESSION))
    shuffler = DEPLOYMENT.shuffler(channel, republish_interval=3600, ack_timeout=ACK_TIMEOUT, clock=lambda: now[0])
    task = asyncio.create_task(shuffler.run_round(spec, signed))
    try:
        await asyncio.wait_for(specs.get(), 5)  # the round is open
        client = DEPLOYMENT.client(np.array([0.5]), PrivacyLedger(1.0))
        await channel.publish(reports_topic(SESSION, 0), client.answer(signed)[0])
        await asyncio.wait_for(channel.waiting.wait(), 5)  # released in the spool; its batch's publish waits
        now[0] = DEADLINE + ACK_TIMEOUT + 1  # no acknowledgement came: the re-publishing pass gives it up
        await shuffler.republish_unacknowledged()
        assert shuffler.expired == 1 and shuffler.spool.round(SESSION, 0).state == "failed"
        channel.go.set()  # the batch's publish goes through at last, and the round's task goes on
        await asyncio.wait_for(task, 5)
    finally:
        channel.go.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await shuffler.republish_unacknowledged()  # anything still pending goes out
    words = [_word(data) for data in outcomes.get_nowait_all()]
    assert words == ["failed:not-acknowledged"], f"outcomes published for the round, in order: {words}"
    retained = await channel.subscribe(outcome_topic(SESSION, 0))  # what a device that connects later reads
    assert _word(retained.get_nowait_all()[-1]) == "failed:not-acknowledged"
