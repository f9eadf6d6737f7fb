"""Fuzzing the service entry points with hostile messages mixed into valid traffic.

* Shuffler admission: ``RoundAdmission.offer_many`` on bursts of real onion
  envelopes mixed with hostile ones never raises and never counts
  ``internal-error``; every input is counted once (admitted, acknowledged again as
  an exact retransmission, or refused by reason); every valid envelope is admitted
  exactly once and named admitted (never refused) in the receipts, and the receipts
  always make a publishable :class:`AdmissionReceipts`; ``admit`` raises only
  ShuffleDPError. Hostile envelopes are what anyone holding the shuffler's public
  key can send: outer layers really sealed to the shuffler around mutated
  admissions, hostile CBOR or random bytes, admissions of other rounds or with
  sealed reports of other sizes, layers sealed for another round, session or
  shuffler; forged, foreign, revoked, over-quota and rate-limited credentials;
  replayed nonces, re-wrapped sealed reports, exact retransmissions; and the
  envelope bytes themselves mutated; and runs of them packed several to a message
  (``protocol/wire/envelope_packing.py``), each envelope still counted once.
* Client: ``Client.answer`` on mutated signed specs (the outer message mutated, or
  the inner RoundSpec mutated and re-signed by the real analyzer, or a valid spec
  with hostile field values, including hostile shuffler keys) raises only
  ShuffleDPError, and never charges the ledger when it raises; when it answers,
  the envelope is one of the round, of the round's fixed envelope size, and its
  outer layer opens at the shuffler to the client's own credential and nonce.
  ``settle_receipts`` and ``settle_outcome`` on junk, mutated, foreign-signed and
  genuine messages raise only ShuffleDPError and record exactly what the genuine
  ones (signed by the round's shuffler, for a round the client answered) say,
  never touching the budget spent.
* Analyzer: ``open_payloads``, ``open_batch`` and ``open_batch_bytes`` (signed
  single-chunk batches) on real sealed reports mixed with mutated payloads
  (mutated ciphertexts, copies, sealed mutated plaintexts, payloads of other
  rounds, random bytes) never count ``internal-error``, account for every payload,
  and output exactly the values a reference model predicts: every valid report
  once, plus any sealed mutant that is a valid report of the round (decided by the
  general decoder). Unsigned, foreign-signed and multi-chunk batches are refused, typed.
* Batch delivery: the coordinator's chunk intake (``Coordinator._take_chunk``)
  on a real chunked batch mixed with junk (mutated chunks, chunks of other rounds,
  chunks signed by another shuffler, redeliveries, inconsistent batches signed by
  the round's shuffler) never raises, counts every refused chunk, and assembles
  exactly the real batch once; ``Shuffler.handle_ack`` on the analyzer's real
  acknowledgement mixed with junk acknowledgements marks the batch served exactly
  once and counts everything else by reason, never ``internal-error``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections import Counter

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from hypothesis import given

import cbor_raw as raw
import strategies as S
from fuzz_stats import FUZZ, count_case, timed
from shuffledp.analyzer.coordinator import Coordinator, ShufflerIdentity
from shuffledp.analyzer.service import INTERNAL_ERROR, Analyzer
from shuffledp.protocol.wire.envelope_packing import unpack_envelopes
from shuffledp.client.client import Client, verified_spec
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.client.mechanisms import report_ranges
from shuffledp.protocol.wire import codec
from shuffledp.protocol.transport.channel import InProcessChannel
from shuffledp.protocol.wire.credentials import assigned_instance
from shuffledp.protocol.errors import MessageTooLarge, ShuffleDPError
from shuffledp.protocol.wire.messages import (
    MAX_OUTER_BYTES,
    Admission,
    AdmissionReceipts,
    BatchAck,
    Envelope,
    HadamardRangeParams,
    ProjectedMeanParams,
    Report,
    RoundOutcome,
    RoundSpec,
    ShuffledBatch,
    SignedRoundSpec,
)
from shuffledp.protocol.wire.onion import (
    SIGNED_LABEL,
    EnvelopeOpener,
    envelope_format,
    envelope_info,
    sign_spec_bytes,
    signed,
    wrap,
)
from shuffledp.protocol.mechanisms.randomness import SeededSource
from shuffledp.protocol.wire.report_format import read_batch_chunk, report_format
from shuffledp.protocol.wire.sealing import SUITE, AnalyzerKeys, Sealer, open_sealed
from shuffledp.shuffler.service import INTERNAL_ERROR as SHUFFLER_INTERNAL_ERROR
from shuffledp.shuffler.service import REFUSALS_PER_CREDENTIAL, RoundAdmission, Shuffler, batch_chunks
from shuffledp.shuffler.spool import SqliteSpool, StoredRound

NOW = 1_000_000.0
SESSION = bytes(range(16))
#: Fixed keys keep the suite reproducible (HPKE still draws a fresh ephemeral key per seal).
ANALYZER = Analyzer(S.ANALYZER_KEYS)
OTHER_ANALYZER = Analyzer(
    AnalyzerKeys(
        X25519PrivateKey.from_private_bytes(bytes(range(2, 34))),
        Ed25519PrivateKey.from_private_bytes(bytes(range(34, 66))),
    )
)
KEY = ANALYZER.keys.hpke_public
SHUFFLER_KEYS = S.SHUFFLER_KEYS
OTHER_SHUFFLER_KEYS = S.OTHER_SHUFFLER_KEYS
SHUFFLER = (SHUFFLER_KEYS.hpke_public, SHUFFLER_KEYS.signing_public)
SHUFFLER_PUBLIC = X25519PublicKey.from_public_bytes(SHUFFLER_KEYS.hpke_public)
ISSUER = S.ISSUER


def make_spec(session: bytes, round_id: int, params, epsilon0: float, *, delta0: float = 0.0) -> RoundSpec:
    """A spec naming the test analyzer and the test shuffler."""
    return RoundSpec(
        session_id=session, round_id=round_id, params=params, epsilon0=epsilon0, delta0=delta0, analyzer_key=KEY,
        shuffler_key=SHUFFLER[0], shuffler_signing_key=SHUFFLER[1], min_batch=1, deadline=NOW + 3600,
    )


SPECS = (
    make_spec(SESSION, 3, HadamardRangeParams(-4.0, 4.0, 0.5), 0.5),
    make_spec(SESSION, 70000, ProjectedMeanParams(0.0, 2.0, "laplace", 4096), 1.0),
    make_spec(SESSION, 2**40, ProjectedMeanParams(-1.0, 1.0, "gaussian", 64), 2.0, delta0=1e-6),
    make_spec(bytes(16), 2**63 - 1, HadamardRangeParams(0.0, 1.0, 1 / 64), 3.0),
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
    """``(sealed, plaintext, values)`` of real reports of ``spec``: answers of real enrolled clients to the
    signed spec, their outer layers opened by the shuffler."""
    signed_spec = ANALYZER.sign_spec(spec)
    opener = EnvelopeOpener(SHUFFLER_KEYS.hpke_private, spec)
    out = []
    dim = getattr(spec.params, "dim", None)  # vector rounds: every user holds a vector
    for x, seed in zip(samples, seeds):
        data = np.array([x]) if dim is None else np.full((1, dim), x / max(1, dim))
        client = Client(
            data, ANALYZER.keys.signing_public, PrivacyLedger(1e6, 0.9999),
            credential=ISSUER.issue(seed.to_bytes(16, "big")), clock=lambda: NOW, source=SeededSource(seed),
            accept_central_only=True, shuffler_signing_key=spec.shuffler_signing_key,  # summation rounds too
            shuffler_key=spec.shuffler_key,
        )
        for envelope in client.answer(signed_spec)[:4]:  # every message of a multi-message round is a report
            admission = opener.open(envelope)
            assert admission.credential == client.credential
            plaintext = open_sealed(ANALYZER.keys.hpke_private, admission.sealed, spec.session_id, spec.round_id, spec.digest)
            values = reference_values(plaintext, spec)
            assert values is not None, f"a client's own report is not valid for its round: {plaintext.hex()}"
            out.append((admission.sealed, plaintext, values))
    return tuple(out)


@functools.cache
def pool(index: int) -> tuple[tuple[bytes, bytes, tuple[int, ...]], ...]:
    """Real reports of ``SPECS[index]`` (made once per session)."""
    return client_reports(SPECS[index], [-3.0 + 0.25 * k for k in range(POOL_SIZE)], range(POOL_SIZE))


def encoded(message) -> bytes:
    """``codec.encode``, or an empty map (refused by every decoder) for a hostile message too large to encode."""
    try:
        return codec.encode(message)
    except MessageTooLarge:
        return b"\xa0"


# ---------------------------------------------------------------------------
# shuffler admission
# ---------------------------------------------------------------------------

#: Client-id prefixes: valid clients, decoy clients (enrolled, but all their traffic is
#: the attacker's), and a revoked client. No decoy byte string can equal a valid one's.
VALID_ID, DECOY_ID, REVOKED_ID = b"\xa5" * 8, b"\x3c" * 8, b"\x99" * 8
REVOKED = frozenset({REVOKED_ID + bytes(8)})


def client_id(prefix: bytes, i: int) -> bytes:
    return prefix + i.to_bytes(8, "big")


def sealed_outer(spec: RoundSpec, plaintext: bytes, *, session=None, round_id=None, info=None,
                 key=SHUFFLER_PUBLIC) -> bytes:
    """An envelope whose outer layer is ``plaintext`` really sealed to ``key`` (anyone can do this)."""
    session = spec.session_id if session is None else session
    round_id = spec.round_id if round_id is None else round_id
    outer = SUITE.encrypt(plaintext, key, info=envelope_info(*(info or (session, round_id, spec.digest))))
    return codec.encode(Envelope(session, round_id, outer[:MAX_OUTER_BYTES]))


class Decoys:
    """Hostile envelopes for one round. Every decoy admission carries a decoy (or forged,
    foreign or revoked) credential, a nonce starting ``c3 * 8`` and a sealed report starting
    ``b"D"``: whatever the mutations, none equals a valid envelope's."""

    def __init__(self, r: S.Rng, spec: RoundSpec) -> None:
        self.r = r
        self.spec = spec
        self.fmt = envelope_format(spec.round_id, spec.mechanism)
        self.count = 0
        self.sent: list[tuple[Admission, bytes]] = []  # honestly sealed decoys: (admission, envelope)

    def nonce(self) -> bytes:
        self.count += 1
        return b"\xc3" * 8 + self.count.to_bytes(8, "big")

    def credential(self, r: S.Rng) -> bytes:
        k = r.below(8)
        if k < 4:  # a few enrolled decoy clients: their quota and refusal limits bite
            return ISSUER.issue(client_id(DECOY_ID, r.below(3)))
        if k == 4:
            return ISSUER.issue(REVOKED_ID + bytes(8))
        if k == 5:
            return S.OTHER_ISSUER.issue(client_id(DECOY_ID, 0))
        if k == 6:  # a forged tag for a decoy id
            return client_id(DECOY_ID, 0) + r.bytes(32)
        return r.bytes(48)

    def admission(self, r: S.Rng | None = None, *, round_id=None, size=None) -> Admission:
        r = r or self.r
        round_id = self.spec.round_id if round_id is None else round_id
        size = self.fmt.sealed_size if size is None else size
        return Admission(round_id, self.credential(r), self.nonce(), b"D" + r.bytes(size - 1))

    def flood(self) -> list[bytes]:
        """An enrolled decoy client sending more refusable envelopes than its refusal limit:
        one admitted, then replays of its nonce (refused, then rate-limited and dropped unanswered)."""
        r, spec = self.r, self.spec
        credential = ISSUER.issue(client_id(DECOY_ID, 7))
        first = self.admission()
        out = [wrap(spec, credential, first.sealed, first.nonce)[0]]
        for _ in range(REFUSALS_PER_CREDENTIAL + r.int(1, 3)):
            out.append(wrap(spec, credential, b"D" + r.bytes(self.fmt.sealed_size - 1), first.nonce)[0])
        return out

    def envelope(self) -> bytes:
        r, spec, fmt = self.r, self.spec, self.fmt
        k = r.below(14)
        if k < 3 or (k < 5 and not self.sent):  # an honestly sealed decoy (two in three from one busy client)
            admission = self.admission()
            if k > 0:
                admission = dataclasses.replace(admission, credential=ISSUER.issue(client_id(DECOY_ID, 5)))
            data = wrap(spec, admission.credential, admission.sealed, admission.nonce)[0]
            self.sent.append((admission, data))
            return data
        if k < 5:  # built on an earlier decoy: a replayed nonce, a re-wrapped sealed report, an exact copy
            admission, data = r.pick(self.sent)
            j = r.below(3)
            if j == 0:
                return wrap(spec, admission.credential, b"D" + r.bytes(fmt.sealed_size - 1), admission.nonce)[0]
            if j == 1:
                credential = admission.credential if r.bool() else self.credential(r)
                return wrap(spec, credential, admission.sealed, self.nonce())[0]
            return data
        if k < 9:  # the attacker's plaintext sealed to the shuffler
            j = r.below(6)
            if j == 0:
                plaintext = r.bytes(fmt.admission_size)
            elif j == 1:
                plaintext = raw.encode(S.g_hostile_tree(r))
            else:
                plaintext = S.mutate(r, codec.encode(self.admission()), max_ops=2,
                                     others=lambda rr: codec.encode(self.admission(rr)))
            if r.below(4):  # fitted to the round's admission size, so the outer layer has the right length
                plaintext = plaintext[: fmt.admission_size] + bytes(max(0, fmt.admission_size - len(plaintext)))
            return sealed_outer(spec, plaintext)
        if k == 9:  # an admission of another round, or holding a sealed report of another size
            if r.bool():
                admission = self.admission(round_id=r.pick((spec.round_id ^ 1, S.g_round_id(r))))
            else:
                admission = self.admission(size=r.pick((fmt.sealed_size - 1, fmt.sealed_size + 1, r.int(2, 1024))))
            return sealed_outer(spec, codec.encode(admission))
        if k == 10:  # sealed for another round or session, or to another shuffler
            plaintext = codec.encode(self.admission())
            j = r.below(5)
            if j == 4:  # this session and round, another spec (e.g. one a restarted analyzer signed)
                return sealed_outer(spec, plaintext, info=(spec.session_id, spec.round_id, r.bytes(32)))
            if j == 0:
                return sealed_outer(spec, plaintext, key=X25519PublicKey.from_public_bytes(OTHER_SHUFFLER_KEYS.hpke_public))
            if j == 1:
                return sealed_outer(spec, plaintext, info=(spec.session_id, spec.round_id ^ 1, spec.digest))
            if j == 2:
                return sealed_outer(spec, plaintext, info=(S.g_session(r), spec.round_id, spec.digest))
            return sealed_outer(spec, plaintext, session=S.g_session(r))  # the header names another session
        # the envelope bytes of a decoy mutated: header, outer ciphertext or structure
        admission = self.admission()
        data = wrap(spec, admission.credential, admission.sealed, admission.nonce)[0]
        return S.mutate(r, data, max_ops=2,
                        others=lambda rr: codec.encode(S.g_envelope(rr, session=spec.session_id, round_id=spec.round_id)))


def _bursts(r: S.Rng, items: list) -> list[list]:
    """``items`` cut into 1..3 consecutive bursts (as the shuffler drains its subscription)."""
    cuts = sorted(r.int(0, len(items)) for _ in range(r.int(0, 2)))
    bounds = [0, *cuts, len(items)]
    return [items[a:b] for a, b in zip(bounds, bounds[1:])]


def _packed(r: S.Rng, items: list[bytes], size: int) -> list[bytes]:
    """``items`` with runs of consecutive whole envelopes (``size`` bytes each) packed into one message
    (``protocol/wire/envelope_packing.py``), as a gateway may send them."""
    out: list[bytes] = []
    run: list[bytes] = []
    for item in items:
        if len(item) == size and len(run) < r.int(1, 6):
            run.append(item)
            continue
        if run:
            out.append(b"".join(run))
        run = [item] if len(item) == size else []
        if len(item) != size:
            out.append(item)
    if run:
        out.append(b"".join(run))
    return out


@FUZZ
@given(seed=S.seeds)
def test_admission_survives_hostile_envelopes_and_admits_every_valid_one(seed):
    count_case("admission")
    r = S.Rng(seed)
    spec = S.g_round_spec(r, min_max_batch=64, shuffler=SHUFFLER)
    fmt = envelope_format(spec.round_id, spec.mechanism)
    instance = r.below(spec.shuffler_instances)  # this shuffler's instance; clients are assigned by credential
    ids = (client_id(VALID_ID, j) for j in range(10**6))
    valid = []  # (nonce, sealed, envelope): one credential each (of this instance), so no quota refuses them
    for i in range(r.int(0, 4)):
        cid = next(c for c in ids if assigned_instance(c, spec.shuffler_instances, spec.digest) == instance)
        nonce, sealed = b"\x5a" * 8 + i.to_bytes(8, "big"), b"V" + bytes([i]) + r.bytes(fmt.sealed_size - 2)
        valid.append((nonce, sealed, wrap(spec, ISSUER.issue(cid), sealed, nonce)[0]))
    decoys = Decoys(r, spec)
    hostile = [decoys.envelope() for _ in range(r.int(0, 7))]
    if r.one_in(10):
        hostile += decoys.flood()
    copies = [r.pick(valid)[2] for _ in range(r.int(0, 2))] if valid else []  # a valid client retrying
    traffic = [(True, e) for _, _, e in valid] + [(False, e) for e in hostile + copies]
    r.r.shuffle(traffic)

    spool = SqliteSpool(":memory:") if r.one_in(8) else None
    admission = RoundAdmission(spec, SHUFFLER_KEYS, ISSUER, spool, revoked=REVOKED, instance=instance)
    admitted_nonces, refused = set(), []
    messages = _packed(r, [data for _, data in traffic], fmt.size) if r.one_in(3) else [data for _, data in traffic]
    for burst in _bursts(r, messages):
        receipts = admission.offer_many(burst)  # never raises
        admitted_nonces.update(receipts.admitted)
        refused += zip(receipts.refused, receipts.reasons)
        # the receipts always make a publishable, signable message
        message = AdmissionReceipts(spec.session_id, spec.round_id, spec.digest, tuple(receipts.admitted),
                                    tuple(receipts.refused), tuple(receipts.reasons))
        assert codec.decode(codec.encode(message), AdmissionReceipts) == message
    # admit() raises typed errors only (on a round that fills up at once: later envelopes are round-full)
    floor = getattr(spec.params, "min_reports", 1)  # summation rounds cannot be smaller than their users' shares
    small = dataclasses.replace(spec, min_batch=floor, max_batch=floor + r.int(0, 2))
    probe = RoundAdmission(small, SHUFFLER_KEYS, ISSUER, revoked=REVOKED, instance=instance)
    for i, data in enumerate(d for is_valid, d in traffic if not is_valid):
        if i == 0:  # the opener alone is pure, so its time can go on the record (timed() may call it again)
            try:
                timed("EnvelopeOpener.open", probe.opener.open, data)
            except ShuffleDPError:
                pass
        try:
            probe.admit(data)
        except ShuffleDPError:
            pass
    assert len(probe.payloads) <= small.max_batch

    stats = admission.stats

    def context():
        return f"rejections {dict(stats.rejected)}; traffic {[d.hex() for _, d in traffic]}"

    assert INTERNAL_ERROR not in stats.rejected and SHUFFLER_INTERNAL_ERROR not in stats.rejected, context()
    # every envelope counted once: a message of k whole envelopes (2 <= k <= 64) is k of them
    envelopes = sum(len(unpack_envelopes([m], fmt.size)) for m in messages)
    assert envelopes == sum(len(unpack_envelopes([d], fmt.size)) for _, d in traffic), context()
    assert stats.admitted + stats.retransmitted + sum(stats.rejected.values()) == envelopes, context()
    assert stats.admitted == len(admission.payloads)
    if spool is not None:
        assert len(spool.admitted(spec.session_id, spec.round_id)) == stats.admitted
    admitted = Counter(admission.payloads)
    refused_nonces = {nonce for nonce, _ in refused}
    for nonce, sealed, data in valid:
        assert admitted[sealed] == 1, f"valid envelope not admitted exactly once: {data.hex()}; " + context()
        assert nonce in admitted_nonces and nonce not in refused_nonces, context()


# ---------------------------------------------------------------------------
# client: answering
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
            return codec.encode(SignedRoundSpec(spec_bytes, sign_spec_bytes(ANALYZER.keys.signing_private, spec_bytes)))
        except MessageTooLarge:
            return ANALYZER.sign_spec(spec)
    if r.one_in(8):  # signed by another analyzer
        return OTHER_ANALYZER.sign_spec(spec)
    return ANALYZER.sign_spec(spec)  # valid, with hostile (but in-domain) values and shuffler keys


@FUZZ
@given(seed=S.seeds)
def test_client_answer_raises_only_typed_errors_and_charges_only_on_success(seed):
    count_case("client")
    r = S.Rng(seed)
    signed_spec = _signed_for_client(r)
    ledger = PrivacyLedger(r.pick((0.1, 1.0, 31.0, 1e6)), r.pick((0.0, 1e-6, 0.5)))
    if r.one_in(4):  # a round already answered
        try:
            spec = verified_spec(signed_spec, ANALYZER.keys.signing_public)
            ledger.spend(spec.session_id, spec.round_id, 0.0, 0.0)
        except ShuffleDPError:
            pass
    credential = ISSUER.issue(r.bytes(16))
    if r.one_in(16):  # a credential of the wrong shape: refused when the client is made
        bad = r.pick((b"", credential[:-1], credential + b"\x00", credential.hex()[:48], None))
        with pytest.raises(ShuffleDPError):
            Client(np.array([1.0]), ANALYZER.keys.signing_public, ledger, credential=bad)
    client = Client(
        np.array([r.r.uniform(-100.0, 100.0) if r.below(4) else S.g_low(r)]), ANALYZER.keys.signing_public, ledger,
        credential=credential, clock=lambda: NOW, source=SeededSource(r.below(2**32)),
    )
    before = (ledger.spent_epsilon, ledger.spent_delta, frozenset(ledger.answered))
    try:
        out = client.answer(signed_spec)
    except ShuffleDPError:
        after = (ledger.spent_epsilon, ledger.spent_delta, frozenset(ledger.answered))
        assert after == before, f"a refused round charged the ledger: {signed_spec.hex()}"
        return
    spec = verified_spec(signed_spec, ANALYZER.keys.signing_public)
    assert len(out) == spec.messages_per_user  # every message of the round, each its own envelope
    fmt = envelope_format(spec.round_id, spec.mechanism)
    for data in out:
        envelope = codec.decode(data, Envelope)
        assert (envelope.session_id, envelope.round_id) == (spec.session_id, spec.round_id)
        assert len(data) == fmt.size and len(envelope.outer) == fmt.outer_size  # one length per round
    assert ledger.spent_epsilon == before[0] + spec.epsilon0
    assert ledger.spent_delta == before[1] + spec.delta0
    assert ledger.answered == before[2] | {(spec.session_id, spec.round_id)}
    sent = client.sent[(spec.session_id, spec.round_id)]
    assert len(set(sent.nonces)) == len(out) and sent.receipts == {} and sent.outcome is None
    if spec.shuffler_key == SHUFFLER[0]:  # the shuffler opens it to this client's credential and nonce
        admission = EnvelopeOpener(SHUFFLER_KEYS.hpke_private, spec).open(out[0])
        assert admission.credential == credential and ISSUER.verify(admission.credential) == credential[:16]
        assert admission.nonce == sent.nonces[0]
        assert len(admission.sealed) == fmt.sealed_size
        if spec.analyzer_key == KEY:
            plaintext = open_sealed(ANALYZER.keys.hpke_private, admission.sealed, spec.session_id, spec.round_id, spec.digest)
            assert reference_values(plaintext, spec) is not None, plaintext.hex()


# ---------------------------------------------------------------------------
# client: receipts and outcomes
# ---------------------------------------------------------------------------

SEALERS = {index: Sealer(spec.analyzer_key) for index, spec in enumerate(SPECS)}


def _settle_message(r: S.Rng, spec: RoundSpec, nonce: bytes, genuine: list) -> bytes:
    """One message for a client that sent ``nonce`` in ``spec``'s round; genuine ones are appended to ``genuine``."""
    k = r.below(10)
    if k == 9:  # junk: another message type, a hostile document, random bytes
        j = r.below(3)
        return S.g_valid_message(r) if j == 0 else raw.encode(S.g_hostile_tree(r)) if j == 1 else r.bytes(r.int(0, 64))
    receipts = r.bool()
    session, round_id = spec.session_id, spec.round_id
    digest = spec.digest
    if k == 8:  # a round this client did not answer, or another spec of its round
        j = r.below(3)
        if j == 0:
            session = S.g_session(r)
        elif j == 1:
            round_id = r.pick((round_id ^ 1, S.g_round_id(r)))
        else:
            digest = S.g_spec_digest(r)
    key = SHUFFLER_KEYS.signing_private
    if k == 7:  # signed by someone else: another shuffler, the analyzer
        key = r.pick((OTHER_SHUFFLER_KEYS.signing_private, ANALYZER.keys.signing_private))
    if receipts:
        message = S.g_receipts(r, session, round_id, nonces=(nonce,) if r.below(4) else (), spec_digest=digest)
    else:
        message = S.g_outcome(r, session, round_id, instances=spec.shuffler_instances if r.below(4) else None,
                              spec_digest=digest)
    if k == 6:  # a random (or zero) signature
        message = dataclasses.replace(message, signature=r.pick((bytes(64), r.bytes(64))))
    else:
        message = signed(key, message)
    if k not in (6, 7) and (session, round_id, digest) == (spec.session_id, spec.round_id, spec.digest):  # (k == 8 may redraw them)
        genuine.append(message)
    data = encoded(message)
    if r.one_in(4):  # mutated: genuine only if it still decodes to a genuine message (checked by the caller)
        data = S.mutate(r, data, max_ops=2, others=lambda rr: encoded(S.g_receipts(rr, session, round_id, spec_digest=digest)))
    return data


def _decoded(data: bytes, cls):
    try:
        return codec.decode(data, cls)
    except ShuffleDPError:
        return None


@FUZZ
@given(seed=S.seeds)
def test_client_settles_only_genuine_receipts_and_outcomes(seed):
    count_case("client_settle")
    r = S.Rng(seed)
    index = r.below(len(SPECS))
    spec = SPECS[index]
    if r.bool():  # a round spread over several shuffler instances: outcomes of the others say nothing of ours
        spec = dataclasses.replace(spec, shuffler_instances=r.pick((2, 3, 64)))
    ledger = PrivacyLedger(1e6, 0.9999)
    client = Client(np.array([0.5]), ANALYZER.keys.signing_public, ledger, credential=ISSUER.issue(r.bytes(16)),
                    clock=lambda: NOW, source=SeededSource(r.below(2**32)))
    client.answer_verified(spec, SEALERS[index])
    key = (spec.session_id, spec.round_id)
    sent = client.sent[key]
    nonce = sent.nonces[0]
    mine = assigned_instance(client.credential[:16], spec.shuffler_instances, spec.digest)
    spent = (ledger.spent_epsilon, ledger.spent_delta, frozenset(ledger.answered))
    expected_receipts: dict[bytes, str] = {}
    expected_outcome = None
    genuine: list = []
    for _ in range(r.int(1, 3)):
        data = _settle_message(r, spec, nonce, genuine)
        for settle, cls in ((client.settle_receipts, AdmissionReceipts), (client.settle_outcome, RoundOutcome)):
            message = _decoded(data, cls)
            is_genuine = message is not None and message in genuine
            try:
                result = settle(data)  # stateful: not timed (timed() may call a slow decoder again)
            except ShuffleDPError:
                assert not is_genuine, f"{settle.__name__} refused a genuine message: {data.hex()}"
            else:
                assert is_genuine, f"{settle.__name__} accepted a message that is not genuine: {data.hex()}"
                assert result is sent
                if cls is AdmissionReceipts:
                    if nonce in message.admitted:
                        expected_receipts[nonce] = "admitted"
                    for refused, reason in zip(message.refused, message.reasons):
                        if refused == nonce and expected_receipts.get(nonce) != "admitted":
                            expected_receipts[nonce] = reason
                elif message.instance == mine:  # another instance's outcome is genuine, but not about this report
                    word = "released" if message.outcome == "released" else f"failed:{message.reason}"
                    # only forward: released may turn failed, a failed outcome is final
                    if expected_outcome is None or (expected_outcome == "released" and word != "released"):
                        expected_outcome = word
            assert sent.receipts == expected_receipts, data.hex()
            assert sent.outcome == expected_outcome, data.hex()
            assert ledger.outcomes == ({} if expected_outcome is None else {key: expected_outcome}), data.hex()
            assert (ledger.spent_epsilon, ledger.spent_delta, frozenset(ledger.answered)) == spent  # never refunded


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
        sealed = Sealer(spec.analyzer_key).seal(plaintext, spec.session_id, spec.round_id, spec.digest)
        known[sealed] = plaintext
        return sealed
    if kind == 4:  # a valid report sealed for another round, session or spec: does not open here
        if r.below(3) == 0:  # this session and round, another spec (e.g. one a restarted analyzer signed)
            return Sealer(spec.analyzer_key).seal(r.pick(reports)[1], spec.session_id, spec.round_id, r.bytes(32))
        round_id = spec.round_id ^ 1 if r.bool() else spec.round_id
        session = spec.session_id
        if round_id == spec.round_id:  # then another session (every byte changed)
            session = bytes(b ^ (1 + r.below(255)) for b in spec.session_id)
        return Sealer(spec.analyzer_key).seal(r.pick(reports)[1], session, round_id, spec.digest)
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


def whole_batch(spec: RoundSpec, payloads, key=SHUFFLER_KEYS.signing_private, **fields) -> ShuffledBatch:
    """A single-chunk batch of ``payloads`` signed by ``key`` (``fields`` override chunk fields before signing)."""
    batch = ShuffledBatch(spec.session_id, spec.round_id, spec.digest, bytes(range(16)), 0, 1, len(payloads), tuple(payloads))
    return signed(key, dataclasses.replace(batch, **fields))


@FUZZ
@given(seed=S.seeds)
def test_analyzer_opens_every_valid_report_among_mutants(seed):
    count_case("analyzer")
    r = S.Rng(seed)
    if r.one_in(4):  # a drawn round (any mechanism, parameters, round id) with a few fresh client reports
        index = "drawn"
        spec = S.g_round_spec(r, analyzer_key=KEY, deadline=NOW + 3600, shuffler=SHUFFLER)
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
    if not payloads:  # a batch holds at least one report: there is no empty batch to send
        with pytest.raises(ShuffleDPError):
            ShuffledBatch(spec.session_id, spec.round_id, spec.digest, bytes(16), 0, 1, 1, ())
        return
    batch = whole_batch(spec, payloads)
    _check_opened(ANALYZER.open_batch(batch, spec), payloads, expected, valid_values, context)
    data = codec.encode(batch)
    sealed_size = report_format(spec.round_id, spec.mechanism).sealed_size
    if all(len(p) == sealed_size for p in payloads) and not over:
        opened = ANALYZER.open_batch_bytes(data, spec)
        _check_opened(opened, payloads, expected, valid_values, context)
    else:  # the fast batch reader refuses a batch too long or with a payload of another size, typed
        with pytest.raises(ShuffleDPError):
            ANALYZER.open_batch_bytes(data, spec)
    # a batch not signed by the round's shuffler, or not whole, is refused (typed) before anything is opened
    k = r.below(4)
    if k == 0:
        forged = whole_batch(spec, payloads, key=OTHER_SHUFFLER_KEYS.signing_private)
    elif k == 1:
        forged = dataclasses.replace(batch, signature=r.pick((bytes(64), r.bytes(64))))
    elif k == 2:
        forged = whole_batch(spec, payloads, chunks=2, total=len(payloads) + 1)
    else:
        forged = dataclasses.replace(batch, batch_id=r.bytes(16))  # signed for another batch id
    with pytest.raises(ShuffleDPError):
        ANALYZER.open_batch(forged, spec)
    with pytest.raises(ShuffleDPError):
        ANALYZER.open_batch_bytes(codec.encode(forged), spec)
    # and the batch bytes themselves mutated: a typed refusal, or an opening with nothing untyped
    mutant = S.mutate(r, data, max_ops=2, others=lambda rr: codec.encode(whole_batch(spec, (rr.pick(reports)[0],))))
    try:
        opened = ANALYZER.open_batch_bytes(mutant, spec)
    except ShuffleDPError:
        return
    assert INTERNAL_ERROR not in opened.rejected, mutant.hex()
    assert mutant == data, f"a changed batch passed the signature check: {mutant.hex()}"


# ---------------------------------------------------------------------------
# batch delivery: the coordinator's chunk intake, and the shuffler's acknowledgements
# ---------------------------------------------------------------------------


@functools.cache
def real_batches(index: int) -> tuple:
    """A few real chunked batches of ``SPECS[index]``: ``(batch_id, chunks, values)``, signed by the shuffler."""
    reports = pool(index)
    out = []
    for k in range(8):
        r = S.Rng(1000 * index + k)
        chosen = r.r.sample(range(len(reports)), r.int(1, 6))
        payloads = [reports[j][0] for j in chosen]
        chunk_size = r.int(1, len(payloads))
        batch_id = bytes([index, k]) * 8
        chunks = batch_chunks(SPECS[index], SHUFFLER_KEYS, batch_id, payloads, chunk_size)
        out.append((batch_id, tuple(chunks), sorted(reports[j][2] for j in chosen)))
    return tuple(out)


@functools.cache
def foreign_signed(chunk: bytes) -> bytes:
    """A real chunk's content signed by another shuffler (cached: signing is the costly part)."""
    return codec.encode(signed(OTHER_SHUFFLER_KEYS.signing_private, codec.decode(chunk, ShuffledBatch)))


@functools.cache
def acknowledgement(index: int, batch_id: bytes) -> bytes:
    """The analyzer's acknowledgement of a batch of ``SPECS[index]`` (deterministic: Ed25519)."""
    return ANALYZER.acknowledge(SPECS[index], batch_id)


def _junk_chunk(r: S.Rng, spec: RoundSpec, index: int, chunks) -> bytes:
    """One chunk that is not part of the real batch; none is a valid chunk of this round signed by its shuffler."""
    k = r.below(6)
    if k == 0:  # a real chunk mutated (its signature no longer covers it)
        return S.mutate(r, r.pick(chunks), max_ops=2, others=lambda rr: rr.pick(chunks))
    if k == 1:  # a real chunk of another round or session (signed by the same shuffler)
        other = r.pick([i for i in range(len(SPECS)) if i != index])
        return r.pick(r.pick(real_batches(other))[1])
    if k == 2:  # a real chunk's content signed by another shuffler
        return foreign_signed(r.pick(chunks))
    if k == 3:  # a chunk of this round with a random signature, or payloads of another size
        batch = S.g_batch(r, spec.session_id, spec.round_id, max_count=3, spec_digest=spec.digest if r.bool() else None)
        return encoded(dataclasses.replace(batch, signature=r.bytes(64)))
    if k == 4:
        return S.g_valid_message(r) if r.bool() else raw.encode(S.g_hostile_tree(r))
    return r.bytes(r.int(0, 200))


def _rogue_batch(r: S.Rng, spec: RoundSpec) -> list[bytes]:
    """Chunks really signed by the round's shuffler that do not make a usable batch: payloads
    that do not open, a total that the chunks never reach, chunks that disagree on the shape."""
    sealed_size = report_format(spec.round_id, spec.mechanism).sealed_size
    batch_id = b"\xee" + r.bytes(15)
    total = r.int(1, 4)
    chunks = r.int(1, total)
    out = []
    for chunk in range(chunks):
        count = r.int(1, total)
        shape = (chunks, total) if r.below(4) else (chunks, total + 1)
        batch = ShuffledBatch(spec.session_id, spec.round_id, spec.digest, batch_id, chunk, shape[0], shape[1],
                              tuple(r.bytes(sealed_size) for _ in range(min(count, shape[1]))))
        out.append(codec.encode(signed(SHUFFLER_KEYS.signing_private, batch)))
    return out


class AckSpool:
    """The part of the spool ``handle_ack`` uses: one stored round (its signed spec) and its
    released batches, acknowledged at most once."""

    def __init__(self, batch_ids, stored: StoredRound) -> None:
        self.released = {batch_id: False for batch_id in batch_ids}
        self.stored = stored

    def round(self, session_id: bytes, round_id: int) -> StoredRound | None:
        return self.stored if (session_id, round_id) == (self.stored.session_id, self.stored.round_id) else None

    def acknowledge(self, batch_id: bytes) -> tuple[bytes, int] | None:
        """The batch's (session, round) on its first acknowledgement, else None (as SqliteSpool)."""
        if self.released.get(batch_id) is not False:
            return None
        self.released[batch_id] = True
        return self.stored.session_id, self.stored.round_id


@functools.cache
def foreign_ack(ack: BatchAck, signer: int) -> bytes:
    """``ack`` signed by another analyzer (0) or by the shuffler (1); cached, signing is the costly part."""
    key = (OTHER_ANALYZER.keys.signing_private, SHUFFLER_KEYS.signing_private)[signer]
    return codec.encode(signed(key, ack))


@functools.cache
def cross_type_ack(ack: BatchAck, tag: str) -> bytes:
    """``ack`` with the analyzer's signature over its zeroed digest under another type's label."""
    digest = hashlib.sha256(codec.encode(ack)).digest()
    signature = ANALYZER.keys.signing_private.sign(SIGNED_LABEL + tag.encode() + digest)
    return codec.encode(dataclasses.replace(ack, signature=signature))


def _junk_ack(r: S.Rng, spec: RoundSpec, batch_id: bytes, real_ack: bytes) -> tuple[bytes, str | None]:
    """A junk acknowledgement, and the reason the shuffler must count it under (None: any typed reason)."""
    k = r.below(8)
    ack = BatchAck(spec.session_id, spec.round_id, spec.digest, batch_id, bytes(64))
    analyzer = ANALYZER.keys.signing_private
    if k == 0:
        return S.mutate(r, real_ack, max_ops=2, others=lambda rr: encoded(S.g_batch_ack(rr))), None
    if k == 1:  # signed by someone other than the analyzer
        return foreign_ack(ack, r.below(2)), "bad-signature"
    if k == 2:
        return codec.encode(dataclasses.replace(ack, signature=r.pick((bytes(64), r.bytes(64))))), "bad-signature"
    if k == 3:  # the analyzer's real signature, for another session
        return codec.encode(signed(analyzer, dataclasses.replace(ack, session_id=S.g_session(r)))), "unknown-round"
    if k == 4:  # the analyzer's real signature, of a batch the shuffler never released
        return codec.encode(signed(analyzer, dataclasses.replace(ack, batch_id=r.bytes(16)))), "unknown-batch"
    if k == 5:  # the analyzer's signature over this very acknowledgement, made for another message type
        return cross_type_ack(ack, r.pick([t for t in codec.MESSAGE_TYPES if t != "batch-ack"])), "bad-signature"
    if k == 6:  # the analyzer's real signature, of this batch, under another spec of the round
        return codec.encode(signed(analyzer, dataclasses.replace(ack, spec_digest=S.g_spec_digest(r)))), "unknown-round"
    return (S.g_valid_message(r) if r.bool() else r.bytes(r.int(0, 100))), None


@FUZZ
@given(seed=S.seeds)
def test_batch_delivery_survives_junk_chunks_and_acks(seed):
    count_case("batch_delivery")
    r = S.Rng(seed)
    index = r.below(len(SPECS))
    spec = SPECS[index]
    batch_id, chunks, values = r.pick(real_batches(index))
    sealed_size = report_format(spec.round_id, spec.mechanism).sealed_size
    traffic = [("real", c) for c in chunks]
    traffic += [("real", r.pick(chunks)) for _ in range(r.int(0, 2))]  # redeliveries
    traffic += [("junk", _junk_chunk(r, spec, index, chunks)) for _ in range(r.int(0, 5))]
    if r.one_in(4):
        traffic += [("rogue", c) for c in _rogue_batch(r, spec)]
    r.r.shuffle(traffic)

    coordinator = Coordinator(InProcessChannel(), ANALYZER, ShufflerIdentity(*SHUFFLER), session_id=spec.session_id)
    rejected = coordinator.rejected_batches
    assemblies: dict = {}
    completed: dict = {}
    seen = set()

    def context():
        return f"rejected {dict(rejected)}; traffic {[(kind, d.hex()) for kind, d in traffic]}"

    for kind, data in traffic:  # as the coordinator's collection loop feeds it
        before = sum(rejected.values())
        batch = coordinator._take_chunk(spec, assemblies, completed, data)  # never raises
        counted = sum(rejected.values()) - before
        if batch is not None:
            assert batch.batch_id not in completed, context()
            completed[batch.batch_id] = batch
        if data in chunks:  # a real chunk (or junk that came out byte for byte equal to one)
            assert counted == (data in seen), context()  # a redelivery is counted, and skipped
            seen.add(data)
        elif kind == "rogue":  # the round's shuffler's own signed mess: counted when refused or complete
            assert counted <= 1 and batch is None, context()
        else:
            assert counted == 1 and batch is None, context()
            try:  # the chunk reader alone is pure: its time goes on the record
                timed("read_batch_chunk", read_batch_chunk, data, spec.session_id, spec.round_id, spec.digest, sealed_size,
                      spec.max_batch)
            except ShuffleDPError:
                pass

    assert list(completed) == [batch_id], "the real batch, and only it, is assembled; " + context()
    record = completed[batch_id]
    assert record.chunks == len(chunks) and record.bytes == sum(map(len, chunks)), context()
    assert sorted(tuple(int(v) for v in row) for row in record.opened.values) == values, context()
    assert not record.opened.rejected, context()
    assert INTERNAL_ERROR not in rejected, context()

    # the analyzer acknowledges; the shuffler marks the batch served once, and counts junk by reason
    real_ack = acknowledgement(index, batch_id)
    spool = AckSpool([batch_id, b"\xdd" * 16], StoredRound(spec.session_id, spec.round_id, ANALYZER.sign_spec(spec), "released"))
    shuffler = Shuffler(InProcessChannel(), spec.session_id, ANALYZER.keys.signing_public, SHUFFLER_KEYS, ISSUER,
                        spool=spool)
    acks = [(real_ack, None) for _ in range(r.int(1, 2))] + [_junk_ack(r, spec, batch_id, real_ack)
                                                              for _ in range(r.int(0, 5))]
    r.r.shuffle(acks)
    served = 0
    for data, reason in acks:
        before = Counter(shuffler.rejected_acks)
        accepted = shuffler.handle_ack(data)  # stateful: not timed (timed() may call a slow decoder again)
        grew = Counter(shuffler.rejected_acks)
        grew.subtract(before)
        grew = +grew
        if data == real_ack:  # (junk may come out byte for byte equal to it)
            assert accepted == (served == 0), data.hex()
            served += accepted
            reason = None if accepted else "unknown-batch"  # acknowledged again: counted, not served twice
        else:
            assert not accepted, f"junk acknowledgement accepted: {data.hex()}"
        assert sum(grew.values()) == (0 if accepted else 1), (data.hex(), dict(grew))
        if reason is not None:
            assert grew[reason] == 1, (reason, dict(grew), data.hex())
    assert served == 1 and shuffler.acknowledged == 1
    assert INTERNAL_ERROR not in shuffler.rejected_acks and SHUFFLER_INTERNAL_ERROR not in shuffler.rejected_acks
    assert spool.released == {batch_id: True, b"\xdd" * 16: False}
