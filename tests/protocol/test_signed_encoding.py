"""Signed messages encoded once and checked where they lie (``protocol/wire/onion.py``).

:func:`signed_encoding` must give exactly ``codec.encode(signed(...))``, and :func:`decode_verified`,
which hashes the received bytes with their signature zeroed in place, must accept exactly what the
re-encoding check accepts: every genuine message, and nothing with a byte changed. The field's head
planted inside another field (a session id an analyzer chose) must not move where the signature is read.
"""

import importlib.util
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from shuffledp.protocol.errors import BadSignature, MalformedMessage, ShuffleDPError
from shuffledp.protocol.wire import codec
from shuffledp.protocol.wire import messages as m
from shuffledp.protocol.wire.onion import (
    _SIGNATURE_FIELD,
    decode_verified,
    signed,
    signed_encoding,
    verify_signed,
)

_spec = importlib.util.spec_from_file_location("make_vectors", Path(__file__).parent / "vectors" / "make_vectors.py")
vectors = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("make_vectors", vectors)
_spec.loader.exec_module(vectors)

SIGNED = vectors.signed_messages()
SHUFFLER = vectors.shuffler_keys()


def _unsigned(message):
    import dataclasses

    return dataclasses.replace(message, signature=bytes(64))


@pytest.mark.parametrize("name, message, key", SIGNED, ids=[name for name, _, _ in SIGNED])
def test_one_encoding_gives_the_bytes_of_encoding_the_signed_message(name, message, key):
    unsigned = _unsigned(message)
    assert signed_encoding(key, unsigned) == codec.encode(signed(key, unsigned))
    # a message that already carries a signature is signed anew, as signed() does
    assert signed_encoding(key, message) == codec.encode(signed(key, message))


@pytest.mark.parametrize("name, message, key", SIGNED, ids=[name for name, _, _ in SIGNED])
def test_a_genuine_message_decodes_and_verifies(name, message, key):
    data = codec.encode(message)
    public = key.public_key().public_bytes_raw()
    assert decode_verified(data, type(message), public) == message
    assert decode_verified(bytearray(data), type(message), public) == message


@pytest.mark.parametrize("name, message, key", SIGNED, ids=[name for name, _, _ in SIGNED])
def test_every_changed_byte_is_refused(name, message, key):
    """Each single-byte change of a genuine encoding: refused, as the re-encoding check refuses it."""
    data = codec.encode(message)
    public = key.public_key().public_bytes_raw()
    for position in range(len(data)):
        changed = bytearray(data)
        changed[position] ^= 0x01
        with pytest.raises(ShuffleDPError) as raised:
            decode_verified(bytes(changed), type(message), public)
        assert isinstance(raised.value, (BadSignature, MalformedMessage))


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.integers(0, 5), st.binary(min_size=0, max_size=5))
def test_the_field_head_inside_the_session_id_moves_nothing(offset, rest):
    """A session id holding the signature field's head (an analyzer picks session ids): the encoding is
    still exactly the general one, it verifies, and a forged signature in the planted place does not."""
    session = (bytes(offset) + _SIGNATURE_FIELD + rest).ljust(16, b"\x07")[:16]
    key = SHUFFLER.signing_private
    public = SHUFFLER.signing_public
    message = m.RoundOutcome(session, 2, bytes(range(32)), "released", "", 9, bytes(16))
    data = signed_encoding(key, message)
    assert data == codec.encode(signed(key, message))
    decoded = decode_verified(data, m.RoundOutcome, public)
    verify_signed(public, decoded)
    with pytest.raises(BadSignature):
        decode_verified(codec.encode(m.RoundOutcome(session, 2, bytes(range(32)), "released", "", 10, bytes(16), 0,
                                                    decoded.signature)), m.RoundOutcome, public)


def test_a_payload_holding_the_field_head_is_encoded_and_verified_as_ever():
    """A client controls its sealed payload's bytes: one that spells the signature field's head
    cannot make a batch chunk's signature be written or read elsewhere."""
    key, public = SHUFFLER.signing_private, SHUFFLER.signing_public
    sealed = (_SIGNATURE_FIELD + bytes(64)).ljust(vectors.SEALED_SIZE, b"\x01")[: vectors.SEALED_SIZE]
    chunk = m.ShuffledBatch(vectors.SESSION, 0, bytes(32), bytes(16), 0, 1, 2, (sealed, bytes([9]) * vectors.SEALED_SIZE))
    data = signed_encoding(key, chunk)
    assert data == codec.encode(signed(key, chunk))
    assert decode_verified(data, m.ShuffledBatch, public).payloads == chunk.payloads
