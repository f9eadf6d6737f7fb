"""The library's Coordinator has the liveness margin of ``analyzer run`` by default; no margin is an opt-out by name.

Junk from an enrolled credential is admitted like a report (the shuffler cannot look inside
the inner seal). Without a margin (``max_batch = min_batch``) one such envelope takes an
honest client's place or leaves the batch one valid report short, and the round fails. By
default the coordinator now gives every round the margin ``analyzer run`` gives its rounds:

* ``run_round(min_batch)``: ``max_batch = min_batch + liveness_margin(min_batch)``;
* ``run_protocol(protocol, users)``: each round takes every message of every user
  (``max_batch = users * messages_per_user``) and needs ``min_batch`` = that minus the margin
  of :func:`service_batch_bounds` (never more than half the messages), so a round is still
  released the moment every user answered.

``batch_margin=NO_LIVENESS_MARGIN`` (0) is the opt-out, for rounds whose every credential is
held by an honest party (the in-process simulation): exactly the old behaviour.
"""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

from shuffledp.analyzer.coordinator import NO_LIVENESS_MARGIN, liveness_margin, service_batch_bounds
from shuffledp.analyzer.protocols import Protocol, RoundPlan
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.deploy.deployment import Deployment
from shuffledp.protocol.errors import BatchTooSmall
from shuffledp.protocol.transport.channel import InProcessChannel, reports_topic, spec_topic
from shuffledp.protocol.wire import codec
from shuffledp.protocol.wire.messages import RoundSpec, SignedRoundSpec
from shuffledp.protocol.wire.report_format import report_format

from parties import PARAMS, envelope

HONEST = 6


class OneRound(Protocol):
    """One Hadamard range round; its result is the round's opened reports."""

    name = "one-round"

    def rounds(self):
        values = yield RoundPlan(PARAMS, 0.5)
        return values

    @property
    def budget(self):
        return 0.5, 0.0


async def _answer(channel, session_id, clients, junk_credentials, junk_instead=()):
    """Answer the round: one junk envelope (the round's sealed size, not a sealed report) per junk
    credential first, then every honest client's report; a client in ``junk_instead`` sends junk
    under its own credential instead of its report."""
    specs = await channel.subscribe(spec_topic(session_id))
    try:
        signed = await specs.get()
    finally:
        await specs.close()
    spec = codec.decode(codec.decode(signed, SignedRoundSpec).spec_bytes, RoundSpec)
    size = report_format(spec.round_id, spec.mechanism).sealed_size
    topic = reports_topic(session_id, spec.round_id)
    for credential in junk_credentials:
        await channel.publish(topic, envelope(spec, credential, os.urandom(size)))
    for i, client in enumerate(clients):
        if i in junk_instead:
            await channel.publish(topic, envelope(spec, client.credential, os.urandom(size)))
        else:
            await channel.publish(topic, client.answer(signed)[0])
    return spec


async def _run(coordinator_options: dict, call, clients: int, junk: int = 0, junk_instead=()):
    deployment = Deployment()
    channel = InProcessChannel()
    coordinator = deployment.coordinator(channel, round_timeout=1.0, grace=1.0, **coordinator_options)
    shuffler = deployment.shuffler(channel)
    honest = [deployment.client(np.array([0.25 * i]), PrivacyLedger(1.0)) for i in range(clients)]
    junk_credentials = [deployment.enroll() for _ in range(junk)]
    serving = asyncio.create_task(shuffler.serve())
    try:
        await asyncio.sleep(0)
        answering = asyncio.create_task(_answer(channel, coordinator.session_id, honest, junk_credentials, junk_instead))
        try:
            result = await asyncio.wait_for(call(coordinator), 10)
        finally:
            spec = await answering
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
    return result, spec, shuffler


async def test_run_round_has_the_liveness_margin_by_default_and_one_junk_envelope_cannot_fail_it():
    record, spec, shuffler = await _run({}, lambda c: c.run_round(PARAMS, 0.5, min_batch=HONEST), HONEST, junk=1)
    assert (spec.min_batch, spec.max_batch) == (HONEST, HONEST + liveness_margin(HONEST))
    assert record.opened.size == HONEST and sum(record.opened.rejected.values()) == 1
    assert not shuffler.rounds[spec.round_id].rejected  # no honest client was turned away


async def test_no_liveness_margin_is_the_named_opt_out_and_keeps_the_old_behaviour():
    assert NO_LIVENESS_MARGIN == 0
    with pytest.raises(BatchTooSmall):
        await _run({"batch_margin": NO_LIVENESS_MARGIN}, lambda c: c.run_round(PARAMS, 0.5, min_batch=HONEST),
                   HONEST, junk=1)


async def test_run_protocol_takes_every_user_and_tolerates_the_service_margin_of_junk_by_default():
    users = 20
    values, spec, shuffler = await _run({}, lambda c: _result(c, users), users, junk_instead={3})
    assert (spec.min_batch, spec.max_batch) == service_batch_bounds(users) == (users - 8, users)
    assert len(values) == users - 1  # the junk was dropped, every honest report counted
    stats = shuffler.rounds[spec.round_id]
    assert stats.admitted == stats.forwarded == users and not stats.rejected


async def _result(coordinator, users):
    result, records = await coordinator.run_protocol(OneRound(), users)
    return result


async def test_run_protocol_without_margin_needs_every_user_as_before():
    users = 20
    with pytest.raises(BatchTooSmall):
        await _run({"batch_margin": NO_LIVENESS_MARGIN}, lambda c: _result(c, users), users, junk_instead={3})
