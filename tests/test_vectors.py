"""The committed JSON test vectors still describe this build's wire format exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from shuffledp.protocol import codec
from shuffledp.protocol.errors import BadSignature, MalformedMessage
from shuffledp.protocol.messages import Report
from shuffledp.protocol.report_format import report_format
from shuffledp.protocol.sealing import open_sealed, report_info, verify

VECTORS = Path(__file__).parent / "vectors"
CODEC = json.loads((VECTORS / "codec.json").read_text())


def _from_json(value):
    if isinstance(value, dict) and set(value) == {"hex"}:
        return bytes.fromhex(value["hex"])
    if isinstance(value, dict):
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


@pytest.mark.parametrize("vector", CODEC, ids=[v["name"] for v in CODEC])
def test_codec_vector_decodes_to_its_fields_and_reencodes_identically(vector):
    data = bytes.fromhex(vector["cbor_hex"])
    message = codec.decode(data)
    assert codec._TYPE_OF[type(message)] == vector["type"]
    assert codec.encode(message) == data
    assert _lists_to_tuples(codec._to_wire(message)) == _lists_to_tuples(_from_json(vector["fields"]))


def _lists_to_tuples(value):
    if isinstance(value, dict):
        return {k: _lists_to_tuples(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return tuple(_lists_to_tuples(v) for v in value)
    return value


def test_sealing_vector_opens_to_its_plaintext():
    v = json.loads((VECTORS / "sealing.json").read_text())
    session = bytes.fromhex(v["session_id_hex"])
    assert report_info(session, v["round_id"]).hex() == v["info_hex"]
    private = X25519PrivateKey.from_private_bytes(bytes.fromhex(v["recipient_private_key_hex"]))
    opened = open_sealed(private, bytes.fromhex(v["sealed_hex"]), session, v["round_id"])
    assert opened.hex() == v["plaintext_hex"]
    # the plaintext is the report followed by zeros up to the round's fixed size
    report = bytes.fromhex(v["report_hex"])
    assert len(opened) == v["padded_size"] == report_format(v["round_id"], "hadamard-range").size
    assert opened == report + bytes(len(opened) - len(report))
    assert codec.decode_padded(opened, Report) == codec.decode(report, Report)


REFUSED = json.loads((VECTORS / "refused.json").read_text())


@pytest.mark.parametrize("vector", REFUSED, ids=[v["name"] for v in REFUSED])
def test_refused_vectors_are_refused(vector):
    with pytest.raises(MalformedMessage, match=vector["names"]):
        codec.decode(bytes.fromhex(vector["hex"]))


def test_signing_vector_verifies_and_a_changed_message_does_not():
    v = json.loads((VECTORS / "signing.json").read_text())
    public, message, signature = (bytes.fromhex(v[k]) for k in ("public_key_hex", "message_hex", "signature_hex"))
    assert verify(public, message, signature) is None  # raises BadSignature on failure
    with pytest.raises(BadSignature):
        verify(public, message[:-1] + bytes([message[-1] ^ 1]), signature)
