"""The shuffler's durable spool: state machine, uniqueness, resume after a restart,
and a real ``kill -9`` of a process in the middle of admitting envelopes.

The tests of the spool's rules (not of files or restarts) run on both spools, the SQLite one
and the in-memory one of simulations (the ``spool`` fixture): their semantics must be the same."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter

import numpy as np
import pytest

from cryptography.hazmat.primitives import serialization

from shuffledp.client.ledger import PrivacyLedger
from shuffledp.protocol.wire import codec
from shuffledp.protocol.transport.channel import InProcessChannel, announce_topic, batch_topic, receipts_topic, reports_topic
from shuffledp.protocol.errors import DuplicateReport, QuotaExceeded, ReplayedReport
from shuffledp.protocol.wire.messages import AdmissionReceipts, RoundSpec, ShuffledBatch
from shuffledp.protocol.wire.onion import EnvelopeOpener, decode_verified
from shuffledp.shuffler.memory_spool import MemorySpool
from shuffledp.shuffler.service import RoundAdmission, Shuffler
from shuffledp.shuffler.spool import AdmittedEnvelope, SqliteSpool

import parties
from parties import DEPLOYMENT, ISSUER, OTHER_SESSION, SESSION, SHUFFLER_KEYS

ANALYZER = DEPLOYMENT.analyzer()


def make_spec(round_id=0, min_batch=5, max_batch=50, deadline=None) -> RoundSpec:
    deadline = time.time() + 60 if deadline is None else deadline
    return parties.make_spec(round_id=round_id, min_batch=min_batch, max_batch=max_batch, deadline=deadline)


def envelopes(spec: RoundSpec, n: int) -> list[bytes]:
    signed = ANALYZER.sign_spec(spec)
    return [DEPLOYMENT.client(np.array([0.1 * i]), PrivacyLedger(9.0)).answer(signed)[0] for i in range(n)]


def sealed_of(spec: RoundSpec, data: list[bytes]) -> list[bytes]:
    opener = EnvelopeOpener(SHUFFLER_KEYS.hpke_private, spec)
    return [opener.open(d).sealed for d in data]


def admission(spec: RoundSpec, spool) -> RoundAdmission:
    return RoundAdmission(spec, SHUFFLER_KEYS, ISSUER, spool)


def shuffler(channel, spool=None) -> Shuffler:
    return DEPLOYMENT.shuffler(channel, spool=spool)


@pytest.fixture(params=["sqlite", "memory"])
def spool(request, tmp_path):
    """Each implementation of the spool's interface: SQLite on a file, and the in-memory spool."""
    made = SqliteSpool(tmp_path / "s.db") if request.param == "sqlite" else MemorySpool()
    yield made
    made.close()


def test_round_states_only_move_forward(spool):
    assert spool.open_round(SESSION, 1, b"spec").state == "open"
    spool.admit(SESSION, 1, AdmittedEnvelope(b"c" * 16, b"n" * 16, b"s" * 100))
    spool.release(SESSION, 1, b"b" * 16, [b"chunk0", b"chunk1"])
    assert spool.round(SESSION, 1).state == "released"
    spool.fail(SESSION, 1, "late")  # only an open round can fail
    assert spool.open_round(SESSION, 1, b"other").state == "released"  # re-opening keeps the state
    assert [(b.batch_id, b.chunks) for b in spool.unacknowledged()] == [(b"b" * 16, [b"chunk0", b"chunk1"])]
    assert spool.acknowledge(b"b" * 16) and not spool.acknowledge(b"b" * 16) and not spool.acknowledge(b"x")
    assert spool.round(SESSION, 1).state == "served" and spool.unacknowledged() == []
    assert spool.admitted(SESSION, 1) == []  # a served round's ciphertexts are deleted
    spool.open_round(SESSION, 2, b"spec")
    spool.admit(SESSION, 2, AdmittedEnvelope(b"c" * 16, b"n" * 16, b"s" * 100))
    spool.fail(SESSION, 2, "batch-too-small")
    assert [r.round_id for r in spool.rounds("failed")] == [2]
    assert spool.admitted(SESSION, 2) == []  # a failed round's reports are deleted, never forwarded


def test_spool_refuses_copies_itself(spool):
    spool.open_round(SESSION, 1, b"spec")
    spool.admit(SESSION, 1, AdmittedEnvelope(b"c" * 16, b"n" * 16, b"s" * 100))
    with pytest.raises(ReplayedReport):
        spool.admit(SESSION, 1, AdmittedEnvelope(b"d" * 16, b"n" * 16, b"t" * 100))
    with pytest.raises(DuplicateReport):
        spool.admit(SESSION, 1, AdmittedEnvelope(b"d" * 16, b"m" * 16, b"s" * 100))
    spool.admit(SESSION, 2, AdmittedEnvelope(b"c" * 16, b"n" * 16, b"s" * 100))  # another round: fine
    with pytest.raises(ReplayedReport):  # a group commit is all or nothing
        spool.admit_many(SESSION, 1, [AdmittedEnvelope(b"e" * 16, b"o" * 16, b"u" * 100), AdmittedEnvelope(b"e" * 16, b"n" * 16, b"v" * 100)])
    assert len(spool.admitted(SESSION, 1)) == 1 and len(spool.admitted(SESSION, 2)) == 1


def _env(i: int, nonce: int | None = None, sealed: int | None = None) -> AdmittedEnvelope:
    """A stand-in admitted envelope; ``nonce`` / ``sealed`` reuse another one's."""
    return AdmittedEnvelope(bytes([i]) * 16, bytes([i if nonce is None else nonce]) * 16,
                            bytes([i if sealed is None else sealed]) * 100)


def test_spool_keeps_rounds_and_the_order_of_admission(spool):
    assert spool.round(SESSION, 1) is None and spool.admitted(SESSION, 1) == [] and spool.rounds("open") == []
    assert spool.open_round(SESSION, 1, b"spec").signed_spec == b"spec"
    assert spool.open_round(SESSION, 1, b"other") == spool.round(SESSION, 1)  # the first spec stays
    assert spool.round(SESSION, 1).signed_spec == b"spec" and spool.round(SESSION, 1).state == "open"
    spool.admit_many(SESSION, 1, [_env(3), _env(1), _env(2)])
    spool.admit(SESSION, 1, _env(0))
    spool.admit_many(SESSION, 1, [])
    assert spool.admitted(SESSION, 1) == [_env(3), _env(1), _env(2), _env(0)]  # in order of admission
    with pytest.raises(DuplicateReport):  # nonce and report both seen: the report is named
        spool.admit(SESSION, 1, _env(9, nonce=3, sealed=3))
    with pytest.raises(ReplayedReport):  # a copy inside one admission
        spool.admit_many(SESSION, 1, [_env(4), _env(5, nonce=4)])
    with pytest.raises(DuplicateReport):
        spool.admit_many(SESSION, 1, [_env(4), _env(5, sealed=4)])
    with pytest.raises(DuplicateReport):  # the first refused envelope in order decides
        spool.admit_many(SESSION, 1, [_env(6, sealed=1), _env(7, nonce=1)])
    assert spool.admitted(SESSION, 1) == [_env(3), _env(1), _env(2), _env(0)]  # nothing of them written
    spool.admit(SESSION, 1, _env(4))  # the refused admissions left no trace
    spool.open_round(OTHER_SESSION, 1, b"spec")
    spool.admit(OTHER_SESSION, 1, _env(3))  # another session: fine
    spool.open_round(SESSION, 0, b"spec0")
    assert [(r.session_id, r.round_id) for r in spool.rounds("open")] == [(SESSION, 0), (SESSION, 1), (OTHER_SESSION, 1)]


def test_spool_releases_acknowledges_and_expires_batches_once(spool):
    for round_id in (3, 1, 2, 4):
        spool.open_round(SESSION, round_id, b"spec")
        spool.admit(SESSION, round_id, _env(round_id))
    spool.release(SESSION, 3, b"3" * 16, [b"c0", b"c1", b"c2"])
    spool.release(SESSION, 1, b"1" * 16, [b"d0"])
    spool.release(SESSION, 2, b"2" * 16, [])
    assert spool.admitted(SESSION, 3) == spool.admitted(SESSION, 1) == []  # deleted at the release
    assert spool.admitted(SESSION, 4) == [_env(4)]
    pending = spool.unacknowledged()
    assert [(b.batch_id, b.session_id, b.round_id, b.chunks) for b in pending] == [
        (b"1" * 16, SESSION, 1, [b"d0"]), (b"2" * 16, SESSION, 2, []), (b"3" * 16, SESSION, 3, [b"c0", b"c1", b"c2"])]
    assert [r.round_id for r in spool.rounds("released")] == [1, 2, 3]
    spool.fail(SESSION, 3, "late")  # a released round does not fail
    assert spool.round(SESSION, 3).state == "released"
    # given up: released -> failed, once; an acknowledgement afterwards changes nothing
    assert spool.expire(b"3" * 16) == (SESSION, 3)
    assert spool.round(SESSION, 3).state == "failed"
    assert spool.expire(b"3" * 16) is None and spool.acknowledge(b"3" * 16) is None
    assert spool.round(SESSION, 3).state == "failed"
    assert spool.open_round(SESSION, 3, b"replayed").state == "failed"  # never re-opened
    # acknowledged: served, once; a later expiry changes nothing
    assert spool.acknowledge(b"1" * 16) == (SESSION, 1)
    assert spool.expire(b"1" * 16) is None and spool.acknowledge(b"1" * 16) is None
    assert spool.round(SESSION, 1).state == "served"
    assert spool.expire(b"x" * 16) is None and spool.acknowledge(b"x" * 16) is None  # unknown batches
    # expiry fails only a released round: a batch stored for a round never opened leaves that round open
    spool.release(SESSION, 7, b"7" * 16, [b"e0"])
    assert spool.round(SESSION, 7) is None and spool.open_round(SESSION, 7, b"spec").state == "open"
    assert spool.expire(b"7" * 16) == (SESSION, 7) and spool.round(SESSION, 7).state == "open"
    assert [b.batch_id for b in spool.unacknowledged()] == [b"2" * 16]
    # an open round fails with its reports deleted; only from open (expire needs a released round)
    spool.fail(SESSION, 4, "batch-too-small")
    assert spool.round(SESSION, 4).state == "failed" and spool.admitted(SESSION, 4) == []
    assert [r.round_id for r in spool.rounds("failed")] == [3, 4] and [r.round_id for r in spool.rounds("open")] == [7]
    spool.close()
    spool.close()  # idempotent


def test_memory_spool_refuses_misuse_without_changing_anything():
    spool = MemorySpool()
    spool.open_round(SESSION, 1, b"spec")
    spool.release(SESSION, 1, b"b" * 16, [b"chunk"])
    with pytest.raises(ValueError):  # a batch id is stored once (SQLite: an IntegrityError)
        spool.release(SESSION, 2, b"b" * 16, [b"other"])
    assert [(b.round_id, b.chunks) for b in spool.unacknowledged()] == [(1, [b"chunk"])]
    spool.close()
    with pytest.raises(ValueError):  # closed (SQLite: a ProgrammingError)
        spool.round(SESSION, 1)


def test_admission_resumes_from_the_spool(tmp_path):
    spec = make_spec()
    data = envelopes(spec, 8)
    first = admission(spec, SqliteSpool(tmp_path / "s.db"))
    for d in data[:5]:
        first.admit(d)
    resumed = admission(spec, SqliteSpool(tmp_path / "s.db"))  # a new process on the same file
    assert resumed.stats.admitted == resumed.stats.resumed == 5 and resumed.payloads == first.payloads
    for d in data:  # the clients (or an attacker) send everything again
        resumed.offer(d)
    assert resumed.stats.admitted == 8 and resumed.stats.retransmitted == 5 and not resumed.stats.rejected
    # the per-credential quota survives the restart too
    assert len(first.per_client) == 5 and all(resumed.per_client[c] == 1 for c in first.per_client)
    client_id = next(iter(first.per_client))
    second_report = parties.envelope(spec, ISSUER.issue(client_id), bytes(len(first.payloads[0])))
    with pytest.raises(QuotaExceeded):
        resumed.admit(second_report)


async def _serve_until(shuffler: Shuffler, condition, timeout=10.0):
    task = asyncio.create_task(shuffler.serve())
    try:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, "condition not reached"
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_restarted_shuffler_resumes_the_round_and_never_reopens_a_served_one(tmp_path):
    path = tmp_path / "spool.db"
    channel = InProcessChannel()
    spec = make_spec(min_batch=6, max_batch=6)
    signed = ANALYZER.sign_spec(spec)
    data = envelopes(spec, 6)
    batches = await channel.subscribe(batch_topic(SESSION, spec.round_id))
    await channel.publish(announce_topic(SESSION), signed, retain=True)

    # first life: four envelopes admitted, then the process "dies" (task cancelled, objects dropped)
    first = shuffler(channel, SqliteSpool(path))

    async def send(items):
        for d in items:
            await channel.publish(reports_topic(SESSION, spec.round_id), d)

    task = asyncio.create_task(first.serve())
    await asyncio.sleep(0.05)
    await send(data[:4])
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert first.rounds[0].admitted == 4

    # second life, same spool: the round resumes with its four; replays are refused; two more fill it
    second = shuffler(channel, SqliteSpool(path))
    task = asyncio.create_task(second.serve())
    await asyncio.sleep(0.05)
    await send(data)  # everything again: four replays, two new
    raw = await asyncio.wait_for(batches.get(), 5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    stats = second.rounds[0]
    assert stats.resumed == 4 and stats.admitted == 6 and stats.retransmitted == 4 and not stats.rejected
    batch = codec.decode(raw, ShuffledBatch)
    assert Counter(batch.payloads) == Counter(sealed_of(spec, data))
    assert SqliteSpool(path).round(SESSION, 0).state == "released"

    # third life: the retained announcement of the released round is replayed; it is not re-opened
    third = shuffler(channel, SqliteSpool(path))
    await _serve_until(third, lambda: third.republished == 1)
    assert third.rounds == {}
    # ... but its unacknowledged batch is published again, byte for byte (the analyzer counts it once)
    assert channel.messages_by_topic[batch_topic(SESSION, 0)] == 2
    assert await asyncio.wait_for(batches.get(), 1) == raw


async def test_policy_admits_until_max_or_deadline_not_until_min(spool):
    """Honest clients answering before the deadline are not dropped because min_batch was reached."""
    channel = InProcessChannel()
    spec = make_spec(min_batch=2, max_batch=100, deadline=time.time() + 0.6)
    data = envelopes(spec, 7)
    batches = await channel.subscribe(batch_topic(SESSION, 0))
    await channel.publish(announce_topic(SESSION), ANALYZER.sign_spec(spec), retain=True)
    service = shuffler(channel, spool)
    task = asyncio.create_task(service.serve())
    await asyncio.sleep(0.05)
    for d in data:
        await channel.publish(reports_topic(SESSION, 0), d)
    raw = await asyncio.wait_for(batches.get(), 5)  # released at the deadline, with all seven
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert codec.decode(raw, ShuffledBatch).size == 7


async def test_a_shuffler_on_the_memory_spool_admits_refuses_and_releases_as_on_sqlite():
    """The same envelopes (a replay of an admitted nonce and an exact retransmission among them) to a
    shuffler on each spool: the same admissions, refusals, receipts and released batch."""
    spec = make_spec(min_batch=6, max_batch=6)
    data = envelopes(spec, 6)
    first = EnvelopeOpener(SHUFFLER_KEYS.hpke_private, spec).open(data[0])
    replay = parties.envelope(spec, parties.credential(99), bytes(len(first.sealed)), first.nonce)

    async def run(spool):
        channel = InProcessChannel()
        batches = await channel.subscribe(batch_topic(SESSION, spec.round_id))
        receipts = await channel.subscribe(receipts_topic(SESSION, spec.round_id))
        await channel.publish(announce_topic(SESSION), ANALYZER.sign_spec(spec), retain=True)
        service = shuffler(channel, spool)
        task = asyncio.create_task(service.serve())
        try:
            await asyncio.sleep(0.05)
            for d in [*data[:3], replay, data[0], *data[3:]]:
                await channel.publish(reports_topic(SESSION, spec.round_id), d)
            batch = codec.decode(await asyncio.wait_for(batches.get(), 5), ShuffledBatch)
            await asyncio.sleep(0.05)  # the last receipts
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        signed = [decode_verified(r, AdmissionReceipts, SHUFFLER_KEYS.signing_public) for r in receipts.get_nowait_all()]
        admitted = Counter(n for r in signed for n in r.admitted)
        refused = [(n, why) for r in signed for n, why in zip(r.refused, r.reasons)]
        return service.rounds[spec.round_id].as_dict(), batch, admitted, refused

    spools = SqliteSpool(":memory:"), MemorySpool()
    on_sqlite, on_memory = [await run(spool) for spool in spools]
    for stats, batch, admitted, refused in (on_sqlite, on_memory):
        assert stats["admitted"] == stats["forwarded"] == 6 and stats["retransmitted"] == 1
        assert stats["rejected"] == {"replay": 1}
        assert refused == [(first.nonce, "replay")]
        assert admitted == Counter({first.nonce: 2}) + Counter(EnvelopeOpener(SHUFFLER_KEYS.hpke_private, spec).open(d).nonce for d in data[1:])
        assert batch.size == 6 and Counter(batch.payloads) == Counter(sealed_of(spec, data))
    assert on_memory[0] == on_sqlite[0] and on_memory[2:] == on_sqlite[2:]
    for spool, (_, batch, _, _) in zip(spools, (on_sqlite, on_memory)):
        assert spool.round(SESSION, spec.round_id).state == "released" and spool.admitted(SESSION, spec.round_id) == []
        assert [b.batch_id for b in spool.unacknowledged()] == [batch.batch_id]


_CHILD = textwrap.dedent(
    """
    import sys, time
    from shuffledp.protocol.wire.credentials import CredentialIssuer
    from shuffledp.protocol.wire.messages import RoundSpec
    from shuffledp.protocol.wire.onion import ShufflerKeys
    from shuffledp.shuffler.service import RoundAdmission
    from shuffledp.shuffler.spool import SqliteSpool
    spec_path, spool_path, env_path, keys_path = sys.argv[1:5]
    from shuffledp.protocol.wire import codec
    spec = codec.decode(open(spec_path, "rb").read(), RoundSpec)
    keys = open(keys_path, "rb").read()
    shuffler_keys = ShufflerKeys.from_bytes(keys[:32], keys[32:64])
    admission = RoundAdmission(spec, shuffler_keys, CredentialIssuer(keys[64:96]), SqliteSpool(spool_path))
    data = open(env_path, "rb").read()
    size = int.from_bytes(data[:4], "big")
    items = [data[4 + i * size: 4 + (i + 1) * size] for i in range((len(data) - 4) // size)]
    print("ready", flush=True)
    for i, item in enumerate(items):
        admission.offer(item)
        if i == 40:
            print("half", flush=True)
            time.sleep(0.002)
    print("done", flush=True)
    time.sleep(60)
    """
)


def test_kill_9_mid_admission_loses_nothing_admitted_and_admits_nothing_twice(tmp_path):
    spec = make_spec(max_batch=200)
    data = envelopes(spec, 120)
    assert len({len(d) for d in data}) == 1  # one envelope length per round
    (tmp_path / "spec").write_bytes(codec.encode(spec))
    (tmp_path / "env").write_bytes(len(data[0]).to_bytes(4, "big") + b"".join(data))
    raw = serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    keys = SHUFFLER_KEYS.hpke_private.private_bytes(*raw) + SHUFFLER_KEYS.signing_private.private_bytes(*raw) + ISSUER.key
    (tmp_path / "keys").write_bytes(keys)
    spool_path = tmp_path / "spool.db"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path / "spec"), str(spool_path), str(tmp_path / "env"), str(tmp_path / "keys")],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        assert child.stdout.readline().strip() == "half"
        os.kill(child.pid, signal.SIGKILL)  # in the middle of admitting
    finally:
        child.wait(10)
    assert child.returncode == -signal.SIGKILL
    resumed = admission(spec, SqliteSpool(spool_path))
    survived = resumed.stats.admitted
    assert 41 <= survived <= 120
    # every committed envelope is back, in a consistent database, and none is admitted twice
    assert resumed.payloads == sealed_of(spec, data[:survived])
    for d in data:
        resumed.offer(d)
    assert resumed.stats.admitted == 120 and resumed.stats.retransmitted == survived and not resumed.stats.rejected
