"""The client's privacy ledger (client/ledger.py) and the device Client (client/client.py)."""

from __future__ import annotations

import dataclasses

import cbor2
import numpy as np
import pytest

from shuffledp.client.client import Client, RoundExpired, randomize_reports, verified_spec
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.protocol.wire import codec
from shuffledp.protocol.errors import BadSignature, BudgetExceeded, InvalidParameter, MalformedMessage, UnknownRound
from shuffledp.protocol.wire.messages import (
    Envelope,
    HadamardRangeParams,
    ProjectedMeanParams,
    Report,
    RoundOutcome,
    RoundSpec,
    SignedRoundSpec,
)
from shuffledp.protocol.wire.onion import EnvelopeOpener, ShufflerKeys, signed
from shuffledp.shuffler.service import RoundAdmission

import parties
from shuffledp.deploy.deployment import Deployment
from shuffledp.protocol.mechanisms.randomness import SeededSource
from shuffledp.protocol.wire.sealing import open_sealed

S1 = bytes(range(16))
S2 = bytes(range(1, 17))
NOW = 1_000_000.0


# --------------------------------------------------------------------------
# ledger
# --------------------------------------------------------------------------


def test_ledger_spends_up_to_budget_then_refuses():
    ledger = PrivacyLedger(1.0)
    ledger.spend(S1, 0, 0.5, 0.0)
    ledger.spend(S1, 1, 0.5, 0.0)  # 0.5 + 0.5 = 1.0 exactly: allowed
    assert ledger.spent_epsilon == pytest.approx(1.0)
    with pytest.raises(BudgetExceeded):
        ledger.spend(S1, 2, 1e-6, 0.0)
    assert ledger.spent_epsilon == pytest.approx(1.0)  # a refusal spends nothing
    assert (S1, 2) not in ledger.answered


def test_ledger_float_sums_within_tolerance():
    ledger = PrivacyLedger(1.0)
    for r in range(10):
        ledger.spend(S1, r, 0.1, 0.0)  # sum of ten 0.1 is 0.9999999999999999
    with pytest.raises(BudgetExceeded):
        ledger.spend(S1, 10, 0.1, 0.0)


def test_ledger_refuses_single_overspend():
    ledger = PrivacyLedger(0.4)
    with pytest.raises(BudgetExceeded):
        ledger.spend(S1, 0, 0.5, 0.0)
    assert ledger.spent_epsilon == 0.0 and not ledger.answered


def test_ledger_delta_budget():
    ledger = PrivacyLedger(10.0, 1e-6)
    ledger.spend(S1, 0, 1.0, 6e-7)
    with pytest.raises(BudgetExceeded):
        ledger.spend(S1, 1, 1.0, 6e-7)
    ledger.spend(S1, 2, 1.0, 4e-7)
    assert ledger.spent_delta == pytest.approx(1e-6)
    with pytest.raises(BudgetExceeded):
        PrivacyLedger(10.0).spend(S1, 0, 1.0, 1e-9)  # no delta budget at all


def test_ledger_refuses_same_round_twice():
    ledger = PrivacyLedger(100.0)
    ledger.spend(S1, 3, 0.5, 0.0)
    with pytest.raises(BudgetExceeded):
        ledger.spend(S1, 3, 0.5, 0.0)
    with pytest.raises(BudgetExceeded):
        ledger.check(S1, 3, 0.0001, 0.0)
    assert ledger.spent_epsilon == 0.5
    # the same round id in another session is a different round
    ledger.spend(S2, 3, 0.5, 0.0)
    ledger.spend(S1, 4, 0.5, 0.0)
    assert ledger.spent_epsilon == pytest.approx(1.5)


@pytest.mark.parametrize("eps,delta", [(0.0, 0.0), (-1.0, 0.0), (float("inf"), 0.0), (float("nan"), 0.0), (1.0, 1.0), (1.0, -0.1)])
def test_ledger_invalid_budget(eps, delta):
    with pytest.raises(InvalidParameter):
        PrivacyLedger(eps, delta)


# --------------------------------------------------------------------------
# client
# --------------------------------------------------------------------------

DEPLOYMENT = parties.DEPLOYMENT
ANALYZER = DEPLOYMENT.analyzer()
RANGE = HadamardRangeParams(-4.0, 4.0, 0.5)  # 8 bins


def spec(round_id=0, params=RANGE, epsilon0=0.5, delta0=0.0, deadline=NOW + 60, session=S1) -> RoundSpec:
    import dataclasses

    s = parties.make_spec(params, round_id=round_id, epsilon0=epsilon0, delta0=delta0, deadline=deadline, min_batch=1)
    return dataclasses.replace(s, session_id=session)


def client(budget=1.0, delta_budget=0.0, samples=(1.2, 1.4), **kw) -> Client:
    kw.setdefault("credential", DEPLOYMENT.enroll())
    return Client(
        np.array(samples), ANALYZER.keys.signing_public, PrivacyLedger(budget, delta_budget), clock=lambda: NOW, **kw
    )


def sealed_of(data: bytes, s: RoundSpec) -> bytes:
    """The inner sealed report of an envelope, through the shuffler's opener."""
    return EnvelopeOpener(DEPLOYMENT.shuffler_keys.hpke_private, s).open(data).sealed


def open_envelope(data: bytes, s: RoundSpec) -> Report:
    envelope = codec.decode(data, Envelope)
    assert envelope.session_id == s.session_id and envelope.round_id == s.round_id
    return codec.decode_padded(open_sealed(ANALYZER.keys.hpke_private, sealed_of(data, s), s.session_id, s.round_id, s.digest), Report)


def test_valid_range_answer_opens_to_report():
    c = client()
    s = spec(round_id=5)
    out = c.answer(ANALYZER.sign_spec(s))
    assert len(out) == 1
    admission = EnvelopeOpener(DEPLOYMENT.shuffler_keys.hpke_private, s).open(out[0])
    assert admission.credential == c.credential and c.sent[(S1, 5)].nonces == [admission.nonce]
    # the broker sees no credential: nothing but the session, the round and a ciphertext
    assert set(cbor2.loads(out[0])) == {"v", "t", "session_id", "round_id", "outer"}
    assert c.credential not in out[0]
    report = open_envelope(out[0], s)
    assert report.round_id == 5 and report.mechanism == "hadamard-range"
    row, bit = report.values
    assert 0 <= row < RANGE.padded_bins and bit in (-1, 1)
    assert c.ledger.spent_epsilon == 0.5 and (S1, 5) in c.ledger.answered
    # and through the analyzer's batch opener
    opened = ANALYZER.open_payloads([admission.sealed], s)
    assert opened.size == 1 and not opened.rejected
    assert tuple(opened.values[0]) == report.values


def test_valid_mean_answer_opens_to_report():
    params = ProjectedMeanParams(0.0, 2.0, "laplace", 64)
    c = client(samples=(1.0, 1.5))
    s = spec(round_id=9, params=params)
    report = open_envelope(c.answer(ANALYZER.sign_spec(s))[0], s)
    assert report.round_id == 9 and report.mechanism == "projected-mean" and len(report.values) == 1


def test_gaussian_round_spends_delta():
    params = ProjectedMeanParams(0.0, 2.0, "gaussian", 64)
    c = client(delta_budget=1e-6)
    s = spec(round_id=1, params=params, delta0=1e-6)
    report = open_envelope(c.answer(ANALYZER.sign_spec(s))[0], s)
    assert report.mechanism == "projected-mean"
    assert c.ledger.spent_delta == 1e-6
    with pytest.raises(BudgetExceeded):  # no delta left for another Gaussian round
        c.answer(ANALYZER.sign_spec(spec(round_id=2, params=params, delta0=1e-6)))


def test_nonces_are_fresh():
    c = client(budget=10.0)
    for r in range(5):
        c.answer(ANALYZER.sign_spec(spec(round_id=r)))
    nonces = {n for sent in c.sent.values() for n in sent.nonces}
    assert len(nonces) == 5


def test_refuses_bad_signature():
    c = client()
    signed = codec.decode(ANALYZER.sign_spec(spec()), SignedRoundSpec)
    forged = SignedRoundSpec(signed.spec_bytes, bytes([signed.signature[0] ^ 1]) + signed.signature[1:])
    with pytest.raises(BadSignature):
        c.answer(codec.encode(forged))
    # a spec signed by another analyzer (e.g. with parameters changed) is refused too
    with pytest.raises(BadSignature):
        c.answer(Deployment().analyzer().sign_spec(spec()))
    # a modified spec under the original signature
    other = codec.encode(spec(epsilon0=0.01))
    with pytest.raises(BadSignature):
        c.answer(SignedRoundSpec(other, signed.signature))
    with pytest.raises(MalformedMessage):
        c.answer(b"\x00garbage")
    assert c.ledger.spent_epsilon == 0.0 and not c.ledger.answered


def test_refuses_expired_deadline():
    c = client()
    with pytest.raises(RoundExpired):
        c.answer(ANALYZER.sign_spec(spec(deadline=NOW - 0.001)))
    assert c.ledger.spent_epsilon == 0.0 and not c.ledger.answered
    c.answer(ANALYZER.sign_spec(spec(deadline=NOW)))  # exactly at the deadline is still open


def test_refuses_over_budget_and_repeats():
    c = client(budget=0.8)
    c.answer(ANALYZER.sign_spec(spec(round_id=0, epsilon0=0.5)))
    with pytest.raises(BudgetExceeded):
        c.answer(ANALYZER.sign_spec(spec(round_id=1, epsilon0=0.5)))
    with pytest.raises(BudgetExceeded):  # re-delivered spec: never answered twice
        c.answer(ANALYZER.sign_spec(spec(round_id=0, epsilon0=0.5)))
    assert c.ledger.spent_epsilon == 0.5
    c.answer(ANALYZER.sign_spec(spec(round_id=2, epsilon0=0.3)))
    assert c.ledger.spent_epsilon == pytest.approx(0.8)


def test_verified_spec_round_trip():
    s = spec(round_id=7)
    assert verified_spec(ANALYZER.sign_spec(s), ANALYZER.keys.signing_public) == s


def test_client_uses_its_local_mean():
    """All samples far in bin 7: with eps large the true Hadamard sign is kept almost surely."""
    params = HadamardRangeParams(-4.0, 4.0, 0.5)
    s = spec(params=params, epsilon0=30.0)  # the largest allowed: the sign flips with probability ~1e-13
    values = randomize_reports(s, np.array([3.9, 3.9, -3.9]), SeededSource(3))
    for (row, bit), nu in zip(values[:, 0, :], (7, 7, 0)):
        assert bit == (1 if bin(row & nu).count("1") % 2 == 0 else -1)
    c = client(budget=100.0, samples=(3.8, 4.0))
    report = open_envelope(c.answer(ANALYZER.sign_spec(s))[0], s)
    row, bit = report.values
    assert bit == (1 if bin(row & 7).count("1") % 2 == 0 else -1)


@pytest.mark.parametrize("samples", [[], [[[1.0, 2.0]]], [1.0, float("nan")], [[1.0, float("inf")]]])
def test_client_rejects_bad_samples(samples):
    with pytest.raises(InvalidParameter):
        Client(np.array(samples), ANALYZER.keys.signing_public, PrivacyLedger(1.0), credential=DEPLOYMENT.enroll())


@pytest.mark.parametrize("credential", [b"short", bytes(49), "x" * 48, None])
def test_client_rejects_bad_credential(credential):
    with pytest.raises(InvalidParameter):
        client(credential=credential)


def test_client_settles_signed_receipts_and_outcomes():
    c = client(budget=1.0)
    s = spec(round_id=4)
    envelope = c.answer(ANALYZER.sign_spec(s))[0]
    adm = RoundAdmission(s, DEPLOYMENT.shuffler_keys, DEPLOYMENT.issuer)
    receipts = adm.offer_many([envelope])
    from shuffledp.protocol.wire.messages import AdmissionReceipts

    message = signed(DEPLOYMENT.shuffler_keys.signing_private, AdmissionReceipts(S1, 4, s.digest, tuple(receipts.admitted), (), ()))
    sent = c.settle_receipts(codec.encode(message))
    assert sent.admitted == 1
    # forged by anyone but the round's shuffler: refused, nothing recorded
    impostor = ShufflerKeys.generate()
    forged = signed(impostor.signing_private, RoundOutcome(S1, 4, s.digest, "failed", "batch-too-small", 1, bytes(16)))
    with pytest.raises(BadSignature):
        c.settle_outcome(codec.encode(forged))
    assert c.ledger.outcomes == {}
    genuine = signed(DEPLOYMENT.shuffler_keys.signing_private, RoundOutcome(S1, 4, s.digest, "failed", "batch-too-small", 1, bytes(16)))
    c.settle_outcome(codec.encode(genuine))
    assert c.ledger.lost_rounds() == [(S1, 4)] and c.ledger.spent_epsilon == 0.5  # told, and still charged
    with pytest.raises(UnknownRound):  # a round this client never answered
        c.settle_outcome(codec.encode(signed(DEPLOYMENT.shuffler_keys.signing_private, RoundOutcome(S1, 9, bytes(32), "released", "", 1, bytes(16)))))


def test_a_device_can_pin_its_shuffler_and_a_crowd_floor():
    from shuffledp.client.client import UntrustedRound

    s = spec(round_id=6)
    pinned = client(shuffler_signing_key=DEPLOYMENT.shuffler_keys.signing_public,
                    shuffler_key=DEPLOYMENT.shuffler_keys.hpke_public, min_batch_floor=1)
    pinned.answer(ANALYZER.sign_spec(s))
    impostor = ShufflerKeys.generate()
    other = client(shuffler_signing_key=impostor.signing_public, shuffler_key=impostor.hpke_public)
    with pytest.raises(UntrustedRound):
        other.answer(ANALYZER.sign_spec(s))
    small = client(min_batch_floor=1000)
    with pytest.raises(UntrustedRound):
        small.answer(ANALYZER.sign_spec(s))  # this spec promises a crowd of 1
    assert other.ledger.spent_epsilon == small.ledger.spent_epsilon == 0.0


def test_a_pinned_device_refuses_a_spec_that_swaps_its_shuffler_sealing_key():
    """A malicious analyzer keeps the pinned shuffler signing key but names its own X25519 key as
    the shuffler's: a pinned device must not seal its outer layer (credential, nonce, every share)
    to it. It refuses, and is not charged."""
    from shuffledp.client.client import UntrustedRound

    analyzer_as_shuffler = ShufflerKeys.generate()
    s = dataclasses.replace(spec(round_id=7), shuffler_key=analyzer_as_shuffler.hpke_public)
    assert s.shuffler_signing_key == DEPLOYMENT.shuffler_keys.signing_public
    pinned = client(shuffler_signing_key=DEPLOYMENT.shuffler_keys.signing_public,
                    shuffler_key=DEPLOYMENT.shuffler_keys.hpke_public, min_batch_floor=1)
    with pytest.raises(UntrustedRound):
        pinned.answer(ANALYZER.sign_spec(s))
    assert pinned.ledger.spent_epsilon == 0.0 and pinned.sent == {}


def test_a_device_pins_both_shuffler_keys_or_neither():
    with pytest.raises(InvalidParameter):
        client(shuffler_signing_key=DEPLOYMENT.shuffler_keys.signing_public)
    with pytest.raises(InvalidParameter):
        client(shuffler_key=DEPLOYMENT.shuffler_keys.hpke_public)
