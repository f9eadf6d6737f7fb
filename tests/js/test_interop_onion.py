"""The JavaScript device client against the Python shuffler and analyzer: envelopes a JS
``Client`` seals (``js/test/support/seal_round.mjs``) open with the Python ``EnvelopeOpener``
(the shuffler's outer layer) and the analyzer's ``ReportOpener`` (the inner layer), carry the
device's credential and nonces, decode to report values an honest randomizer of the round can
send, and have the round's one envelope size. Specs are built as
``tests/protocol/vectors/make_vectors.py`` builds them, with fresh keys, and signed as the
analyzer signs them (``Analyzer.sign_spec``).
"""

from __future__ import annotations

import dataclasses

import pytest

from shuffledp.client.mechanisms import check_report_values, report_ranges
from shuffledp.protocol.wire import codec
from shuffledp.protocol.wire import messages as m
from shuffledp.protocol.wire.credentials import CLIENT_ID_BYTES, CredentialIssuer, assigned_instance
from shuffledp.protocol.wire.onion import EnvelopeOpener, ShufflerKeys, envelope_format, sign_spec_bytes, signed_encoding
from shuffledp.protocol.wire.report_format import report_format
from shuffledp.protocol.wire.sealing import AnalyzerKeys, ReportOpener

from tests.js.conftest import run_node_json

ANALYZER = AnalyzerKeys.generate()
SHUFFLER = ShufflerKeys.generate()
ISSUER = CredentialIssuer.generate()
SESSION = bytes(range(16))
#: Before every spec's deadline (1.9e9), so no test depends on the wall clock.
NOW = 1_800_000_000.0


def _specs() -> list[tuple[str, m.RoundSpec, object]]:
    """(name, spec, local data) for every mechanism, with the parameters of the test vectors."""
    keys = dict(analyzer_key=ANALYZER.hpke_public, shuffler_key=SHUFFLER.hpke_public,
                shuffler_signing_key=SHUFFLER.signing_public, session_id=SESSION, deadline=1_900_000_000.0)
    vector = [0.5, -0.25, 0.75]
    near_center = [5.5, -1.0, 0.25]
    return [
        ("hadamard-range", m.RoundSpec(round_id=0, params=m.HadamardRangeParams(-20.0, 20.0, 0.8), epsilon0=0.5,
                                       min_batch=1000, **keys), 3.7),
        ("projected-mean", m.RoundSpec(round_id=1, params=m.ProjectedMeanParams(-0.7, 4.1, "gaussian", 4096), epsilon0=0.5,
                                       delta0=1e-7, min_batch=1000, max_batch=4000, shuffler_instances=4, **keys), 1.3),
        ("modular-sum", m.RoundSpec(round_id=2, params=m.ModularSumParams(0.0, 1.0, 100, 2_000_003, 8, 10_000), epsilon0=1.0,
                                    delta0=1e-6, min_batch=80_000, max_batch=80_000, messages_per_user=8, **keys), 0.42),
        ("vector-sum", m.RoundSpec(round_id=3, params=m.VectorSumParams(3, 1.0, 200, 7, 10_000_019, 10, 10_000, 3.0e6),
                                   epsilon0=1.0, delta0=1e-6, min_batch=400_000, max_batch=400_000, messages_per_user=40,
                                   **keys), vector),
        ("vector-range-paper", m.RoundSpec(round_id=4, params=m.VectorRangeParams(-4.0, 4.0, 0.5, 3, 2**64 - 1, "paper"),
                                           epsilon0=2.0, min_batch=4000, messages_per_user=4, **keys), vector),
        ("vector-range-sampled", m.RoundSpec(round_id=10, params=m.VectorRangeParams(-4.0, 4.0, 0.5, 3, 99, "sampled"),
                                             epsilon0=2.0, min_batch=1000, **keys), vector),
        ("vector-mean", m.RoundSpec(round_id=5, params=m.VectorMeanParams(3, 2**64 - 1, (-1.5, -1.0, 0.0, 0.5),
                                                                          (1.5, 2.0, 3.0, 3.5), "laplace", 1024),
                                    epsilon0=2.0, min_batch=1000, **keys), vector),
        ("coordinate-tree", m.RoundSpec(round_id=6, params=m.CoordinateTreeParams(-50.0, 50.0, 50.0 / 64, 3, 12345),
                                        epsilon0=3.0, min_batch=1000, **keys), vector),
        ("shifted-norm", m.RoundSpec(round_id=7, params=m.ShiftedNormParams((4.5, -1.25, 0.0), -32.0, 8.0, 0.125),
                                     epsilon0=4.0, min_batch=1000, **keys), near_center),
        ("shifted-vector-sum", m.RoundSpec(round_id=8, params=m.ShiftedVectorSumParams(
            3, 2.5, 200, 7, 10_000_019, 10, 10_000, 3.0e6, "skellam", (4.5, -1.25, 0.0)),
            epsilon0=1.0, delta0=1e-6, min_batch=400_000, max_batch=400_000, messages_per_user=40, **keys), near_center),
        # The vectors' local-vector round (levels 200, mu 500,000) is beyond the JS device's exact
        # Poisson sampler (a mean of at most 2^16 per draw, DEVICE_MAX_MEAN): a coarser grid whose
        # Skellam noise (mu 60,000) gives epsilon 1.39 <= 2 at delta 1e-6. The vectors' own round is
        # refused, typed (test_js_device_refuses_rounds_beyond_its_samplers).
        ("local-vector", m.RoundSpec(round_id=9, params=m.LocalVectorParams(3, 2.5, 50, 7, 60_000.0, (4.5, -1.25, 0.0)),
                                     epsilon0=2.0, delta0=1e-6, min_batch=4000, messages_per_user=4, **keys), near_center),
    ]


SPECS = _specs()


def _signed(spec: m.RoundSpec, keys: AnalyzerKeys = ANALYZER, spec_bytes: bytes | None = None) -> bytes:
    """The encoded signed spec, as ``Analyzer.sign_spec`` makes it (the canonical encoding, signed)."""
    spec_bytes = codec.canonical_encode(spec) if spec_bytes is None else spec_bytes
    return codec.encode(m.SignedRoundSpec(spec_bytes, sign_spec_bytes(keys.signing_private, spec_bytes)))


def _request(spec: m.RoundSpec, local_data: object, credential: bytes, **overrides) -> dict:
    request = {
        "signed_spec": _signed(spec).hex(),
        "credential": credential.hex(),
        "local_data": local_data,
        "analyzer_signing_key": ANALYZER.signing_public.hex(),
        "shuffler_signing_key": SHUFFLER.signing_public.hex(),
        "shuffler_key": SHUFFLER.hpke_public.hex(),
        "accept_central_only": not getattr(spec.params, "LOCAL_GUARANTEE", True),
        "now": NOW,
    }
    request.update(overrides)
    return request


def _answer(js_package, request: dict) -> dict:
    return run_node_json(js_package / "test" / "support" / "seal_round.mjs", request, timeout=120)


@pytest.mark.parametrize("name, spec, local_data", SPECS, ids=[name for name, _, _ in SPECS])
def test_python_opens_every_envelope_of_a_js_device(js_package, name, spec, local_data):
    credential = ISSUER.issue()
    answer = _answer(js_package, _request(spec, local_data, credential))
    assert "error" not in answer, answer
    assert answer["digest"] == spec.digest.hex()
    assert answer["spent_epsilon"] == spec.epsilon0 and answer["spent_delta"] == spec.delta0
    assert answer["instance"] == assigned_instance(credential[:CLIENT_ID_BYTES], spec.shuffler_instances, spec.digest)
    envelopes = [bytes.fromhex(e) for e in answer["envelopes"]]
    nonces = [bytes.fromhex(n) for n in answer["nonces"]]
    assert len(envelopes) == len(nonces) == m.messages_per_user(spec.params)

    size = envelope_format(spec.round_id, spec.mechanism).size
    shuffler = EnvelopeOpener(SHUFFLER.hpke_private, spec)
    analyzer = ReportOpener(ANALYZER.hpke_private, spec.session_id, spec.round_id, spec.digest)
    read_values = report_format(spec.round_id, spec.mechanism).values
    ranges = report_ranges(spec)
    encapsulated = set()
    rows = []
    for envelope, nonce in zip(envelopes, nonces):
        assert len(envelope) == size  # one size per round, whatever the value
        admission = shuffler.open(envelope)
        assert admission.credential == credential and ISSUER.verify(admission.credential) == credential[:CLIENT_ID_BYTES]
        assert admission.nonce == nonce
        values = read_values(analyzer.open(admission.sealed))
        check_report_values(values, ranges)
        encapsulated.add(admission.sealed[:32])
        rows.append(values)
    assert len(encapsulated) == len(envelopes)  # every message sealed on its own
    assert len(set(nonces)) == len(nonces)

    if name == "modular-sum":
        # The 8 shares sum, mod q, to the fixed-point encoding of 0.42 (42, the precision being 100:
        # exact, no rounding) plus this user's Polya noise share. One user's share is a difference of
        # two Polya(1/n, e^(-1/100)) draws (n = 10^4, scale 100 units): P(|share| >= 1000) is about
        # 2 (1/n) E1(10) < 1e-9, the false-failure probability of this check.
        q = spec.params.modulus
        total = sum(row[0] for row in rows) % q
        centered = total - q if total > q // 2 else total
        assert abs(centered - 42) < 1000, centered
    if spec.mechanism in ("vector-range", "local-vector", "vector-sum", "shifted-vector-sum") and len(rows) > 1:
        # Paper-mode and per-coordinate mechanisms answer every rotated coordinate.
        coordinates = sorted({row[0] for row in rows})
        assert coordinates == list(range(spec.params.padded_dim))


def test_js_device_refuses_what_python_parties_would_not_sign(js_package):
    _, spec, local_data = SPECS[0]
    credential = ISSUER.issue()
    other = AnalyzerKeys.generate()
    refused = _answer(js_package, _request(spec, local_data, credential, signed_spec=_signed(spec, other).hex()))
    assert refused["error"]["reason"] == "bad-signature" and refused["spent_epsilon"] == 0

    flipped = bytearray(_signed(spec))
    flipped[-5] ^= 0x01  # inside the spec bytes, the last field of the signed spec
    refused = _answer(js_package, _request(spec, local_data, credential, signed_spec=bytes(flipped).hex()))
    assert refused["error"]["reason"] == "bad-signature"

    swapped = dataclasses.replace(spec, shuffler_key=ShufflerKeys.generate().hpke_public)
    refused = _answer(js_package, _request(swapped, local_data, credential))
    assert refused["error"]["reason"] == "untrusted-round" and refused["spent_epsilon"] == 0

    expired = _answer(js_package, _request(spec, local_data, credential, now=spec.deadline + 1))
    assert expired["error"]["reason"] == "expired"

    # A spec in a form other than the canonical one (an integer where a float belongs) is refused,
    # as the Python parties' verified_spec refuses it: every party must derive one digest.
    integral = dataclasses.replace(spec, params=m.HadamardRangeParams(-20, 20, 1))
    plain = codec.encode(integral)
    assert plain != codec.canonical_encode(integral)
    refused = _answer(js_package, _request(integral, local_data, credential, signed_spec=_signed(integral, spec_bytes=plain).hex()))
    assert refused["error"]["reason"] == "malformed"

    budget = _answer(js_package, _request(spec, local_data, credential, epsilon_budget=0.25))
    assert budget["error"]["reason"] == "budget" and budget["spent_epsilon"] == 0


def test_js_device_refuses_rounds_beyond_its_samplers(js_package):
    """The vectors' local-vector round asks a per-user Skellam mean the device's exact sampler does
    not run (time linear in the mean): a typed refusal, nothing charged."""
    spec = dataclasses.replace(SPECS[-1][1], params=m.LocalVectorParams(3, 2.5, 200, 7, 500_000.0, (4.5, -1.25, 0.0)))
    refused = _answer(js_package, _request(spec, [5.5, -1.0, 0.25], ISSUER.issue()))
    assert refused["error"]["reason"] == "invalid-parameter" and refused["spent_epsilon"] == 0


def test_js_device_settles_outcomes_the_python_shuffler_signs(js_package):
    """Outcomes signed by the Python shuffler (``signed_encoding``) verify in the JS device, which
    heeds only its own instance, trusts them only forward (a failed round stays failed whatever
    replayed word follows) and keeps the lost round charged; one signed by another key is refused."""
    _, spec, local_data = SPECS[1]  # four shuffler instances
    credential = ISSUER.issue()
    mine = assigned_instance(credential[:CLIENT_ID_BYTES], spec.shuffler_instances, spec.digest)

    def outcome(word: str, instance: int, reason: str = "", key=SHUFFLER) -> str:
        batch_id = bytes(range(16)) if word == "released" else bytes(16)
        message = m.RoundOutcome(spec.session_id, spec.round_id, spec.digest, word, reason, 1000 if word == "released" else 7,
                                 batch_id, instance)
        return signed_encoding(key.signing_private, message).hex()

    outcomes = [
        outcome("released", (mine + 1) % 4),  # another instance's batch: ignored
        outcome("failed", mine, "batch-too-small", key=ShufflerKeys.generate()),  # not the spec's shuffler
        outcome("released", mine),
        outcome("failed", mine, "batch-too-small"),
        outcome("released", mine),  # a replayed older word: changes nothing
    ]
    answer = _answer(js_package, _request(spec, local_data, credential, outcomes=outcomes))
    assert answer["settled"] == [
        {"outcome": None},
        {"error": "bad-signature"},
        {"outcome": "released"},
        {"outcome": "failed:batch-too-small"},
        {"outcome": "failed:batch-too-small"},
    ]
    assert answer["lost_rounds"] == [str(spec.round_id)]
    assert answer["spent_epsilon"] == spec.epsilon0  # a lost round stays charged
