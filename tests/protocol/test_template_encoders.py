"""The per-round template encoders write exactly the bytes of the general canonical encoder.

A client encodes its report, its admission and its envelope from fixed per-round
templates (``ReportFormat.encode_padded``, ``FixedLayout.build``, ``EnvelopeWrapper``);
the general encoder (``codec.encode``, a dataclass walk then canonical CBOR) defines
the format. For every mechanism, any round id and any values the format admits
(every CBOR integer width, both signs, the edges of the range), the two must agree
byte for byte; inputs the template does not cover must fall back to the general
encoder's result or its typed error.
"""

from __future__ import annotations

import os

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.wire import codec
from shuffledp.protocol.wire.messages import (
    CREDENTIAL_BYTES,
    MECHANISMS,
    NONCE_BYTES,
    Admission,
    Envelope,
    HadamardRangeParams,
    Report,
    RoundSpec,
)
from shuffledp.protocol.wire.onion import EnvelopeOpener, EnvelopeWrapper, FixedLayout, envelope_format, wrap
from shuffledp.protocol.wire.report_format import VALUE_LIMIT, ReportFormat
from shuffledp.protocol.wire.sealing import SUITE, public_bytes

#: Integers at every CBOR width boundary (1, 2, 3, 5, 9 bytes), both signs, and the format's edges.
EDGES = sorted({
    s * b + d
    for b in (0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**62 - 1)
    for s in (1, -1)
    for d in (-1, 0, 1)
    if -VALUE_LIMIT <= s * b + d < VALUE_LIMIT
})
value = st.one_of(st.sampled_from(EDGES), st.integers(-VALUE_LIMIT, VALUE_LIMIT - 1), st.integers(-2000, 5000))
round_ids = st.one_of(st.integers(0, 30), st.integers(0, 2**32), st.sampled_from([23, 24, 255, 256, 65535, 65536]))


@settings(max_examples=600, deadline=None)
@given(mechanism=st.sampled_from(sorted(MECHANISMS)), round_id=round_ids, data=st.data())
def test_report_template_is_the_general_encoding(mechanism, round_id, data):
    layout = ReportFormat(round_id, mechanism)
    values = tuple(data.draw(st.lists(value, min_size=layout.width, max_size=layout.width)))
    expected = layout.pad(codec.encode(Report(round_id, mechanism, values)))
    assert layout.encode_padded(values) == expected
    assert layout.values(expected) == values


def test_report_template_every_edge_value_in_every_position():
    for mechanism in sorted(MECHANISMS):
        layout = ReportFormat(7, mechanism)
        for v in EDGES:
            for position in range(layout.width):
                values = tuple(v if i == position else 1 for i in range(layout.width))
                assert layout.encode_padded(values) == layout.pad(codec.encode(Report(7, mechanism, values)))


@pytest.mark.parametrize("bad", [(True,), (1.0,), (VALUE_LIMIT,), (-VALUE_LIMIT - 1,), ()])
def test_report_template_refuses_what_the_general_encoder_refuses(bad):
    layout = ReportFormat(0, "projected-mean")
    if bad == ():
        values = (1, 2)  # the wrong count
    else:
        values = bad
    with pytest.raises(InvalidParameter):
        codec.encode(Report(0, "projected-mean", values))
    with pytest.raises(InvalidParameter):
        layout.encode_padded(values)


def _spec(round_id: int, shuffler_key: bytes, mechanism_params=None) -> RoundSpec:
    return RoundSpec(
        session_id=os.urandom(16), round_id=round_id, params=mechanism_params or HadamardRangeParams(-4.0, 4.0, 1.0),
        epsilon0=1.0, analyzer_key=os.urandom(32), shuffler_key=shuffler_key,
        shuffler_signing_key=os.urandom(32), min_batch=10, deadline=1e12,
    )


@settings(max_examples=300, deadline=None)
@given(
    round_id=round_ids,
    mechanism=st.sampled_from(sorted(MECHANISMS)),
    credential=st.binary(min_size=CREDENTIAL_BYTES, max_size=CREDENTIAL_BYTES),
    nonce=st.binary(min_size=NONCE_BYTES, max_size=NONCE_BYTES),
    session=st.binary(min_size=16, max_size=16),
    seed=st.integers(0, 2**32),
)
def test_admission_and_envelope_templates_are_the_general_encoding(round_id, mechanism, credential, nonce, session, seed):
    f = envelope_format(round_id, mechanism)
    sealed = os.urandom(f.sealed_size)
    admission = FixedLayout(
        Admission(round_id, bytes(CREDENTIAL_BYTES), bytes(NONCE_BYTES), bytes(f.sealed_size)), ("credential", "nonce", "sealed"))
    assert admission.build(credential, nonce, sealed) == codec.encode(Admission(round_id, credential, nonce, sealed))
    outer = os.urandom(f.outer_size)
    envelope = FixedLayout(Envelope(session, round_id, bytes(f.outer_size)), ("outer",))
    assert envelope.build(outer) == codec.encode(Envelope(session, round_id, outer))
    # Reading a message of the layout gives back its fields, in the given order.
    encoded = admission.build(credential, nonce, sealed)
    assert admission.values(encoded) == (credential, nonce, sealed)
    assert envelope.values(envelope.build(outer)) == (outer,)
    # A message not of the layout (a changed fixed byte, another length) reads as None.
    for other in (encoded[:-1], encoded + b"\0", bytes([encoded[0] ^ 1]) + encoded[1:]):
        assert admission.values(other) is None
    # Another length is not the round's layout: no template bytes.
    assert admission.build(credential, nonce, sealed + b"\0") is None
    assert envelope.build(outer[:-1]) is None
    assert admission.build(credential, nonce, bytearray(sealed)) is None


def test_wrapper_matches_wrap_and_opens():
    private = X25519PrivateKey.generate()
    spec = _spec(5, public_bytes(private.public_key()))
    wrapper = EnvelopeWrapper(spec)
    opener = EnvelopeOpener(private, spec)
    sealed_size = envelope_format(spec.round_id, spec.mechanism).sealed_size
    for _ in range(200):
        credential, sealed, nonce = os.urandom(CREDENTIAL_BYTES), os.urandom(sealed_size), os.urandom(NONCE_BYTES)
        ours, our_nonce = wrapper.wrap(credential, sealed, nonce)
        theirs, _ = wrap(spec, credential, sealed, nonce)
        assert our_nonce == nonce
        assert len(ours) == len(theirs) == envelope_format(spec.round_id, spec.mechanism).size
        assert ours != theirs  # a fresh HPKE encapsulation each time
        # Same structure: the general decoder reads both; the outer layer opens to the general encoding.
        envelope = codec.decode(ours, Envelope)
        assert (envelope.session_id, envelope.round_id) == (spec.session_id, spec.round_id)
        plaintext = SUITE.decrypt(envelope.outer, private, info=opener._info)
        assert plaintext == codec.encode(Admission(spec.round_id, credential, nonce, sealed))
        assert opener.open(ours) == Admission(spec.round_id, credential, nonce, sealed)
    # A fresh nonce each call when none is given (across the wrapper's reads of the OS CSPRNG).
    nonces = [wrapper.wrap(os.urandom(CREDENTIAL_BYTES), os.urandom(sealed_size))[1] for _ in range(3 * 256 + 5)]
    assert len(set(nonces)) == len(nonces) and all(len(nonce) == NONCE_BYTES for nonce in nonces)
    # Outside the round's lengths: the general encoder's typed error.
    with pytest.raises(InvalidParameter):
        wrapper.wrap(os.urandom(CREDENTIAL_BYTES - 1), os.urandom(sealed_size))


def test_a_wrapper_shared_by_threads_hands_out_each_nonce_once():
    from concurrent.futures import ThreadPoolExecutor

    private = X25519PrivateKey.generate()
    spec = _spec(1, public_bytes(private.public_key()))
    wrapper = EnvelopeWrapper(spec)
    sealed = os.urandom(envelope_format(spec.round_id, spec.mechanism).sealed_size)
    credential = os.urandom(CREDENTIAL_BYTES)
    with ThreadPoolExecutor(8) as pool:
        batches = list(pool.map(lambda _: [wrapper._fresh_nonce() for _ in range(2000)], range(8)))
    nonces = [nonce for batch in batches for nonce in batch]
    assert len(set(nonces)) == len(nonces) == 16000
    assert wrapper.wrap(credential, sealed)[1] not in set(nonces)
