"""The shuffler (shuffler/service.py, shuffler/permutation.py) alone and with the
coordinator, real clients and junk traffic over the in-process channel.

The permutation uniformity test cannot be seeded (secure_permutation draws from
os.urandom), so it uses the very small significance level ALPHA_OS = 1e-6: a
correct implementation fails it once in a million runs.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections import Counter

import cbor2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from shuffledp.analyzer.coordinator import Coordinator
from shuffledp.analyzer.service import Analyzer
from shuffledp.client.client import Client
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.protocol import codec
from shuffledp.protocol.channel import InProcessChannel, announce_topic, batch_topic, reports_topic, spec_topic
from shuffledp.protocol.errors import BatchTooSmall
from shuffledp.protocol.messages import (
    Envelope,
    HadamardRangeParams,
    Report,
    RoundSpec,
    ShuffledBatch,
    SignedRoundSpec,
)
from shuffledp.protocol.report_format import report_format
from shuffledp.protocol.sealing import open_sealed
from shuffledp.shuffler.permutation import secure_permutation
from shuffledp.shuffler.service import RoundAdmission, Shuffler

ALPHA_OS = 1e-6
SESSION = bytes(range(16))
OTHER_SESSION = bytes(16)
PARAMS = HadamardRangeParams(-4.0, 4.0, 0.5)


#: Every sealed payload of a round has one length (the padded report plus HPKE's 48 bytes).
SEALED = report_format(3, PARAMS.MECHANISM).sealed_size


def sealed_bytes(i: int) -> bytes:
    """A distinct stand-in sealed payload of the round's length."""
    return i.to_bytes(SEALED, "big")


def make_spec(messages_per_user=1, min_batch=3, round_id=3) -> RoundSpec:
    return RoundSpec(SESSION, round_id, PARAMS, 0.5, bytes(32), min_batch, 1e12, messages_per_user=messages_per_user)


def envelope(token: bytes, nonce: bytes, *, session=SESSION, round_id=3, sealed: bytes | None = None) -> bytes:
    return codec.encode(Envelope(session, round_id, token, nonce, sealed if sealed is not None else os.urandom(SEALED)))


def tok(i: int) -> bytes:
    return i.to_bytes(16, "big")


# --------------------------------------------------------------------------
# admission
# --------------------------------------------------------------------------


def test_admission_reasons_are_counted():
    adm = RoundAdmission(make_spec(messages_per_user=2))
    valid = [envelope(tok(1), tok(100)), envelope(tok(1), tok(101)), envelope(tok(2), tok(102))]
    for data in valid:
        adm.offer(data)
    wrong_version = cbor2.loads(envelope(tok(3), tok(103)))
    wrong_version["v"] = 3
    junk = {
        "malformed": [b"", b"\xff", b"\xa1\x61v\x02", codec.encode(make_spec()), b"not cbor at all" * 3],
        "too-large": [b"\x00" * 2049],
        "unsupported-version": [cbor2.dumps(wrong_version, canonical=True)],
        "unknown-round": [
            envelope(tok(4), tok(104), session=OTHER_SESSION),
            envelope(tok(4), tok(105), round_id=4),
        ],
        "replay": [valid[0], envelope(tok(5), tok(100))],  # same bytes; same nonce, other token
        "quota": [envelope(tok(1), tok(106))],  # third report of token 1, quota 2
    }
    for items in junk.values():
        for data in items:
            adm.offer(data)  # never raises
    assert adm.stats.admitted == 3
    assert adm.stats.rejected == Counter({reason: len(items) for reason, items in junk.items()})
    assert adm.payloads == [codec.decode(d, Envelope).sealed for d in valid]
    # a quota rejection does not burn the nonce; a later envelope from a fresh token with it is admitted
    adm.offer(envelope(tok(6), tok(106)))
    assert adm.stats.admitted == 4


def test_admit_raises_typed_errors():
    from shuffledp.protocol.errors import MalformedMessage, QuotaExceeded, ReplayedReport, UnknownRound

    adm = RoundAdmission(make_spec())
    adm.admit(envelope(tok(1), tok(1)))
    with pytest.raises(MalformedMessage):
        adm.admit(b"\x00")
    with pytest.raises(UnknownRound):
        adm.admit(envelope(tok(2), tok(2), round_id=0))
    with pytest.raises(ReplayedReport):
        adm.admit(envelope(tok(2), tok(1)))
    with pytest.raises(QuotaExceeded):
        adm.admit(envelope(tok(1), tok(3)))


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=3000))
def test_offer_never_raises_on_arbitrary_bytes(data):
    adm = RoundAdmission(make_spec())
    adm.offer(data)
    assert adm.stats.admitted + sum(adm.stats.rejected.values()) == 1


@settings(max_examples=200, deadline=None)
@given(
    choices=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 6), st.sampled_from([3, 3, 3, 4]), st.booleans()), max_size=30
    ),
    quota=st.integers(1, 3),
)
def test_admission_matches_a_model(choices, quota):
    """Admit iff right round, unseen nonce and the token is under quota (checked in that order)."""
    adm = RoundAdmission(make_spec(messages_per_user=quota))
    seen, per_token, admitted, rejected = set(), Counter(), [], Counter()
    for i, (t, nonce, round_id, foreign) in enumerate(choices):
        sealed = sealed_bytes(i)
        data = envelope(tok(t), tok(nonce), round_id=round_id, session=OTHER_SESSION if foreign else SESSION, sealed=sealed)
        adm.offer(data)
        if foreign or round_id != 3:
            rejected["unknown-round"] += 1
        elif nonce in seen:
            rejected["replay"] += 1
        elif per_token[t] >= quota:
            rejected["quota"] += 1
        else:
            seen.add(nonce)
            per_token[t] += 1
            admitted.append(sealed)
    assert adm.payloads == admitted
    assert adm.stats.admitted == len(admitted)
    assert adm.stats.rejected == rejected


def test_shuffled_batch_holds_exactly_the_admitted_payloads():
    adm = RoundAdmission(make_spec())
    sealed = [sealed_bytes(i) for i in range(40)]
    for i, s in enumerate(sealed):
        adm.offer(envelope(tok(i), tok(1000 + i), sealed=s))
        adm.offer(envelope(tok(i), tok(2000 + i), sealed=sealed_bytes(1000 + i)))  # over quota: rejected
    batch = adm.shuffled_batch()
    assert isinstance(batch, ShuffledBatch)
    assert (batch.session_id, batch.round_id, batch.size) == (SESSION, 3, 40)
    assert Counter(batch.payloads) == Counter(sealed)
    assert not set(batch.payloads) & {sealed_bytes(1000 + i) for i in range(40)}
    assert codec.decode(codec.encode(batch), ShuffledBatch) == batch


# --------------------------------------------------------------------------
# permutation
# --------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 2, 3, 10, 1000])
def test_secure_permutation_is_a_permutation(n):
    perm = secure_permutation(n)
    assert perm.shape == (n,)
    np.testing.assert_array_equal(np.sort(perm), np.arange(n))


def test_secure_permutation_rejects_negative():
    with pytest.raises(ValueError):
        secure_permutation(-1)


def test_secure_permutation_is_uniform_over_s4():
    """Chi-square over all 24 permutations of 4 items, 24000 draws, level ALPHA_OS (not seedable)."""
    index = {p: i for i, p in enumerate(itertools.permutations(range(4)))}
    draws = 24_000
    counts = np.zeros(24, dtype=np.int64)
    for _ in range(draws):
        counts[index[tuple(secure_permutation(4).tolist())]] += 1
    _, pvalue = stats.chisquare(counts)  # uniform expectation: 1000 per permutation
    assert pvalue > ALPHA_OS


# --------------------------------------------------------------------------
# the services over the in-process channel
# --------------------------------------------------------------------------


async def answer_round(channel, session_id, clients, inject):
    """A tiny client population: wait for the open round's spec, publish junk, then the real answers."""
    specs = await channel.subscribe(spec_topic(session_id))
    try:
        signed = await specs.get()
    finally:
        await specs.close()
    spec = codec.decode(codec.decode(signed, SignedRoundSpec).spec_bytes, RoundSpec)
    topic = reports_topic(session_id, spec.round_id)
    answers = [c.answer(signed)[0] for c in clients]
    for data in inject(spec, answers):
        await channel.publish(topic, data)
    return spec, answers


async def test_round_forwards_exactly_the_valid_reports():
    channel = InProcessChannel()
    analyzer = Analyzer()
    coordinator = Coordinator(channel, analyzer, round_timeout=30.0, grace=5.0)
    sid = coordinator.session_id
    shuffler = Shuffler(channel, sid, analyzer.keys.signing_public)
    rng = np.random.default_rng(5)
    clients = [
        Client(rng.normal(1.0, 0.5, size=10), analyzer.keys.signing_public, PrivacyLedger(1.0)) for _ in range(6)
    ]

    def inject(spec, answers):
        first = codec.decode(answers[0], Envelope)
        wrong_version = cbor2.loads(answers[1])
        wrong_version["v"] = 7
        yield b"\x00junk"
        yield os.urandom(3000)
        yield cbor2.dumps(wrong_version, canonical=True)
        yield envelope(tok(99), tok(99), session=bytes(16), round_id=spec.round_id)
        yield envelope(tok(98), tok(98), session=sid, round_id=spec.round_id + 1)
        yield answers[0]
        yield answers[0]  # replay
        yield codec.encode(Envelope(sid, spec.round_id, first.token, os.urandom(16), os.urandom(len(first.sealed))))  # over quota
        yield from answers[1:]

    shuffler_task = asyncio.create_task(shuffler.serve())
    try:
        await asyncio.sleep(0)  # let the shuffler subscribe to announcements
        await channel.publish(announce_topic(sid), b"not a signed spec")
        await channel.publish(announce_topic(sid), Analyzer().sign_spec(make_spec()))  # foreign signer
        batches = await channel.subscribe(batch_topic(sid, 0))
        clients_task = asyncio.create_task(answer_round(channel, sid, clients, inject))
        record = await asyncio.wait_for(coordinator.run_round(PARAMS, 0.5, min_batch=len(clients)), 20)
        spec, answers = await clients_task
        raw = await asyncio.wait_for(batches.get(), 5)
    finally:
        shuffler_task.cancel()
        await asyncio.gather(shuffler_task, return_exceptions=True)

    assert shuffler.rejected_announcements == Counter({"malformed": 1, "bad-signature": 1})
    stats_ = shuffler.rounds[spec.round_id]
    assert stats_.outcome == "forwarded" and stats_.admitted == stats_.forwarded == len(clients)
    assert stats_.rejected == Counter(
        {"malformed": 1, "too-large": 1, "unsupported-version": 1, "unknown-round": 2, "replay": 1, "quota": 1}
    )
    batch = codec.decode(raw, ShuffledBatch)
    sealed = [codec.decode(a, Envelope).sealed for a in answers]
    assert Counter(batch.payloads) == Counter(sealed)
    # the analyzer opened all of them, and they are the clients' reports
    assert record.opened.size == len(clients) and not record.opened.rejected
    reports = [
        codec.decode_padded(open_sealed(analyzer.keys.hpke_private, s, sid, spec.round_id), Report).values for s in sealed
    ]
    assert Counter(map(tuple, record.opened.values.tolist())) == Counter(reports)
    assert record.spec == spec


async def test_round_below_min_batch_is_not_forwarded():
    channel = InProcessChannel()
    analyzer = Analyzer()
    coordinator = Coordinator(channel, analyzer, round_timeout=0.3, grace=0.3)
    sid = coordinator.session_id
    shuffler = Shuffler(channel, sid, analyzer.keys.signing_public)
    clients = [Client(np.array([0.5]), analyzer.keys.signing_public, PrivacyLedger(1.0)) for _ in range(2)]
    shuffler_task = asyncio.create_task(shuffler.serve())
    try:
        await asyncio.sleep(0)
        clients_task = asyncio.create_task(answer_round(channel, sid, clients, lambda spec, answers: answers))
        with pytest.raises(BatchTooSmall):
            await coordinator.run_round(PARAMS, 0.5, min_batch=5)
        await clients_task
        # the shuffler's deadline (0.3 s) precedes the coordinator's (0.6 s): the round is already closed
        stats_ = shuffler.rounds[0]
    finally:
        shuffler_task.cancel()
        await asyncio.gather(shuffler_task, return_exceptions=True)
    assert stats_.outcome == "batch-too-small"
    assert stats_.admitted == 2 and stats_.forwarded == 0
    assert channel.messages_by_topic[batch_topic(sid, 0)] == 0
