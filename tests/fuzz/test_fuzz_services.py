"""Fuzzing the service entry points with mutated messages mixed into valid traffic.

* Shuffler: ``RoundAdmission.offer`` never raises and never counts
  ``internal-error`` on mutated envelopes, and every valid envelope mixed in among
  them is admitted exactly once; ``admit`` raises only ShuffleDPError.
* Client: ``Client.answer`` on mutated signed specs (the outer message mutated, or
  the inner RoundSpec mutated and re-signed by the real analyzer, or a valid spec
  with hostile field values) raises only ShuffleDPError, and never charges the
  ledger when it raises; when it answers, the envelope is one of the round.
* Analyzer: ``open_payloads``, ``open_batch`` and ``open_batch_bytes`` on real
  sealed reports mixed with mutated payloads (mutated ciphertexts, copies, sealed
  mutated plaintexts, payloads of other rounds, random bytes) never count
  ``internal-error``, account for every payload, and output exactly the values a
  reference model predicts: every valid report once, plus any sealed mutant that
  is a valid report of the round (decided by the general decoder).
"""

from __future__ import annotations

import functools
from collections import Counter

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given

import strategies as S
from fuzz_stats import FUZZ, count_case, timed
from shuffledp.analyzer.service import INTERNAL_ERROR, Analyzer
from shuffledp.client.client import Client, verified_spec
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.client.mechanisms import report_ranges
from shuffledp.protocol import codec
from shuffledp.protocol.errors import MessageTooLarge, ShuffleDPError
from shuffledp.protocol.messages import (
    Envelope,
    HadamardRangeParams,
    ProjectedMeanParams,
    Report,
    RoundSpec,
    ShuffledBatch,
    SignedRoundSpec,
)
from shuffledp.protocol.randomness import SeededSource
from shuffledp.protocol.report_format import report_format
from shuffledp.protocol.sealing import AnalyzerKeys, Sealer, open_sealed, sign
from shuffledp.shuffler.service import INTERNAL_ERROR as SHUFFLER_INTERNAL_ERROR
from shuffledp.shuffler.service import RoundAdmission

NOW = 1_000_000.0
SESSION = bytes(range(16))
#: Fixed keys keep the suite reproducible (HPKE still draws a fresh ephemeral key per seal).
ANALYZER = Analyzer(
    AnalyzerKeys(
        X25519PrivateKey.from_private_bytes(bytes(range(1, 33))),
        Ed25519PrivateKey.from_private_bytes(bytes(range(33, 65))),
    )
)
OTHER_ANALYZER = Analyzer(
    AnalyzerKeys(
        X25519PrivateKey.from_private_bytes(bytes(range(2, 34))),
        Ed25519PrivateKey.from_private_bytes(bytes(range(34, 66))),
    )
)
KEY = ANALYZER.keys.hpke_public
SPECS = (
    RoundSpec(SESSION, 3, HadamardRangeParams(-4.0, 4.0, 0.5), 0.5, KEY, 1, NOW + 3600),
    RoundSpec(SESSION, 70000, ProjectedMeanParams(0.0, 2.0, "laplace", 4096), 1.0, KEY, 1, NOW + 3600),
    RoundSpec(SESSION, 2**40, ProjectedMeanParams(-1.0, 1.0, "gaussian", 64), 2.0, KEY, 1, NOW + 3600, delta0=1e-6),
    RoundSpec(bytes(16), 2**63 - 1, HadamardRangeParams(0.0, 1.0, 1 / 64), 3.0, KEY, 1, NOW + 3600),
)
POOL_SIZE = 24


def reference_values(plaintext: bytes, spec: RoundSpec):
    """What the analyzer must output for an opened plaintext, by the general decoder (None: rejected)."""
    try:
        report = codec.decode_padded(plaintext, Report)
    except ShuffleDPError:
        return None
    if report.round_id != spec.round_id or report.mechanism != spec.mechanism:
        return None
    if len(plaintext) != report_format(spec.round_id, spec.mechanism).size:
        return None
    ranges = report_ranges(spec)
    if len(report.values) != len(ranges) or any(v not in allowed for v, allowed in zip(report.values, ranges)):
        return None
    return tuple(report.values)


def client_reports(spec: RoundSpec, samples, seeds) -> tuple[tuple[bytes, bytes, tuple[int, ...]], ...]:
    """``(sealed, plaintext, values)`` of real reports of ``spec``: answers of real clients to the signed spec."""
    signed = ANALYZER.sign_spec(spec)
    out = []
    for x, seed in zip(samples, seeds):
        client = Client(
            np.array([x]), ANALYZER.keys.signing_public, PrivacyLedger(1e6, 0.9999),
            clock=lambda: NOW, source=SeededSource(seed),
        )
        sealed = codec.decode(client.answer(signed)[0], Envelope).sealed
        plaintext = open_sealed(ANALYZER.keys.hpke_private, sealed, spec.session_id, spec.round_id)
        values = reference_values(plaintext, spec)
        assert values is not None, f"a client's own report is not valid for its round: {plaintext.hex()}"
        out.append((sealed, plaintext, values))
    return tuple(out)


@functools.cache
def pool(index: int) -> tuple[tuple[bytes, bytes, tuple[int, ...]], ...]:
    """Real reports of ``SPECS[index]`` (made once per session)."""
    return client_reports(SPECS[index], [-3.0 + 0.25 * k for k in range(POOL_SIZE)], range(POOL_SIZE))


# ---------------------------------------------------------------------------
# shuffler admission
# ---------------------------------------------------------------------------


def _decoy(r: S.Rng, spec: RoundSpec, index: int, sealed_size: int) -> bytes:
    """An envelope whose token, nonce and sealed bytes can never equal a valid one's (distinct prefixes)."""
    session, round_id, size = spec.session_id, spec.round_id, sealed_size
    k = r.below(8)
    if k == 0:
        session = S.g_session(r)
    elif k == 1:
        round_id = S.g_round_id(r)
    elif k == 2:
        size = r.int(1, 1024)
    return codec.encode(
        Envelope(session, round_id, b"\x3c" * 8 + index.to_bytes(8, "big"), b"\xc3" * 8 + index.to_bytes(8, "big"),
                 b"D" + r.bytes(size - 1))
    )


@FUZZ
@given(seed=S.seeds)
def test_admission_survives_mutated_envelopes_and_admits_every_valid_one(seed):
    count_case("admission")
    r = S.Rng(seed)
    spec = S.g_round_spec(r, min_max_batch=64)
    sealed_size = report_format(spec.round_id, spec.mechanism).sealed_size
    valid = [
        Envelope(spec.session_id, spec.round_id, b"\xa5" * 8 + i.to_bytes(8, "big"), b"\x5a" * 8 + i.to_bytes(8, "big"),
                 b"V" + bytes([i]) + r.bytes(sealed_size - 2))
        for i in range(r.int(0, 8))
    ]
    counter = iter(range(10**6))

    def decoys(rr):
        return _decoy(rr, spec, next(counter), sealed_size)

    mutants = [S.mutate(r, decoys(r), others=decoys) for _ in range(r.int(0, 10))]
    if r.one_in(4):
        mutants.append(decoys(r))  # an unmutated decoy: valid, admitted, and harmless to the valid ones
    traffic = [(True, codec.encode(e)) for e in valid] + [(False, m) for m in mutants]
    r.r.shuffle(traffic)

    admission = RoundAdmission(spec)
    for is_valid, data in traffic:
        admission.offer(data)  # never raises
        if not is_valid:
            try:
                timed("RoundAdmission.admit", lambda d: RoundAdmission(spec).admit(d), data)
            except ShuffleDPError:
                pass
    stats = admission.stats
    assert INTERNAL_ERROR not in stats.rejected and SHUFFLER_INTERNAL_ERROR not in stats.rejected, (
        stats.rejected, [d.hex() for _, d in traffic]
    )
    assert stats.admitted + sum(stats.rejected.values()) == len(traffic)
    assert stats.admitted == len(admission.payloads)
    admitted = Counter(admission.payloads)
    for envelope in valid:
        assert admitted[envelope.sealed] == 1, (
            f"valid envelope not admitted exactly once: {codec.encode(envelope).hex()}; "
            f"rejections {dict(stats.rejected)}; traffic {[d.hex() for _, d in traffic]}"
        )


# ---------------------------------------------------------------------------
# client
# ---------------------------------------------------------------------------


def _signed_for_client(r: S.Rng) -> bytes:
    mode = r.below(3)
    key = KEY if r.bool() else (r.pick(S.LOW_ORDER_X25519) if r.bool() else r.bytes(32))
    deadline = r.pick((NOW + 3600, NOW, NOW - 1e-3, 1e12, NOW + 1)) if r.below(4) else r.float()
    spec = S.g_round_spec(r, analyzer_key=key, deadline=deadline)
    if mode == 0:  # the outer SignedRoundSpec mutated
        return S.mutate(r, ANALYZER.sign_spec(spec), others=lambda rr: ANALYZER.sign_spec(S.g_round_spec(rr)))
    if mode == 1:  # the inner RoundSpec mutated, then really signed: reaches the spec validation
        spec_bytes = S.mutate(r, codec.encode(spec), others=lambda rr: codec.encode(S.g_round_spec(rr))) or b"\x00"
        try:
            return codec.encode(SignedRoundSpec(spec_bytes, sign(ANALYZER.keys.signing_private, spec_bytes)))
        except MessageTooLarge:
            return ANALYZER.sign_spec(spec)
    if r.one_in(8):  # signed by another analyzer
        return OTHER_ANALYZER.sign_spec(spec)
    return ANALYZER.sign_spec(spec)  # valid, with hostile (but in-domain) values


@FUZZ
@given(seed=S.seeds)
def test_client_answer_raises_only_typed_errors_and_charges_only_on_success(seed):
    count_case("client")
    r = S.Rng(seed)
    signed = _signed_for_client(r)
    ledger = PrivacyLedger(r.pick((0.1, 1.0, 31.0, 1e6)), r.pick((0.0, 1e-6, 0.5)))
    if r.one_in(4):  # a round already answered
        try:
            spec = verified_spec(signed, ANALYZER.keys.signing_public)
            ledger.spend(spec.session_id, spec.round_id, 0.0, 0.0)
        except ShuffleDPError:
            pass
    client = Client(
        np.array([r.r.uniform(-100.0, 100.0) if r.below(4) else S.g_low(r)]), ANALYZER.keys.signing_public, ledger,
        clock=lambda: NOW, source=SeededSource(r.below(2**32)),
    )
    before = (ledger.spent_epsilon, ledger.spent_delta, frozenset(ledger.answered))
    try:
        out = client.answer(signed)
    except ShuffleDPError:
        after = (ledger.spent_epsilon, ledger.spent_delta, frozenset(ledger.answered))
        assert after == before, f"a refused round charged the ledger: {signed.hex()}"
        return
    spec = verified_spec(signed, ANALYZER.keys.signing_public)
    assert len(out) == 1
    envelope = codec.decode(out[0], Envelope)
    assert (envelope.session_id, envelope.round_id) == (spec.session_id, spec.round_id)
    assert client.token is None or envelope.token == client.token
    assert len(envelope.sealed) == report_format(spec.round_id, spec.mechanism).sealed_size
    assert ledger.spent_epsilon == before[0] + spec.epsilon0
    assert ledger.spent_delta == before[1] + spec.delta0
    assert ledger.answered == before[2] | {(spec.session_id, spec.round_id)}
    if spec.analyzer_key == KEY:
        plaintext = open_sealed(ANALYZER.keys.hpke_private, envelope.sealed, spec.session_id, spec.round_id)
        assert reference_values(plaintext, spec) is not None, plaintext.hex()


# ---------------------------------------------------------------------------
# analyzer
# ---------------------------------------------------------------------------


def _extra_payload(r: S.Rng, spec: RoundSpec, reports, chosen, known: dict) -> bytes:
    """One hostile payload; ``known`` maps every payload that opens to its plaintext."""
    layout = report_format(spec.round_id, spec.mechanism)
    kind = r.below(7)
    if kind == 0 or (kind == 1 and not chosen):  # a mutated ciphertext (AEAD: does not open)
        def other(rr):
            return rr.pick(reports)[0]

        return S.mutate_bytes(r, r.pick(reports)[0], others=other)[:1024] or b"\x00"
    if kind == 1:  # an exact copy of a valid report in the batch
        return reports[r.pick(chosen)][0]
    if kind in (2, 3):  # a mutated plaintext, sealed for the round: opens, then meets the report reader
        if r.bool():
            base = r.pick(reports)[1]
        else:
            base = layout.pad(codec.encode(S.g_report(r, spec.round_id, spec.mechanism)))
        plaintext = S.mutate(r, base, others=lambda rr: rr.pick(reports)[1], max_ops=2)[:976] or b"\x00"
        if r.below(4):
            plaintext = plaintext[: layout.size] + bytes(max(0, layout.size - len(plaintext)))
        sealed = Sealer(spec.analyzer_key).seal(plaintext, spec.session_id, spec.round_id)
        known[sealed] = plaintext
        return sealed
    if kind == 4:  # a valid report sealed for another round or session: does not open here
        round_id = spec.round_id ^ 1 if r.bool() else spec.round_id
        session = spec.session_id
        if round_id == spec.round_id:  # then another session (every byte changed)
            session = bytes(b ^ (1 + r.below(255)) for b in spec.session_id)
        return Sealer(spec.analyzer_key).seal(r.pick(reports)[1], session, round_id)
    if kind == 5:  # the encapsulated key of a report in the batch on a forged ciphertext
        source = reports[r.pick(chosen)][0] if chosen else r.pick(reports)[0]
        return source[:32] + r.bytes(layout.sealed_size - 32)
    return r.bytes(layout.sealed_size if r.bool() else r.int(1, 1024))


def _expected_rows(payloads, spec, known) -> list:
    """The reference model of ``open_payloads``: sizes, opening, encapsulated-key de-duplication, values."""
    sealed_size = report_format(spec.round_id, spec.mechanism).sealed_size
    seen, rows = set(), []
    for p in payloads:
        if len(p) != sealed_size or p not in known:
            continue
        if p[:32] in seen:
            continue
        seen.add(p[:32])
        values = reference_values(known[p], spec)
        if values is not None:
            rows.append(values)
    return sorted(rows)


def _check_opened(opened, payloads, expected, valid_values, context):
    assert INTERNAL_ERROR not in opened.rejected, context()
    assert opened.size + sum(opened.rejected.values()) == len(payloads), context()
    rows = sorted(tuple(int(v) for v in row) for row in opened.values)
    assert rows == expected, context()
    missing = Counter(valid_values) - Counter(rows)
    assert not missing, f"valid reports lost: {missing}; " + context()


@FUZZ
@given(seed=S.seeds)
def test_analyzer_opens_every_valid_report_among_mutants(seed):
    count_case("analyzer")
    r = S.Rng(seed)
    if r.one_in(4):  # a drawn round (any mechanism, parameters, round id) with a few fresh client reports
        index = "drawn"
        spec = S.g_round_spec(r, analyzer_key=KEY, deadline=NOW + 3600)
        samples = [r.r.uniform(-10.0, 10.0) if r.below(4) else S.g_low(r) for _ in range(r.int(1, 3))]
        reports = client_reports(spec, samples, [r.below(2**32) for _ in samples])
    else:
        index = r.below(len(SPECS))
        spec = SPECS[index]
        reports = pool(index)
    known = {sealed: plaintext for sealed, plaintext, _ in reports}
    chosen = r.r.sample(range(len(reports)), r.int(0, min(8, len(reports))))
    payloads = [reports[j][0] for j in chosen]
    valid_values = [reports[j][2] for j in chosen]
    payloads += [_extra_payload(r, spec, reports, chosen, known) for _ in range(r.int(0, 8))]
    r.r.shuffle(payloads)
    expected = _expected_rows(payloads, spec, known)
    over = len(payloads) > spec.max_batch  # refused whole, before anything is opened
    if over:
        expected, valid_values = [], []

    def context():
        return f"spec {index} ({spec}); payloads {[p.hex() for p in payloads]}"

    _check_opened(ANALYZER.open_payloads(payloads, spec), payloads, expected, valid_values, context)
    _check_opened(
        ANALYZER.open_batch(ShuffledBatch(spec.session_id, spec.round_id, tuple(payloads)), spec),
        payloads, expected, valid_values, context,
    )
    data = codec.encode(ShuffledBatch(spec.session_id, spec.round_id, tuple(payloads)))
    sealed_size = report_format(spec.round_id, spec.mechanism).sealed_size
    if all(len(p) == sealed_size for p in payloads) and not over:
        opened = ANALYZER.open_batch_bytes(data, spec)
        _check_opened(opened, payloads, expected, valid_values, context)
    else:  # the fast batch reader refuses a batch too long or with a payload of another size, typed
        with pytest.raises(ShuffleDPError):
            ANALYZER.open_batch_bytes(data, spec)
    # and the batch bytes themselves mutated: a typed refusal, or an opening with nothing untyped
    mutant = S.mutate(r, data, others=lambda rr: codec.encode(ShuffledBatch(spec.session_id, spec.round_id,
                                                                            (rr.pick(reports)[0],))), max_ops=2)
    try:
        opened = ANALYZER.open_batch_bytes(mutant, spec)
    except ShuffleDPError:
        return
    assert INTERNAL_ERROR not in opened.rejected, mutant.hex()
