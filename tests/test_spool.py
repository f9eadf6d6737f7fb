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

from shuffledp.analyzer.service import Analyzer
from shuffledp.client.client import Client
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.protocol import codec
from shuffledp.protocol.channel import InProcessChannel, announce_topic, batch_topic, reports_topic, spec_topic
from shuffledp.protocol.errors import DuplicateReport, ReplayedReport
from shuffledp.protocol.messages import Envelope, HadamardRangeParams, RoundSpec, ShuffledBatch
from shuffledp.shuffler.service import RoundAdmission, Shuffler
from shuffledp.shuffler.spool import AdmittedEnvelope, SqliteSpool

ANALYZER = Analyzer()
SESSION = bytes(range(16))
PARAMS = HadamardRangeParams(-4.0, 4.0, 0.5)


def make_spec(round_id=0, min_batch=5, max_batch=50, deadline=None) -> RoundSpec:
    deadline = time.time() + 60 if deadline is None else deadline
    return RoundSpec(SESSION, round_id, PARAMS, 0.5, ANALYZER.keys.hpke_public, min_batch, deadline, max_batch=max_batch)


def envelopes(spec: RoundSpec, n: int) -> list[bytes]:
    signed = ANALYZER.sign_spec(spec)
    return [
        Client(np.array([0.1 * i]), ANALYZER.keys.signing_public, PrivacyLedger(9.0)).answer(signed)[0]
        for i in range(n)
    ]


def test_round_states_only_move_forward(tmp_path):
    spool = SqliteSpool(tmp_path / "s.db")
    assert spool.open_round(SESSION, 1, b"spec").state == "open"
    spool.release(SESSION, 1, b"b" * 16, b"batch")
    assert spool.round(SESSION, 1).state == "released"
    spool.fail(SESSION, 1, "late")  # only an open round can fail
    assert spool.open_round(SESSION, 1, b"other").state == "released"  # re-opening keeps the state
    assert [b.batch_id for b in spool.unacknowledged()] == [b"b" * 16]
    assert spool.acknowledge(b"b" * 16) and not spool.acknowledge(b"b" * 16) and not spool.acknowledge(b"x")
    assert spool.round(SESSION, 1).state == "served" and spool.unacknowledged() == []
    spool.open_round(SESSION, 2, b"spec")
    spool.fail(SESSION, 2, "batch-too-small")
    assert [r.round_id for r in spool.rounds("failed")] == [2]


def test_spool_refuses_copies_itself(tmp_path):
    spool = SqliteSpool(tmp_path / "s.db")
    spool.open_round(SESSION, 1, b"spec")
    spool.admit(SESSION, 1, AdmittedEnvelope(b"c" * 16, b"n" * 16, b"s" * 100))
    with pytest.raises(ReplayedReport):
        spool.admit(SESSION, 1, AdmittedEnvelope(b"d" * 16, b"n" * 16, b"t" * 100))
    with pytest.raises(DuplicateReport):
        spool.admit(SESSION, 1, AdmittedEnvelope(b"d" * 16, b"m" * 16, b"s" * 100))
    spool.admit(SESSION, 2, AdmittedEnvelope(b"c" * 16, b"n" * 16, b"s" * 100))  # another round: fine
    assert len(spool.admitted(SESSION, 1)) == 1 and len(spool.admitted(SESSION, 2)) == 1


def test_admission_resumes_from_the_spool(tmp_path):
    spec = make_spec()
    data = envelopes(spec, 8)
    first = RoundAdmission(spec, SqliteSpool(tmp_path / "s.db"))
    for d in data[:5]:
        first.admit(d)
    resumed = RoundAdmission(spec, SqliteSpool(tmp_path / "s.db"))  # a new process on the same file
    assert resumed.stats.admitted == resumed.stats.resumed == 5 and resumed.payloads == first.payloads
    for d in data:  # the clients (or an attacker) send everything again
        resumed.offer(d)
    assert resumed.stats.admitted == 8 and resumed.stats.rejected == Counter({"replay": 5})


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
    first = Shuffler(channel, SESSION, ANALYZER.keys.signing_public, spool=SqliteSpool(path))

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
    second = Shuffler(channel, SESSION, ANALYZER.keys.signing_public, spool=SqliteSpool(path))
    task = asyncio.create_task(second.serve())
    await asyncio.sleep(0.05)
    await send(data)  # everything again: four replays, two new
    raw = await asyncio.wait_for(batches.get(), 5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    stats = second.rounds[0]
    assert stats.resumed == 4 and stats.admitted == 6 and stats.rejected == Counter({"replay": 4})
    batch = codec.decode(raw, ShuffledBatch)
    assert Counter(batch.payloads) == Counter(codec.decode(d, Envelope).sealed for d in data)
    assert SqliteSpool(path).round(SESSION, 0).state == "released"

    # third life: the retained announcement of the released round is replayed; it is not re-opened
    third = Shuffler(channel, SESSION, ANALYZER.keys.signing_public, spool=SqliteSpool(path))
    await _serve_until(third, lambda: True)
    await asyncio.sleep(0)
    assert third.rounds == {}
    assert channel.messages_by_topic[batch_topic(SESSION, 0)] == 1


async def test_policy_admits_until_max_or_deadline_not_until_min(tmp_path):
    """Honest clients answering before the deadline are not dropped because min_batch was reached."""
    channel = InProcessChannel()
    spec = make_spec(min_batch=2, max_batch=100, deadline=time.time() + 0.6)
    data = envelopes(spec, 7)
    batches = await channel.subscribe(batch_topic(SESSION, 0))
    await channel.publish(announce_topic(SESSION), ANALYZER.sign_spec(spec), retain=True)
    shuffler = Shuffler(channel, SESSION, ANALYZER.keys.signing_public)
    task = asyncio.create_task(shuffler.serve())
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
    from shuffledp.protocol.messages import HadamardRangeParams, RoundSpec
    from shuffledp.shuffler.service import RoundAdmission
    from shuffledp.shuffler.spool import SqliteSpool
    spec_path, spool_path, env_path = sys.argv[1:4]
    from shuffledp.protocol import codec
    spec = codec.decode(open(spec_path, "rb").read(), RoundSpec)
    admission = RoundAdmission(spec, SqliteSpool(spool_path))
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
    spool_path = tmp_path / "spool.db"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path / "spec"), str(spool_path), str(tmp_path / "env")],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        assert child.stdout.readline().strip() == "half"
        os.kill(child.pid, signal.SIGKILL)  # in the middle of admitting
    finally:
        child.wait(10)
    assert child.returncode == -signal.SIGKILL
    resumed = RoundAdmission(spec, SqliteSpool(spool_path))
    survived = resumed.stats.admitted
    assert 41 <= survived <= 120
    # every committed envelope is back, in a consistent database, and none is admitted twice
    stored = [codec.decode(d, Envelope).sealed for d in data[:survived]]
    assert resumed.payloads == stored
    for d in data:
        resumed.offer(d)
    assert resumed.stats.admitted == 120 and sum(resumed.stats.rejected.values()) == survived
