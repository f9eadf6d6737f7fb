"""The shuffler's durable spool: state machine, uniqueness, resume after a restart,
and a real ``kill -9`` of a process in the middle of admitting envelopes."""

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
from shuffledp.protocol.transport.channel import InProcessChannel, announce_topic, batch_topic, reports_topic
from shuffledp.protocol.errors import DuplicateReport, QuotaExceeded, ReplayedReport
from shuffledp.protocol.wire.messages import RoundSpec, ShuffledBatch
from shuffledp.protocol.wire.onion import EnvelopeOpener
from shuffledp.shuffler.service import RoundAdmission, Shuffler
from shuffledp.shuffler.spool import AdmittedEnvelope, SqliteSpool

import parties
from parties import DEPLOYMENT, SESSION, SHUFFLER_KEYS, ISSUER

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


def test_round_states_only_move_forward(tmp_path):
    spool = SqliteSpool(tmp_path / "s.db")
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


def test_spool_refuses_copies_itself(tmp_path):
    spool = SqliteSpool(tmp_path / "s.db")
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


async def test_policy_admits_until_max_or_deadline_not_until_min(tmp_path):
    """Honest clients answering before the deadline are not dropped because min_batch was reached."""
    channel = InProcessChannel()
    spec = make_spec(min_batch=2, max_batch=100, deadline=time.time() + 0.6)
    data = envelopes(spec, 7)
    batches = await channel.subscribe(batch_topic(SESSION, 0))
    await channel.publish(announce_topic(SESSION), ANALYZER.sign_spec(spec), retain=True)
    service = shuffler(channel)
    task = asyncio.create_task(service.serve())
    await asyncio.sleep(0.05)
    for d in data:
        await channel.publish(reports_topic(SESSION, 0), d)
    raw = await asyncio.wait_for(batches.get(), 5)  # released at the deadline, with all seven
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert codec.decode(raw, ShuffledBatch).size == 7


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
