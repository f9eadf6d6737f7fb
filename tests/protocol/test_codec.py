"""Tests for the wire codec (shuffledp.protocol.wire.codec) over every message type.

* Round trips: hypothesis strategies generate valid messages of every type; they
  decode back to equal messages, with and without ``expected``.
* Canonical encoding: encoding is a deterministic function of the message, and the
  bytes are already in CBOR's canonical form (re-encoding the decoded CBOR with
  ``canonical=True`` reproduces them byte for byte).
* Rejection: for arbitrary bytes, for valid CBOR of the wrong shape and for
  over-size inputs, ``decode`` raises only :class:`MalformedMessage` (or its
  subclasses :class:`MessageTooLarge`, :class:`UnsupportedVersion`).
* Every wire type is covered, the onion and signing messages included (admission,
  envelope, signed batch chunk, batch acknowledgement, admission receipts, round
  outcome): their deterministic key order (which the fast readers rely on), the
  size limits (the table is pinned, and the largest valid message of each
  fixed-shape type fits its limit), the fixed-size rule of the outer layer, and
  field-by-field refusals of out-of-domain values.

Defects these tests found are kept as regression tests at the end of the file
(see their reasons); the generic wrong-value fuzz below keeps its floats in
``[1e-6, 1e6]`` in magnitude precisely because magnitudes beyond that hit one of
those defects (an ``OverflowError``), which is tested explicitly there.
"""

from __future__ import annotations

import copy
import dataclasses

import cbor2
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from shuffledp.protocol.wire import codec
from shuffledp.protocol.wire import messages as m
from shuffledp.protocol.errors import (
    InvalidParameter,
    MalformedMessage,
    MessageTooLarge,
    UnsupportedVersion,
)
from shuffledp.protocol.wire.ed25519_keys import weak_ed25519_key
from shuffledp.protocol.wire.onion import envelope_format
from shuffledp.protocol.wire.report_format import HPKE_OVERHEAD, read_batch_chunk, report_format

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------------------
# strategies for valid messages
# ---------------------------------------------------------------------------

round_ids = st.integers(0, 2**63 - 1)
session_ids = st.binary(min_size=16, max_size=16)
keys32 = st.binary(min_size=32, max_size=32)
#: Ed25519 public keys a spec may name: not a small-order point nor a non-canonical encoding.
signing_keys = keys32.filter(lambda k: weak_ed25519_key(k) is None)
batch_ids = st.binary(min_size=16, max_size=16)
spec_digests = st.binary(min_size=32, max_size=32)
nonces = st.binary(min_size=16, max_size=16)
signatures = st.binary(min_size=64, max_size=64)
#: Reasons and other short texts: 1..32 characters of any Unicode (a reason may be 128 bytes of UTF-8).
reason_texts = st.text(min_size=1, max_size=32)
positive_floats = st.floats(min_value=0.0, exclude_min=True, allow_infinity=False, allow_nan=False)
any_finite = st.floats(allow_infinity=False, allow_nan=False)


@st.composite
def hadamard_params(draw):
    low = draw(st.floats(-1e6, 1e6))
    width = draw(st.floats(1e-3, 1e6))
    bins = draw(st.integers(1, 5000))
    tau = width / (2.0 * bins) * draw(st.floats(0.5, 2.0))
    high = low + width
    if not high > low:
        high = low + 1.0
    return m.HadamardRangeParams(low, high, tau)


@st.composite
def mean_params(draw, noise=None):
    lower = draw(st.floats(-1e6, 1e6))
    upper = lower + draw(st.floats(1e-3, 1e6))
    if not upper > lower:
        upper = lower + 1.0
    noise = noise if noise is not None else draw(st.sampled_from(m.NOISE_KINDS))
    try:
        return m.ProjectedMeanParams(lower, upper, noise, draw(st.integers(1, m.MAX_GRID_LEVELS)))
    except InvalidParameter:  # a grid step below double resolution at this magnitude
        assume(False)


@st.composite
def round_specs(draw):
    """Valid specs; draws the budget rules refuse (noise scale too large) are filtered out."""
    try:
        return _round_spec(draw)
    except InvalidParameter:
        assume(False)


def _round_spec(draw):
    params = draw(st.one_of(hadamard_params(), mean_params()))
    gaussian = getattr(params, "noise", "laplace") == "gaussian"
    delta0 = draw(st.floats(0.0, 1.0, exclude_min=True, exclude_max=True)) if gaussian else 0.0
    max_batch = draw(st.integers(1, m.MAX_BATCH))
    return m.RoundSpec(
        session_id=draw(session_ids),
        round_id=draw(round_ids),
        params=params,
        epsilon0=draw(st.floats(min_value=m.MIN_EPSILON, max_value=m.MAX_EPSILON)),
        analyzer_key=draw(keys32),
        shuffler_key=draw(keys32),
        shuffler_signing_key=draw(signing_keys),
        min_batch=draw(st.integers(1, max_batch)),
        max_batch=max_batch,
        deadline=draw(any_finite),
        delta0=delta0,
        messages_per_user=m.messages_per_user(params),
        shuffler_instances=draw(st.integers(1, m.MAX_SHUFFLER_INSTANCES)),
    )


signed_specs = st.builds(
    m.SignedRoundSpec,
    spec_bytes=st.binary(min_size=1, max_size=4000),
    signature=st.binary(min_size=64, max_size=64),
)
reports = st.sampled_from(sorted(m.MECHANISMS)).flatmap(
    lambda mechanism: st.builds(
        m.Report,
        round_id=round_ids,
        mechanism=st.just(mechanism),
        values=st.lists(
            st.integers(-(2**62), 2**62 - 1),
            min_size=m.MECHANISMS[mechanism].VALUES_PER_REPORT,
            max_size=m.MECHANISMS[mechanism].VALUES_PER_REPORT,
        ).map(tuple),
    )
)
admissions = st.builds(
    m.Admission,
    round_id=round_ids,
    credential=st.binary(min_size=m.CREDENTIAL_BYTES, max_size=m.CREDENTIAL_BYTES),
    nonce=nonces,
    sealed=st.binary(min_size=1, max_size=m.MAX_SEALED_BYTES),
)
envelopes = st.builds(
    m.Envelope,
    session_id=session_ids,
    round_id=round_ids,
    outer=st.binary(min_size=1, max_size=m.MAX_OUTER_BYTES),
)


@st.composite
def batches(draw):
    """One chunk of a batch: ``1 <= len(payloads) <= total``, ``1 <= chunks <= total``, ``chunk < chunks``."""
    payloads = tuple(draw(st.lists(st.binary(min_size=1, max_size=m.MAX_SEALED_BYTES), min_size=1, max_size=8)))
    total = draw(st.one_of(st.just(len(payloads)), st.integers(len(payloads), m.MAX_BATCH)))
    chunks = draw(st.integers(1, total))
    return m.ShuffledBatch(
        session_id=draw(session_ids), round_id=draw(round_ids), spec_digest=draw(spec_digests), batch_id=draw(batch_ids),
        chunk=draw(st.integers(0, chunks - 1)), chunks=chunks, total=total, payloads=payloads,
        signature=draw(signatures),
    )


batch_acks = st.builds(m.BatchAck, session_id=session_ids, round_id=round_ids, spec_digest=spec_digests,
                       batch_id=batch_ids, signature=signatures)


@st.composite
def admission_receipts(draw):
    refused = tuple(draw(st.lists(nonces, max_size=6)))
    return m.AdmissionReceipts(
        session_id=draw(session_ids), round_id=draw(round_ids), spec_digest=draw(spec_digests),
        admitted=tuple(draw(st.lists(nonces, max_size=6))),
        refused=refused, reasons=tuple(draw(reason_texts) for _ in refused), signature=draw(signatures),
    )


round_outcomes = st.builds(
    m.RoundOutcome,
    session_id=session_ids,
    round_id=round_ids,
    spec_digest=spec_digests,
    outcome=st.sampled_from(m.ROUND_OUTCOMES),
    reason=st.text(max_size=32),
    admitted=st.integers(0, m.MAX_BATCH),
    batch_id=batch_ids,
    instance=st.integers(0, m.MAX_SHUFFLER_INSTANCES - 1),
    signature=signatures,
)
ALL_MESSAGES = {
    m.RoundSpec: round_specs(),
    m.SignedRoundSpec: signed_specs,
    m.Report: reports,
    m.Admission: admissions,
    m.Envelope: envelopes,
    m.ShuffledBatch: batches(),
    m.BatchAck: batch_acks,
    m.AdmissionReceipts: admission_receipts(),
    m.RoundOutcome: round_outcomes,
}
any_message = st.one_of(*ALL_MESSAGES.values())


def test_every_wire_type_has_a_strategy():
    assert set(ALL_MESSAGES) == {cls for cls, _ in codec.MESSAGE_TYPES.values()}


# ---------------------------------------------------------------------------
# round trips and canonical form
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("cls", list(ALL_MESSAGES), ids=lambda c: c.__name__)
@SETTINGS
@given(data=st.data())
def test_round_trip(cls, data):
    msg = data.draw(ALL_MESSAGES[cls])
    wire = codec.encode(msg)
    assert isinstance(wire, bytes)
    back = codec.decode(wire, cls)
    assert type(back) is cls
    assert back == msg
    assert codec.decode(wire) == msg  # without pinning the type
    assert len(wire) <= codec.MESSAGE_TYPES[codec._TYPE_OF[cls]][1]


@SETTINGS
@given(msg=any_message)
def test_encoding_is_canonical_and_deterministic(msg):
    wire = codec.encode(msg)
    assert codec.encode(msg) == wire
    # an equal message built separately encodes identically
    assert codec.encode(copy.deepcopy(msg)) == wire
    assert codec.encode(codec.decode(wire)) == wire
    # the bytes are CBOR's canonical form of their own content
    body = cbor2.loads(wire)
    assert cbor2.dumps(body, canonical=True) == wire
    # and do not depend on the order in which map keys were inserted
    reordered = dict(reversed(list(body.items())))
    assert cbor2.dumps(reordered, canonical=True) == wire
    assert body["v"] == m.WIRE_VERSION and body["t"] == codec._TYPE_OF[type(msg)]


def test_known_encoding_of_a_report():
    """A fixed vector: canonical CBOR sorts keys by length then bytewise."""
    wire = codec.encode(m.Report(3, "hadamard-range", (1, -1)))
    expected = cbor2.dumps(
        {"t": "report", "v": 3, "values": [1, -1], "round_id": 3, "mechanism": "hadamard-range"},
        canonical=True,
    )
    assert wire == expected
    assert wire[:1] == b"\xa5"  # a map of 5 pairs
    assert wire[1:4] == b"\x61t\x66"  # first key "t" (text of length 1), then a 6-char text


@pytest.mark.parametrize(
    "path", [("delta0",), ("messages_per_user",), ("max_batch",), ("shuffler_instances",), ("params", "noise"), ("params", "grid_levels")]
)
def test_defaulted_keys_are_still_required(path):
    """The deterministic encoding writes every key, defaulted ones too; one without a key is refused."""
    spec = m.RoundSpec(
        session_id=bytes(16), round_id=1, params=m.ProjectedMeanParams(0.0, 1.0), epsilon0=1.0,
        analyzer_key=bytes(32), shuffler_key=bytes(32), shuffler_signing_key=bytes(range(32)), min_batch=10, deadline=5.0,
    )
    body = cbor2.loads(codec.encode(spec))
    target = body
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    with pytest.raises(MalformedMessage, match="missing key"):
        codec.decode(cbor2.dumps(body, canonical=True), m.RoundSpec)
    outcome = m.RoundOutcome(bytes(16), 1, bytes(32), "released", "", 3, bytes(16), signature=bytes(range(64)))
    body = cbor2.loads(codec.encode(outcome))
    del body["instance"]
    with pytest.raises(MalformedMessage, match="missing key"):
        codec.decode(cbor2.dumps(body, canonical=True), m.RoundOutcome)


#: Signed messages whose dataclass gives ``signature`` a default (all zeros), for building them before signing.
SIGNED_WITH_DEFAULT = [
    m.ShuffledBatch(bytes(16), 1, bytes(32), bytes(16), 0, 1, 1, (b"x",), bytes(range(64))),
    m.AdmissionReceipts(bytes(16), 1, bytes(32), (bytes(16),), (), (), bytes(range(64))),
    m.RoundOutcome(bytes(16), 1, bytes(32), "failed", "batch-too-small", 2, bytes(16), 0, bytes(range(64))),
]


@pytest.mark.parametrize("msg", SIGNED_WITH_DEFAULT, ids=lambda x: type(x).__name__)
def test_signature_key_is_required(msg):
    body = _body(msg)
    del body["signature"]
    with pytest.raises(MalformedMessage):
        decode_strictly(cbor2.dumps(body, canonical=True), type(msg))


def test_encode_rejects_non_messages_and_oversize():
    with pytest.raises(InvalidParameter):
        codec.encode({"v": 1})
    with pytest.raises(InvalidParameter):
        codec.encode(m.HadamardRangeParams(0.0, 1.0, 0.1))  # params are not a wire message
    with pytest.raises(MessageTooLarge):
        codec.encode(m.SignedRoundSpec(bytes(26 * 1024), bytes(64)))


# ---------------------------------------------------------------------------
# rejection of malformed input
# ---------------------------------------------------------------------------

EXPECTED_CHOICES = [None, *ALL_MESSAGES]


def decode_strictly(data, expected=None):
    """decode, asserting that the only exceptions are MalformedMessage and its subclasses."""
    try:
        return codec.decode(data, expected)
    except MalformedMessage:
        raise
    except Exception as exc:  # pragma: no cover - a failure path
        pytest.fail(f"decode raised {type(exc).__name__}: {exc} (only MalformedMessage is allowed)")


@settings(max_examples=400, deadline=None)
@given(data=st.binary(max_size=600), expected=st.sampled_from(EXPECTED_CHOICES))
def test_arbitrary_bytes_only_raise_malformed(data, expected):
    try:
        out = decode_strictly(data, expected)
    except MalformedMessage:
        return
    # astronomically unlikely, but a valid decode must be a message of the right type
    assert type(out) in ALL_MESSAGES
    assert expected is None or type(out) is expected


@settings(max_examples=200, deadline=None)
@given(msg=any_message, cut=st.integers(0, 10_000), flip=st.integers(0, 10_000))
def test_truncated_or_bitflipped_encodings_only_raise_malformed(msg, cut, flip):
    wire = codec.encode(msg)
    truncated = wire[: cut % len(wire)]
    with pytest.raises(MalformedMessage):
        decode_strictly(truncated, type(msg))
    flipped = bytearray(wire)
    flipped[flip % len(wire)] ^= 0xFF
    try:
        decode_strictly(bytes(flipped), type(msg))
    except MalformedMessage:
        pass


def _valid_examples():
    sid = bytes(range(16))
    keys = dict(analyzer_key=bytes(32), shuffler_key=bytes(range(32)), shuffler_signing_key=bytes(range(32, 64)))
    return [
        m.RoundSpec(sid, 4, m.HadamardRangeParams(-1.0, 1.0, 0.1), 0.5, min_batch=10, deadline=100.0, **keys),
        m.RoundSpec(
            sid, 5, m.ProjectedMeanParams(-1.0, 1.0, "gaussian", 64), 0.5, min_batch=10, deadline=100.0, delta0=1e-6,
            max_batch=50, shuffler_instances=3, **keys,
        ),
        m.SignedRoundSpec(b"spec", bytes(64)),
        m.Report(7, "projected-mean", (12,)),
        m.Admission(7, bytes(range(48)), bytes(range(16)), b"sealed"),
        m.Envelope(sid, 7, b"outer layer"),
        m.ShuffledBatch(sid, 7, bytes(32), bytes(range(16, 32)), 1, 2, 5, (b"a", b"bc", b"def"), bytes(range(64))),
        m.BatchAck(sid, 7, bytes(32), bytes(range(16, 32)), bytes(range(64))),
        m.AdmissionReceipts(sid, 7, bytes(32), (bytes(16),), (bytes([1]) * 16, bytes([2]) * 16), ("quota", "replay"), bytes(64)),
        m.RoundOutcome(sid, 7, bytes(32), "released", "", 2, bytes(range(16, 32)), 1, bytes(range(64))),
    ]


VALID = _valid_examples()
VALID_IDS = [f"{type(x).__name__}-{i}" for i, x in enumerate(VALID)]


def _body(msg) -> dict:
    return cbor2.loads(codec.encode(msg))


def _required_keys(msg) -> list[str]:
    return [f.name for f in dataclasses.fields(msg) if f.default is dataclasses.MISSING]


@pytest.mark.parametrize("msg", VALID, ids=VALID_IDS)
def test_valid_examples_decode(msg):
    assert codec.decode(codec.encode(msg), type(msg)) == msg


@pytest.mark.parametrize("msg", VALID, ids=VALID_IDS)
def test_missing_keys_rejected(msg):
    for key in _required_keys(msg) + ["v", "t"]:
        body = _body(msg)
        del body[key]
        with pytest.raises(MalformedMessage):
            decode_strictly(cbor2.dumps(body, canonical=True), type(msg))
        with pytest.raises(MalformedMessage):
            decode_strictly(cbor2.dumps(body, canonical=True))
    if isinstance(msg, m.RoundSpec):
        for key in ("low", "high", "tau", "mechanism") if msg.mechanism == "hadamard-range" else (
            "lower",
            "upper",
            "mechanism",
        ):
            body = _body(msg)
            del body["params"][key]
            with pytest.raises(MalformedMessage):
                decode_strictly(cbor2.dumps(body, canonical=True), m.RoundSpec)
    if isinstance(msg, m.RoundSpec) and msg.delta0 > 0:
        body = _body(msg)
        del body["delta0"]  # defaults to 0, inconsistent with Gaussian noise
        with pytest.raises(MalformedMessage):
            decode_strictly(cbor2.dumps(body, canonical=True), m.RoundSpec)


@pytest.mark.parametrize("msg", VALID, ids=VALID_IDS)
@pytest.mark.parametrize("extra", ["zzz", "V", "mechanism", 1, b"v"])
def test_extra_keys_rejected(msg, extra):
    body = _body(msg)
    body[extra] = 0
    with pytest.raises(MalformedMessage):
        decode_strictly(cbor2.dumps(body, canonical=True), type(msg))
    if isinstance(msg, m.RoundSpec):
        body = _body(msg)
        body["params"][extra if extra != "mechanism" else "zzz"] = 0
        with pytest.raises(MalformedMessage):
            decode_strictly(cbor2.dumps(body, canonical=True), m.RoundSpec)


# Values of the wrong type for each kind of field (bools count as wrong for ints and floats).
WRONG_FOR = {
    int: ["1", 1.5, 1.0, b"\x01", None, [1], {"a": 1}, True, False],
    float: ["1.0", b"\x01", None, [1.0], {"a": 1.0}, True, False],
    bytes: ["x" * 16, 1, None, [1, 2], {"a": b""}, True, 1.5],
    str: [1, b"laplace", None, ["laplace"], True],
    tuple: [5, "ab", b"ab", None, {"a": 1}, True, 1.5],
}


def _field_kinds(msg) -> dict[str, type]:
    kinds = {}
    hints, fields = codec._schema(type(msg))
    for name in fields:
        hint = hints[name]
        origin = getattr(hint, "__origin__", None)
        kinds[name] = tuple if origin is tuple else (hint if hint in (int, float, bytes, str) else None)
    return kinds


@pytest.mark.parametrize("msg", VALID, ids=VALID_IDS)
def test_wrong_types_rejected(msg):
    checked = 0
    for name, kind in _field_kinds(msg).items():
        for bad in WRONG_FOR.get(kind, []):
            body = _body(msg)
            body[name] = bad
            with pytest.raises(MalformedMessage):
                decode_strictly(cbor2.dumps(body, canonical=True), type(msg))
            checked += 1
    assert checked > 0
    if isinstance(msg, m.RoundSpec):
        kinds = _field_kinds(msg.params)
        for name, kind in kinds.items():
            for bad in WRONG_FOR[kind]:
                body = _body(msg)
                body["params"][name] = bad
                with pytest.raises(MalformedMessage):
                    decode_strictly(cbor2.dumps(body, canonical=True), m.RoundSpec)
        for bad in [None, 1, "hadamard-range", [1], {"mechanism": "nope"}, {"mechanism": 1}, {}]:
            body = _body(msg)
            body["params"] = bad
            with pytest.raises(MalformedMessage):
                decode_strictly(cbor2.dumps(body, canonical=True), m.RoundSpec)


@pytest.mark.parametrize(
    "field,bad",
    [
        ("values", [True]),
        ("values", [1, False]),
        ("values", [1, 2]),
        ("values", [1.0]),
        ("values", ["1"]),
        ("values", []),
        ("values", list(range(9))),
        ("values", [2**62]),
        ("values", [-(2**62) - 1]),
        ("values", [2**200]),
        ("round_id", True),
        ("round_id", -1),
        ("round_id", 2**63),
        ("round_id", 2**100),
        ("mechanism", "laplace"),
    ],
)
def test_report_bad_values_rejected(field, bad):
    body = _body(m.Report(7, "projected-mean", (12,)))
    body[field] = bad
    with pytest.raises(MalformedMessage):
        decode_strictly(cbor2.dumps(body, canonical=True), m.Report)


@pytest.mark.parametrize(
    "path,bad",
    [
        (("min_batch",), True),
        (("min_batch",), 0),
        (("messages_per_user",), True),
        (("messages_per_user",), m.MAX_MESSAGES_PER_USER + 1),
        (("epsilon0",), True),
        (("epsilon0",), 0.0),
        (("epsilon0",), -1.0),
        (("epsilon0",), float("nan")),
        (("epsilon0",), float("inf")),
        (("epsilon0",), m.MAX_EPSILON * 2),
        (("deadline",), float("-inf")),
        (("delta0",), 1.0),
        (("analyzer_key",), bytes(31)),
        (("session_id",), bytes(17)),
        (("params", "grid_levels"), True),
        (("params", "grid_levels"), 0),
        (("params", "grid_levels"), m.MAX_GRID_LEVELS + 1),
        (("params", "noise"), "cauchy"),
        (("params", "lower"), 1.0),  # lower == upper
        (("params", "upper"), float("nan")),
        (("params", "mechanism"), "hadamard-range"),  # wrong field set for that mechanism
    ],
)
def test_spec_out_of_domain_values_rejected(path, bad):
    body = _body(VALID[1])
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = bad
    with pytest.raises(MalformedMessage):
        decode_strictly(cbor2.dumps(body, canonical=True), m.RoundSpec)


@pytest.mark.parametrize("msg", VALID, ids=VALID_IDS)
def test_wrong_version_rejected(msg):
    for version in (0, 1, 2, 4, 255, 2**64 - 1, -1):
        body = _body(msg)
        body["v"] = version
        with pytest.raises(UnsupportedVersion):
            decode_strictly(cbor2.dumps(body, canonical=True), type(msg))
    for version in ("1", b"\x01", None, [1], 1.5):
        body = _body(msg)
        body["v"] = version
        with pytest.raises(MalformedMessage) as info:
            decode_strictly(cbor2.dumps(body, canonical=True), type(msg))
        assert not isinstance(info.value, UnsupportedVersion)


@pytest.mark.parametrize("msg", VALID, ids=VALID_IDS)
def test_wrong_type_tag_rejected(msg):
    for tag in ("nope", "Report", "", 1, b"report", None, True, ["report"]):
        body = _body(msg)
        body["t"] = tag
        with pytest.raises(MalformedMessage):
            decode_strictly(cbor2.dumps(body, canonical=True), type(msg))
        with pytest.raises(MalformedMessage):
            decode_strictly(cbor2.dumps(body, canonical=True))


@pytest.mark.parametrize("msg", VALID, ids=VALID_IDS)
def test_expected_type_mismatch_rejected(msg):
    wire = codec.encode(msg)
    for other in ALL_MESSAGES:
        if other is not type(msg):
            with pytest.raises(MalformedMessage):
                decode_strictly(wire, other)
    # a body relabelled as another type fails that type's schema
    for tag in codec.MESSAGE_TYPES:
        if tag != codec._TYPE_OF[type(msg)]:
            body = _body(msg)
            body["t"] = tag
            with pytest.raises(MalformedMessage):
                decode_strictly(cbor2.dumps(body, canonical=True))


@pytest.mark.parametrize("top", [[1, 2], 1, "report", b"report", None, True, 1.5, []])
def test_top_level_must_be_a_map(top):
    with pytest.raises(MalformedMessage):
        decode_strictly(cbor2.dumps(top, canonical=True))


def test_non_bytes_input_rejected():
    for bad in ("text", None, 5, [1]):
        with pytest.raises(MalformedMessage):
            decode_strictly(bad)


@pytest.mark.parametrize("cls", list(ALL_MESSAGES), ids=lambda c: c.__name__)
def test_oversize_rejected_before_parsing(cls):
    limit = codec.MESSAGE_TYPES[codec._TYPE_OF[cls]][1]
    if limit > 1 << 20:
        # lazily allocated zero pages: no memory is touched, only the length is checked
        data = memoryview(np.zeros(limit + 1, dtype=np.uint8))
    else:
        data = b"\xff" * (limit + 1)  # not CBOR at all: only the size check can name it
    with pytest.raises(MessageTooLarge):
        decode_strictly(data, cls)


def test_oversize_without_expected():
    data = memoryview(np.zeros(codec.MAX_MESSAGE_BYTES + 1, dtype=np.uint8))
    with pytest.raises(MessageTooLarge):
        decode_strictly(data)


def test_type_specific_limit_applies_without_expected():
    """A report-tagged map over the report limit is too large even if the caller pins no type."""
    body = _body(m.Report(7, "projected-mean", (12,)))
    body["padding"] = "x" * 300
    data = cbor2.dumps(body, canonical=True)
    assert len(data) > codec.MESSAGE_TYPES["report"][1]
    with pytest.raises(MessageTooLarge):
        decode_strictly(data)


@pytest.mark.parametrize(
    "cls,field,field_limit,over_field,over_message",
    [
        (m.Envelope, "outer", m.MAX_OUTER_BYTES, 3000, 5000),
        (m.Admission, "sealed", m.MAX_SEALED_BYTES, 1500, 3000),
    ],
)
def test_oversize_byte_fields_are_rejected(cls, field, field_limit, over_field, over_message):
    msg = next(x for x in VALID if type(x) is cls)
    body = _body(msg)
    body[field] = bytes(field_limit)  # the largest allowed
    assert codec.decode(cbor2.dumps(body, canonical=True), cls) == dataclasses.replace(msg, **{field: bytes(field_limit)})
    body[field] = bytes(field_limit + 1)
    with pytest.raises(MalformedMessage):
        decode_strictly(cbor2.dumps(body, canonical=True), cls)
    body[field] = bytes(over_field)  # under the message's byte limit, over the field's
    data = cbor2.dumps(body, canonical=True)
    assert len(data) <= codec.MESSAGE_TYPES[codec._TYPE_OF[cls]][1]
    with pytest.raises(MalformedMessage):
        decode_strictly(data, cls)
    body[field] = bytes(over_message)
    with pytest.raises(MessageTooLarge):
        decode_strictly(cbor2.dumps(body, canonical=True), cls)


# ---------------------------------------------------------------------------
# size limits and the fixed-size rule of the outer layer
# ---------------------------------------------------------------------------


def test_size_limits_are_the_documented_ones():
    """The table in docs/wire-format.md ("Size limits"), exactly."""
    assert {tag: limit for tag, (_, limit) in codec.MESSAGE_TYPES.items()} == {
        "round-spec": 24 * 1024,
        "signed-round-spec": 25 * 1024,
        "report": 256,
        "admission": 2048,
        "envelope": 4096,
        "shuffled-batch": 512 * 1024 * 1024,
        "batch-ack": 256,
        "admission-receipts": 4 * 1024 * 1024,
        "round-outcome": 512,
    }


def test_the_largest_vector_mean_spec_fits_its_limit():
    """1,024 coordinates, every bound a full double, signed: within the documented limits."""
    for first in (-1.0 / 3.0, -1.5):  # bounds as 9-byte doubles, and as 3-byte halves (the most objects per byte)
        bounds = tuple(first - i for i in range(m.MAX_VECTOR_DIM))
        params = m.VectorMeanParams(m.MAX_VECTOR_DIM, 2**64 - 1, bounds, tuple(b + 1.0 for b in bounds), "gaussian", 4096)
        spec = m.RoundSpec(bytes(16), 2**63 - 1, params, 1.0, bytes(32), bytes(32), bytes(range(32)), m.MAX_BATCH, 1e300,
                           delta0=0.999, shuffler_instances=64)
        data = codec.encode(spec)
        assert codec.decode(data, m.RoundSpec) == spec
        assert codec.decode(codec.encode(m.SignedRoundSpec(data, bytes(64))), m.SignedRoundSpec).spec_bytes == data


def _largest_examples():
    """The largest valid message of each type whose fields are all bounded (every field at its widest)."""
    sid, top = bytes([0xFF]) * 16, 2**63 - 1
    widest_text = "\U0010ffff" * 32  # 32 characters of 4 bytes each in UTF-8
    return [
        m.Admission(top, bytes(m.CREDENTIAL_BYTES), bytes(m.NONCE_BYTES), bytes(m.MAX_SEALED_BYTES)),
        m.Envelope(sid, top, bytes(m.MAX_OUTER_BYTES)),
        m.BatchAck(sid, top, bytes(32), bytes(16), bytes(64)),
        m.RoundOutcome(sid, top, bytes(32), "released", widest_text, m.MAX_BATCH, bytes(16), m.MAX_SHUFFLER_INSTANCES - 1),
        m.Report(top, "hadamard-range", (-(2**62), -(2**62))),
        m.AdmissionReceipts(sid, top, bytes(32), tuple(bytes(16) for _ in range(m.MAX_RECEIPTS)), (), ()),
    ]


@pytest.mark.parametrize("msg", _largest_examples(), ids=lambda x: type(x).__name__)
def test_largest_valid_message_fits_its_limit(msg):
    wire = codec.encode(msg)  # raises MessageTooLarge if not
    assert codec.decode(wire, type(msg)) == msg


def test_receipts_with_long_reasons_hit_the_byte_limit_before_the_count_limit():
    """MAX_RECEIPTS refused nonces with 32-character reasons exceed 4 MiB: the byte limit binds first,
    so a shuffler must split its receipts by size (encoding refuses, typed, rather than send them)."""
    short = m.AdmissionReceipts(bytes(16), 1, bytes(32), (), tuple(bytes(16) for _ in range(m.MAX_RECEIPTS)),
                                ("x" * 32,) * m.MAX_RECEIPTS)
    assert codec.decode(codec.encode(short), m.AdmissionReceipts) == short
    wide = dataclasses.replace(short, reasons=("\U0010ffff" * 32,) * m.MAX_RECEIPTS)
    with pytest.raises(MessageTooLarge):
        codec.encode(wide)
    with pytest.raises(InvalidParameter):  # and one more receipt is refused by the message itself
        m.AdmissionReceipts(bytes(16), 1, bytes(32), (bytes(16),) * (m.MAX_RECEIPTS + 1), (), ())


@settings(max_examples=100, deadline=None)
@given(
    round_id=round_ids, mechanism=st.sampled_from(sorted(m.MECHANISMS)), session=session_ids,
    credential=st.binary(min_size=48, max_size=48), nonce=nonces, data=st.data(),
)
def test_outer_layer_has_one_size_per_round(round_id, mechanism, session, credential, nonce, data):
    """Every admission of a round encodes to the same length whatever its bytes, so every outer
    layer (admission + HPKE's 48 bytes) and every envelope of the round has one length too."""
    fmt = envelope_format(round_id, mechanism)
    assert fmt.sealed_size == report_format(round_id, mechanism).sealed_size
    sealed = data.draw(st.binary(min_size=fmt.sealed_size, max_size=fmt.sealed_size))
    admission = codec.encode(m.Admission(round_id, credential, nonce, sealed))
    assert len(admission) == fmt.admission_size
    assert fmt.outer_size == fmt.admission_size + HPKE_OVERHEAD <= m.MAX_OUTER_BYTES
    outer = data.draw(st.binary(min_size=fmt.outer_size, max_size=fmt.outer_size))
    assert len(codec.encode(m.Envelope(session, round_id, outer))) == fmt.size


# ---------------------------------------------------------------------------
# deterministic key order (the fast readers and the signing rule rely on it)
# ---------------------------------------------------------------------------

#: The order of the keys on the wire: shorter keys first, then bytewise (RFC 8949 §4.2.1).
KEY_ORDER = {
    m.Admission: ["t", "v", "nonce", "sealed", "round_id", "credential"],
    m.Envelope: ["t", "v", "outer", "round_id", "session_id"],
    m.ShuffledBatch: [
        "t", "v", "chunk", "total", "chunks", "batch_id", "payloads", "round_id", "signature", "session_id", "spec_digest",
    ],
    m.BatchAck: ["t", "v", "batch_id", "round_id", "signature", "session_id", "spec_digest"],
    m.AdmissionReceipts: ["t", "v", "reasons", "refused", "admitted", "round_id", "signature", "session_id", "spec_digest"],
    m.RoundOutcome: [
        "t", "v", "reason", "outcome", "admitted", "batch_id", "instance", "round_id", "signature", "session_id",
        "spec_digest",
    ],
}


@pytest.mark.parametrize("cls", list(KEY_ORDER), ids=lambda c: c.__name__)
def test_key_order_is_canonical(cls):
    msg = next(x for x in VALID if type(x) is cls)
    wire = codec.encode(msg)
    keys = list(cbor2.loads(wire))  # cbor2 keeps the order of the encoding
    assert keys == KEY_ORDER[cls]
    assert keys == sorted(keys, key=lambda k: (len(k.encode()), k.encode()))
    assert wire[0] == 0xA0 | len(keys)  # one map of that many pairs


def test_batch_chunk_layout_is_the_one_the_fast_reader_reads():
    """A chunk's encoding read by ``read_batch_chunk`` gives back its fields, and the digest it
    hashes in place (signature zeroed where it lies) is that of the re-encoded zeroed message."""
    import hashlib

    sid = bytes(range(16))
    for round_id, sealed_size in ((0, 1), (23, 24), (2**32, 256), (2**63 - 1, 1024)):
        for count, total, chunks, chunk in ((1, 1, 1, 0), (3, 7, 3, 2), (2, 2**24, 2**20, 5)):
            payloads = tuple(bytes([i]) * sealed_size for i in range(count))
            batch = m.ShuffledBatch(sid, round_id, bytes(32), bytes(range(16, 32)), chunk, chunks, total, payloads, bytes(range(64)))
            wire = codec.encode(batch)
            read = read_batch_chunk(wire, sid, round_id, bytes(32), sealed_size, m.MAX_BATCH)
            assert (read.batch_id, read.chunk, read.chunks, read.total, tuple(read.payloads), read.signature) == (
                batch.batch_id, chunk, chunks, total, payloads, batch.signature,
            )
            zeroed = codec.encode(dataclasses.replace(batch, signature=bytes(64)))
            assert read.digest == hashlib.sha256(zeroed).digest()
            at = wire.index(b"\x69signature\x58\x40") + 12  # the signature's 64 bytes: zeroed in place
            assert zeroed == wire[:at] + bytes(64) + wire[at + 64 :]


# ---------------------------------------------------------------------------
# out-of-domain values of the onion and signing messages
# ---------------------------------------------------------------------------

NEW_TYPE_BAD_VALUES = [
    (m.Admission, "credential", bytes(47)),
    (m.Admission, "credential", bytes(49)),
    (m.Admission, "nonce", bytes(15)),
    (m.Admission, "nonce", bytes(17)),
    (m.Admission, "sealed", b""),
    (m.Admission, "round_id", -1),
    (m.Admission, "round_id", 2**63),
    (m.Envelope, "outer", b""),
    (m.Envelope, "session_id", bytes(15)),
    (m.Envelope, "round_id", True, "simple values"),  # a boolean is not an integer: not even read
    (m.ShuffledBatch, "batch_id", bytes(15)),
    (m.ShuffledBatch, "signature", bytes(63)),
    (m.ShuffledBatch, "signature", bytes(65)),
    (m.ShuffledBatch, "chunk", 2),  # chunk == chunks
    (m.ShuffledBatch, "chunk", -1),
    (m.ShuffledBatch, "chunks", 0),
    (m.ShuffledBatch, "chunks", 6),  # chunks > total
    (m.ShuffledBatch, "total", 2, "payloads"),  # fewer than the chunk's payloads
    (m.ShuffledBatch, "total", 1, "chunks"),  # fewer than its chunks
    (m.ShuffledBatch, "total", m.MAX_BATCH + 1),
    (m.ShuffledBatch, "payloads", []),
    (m.ShuffledBatch, "payloads", [b"a", b""]),
    (m.ShuffledBatch, "payloads", [bytes(m.MAX_SEALED_BYTES + 1)]),
    (m.BatchAck, "batch_id", bytes(17)),
    (m.BatchAck, "signature", b""),
    (m.AdmissionReceipts, "admitted", [bytes(15)]),
    (m.AdmissionReceipts, "refused", [bytes(16)]),  # a refused nonce without its reason
    (m.AdmissionReceipts, "reasons", ["quota"]),  # fewer reasons than refused nonces
    (m.AdmissionReceipts, "reasons", ["quota", ""]),
    (m.AdmissionReceipts, "reasons", ["quota", "x" * 33]),
    (m.AdmissionReceipts, "reasons", ["quota", 5]),
    (m.RoundOutcome, "outcome", "served"),
    (m.RoundOutcome, "outcome", ""),
    (m.RoundOutcome, "reason", "x" * 33),
    (m.RoundOutcome, "admitted", -1),
    (m.RoundOutcome, "admitted", m.MAX_BATCH + 1),
    (m.RoundOutcome, "instance", m.MAX_SHUFFLER_INSTANCES),
    (m.RoundOutcome, "instance", -1),
    (m.RoundOutcome, "batch_id", bytes(0)),
    (m.RoundSpec, "shuffler_key", bytes(31)),
    (m.RoundSpec, "shuffler_signing_key", bytes(33)),
    (m.RoundSpec, "shuffler_instances", 0),
    (m.RoundSpec, "shuffler_instances", m.MAX_SHUFFLER_INSTANCES + 1),
    (m.RoundSpec, "max_batch", 9, "min_batch"),  # below min_batch
]


@pytest.mark.parametrize(
    "case", NEW_TYPE_BAD_VALUES, ids=[f"{c[0].__name__}.{c[1]}-{i}" for i, c in enumerate(NEW_TYPE_BAD_VALUES)]
)
def test_onion_and_signed_messages_refuse_out_of_domain_values(case):
    """Each case: (type, field, bad value[, what the refusal names: the field itself by default])."""
    cls, field, bad, names = (*case, case[1]) if len(case) == 3 else case
    msg = next(x for x in VALID if type(x) is cls)
    body = _body(msg)
    assert field in body
    body[field] = bad
    with pytest.raises(MalformedMessage, match=names):
        decode_strictly(cbor2.dumps(body, canonical=True), cls)


def test_legacy_envelope_fields_are_refused():
    """The pre-onion envelope (token, nonce and sealed report in the clear) is not an envelope of this wire version."""
    legacy = {"t": "envelope", "v": m.WIRE_VERSION, "session_id": bytes(16), "round_id": 1, "token": bytes(16),
              "nonce": bytes(16), "sealed": bytes(122)}
    with pytest.raises(MalformedMessage):
        decode_strictly(cbor2.dumps(legacy, canonical=True), m.Envelope)
    legacy["outer"] = bytes(200)
    with pytest.raises(MalformedMessage, match="unknown key"):
        decode_strictly(cbor2.dumps(legacy, canonical=True), m.Envelope)


# Generic fuzz: replace one field (top level or inside params) by an arbitrary CBOR value.
moderate_floats = st.one_of(
    st.floats(-1e6, -1e-6),
    st.floats(1e-6, 1e6),
    st.sampled_from([0.0, -0.0, float("nan"), float("inf"), float("-inf")]),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**64), 2**64),
    moderate_floats,
    st.text(max_size=20),
    st.binary(max_size=40),
)
cbor_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.text(max_size=10), st.integers()), inner, max_size=4)
    ),
    max_leaves=8,
)


@settings(max_examples=400, deadline=None)
@given(index=st.integers(0, len(VALID) - 1), which=st.integers(0, 100), value=cbor_values, nested=st.booleans())
def test_mutated_field_only_raises_malformed(index, which, value, nested):
    msg = VALID[index]
    body = _body(msg)
    target = body["params"] if nested and "params" in body else body
    keys = sorted(target)
    target[keys[which % len(keys)]] = value
    try:
        out = decode_strictly(cbor2.dumps(body, canonical=True), type(msg))
    except MalformedMessage:
        return
    assert type(out) is type(msg)


@settings(max_examples=150, deadline=None)
@given(index=st.integers(0, len(VALID) - 1), key=st.one_of(st.text(max_size=12), st.integers()), value=cbor_values)
def test_added_key_always_rejected(index, key, value):
    msg = VALID[index]
    body = _body(msg)
    if key in body:
        return
    body[key] = value
    with pytest.raises(MalformedMessage):
        decode_strictly(cbor2.dumps(body, canonical=True), type(msg))


# ---------------------------------------------------------------------------
# Regression tests: defects these tests found
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", [True, 1.0])
def test_version_must_be_an_integer(version):
    body = _body(VALID[3])
    body["v"] = version
    with pytest.raises(MalformedMessage):
        decode_strictly(cbor2.dumps(body, canonical=True), m.Report)


def test_trailing_bytes_rejected():
    wire = codec.encode(VALID[3])
    with pytest.raises(MalformedMessage):
        decode_strictly(wire + b"\x00", m.Report)


@pytest.mark.parametrize("field", ["epsilon0", "deadline"])
def test_huge_integer_in_float_field_is_malformed(field):
    body = _body(VALID[0])
    body[field] = 2**1100
    with pytest.raises(MalformedMessage):
        decode_strictly(cbor2.dumps(body, canonical=True), m.RoundSpec)


@pytest.mark.parametrize("low,high,tau", [(-1e308, 1e308, 1.0), (0.0, 1.0, 5e-324), (0.0, 1e10, 1e-300)])
def test_overflowing_bin_count_is_malformed(low, high, tau):
    body = _body(VALID[0])
    body["params"].update(low=low, high=high, tau=tau)
    with pytest.raises(MalformedMessage):
        decode_strictly(cbor2.dumps(body, canonical=True), m.RoundSpec)


def test_overflowing_bin_count_is_invalid_parameter():
    with pytest.raises(InvalidParameter):
        m.HadamardRangeParams(-1e308, 1e308, 1.0)
