"""Liveness against enrolled clients that send junk: the liveness margin and the end of unacknowledged batches.

The shuffler cannot look inside the inner seal, so an enrolled credential's junk envelope
is admitted like a report. A round announced with ``max_batch = min_batch + margin``
(:func:`~shuffledp.analyzer.coordinator.liveness_margin`, the coordinator's
``batch_margin=None``) admits every honest client next to up to ``margin`` junk
envelopes, and the analyzer, counting only valid reports, still finds ``min_batch``.
More junk than that may fail the round; then the batch the analyzer refused is never
acknowledged, and the shuffler gives it up ``ack_timeout`` after the round's deadline: it deletes the batch
from its spool, stops re-publishing it and signs a ``failed`` outcome
(``not-acknowledged``) its clients read.
"""

from __future__ import annotations

import asyncio
import os
import time

import numpy as np
import pytest

from shuffledp.client.ledger import PrivacyLedger
from shuffledp.deploy.deployment import Deployment
from shuffledp.protocol.wire import codec
from shuffledp.protocol.transport.channel import InProcessChannel, batch_topic, outcome_topic, reports_topic, spec_topic
from shuffledp.protocol.errors import BatchTooSmall
from shuffledp.protocol.wire.messages import RoundOutcome, RoundSpec, SignedRoundSpec
from shuffledp.protocol.wire.onion import decode_verified
from shuffledp.protocol.wire.report_format import report_format
from shuffledp.analyzer.coordinator import MIN_LIVENESS_MARGIN, liveness_margin
from shuffledp.shuffler.service import batch_chunks

from parties import PARAMS, envelope, make_spec

HONEST = 6
MARGIN = liveness_margin(HONEST)


def test_the_margin_is_at_least_eight_and_one_percent():
    assert MIN_LIVENESS_MARGIN == 8
    assert liveness_margin(1) == liveness_margin(800) == 8
    assert liveness_margin(801) == 9 and liveness_margin(10_000) == 100


async def _answer(channel, session_id, clients, junk_credentials):
    """Wait for the round's spec; publish one junk envelope (right size, not a sealed report) per
    junk credential first, then every honest client's answer."""
    specs = await channel.subscribe(spec_topic(session_id))
    try:
        signed = await specs.get()
    finally:
        await specs.close()
    spec = codec.decode(codec.decode(signed, SignedRoundSpec).spec_bytes, RoundSpec)
    size = report_format(spec.round_id, spec.mechanism).sealed_size
    topic = reports_topic(session_id, spec.round_id)
    for cred in junk_credentials:
        await channel.publish(topic, envelope(spec, cred, os.urandom(size)))
    for c in clients:
        await channel.publish(topic, c.answer(signed)[0])
    return spec


def _parties(junk: int, *, round_timeout: float, **shuffler_options):
    deployment = Deployment()
    channel = InProcessChannel()
    coordinator = deployment.coordinator(channel, round_timeout=round_timeout, grace=1.0, batch_margin=None)
    shuffler = deployment.shuffler(channel, **shuffler_options)
    clients = [deployment.client(np.array([0.25 * i]), PrivacyLedger(1.0)) for i in range(HONEST)]
    junk_credentials = [deployment.enroll() for _ in range(junk)]
    return deployment, channel, coordinator, shuffler, clients, junk_credentials


@pytest.mark.parametrize("junk", [1, MARGIN])
async def test_junk_from_up_to_margin_enrolled_clients_cannot_fail_an_honest_round(junk):
    deployment, channel, coordinator, shuffler, clients, junk_credentials = _parties(junk, round_timeout=1.0)
    sid = coordinator.session_id
    task = asyncio.create_task(shuffler.serve())
    try:
        await asyncio.sleep(0)
        answering = asyncio.create_task(_answer(channel, sid, clients, junk_credentials))
        record = await asyncio.wait_for(coordinator.run_round(PARAMS, 0.5, min_batch=HONEST), 10)
        spec = await answering
        await asyncio.sleep(0.05)  # let the shuffler take the acknowledgement
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert (spec.min_batch, spec.max_batch) == (HONEST, HONEST + MARGIN)
    stats = shuffler.rounds[spec.round_id]
    assert "round-full" not in stats.rejected and not stats.rejected  # no honest client was turned away
    assert stats.admitted == stats.forwarded == HONEST + junk
    # every honest report counts, the junk is dropped, and the round is accounted at its valid reports
    assert record.opened.size == HONEST and sum(record.opened.rejected.values()) == junk
    assert record.smallest_batch == HONEST
    assert stats.outcome == "served" and shuffler.spool.unacknowledged() == []


async def test_more_junk_than_the_margin_may_fail_the_round_which_ends_signed_and_deleted():
    junk = MARGIN + 1
    deployment, channel, coordinator, shuffler, clients, junk_credentials = _parties(
        junk, round_timeout=2.0, republish_interval=0.05, ack_timeout=0.3
    )
    sid = coordinator.session_id
    outcomes = await channel.subscribe(outcome_topic(sid, 0))
    task = asyncio.create_task(shuffler.serve())
    try:
        await asyncio.sleep(0)
        answering = asyncio.create_task(_answer(channel, sid, clients, junk_credentials))
        with pytest.raises(BatchTooSmall):
            await asyncio.wait_for(coordinator.run_round(PARAMS, 0.5, min_batch=HONEST), 10)
        spec = await answering
        released = decode_verified(await asyncio.wait_for(outcomes.get(), 1), RoundOutcome, deployment.shuffler_keys.signing_public)
        failed_bytes = await asyncio.wait_for(outcomes.get(), 2)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    stats = shuffler.rounds[spec.round_id]
    assert stats.admitted == spec.max_batch and stats.rejected["round-full"] == 1
    assert coordinator.rejected_batches["batch-too-small"] >= 1  # the analyzer refused the batch
    assert released.outcome == "released"
    failed = decode_verified(failed_bytes, RoundOutcome, deployment.shuffler_keys.signing_public)
    assert (failed.outcome, failed.reason, failed.batch_id) == ("failed", "not-acknowledged", released.batch_id)
    assert stats.outcome == "not-acknowledged" and shuffler.expired == 1
    # the spool keeps nothing of the round: no admitted envelope, no batch to re-publish
    assert shuffler.spool.admitted(sid, spec.round_id) == [] and shuffler.spool.unacknowledged() == []
    assert shuffler.spool._db.execute("SELECT count(*) FROM chunks").fetchone()[0] == 0
    # an honest client whose report was admitted learns its charged round was lost
    admitted_client = next(c for c in clients if (sid, spec.round_id) in c.sent)
    admitted_client.settle_outcome(failed_bytes)
    assert admitted_client.ledger.lost_rounds() == [(sid, spec.round_id)]


async def test_a_batch_never_acknowledged_stops_being_republished_and_ends_with_a_signed_outcome(tmp_path):
    from shuffledp.shuffler.spool import SqliteSpool

    deployment = Deployment()
    channel = InProcessChannel()
    path = tmp_path / "spool" / "spool.db"
    spool = SqliteSpool(path)
    shuffler = deployment.shuffler(channel, spool=spool, republish_interval=0.05, ack_timeout=0.25)
    spec = make_spec(round_id=0, min_batch=1, deadline=time.time(), deployment=deployment)
    sealed = report_format(0, spec.mechanism).sealed_size
    shuffler.spool.open_round(spec.session_id, 0, deployment.analyzer().sign_spec(spec))
    batch_id = os.urandom(16)
    chunks = batch_chunks(spec, deployment.shuffler_keys, batch_id, [bytes(sealed)], 16)
    shuffler.spool.release(spec.session_id, 0, batch_id, chunks)
    batches = await channel.subscribe(batch_topic(spec.session_id, 0))
    outcomes = await channel.subscribe(outcome_topic(spec.session_id, 0))
    task = asyncio.create_task(shuffler.serve())
    try:
        data = await asyncio.wait_for(outcomes.get(), 2)
        published = len(batches.get_nowait_all())
        await asyncio.sleep(0.3)  # several re-publishing periods
        after = len(batches.get_nowait_all())
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert published >= 2 and after == 0  # re-published until given up, never after
    outcome = decode_verified(data, RoundOutcome, deployment.shuffler_keys.signing_public)
    assert (outcome.outcome, outcome.reason, outcome.batch_id) == ("failed", "not-acknowledged", batch_id)
    assert shuffler.expired == 1 and shuffler.stats()["expired_batches"] == 1
    # the spool holds nothing to re-publish, after a restart too
    restarted = SqliteSpool(path)
    try:
        assert restarted.unacknowledged() == []
        assert restarted.round(spec.session_id, 0).state == "failed"  # given up: never re-opened, never "served"
        assert restarted._db.execute("SELECT count(*) FROM chunks").fetchone()[0] == 0
    finally:
        restarted.close()


async def test_a_batch_is_not_given_up_before_its_rounds_deadline_plus_the_ack_timeout():
    """The analyzer may still accept a batch until the deadline plus its grace period: the shuffler's
    ``ack_timeout`` runs from the round's deadline, so such a batch is re-published, not given up."""
    deployment = Deployment()
    channel = InProcessChannel()
    shuffler = deployment.shuffler(channel, republish_interval=0.02, ack_timeout=0.05)
    spec = make_spec(round_id=0, min_batch=1, deadline=time.time() + 3600, deployment=deployment)
    sealed = report_format(0, spec.mechanism).sealed_size
    shuffler.spool.open_round(spec.session_id, 0, deployment.analyzer().sign_spec(spec))
    chunks = batch_chunks(spec, deployment.shuffler_keys, bytes(16), [bytes(sealed)], 16)
    shuffler.spool.release(spec.session_id, 0, bytes(16), chunks)
    outcomes = await channel.subscribe(outcome_topic(spec.session_id, 0))
    task = asyncio.create_task(shuffler.serve())
    try:
        await asyncio.sleep(0.25)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert outcomes.get_nowait_all() == [] and shuffler.expired == 0
    assert [b.batch_id for b in shuffler.spool.unacknowledged()] == [bytes(16)] and shuffler.republished >= 3
