"""The committed JSON test vectors still describe this build's wire format exactly."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from shuffledp.protocol.wire import codec
from shuffledp.protocol.wire.credentials import CredentialIssuer
from shuffledp.protocol.errors import BadSignature, MalformedMessage, SealingError
from shuffledp.protocol.wire.messages import Admission, Envelope, Report, RoundSpec, ShuffledBatch, SignedRoundSpec
from shuffledp.protocol.wire.onion import (
    SIGNED_LABEL,
    EnvelopeOpener,
    envelope_format,
    envelope_info,
    verified_spec,
    verify_encoded,
    verify_signed,
)
from shuffledp.protocol.wire.report_format import read_batch_chunk, report_format
from shuffledp.protocol.wire.sealing import SUITE, open_sealed, report_info, verify

VECTORS = Path(__file__).parent / "vectors"
CODEC = json.loads((VECTORS / "codec.json").read_text())
SIGNING = json.loads((VECTORS / "signing.json").read_text())
SIGNED_MESSAGES = SIGNING["signed_messages"]


def _from_json(value):
    if isinstance(value, dict) and set(value) == {"hex"}:
        return bytes.fromhex(value["hex"])
    if isinstance(value, dict):
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def test_every_wire_type_has_a_codec_vector():
    assert {v["type"] for v in CODEC} == set(codec.MESSAGE_TYPES)


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


def _range_spec() -> RoundSpec:
    """The round-0 spec whose signature signing.json gives (the spec of the sealing and onion vectors)."""
    signing = json.loads((VECTORS / "signing.json").read_text())
    spec_bytes = bytes.fromhex(signing["message_hex"])
    assert bytes.fromhex(signing["spec_digest_hex"]) == hashlib.sha256(b"shuffledp/v3/spec" + spec_bytes).digest()
    return codec.decode(spec_bytes, RoundSpec)


def test_sealing_vector_opens_to_its_plaintext():
    v = json.loads((VECTORS / "sealing.json").read_text())
    session, digest = bytes.fromhex(v["session_id_hex"]), bytes.fromhex(v["spec_digest_hex"])
    assert digest == _range_spec().digest  # the round spec of signing.json
    assert report_info(session, v["round_id"], digest).hex() == v["info_hex"]
    assert v["info_hex"] == (b"shuffledp/v3/report" + session + v["round_id"].to_bytes(8, "big") + digest).hex()
    private = X25519PrivateKey.from_private_bytes(bytes.fromhex(v["recipient_private_key_hex"]))
    opened = open_sealed(private, bytes.fromhex(v["sealed_hex"]), session, v["round_id"], digest)
    assert opened.hex() == v["plaintext_hex"]
    # the plaintext is the report followed by zeros up to the round's fixed size
    report = bytes.fromhex(v["report_hex"])
    assert len(opened) == v["padded_size"] == report_format(v["round_id"], "hadamard-range").size
    assert opened == report + bytes(len(opened) - len(report))
    assert codec.decode_padded(opened, Report) == codec.decode(report, Report)


def test_onion_vector_opens_layer_by_layer():
    """envelope --(shuffler key)--> admission --(credential checked)--> sealed --(analyzer key)--> report."""
    v = json.loads((VECTORS / "onion.json").read_text())
    sealing = json.loads((VECTORS / "sealing.json").read_text())
    session, round_id = bytes.fromhex(v["session_id_hex"]), v["round_id"]
    digest = bytes.fromhex(v["spec_digest_hex"])
    assert envelope_info(session, round_id, digest).hex() == v["info_hex"]
    assert v["info_hex"] == (b"shuffledp/v3/envelope" + session + round_id.to_bytes(8, "big") + digest).hex()
    data = bytes.fromhex(v["envelope_hex"])
    envelope = codec.decode(data, Envelope)
    assert (envelope.session_id, envelope.round_id) == (session, round_id)
    private = X25519PrivateKey.from_private_bytes(bytes.fromhex(v["recipient_private_key_hex"]))
    admission_bytes = SUITE.decrypt(envelope.outer, private, info=bytes.fromhex(v["info_hex"]))
    assert admission_bytes.hex() == v["admission_hex"]
    admission = codec.decode(admission_bytes, Admission)
    assert (admission.round_id, admission.nonce.hex(), admission.sealed.hex()) == (round_id, v["nonce_hex"], v["sealed_hex"])
    # the credential is the issuer's for that client id
    assert admission.credential.hex() == v["credential_hex"]
    issuer = CredentialIssuer(bytes.fromhex(v["issuer_key_hex"]))
    assert issuer.verify(admission.credential).hex() == v["client_id_hex"]
    # the sealed report inside is the inner layer of sealing.json
    assert v["sealed_hex"] == sealing["sealed_hex"]
    # every length is the round's fixed one
    fmt = envelope_format(round_id, v["mechanism"])
    assert v["sizes"] == {
        "sealed": fmt.sealed_size, "admission": fmt.admission_size, "outer": fmt.outer_size, "envelope": fmt.size,
    }
    assert (len(admission.sealed), len(admission_bytes), len(envelope.outer), len(data)) == tuple(v["sizes"].values())
    # and the shuffler's own opener reads it the same way, under the round's spec and no other
    spec = _range_spec()
    assert (spec.session_id, spec.round_id, spec.digest) == (session, round_id, digest)
    assert EnvelopeOpener(private, spec).open(data) == admission
    with pytest.raises(SealingError):
        EnvelopeOpener(private, dataclasses.replace(spec, epsilon0=8.0)).open(data)


def test_onion_vector_does_not_open_for_another_round_or_with_a_changed_byte():
    v = json.loads((VECTORS / "onion.json").read_text())
    private = X25519PrivateKey.from_private_bytes(bytes.fromhex(v["recipient_private_key_hex"]))
    envelope = codec.decode(bytes.fromhex(v["envelope_hex"]), Envelope)
    session = bytes.fromhex(v["session_id_hex"])
    with pytest.raises(InvalidTag):  # the outer layer is bound to session and round
        SUITE.decrypt(envelope.outer, private, info=envelope_info(session, v["round_id"] + 1, bytes.fromhex(v["spec_digest_hex"])))
    with pytest.raises(InvalidTag):  # and to the exact spec
        SUITE.decrypt(envelope.outer, private, info=envelope_info(session, v["round_id"], bytes(32)))
    tampered = envelope.outer[:-1] + bytes([envelope.outer[-1] ^ 1])
    with pytest.raises(InvalidTag):
        SUITE.decrypt(tampered, private, info=bytes.fromhex(v["info_hex"]))


REFUSED = json.loads((VECTORS / "refused.json").read_text())


@pytest.mark.parametrize("vector", REFUSED, ids=[v["name"] for v in REFUSED])
def test_refused_vectors_are_refused(vector):
    with pytest.raises(MalformedMessage, match=vector["names"]):
        codec.decode(bytes.fromhex(vector["hex"]))


@pytest.mark.parametrize(
    "tag", ["admission", "envelope", "shuffled-batch", "batch-ack", "admission-receipts", "round-outcome"]
)
def test_refused_vectors_cover_the_onion_and_signed_message_types(tag):
    """At least one refusal of a message of each new type (its type tag is in the bytes)."""
    mine = [bytes.fromhex(v["hex"]) for v in REFUSED if v["name"].startswith(tag + "-")]
    assert mine and all(tag.encode() in data for data in mine)


def test_signing_vector_verifies_and_a_changed_message_does_not():
    v = SIGNING
    public, message, signature = (bytes.fromhex(v[k]) for k in ("public_key_hex", "message_hex", "signature_hex"))
    signed_string = bytes.fromhex(v["spec_signed_string_hex"])
    assert signed_string == b"shuffledp/v3/signed/round-spec" + hashlib.sha256(message).digest()
    assert verify(public, signed_string, signature) is None  # plain Ed25519 over the signed string
    verified_spec(SignedRoundSpec(message, signature), public)  # and the library's check agrees
    changed = message[:-1] + bytes([message[-1] ^ 1])
    with pytest.raises(BadSignature):
        verify(public, b"shuffledp/v3/signed/round-spec" + hashlib.sha256(changed).digest(), signature)
    with pytest.raises(BadSignature):  # the spec bytes alone, without the label, are not what was signed
        verify(public, message, signature)


def test_every_signed_message_type_has_a_signing_vector():
    assert {v["type"] for v in SIGNED_MESSAGES} == {"shuffled-batch", "batch-ack", "admission-receipts", "round-outcome"}
    assert SIGNING["signed_label"] == SIGNED_LABEL.decode() == "shuffledp/v3/signed/"


@pytest.mark.parametrize("vector", SIGNED_MESSAGES, ids=[v["name"] for v in SIGNED_MESSAGES])
def test_signed_message_vector_follows_the_signing_rule(vector):
    """signature = Ed25519(key, "shuffledp/v3/signed/" || type tag || SHA-256(encoding with the signature zeroed))."""
    public = bytes.fromhex(vector["public_key_hex"])
    data = bytes.fromhex(vector["message_hex"])
    message = codec.decode(data)
    assert codec._TYPE_OF[type(message)] == vector["type"]
    assert message.signature.hex() == vector["signature_hex"]
    # the zeroed encoding is the encoding with the 64 signature bytes zeroed where they lie
    zeroed = bytes.fromhex(vector["zeroed_hex"])
    at = data.index(bytes.fromhex(vector["signature_hex"]))
    assert zeroed == data[:at] + bytes(64) + data[at + 64 :]
    assert hashlib.sha256(zeroed).hexdigest() == vector["digest_hex"]
    signed_string = SIGNED_LABEL + vector["type"].encode() + bytes.fromhex(vector["digest_hex"])
    assert signed_string.hex() == vector["signed_string_hex"]
    assert verify(public, signed_string, message.signature) is None  # plain Ed25519 over the signed string
    verify_signed(public, message)  # and the library's check agrees
    verify_encoded(public, type(message), bytes.fromhex(vector["digest_hex"]), message.signature)
    # a signature is bound to its type: the same digest under another type's label does not verify
    for other in {cls for cls, _ in codec.MESSAGE_TYPES.values()} - {type(message)}:
        with pytest.raises(BadSignature):
            verify_encoded(public, other, bytes.fromhex(vector["digest_hex"]), message.signature)
    # and to every byte of the message
    flipped = bytearray(zeroed)
    flipped[len(flipped) // 3] ^= 1
    with pytest.raises(BadSignature):
        verify_encoded(public, type(message), hashlib.sha256(bytes(flipped)).digest(), message.signature)


@pytest.mark.parametrize(
    "vector", [v for v in SIGNED_MESSAGES if v["type"] == "shuffled-batch"], ids=lambda v: v["name"]
)
def test_batch_chunk_vector_is_read_in_place_by_the_fast_reader(vector):
    """The analyzer hashes a chunk where it lies, signature zeroed in place: the same digest."""
    data = bytes.fromhex(vector["message_hex"])
    batch = codec.decode(data, ShuffledBatch)
    sealed_size = len(batch.payloads[0])
    chunk = read_batch_chunk(data, batch.session_id, batch.round_id, batch.spec_digest, sealed_size, batch.total)
    assert chunk.digest.hex() == vector["digest_hex"]
    assert (chunk.batch_id, chunk.chunk, chunk.chunks, chunk.total) == (batch.batch_id, batch.chunk, batch.chunks, batch.total)
    assert tuple(chunk.payloads) == batch.payloads and chunk.signature == batch.signature
    verify_encoded(bytes.fromhex(vector["public_key_hex"]), ShuffledBatch, chunk.digest, chunk.signature)


def test_every_mechanism_has_a_spec_and_a_report_vector():
    from shuffledp.protocol.wire.messages import MECHANISMS

    spec_mechanisms = {v["fields"]["params"]["mechanism"] for v in CODEC if v["type"] == "round-spec"}
    report_mechanisms = {v["fields"]["mechanism"] for v in CODEC if v["type"] == "report"}
    assert spec_mechanisms == report_mechanisms == set(MECHANISMS)
