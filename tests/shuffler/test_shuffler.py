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

from shuffledp.analyzer.coordinator import NO_LIVENESS_MARGIN
from shuffledp.analyzer.service import Analyzer
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.deploy.deployment import Deployment
from shuffledp.protocol.wire import codec
from shuffledp.protocol.transport.channel import (
    InProcessChannel,
    acks_topic,
    announce_topic,
    batch_topic,
    outcome_topic,
    receipts_topic,
    reports_topic,
    spec_topic,
)
from shuffledp.protocol.wire.credentials import CredentialIssuer
from shuffledp.protocol.errors import BatchTooSmall
from shuffledp.protocol.wire.messages import (
    AdmissionReceipts,
    Report,
    RoundOutcome,
    RoundSpec,
    ShuffledBatch,
    SignedRoundSpec,
)
from shuffledp.protocol.wire.onion import ShufflerKeys, decode_verified, verify_signed
from shuffledp.protocol.wire.report_format import report_format
from shuffledp.protocol.wire.sealing import SUITE, open_sealed
from shuffledp.shuffler.permutation import secure_permutation
from shuffledp.protocol.wire.envelope_packing import MAX_ENVELOPES_PER_MESSAGE
from shuffledp.shuffler.service import REFUSALS_PER_CREDENTIAL, RoundAdmission, batch_chunks

from parties import ISSUER, OTHER_SESSION, PARAMS, SESSION, SHUFFLER_KEYS, credential, envelope, make_spec, nonce

ALPHA_OS = 1e-6


#: Every sealed payload of a round has one length (the padded report plus HPKE's 48 bytes).
SEALED = report_format(3, PARAMS.MECHANISM).sealed_size


def sealed_bytes(i: int, spec: RoundSpec | None = None) -> bytes:
    """A distinct stand-in sealed payload of the round's length (``spec``'s round, or the default one)."""
    size = SEALED if spec is None else report_format(spec.round_id, spec.mechanism).sealed_size
    return i.to_bytes(size, "big")


def admission(spec: RoundSpec, **options) -> RoundAdmission:
    return RoundAdmission(spec, SHUFFLER_KEYS, ISSUER, **options)


# --------------------------------------------------------------------------
# admission
# --------------------------------------------------------------------------


def test_admission_reasons_are_counted():
    spec = make_spec(messages_per_user=2)
    adm = admission(spec)
    valid = [
        envelope(spec, credential(1), sealed_bytes(1, spec), nonce(100)),
        envelope(spec, credential(1), sealed_bytes(2, spec), nonce(101)),
        envelope(spec, credential(2), sealed_bytes(3, spec), nonce(102)),
    ]
    receipts = adm.offer_many(valid)
    assert receipts.admitted == [nonce(100), nonce(101), nonce(102)] and not receipts.refused
    wrong_version = cbor2.loads(envelope(spec, credential(3), sealed_bytes(4, spec), nonce(103)))
    wrong_version["v"] = 2  # the previous wire version
    forged = bytearray(credential(7))
    forged[-1] ^= 1
    junk = {
        "malformed": [b"", b"\xff", b"\xa1\x61v\x03", codec.encode(spec), b"not cbor at all" * 3],
        "too-large": [b"\x00" * 4097],
        "unsupported-version": [cbor2.dumps(wrong_version, canonical=True)],
        "unknown-round": [
            envelope(spec, credential(4), sealed_bytes(5, spec), nonce(104), session_id=OTHER_SESSION),
            envelope(spec, credential(4), sealed_bytes(6, spec), nonce(105), round_id=4),
        ],
        "unsealable": [envelope(spec, credential(4), sealed_bytes(7, spec), nonce(106), shuffler_key=ShufflerKeys.generate().hpke_public)],
        "bad-credential": [envelope(spec, bytes(forged), sealed_bytes(8, spec), nonce(107)), envelope(spec, CredentialIssuer.generate().issue(), sealed_bytes(9, spec), nonce(108))],
        "replay": [envelope(spec, credential(5), sealed_bytes(10, spec), nonce(100))],  # admitted nonce, other report
        "duplicate": [envelope(spec, credential(5), sealed_bytes(1, spec), nonce(109))],  # admitted report, re-wrapped
        "quota": [envelope(spec, credential(1), sealed_bytes(11, spec), nonce(110))],  # third report of client 1, quota 2
        "wrong-size": [envelope(spec, credential(6), bytes(len(sealed_bytes(0, spec)) - 1), nonce(111))],
    }
    for items in junk.values():
        adm.offer_many(items)  # never raises
    assert adm.stats.admitted == 3
    assert adm.stats.rejected == Counter({reason: len(items) for reason, items in junk.items()})
    assert adm.payloads == [sealed_bytes(1, spec), sealed_bytes(2, spec), sealed_bytes(3, spec)]
    # an exact retransmission is acknowledged again and counted once
    again = adm.offer_many([valid[0]])
    assert again.admitted == [nonce(100)] and adm.stats.admitted == 3 and adm.stats.retransmitted == 1
    # a quota refusal does not burn the nonce: a fresh client may use it
    adm.offer(envelope(spec, credential(8), sealed_bytes(12, spec), nonce(110)))
    assert adm.stats.admitted == 4


def test_receipts_name_refusals_that_opened():
    spec = make_spec()
    adm = admission(spec)
    receipts = adm.offer_many(
        [
            envelope(spec, credential(1), sealed_bytes(1), nonce(1)),
            envelope(spec, credential(1), sealed_bytes(2), nonce(2)),  # quota
            b"junk",  # no nonce to name
            envelope(spec, credential(2), sealed_bytes(1), nonce(3)),  # duplicate report
        ]
    )
    assert receipts.admitted == [nonce(1)]
    assert list(zip(receipts.refused, receipts.reasons)) == [(nonce(2), "quota"), (nonce(3), "duplicate")]


def test_a_credential_that_keeps_failing_is_rate_limited():
    spec = make_spec()
    adm = admission(spec)
    adm.offer(envelope(spec, credential(1), sealed_bytes(0), nonce(0)))
    items = [envelope(spec, credential(1), sealed_bytes(i), nonce(i)) for i in range(1, REFUSALS_PER_CREDENTIAL + 4)]
    receipts = adm.offer_many(items)
    assert adm.stats.rejected == Counter({"quota": REFUSALS_PER_CREDENTIAL, "rate-limited": 3})
    assert len(receipts.refused) == REFUSALS_PER_CREDENTIAL  # rate-limited ones are dropped unanswered
    adm.offer(envelope(spec, credential(2), sealed_bytes(99), nonce(99)))  # other clients are unaffected
    assert adm.stats.admitted == 2


def test_revoked_credentials_are_refused():
    spec = make_spec()
    adm = admission(spec, revoked=frozenset({(1).to_bytes(16, "big")}))
    adm.offer(envelope(spec, credential(1), sealed_bytes(1), nonce(1)))
    adm.offer(envelope(spec, credential(2), sealed_bytes(2), nonce(2)))
    assert adm.stats.admitted == 1 and adm.stats.rejected == Counter({"bad-credential": 1})


def test_admit_raises_typed_errors():
    from shuffledp.protocol.wire.credentials import BadCredential
    from shuffledp.protocol.errors import MalformedMessage, QuotaExceeded, ReplayedReport, RoundFull, UnknownRound

    spec = make_spec(max_batch=3)
    adm = admission(spec)
    adm.admit(envelope(spec, credential(1), sealed_bytes(1), nonce(1)))
    with pytest.raises(MalformedMessage):
        adm.admit(b"\x00")
    with pytest.raises(UnknownRound):
        adm.admit(envelope(spec, credential(2), sealed_bytes(2), nonce(2), round_id=0))
    with pytest.raises(ReplayedReport):
        adm.admit(envelope(spec, credential(2), sealed_bytes(2), nonce(1)))
    with pytest.raises(QuotaExceeded):
        adm.admit(envelope(spec, credential(1), sealed_bytes(3), nonce(3)))
    with pytest.raises(BadCredential):
        adm.admit(envelope(spec, bytes(48), sealed_bytes(3), nonce(3)))
    adm.admit(envelope(spec, credential(2), sealed_bytes(2), nonce(2)))
    adm.admit(envelope(spec, credential(3), sealed_bytes(3), nonce(3)))
    with pytest.raises(RoundFull):
        adm.admit(envelope(spec, credential(4), sealed_bytes(4), nonce(4)))


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=3000))
def test_offer_never_raises_on_arbitrary_bytes(data):
    adm = admission(make_spec())
    adm.offer(data)
    assert adm.stats.admitted + sum(adm.stats.rejected.values()) == 1


@settings(max_examples=150, deadline=None)
@given(
    choices=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 6), st.sampled_from([3, 3, 3, 4]), st.booleans()), max_size=30
    ),
    quota=st.sampled_from([1, 2, 4]),
    burst=st.integers(1, 8),
)
def test_admission_matches_a_model(choices, quota, burst):
    """Admit iff right round, credential not rate-limited, unseen nonce, under quota (in that order),
    whether envelopes arrive one by one or in bursts committed together."""
    spec = make_spec(messages_per_user=quota)
    adm = admission(spec)
    seen, per_client, refusals, admitted, rejected = set(), Counter(), Counter(), [], Counter()
    items = []
    for i, (c, n, round_id, foreign) in enumerate(choices):
        sealed = sealed_bytes(i, spec)
        header = {"session_id": OTHER_SESSION} if foreign else {}
        if round_id != 3:
            header["round_id"] = round_id
        items.append(envelope(spec, credential(c), sealed, nonce(n), **header))
        if foreign or round_id != 3:
            rejected["unknown-round"] += 1
        elif refusals[c] >= REFUSALS_PER_CREDENTIAL:
            rejected["rate-limited"] += 1
        elif n in seen:
            rejected["replay"] += 1
            refusals[c] += 1
        elif per_client[c] >= quota:
            rejected["quota"] += 1
            refusals[c] += 1
        else:
            seen.add(n)
            per_client[c] += 1
            admitted.append(sealed)
    for start in range(0, len(items), burst):
        adm.offer_many(items[start : start + burst])
    assert adm.payloads == admitted
    assert adm.stats.admitted == len(admitted)
    assert adm.stats.rejected == rejected


def test_shuffled_chunks_hold_exactly_the_admitted_payloads():
    spec = make_spec()
    adm = admission(spec)
    sealed = [sealed_bytes(i) for i in range(40)]
    for i, s in enumerate(sealed):
        adm.offer(envelope(spec, credential(i), s, nonce(1000 + i)))
        adm.offer(envelope(spec, credential(i), sealed_bytes(1000 + i), nonce(2000 + i)))  # over quota: refused
    batch_id = os.urandom(16)
    chunks = batch_chunks(spec, SHUFFLER_KEYS, batch_id, adm.shuffled_payloads(), chunk_size=16)
    decoded = [codec.decode(c, ShuffledBatch) for c in chunks]
    assert [(b.chunk, b.chunks, b.total, b.size) for b in decoded] == [(0, 3, 40, 16), (1, 3, 40, 16), (2, 3, 40, 8)]
    for b in decoded:
        assert (b.session_id, b.round_id, b.batch_id) == (SESSION, 3, batch_id)
        verify_signed(SHUFFLER_KEYS.signing_public, b)
    payloads = [p for b in decoded for p in b.payloads]
    assert Counter(payloads) == Counter(sealed)
    assert not set(payloads) & {sealed_bytes(1000 + i) for i in range(40)}


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


async def answer_round(channel, session_id, clients, inject, batch_junk=()):
    """A tiny client population: wait for the open round's spec, publish junk, then the real answers.

    ``batch_junk`` is published on the round's batch topic first (an attacker posing as the shuffler):
    bytes, or a function of the announced spec that makes them.
    """
    specs = await channel.subscribe(spec_topic(session_id))
    try:
        signed = await specs.get()
    finally:
        await specs.close()
    spec = codec.decode(codec.decode(signed, SignedRoundSpec).spec_bytes, RoundSpec)
    for data in batch_junk:
        await channel.publish(batch_topic(session_id, spec.round_id), data(spec) if callable(data) else data)
    topic = reports_topic(session_id, spec.round_id)
    answers = [c.answer(signed)[0] for c in clients]
    for data in inject(spec, answers):
        await channel.publish(topic, data)
    return spec, answers


def sealed_reports(deployment: Deployment, spec: RoundSpec, answers: list[bytes]) -> list[bytes]:
    """The inner sealed reports of encoded envelopes (opening their outer layers as the shuffler does)."""
    from shuffledp.protocol.wire.onion import EnvelopeOpener

    opener = EnvelopeOpener(deployment.shuffler_keys.hpke_private, spec)
    return [opener.open(a).sealed for a in answers]


async def test_round_forwards_exactly_the_valid_reports():
    deployment = Deployment()
    channel = InProcessChannel()
    analyzer = deployment.analyzer()
    # an exact, honest population: released the moment min_batch arrive (no liveness margin)
    coordinator = deployment.coordinator(channel, analyzer=analyzer, round_timeout=30.0, grace=5.0,
                                         batch_margin=NO_LIVENESS_MARGIN)
    sid = coordinator.session_id
    shuffler = deployment.shuffler(channel)
    rng = np.random.default_rng(5)
    clients = [deployment.client(rng.normal(1.0, 0.5, size=10), PrivacyLedger(1.0)) for _ in range(6)]
    impostor = ShufflerKeys.generate()

    def inject(spec, answers):
        wrong_version = cbor2.loads(answers[1])
        wrong_version["v"] = 7
        sealed = sealed_reports(deployment, spec, answers[:1])[0]
        yield b"\x00junk"
        yield os.urandom(5000)
        yield cbor2.dumps(wrong_version, canonical=True)
        yield envelope(spec, clients[0].credential, sealed, session_id=bytes(16))
        yield envelope(spec, clients[0].credential, sealed, round_id=spec.round_id + 1)
        yield answers[0]
        yield answers[0]  # an exact retransmission: acknowledged, counted once
        yield envelope(spec, clients[1].credential, sealed)  # someone else's report, re-wrapped: duplicate
        yield envelope(spec, clients[0].credential, os.urandom(len(sealed)))  # second report of client 0: quota
        yield from answers[1:]

    shuffler_task = asyncio.create_task(shuffler.serve())
    try:
        await asyncio.sleep(0)  # let the shuffler subscribe to announcements
        await channel.publish(announce_topic(sid), b"not a signed spec")
        await channel.publish(announce_topic(sid), Analyzer().sign_spec(make_spec(deployment=deployment)))  # foreign signer
        batches = await channel.subscribe(batch_topic(sid, 0))
        receipts_sub = await channel.subscribe(receipts_topic(sid, 0))
        # an attacker on the batch topic: a well-formed batch of the round signed by another key, a
        # batch the real shuffler signed for another spec of round 0 (refused by its layout), and junk
        forged = lambda spec: batch_chunks(spec, impostor, os.urandom(16), [bytes(SEALED)] * 6, 16)[0]  # noqa: E731
        other_spec = make_spec(round_id=0, deployment=deployment)
        other = batch_chunks(other_spec, deployment.shuffler_keys, os.urandom(16), [bytes(SEALED)] * 6, 16)[0]
        clients_task = asyncio.create_task(answer_round(channel, sid, clients, inject, [forged, other, b"junk"]))
        record = await asyncio.wait_for(coordinator.run_round(PARAMS, 0.5, min_batch=len(clients)), 20)
        spec, answers = await clients_task
        raws = [await asyncio.wait_for(batches.get(), 5) for _ in range(4)]
        await asyncio.sleep(0.05)  # let the shuffler take the acknowledgement
        receipts = [decode_verified(d, AdmissionReceipts, deployment.shuffler_keys.signing_public) for d in receipts_sub.get_nowait_all()]
    finally:
        shuffler_task.cancel()
        await asyncio.gather(shuffler_task, return_exceptions=True)

    assert shuffler.rejected_announcements == Counter({"malformed": 1, "bad-signature": 1})
    assert coordinator.rejected_batches == Counter({"bad-signature": 1, "malformed": 2})
    stats_ = shuffler.rounds[spec.round_id]
    assert stats_.admitted == stats_.forwarded == len(clients) and stats_.retransmitted == 1
    assert stats_.outcome == "served" and shuffler.acknowledged == 1
    assert shuffler.spool.round(sid, spec.round_id).state == "served"
    assert stats_.rejected == Counter(
        {"malformed": 1, "too-large": 1, "unsupported-version": 1, "unknown-round": 2, "duplicate": 1, "quota": 1}
    )
    # every client's nonce was acknowledged as admitted
    admitted = {n for r in receipts for n in r.admitted}
    assert all(c.sent[(sid, spec.round_id)].nonces[0] in admitted for c in clients)
    # the batch on the wire is the shuffler's (signed), and holds exactly the clients' sealed reports
    decoded = [codec.decode(r, ShuffledBatch) for r in raws if r != b"junk"]
    batch = next(b for b in decoded if b.batch_id == record.batch_id)
    assert batch.spec_digest == spec.digest
    verify_signed(deployment.shuffler_keys.signing_public, batch)
    sealed = sealed_reports(deployment, spec, answers)
    assert Counter(batch.payloads) == Counter(sealed)
    # the analyzer opened all of them, and they are the clients' reports
    assert record.opened.size == len(clients) and not record.opened.rejected and record.batch_id == batch.batch_id
    reports = [
        codec.decode_padded(open_sealed(analyzer.keys.hpke_private, s, sid, spec.round_id, spec.digest), Report).values for s in sealed
    ]
    assert Counter(map(tuple, record.opened.values.tolist())) == Counter(reports)
    assert record.spec == spec
    # the record keeps the exact signed spec announced (the session file's proof for an auditor)
    from shuffledp.protocol.wire.onion import verified_spec

    assert verified_spec(record.signed_spec, deployment.analyzer_signing_key) == spec


async def test_round_below_min_batch_fails_and_says_so():
    deployment = Deployment()
    channel = InProcessChannel()
    coordinator = deployment.coordinator(channel, round_timeout=0.3, grace=5.0)
    sid = coordinator.session_id
    shuffler = deployment.shuffler(channel)
    clients = [deployment.client(np.array([0.5]), PrivacyLedger(1.0)) for _ in range(2)]
    shuffler_task = asyncio.create_task(shuffler.serve())
    outcomes = await channel.subscribe(outcome_topic(sid, 0))
    try:
        await asyncio.sleep(0)
        clients_task = asyncio.create_task(answer_round(channel, sid, clients, lambda spec, answers: answers))
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(BatchTooSmall, match="shuffler reports the round failed"):
            await coordinator.run_round(PARAMS, 0.5, min_batch=5)
        waited = loop.time() - started
        await clients_task
        stats_ = shuffler.rounds[0]
        outcome_bytes = await asyncio.wait_for(outcomes.get(), 1)
    finally:
        shuffler_task.cancel()
        await asyncio.gather(shuffler_task, return_exceptions=True)
    assert waited < 3.0  # the signed outcome ended the wait, not the 5 s grace period
    assert stats_.outcome == "batch-too-small"
    assert stats_.admitted == 2 and stats_.forwarded == 0
    assert channel.messages_by_topic[batch_topic(sid, 0)] == 0
    assert shuffler.spool.admitted(sid, 0) == []  # the reports were deleted, never to be forwarded
    outcome = decode_verified(outcome_bytes, RoundOutcome, deployment.shuffler_keys.signing_public)
    assert (outcome.outcome, outcome.reason, outcome.admitted) == ("failed", "batch-too-small", 2)
    # each client learns that its charged round was lost
    for c in clients:
        c.settle_outcome(outcome_bytes)
        assert c.ledger.lost_rounds() == [(sid, 0)] and c.ledger.spent_epsilon == 0.5


async def test_large_batches_stream_in_signed_chunks_and_count_once():
    deployment = Deployment()
    channel = InProcessChannel()
    coordinator = deployment.coordinator(channel, round_timeout=30.0, grace=5.0, batch_margin=NO_LIVENESS_MARGIN)
    sid = coordinator.session_id
    shuffler = deployment.shuffler(channel, chunk_size=4)
    clients = [deployment.client(np.array([0.1 * i]), PrivacyLedger(1.0)) for i in range(10)]
    batches = await channel.subscribe(batch_topic(sid, 0))
    shuffler_task = asyncio.create_task(shuffler.serve())
    try:
        await asyncio.sleep(0)

        def inject(spec, answers):
            return answers

        clients_task = asyncio.create_task(answer_round(channel, sid, clients, inject))
        # re-deliver the first chunk before the last arrives (as after a shuffler restart)
        original_publish = channel.publish
        seen = []

        async def publish_twice(topic, payload, *, retain=False):
            await original_publish(topic, payload, retain=retain)
            if topic == batch_topic(sid, 0):
                seen.append(payload)
                if len(seen) == 2:
                    await original_publish(topic, seen[0])

        channel.publish = publish_twice
        record = await asyncio.wait_for(coordinator.run_round(PARAMS, 0.5, min_batch=10), 20)
        await clients_task
        await asyncio.sleep(0.05)
    finally:
        shuffler_task.cancel()
        await asyncio.gather(shuffler_task, return_exceptions=True)
    chunks = [codec.decode(d, ShuffledBatch) for d in batches.get_nowait_all()]
    assert [c.chunk for c in chunks] == [0, 1, 0, 2] and {c.size for c in chunks} == {4, 2}
    assert record.opened.size == 10 and record.chunks == 3
    assert coordinator.rejected_batches == Counter({"redelivered-chunk": 1})
    assert shuffler.rounds[0].chunks == 3 and shuffler.rounds[0].outcome == "served"
    assert shuffler.spool.unacknowledged() == []


async def test_unacknowledged_batches_are_published_again():
    deployment = Deployment()
    channel = InProcessChannel()
    shuffler = deployment.shuffler(channel, republish_interval=0.05)
    spec = make_spec(round_id=0, min_batch=1, deployment=deployment)
    signed = deployment.analyzer().sign_spec(spec)
    shuffler.spool.open_round(spec.session_id, 0, signed)
    chunks = batch_chunks(spec, deployment.shuffler_keys, bytes(16), [bytes(SEALED)], 16)
    shuffler.spool.release(spec.session_id, 0, bytes(16), chunks)
    batches = await channel.subscribe(batch_topic(spec.session_id, 0))
    task = asyncio.create_task(shuffler.serve())
    try:
        first = await asyncio.wait_for(batches.get(), 1)  # at start
        again = await asyncio.wait_for(batches.get(), 1)  # periodically
        # a forged acknowledgement changes nothing; the analyzer's does
        forged = Analyzer().acknowledge(spec, bytes(16))
        await channel.publish(acks_topic(spec.session_id), forged)
        await channel.publish(acks_topic(spec.session_id), deployment.analyzer().acknowledge(spec, bytes(16)))
        await asyncio.sleep(0.02)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert first == again == chunks[0]
    assert shuffler.rejected_acks == Counter({"bad-signature": 1})
    assert shuffler.acknowledged == 1 and shuffler.spool.round(spec.session_id, 0).state == "served"
    assert shuffler.spool.unacknowledged() == []


def test_stats_are_json():
    import json

    deployment = Deployment()
    shuffler = deployment.shuffler(InProcessChannel())
    spec = make_spec(deployment=deployment)
    adm = RoundAdmission(spec, deployment.shuffler_keys, deployment.issuer)
    adm.offer(b"junk")
    shuffler.rounds[spec.round_id] = adm.stats
    stats_ = json.loads(json.dumps(shuffler.stats()))
    assert stats_["rejected_total"] == {"malformed": 1} and stats_["rounds"][0]["rejected"] == {"malformed": 1}


def _outcome(fn):
    try:
        return ("ok", fn())
    except Exception as exc:  # noqa: BLE001 - the type is what is compared
        return ("error", type(exc).__name__)


@settings(max_examples=300, deadline=None)
@given(position=st.integers(0, 400), value=st.integers(0, 255), cut=st.integers(0, 3))
def test_fixed_layout_reader_accepts_exactly_what_the_general_decoder_accepts(position, value, cut):
    """The shuffler's fast envelope reader agrees with the general decoder on mutated envelopes."""
    from shuffledp.protocol.wire.onion import EnvelopeOpener

    spec = make_spec()
    opener = EnvelopeOpener(SHUFFLER_KEYS.hpke_private, spec)
    data = bytearray(envelope(spec, credential(1), sealed_bytes(1), nonce(1)))
    if position < len(data):
        data[position] = value
    data = bytes(data[: len(data) - cut])
    fast = _outcome(lambda: opener.open(data))
    slow = _outcome(
        lambda: opener._admission_slow(SUITE.decrypt(opener._outer_slow(data), SHUFFLER_KEYS.hpke_private, info=opener._info))
    )
    if slow[0] == "error" and slow[1] in ("InvalidTag", "ValueError"):
        slow = ("error", "SealingError")
    assert fast == slow


async def test_a_flood_of_refusable_envelopes_cannot_fail_the_round():
    """Threat-model finding: a burst of more envelopes than one receipts message can name
    (forged credentials cost the attacker nothing) once made the round fail and delete
    its honest reports. Receipts are now split, bursts bounded, and publishing them is never fatal."""
    from shuffledp.protocol.wire.messages import MAX_RECEIPTS
    from shuffledp.shuffler.service import Receipts

    deployment = Deployment()
    channel = InProcessChannel()
    shuffler = deployment.shuffler(channel)
    spec = make_spec(deployment=deployment)
    receipts = Receipts(refused=[nonce(i) for i in range(MAX_RECEIPTS + 5)], reasons=["bad-credential"] * (MAX_RECEIPTS + 5))
    sub = await channel.subscribe(receipts_topic(spec.session_id, spec.round_id))
    stats_ = RoundAdmission(spec, deployment.shuffler_keys, deployment.issuer).stats
    await shuffler._publish_receipts(spec, receipts, stats_)
    messages = [decode_verified(d, AdmissionReceipts, deployment.shuffler_keys.signing_public) for d in sub.get_nowait_all()]
    assert sum(len(m.refused) for m in messages) == MAX_RECEIPTS + 5 and stats_.receipts_unsent == 0

    class Down(InProcessChannel):
        async def publish(self, topic, payload, *, retain=False):
            from shuffledp.protocol.errors import TransportError

            raise TransportError("broker away")

    down = deployment.shuffler(Down())
    await down._publish_receipts(spec, receipts, stats_)  # never raises
    assert stats_.receipts_unsent == 1


async def test_several_shuffler_instances_serve_one_round_each_with_its_own_batch(tmp_path):
    """Two instances of one shuffler identity split the clients by credential; each releases
    its own signed batch; the coordinator opens both and reports the per-batch sizes."""
    from shuffledp.shuffler.spool import SqliteSpool

    deployment = Deployment()
    channel = InProcessChannel()
    coordinator = deployment.coordinator(channel, round_timeout=0.8, grace=5.0)
    sid = coordinator.session_id
    instances = [deployment.shuffler(channel, instance=i, spool=SqliteSpool(tmp_path / f"spool{i}.db")) for i in range(2)]
    clients = [deployment.client(np.array([0.1 * i]), PrivacyLedger(1.0)) for i in range(16)]
    tasks = [asyncio.create_task(s.serve()) for s in instances]
    try:
        await asyncio.sleep(0)

        async def fleet():
            specs = await channel.subscribe(spec_topic(sid))
            signed = await specs.get()
            spec = codec.decode(codec.decode(signed, SignedRoundSpec).spec_bytes, RoundSpec)
            for c in clients:
                for e in c.answer(signed):
                    await channel.publish(reports_topic(sid, spec.round_id, c.instance_for(spec)), e)
            # a client knocking at the other instance's door is refused there
            stray = deployment.client(np.array([0.0]), PrivacyLedger(1.0))
            wrong = 1 - stray.instance_for(spec)
            await channel.publish(reports_topic(sid, spec.round_id, wrong), stray.answer(signed)[0])
            return spec, wrong

        fleet_task = asyncio.create_task(fleet())
        record = await asyncio.wait_for(coordinator.run_round(PARAMS, 0.5, min_batch=2, max_batch=16, shuffler_instances=2), 20)
        spec, wrong = await fleet_task
        await asyncio.sleep(0.05)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    share = Counter(c.instance_for(spec) for c in clients)
    assert sorted(record.batch_sizes) == sorted(share.values()) and sum(record.batch_sizes) == 16
    assert record.opened.size == 16 and record.smallest_batch == min(share.values()) and record.failed_instances == 0
    assert [s.rounds[0].admitted for s in instances] == [share[0], share[1]]
    assert instances[wrong].rounds[0].rejected == Counter({"wrong-instance": 1})
    assert all(s.rounds[0].outcome == "served" for s in instances)  # each acknowledged its own batch


def test_a_copy_in_the_same_burst_is_named_admitted_only_if_its_original_was_committed():
    """Found by the fuzz port: a copy of a still-pending envelope was receipted 'admitted' even
    when the spool then refused the original, so the same nonce was named both ways."""
    from shuffledp.protocol.errors import DuplicateReport

    class RefusingSpool:
        def admitted(self, session_id, round_id):
            return []

        def admit_many(self, session_id, round_id, envelopes):
            raise DuplicateReport("another writer admitted it")

        def admit(self, session_id, round_id, envelope):
            raise DuplicateReport("another writer admitted it")

    spec = make_spec()
    adm = RoundAdmission(spec, SHUFFLER_KEYS, ISSUER, RefusingSpool())
    env = envelope(spec, credential(1), sealed_bytes(1), nonce(1))
    receipts = adm.offer_many([env, env])
    assert receipts.admitted == [] and receipts.refused == [nonce(1)] and receipts.reasons == ["duplicate"]
    assert adm.stats.admitted == 0 and adm.stats.retransmitted == 0
    ok = RoundAdmission(spec, SHUFFLER_KEYS, ISSUER).offer_many([env, env])  # with a spool that commits
    assert ok.admitted == [nonce(1), nonce(1)] and not ok.refused


def test_an_ack_marks_the_round_of_its_batch_served_whatever_round_it_names():
    deployment = Deployment()
    shuffler = deployment.shuffler(InProcessChannel())
    spec = make_spec(round_id=0, deployment=deployment)
    shuffler.spool.open_round(spec.session_id, 0, b"spec")
    shuffler.spool.release(spec.session_id, 0, bytes(16), [b"chunk"])
    for r in (0, 5):
        shuffler.rounds[r] = RoundAdmission(make_spec(round_id=r, deployment=deployment), deployment.shuffler_keys, deployment.issuer).stats
    lying = deployment.analyzer().acknowledge(make_spec(round_id=5, deployment=deployment), bytes(16))
    assert shuffler.handle_ack(lying)
    assert shuffler.rounds[0].outcome == "served" and shuffler.rounds[5].outcome == "open"


def test_opening_on_worker_processes_decides_exactly_as_in_process():
    """Same burst, same decisions: admitted payloads in order, refusals by reason, receipts."""
    from shuffledp.shuffler.parallel_open import OuterLayerPool

    spec = make_spec(messages_per_user=2, max_batch=300)
    items = []
    for i in range(300):
        items.append(envelope(spec, credential(i % 120), sealed_bytes(i, spec), nonce(i % 280)))  # quota, replays
    items += [b"junk", envelope(spec, credential(1), sealed_bytes(5, spec), nonce(9999)), items[0]]  # junk, copy, retransmit
    items += [envelope(spec, credential(3), sealed_bytes(7, spec), nonce(7777), round_id=4)]  # another round
    items.insert(150, b"".join([items[0]] * (MAX_ENVELOPES_PER_MESSAGE + 1)))  # over-packed: refused before opening
    pool = OuterLayerPool(SHUFFLER_KEYS.hpke_private, 2, threshold=16)
    try:
        parallel = RoundAdmission(spec, SHUFFLER_KEYS, ISSUER, opener_pool=pool)
        r_parallel = parallel.offer_many(items)
        # The service's path: the burst's opening awaited while the event loop runs other tasks.
        awaited = RoundAdmission(spec, SHUFFLER_KEYS, ISSUER, opener_pool=pool)
        ticks = []

        async def offer_while_ticking():
            async def tick():
                while True:
                    ticks.append(1)
                    await asyncio.sleep(0)

            ticker = asyncio.create_task(tick())
            try:
                return await awaited.offer_many_async(items)
            finally:
                ticker.cancel()

        r_awaited = asyncio.run(offer_while_ticking())
    finally:
        pool.close()
    serial = RoundAdmission(spec, SHUFFLER_KEYS, ISSUER)
    r_serial = serial.offer_many(items)
    assert len(ticks) > 1  # the loop ran other tasks while the workers opened
    for other, receipts in ((parallel, r_parallel), (awaited, r_awaited)):
        assert other.payloads == serial.payloads and other.stats.as_dict() == serial.stats.as_dict()
        assert (receipts.admitted, receipts.refused, receipts.reasons) == (r_serial.admitted, r_serial.refused, r_serial.reasons)
    assert serial.stats.rejected["malformed"] == 1 and serial.stats.rejected["unknown-round"] == 1
    assert serial.stats.rejected["too-large"] == 1


def _state(adm: RoundAdmission) -> tuple:
    return (adm.payloads, adm.nonces, adm.sealed_seen, dict(adm.per_client), dict(adm.refusals), adm.stats.as_dict())


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    # few credentials (quotas bind), many nonces and reports (most bursts clean, some with a copy)
    choices=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 40), st.integers(0, 40), st.sampled_from(["ok"] * 14 + ["forged", "junk"])),
                     max_size=24),
    quota=st.sampled_from([1, 2, 4]),
    max_batch=st.sampled_from([4, 8, 64]),
    burst=st.integers(1, 12),
    flood=st.booleans(),
)
def test_a_burst_admitted_at_once_is_admitted_as_one_by_one(choices, quota, max_batch, burst, flood):
    """Every burst judged with the whole-burst shortcut leaves the round exactly as judging its envelopes
    one by one does (receipts, counts, admitted reports, quotas, refusals): over bursts that hold
    retransmissions, replays, re-wrapped copies, a credential over its quota or rate-limited, a
    forged or revoked credential, junk, and more than the round has room for."""
    spec = make_spec(messages_per_user=quota, min_batch=1, max_batch=max_batch)
    revoked = frozenset({(4).to_bytes(16, "big")})
    items = []
    for c, n, r, kind in choices:  # credential 4 is revoked
        if kind == "junk":
            items.append(b"\x00" * 5)
            continue
        cred = credential(c)
        if kind == "forged":
            cred = cred[:-1] + bytes([cred[-1] ^ 1])
        items.append(envelope(spec, cred, sealed_bytes(r, spec), nonce(n)))
    if flood:  # a credential refused often enough to be rate-limited, then sending more
        items = [envelope(spec, credential(0), sealed_bytes(90 + i, spec), nonce(0)) for i in range(REFUSALS_PER_CREDENTIAL + 1)] + items
    shortcut, one_by_one = admission(spec, revoked=revoked), admission(spec, revoked=revoked)
    one_by_one._admissible_burst = lambda opened: None  # this one never takes the shortcut
    for start in range(0, len(items), burst):
        chunk = items[start : start + burst]
        assert shortcut.offer_many(chunk) == one_by_one.offer_many(chunk)
        assert _state(shortcut) == _state(one_by_one)


def test_the_whole_burst_shortcut_takes_clean_bursts_and_only_those(monkeypatch):
    spec = make_spec(messages_per_user=1, min_batch=1, max_batch=10)
    adm = admission(spec)
    taken = []
    real = RoundAdmission._admissible_burst

    def spy(self, opened):
        result = real(self, opened)
        taken.append(result is not None)
        return result

    monkeypatch.setattr(RoundAdmission, "_admissible_burst", spy)
    adm.offer_many([envelope(spec, credential(i), sealed_bytes(i, spec), nonce(i)) for i in range(3)])
    adm.offer_many([envelope(spec, credential(0), sealed_bytes(7, spec), nonce(7))])  # over its quota of 1
    adm.offer_many([envelope(spec, credential(5), sealed_bytes(8, spec), nonce(8))])
    assert taken == [True, False, True] and adm.stats.admitted == 4


@pytest.mark.parametrize("burst", [
    [(0, 1, 1), (1, 2, 1)],  # one sealed report re-wrapped under two credentials
    [(0, 1, 1), (0, 1, 1)],  # an exact retransmission inside the burst
    [(0, 1, 1), (1, 1, 2)],  # one nonce, two reports
    [(0, 1, 1), (0, 2, 2)],  # a credential over its quota of one
    [(0, 1, 1), (1, 2, 2), (2, 3, 3), (3, 4, 4), (5, 5, 5)],  # more than the round's room of four
    [(0, 1, 1), (4, 2, 2)],  # a revoked credential
], ids=["re-wrapped", "retransmitted", "replayed", "over-quota", "round-full", "revoked"])
def test_each_conflict_inside_one_burst_is_judged_as_one_by_one(burst):
    spec = make_spec(messages_per_user=1, min_batch=1, max_batch=4)
    revoked = frozenset({(4).to_bytes(16, "big")})
    items = [envelope(spec, credential(c), sealed_bytes(r, spec), nonce(n)) for c, n, r in burst]
    shortcut, one_by_one = admission(spec, revoked=revoked), admission(spec, revoked=revoked)
    one_by_one._admissible_burst = lambda opened: None
    assert shortcut._admissible_burst(shortcut._open_all(items)) is None
    assert shortcut.offer_many(items) == one_by_one.offer_many(items)
    assert _state(shortcut) == _state(one_by_one)


def test_a_worker_slice_s_failures_come_back_in_place_as_typed_refusals_or_bugs():
    from shuffledp.shuffler.parallel_open import OpenedElsewhere, OpenerBug, OuterLayerPool

    fields = (b"c" * 48, b"n" * 16, b"s" * 8)
    slices = [([fields, None, None], {1: ("error", "malformed", "not an envelope"), 2: ("bug", "KeyError: 'x'")}),
              ([fields], {})]
    out = OuterLayerPool._admissions(make_spec(), slices)
    assert out[0] == fields and out[3] == fields
    assert isinstance(out[1], OpenedElsewhere) and out[1].reason == "malformed" and str(out[1]) == "not an envelope"
    assert isinstance(out[2], OpenerBug) and "KeyError" in str(out[2])


def test_a_burst_judged_one_by_one_has_its_credentials_checked_once():
    """A burst the shortcut turns down for a copy, a replay or a quota is not verified by it first:
    each credential's tag is computed once, by the one-by-one judging (no doubled work that a
    hostile burst could force)."""
    spec = make_spec(messages_per_user=1, min_batch=1, max_batch=64)
    adm = admission(spec)
    adm.offer_many([envelope(spec, credential(0), sealed_bytes(0, spec), nonce(0))])
    calls = []
    real_verify = adm.issuer.verify
    adm.issuer = type("Counting", (), {"verify": lambda self, c, r=frozenset(): calls.append(c) or real_verify(c, r)})()
    burst = [envelope(spec, credential(i), sealed_bytes(i, spec), nonce(i)) for i in range(1, 9)]
    burst.append(envelope(spec, credential(9), sealed_bytes(9, spec), nonce(0)))  # a replay of an admitted nonce
    receipts = adm.offer_many(burst)
    assert len(receipts.admitted) == 8 and receipts.reasons == ["replay"]
    assert len(calls) == len(burst)
