"""Regenerate the JSON test vectors in this folder: ``python tests/protocol/vectors/make_vectors.py``.

The vectors pin the wire format for implementations in other languages:

* ``codec.json``: each message as JSON-friendly fields (bytes as hex) and its exact CBOR
  encoding: every wire type, the onion envelope (with a real outer layer), its admission,
  signed batch chunks, a signed batch acknowledgement, signed receipts and outcomes;
* ``sealing.json``: the inner layer: an X25519 private key, HPKE ``info`` and a sealed
  report that must open to the given padded plaintext (HPKE sealing is randomized, so
  only opening is reproducible);
* ``onion.json``: the outer layer: the shuffler's X25519 private key, the envelope's HPKE
  ``info``, an encoded envelope whose outer layer must open to the given admission,
  whose ``sealed`` is the inner layer of ``sealing.json``, under a credential the given
  issuer key verifies;
* ``signing.json``: an Ed25519 key seed, a round spec and its (deterministic) signature
  over ``"shuffledp/v3/signed/round-spec" || SHA-256(spec bytes)``,
  and for each signed message type the signing rule step by step: the encoding with the
  signature zeroed, its SHA-256, the signed string
  ``"shuffledp/v3/signed/" || type tag || digest`` and the signature, and the round
  spec's digest ``SHA-256("shuffledp/v3/spec" || spec bytes)``, which the HPKE ``info``
  of both layers and every signed message of the round carry;
* ``refused.json``: encodings a decoder must refuse (hostile CBOR features,
  non-deterministic forms, and messages of each type out of their domain), each with
  the rule it breaks and a pattern the refusal's message matches.

Keys here are test keys, fixed by seeds written in this file; never use them for real.
Regenerating rewrites every file; the HPKE ciphertexts (``sealing.json``, ``onion.json``
and the envelope of ``codec.json``) change, everything else is reproduced byte for byte.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import cbor2
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from shuffledp.protocol.wire import codec
from shuffledp.protocol.wire import messages as m
from shuffledp.protocol.wire.credentials import CredentialIssuer
from shuffledp.protocol.wire.onion import (
    SIGNED_LABEL,
    ShufflerKeys,
    envelope_info,
    sign_spec_bytes,
    signed,
    spec_signing_string,
    wrap,
)
from shuffledp.protocol.wire.report_format import report_format
from shuffledp.protocol.wire.sealing import Sealer, public_bytes, report_info

HERE = Path(__file__).parent
SESSION = bytes(range(16))
#: RFC 7748 §6.1 (Alice's private key) and RFC 8032 §7.1 test 1: the analyzer's test keys.
ANALYZER_X25519 = bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
ANALYZER_ED25519_SEED = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
#: RFC 7748 §6.1 (Bob's private key) and RFC 8032 §7.1 test 2: the shuffler's test keys.
SHUFFLER_X25519 = bytes.fromhex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb")
SHUFFLER_ED25519_SEED = bytes.fromhex("4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb")
#: The shuffler's Ed25519 public key (RFC 8032 §7.1 test 2): a usable signing key for refused
#: specs, so each breaks only its own rule (all zeros would be a small-order point, also refused).
SHUFFLER_ED25519_PUBLIC = Ed25519PrivateKey.from_private_bytes(SHUFFLER_ED25519_SEED).public_key().public_bytes_raw()
#: The credential issuer's test key, and the enrolled client of the vectors.
ISSUER_KEY = bytes(range(0xA0, 0xC0))
CLIENT_ID = bytes.fromhex("c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1")
NONCE = bytes.fromhex("0f0e0d0c0b0a09080706050403020100")
BATCH_ID = bytes.fromhex("b0b1b2b3b4b5b6b7b8b9babbbcbdbebf")
#: A spec digest for the refused vectors (any 32 bytes: they are refused for another field).
SPEC_DIGEST = bytes(range(0x40, 0x60))

#: Sealed size of round 0's hadamard-range reports (the padded report plus 48 bytes of HPKE).
SEALED_SIZE = report_format(0, "hadamard-range").sealed_size


def _message(tag: str, **fields) -> str:
    """The canonical CBOR (hex) of a map with ``v``, ``t`` and ``fields``: any shape, valid or not."""
    return cbor2.dumps({"v": m.WIRE_VERSION, "t": tag, **fields}, canonical=True).hex()


def _batch_fields(**changes) -> dict:
    fields = dict(session_id=SESSION, round_id=0, spec_digest=SPEC_DIGEST, batch_id=BATCH_ID, chunk=0, chunks=1, total=2,
                  payloads=[bytes([1]) * SEALED_SIZE, bytes([2]) * SEALED_SIZE], signature=bytes(64))
    fields.update(changes)
    return fields


def _non_shortest_total() -> str:
    """A batch chunk whose ``total`` is written in two bytes (``18 02``) instead of one (``02``)."""
    good = bytes.fromhex(_message("shuffled-batch", **_batch_fields()))
    key = b"\x65total"
    at = good.index(key) + len(key)
    assert good[at] == 0x02
    return (good[:at] + b"\x18\x02" + good[at + 1 :]).hex()


#: (name, hex, rule, what the refusal names): each must be refused by a conforming decoder.
REFUSED = [
    ("tag-bignum-round-id", "a168726f756e645f6964c25901f4" + "ff" * 500, "no tags (a 4,000-bit bignum)", "tags"),
    ("shared-reference", "d81ca1d81d0000", "no tags (value sharing, tags 28/29)", "tags"),
    ("indefinite-map", "bf617402ff", "definite lengths only", "indefinite"),
    ("duplicate-key", "a2617402617402", "map keys strictly increasing (no duplicates)", "increasing"),
    ("unsorted-keys", "a2617602617401", "map keys strictly increasing", "increasing"),
    ("non-shortest-int", "a161741802", "integers in shortest form", "shortest form"),
    ("nan", "a16174f97e00", "no NaN or infinities", "NaN"),
    ("double-for-half", "a16174fb3ff0000000000000", "floats in shortest exact form", "shortest exact"),
    ("true", "a16174f5", "no simple values", "simple values"),
    ("array-longer-than-input", "9b000000010000000000", "a length never exceeds the bytes that remain", "remain"),
    # the onion and signing messages, out of their domain
    (
        "envelope-with-clear-fields",
        _message("envelope", session_id=SESSION, round_id=0, token=bytes(16), nonce=bytes(16), sealed=bytes(SEALED_SIZE)),
        "an envelope is session, round and outer layer only: no credential, nonce or report in the clear",
        "unknown key",
    ),
    ("envelope-empty-outer", _message("envelope", session_id=SESSION, round_id=0, outer=b""),
     "the outer layer is 1..2048 bytes", "outer"),
    ("envelope-outer-too-long", _message("envelope", session_id=SESSION, round_id=0, outer=bytes(2049)),
     "the outer layer is 1..2048 bytes", "outer"),
    ("admission-short-credential",
     _message("admission", round_id=0, credential=bytes(47), nonce=NONCE, sealed=bytes(SEALED_SIZE)),
     "a credential is 48 bytes", "credential"),
    ("admission-long-nonce",
     _message("admission", round_id=0, credential=bytes(48), nonce=bytes(17), sealed=bytes(SEALED_SIZE)),
     "a nonce is 16 bytes", "nonce"),
    ("shuffled-batch-chunk-out-of-range", _message("shuffled-batch", **_batch_fields(chunk=1)),
     "chunk < chunks", "chunk"),
    ("shuffled-batch-more-chunks-than-reports", _message("shuffled-batch", **_batch_fields(chunks=3)),
     "chunks <= total", "chunks"),
    ("shuffled-batch-more-payloads-than-total", _message("shuffled-batch", **_batch_fields(total=1)),
     "a chunk holds at most total payloads", "payloads"),
    ("shuffled-batch-empty", _message("shuffled-batch", **_batch_fields(payloads=[])),
     "a chunk holds at least one payload", "payloads"),
    ("shuffled-batch-short-batch-id", _message("shuffled-batch", **_batch_fields(batch_id=bytes(15))),
     "a batch id is 16 bytes", "batch_id"),
    ("shuffled-batch-short-spec-digest", _message("shuffled-batch", **_batch_fields(spec_digest=bytes(31))),
     "a spec digest is 32 bytes", "spec_digest"),
    ("shuffled-batch-non-shortest-total", _non_shortest_total(),
     "integers in shortest form (the fast chunk reader relies on it)", "shortest form"),
    ("batch-ack-short-signature",
     _message("batch-ack", session_id=SESSION, round_id=0, spec_digest=SPEC_DIGEST, batch_id=BATCH_ID, signature=bytes(63)),
     "a signature is 64 bytes", "signature"),
    ("admission-receipts-reason-missing",
     _message("admission-receipts", session_id=SESSION, round_id=0, spec_digest=SPEC_DIGEST, admitted=[], refused=[NONCE], reasons=[],
              signature=bytes(64)),
     "one reason per refused nonce", "reasons"),
    ("admission-receipts-reason-too-long",
     _message("admission-receipts", session_id=SESSION, round_id=0, spec_digest=SPEC_DIGEST, admitted=[], refused=[NONCE], reasons=["x" * 33],
              signature=bytes(64)),
     "a reason is 1..32 characters", "reasons"),
    ("admission-receipts-short-nonce",
     _message("admission-receipts", session_id=SESSION, round_id=0, spec_digest=SPEC_DIGEST, admitted=[bytes(15)], refused=[], reasons=[],
              signature=bytes(64)),
     "a nonce is 16 bytes", "admitted"),
    ("round-outcome-unknown-outcome",
     _message("round-outcome", session_id=SESSION, round_id=0, spec_digest=SPEC_DIGEST, outcome="served", reason="", admitted=2,
              batch_id=BATCH_ID, instance=0, signature=bytes(64)),
     'an outcome is "released" or "failed"', "outcome"),
    ("round-spec-modular-sum-too-few-shares",
     _message("round-spec", session_id=SESSION, round_id=2, epsilon0=1.0, delta0=1e-6, analyzer_key=bytes(32),
              shuffler_key=bytes(32), shuffler_signing_key=SHUFFLER_ED25519_PUBLIC, min_batch=30_000, deadline=1_900_000_000.0,
              messages_per_user=3, max_batch=30_000, shuffler_instances=1,
              params={"mechanism": "modular-sum", "lower": 0.0, "upper": 1.0, "precision": 100,
                      "modulus": 2_000_003, "messages": 3, "users": 10_000, "noise": "polya"}),
     "a summation spec must deliver its central (epsilon0, delta0): 3 shares mod 2000003 from 10^4 users do not",
     "messages"),
    ("round-outcome-instance-out-of-range",
     _message("round-outcome", session_id=SESSION, round_id=0, spec_digest=SPEC_DIGEST, outcome="released", reason="", admitted=2,
              batch_id=BATCH_ID, instance=64, signature=bytes(64)),
     "an instance is 0..63", "instance"),
]


def jsonable(value):
    """A message's wire body (``codec._to_wire``) with bytes as ``{"hex": ...}`` for JSON."""
    return _hexify(codec._to_wire(value))


def _hexify(value):
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    if isinstance(value, dict):
        return {k: _hexify(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_hexify(v) for v in value]
    return value


def analyzer_keys() -> tuple[X25519PrivateKey, Ed25519PrivateKey]:
    return X25519PrivateKey.from_private_bytes(ANALYZER_X25519), Ed25519PrivateKey.from_private_bytes(ANALYZER_ED25519_SEED)


def shuffler_keys() -> ShufflerKeys:
    return ShufflerKeys.from_bytes(SHUFFLER_X25519, SHUFFLER_ED25519_SEED)


def round_specs() -> tuple[m.RoundSpec, m.RoundSpec]:
    x25519_public = public_bytes(analyzer_keys()[0].public_key())
    shuffler = shuffler_keys()
    keys = dict(analyzer_key=x25519_public, shuffler_key=shuffler.hpke_public,
                shuffler_signing_key=shuffler.signing_public)
    range_spec = m.RoundSpec(
        session_id=SESSION, round_id=0, params=m.HadamardRangeParams(-20.0, 20.0, 0.8),
        epsilon0=0.5, min_batch=1000, deadline=1_900_000_000.0, **keys,
    )
    mean_spec = m.RoundSpec(
        session_id=SESSION, round_id=1, params=m.ProjectedMeanParams(-0.7, 4.1, "gaussian", 4096),
        epsilon0=0.5, delta0=1e-7, min_batch=1000, deadline=1_900_000_060.0, max_batch=4000, shuffler_instances=4,
        **keys,
    )
    return range_spec, mean_spec


def signed_messages() -> list[tuple[str, object, Ed25519PrivateKey]]:
    """The signed messages of the vectors: (name, message with its signature, signing key)."""
    shuffler = shuffler_keys().signing_private
    analyzer = analyzer_keys()[1]
    payloads = tuple(bytes([i]) * SEALED_SIZE for i in (1, 2, 3))
    r0, r1 = (spec.digest for spec in round_specs())  # each message names the exact spec of its round
    messages = [
        ("shuffled-batch/whole", m.ShuffledBatch(SESSION, 0, r0, BATCH_ID, 0, 1, 2, payloads[:2]), shuffler),
        ("shuffled-batch/chunk-1-of-2", m.ShuffledBatch(SESSION, 0, r0, BATCH_ID, 1, 2, 3, payloads[2:]), shuffler),
        ("batch-ack", m.BatchAck(SESSION, 0, r0, BATCH_ID, bytes(64)), analyzer),
        (
            "admission-receipts",
            m.AdmissionReceipts(SESSION, 0, r0, (NONCE,), (bytes([0x11]) * 16, bytes([0x22]) * 16), ("replay", "quota")),
            shuffler,
        ),
        ("round-outcome/released", m.RoundOutcome(SESSION, 0, r0, "released", "", 2, BATCH_ID), shuffler),
        ("round-outcome/failed", m.RoundOutcome(SESSION, 1, r1, "failed", "batch-too-small", 7, bytes(16), 3), shuffler),
    ]
    return [(name, signed(key, message), key) for name, message, key in messages]


def onion() -> dict:
    """A real onion envelope of round 0: inner layer to the analyzer, outer layer to the shuffler."""
    private, _ = analyzer_keys()
    shuffler = shuffler_keys()
    range_spec, _ = round_specs()
    report = codec.encode(m.Report(0, "hadamard-range", (17, -1)))
    plaintext = report_format(0, "hadamard-range").pad(report)
    sealed = Sealer(public_bytes(private.public_key())).seal(plaintext, SESSION, 0, range_spec.digest)
    credential = CredentialIssuer(ISSUER_KEY).issue(CLIENT_ID)
    envelope, _ = wrap(range_spec, credential, sealed, NONCE)
    admission = m.Admission(0, credential, NONCE, sealed)
    return {
        "report": report,
        "plaintext": plaintext,
        "sealed": sealed,
        "credential": credential,
        "admission": admission,
        "envelope": envelope,
        "shuffler": shuffler,
    }


def multi_message_specs() -> list[tuple[str, m.RoundSpec]]:
    """Round specs of the mechanisms with coordinates or several messages per user."""
    range_spec, _ = round_specs()
    base = dict(session_id=SESSION, analyzer_key=range_spec.analyzer_key, shuffler_key=range_spec.shuffler_key,
                shuffler_signing_key=range_spec.shuffler_signing_key, deadline=1_900_000_000.0)
    total = m.ModularSumParams(0.0, 1.0, 100, 2_000_003, 8, 10_000)  # min_batch = 10^4 users x 8 shares
    vector_sum = m.VectorSumParams(3, 1.0, 200, 7, 10_000_019, 10, 10_000, 3.0e6)  # min_batch = 10^4 x 10 x 4
    vector_range = m.VectorRangeParams(-4.0, 4.0, 0.5, 3, 2**64 - 1, "paper")
    vector_mean = m.VectorMeanParams(3, 2**64 - 1, (-1.5, -1.0, 0.0, 0.5), (1.5, 2.0, 3.0, 3.5), "laplace", 1024)
    coordinate_tree = m.CoordinateTreeParams(-50.0, 50.0, 50.0 / 64, 3, 12345)  # 64 leaves: 6 levels x 4 coordinates
    shifted_norm = m.ShiftedNormParams((4.5, -1.25, 0.0), -32.0, 8.0, 0.125)  # log2 bins of a quarter octave
    shifted_sum = m.ShiftedVectorSumParams(3, 2.5, 200, 7, 10_000_019, 10, 10_000, 3.0e6, "skellam", (4.5, -1.25, 0.0))
    local_vector = m.LocalVectorParams(3, 2.5, 200, 7, 500_000.0, (4.5, -1.25, 0.0))
    return [
        ("round-spec/modular-sum", m.RoundSpec(round_id=2, params=total, epsilon0=1.0, delta0=1e-6, min_batch=80_000,
                                               max_batch=80_000, messages_per_user=8, **base)),
        ("round-spec/vector-sum", m.RoundSpec(round_id=3, params=vector_sum, epsilon0=1.0, delta0=1e-6, min_batch=400_000,
                                              max_batch=400_000, messages_per_user=40, **base)),
        ("round-spec/vector-range-paper", m.RoundSpec(round_id=4, params=vector_range, epsilon0=2.0, min_batch=4000,
                                                      messages_per_user=4, **base)),
        ("round-spec/vector-mean", m.RoundSpec(round_id=5, params=vector_mean, epsilon0=2.0, min_batch=1000, **base)),
        ("round-spec/coordinate-tree", m.RoundSpec(round_id=6, params=coordinate_tree, epsilon0=3.0, min_batch=1000, **base)),
        ("round-spec/shifted-norm", m.RoundSpec(round_id=7, params=shifted_norm, epsilon0=4.0, min_batch=1000, **base)),
        ("round-spec/shifted-vector-sum", m.RoundSpec(round_id=8, params=shifted_sum, epsilon0=1.0, delta0=1e-6,
                                                      min_batch=400_000, max_batch=400_000, messages_per_user=40, **base)),
        ("round-spec/local-vector", m.RoundSpec(round_id=9, params=local_vector, epsilon0=2.0, delta0=1e-6, min_batch=4000,
                                                messages_per_user=4, **base)),
    ]


def example_messages(layers: dict) -> list[tuple[str, object]]:
    range_spec, mean_spec = round_specs()
    spec_bytes = codec.encode(range_spec)
    signature = sign_spec_bytes(analyzer_keys()[1], spec_bytes)
    return [
        ("round-spec/hadamard-range", range_spec),
        ("round-spec/projected-mean-gaussian", mean_spec),
        *multi_message_specs(),
        ("report/modular-sum", m.Report(2, "modular-sum", (1_999_999,))),
        ("report/vector-sum", m.Report(3, "vector-sum", (3, 10_000_018))),
        ("report/vector-range", m.Report(4, "vector-range", (2, 11, -1))),
        ("report/vector-mean", m.Report(5, "vector-mean", (1, -7))),
        ("report/coordinate-tree", m.Report(6, "coordinate-tree", (23, 40, 1))),
        ("report/shifted-norm", m.Report(7, "shifted-norm", (159, -1))),
        ("report/shifted-vector-sum", m.Report(8, "shifted-vector-sum", (0, 5))),
        ("report/local-vector", m.Report(9, "local-vector", (2, -1017))),
        ("signed-round-spec", m.SignedRoundSpec(spec_bytes, signature)),
        ("report/hadamard-range", m.Report(0, "hadamard-range", (17, -1))),
        ("report/projected-mean", m.Report(1, "projected-mean", (-123456,))),
        ("admission", layers["admission"]),
        ("envelope", codec.decode(layers["envelope"], m.Envelope)),
        *[(name, message) for name, message, _ in signed_messages()],
    ]


def main() -> None:
    layers = onion()
    codec_vectors = [
        {"name": name, "type": codec._TYPE_OF[type(msg)], "fields": jsonable(msg), "cbor_hex": codec.encode(msg).hex()}
        for name, msg in example_messages(layers)
    ]
    private, signer = analyzer_keys()
    sealing_vectors = {
        "suite": "DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, ChaCha20-Poly1305 (RFC 9180 base mode)",
        "recipient_private_key_hex": ANALYZER_X25519.hex(),
        "recipient_public_key_hex": public_bytes(private.public_key()).hex(),
        "session_id_hex": SESSION.hex(),
        "round_id": 0,
        "spec_digest_hex": round_specs()[0].digest.hex(),
        "info_hex": report_info(SESSION, 0, round_specs()[0].digest).hex(),
        "sealed_hex": layers["sealed"].hex(),
        "report_hex": layers["report"].hex(),
        "padded_size": len(layers["plaintext"]),
        "plaintext_hex": layers["plaintext"].hex(),
    }
    shuffler = layers["shuffler"]
    onion_vectors = {
        "suite": sealing_vectors["suite"],
        "recipient_private_key_hex": SHUFFLER_X25519.hex(),
        "recipient_public_key_hex": shuffler.hpke_public.hex(),
        "session_id_hex": SESSION.hex(),
        "round_id": 0,
        "mechanism": "hadamard-range",
        "spec_digest_hex": round_specs()[0].digest.hex(),
        "info_hex": envelope_info(SESSION, 0, round_specs()[0].digest).hex(),
        "envelope_hex": layers["envelope"].hex(),
        "admission_hex": codec.encode(layers["admission"]).hex(),
        "issuer_key_hex": ISSUER_KEY.hex(),
        "client_id_hex": CLIENT_ID.hex(),
        "credential_hex": layers["credential"].hex(),
        "nonce_hex": NONCE.hex(),
        "sealed_hex": layers["sealed"].hex(),
        "sizes": {
            "sealed": len(layers["sealed"]),
            "admission": len(codec.encode(layers["admission"])),
            "outer": len(codec.decode(layers["envelope"], m.Envelope).outer),
            "envelope": len(layers["envelope"]),
        },
    }
    message = codec.encode(round_specs()[0])
    signing_vectors = {
        "algorithm": "Ed25519 (RFC 8032)",
        "private_seed_hex": ANALYZER_ED25519_SEED.hex(),
        "public_key_hex": public_bytes(signer.public_key()).hex(),
        "message_hex": message.hex(),
        "spec_signed_string_hex": spec_signing_string(message).hex(),
        "signature_hex": sign_spec_bytes(signer, message).hex(),
        "spec_digest_label": m.SPEC_DIGEST_LABEL.decode(),
        "spec_digest_hex": m.spec_digest_of(message).hex(),
        "signed_label": SIGNED_LABEL.decode(),
        "signed_messages": [signing_steps(name, msg, key) for name, msg, key in signed_messages()],
    }
    refused = [{"name": name, "hex": data, "rule": rule, "names": names} for name, data, rule, names in REFUSED]
    vectors = (
        ("codec", codec_vectors),
        ("sealing", sealing_vectors),
        ("onion", onion_vectors),
        ("signing", signing_vectors),
        ("refused", refused),
    )
    for name, data in vectors:
        (HERE / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {HERE / name}.json")


def signing_steps(name: str, message, key: Ed25519PrivateKey) -> dict:
    """The signing rule of ``message`` step by step (see docs/wire-format.md, "Signing")."""
    tag = codec._TYPE_OF[type(message)]
    zeroed = codec.encode(dataclasses.replace(message, signature=bytes(64)))
    digest = hashlib.sha256(zeroed).digest()
    signed_string = SIGNED_LABEL + tag.encode() + digest
    assert key.sign(signed_string) == message.signature
    return {
        "name": name,
        "type": tag,
        "public_key_hex": public_bytes(key.public_key()).hex(),
        "message_hex": codec.encode(message).hex(),
        "zeroed_hex": zeroed.hex(),
        "digest_hex": digest.hex(),
        "signed_string_hex": signed_string.hex(),
        "signature_hex": message.signature.hex(),
    }


if __name__ == "__main__":
    main()
