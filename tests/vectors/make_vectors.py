"""Regenerate the JSON test vectors in this folder: ``python tests/vectors/make_vectors.py``.

The vectors pin the wire format for implementations in other languages:

* ``codec.json``: each message as JSON-friendly fields (bytes as hex) and its exact CBOR encoding;
* ``sealing.json``: an X25519 private key, HPKE ``info`` and a sealed payload that must open
  to the given plaintext (HPKE sealing is randomized, so only opening is reproducible);
* ``signing.json``: an Ed25519 key seed, a message and its (deterministic) signature;
* ``refused.json``: encodings a decoder must refuse (hostile CBOR features and
  non-deterministic forms), each with the rule it breaks.

Keys here are test keys, fixed by seeds written in this file; never use them for real.
"""

from __future__ import annotations

import json
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from shuffledp.protocol import codec
from shuffledp.protocol import messages as m
from shuffledp.protocol.report_format import report_format
from shuffledp.protocol.sealing import Sealer, public_bytes, report_info

HERE = Path(__file__).parent
SESSION = bytes(range(16))
ANALYZER_X25519 = bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
ANALYZER_ED25519_SEED = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")


#: Sealed size of round 0's hadamard-range reports (the padded report plus 48 bytes of HPKE).
SEALED_SIZE = report_format(0, "hadamard-range").sealed_size

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


def example_messages() -> list[tuple[str, object]]:
    x25519_public = public_bytes(X25519PrivateKey.from_private_bytes(ANALYZER_X25519).public_key())
    range_spec = m.RoundSpec(
        session_id=SESSION, round_id=0, params=m.HadamardRangeParams(-20.0, 20.0, 0.8),
        epsilon0=0.5, analyzer_key=x25519_public, min_batch=1000, deadline=1_900_000_000.0,
    )
    mean_spec = m.RoundSpec(
        session_id=SESSION, round_id=1, params=m.ProjectedMeanParams(-0.7, 4.1, "gaussian", 4096),
        epsilon0=0.5, delta0=1e-7, analyzer_key=x25519_public, min_batch=1000, deadline=1_900_000_060.0,
    )
    spec_bytes = codec.encode(range_spec)
    signature = Ed25519PrivateKey.from_private_bytes(ANALYZER_ED25519_SEED).sign(spec_bytes)
    return [
        ("round-spec/hadamard-range", range_spec),
        ("round-spec/projected-mean-gaussian", mean_spec),
        ("signed-round-spec", m.SignedRoundSpec(spec_bytes, signature)),
        ("report/hadamard-range", m.Report(0, "hadamard-range", (17, -1))),
        ("report/projected-mean", m.Report(1, "projected-mean", (-123456,))),
        ("envelope", m.Envelope(SESSION, 0, bytes([0xAA]) * 16, bytes([0x55]) * 16, bytes(range(SEALED_SIZE)))),
        ("shuffled-batch", m.ShuffledBatch(SESSION, 0, (bytes([1]) * SEALED_SIZE, bytes([2]) * SEALED_SIZE))),
    ]


def main() -> None:
    codec_vectors = [
        {"name": name, "type": codec._TYPE_OF[type(msg)], "fields": jsonable(msg), "cbor_hex": codec.encode(msg).hex()}
        for name, msg in example_messages()
    ]
    private = X25519PrivateKey.from_private_bytes(ANALYZER_X25519)
    report = codec.encode(m.Report(0, "hadamard-range", (17, -1)))
    plaintext = report_format(0, "hadamard-range").pad(report)
    sealed = Sealer(public_bytes(private.public_key())).seal(plaintext, SESSION, 0)
    sealing_vectors = {
        "suite": "DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, ChaCha20-Poly1305 (RFC 9180 base mode)",
        "recipient_private_key_hex": ANALYZER_X25519.hex(),
        "recipient_public_key_hex": public_bytes(private.public_key()).hex(),
        "session_id_hex": SESSION.hex(),
        "round_id": 0,
        "info_hex": report_info(SESSION, 0).hex(),
        "sealed_hex": sealed.hex(),
        "report_hex": report.hex(),
        "padded_size": len(plaintext),
        "plaintext_hex": plaintext.hex(),
    }
    signer = Ed25519PrivateKey.from_private_bytes(ANALYZER_ED25519_SEED)
    message = codec.encode(example_messages()[0][1])
    signing_vectors = {
        "algorithm": "Ed25519 (RFC 8032)",
        "private_seed_hex": ANALYZER_ED25519_SEED.hex(),
        "public_key_hex": public_bytes(signer.public_key()).hex(),
        "message_hex": message.hex(),
        "signature_hex": signer.sign(message).hex(),
    }
    refused = [{"name": name, "hex": data, "rule": rule, "names": names} for name, data, rule, names in REFUSED]
    vectors = (("codec", codec_vectors), ("sealing", sealing_vectors), ("signing", signing_vectors), ("refused", refused))
    for name, data in vectors:
        (HERE / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {HERE / name}.json")


if __name__ == "__main__":
    main()
