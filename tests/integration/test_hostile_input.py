"""Tests for every class of hostile input, on the onion envelopes and signed batch chunks
of wire version 2. Each fails on a decoder without the strict rules (wire version 1, cbor2
decoding, unpadded reports):

* a nested shared-reference map key of 412 bytes that makes a permissive decoder take
  time exponential in its depth (200 bytes: 1.2 s; 412 bytes: never ends), also inside
  a validly sealed outer layer, where any client can put any plaintext;
* a 5,000-digit integer in each integer field (an untyped ``ValueError`` from
  formatting the error message), in every message type;
* a flood of NaN fields;
* a re-wrapped sealed report (another enrolled client's credential, a fresh nonce)
  admitted twice; an envelope replayed by the broker counted twice;
* a report value at the integer limit accepted, moving the mean arbitrarily far;
* ``epsilon0 = 1e-16`` accepted, and a seeded source that emitted noiseless reports
  for a huge noise scale;
* value-dependent sizes of sealed reports, outer layers and envelopes; a credential,
  nonce or sealed report visible to the broker;
* NaN device data projected silently; the ledger charged for a round that then failed;
* the ledger raced by threads;
* junk, foreign-signed, short or padded batches on the batch topic, forged outcomes,
  receipts and acknowledgements; non-bytes at every entry point.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time
from collections import Counter

import cbor2
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from shuffledp.analyzer.coordinator import NO_LIVENESS_MARGIN, check_servable
from shuffledp.client.client import Client
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.client.local_data import as_real_array
from shuffledp.client.mean_randomizer import decode_values, noise_tail_bound, randomize_mean, report_range
from shuffledp.client.mechanisms import report_ranges
from shuffledp.simulation.client_pool import ClientPool
from shuffledp.client.range_randomizer import bin_index, randomize_range
from shuffledp.protocol.wire import codec
from shuffledp.protocol.wire import messages as m
from shuffledp.protocol.wire.cbor_strict import StrictReader, loads
from shuffledp.protocol.transport.channel import InProcessChannel, announce_topic, batch_topic, outcome_topic
from shuffledp.protocol.errors import (
    BadSignature,
    BudgetExceeded,
    DuplicateReport,
    InvalidParameter,
    MalformedMessage,
    SealingError,
    ShuffleDPError,
    UnknownRound,
)
from shuffledp.protocol.wire.onion import (
    EnvelopeOpener,
    ShufflerKeys,
    decode_verified,
    envelope_format,
    envelope_info,
    signed,
)
from shuffledp.protocol.mechanisms.randomness import MAX_NOISE_SCALE, SeededSource, SystemSource
from shuffledp.protocol.wire.report_format import HPKE_OVERHEAD, WrongSize, read_batch_chunk, report_format
from shuffledp.protocol.wire.sealing import SUITE, Sealer
from shuffledp.shuffler.service import INTERNAL_ERROR, RoundAdmission, batch_chunks
from shuffledp.shuffler.spool import SqliteSpool

from parties import DEPLOYMENT, ISSUER, OTHER_SESSION, SESSION, SHUFFLER_KEYS, credential, envelope, make_spec, nonce, quota_params

ANALYZER = DEPLOYMENT.analyzer()
#: A well-formed shuffler identity the session does not trust.
IMPOSTOR = ShufflerKeys.generate()
RANGE = m.HadamardRangeParams(-4.0, 4.0, 0.5)
LAPLACE = m.ProjectedMeanParams(-1.0, 2.0, "laplace", 4096)
GAUSSIAN = m.ProjectedMeanParams(-1.0, 2.0, "gaussian", 4096)


def spec(params=RANGE, round_id=3, epsilon0=0.5, delta0=0.0, **kw) -> m.RoundSpec:
    """A spec of the shared deployment's session (its analyzer and shuffler keys); min_batch 1 unless given."""
    if getattr(params, "noise", "laplace") == "gaussian" and delta0 == 0.0:
        delta0 = 1e-6
    return make_spec(params, round_id=round_id, epsilon0=epsilon0, delta0=delta0, min_batch=kw.pop("min_batch", 1), **kw)


def client(value=0.5, ledger=None, source=None) -> Client:
    """An enrolled client (a fresh credential from the shared deployment's issuer)."""
    ledger = ledger or PrivacyLedger(100.0, delta_budget=0.5)
    return DEPLOYMENT.client(np.array([value]), ledger, source=source)


def opener(s: m.RoundSpec) -> EnvelopeOpener:
    return EnvelopeOpener(SHUFFLER_KEYS.hpke_private, s)


def sealed_of(s: m.RoundSpec, data: bytes) -> bytes:
    """The inner sealed report of an encoded envelope (opening its outer layer as the shuffler does)."""
    return opener(s).open(data).sealed


def admission(s: m.RoundSpec, **options) -> RoundAdmission:
    return RoundAdmission(s, SHUFFLER_KEYS, ISSUER, **options)


def signed_batch(s: m.RoundSpec, payloads, keys: ShufflerKeys = SHUFFLER_KEYS, batch_id: bytes | None = None) -> bytes:
    """One encoded single-chunk batch of ``s``'s round holding ``payloads``, signed with ``keys``."""
    chunks = batch_chunks(s, keys, batch_id or os.urandom(16), list(payloads), len(payloads))
    assert len(chunks) == 1
    return chunks[0]


def raw_batch(s: m.RoundSpec, payloads, **fields) -> bytes:
    """A shuffled-batch encoding built without the constructor's checks (empty, unsigned, ...)."""
    body = {
        "t": "shuffled-batch",
        "v": m.WIRE_VERSION,
        "session_id": s.session_id,
        "round_id": s.round_id,
        "spec_digest": s.digest,
        "batch_id": bytes(16),
        "chunk": 0,
        "chunks": 1,
        "total": len(payloads),
        "payloads": list(payloads),
        "signature": bytes(64),
    }
    body.update(fields)
    return cbor2.dumps(body, canonical=True)


def outer_sealed(s: m.RoundSpec, plaintext: bytes) -> bytes:
    """An envelope of ``s``'s round whose outer layer is ``plaintext`` sealed to the round's shuffler:
    what any client (the shuffler key is public) can send in place of an Admission."""
    outer = SUITE.encrypt(
        plaintext, X25519PublicKey.from_public_bytes(s.shuffler_key), info=envelope_info(s.session_id, s.round_id, s.digest)
    )
    return codec.encode(m.Envelope(s.session_id, s.round_id, outer))


def fit(plaintext: bytes, s: m.RoundSpec) -> bytes:
    """``plaintext``, checked to be exactly the round's admission size (so it gets past the size check)."""
    size = envelope_format(s.round_id, s.mechanism).admission_size
    assert len(plaintext) == size, (len(plaintext), size)
    return plaintext


# --------------------------------------------------------------------------
# decoding is total and bounded
# --------------------------------------------------------------------------


def _shared_reference_key(depth: int) -> bytes:
    """A map key: an array of `depth + 1` shared values, each an array holding the previous twice.

    Expanded (as cbor2 does, then ``str()`` in the unknown-key error) it has 2**depth leaves.
    """
    count = depth + 1
    header = bytes([0x80 | count]) if count < 24 else bytes([0x98, count])  # shortest form: the tag is the first fault
    out = header + bytes.fromhex("d81c") + bytes([0x81, 0x00])
    for i in range(1, depth + 1):
        ref = bytes.fromhex("d81d") + bytes([0x18, i - 1])
        out += bytes.fromhex("d81c") + bytes([0x82]) + ref + ref
    return out


def _head(tag: str) -> bytes:
    return b"\xa3" + cbor2.dumps("t") + cbor2.dumps(tag) + cbor2.dumps("v") + cbor2.dumps(m.WIRE_VERSION)


@pytest.mark.parametrize("tag", sorted(codec.MESSAGE_TYPES))
def test_nested_shared_reference_map_key_is_refused_at_its_first_tag(tag):
    data = _head(tag) + _shared_reference_key(40) + b"\x00"
    assert len(data) < 500
    with pytest.raises(MalformedMessage, match="tags"):
        codec.decode(data)
    cls, limit = codec.MESSAGE_TYPES[tag]
    with pytest.raises(MalformedMessage, match="tags" if len(data) <= limit else "over the limit"):
        codec.decode(data, cls)
    reader = StrictReader(data)
    with pytest.raises(MalformedMessage):
        reader.read()
    assert reader.items <= 8  # it stopped at the first tag, a few items in


def _hostile_admissions(s: m.RoundSpec) -> dict[str, tuple[bytes, str]]:
    """Plaintexts of exactly the round's admission size that are not an Admission of the round, and their reason."""
    fmt = envelope_format(s.round_id, s.mechanism)
    cred, n = credential(1), nonce(1)

    def body(**changes) -> dict:
        b = cbor2.loads(codec.encode(m.Admission(s.round_id, cred, n, bytes(fmt.sealed_size))))
        b.update(changes)
        return b

    head = _head("admission")
    depth = (fmt.admission_size - len(head) - 7) // 11
    shared = head + _shared_reference_key(depth) + b"\x00"
    pairs = b"".join(cbor2.dumps(f"k{i:05d}") + bytes.fromhex("f97e00") for i in range(200))
    nan_flood = (b"\xb9" + (200).to_bytes(2, "big") + pairs)[: fmt.admission_size]
    # the bignum 2**64 (tag 2) takes 10 bytes more than round id 3; the sealed report 10 fewer
    bignum = cbor2.dumps(body(round_id=2**64, sealed=bytes(fmt.sealed_size - 10)), canonical=True)
    trailing = codec.encode(m.Admission(s.round_id, cred, n, bytes(fmt.sealed_size - 2))) + bytes(2)
    short_credential = cbor2.dumps(body(credential=cred[:-1], sealed=bytes(fmt.sealed_size + 1)), canonical=True)
    inner_envelope = next(
        e
        for k in range(1, fmt.admission_size)
        if len(e := codec.encode(m.Envelope(s.session_id, s.round_id, bytes(k)))) == fmt.admission_size
    )
    other_round = codec.encode(m.Admission(s.round_id + 1, cred, n, bytes(fmt.sealed_size)))
    cases = {
        "shared-reference": (shared + bytes(fmt.admission_size - len(shared)), "malformed"),
        "nan-flood": (nan_flood, "malformed"),
        "bignum-round-id": (bignum, "malformed"),
        "trailing-bytes": (trailing, "malformed"),
        "short-credential": (short_credential, "malformed"),
        "envelope-in-envelope": (inner_envelope, "malformed"),
        "random": (os.urandom(fmt.admission_size), "malformed"),
        "other-round": (other_round, "unknown-round"),
    }
    return {name: (fit(data, s), reason) for name, (data, reason) in cases.items()}


@pytest.mark.parametrize(
    "case",
    [
        "shared-reference",
        "nan-flood",
        "bignum-round-id",
        "trailing-bytes",
        "short-credential",
        "envelope-in-envelope",
        "random",
        "other-round",
    ],
)
def test_hostile_plaintext_inside_a_validly_sealed_outer_layer_is_typed_and_cheap(case):
    """The outer layer is sealed to a public key: any client can make the shuffler decode any plaintext."""
    s = spec()
    plaintext, reason = _hostile_admissions(s)[case]
    data = outer_sealed(s, plaintext)
    assert len(data) == envelope_format(s.round_id, s.mechanism).size  # past every size check
    started = time.perf_counter()
    with pytest.raises(ShuffleDPError) as info:
        opener(s).open(data)
    assert time.perf_counter() - started < 0.5
    assert info.value.reason == reason and len(str(info.value)) < 200
    adm = admission(s)
    receipts = adm.offer_many([data])
    assert adm.stats.rejected == Counter({reason: 1}) and adm.stats.admitted == 0
    assert not receipts  # no nonce came out of it, so nothing to name
    if case == "shared-reference":
        reader = StrictReader(plaintext)
        with pytest.raises(MalformedMessage, match="tags"):
            reader.read()
        assert reader.items <= 8


def _sample_bodies() -> dict[str, dict]:
    s = spec(LAPLACE)
    sealed = report_format(s.round_id, s.mechanism).sealed_size
    samples = {
        "round-spec": codec.encode(s),
        "envelope": envelope(s, credential(1), bytes(sealed), nonce(1)),
        "admission": codec.encode(m.Admission(s.round_id, credential(1), nonce(1), bytes(sealed))),
        "shuffled-batch": signed_batch(s, [bytes(sealed), bytes([1]) * sealed]),
        "admission-receipts": codec.encode(m.AdmissionReceipts(SESSION, 3, bytes(32), (nonce(1),), (nonce(2),), ("quota",))),
        "round-outcome": codec.encode(m.RoundOutcome(SESSION, 3, bytes(32), "released", "", 5, bytes(16))),
        "batch-ack": ANALYZER.acknowledge(s, bytes(16)),
    }
    return {tag: cbor2.loads(data) for tag, data in samples.items()}


INTEGER_FIELDS = [
    ("round-spec", ("round_id",)),
    ("round-spec", ("min_batch",)),
    ("round-spec", ("max_batch",)),
    ("round-spec", ("messages_per_user",)),
    ("round-spec", ("params", "grid_levels")),
    ("round-spec", ("v",)),
    ("round-spec", ("shuffler_instances",)),
    ("envelope", ("round_id",)),
    ("envelope", ("v",)),
    ("admission", ("round_id",)),
    ("shuffled-batch", ("round_id",)),
    ("shuffled-batch", ("chunk",)),
    ("shuffled-batch", ("chunks",)),
    ("shuffled-batch", ("total",)),
    ("shuffled-batch", ("v",)),
    ("admission-receipts", ("round_id",)),
    ("round-outcome", ("admitted",)),
    ("round-outcome", ("instance",)),
    ("batch-ack", ("round_id",)),
]


@pytest.mark.parametrize("tag,path", INTEGER_FIELDS, ids=["-".join((t, *p)) for t, p in INTEGER_FIELDS])
@pytest.mark.parametrize("sign", [1, -1])
def test_five_thousand_digit_integer_in_each_integer_field_is_typed(tag, path, sign):
    body = _sample_bodies()[tag]
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = sign * 10**5000
    data = cbor2.dumps(body, canonical=True)  # a bignum tag of 2,077 bytes (over the limit of the small messages)
    cls = codec.MESSAGE_TYPES[tag][0]
    with pytest.raises(MalformedMessage) as info:
        codec.decode(data, cls)
    assert len(str(info.value)) < 200  # the message never quotes the value
    if tag == "shuffled-batch":  # the analyzer's fixed-layout reader
        s = spec(LAPLACE)
        with pytest.raises(MalformedMessage) as info:
            read_batch_chunk(data, SESSION, s.round_id, s.digest, report_format(s.round_id, s.mechanism).sealed_size, m.MAX_BATCH)
        assert len(str(info.value)) < 200
    if tag == "envelope":  # the shuffler's entry point
        adm = admission(spec(LAPLACE))
        adm.offer(data)
        assert adm.stats.rejected == Counter({"malformed": 1})


def test_integer_fields_refuse_huge_values_built_in_python_with_a_short_message():
    huge = 10**5000
    for make in (
        lambda: m.Report(huge, "projected-mean", (1,)),
        lambda: m.Admission(huge, credential(1), nonce(1), b"x"),
        lambda: m.Envelope(SESSION, huge, b"x"),
        lambda: m.ShuffledBatch(SESSION, 3, bytes(32), bytes(16), 0, 1, huge, (b"x",)),
        lambda: m.ShuffledBatch(SESSION, 3, bytes(32), bytes(16), huge, 1, 1, (b"x",)),
        lambda: m.AdmissionReceipts(SESSION, huge, bytes(32), (), (), ()),
        lambda: m.RoundOutcome(SESSION, 3, bytes(32), "released", "", huge, bytes(16)),
        lambda: m.RoundOutcome(SESSION, 3, bytes(32), "released", "", 1, bytes(16), huge),
        lambda: m.BatchAck(SESSION, huge, bytes(32), bytes(16), bytes(64)),
        lambda: spec(round_id=huge),
        lambda: dataclasses.replace(spec(), shuffler_instances=huge),
    ):
        with pytest.raises(InvalidParameter) as info:
            make()
        assert "integer of" in str(info.value) and len(str(info.value)) < 200


def test_a_flood_of_nan_fields_is_refused_at_the_first_nan():
    pairs = b"".join(cbor2.dumps(f"k{i:05d}") + bytes.fromhex("f97e00") for i in range(3000))
    data = b"\xb9" + (3000).to_bytes(2, "big") + pairs
    reader = StrictReader(data)
    with pytest.raises(MalformedMessage, match="NaN"):
        reader.read()
    assert reader.items == 3  # the map, one key, one NaN
    for field in ("epsilon0", "deadline", "delta0"):
        body = cbor2.loads(codec.encode(spec(LAPLACE)))
        body[field] = float("nan")
        with pytest.raises(MalformedMessage, match="NaN"):
            codec.decode(cbor2.dumps(body, canonical=True), m.RoundSpec)


# --------------------------------------------------------------------------
# batch bounds
# --------------------------------------------------------------------------


def test_batch_longer_than_max_batch_is_refused_before_allocating():
    s = spec(max_batch=4)
    size = report_format(s.round_id, s.mechanism).sealed_size
    payloads = [bytes([i]) * size for i in range(5)]
    batch = signed_batch(s, payloads)  # signed by the round's own shuffler: still too long
    with pytest.raises(MalformedMessage, match="max_batch"):
        read_batch_chunk(batch, SESSION, s.round_id, s.digest, size, s.max_batch)
    with pytest.raises(MalformedMessage, match="over the limit of 4"):
        codec.decode(batch, m.ShuffledBatch, max_items=s.max_batch)
    with pytest.raises(MalformedMessage, match="max_batch"):
        ANALYZER.open_batch_bytes(batch, s)
    # a chunk within bounds that declares a batch total above max_batch is refused from its header
    chunks = batch_chunks(s, SHUFFLER_KEYS, os.urandom(16), payloads, 2)
    for chunk in chunks:
        with pytest.raises(MalformedMessage, match="max_batch"):
            read_batch_chunk(chunk, SESSION, s.round_id, s.digest, size, s.max_batch)
    # a declared total or count far beyond the input is refused from the header alone
    one = signed_batch(s, payloads[:1])
    lying_count = one.replace(b"\x68payloads\x81", b"\x68payloads\x9a\xff\xff\xff\xff")
    assert lying_count != one
    with pytest.raises(MalformedMessage):
        codec.decode(lying_count, m.ShuffledBatch)
    with pytest.raises(MalformedMessage):
        read_batch_chunk(lying_count, SESSION, s.round_id, s.digest, size, m.MAX_BATCH)
    lying_total = raw_batch(s, payloads[:1], total=2**32)
    with pytest.raises(MalformedMessage, match="max_batch"):
        read_batch_chunk(lying_total, SESSION, s.round_id, s.digest, size, m.MAX_BATCH)
    with pytest.raises(MalformedMessage):
        codec.decode(lying_total, m.ShuffledBatch)


def test_batch_of_tiny_payloads_is_refused_by_the_fixed_layout():
    """Tiny payloads would cost ~40 bytes of Python objects per 2 input bytes; the layout refuses them,
    even under the round's own shuffler's signature."""
    s = spec()
    size = report_format(s.round_id, s.mechanism).sealed_size
    batch = signed_batch(s, [b"\x01"] * 1000)
    with pytest.raises(MalformedMessage):
        read_batch_chunk(batch, SESSION, s.round_id, s.digest, size, s.max_batch)
    with pytest.raises(MalformedMessage):
        ANALYZER.open_batch_bytes(batch, s)
    coordinator = DEPLOYMENT.coordinator(InProcessChannel(), analyzer=ANALYZER)
    assert coordinator._take_chunk(s, {}, {}, batch) is None
    assert coordinator.rejected_batches == Counter({"malformed": 1})


# --------------------------------------------------------------------------
# no value (and no identity) leaks through what the broker sees
# --------------------------------------------------------------------------


@pytest.mark.parametrize("params", [RANGE, LAPLACE, GAUSSIAN], ids=["range", "mean-laplace", "mean-gaussian"])
@pytest.mark.parametrize("epsilon0", [1e-3, 0.5, 8.0, m.MAX_EPSILON])
def test_every_sealed_payload_outer_layer_and_envelope_of_a_round_has_one_length(params, epsilon0):
    if getattr(params, "noise", "") == "gaussian" and epsilon0 > 10:
        pytest.skip("the discrete Gaussian calibration is slow at eps0 = 30; covered at 8")
    s = spec(params, epsilon0=epsilon0)
    signed_spec = ANALYZER.sign_spec(s)
    open_outer = opener(s).open
    values = np.concatenate([np.linspace(-1e6, 1e6, 41), [-4.0, 4.0, 0.0, 1e-300, -1e300, 1e300]])
    lengths_sealed, lengths_outer, lengths_envelope = set(), set(), set()

    def measure(data: bytes) -> None:
        lengths_envelope.add(len(data))
        lengths_outer.add(len(codec.decode(data, m.Envelope).outer))
        lengths_sealed.add(len(open_outer(data).sealed))

    for i, y in enumerate(values):
        source = SystemSource() if i % 10 == 0 else SeededSource(i)
        measure(client(y, source=source).answer(signed_spec)[0])
    # extreme reports built by hand: every value an honest randomizer can produce, at its bounds,
    # wrapped under extreme credentials and nonces
    layout = report_format(s.round_id, s.mechanism)
    extremes = [(r.low, r.high) for r in report_ranges(s)]
    for pick in ([lo for lo, _ in extremes], [hi for _, hi in extremes]):
        plaintext = layout.pad(codec.encode(m.Report(s.round_id, s.mechanism, tuple(pick))))
        sealed = Sealer(s.analyzer_key).seal(plaintext, SESSION, s.round_id, s.digest)
        lengths_sealed.add(len(sealed))
        for cred, n in ((credential(0), bytes(16)), (credential(2**128 - 1), b"\xff" * 16)):
            measure(envelope(s, cred, sealed, n))
    fmt = envelope_format(s.round_id, s.mechanism)
    assert lengths_sealed == {layout.sealed_size} == {fmt.sealed_size}
    assert layout.sealed_size == layout.size + HPKE_OVERHEAD
    assert lengths_outer == {fmt.outer_size} and fmt.outer_size == fmt.admission_size + HPKE_OVERHEAD
    assert lengths_envelope == {fmt.size}


@pytest.mark.parametrize("params", [RANGE, LAPLACE], ids=["range", "mean"])
def test_the_broker_sees_no_credential_no_nonce_no_sealed_report_and_one_length(params):
    """What a client publishes is {session_id, round_id, outer}: nothing that names the client or
    links the envelope to its report in the batch, and one length whatever the value."""
    s = spec(params)
    signed_spec = ANALYZER.sign_spec(s)
    open_outer = opener(s).open
    values = np.concatenate([np.linspace(-1e9, 1e9, 120), [0.0, -4.0, 4.0, 1e300, -1e300, 5e-324, 1e-3]])
    lengths, nonces, encapsulated = set(), set(), set()
    for i, y in enumerate(values):
        c = client(y, source=SeededSource(i))
        data = c.answer(signed_spec)[0]
        lengths.add(len(data))
        body = cbor2.loads(data)
        assert set(body) == {"t", "v", "session_id", "round_id", "outer"}
        assert (body["session_id"], body["round_id"]) == (SESSION, s.round_id)
        (sent_nonce,) = c.sent[(SESSION, s.round_id)].nonces
        inside = open_outer(data)
        assert inside.credential == c.credential and inside.nonce == sent_nonce
        client_id, tag = c.credential[:16], c.credential[16:]
        for secret in (c.credential, client_id, tag, sent_nonce, inside.sealed, inside.sealed[:32], inside.sealed[-16:]):
            assert secret not in data
        nonces.add(sent_nonce)
        encapsulated.add(body["outer"][:32])
    assert lengths == {envelope_format(s.round_id, s.mechanism).size}
    assert len(nonces) == len(encapsulated) == len(values)  # fresh nonce and fresh outer key per envelope


def test_analyzer_and_shuffler_reject_payloads_not_of_the_rounds_size():
    s = spec()
    data = client().answer(ANALYZER.sign_spec(s))[0]
    sealed = sealed_of(s, data)
    short = Sealer(s.analyzer_key).seal(codec.encode(m.Report(s.round_id, s.mechanism, (1, 1))), SESSION, 3, s.digest)  # unpadded
    opened = ANALYZER.open_payloads([sealed, short, sealed[:-1]], s)
    assert opened.size == 1 and opened.rejected == Counter({"wrong-size": 2})
    # a batch mixing sizes, even signed by the round's shuffler, is refused whole
    with pytest.raises(MalformedMessage, match="every payload"):  # same total length, one short and one long
        ANALYZER.open_batch_bytes(signed_batch(s, [sealed[:-1], sealed + b"\x00"]), s)
    with pytest.raises(MalformedMessage):
        ANALYZER.open_batch_bytes(signed_batch(s, [sealed, short]), s)
    # at the shuffler: inner reports and outer layers not of the round's size
    outer = codec.decode(data, m.Envelope).outer
    other_mechanism = spec(LAPLACE)  # same session, round and shuffler: another sealed size
    foreign_size = client().answer(ANALYZER.sign_spec(other_mechanism))[0]
    items = [
        envelope(s, credential(1), short, nonce(1)),
        envelope(s, credential(2), sealed[:-1], nonce(2)),
        envelope(s, credential(3), sealed + b"\x00", nonce(3)),
        codec.encode(m.Envelope(SESSION, s.round_id, outer[:-1])),
        codec.encode(m.Envelope(SESSION, s.round_id, outer + b"\x00")),
        foreign_size,
    ]
    adm = admission(s)
    for item in items:
        with pytest.raises(WrongSize):
            opener(s).open(item)
    adm.offer_many(items)
    assert adm.stats.rejected == Counter({"wrong-size": len(items)}) and adm.stats.admitted == 0
    adm.offer(data)
    assert adm.payloads == [sealed]


# --------------------------------------------------------------------------
# a report counts once
# --------------------------------------------------------------------------


def test_a_captured_sealed_report_rewrapped_by_other_enrolled_clients_is_admitted_once(tmp_path):
    s = spec(params=quota_params(2), messages_per_user=2)  # each client may send 2 reports
    signed_spec = ANALYZER.sign_spec(s)
    original = client(value=np.array([0.5, 0.5])).answer(signed_spec)[0]
    first = opener(s).open(original)
    captured = first.sealed
    spool = SqliteSpool(tmp_path / "spool.db")
    adm = admission(s, spool=spool)
    adm.admit(original)
    for i in range(3):  # other enrolled clients, each under its own quota, each with a fresh nonce
        with pytest.raises(DuplicateReport):
            adm.admit(envelope(s, credential(100 + i), captured, os.urandom(16)))
    with pytest.raises(DuplicateReport):  # its own sender, under quota (2), with a fresh nonce
        adm.admit(envelope(s, first.credential, captured, os.urandom(16)))
    receipts = adm.offer_many([envelope(s, credential(200 + i), captured, nonce(200 + i)) for i in range(3)])
    assert receipts.admitted == [] and receipts.refused == [nonce(200 + i) for i in range(3)]
    assert receipts.reasons == ["duplicate"] * 3
    # a fresh report and its re-wrapped copy in the same burst, before anything is committed
    fresh = client(value=np.array([0.2, 0.9])).answer(signed_spec)[0]
    fresh_sealed = sealed_of(s, fresh)
    burst = adm.offer_many([fresh, envelope(s, credential(300), fresh_sealed, nonce(300))])
    assert len(burst.admitted) == 1 and burst.reasons == ["duplicate"]
    # the broker replays the original envelope: acknowledged each time, counted once
    for _ in range(3):
        assert adm.offer_many([original]).admitted == [first.nonce]
    assert adm.payloads == [captured, fresh_sealed]
    assert adm.stats.admitted == 2 and adm.stats.retransmitted == 3
    assert adm.stats.rejected == Counter({"duplicate": 4})
    # after a restart on the same spool, the copy is still a copy
    resumed = admission(s, spool=SqliteSpool(tmp_path / "spool.db"))
    with pytest.raises(DuplicateReport):
        resumed.admit(envelope(s, credential(400), captured, nonce(400)))
    assert resumed.offer_many([original]).admitted == [first.nonce]
    assert Counter(resumed.payloads) == Counter([captured, fresh_sealed]) and resumed.stats.admitted == 2


def test_analyzer_drops_duplicate_encapsulated_keys_even_if_the_shuffler_did_not():
    s = spec()
    signed_spec = ANALYZER.sign_spec(s)
    sealed = [sealed_of(s, client(0.1 * i).answer(signed_spec)[0]) for i in range(5)]
    forged = sealed[0][:32] + bytes(len(sealed[0]) - 32)  # a copied encapsulated key, junk after it
    payloads = [*sealed, sealed[0], forged, sealed[0]]
    opened = ANALYZER.open_payloads(payloads, s)
    # the two copies and the junk are dropped, every real report counts once
    assert opened.size == 5
    assert sum(opened.rejected.values()) == 3 and opened.rejected["duplicate"] >= 2
    assert set(opened.rejected) <= {"duplicate", "unsealable"}
    # the same under the round's shuffler's signature: the analyzer does not trust it to de-duplicate
    via_batch = ANALYZER.open_batch_bytes(signed_batch(s, payloads), s)
    assert via_batch.size == 5 and via_batch.rejected == opened.rejected


def test_junk_with_a_copied_encapsulated_key_does_not_knock_out_the_real_report():
    """The junk copy comes first (the shuffler's permutation puts it first half the time)."""
    s = spec()
    signed_spec = ANALYZER.sign_spec(s)
    sealed = [sealed_of(s, client(0.1 * i).answer(signed_spec)[0]) for i in range(5)]
    forged = sealed[0][:32] + bytes(len(sealed[0]) - 32)
    opened = ANALYZER.open_payloads([forged, sealed[0], *sealed, sealed[0]], s)
    # the junk fails to open (and does not knock out the real report); the two copies are dropped
    assert opened.size == 5
    assert opened.rejected == Counter({"unsealable": 1, "duplicate": 2})


# --------------------------------------------------------------------------
# decoded values are bounded
# --------------------------------------------------------------------------


def _forged(s: m.RoundSpec, values: tuple[int, ...]) -> bytes:
    """A well-formed sealed report carrying any values (what a malicious client can send)."""
    layout = report_format(s.round_id, s.mechanism)
    return Sealer(s.analyzer_key).seal(layout.pad(codec.encode(m.Report(s.round_id, s.mechanism, values))), SESSION, 3, s.digest)


def test_report_at_the_integer_limit_is_rejected_and_moves_nothing():
    s = spec(LAPLACE)
    signed_spec = ANALYZER.sign_spec(s)
    honest = [sealed_of(s, client(0.5, source=SeededSource(i)).answer(signed_spec)[0]) for i in range(50)]
    clean = ANALYZER.open_payloads(honest, s)
    for value in (2**62 - 1, -(2**62)):
        attacked = ANALYZER.open_payloads([*honest, _forged(s, (value,))], s)
        assert attacked.rejected == Counter({"out-of-range": 1})
        np.testing.assert_array_equal(np.sort(attacked.values, axis=0), np.sort(clean.values, axis=0))
    # end to end: an enrolled client sends it; the shuffler cannot see it and admits it; the analyzer drops it
    adm = admission(s)
    for i, sealed in enumerate(honest):
        adm.admit(envelope(s, credential(i), sealed, nonce(i)))
    adm.admit(envelope(s, credential(999), _forged(s, (2**62 - 1,)), nonce(999)))
    attacked = ANALYZER.open_batch_bytes(signed_batch(s, adm.shuffled_payloads()), s)
    assert attacked.rejected == Counter({"out-of-range": 1})
    np.testing.assert_array_equal(np.sort(attacked.values, axis=0), np.sort(clean.values, axis=0))


def test_one_report_moves_the_mean_by_at_most_its_bounded_share():
    s = spec(LAPLACE)
    low, high = report_range(LAPLACE, s.epsilon0)
    assert (low, high) == (-noise_tail_bound(LAPLACE, s.epsilon0), LAPLACE.grid_levels - low)
    signed_spec = ANALYZER.sign_spec(s)
    honest = [sealed_of(s, client(0.5, source=SeededSource(i)).answer(signed_spec)[0]) for i in range(99)]
    base = decode_values(ANALYZER.open_payloads(honest, s).values[:, 0], LAPLACE).mean()
    share = (high - low) * LAPLACE.step / 100  # the decoded range over n = 100 reports
    for value in (low, high):  # the worst a malicious report can still send
        opened = ANALYZER.open_payloads([*honest, _forged(s, (value,))], s)
        assert not opened.rejected and opened.size == 100
        moved = decode_values(opened.values[:, 0], LAPLACE).mean() - base
        assert 0 < abs(moved) <= share
    for value in (low - 1, high + 1):
        assert ANALYZER.open_payloads([*honest, _forged(s, (value,))], s).rejected == Counter({"out-of-range": 1})


def test_range_reports_outside_the_hadamard_domain_are_rejected():
    s = spec(RANGE)
    K = RANGE.padded_bins
    good = _forged(s, (K - 1, -1))
    bad = [_forged(s, v) for v in ((K, 1), (-1, 1), (0, 0), (0, 2), (0, -3))]
    opened = ANALYZER.open_payloads([good, *bad], s)
    assert opened.size == 1 and opened.rejected == Counter({"out-of-range": 5})


def test_the_client_clamp_and_the_analyzer_bound_agree():
    """An honest randomizer never produces a value the analyzer rejects, at any epsilon."""
    for params, eps in ((LAPLACE, m.MIN_EPSILON), (LAPLACE, 0.05), (GAUSSIAN, 0.5)):
        s = spec(params, epsilon0=eps)
        low, high = report_range(params, eps, s.delta0)
        values = randomize_mean(np.linspace(-10, 10, 20_000), params, eps, SeededSource(1), delta=s.delta0)
        assert low <= values.min() and values.max() <= high


# --------------------------------------------------------------------------
# parameters that make no sense are refused
# --------------------------------------------------------------------------


@pytest.mark.parametrize("params", [RANGE, LAPLACE, GAUSSIAN], ids=["range", "laplace", "gaussian"])
@pytest.mark.parametrize("epsilon0", [1e-16, 1e-300, 5e-7])
def test_tiny_epsilon0_is_refused_naming_it(params, epsilon0):
    with pytest.raises(InvalidParameter) as info:
        spec(params, epsilon0=epsilon0)
    assert info.value.parameter == "epsilon0"


def test_noise_scale_past_the_samplers_limit_is_refused_naming_epsilon0():
    params = m.ProjectedMeanParams(0.0, 1.0, "gaussian", m.MAX_GRID_LEVELS)
    with pytest.raises(InvalidParameter) as info:
        spec(params, epsilon0=1e-5, delta0=1e-300)  # sigma up to 6e13 grid units, past 2**44
    assert info.value.parameter == "epsilon0"
    assert spec(params, epsilon0=1e-3, delta0=1e-300).params == params  # 6e11 is fine


@pytest.mark.parametrize("source", [SeededSource(0), SystemSource()], ids=["seeded", "system"])
def test_sources_refuse_noise_scales_they_cannot_sample_instead_of_emitting_no_noise(source):
    with pytest.raises(InvalidParameter):
        source.discrete_laplace(4096 / 1e-16, 10)
    with pytest.raises(InvalidParameter):
        source.discrete_gaussian((MAX_NOISE_SCALE * 2) ** 2, 10)
    draws = source.discrete_laplace(MAX_NOISE_SCALE, 200 if isinstance(source, SeededSource) else 5)
    assert np.all(draws != 0)  # at scale 2**44, a zero has probability ~3e-14 per draw


@pytest.mark.parametrize(
    "make",
    [
        lambda: m.HadamardRangeParams(1e17, 1e17 + 64, 1.0),  # bins narrower than 4 ulps at 1e17
        lambda: m.ProjectedMeanParams(1e15, 1e15 + 1.0, "laplace", 4096),  # grid step below resolution
        lambda: m.ProjectedMeanParams(-1e308, 1e308, "laplace", 16),  # width overflows to inf
        lambda: spec(min_batch=10, max_batch=5),  # min above max
        lambda: dataclasses.replace(spec(), shuffler_key=bytes(31)),  # not an X25519 key
        lambda: dataclasses.replace(spec(), shuffler_signing_key=b""),  # no shuffler to check batches with
    ],
    ids=["bins", "grid", "width", "min-above-max", "shuffler-key", "shuffler-signing-key"],
)
def test_degenerate_parameters_are_refused_at_construction(make):
    with pytest.raises(InvalidParameter):
        make()


@pytest.mark.parametrize("key", ["analyzer_key", "shuffler_key"])
def test_a_spec_no_client_can_seal_to_costs_nothing_and_the_pool_survives(key):
    """An all-zero X25519 point (low order) for either layer: sealing fails before the ledger is charged."""
    low_order = dataclasses.replace(spec(round_id=0), **{key: bytes(32)})
    ledger = PrivacyLedger(1.0)
    c = client(ledger=ledger)
    with pytest.raises(SealingError):
        c.answer(ANALYZER.sign_spec(low_order))
    assert ledger.spent_epsilon == 0 and not ledger.answered and not c.sent

    async def run():
        channel = InProcessChannel()
        pool = ClientPool(channel, SESSION, [client(), client()], SeededSource(0))
        await pool.answer_round(ANALYZER.sign_spec(low_order))
        await pool.answer_round(ANALYZER.sign_spec(spec(round_id=1)))
        return pool

    pool = asyncio.run(run())
    assert pool.refused == Counter({"unsealable": 2}) and pool.answered_rounds == [0, 1]
    for c in pool.clients:
        assert (SESSION, 0) not in c.sent and (SESSION, 0) not in c.ledger.answered
        assert (SESSION, 1) in c.sent and (SESSION, 1) in c.ledger.answered


# --------------------------------------------------------------------------
# a device's own data is checked too
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [[float("nan")], [1.0, float("inf")], ["1.5"], [1 + 2j], [True], [[1.0], [2.0, 3.0]], object(), [None]],
    ids=["nan", "inf", "str", "complex", "bool", "ragged", "object", "none"],
)
def test_bad_device_data_is_refused_before_anything_is_charged(bad):
    with pytest.raises(InvalidParameter):
        Client(bad, ANALYZER.keys.signing_public, PrivacyLedger(1.0), credential=credential(1))
    with pytest.raises(InvalidParameter):
        randomize_range(bad, RANGE, 0.5, SeededSource(0))
    with pytest.raises(InvalidParameter):
        randomize_mean(bad, LAPLACE, 0.5, SeededSource(0))


@pytest.mark.parametrize(
    "bad",
    [None, b"", bytes(47), bytes(49), "x" * 48, bytearray(48), memoryview(bytes(48)), 0],
    ids=["none", "empty", "short", "long", "str", "bytearray", "memoryview", "int"],
)
def test_a_client_without_a_well_formed_credential_is_refused_at_construction(bad):
    with pytest.raises(InvalidParameter) as info:
        Client(np.array([0.5]), ANALYZER.keys.signing_public, PrivacyLedger(1.0), credential=bad)
    assert info.value.parameter == "credential"


def test_nan_in_a_batch_is_refused_not_projected():
    means = np.array([0.1, np.nan, 0.3])
    with pytest.raises(InvalidParameter, match="finite"):
        randomize_range(means, RANGE, 0.5, SeededSource(0))
    assert as_real_array([1, 2], "x").dtype == np.float64


def test_a_round_that_fails_after_the_budget_check_charges_nothing():
    ledger = PrivacyLedger(1.0)
    c = client(ledger=ledger)
    s = spec()
    with pytest.raises(ShuffleDPError):
        c.answer_verified(s, Sealer(s.analyzer_key), values=(RANGE.padded_bins, 1))  # not a value it may send
    assert ledger.spent_epsilon == 0 and not ledger.answered and not c.sent
    c.answer(ANALYZER.sign_spec(s))
    assert ledger.spent_epsilon == pytest.approx(0.5)


# --------------------------------------------------------------------------
# the ledger is safe under concurrency
# --------------------------------------------------------------------------


def test_ledger_never_overspends_under_threads():
    ledger = PrivacyLedger(epsilon_budget=10.0)
    clients = [client(0.1 * i, ledger=ledger) for i in range(4)]
    signed_specs = [ANALYZER.sign_spec(spec(round_id=r, epsilon0=0.5)) for r in range(40)]
    answered, refused = Counter(), Counter()
    barrier = threading.Barrier(8)

    def worker(k: int) -> None:
        barrier.wait()
        for r in range(40):
            try:
                clients[k % 4].answer(signed_specs[(r + k) % 40])
                answered[(r + k) % 40] += 1
            except BudgetExceeded:
                refused[k] += 1

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # exactly 20 rounds fit a budget of 10 at 0.5 each, and none was answered twice
    assert sum(answered.values()) == 20 and max(answered.values()) == 1
    assert len(ledger.answered) == 20 and ledger.spent_epsilon == pytest.approx(10.0)
    assert sum(refused.values()) == 8 * 40 - 20


def test_ledger_refuses_nan_and_negative_charges():
    ledger = PrivacyLedger(1.0)
    for eps, delta in ((float("nan"), 0.0), (0.1, float("nan")), (-0.5, 0.0), ("0.1", 0.0)):
        with pytest.raises(InvalidParameter):
            ledger.spend(SESSION, 0, eps, delta)
    assert ledger.spent_epsilon == 0 and not ledger.answered
    with pytest.raises(InvalidParameter):
        PrivacyLedger("1.0")


# --------------------------------------------------------------------------
# junk on the batch and outcome topics does not end a round
# --------------------------------------------------------------------------


async def test_coordinator_skips_junk_foreign_and_short_batches_and_opens_the_real_one():
    channel = InProcessChannel()
    coordinator = DEPLOYMENT.coordinator(channel, analyzer=ANALYZER, round_timeout=10.0, grace=1.0,
                                         batch_margin=NO_LIVENESS_MARGIN)
    expected: Counter = Counter()
    published: dict[str, bytes] = {}

    async def shuffler_stand_in():
        announcements = await channel.subscribe(announce_topic(SESSION))
        try:
            signed_spec = await announcements.get()
        finally:
            await announcements.close()
        s = codec.decode(codec.decode(signed_spec, m.SignedRoundSpec).spec_bytes, m.RoundSpec)
        assert s.max_batch == s.min_batch == 4
        real = [sealed_of(s, client(0.2 * i).answer(signed_spec)[0]) for i in range(4)]
        size = len(real[0])
        # forged and stale outcomes first: a forged "failed" must not end the round
        outcomes = [
            codec.encode(signed(IMPOSTOR.signing_private, m.RoundOutcome(SESSION, s.round_id, s.digest, "failed", "batch-too-small", 0, bytes(16)))),
            codec.encode(m.RoundOutcome(SESSION, s.round_id, s.digest, "failed", "batch-too-small", 0, bytes(16))),  # unsigned
            codec.encode(signed(SHUFFLER_KEYS.signing_private, m.RoundOutcome(SESSION, s.round_id + 1, bytes(32), "failed", "x", 0, bytes(16)))),
            b"\x00",
        ]
        for data in outcomes:
            await channel.publish(outcome_topic(SESSION, s.round_id), data)
        expected.update({"outcome-bad-signature": 2, "outcome-malformed": 1})  # the other round's is ignored, uncounted
        for _ in range(400):  # let the coordinator take them before any batch (at most 2 s)
            if sum(coordinator.rejected_batches.values()) >= 3:
                break
            await asyncio.sleep(0.005)
        half_id = os.urandom(16)
        genuine_half = batch_chunks(s, SHUFFLER_KEYS, half_id, real, 2)[0]  # never completed
        tampered = bytearray(signed_batch(s, real))
        tampered[-200] ^= 1  # a bit of the last payload, after signing
        junk = {
            "malformed": [
                b"\x00",
                os.urandom(5000),
                signed_batch(s, [b"x"] * 3),  # tiny payloads, under the real key
                signed_batch(dataclasses.replace(s, round_id=s.round_id + 1), real),  # another round, real key
                signed_batch(dataclasses.replace(s, session_id=OTHER_SESSION), real),  # another session, real key
                raw_batch(s, [], total=0),  # an empty "result"
                signed_batch(s, [*real, os.urandom(size)]),  # over max_batch, real key
            ],
            "bad-signature": [
                signed_batch(s, real, IMPOSTOR),  # well-formed, the real reports, another shuffler's key
                raw_batch(s, real),  # well-formed, unsigned
                batch_chunks(s, IMPOSTOR, half_id, [os.urandom(size) for _ in range(4)], 2)[1],  # completes the half
                bytes(tampered),
            ],
            "batch-too-small": [
                signed_batch(s, real[:1]),  # one victim, unshuffled, under the real key
                signed_batch(s, [os.urandom(size) for _ in range(4)]),  # real key, junk that fails to open
                signed_batch(s, [real[0], *real[:3]]),  # real key, padded with a copy: 3 distinct
            ],
        }
        topic = batch_topic(SESSION, s.round_id)
        await channel.publish(topic, genuine_half)
        for items in junk.values():
            for data in items:
                await channel.publish(topic, data)
        expected.update({reason: len(items) for reason, items in junk.items()})
        published["real"] = signed_batch(s, real)
        await channel.publish(topic, published["real"])
        return s, real

    helper = asyncio.create_task(shuffler_stand_in())
    record = await coordinator.run_round(RANGE, 0.5, min_batch=4)
    s, real = await helper
    assert record.opened.size == 4 and not record.opened.rejected
    assert record.batch_id == read_batch_chunk(published["real"], SESSION, s.round_id, s.digest, len(real[0]), 4).batch_id
    assert coordinator.rejected_batches == expected
    assert INTERNAL_ERROR not in coordinator.rejected_batches


def test_open_batch_bytes_refuses_batches_not_signed_by_the_rounds_shuffler():
    s = spec(min_batch=3, max_batch=3)
    signed_spec = ANALYZER.sign_spec(s)
    real = [sealed_of(s, client(0.1 * i).answer(signed_spec)[0]) for i in range(3)]
    assert ANALYZER.open_batch_bytes(signed_batch(s, real), s).size == 3
    tampered = bytearray(signed_batch(s, real))
    tampered[-250] ^= 1  # inside the last payload
    for data in (
        signed_batch(s, real, IMPOSTOR),
        raw_batch(s, real),
        bytes(tampered),
        signed_batch(s, real, ShufflerKeys(SHUFFLER_KEYS.hpke_private, ANALYZER.keys.signing_private)),  # the analyzer's key
    ):
        with pytest.raises(BadSignature):
            ANALYZER.open_batch_bytes(data, s)
    # a genuine chunk of a longer batch is not a whole batch
    for chunk in batch_chunks(s, SHUFFLER_KEYS, os.urandom(16), real, 2):
        with pytest.raises(MalformedMessage):
            ANALYZER.open_batch_bytes(chunk, s)
    # a genuine batch of another round, replayed here
    with pytest.raises(MalformedMessage):
        ANALYZER.open_batch_bytes(signed_batch(dataclasses.replace(s, round_id=4), real), s)
    # a genuine batch of another spec of this very round (e.g. one signed before the analyzer restarted)
    with pytest.raises(MalformedMessage, match="another session or spec"):
        ANALYZER.open_batch_bytes(signed_batch(dataclasses.replace(s, epsilon0=s.epsilon0 * 2), real), s)


def test_generic_decoder_refuses_a_batch_that_would_expand_in_memory():
    tiny = codec.encode(m.ShuffledBatch(SESSION, 3, bytes(32), bytes(16), 0, 1, 20_000, (b"\x01",) * 20_000))  # 40 kB of 1-byte payloads
    with pytest.raises(MalformedMessage, match="expands"):
        codec.decode(tiny, m.ShuffledBatch)
    s = spec()
    size = report_format(s.round_id, s.mechanism).sealed_size
    real = m.ShuffledBatch(SESSION, 3, bytes(32), bytes(16), 0, 1, 20_000, tuple(os.urandom(size) for _ in range(20_000)))
    assert codec.decode(codec.encode(real), m.ShuffledBatch) == real  # real payloads read in full


# --------------------------------------------------------------------------
# forged receipts, outcomes and acknowledgements change nothing
# --------------------------------------------------------------------------


def test_clients_settle_only_receipts_and_outcomes_signed_by_their_rounds_shuffler():
    s = spec()
    ledger = PrivacyLedger(1.0)
    c = client(ledger=ledger)
    c.answer(ANALYZER.sign_spec(s))
    sent = c.sent[(SESSION, s.round_id)]
    (mine,) = sent.nonces
    refusal = m.AdmissionReceipts(SESSION, s.round_id, s.digest, (), (mine,), ("quota",))
    failed = m.RoundOutcome(SESSION, s.round_id, s.digest, "failed", "batch-too-small", 0, bytes(16))
    for data in (codec.encode(signed(IMPOSTOR.signing_private, refusal)), codec.encode(refusal)):
        with pytest.raises(BadSignature):
            c.settle_receipts(data)
    for data in (codec.encode(signed(IMPOSTOR.signing_private, failed)), codec.encode(failed)):
        with pytest.raises(BadSignature):
            c.settle_outcome(data)
    for other in ({"round_id": s.round_id + 1}, {"session_id": OTHER_SESSION}):  # genuine, but not a round it sent in
        with pytest.raises(UnknownRound):
            c.settle_receipts(codec.encode(signed(SHUFFLER_KEYS.signing_private, dataclasses.replace(refusal, **other))))
        with pytest.raises(UnknownRound):
            c.settle_outcome(codec.encode(signed(SHUFFLER_KEYS.signing_private, dataclasses.replace(failed, **other))))
    assert sent.receipts == {} and sent.outcome is None and ledger.lost_rounds() == []
    genuine = m.AdmissionReceipts(SESSION, s.round_id, s.digest, (mine, nonce(1)), (nonce(2),), ("quota",))
    assert c.settle_receipts(codec.encode(signed(SHUFFLER_KEYS.signing_private, genuine))).receipts == {mine: "admitted"}


def test_the_shuffler_marks_nothing_served_on_forged_acknowledgements():
    s = spec()
    shuffler = DEPLOYMENT.shuffler(InProcessChannel())
    shuffler.spool.open_round(SESSION, s.round_id, ANALYZER.sign_spec(s))
    batch_id = os.urandom(16)
    shuffler.spool.release(SESSION, s.round_id, batch_id, [signed_batch(s, [bytes(report_format(3, s.mechanism).sealed_size)])])
    ack = m.BatchAck(SESSION, s.round_id, s.digest, batch_id, bytes(64))
    forged = [
        codec.encode(signed(IMPOSTOR.signing_private, ack)),  # signed by another key
        codec.encode(ack),  # unsigned
        codec.encode(signed(SHUFFLER_KEYS.signing_private, ack)),  # the shuffler's own key, not the analyzer's
        b"\x00",
    ]
    for data in forged:
        assert shuffler.handle_ack(data) is False
    assert shuffler.rejected_acks == Counter({"bad-signature": 3, "malformed": 1})
    assert shuffler.acknowledged == 0 and shuffler.spool.round(SESSION, s.round_id).state == "released"
    foreign = ANALYZER.acknowledge(dataclasses.replace(s, session_id=OTHER_SESSION), batch_id)
    assert shuffler.handle_ack(foreign) is False and shuffler.rejected_acks["unknown-round"] == 1
    assert shuffler.handle_ack(ANALYZER.acknowledge(s, batch_id)) is True


# --------------------------------------------------------------------------
# found by the attacker review
# --------------------------------------------------------------------------


def test_huge_finite_means_fall_in_the_last_bin_not_the_first():
    params = m.HadamardRangeParams(0.0, 1.0, 1 / 64)
    np.testing.assert_array_equal(bin_index(np.array([1e18, 1e308, -1e308]), params), [31, 31, 0])


@pytest.mark.parametrize(
    "make",
    [
        lambda: spec(m.ProjectedMeanParams(-5e306, 5e306, "laplace", 4096)),  # decoded reports overflow a sum
        lambda: m.HadamardRangeParams(0.0, 1.0, 1.5e308),  # 2 tau is infinite
    ],
)
def test_ranges_whose_decoded_values_overflow_are_refused(make):
    with pytest.raises(InvalidParameter):
        make()


def test_finite_samples_whose_mean_overflows_are_refused():
    with pytest.raises(InvalidParameter, match="overflows"):
        Client(np.array([1e308, 1e308]), ANALYZER.keys.signing_public, PrivacyLedger(1.0), credential=credential(1))


@pytest.mark.parametrize("bad", [None, "text", 5, memoryview(b"\xff"), bytearray(b"\x1c")])
def test_every_entry_point_types_its_refusal_of_non_bytes(bad):
    s = spec()
    layout = report_format(s.round_id, s.mechanism)
    c = client()
    c.answer(ANALYZER.sign_spec(s))  # so that settling has a round to look for
    adm = admission(s)
    shuffler = DEPLOYMENT.shuffler(InProcessChannel())
    coordinator = DEPLOYMENT.coordinator(InProcessChannel(), analyzer=ANALYZER)
    for call in (
        lambda: loads(bad),
        lambda: codec.decode(bad),
        lambda: codec.decode_padded(bad, m.Report),
        lambda: layout.values(bad),
        lambda: read_batch_chunk(bad, SESSION, 3, bytes(32), layout.sealed_size, 10),
        lambda: ANALYZER.open_batch_bytes(bad, s),
        lambda: c.answer(bad),
        lambda: c.settle_receipts(bad),
        lambda: c.settle_outcome(bad),
        lambda: opener(s).open(bad),
        lambda: adm.admit(bad),
        lambda: shuffler.verified_spec(bad),
        lambda: decode_verified(bad, m.BatchAck, ANALYZER.keys.signing_public),
    ):
        with pytest.raises(ShuffleDPError):
            call()
    # the services count it by a typed reason and go on
    adm.offer(bad)
    adm.offer_many([bad, bad])
    assert adm.stats.rejected == Counter({"malformed": 3}) and adm.stats.admitted == 0
    assert shuffler.handle_ack(bad) is False and shuffler.rejected_acks == Counter({"malformed": 1})
    assert coordinator._take_chunk(s, {}, {}, bad) is None
    assert coordinator._failed_instance(s, bad) is None
    assert coordinator.rejected_batches == Counter({"malformed": 1, "outcome-malformed": 1})
    opened = ANALYZER.open_payloads([bad], s)
    assert opened.rejected == Counter({"wrong-size": 1})
    assert loads(memoryview(b"\x61a")) == "a" and loads(bytearray(b"\xa0")) == {}  # bytes-like input is read


def test_an_unreadable_buffer_is_refused_with_a_typed_error():
    """``cbor_strict.as_bytes`` types an unreadable buffer ('unreadable buffer'); every entry point should too."""
    s = spec()
    released = memoryview(b"\xa0")
    released.release()
    adm = admission(s)
    adm.offer(released)
    shuffler = DEPLOYMENT.shuffler(InProcessChannel())
    shuffler.handle_ack(released)
    assert INTERNAL_ERROR not in adm.stats.rejected and INTERNAL_ERROR not in shuffler.rejected_acks
    for call in (
        lambda: loads(released),
        lambda: codec.decode(released),
        lambda: codec.decode_padded(released, m.Report),
        lambda: opener(s).open(released),
        lambda: client().answer(released),
    ):
        with pytest.raises(ShuffleDPError):
            call()


def test_a_bytearray_or_memoryview_batch_opens_like_bytes():
    s = spec(min_batch=3, max_batch=3)
    signed_spec = ANALYZER.sign_spec(s)
    real = [sealed_of(s, client(0.1 * i).answer(signed_spec)[0]) for i in range(3)]
    data = signed_batch(s, real)
    for view in (bytearray(data), memoryview(data)):
        opened = ANALYZER.open_batch_bytes(view, s)
        assert opened.size == 3 and not opened.rejected
    coordinator = DEPLOYMENT.coordinator(InProcessChannel(), analyzer=ANALYZER)
    record = coordinator._take_chunk(s, {}, {}, bytearray(data))
    assert record is not None and record.opened.size == 3 and not coordinator.rejected_batches
    # an envelope as a bytearray is admitted like bytes
    adm = admission(s)
    adm.admit(bytearray(client().answer(signed_spec)[0]))
    assert adm.stats.admitted == 1


def test_max_items_bounds_arrays_not_the_message_map():
    s = spec(max_batch=2)
    size = report_format(s.round_id, s.mechanism).sealed_size
    batch = m.ShuffledBatch(SESSION, 3, bytes(32), bytes(16), 0, 1, 2, (bytes(size), bytes([1]) * size))
    assert len(dataclasses.fields(batch)) > s.max_batch  # the map has more keys than max_items
    assert codec.decode(codec.encode(batch), m.ShuffledBatch, max_items=s.max_batch) == batch


def test_the_credential_stays_inside_the_outer_layer_and_nonces_are_fresh_every_round():
    """The credential is the client's only identity, and only the shuffler
    sees it; the nonce (which receipts name) is fresh in every round."""
    c = client(ledger=PrivacyLedger(9.0))
    envelopes, nonces = [], []
    for r in range(6):
        s = spec(round_id=r)
        data = c.answer(ANALYZER.sign_spec(s))[0]
        (sent_nonce,) = c.sent[(SESSION, r)].nonces
        inside = opener(s).open(data)
        assert inside.credential == c.credential and inside.nonce == sent_nonce
        assert c.credential[:16] not in data and c.credential[16:] not in data and sent_nonce not in data
        envelopes.append(data)
        nonces.append(sent_nonce)
        # nor does the analyzer see it: the batch carries the sealed report alone
        adm = admission(s)
        adm.admit(data)
        batch = signed_batch(s, adm.shuffled_payloads())
        assert c.credential[:16] not in batch and c.credential[16:] not in batch and sent_nonce not in batch
    assert len(set(nonces)) == 6
    assert len({codec.decode(e, m.Envelope).outer[:32] for e in envelopes}) == 6  # no outer key repeats


def test_coordinator_refuses_to_announce_a_round_whose_batch_cannot_be_encoded():
    check_servable(spec(max_batch=1_000_000))
    with pytest.raises(InvalidParameter) as info:
        check_servable(spec(max_batch=m.MAX_BATCH))
    assert info.value.parameter == "max_batch"
