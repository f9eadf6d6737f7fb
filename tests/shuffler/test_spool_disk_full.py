"""A spool that cannot be written (a full disk) must not stop the shuffler nor lose what it admitted.

No mock of SQLite: the spool's database is capped with ``PRAGMA max_page_count``, so
an insert that needs one more page fails with SQLITE_FULL ("database or disk is
full"), the error and the automatic rollback a full disk gives; lifting the cap is
the disk getting space back. ``PRAGMA query_only`` (SQLITE_READONLY) stands for a
spool that refuses every write, deletes included.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from collections import Counter

import pytest

from shuffledp.protocol.wire import codec
from shuffledp.protocol.transport.channel import (
    InProcessChannel,
    acks_topic,
    announce_topic,
    batch_topic,
    outcome_topic,
    receipts_topic,
    reports_topic,
)
from shuffledp.protocol.wire.messages import AdmissionReceipts, RoundOutcome, ShuffledBatch
from shuffledp.protocol.wire.report_format import report_format
from shuffledp.shuffler.metrics import render_metrics
from shuffledp.shuffler.service import REFUSALS_PER_CREDENTIAL, RoundAdmission
from shuffledp.shuffler.spool import AdmittedEnvelope, SpoolStorageError, SqliteSpool

import parties
from parties import DEPLOYMENT, ISSUER, SESSION, SHUFFLER_KEYS, credential, envelope, nonce

ANALYZER = DEPLOYMENT.analyzer()
UNCAPPED = 1073741823


def make_spec(**options):
    options.setdefault("deadline", time.time() + 60)
    options.setdefault("round_id", 0)
    return parties.make_spec(**options)


def sealed(spec, i: int) -> bytes:
    size = report_format(spec.round_id, spec.mechanism).sealed_size
    return i.to_bytes(8, "big") + os.urandom(size - 8)


def envelopes(spec, ids) -> list[bytes]:
    return [envelope(spec, credential(i), sealed(spec, i), nonce(i)) for i in ids]


def cap(spool: SqliteSpool, pages: int | None = None) -> None:
    """The disk is full: no page beyond the ones the database has now (or ``pages``)."""
    current = spool._db.execute("PRAGMA page_count").fetchone()[0]
    spool._db.execute(f"PRAGMA max_page_count={current if pages is None else pages}")


def uncap(spool: SqliteSpool) -> None:
    spool._db.execute(f"PRAGMA max_page_count={UNCAPPED}")


def fill(spool: SqliteSpool) -> int:
    """Cap the database, then admit filler rows (another round's) until a write fails; how many fit."""
    cap(spool)
    spool.open_round(SESSION, 99, b"filler")
    for i in range(100000):
        try:
            spool.admit(SESSION, 99, AdmittedEnvelope(os.urandom(16), os.urandom(16), os.urandom(200)))
        except (SpoolStorageError, sqlite3.OperationalError):  # (typed since the spool types its failures)
            return i
    raise AssertionError("the capped spool never filled")


def failures_in(records) -> str:
    return "\n".join(r.getMessage() for r in records)


# --------------------------------------------------------------------------- the spool


def test_a_write_on_a_full_disk_fails_typed_with_the_original_error_and_keeps_the_committed(tmp_path, caplog):
    spool = SqliteSpool(tmp_path / "spool.db")
    spool.open_round(SESSION, 0, b"spec")
    before = [AdmittedEnvelope(os.urandom(16), os.urandom(16), os.urandom(300)) for _ in range(20)]
    spool.admit_many(SESSION, 0, before)
    fill(spool)
    burst = [AdmittedEnvelope(os.urandom(16), os.urandom(16), os.urandom(300)) for _ in range(50)]
    with caplog.at_level(logging.DEBUG, logger="shuffledp"), pytest.raises(SpoolStorageError) as info:
        spool.admit_many(SESSION, 0, burst)
    error = info.value
    assert error.reason == "storage-error" and "database or disk is full" in str(error)
    assert isinstance(error.__cause__, sqlite3.OperationalError) and error.__cause__.sqlite_errorname == "SQLITE_FULL"
    chain, e = [], error  # no second error (a failed ROLLBACK) hides or joins the original
    while e is not None:
        chain.append(str(e))
        e = e.__cause__ or e.__context__
    assert not any("rollback" in text.lower() for text in chain + [failures_in(caplog.records)])
    assert spool.admitted(SESSION, 0) == before  # all or nothing: none of the burst, all of before
    uncap(spool)  # space again: the same burst goes in
    spool.admit_many(SESSION, 0, burst)
    assert spool.admitted(SESSION, 0) == before + burst
    spool.close()


# --------------------------------------------------------------------------- admission


def test_an_admission_that_cannot_be_written_is_refused_without_a_receipt_and_admitted_once_there_is_room(tmp_path, caplog):
    spec = make_spec(max_batch=200)
    spool = SqliteSpool(tmp_path / "spool.db")
    spool.open_round(SESSION, 0, b"spec")
    admission = RoundAdmission(spec, SHUFFLER_KEYS, ISSUER, spool)
    first = envelopes(spec, range(30))
    assert len(admission.offer_many(first).admitted) == 30
    committed = list(admission.payloads)
    fill(spool)

    later = envelopes(spec, range(30, 60))
    with caplog.at_level(logging.INFO, logger="shuffledp"):
        receipts = admission.offer_many(later)  # never raises
        for _ in range(REFUSALS_PER_CREDENTIAL + 2):  # clients retrying while the disk is full
            assert not admission.offer_many(later[:1])
    assert not receipts  # neither admitted nor refused: the clients send them again later
    assert admission.stats.rejected == Counter({"storage-error": 30 + REFUSALS_PER_CREDENTIAL + 2})
    assert admission.stats.admitted == 30 and admission.payloads == committed
    assert [e.sealed for e in spool.admitted(SESSION, 0)] == committed  # nothing admitted before is lost
    log = failures_in(caplog.records)
    assert "database or disk is full" in log and "rollback" not in log.lower()
    assert "30 envelope(s) not admitted" in log
    with pytest.raises(SpoolStorageError):  # the one-envelope call says it too, typed
        admission.admit(later[0])

    uncap(spool)  # the disk has room again: the same envelopes, sent again, are admitted (once)
    receipts = admission.offer_many(later + first[:3])
    assert receipts.admitted == [nonce(i) for i in range(30, 60)] + [nonce(i) for i in range(3)] and not receipts.refused
    assert admission.stats.admitted == 60 and admission.stats.retransmitted == 3
    assert "rate-limited" not in admission.stats.rejected  # a full disk is not held against the clients
    assert len(spool.admitted(SESSION, 0)) == 60
    resumed = RoundAdmission(spec, SHUFFLER_KEYS, ISSUER, SqliteSpool(tmp_path / "spool.db"))  # and after a restart
    assert resumed.payloads == admission.payloads
    spool.close()


# --------------------------------------------------------------------------- the service


async def _until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_the_service_keeps_serving_through_a_full_disk_and_its_round_keeps_every_admitted_report(tmp_path, caplog):
    n = 40
    spec = make_spec(min_batch=n, max_batch=n)
    channel = InProcessChannel()
    spool = SqliteSpool(tmp_path / "spool.db")
    shuffler = DEPLOYMENT.shuffler(channel, spool=spool, storage_retry_interval=0.05)
    receipts = await channel.subscribe(receipts_topic(SESSION, 0))
    batches = await channel.subscribe(batch_topic(SESSION, 0))
    await channel.publish(announce_topic(SESSION), ANALYZER.sign_spec(spec), retain=True)
    data = envelopes(spec, range(n))
    task = asyncio.create_task(shuffler.serve())
    try:
        await _until(lambda: 0 in shuffler.rounds)
        for d in data[:20]:
            await channel.publish(reports_topic(SESSION, 0), d)
        await _until(lambda: shuffler.rounds[0].admitted == 20)
        named = set()
        while len(named) < 20:
            named.update(codec.decode(await asyncio.wait_for(receipts.get(), 5), AdmissionReceipts).admitted)

        fill(spool)  # the disk is full
        with caplog.at_level(logging.INFO, logger="shuffledp"):
            for d in data[20:]:
                await channel.publish(reports_topic(SESSION, 0), d)
            await _until(lambda: shuffler.rounds[0].rejected["storage-error"] == 20)
        assert not task.done()  # the service is up
        assert receipts.get_nowait_all(100) == []  # no receipt for the unwritten envelopes
        assert shuffler.rounds[0].admitted == 20
        assert "database or disk is full" in failures_in(caplog.records)
        metrics = render_metrics(shuffler.stats())
        assert 'shuffledp_shuffler_rejected_total{reason="storage-error"} 20' in metrics

        uncap(spool)  # room again; the clients retransmit what got no receipt
        for d in data[20:]:
            await channel.publish(reports_topic(SESSION, 0), d)
        batch = codec.decode(await asyncio.wait_for(batches.get(), 10), ShuffledBatch)
        assert Counter(batch.payloads) == Counter(parties_sealed(spec, data))  # every admitted report is in the round
        assert shuffler.rounds[0].admitted == n and spool.round(SESSION, 0).state == "released"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert "Traceback" not in caplog.text


def parties_sealed(spec, data):
    from shuffledp.protocol.wire.onion import EnvelopeOpener

    opener = EnvelopeOpener(SHUFFLER_KEYS.hpke_private, spec)
    return [opener.open(d).sealed for d in data]


async def test_a_release_the_disk_cannot_hold_waits_for_room_and_publishes_nothing_before(tmp_path, caplog):
    spec = make_spec(min_batch=5, max_batch=1000, deadline=time.time() + 2.0)
    channel = InProcessChannel()
    spool = SqliteSpool(tmp_path / "spool.db")
    shuffler = DEPLOYMENT.shuffler(channel, spool=spool, storage_retry_interval=0.05)
    batches = await channel.subscribe(batch_topic(SESSION, 0))
    outcomes = await channel.subscribe(outcome_topic(SESSION, 0))
    await channel.publish(announce_topic(SESSION), ANALYZER.sign_spec(spec), retain=True)
    data = envelopes(spec, range(80))  # a batch larger than a page
    task = asyncio.create_task(shuffler.serve())
    try:
        await _until(lambda: 0 in shuffler.rounds)
        for d in data:
            await channel.publish(reports_topic(SESSION, 0), d)
        await _until(lambda: shuffler.rounds[0].admitted == 80)
        assert spool.round(SESSION, 0).state == "open"
        fill(spool)  # the batch's chunks need pages the disk no longer has
        with caplog.at_level(logging.INFO, logger="shuffledp"):
            await _until(lambda: shuffler.storage_errors["release"] >= 3)
        assert not task.done()
        assert batches.get_nowait_all(10) == [] and outcomes.get_nowait_all(10) == []  # nothing published unspooled
        assert spool.round(SESSION, 0).state == "open" and len(spool.admitted(SESSION, 0)) == 80  # resumable as is
        assert "release not written to the spool" in caplog.text and "database or disk is full" in caplog.text
        assert 'shuffledp_shuffler_storage_errors_total{operation="release"}' in render_metrics(shuffler.stats())
        uncap(spool)
        batch = codec.decode(await asyncio.wait_for(batches.get(), 10), ShuffledBatch)
        assert Counter(batch.payloads) == Counter(parties_sealed(spec, data))
        outcome = codec.decode(await asyncio.wait_for(outcomes.get(), 5), RoundOutcome)
        assert outcome.outcome == "released" and outcome.admitted == 80
        assert spool.round(SESSION, 0).state == "released" and spool.admitted(SESSION, 0) == []
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_an_acknowledgement_the_spool_cannot_write_is_written_later(tmp_path):
    spec = make_spec(min_batch=5, max_batch=5)
    channel = InProcessChannel()
    spool = SqliteSpool(tmp_path / "spool.db")
    shuffler = DEPLOYMENT.shuffler(channel, spool=spool, republish_interval=0.1)
    batches = await channel.subscribe(batch_topic(SESSION, 0))
    await channel.publish(announce_topic(SESSION), ANALYZER.sign_spec(spec), retain=True)
    task = asyncio.create_task(shuffler.serve())
    try:
        await _until(lambda: 0 in shuffler.rounds)
        for d in envelopes(spec, range(5)):
            await channel.publish(reports_topic(SESSION, 0), d)
        batch = codec.decode(await asyncio.wait_for(batches.get(), 10), ShuffledBatch)
        spool._db.execute("PRAGMA query_only=ON")  # every write now fails (SQLITE_READONLY)
        await channel.publish(acks_topic(SESSION), ANALYZER.acknowledge(spec, batch.batch_id))
        await _until(lambda: shuffler.rejected_acks["storage-error"] == 1)
        await asyncio.sleep(0.3)
        assert not task.done() and shuffler.storage_errors["acknowledge"] >= 2  # retried
        assert batches.get_nowait_all(10) == []  # the analyzer has it: not re-published meanwhile
        spool._db.execute("PRAGMA query_only=OFF")
        await _until(lambda: shuffler.acknowledged == 1)
        assert spool.round(SESSION, 0).state == "served" and spool.unacknowledged() == []
        assert shuffler.rounds[0].outcome == "served"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
