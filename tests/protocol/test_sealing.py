"""Tests for HPKE sealing and Ed25519 signing (shuffledp.protocol.wire.sealing)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuffledp.protocol.wire import codec
from shuffledp.protocol.errors import BadSignature, InvalidParameter, SealingError
from shuffledp.protocol.wire.messages import HadamardRangeParams, RoundSpec
from shuffledp.protocol.wire.sealing import (
    INFO_LABEL,
    AnalyzerKeys,
    Sealer,
    open_sealed,
    report_info,
    sign,
    verify,
)

KEYS = AnalyzerKeys.generate()
OTHER_KEYS = AnalyzerKeys.generate()
SESSION = bytes(range(16))
OTHER_SESSION = bytes(range(1, 17))
PAYLOAD = b"a report payload: CBOR in practice"


def _sealed(payload=PAYLOAD, session=SESSION, round_id=3) -> bytes:
    return Sealer(KEYS.hpke_public).seal(payload, session, round_id, bytes(32))


def test_public_keys_are_raw_32_bytes():
    assert len(KEYS.hpke_public) == 32
    assert len(KEYS.signing_public) == 32
    assert KEYS.hpke_public != OTHER_KEYS.hpke_public


@settings(max_examples=40, deadline=None)
@given(payload=st.binary(max_size=300), round_id=st.integers(0, 2**63 - 1), session=st.binary(min_size=16, max_size=16))
def test_seal_open_round_trip(payload, round_id, session):
    sealed = Sealer(KEYS.hpke_public).seal(payload, session, round_id, bytes(32))
    # enc (32) + ciphertext + Poly1305 tag (16)
    assert len(sealed) == 32 + len(payload) + 16
    assert open_sealed(KEYS.hpke_private, sealed, session, round_id, bytes(32)) == payload


def test_sealing_is_randomized():
    a, b = _sealed(), _sealed()
    assert a != b  # fresh ephemeral key each time
    assert open_sealed(KEYS.hpke_private, a, SESSION, 3, bytes(32)) == open_sealed(KEYS.hpke_private, b, SESSION, 3, bytes(32)) == PAYLOAD


SEALED = _sealed()


@settings(max_examples=150, deadline=None)
@given(position=st.integers(0, len(SEALED) - 1), mask=st.integers(1, 255))
def test_any_single_byte_change_fails_to_open(position, mask):
    tampered = bytearray(SEALED)
    tampered[position] ^= mask
    with pytest.raises(SealingError):
        open_sealed(KEYS.hpke_private, bytes(tampered), SESSION, 3, bytes(32))


@pytest.mark.parametrize("position", range(len(SEALED)))
def test_every_position_flip_fails_to_open(position):
    tampered = bytearray(SEALED)
    tampered[position] ^= 0x01
    with pytest.raises(SealingError):
        open_sealed(KEYS.hpke_private, bytes(tampered), SESSION, 3, bytes(32))


@pytest.mark.parametrize("cut", [0, 1, 31, 32, 47, len(SEALED) - 1])
def test_truncated_or_extended_fails_to_open(cut):
    with pytest.raises(SealingError):
        open_sealed(KEYS.hpke_private, SEALED[:cut], SESSION, 3, bytes(32))
    with pytest.raises(SealingError):
        open_sealed(KEYS.hpke_private, SEALED + b"\x00", SESSION, 3, bytes(32))


@pytest.mark.parametrize("round_id", [0, 2, 4, 3 + 2**32, 2**63 - 1])
def test_wrong_round_fails(round_id):
    with pytest.raises(SealingError):
        open_sealed(KEYS.hpke_private, SEALED, SESSION, round_id, bytes(32))


def test_wrong_session_fails():
    with pytest.raises(SealingError):
        open_sealed(KEYS.hpke_private, SEALED, OTHER_SESSION, 3, bytes(32))


def test_wrong_spec_fails():
    """A report sealed under one spec of a round does not open under another spec of the same
    session and round (e.g. one a restarted analyzer signed with another epsilon0)."""
    with pytest.raises(SealingError):
        open_sealed(KEYS.hpke_private, SEALED, SESSION, 3, bytes([1]) + bytes(31))


def test_wrong_key_fails():
    with pytest.raises(SealingError):
        open_sealed(OTHER_KEYS.hpke_private, SEALED, SESSION, 3, bytes(32))


def test_info_binds_session_round_and_spec():
    digest = bytes(range(32))
    info = report_info(SESSION, 3, digest)
    assert info == INFO_LABEL + SESSION + (3).to_bytes(8, "big") + digest
    assert report_info(SESSION, 4, digest) != info and report_info(OTHER_SESSION, 3, digest) != info
    assert report_info(SESSION, 3, bytes(32)) != info
    with pytest.raises(InvalidParameter):
        report_info(bytes(15), 3, digest)
    with pytest.raises(InvalidParameter):
        report_info(SESSION, 3, digest[:31])


def test_sealer_rejects_bad_public_key():
    with pytest.raises(InvalidParameter):
        Sealer(b"short")


SPEC = RoundSpec(SESSION, 1, HadamardRangeParams(-1.0, 1.0, 0.25), 0.5, KEYS.hpke_public, bytes(32), bytes(range(32)), 10, 1e12)
SPEC_BYTES = codec.encode(SPEC)
SIGNATURE = sign(KEYS.signing_private, SPEC_BYTES)


def test_verify_accepts_good_signature():
    assert len(SIGNATURE) == 64
    verify(KEYS.signing_public, SPEC_BYTES, SIGNATURE)  # does not raise


def test_modified_spec_rejected():
    changed = codec.encode(RoundSpec(SESSION, 2, SPEC.params, 0.5, KEYS.hpke_public, bytes(32), bytes(range(32)), 10, 1e12))
    with pytest.raises(BadSignature):
        verify(KEYS.signing_public, changed, SIGNATURE)


@settings(max_examples=100, deadline=None)
@given(position=st.integers(0, len(SPEC_BYTES) - 1), mask=st.integers(1, 255))
def test_any_byte_change_of_spec_rejected(position, mask):
    data = bytearray(SPEC_BYTES)
    data[position] ^= mask
    with pytest.raises(BadSignature):
        verify(KEYS.signing_public, bytes(data), SIGNATURE)


@settings(max_examples=100, deadline=None)
@given(position=st.integers(0, 63), mask=st.integers(1, 255))
def test_any_byte_change_of_signature_rejected(position, mask):
    sig = bytearray(SIGNATURE)
    sig[position] ^= mask
    with pytest.raises(BadSignature):
        verify(KEYS.signing_public, SPEC_BYTES, bytes(sig))


def test_wrong_signer_and_malformed_inputs_rejected():
    with pytest.raises(BadSignature):
        verify(OTHER_KEYS.signing_public, SPEC_BYTES, SIGNATURE)
    with pytest.raises(BadSignature):
        verify(KEYS.signing_public, SPEC_BYTES, SIGNATURE[:63])
    with pytest.raises(BadSignature):
        verify(b"not a key", SPEC_BYTES, SIGNATURE)
    with pytest.raises(BadSignature):
        verify(KEYS.signing_public, SPEC_BYTES, os.urandom(64))
