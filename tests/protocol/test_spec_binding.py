"""Every message of a round is bound to the exact spec the analyzer signed, not only to its
session and round ids.

The attack these tests pin down: an analyzer that restarts with the same session id and a
fresh round counter signs a second spec for round 0 (say ε0 = 0.5) while batches randomized
under the first (ε0 = 8) are still in flight or re-published. Bound only to (session, round),
that batch would be opened and recorded as ε0 = 0.5: the printed guarantee would be false.
With the spec digest in both HPKE ``info`` strings and in every signed message, the batch,
its reports, its receipts and its outcome are refused under the second spec.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections import Counter

import numpy as np
import pytest

from shuffledp.client.ledger import PrivacyLedger
from shuffledp.deploy.deployment import Deployment
from shuffledp.protocol.wire import codec
from shuffledp.protocol.transport.channel import InProcessChannel, announce_topic, outcome_topic
from shuffledp.protocol.errors import BatchTooSmall, MalformedMessage, UnknownRound
from shuffledp.protocol.wire.messages import (
    HadamardRangeParams,
    RoundOutcome,
    RoundSpec,
    SignedRoundSpec,
    spec_digest_of,
)
from shuffledp.protocol.wire.onion import signed
from shuffledp.shuffler.service import RoundAdmission, batch_chunks
from shuffledp.shuffler.spool import SqliteSpool

N = 12


def _specs(deployment: Deployment) -> tuple[RoundSpec, RoundSpec]:
    """Round 0 of one session twice: first at ε0 = 8, then (after a restart) at ε0 = 0.5."""
    first = RoundSpec(
        session_id=deployment.session_id, round_id=0, params=HadamardRangeParams(-4.0, 4.0, 1.0), epsilon0=8.0,
        analyzer_key=deployment.analyzer_keys.hpke_public, shuffler_key=deployment.shuffler_keys.hpke_public,
        shuffler_signing_key=deployment.shuffler_keys.signing_public, min_batch=N, max_batch=N, deadline=1e12,
    )
    return first, dataclasses.replace(first, epsilon0=0.5)


def _answer(deployment: Deployment, spec: RoundSpec):
    clients = [deployment.client(np.array([0.1 * i]), PrivacyLedger(100.0)) for i in range(N)]
    signed_spec = deployment.analyzer().sign_spec(spec)
    return clients, [c.answer(signed_spec)[0] for c in clients]


def test_the_digest_is_that_of_the_signed_bytes():
    """A spec decoded from the analyzer's signed bytes has the digest an auditor computes from them."""
    deployment = Deployment()
    first, second = _specs(deployment)
    signed_bytes = codec.decode(deployment.analyzer().sign_spec(first), SignedRoundSpec).spec_bytes
    assert codec.decode(signed_bytes, RoundSpec).digest == spec_digest_of(signed_bytes) == first.digest
    assert first.digest != second.digest  # one field changed: another spec


def test_a_batch_of_the_first_spec_is_refused_under_the_second():
    deployment = Deployment()
    first, second = _specs(deployment)
    _, envelopes = _answer(deployment, first)
    admission = RoundAdmission(first, deployment.shuffler_keys, deployment.issuer)
    admission.offer_many(envelopes)
    assert admission.stats.admitted == N
    payloads = admission.shuffled_payloads()
    analyzer = deployment.analyzer()
    chunk = batch_chunks(first, deployment.shuffler_keys, os.urandom(16), payloads, N)[0]
    assert analyzer.open_batch_bytes(chunk, first).size == N  # control: its own spec opens it
    # the restarted analyzer, now at round 0 under the second spec, refuses the chunk by its layout
    with pytest.raises(MalformedMessage, match="another session or spec"):
        analyzer.open_batch_bytes(chunk, second)
    # and even re-signed by the shuffler as a chunk of the second spec, no report in it opens
    resigned = batch_chunks(second, deployment.shuffler_keys, os.urandom(16), payloads, N)[0]
    opened = analyzer.open_batch_bytes(resigned, second)
    assert opened.size == 0 and sum(opened.rejected.values()) == N


def test_envelopes_sealed_under_the_first_spec_are_not_admitted_under_the_second():
    deployment = Deployment()
    first, second = _specs(deployment)
    _, envelopes = _answer(deployment, first)
    admission = RoundAdmission(second, deployment.shuffler_keys, deployment.issuer)
    receipts = admission.offer_many(envelopes)
    assert admission.stats.admitted == 0 and not receipts.admitted
    assert admission.stats.rejected == Counter({"unsealable": N})


def test_a_client_settles_no_receipt_or_outcome_about_another_spec_of_its_round():
    deployment = Deployment()
    first, second = _specs(deployment)
    clients, _ = _answer(deployment, first)
    c = clients[0]
    key = deployment.shuffler_keys.signing_private
    other = signed(key, RoundOutcome(second.session_id, 0, second.digest, "failed", "batch-too-small", 1, bytes(16)))
    with pytest.raises(UnknownRound, match="another spec"):
        c.settle_outcome(codec.encode(other))
    assert c.ledger.outcomes == {}
    own = signed(key, RoundOutcome(first.session_id, 0, first.digest, "failed", "batch-too-small", 1, bytes(16)))
    c.settle_outcome(codec.encode(own))  # control: the outcome of the spec it answered is recorded
    assert c.ledger.outcomes == {(first.session_id, 0): "failed:batch-too-small"}


async def test_the_shuffler_keeps_the_first_spec_of_a_round_and_refuses_a_second():
    """The shuffler serves one round at a time; once round 0 has ended under its first spec, a
    second spec for round 0 is refused (counted), and the spool keeps the first."""
    deployment = Deployment()
    first, second = _specs(deployment)
    first = dataclasses.replace(first, deadline=time.time() + 0.3)  # ends (fails: nobody answers) at once
    channel = InProcessChannel()
    spool = SqliteSpool(":memory:")
    shuffler = deployment.shuffler(channel, spool=spool)
    analyzer = deployment.analyzer()
    task = asyncio.create_task(shuffler.serve())
    try:
        await channel.publish(announce_topic(first.session_id), analyzer.sign_spec(first), retain=True)
        async with asyncio.timeout(5):
            while getattr(spool.round(first.session_id, 0), "state", "open") == "open":
                await asyncio.sleep(0.01)
        await channel.publish(announce_topic(first.session_id), analyzer.sign_spec(second), retain=True)
        await channel.publish(announce_topic(first.session_id), analyzer.sign_spec(first))  # the same spec again
        async with asyncio.timeout(5):
            while not shuffler.rejected_announcements:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert shuffler.rejected_announcements == Counter({"round-respecified": 1})
    stored = codec.decode(spool.round(first.session_id, 0).signed_spec, SignedRoundSpec)
    assert spec_digest_of(stored.spec_bytes) == first.digest


async def test_the_coordinator_does_not_end_a_round_on_the_outcome_of_another_spec():
    """A retained ``failed`` outcome of the first spec does not fail the second spec's round."""
    deployment = Deployment()
    first, second = _specs(deployment)
    channel = InProcessChannel()
    coordinator = deployment.coordinator(channel, round_timeout=0.3, grace=0.1)
    stale = signed(deployment.shuffler_keys.signing_private,
                   RoundOutcome(first.session_id, 0, first.digest, "failed", "batch-too-small", 0, bytes(16)))
    await channel.publish(outcome_topic(first.session_id, 0, 0), codec.encode(stale), retain=True)
    with pytest.raises(BatchTooSmall, match="no batch by the deadline"):  # not "the shuffler reports the round failed"
        await coordinator.receive_round(dataclasses.replace(second, deadline=time.time() + 0.3))
    assert coordinator.rejected_batches["outcome-other-spec"] == 1


def test_the_instance_a_client_is_sent_to_is_fresh_in_every_round():
    """The instance index is in the clear (the reports topic). Fixed per client, it would be a
    pseudonym linking a device across rounds and sessions; drawn from the spec digest, a
    client's index in one round says nothing of its index in another. Over 400 clients and
    8 instances, the number keeping their index between two rounds is Binomial(400, 1/8):
    mean 50, standard deviation 6.6; a fixed assignment would keep all 400."""
    from shuffledp.protocol.wire.credentials import assigned_instance

    deployment = Deployment()
    first, _ = _specs(deployment)
    second = dataclasses.replace(first, round_id=1)
    ids = [i.to_bytes(16, "big") for i in range(400)]
    kept = sum(assigned_instance(c, 8, first.digest) == assigned_instance(c, 8, second.digest) for c in ids)
    assert 20 <= kept <= 80  # mean +- 4.5 standard deviations
    spread = Counter(assigned_instance(c, 8, first.digest) for c in ids)
    assert len(spread) == 8 and max(spread.values()) <= 50 + 4.5 * 6.6  # uniform over instances


def test_a_signature_the_analyzer_made_on_another_message_is_not_a_spec_signature():
    """Spec signatures are domain-separated like every other signed message: the analyzer's
    signature on an acknowledgement does not verify as its signature on any spec bytes (without
    the label it did, and only the decoder of the forged spec bytes stood in the way)."""
    import hashlib

    from shuffledp.protocol.errors import BadSignature
    from shuffledp.protocol.wire.messages import BatchAck
    from shuffledp.protocol.wire.onion import SIGNED_LABEL, verified_spec

    deployment = Deployment()
    first, _ = _specs(deployment)
    ack = codec.decode(deployment.analyzer().acknowledge(first, bytes(16)), BatchAck)
    zeroed = codec.encode(dataclasses.replace(ack, signature=bytes(64)))
    covered = SIGNED_LABEL + b"batch-ack" + hashlib.sha256(zeroed).digest()  # what the ack's signature covers
    with pytest.raises(BadSignature):
        verified_spec(SignedRoundSpec(covered, ack.signature), deployment.analyzer_signing_key)
    genuine = deployment.analyzer().sign_spec(first)  # control
    assert verified_spec(genuine, deployment.analyzer_signing_key) == first


def test_a_spec_built_from_integers_is_signed_and_bound_in_the_form_every_party_recreates():
    """``HadamardRangeParams(-4, 4, 1)`` and ``epsilon0=8`` are ints where the wire has floats: the
    analyzer signs (and the round is bound to) the encoding the devices and the shuffler re-create
    from the decoded spec, so the round completes; bytes signed in another form are refused."""
    from shuffledp.protocol.errors import MalformedMessage
    from shuffledp.protocol.wire.onion import sign_spec_bytes, verified_spec

    deployment = Deployment()
    built = RoundSpec(
        session_id=deployment.session_id, round_id=0, params=HadamardRangeParams(-4, 4, 1), epsilon0=8,
        analyzer_key=deployment.analyzer_keys.hpke_public, shuffler_key=deployment.shuffler_keys.hpke_public,
        shuffler_signing_key=deployment.shuffler_keys.signing_public, min_batch=N, max_batch=N, deadline=10**12,
    )
    signed_spec = deployment.analyzer().sign_spec(built)
    spec_bytes = codec.decode(signed_spec, SignedRoundSpec).spec_bytes
    received = verified_spec(signed_spec, deployment.analyzer_signing_key)
    assert received.digest == built.digest == spec_digest_of(spec_bytes)
    # the round completes: devices seal under the received spec, the analyzer opens under its own object
    clients = [deployment.client(np.array([0.1 * i]), PrivacyLedger(100.0)) for i in range(N)]
    admission = RoundAdmission(received, deployment.shuffler_keys, deployment.issuer)
    admission.offer_many([c.answer(signed_spec)[0] for c in clients])
    chunk = batch_chunks(received, deployment.shuffler_keys, os.urandom(16), admission.shuffled_payloads(), N)[0]
    assert deployment.analyzer().open_batch_bytes(chunk, built).size == N
    # the integer form, signed as it is, would bind the round to other bytes: refused
    raw = codec.encode(built)
    assert raw != spec_bytes
    with pytest.raises(MalformedMessage, match="canonical"):
        verified_spec(SignedRoundSpec(raw, sign_spec_bytes(deployment.analyzer_keys.signing_private, raw)),
                      deployment.analyzer_signing_key)
