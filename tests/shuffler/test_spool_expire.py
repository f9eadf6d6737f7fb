"""A released batch the analyzer never acknowledges is given up (``ack_timeout``): the spool must record
its round as ``failed`` (reason ``not-acknowledged``), not ``served``, and keep nothing of it.

A restarted shuffler, an operator or an audit reading the spool must not take a batch the shuffler
gave up for one the analyzer acknowledged; the round's chunks (its sealed reports) and any row linking
its clients to reports are gone from the files (read raw, as in ``test_spool_at_rest``); a restart
neither re-opens nor re-publishes it, and an acknowledgement arriving after it does not make it served.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time

from shuffledp.protocol.transport.channel import InProcessChannel, acks_topic, announce_topic, batch_topic, outcome_topic
from shuffledp.protocol.wire.messages import RoundOutcome
from shuffledp.protocol.wire.onion import decode_verified
from shuffledp.protocol.wire.report_format import report_format
from shuffledp.shuffler.service import NOT_ACKNOWLEDGED, batch_chunks
from shuffledp.shuffler.spool import AdmittedEnvelope, SqliteSpool

from parties import DEPLOYMENT, SESSION, SHUFFLER_KEYS, make_spec
from test_spool_at_rest import found, raw_files

ANALYZER = DEPLOYMENT.analyzer()
N = 12


def _h(*parts) -> bytes:
    return hashlib.sha256(repr(parts).encode()).digest()


def _released_round(path, round_id: int = 0):
    """A round admitted (distinct client ids, nonces and sealed reports) and released, its deadline passed:
    the spec, its signed form, the batch id, the secrets (client ids + nonces, sealed reports)."""
    spec = make_spec(round_id=round_id, min_batch=1, max_batch=N, deadline=time.time() - 1)
    signed = ANALYZER.sign_spec(spec)
    size = report_format(round_id, spec.mechanism).sealed_size
    envelopes = [AdmittedEnvelope(_h("client", i)[:16], _h("nonce", i)[:16], (_h("sealed", i) * (size // 32 + 1))[:size])
                 for i in range(N)]
    spool = SqliteSpool(path)
    try:
        spool.open_round(SESSION, round_id, signed)
        spool.admit_many(SESSION, round_id, envelopes)
        linking = [e.client_id for e in envelopes] + [e.nonce for e in envelopes]
        sealed = [e.sealed for e in envelopes]
        opened = raw_files(path)
        assert sum(found(opened, linking).values()) >= len(linking)  # positive control: the search finds them
        batch_id = os.urandom(16)
        spool.release(SESSION, round_id, batch_id, batch_chunks(spec, SHUFFLER_KEYS, batch_id, sealed, 4))
        assert sum(found(raw_files(path), sealed).values()) >= N  # the chunks hold the sealed reports
    finally:
        spool.close()
    return spec, signed, batch_id, linking, sealed


def _state_and_reason(spool: SqliteSpool, round_id: int) -> tuple[str, str | None]:
    return spool._db.execute("SELECT state, reason FROM rounds WHERE session_id = ? AND round_id = ?",
                             (SESSION, round_id)).fetchone()


# --------------------------------------------------------------------------- the spool alone


def test_expire_moves_a_released_round_to_failed_and_deletes_its_chunks(tmp_path):
    path = tmp_path / "spool.db"
    spec, _, batch_id, linking, sealed = _released_round(path)
    spool = SqliteSpool(path)
    try:
        assert spool.round(SESSION, 0).state == "released"
        assert spool.expire(batch_id) == (SESSION, 0)
        assert _state_and_reason(spool, 0) == ("failed", NOT_ACKNOWLEDGED)
        assert spool.unacknowledged() == [] and spool.admitted(SESSION, 0) == []
        assert spool._db.execute("SELECT count(*) FROM chunks").fetchone()[0] == 0
        files = raw_files(path)
        assert files["-wal"] == b""  # the log is truncated, as at an acknowledgement
        assert found(files, sealed) == {n: 0 for n in files} and found(files, linking) == {n: 0 for n in files}
        # final: neither a late acknowledgement nor a second expiry changes it
        assert spool.acknowledge(batch_id) is None and spool.expire(batch_id) is None
        assert _state_and_reason(spool, 0) == ("failed", NOT_ACKNOWLEDGED)
        assert spool.open_round(SESSION, 0, b"replayed").state == "failed"  # never re-opened
    finally:
        spool.close()


def test_expire_does_not_touch_an_acknowledged_round_or_an_open_one(tmp_path):
    path = tmp_path / "spool.db"
    _, _, batch_id, _, _ = _released_round(path)
    spool = SqliteSpool(path)
    try:
        assert spool.acknowledge(batch_id) == (SESSION, 0)
        assert spool.expire(batch_id) is None  # served is final
        assert spool.round(SESSION, 0).state == "served"
        assert spool.expire(os.urandom(16)) is None  # an unknown batch
        spool.open_round(SESSION, 1, b"spec")
        spool.admit(SESSION, 1, AdmittedEnvelope(b"c" * 16, b"n" * 16, b"s" * 32))
        assert spool.round(SESSION, 1).state == "open" and len(spool.admitted(SESSION, 1)) == 1
    finally:
        spool.close()


# --------------------------------------------------------------------------- the service's ack timeout


async def _serve_for(shuffler, seconds: float) -> None:
    task = asyncio.create_task(shuffler.serve())
    try:
        await asyncio.sleep(seconds)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_an_ack_timeout_records_the_round_failed_not_served_and_a_restart_leaves_it_so(tmp_path):
    path = tmp_path / "spool" / "spool.db"
    spec, signed, batch_id, linking, sealed = _released_round(path)
    channel = InProcessChannel()
    outcomes = await channel.subscribe(outcome_topic(SESSION, 0))
    shuffler = DEPLOYMENT.shuffler(channel, spool=SqliteSpool(path), republish_interval=0.05, ack_timeout=0.2)
    task = asyncio.create_task(shuffler.serve())
    try:
        outcome = decode_verified(await asyncio.wait_for(outcomes.get(), 5), RoundOutcome, SHUFFLER_KEYS.signing_public)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert (outcome.outcome, outcome.reason, outcome.batch_id) == ("failed", NOT_ACKNOWLEDGED, batch_id)
    assert shuffler.expired == 1 and shuffler.acknowledged == 0
    # the durable record says what happened: given up, not acknowledged
    assert _state_and_reason(shuffler.spool, 0) == ("failed", NOT_ACKNOWLEDGED)
    files = raw_files(path)
    assert found(files, sealed) == {n: 0 for n in files} and found(files, linking) == {n: 0 for n in files}
    # the analyzer's acknowledgement arriving after the expiry does not make it served
    assert shuffler.handle_ack(ANALYZER.acknowledge(spec, batch_id)) is False
    assert shuffler.spool.round(SESSION, 0).state == "failed" and shuffler.acknowledged == 0
    shuffler.spool.close()

    # a restarted shuffler (the announcement still retained) neither re-opens nor re-publishes the round
    channel = InProcessChannel()
    await channel.publish(announce_topic(SESSION), signed, retain=True)
    batches = await channel.subscribe(batch_topic(SESSION, 0))
    restarted = DEPLOYMENT.shuffler(channel, spool=SqliteSpool(path), republish_interval=0.05, ack_timeout=0.2)
    await _serve_for(restarted, 0.3)
    try:
        assert batches.get_nowait_all() == [] and restarted.republished == 0 and restarted.expired == 0
        assert 0 not in restarted.rounds
        assert _state_and_reason(restarted.spool, 0) == ("failed", NOT_ACKNOWLEDGED)
        assert restarted.spool.rounds("open") == [] and restarted.spool.unacknowledged() == []
        assert restarted.handle_ack(ANALYZER.acknowledge(spec, batch_id)) is False
        assert restarted.spool.round(SESSION, 0).state == "failed"
    finally:
        restarted.spool.close()
    files = raw_files(path)
    assert found(files, sealed) == {n: 0 for n in files} and found(files, linking) == {n: 0 for n in files}


# --------------------------------------------------------------------------- the outcome follows the spool


class _GatedOutcomes(InProcessChannel):
    """A channel whose first publishes of round 0's outcome wait for ``gate`` (``entered`` is set then),
    or fail while ``down`` (a broker away)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()
        self.down = 0

    async def publish(self, topic, payload, *, retain=False):
        if topic == outcome_topic(SESSION, 0):
            if self.down:
                self.down -= 1
                from shuffledp.protocol.errors import TransportError

                raise TransportError("broker away")
            self.entered.set()
            await self.gate.wait()
        await super().publish(topic, payload, retain=retain)


def _decoded(data: bytes) -> RoundOutcome:
    return decode_verified(data, RoundOutcome, SHUFFLER_KEYS.signing_public)


async def _until(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)


async def test_an_acknowledgement_landing_while_the_failed_outcome_is_published_finds_the_round_failed(tmp_path):
    """The analyzer's acknowledgement arrives while the shuffler is publishing the ``failed`` outcome of
    the batch it gives up: the retained outcome clients read and the spool's final state must agree."""
    path = tmp_path / "spool" / "spool.db"
    spec, _, batch_id, _, _ = _released_round(path)
    channel = _GatedOutcomes()
    outcomes = await channel.subscribe(outcome_topic(SESSION, 0))
    shuffler = DEPLOYMENT.shuffler(channel, spool=SqliteSpool(path), republish_interval=0.05, ack_timeout=0.0)
    task = asyncio.create_task(shuffler.serve())
    try:
        await asyncio.wait_for(channel.entered.wait(), 5)  # the expiry is publishing its outcome ...
        await channel.publish(acks_topic(SESSION), ANALYZER.acknowledge(spec, batch_id))  # ... and the ack lands
        await _until(lambda: shuffler.acknowledged + sum(shuffler.rejected_acks.values()) > 0)
        channel.gate.set()
        published = _decoded(await asyncio.wait_for(outcomes.get(), 5))
        await asyncio.sleep(0.1)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    try:
        final = shuffler.spool.round(SESSION, 0).state
        assert (published.outcome, final) == ("failed", "failed"), "the published outcome contradicts the spool"
        assert _state_and_reason(shuffler.spool, 0) == ("failed", NOT_ACKNOWLEDGED)
        assert shuffler.expired == 1 and shuffler.acknowledged == 0 and shuffler.rejected_acks["unknown-batch"] == 1
        assert outcomes.get_nowait_all() == []  # one outcome, nothing contradicting it later
    finally:
        shuffler.spool.close()


async def test_an_acknowledgement_before_the_expiry_wins_and_no_failed_outcome_is_published(tmp_path):
    """An acknowledgement written just before the batch is given up: the round is served, and no ``failed``
    outcome may be published for it (nor the expiry counted)."""
    path = tmp_path / "spool" / "spool.db"
    spec, _, batch_id, _, _ = _released_round(path)
    channel = InProcessChannel()
    outcomes = await channel.subscribe(outcome_topic(SESSION, 0))
    shuffler = DEPLOYMENT.shuffler(channel, spool=SqliteSpool(path), republish_interval=0.05, ack_timeout=0.0)
    try:
        assert shuffler.handle_ack(ANALYZER.acknowledge(spec, batch_id)) is True
        await shuffler._expire(SESSION, 0, batch_id)  # the pass that had listed the batch before the ack
        assert outcomes.get_nowait_all() == []
        assert shuffler.spool.round(SESSION, 0).state == "served" and shuffler.expired == 0
    finally:
        shuffler.spool.close()


async def test_a_failed_outcome_the_broker_did_not_take_is_published_again_and_the_round_stays_failed(tmp_path):
    """The spool is written first: if the outcome cannot be published, the round is ``failed`` (and its
    chunks deleted) all the same, and the outcome goes out once the broker is back."""
    path = tmp_path / "spool" / "spool.db"
    _, _, batch_id, _, sealed = _released_round(path)
    channel = _GatedOutcomes()
    channel.gate.set()
    channel.down = 2  # the first attempt and the first retry fail
    outcomes = await channel.subscribe(outcome_topic(SESSION, 0))
    shuffler = DEPLOYMENT.shuffler(channel, spool=SqliteSpool(path), republish_interval=0.05, ack_timeout=0.0)
    try:
        await shuffler._expire(SESSION, 0, batch_id)  # does not raise: the expiry is written
        assert _state_and_reason(shuffler.spool, 0) == ("failed", NOT_ACKNOWLEDGED) and shuffler.expired == 1
        assert shuffler.spool.unacknowledged() == [] and outcomes.get_nowait_all() == []
        files = raw_files(path)
        assert found(files, sealed) == {n: 0 for n in files}
        await shuffler.republish_unacknowledged()  # the next re-publishing pass: the broker is still away
        assert outcomes.get_nowait_all() == [] and channel.down == 0
        await shuffler.republish_unacknowledged()  # and the one after: it is back
        published = _decoded(await asyncio.wait_for(outcomes.get(), 5))
        assert (published.outcome, published.reason, published.batch_id) == ("failed", NOT_ACKNOWLEDGED, batch_id)
        await shuffler.republish_unacknowledged()
        assert outcomes.get_nowait_all() == []  # published once it went out, not again and again
    finally:
        shuffler.spool.close()
