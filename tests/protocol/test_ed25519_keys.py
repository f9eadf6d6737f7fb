"""Ed25519 public keys that would let anyone sign: small-order points and non-canonical encodings.

Verification checks ``[s]B = R + [k]A`` with ``k = SHA-512(R || A || M)``. When ``A`` is a
point of small order (its order divides 8), ``[k]A`` takes at most 8 values whatever the
message, so ``s = 0`` and ``R = -[k]A`` (one of those 8 points) make a signature on any
message, without any secret: under the neutral point it is ``R = neutral, s = 0`` for every
message. OpenSSL (through ``cryptography``) checks exactly that equation and accepts these,
also under a non-canonical encoding of the key (``y >= p``, or ``x = 0`` written with its
sign bit set). So a signed spec naming such a ``shuffler_signing_key`` would let anyone
forge that "shuffler's" receipts, outcomes and batch chunks.

The small-order points are derived here, not copied from a list: the group of edwards25519
has order ``8 * L`` with a cyclic 8-torsion, so ``[L]Q`` of any point ``Q`` lies in it, and
one of order 8 generates all 8 points (``k * T8`` for ``k = 0..7``). Their encodings, with
every non-canonical variant, are the keys refused. (The same 8 points and variants are the
blocklist of e.g. libsodium's ``crypto_sign_verify_detached`` and of "Taming the many
EdDSAs", Chalkias et al., 2020.)
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools

import numpy as np
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from shuffledp.client.ledger import PrivacyLedger
from shuffledp.protocol.errors import BadSignature, InvalidParameter, MalformedMessage, UnknownRound
from shuffledp.protocol.wire import codec
from shuffledp.protocol.wire.ed25519_keys import SMALL_ORDER_Y
from shuffledp.protocol.wire.messages import RoundOutcome, SignedRoundSpec
from shuffledp.protocol.wire.onion import sign_spec_bytes, spec_signing_string
from shuffledp.protocol.wire.sealing import Sealer, verify

from parties import DEPLOYMENT, make_spec

# ---------------------------------------------------------------- edwards25519, independently

P = 2**255 - 19
D = (-121665 * pow(121666, P - 2, P)) % P
L = 2**252 + 27742317777372353535851937790883648493
SQRT_M1 = pow(2, (P - 1) // 4, P)
NEUTRAL = (0, 1)


def _add(a, b):
    (x1, y1), (x2, y2) = a, b
    t = D * x1 * x2 * y1 * y2 % P
    return ((x1 * y2 + x2 * y1) * pow(1 + t, P - 2, P) % P, (y1 * y2 + x1 * x2) * pow(1 - t, P - 2, P) % P)


def _mul(k, point):
    result = NEUTRAL
    while k:
        if k & 1:
            result = _add(result, point)
        point = _add(point, point)
        k >>= 1
    return result


def _x_of(y):
    """An x with (x, y) on the curve, or None."""
    u, v = (y * y - 1) % P, (D * y * y + 1) % P
    x2 = u * pow(v, P - 2, P) % P
    x = pow(x2, (P + 3) // 8, P)
    if x * x % P != x2:
        x = x * SQRT_M1 % P
    return x if x * x % P == x2 else None


def _encode(point, *, y_plus_p=False, sign=None):
    x, y = point
    y = y + P if y_plus_p else y
    return (y | ((x & 1 if sign is None else sign) << 255)).to_bytes(32, "little")


def _torsion_points():
    """The 8 points of order dividing 8: the multiples of one point of order 8, found as [L]Q."""
    for y in itertools.count(2):
        x = _x_of(y)
        if x is None:
            continue
        t8 = _mul(L, (x, y))
        if _mul(4, t8) != NEUTRAL:  # order exactly 8
            points = [_mul(k, t8) for k in range(8)]
            assert len(set(points)) == 8 and all(_mul(8, q) == NEUTRAL for q in points)
            return points


TORSION = _torsion_points()
CANONICAL = [_encode(q) for q in TORSION]
#: The other encodings of the same points: y + p where it fits in 255 bits (y = 0, 1), and the
#: sign bit set on x = 0 (y = 1, p - 1).
NON_CANONICAL = sorted(
    {_encode(q, y_plus_p=True, sign=s) for q in TORSION if q[1] + P < 2**255 for s in (0, 1)}
    | {_encode(q, sign=1) for q in TORSION if q[0] == 0}
)
ALL_WEAK = CANONICAL + NON_CANONICAL


def _forgery(key: bytes, message: bytes) -> bytes | None:
    """``R || s`` with ``s = 0`` and ``R`` a small-order point such that ``R = -[k]A``: a signature
    on ``message`` under the small-order key ``key``, made with no secret (None if no R fits:
    each R fits with probability about 1/8, so a forger tries another message)."""
    y = (int.from_bytes(key, "little") & (2**255 - 1)) % P  # decoded as the verifier does
    x = next(q[0] for q in TORSION if q[1] == y)
    if x and (x & 1) != key[31] >> 7:
        x = P - x
    a = (x, y)
    for r in TORSION:
        r_bytes = _encode(r)
        k = int.from_bytes(hashlib.sha512(r_bytes + key + message).digest(), "little") % L
        minus_ka = _mul(k % 8, a)
        if _encode(((-minus_ka[0]) % P, minus_ka[1])) == r_bytes:
            return r_bytes + bytes(32)
    return None


def _openssl_accepts(key: bytes, message: bytes, signature: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


# ---------------------------------------------------------------- tests

IDENTITY = bytes([1]) + bytes(31)
IDENTITY_FORGERY = IDENTITY + bytes(32)  # R = neutral point, s = 0


def test_the_derived_small_order_points_are_the_known_eight():
    assert len(set(CANONICAL)) == 8 and len(NON_CANONICAL) == 6
    assert IDENTITY in CANONICAL
    assert SMALL_ORDER_Y == {q[1] for q in TORSION}  # what the software refuses is what the group holds
    assert bytes.fromhex("26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05") in CANONICAL
    assert bytes.fromhex("ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f") in CANONICAL


def test_the_identity_key_forgery_is_refused():
    # R = neutral point, s = 0 satisfies [0]B = R + [k]A for every message when A is neutral.
    assert _openssl_accepts(IDENTITY, b"anything", IDENTITY_FORGERY)  # the library underneath takes it
    with pytest.raises(BadSignature, match="small-order"):
        verify(IDENTITY, b"anything", IDENTITY_FORGERY)


@pytest.mark.parametrize("key", ALL_WEAK, ids=[k.hex()[:8] + "-" + k.hex()[-2:] for k in ALL_WEAK])
def test_every_small_order_key_is_refused_as_a_verification_key(key):
    # a forger varies the message (e.g. an outcome's batch id) until some R fits
    message, forged = next((m, f) for m in (b"outcome %d" % i for i in range(1000)) if (f := _forgery(key, m)))
    assert _openssl_accepts(key, message, forged)  # a signature made with no secret
    with pytest.raises(BadSignature):
        verify(key, message, forged, what="round-outcome")


def test_a_key_whose_y_is_not_reduced_is_refused_as_non_canonical():
    # y >= p: no point has this encoding canonically, whatever its order
    for y in (P, P + 2, 2**255 - 1):
        with pytest.raises(BadSignature, match="non-canonical"):
            verify(y.to_bytes(32, "little"), b"m", bytes(64))


def test_a_signature_whose_s_is_not_reduced_is_refused():
    # s + L verifies the same equation; RFC 8032 requires s < L, and OpenSSL checks it
    private = Ed25519PrivateKey.generate()
    public = private.public_key().public_bytes_raw()
    signature = private.sign(b"m")
    verify(public, b"m", signature)
    s = int.from_bytes(signature[32:], "little")
    with pytest.raises(BadSignature):
        verify(public, b"m", signature[:32] + (s + L).to_bytes(32, "little"))


def test_normal_keys_still_verify():
    for seed in range(20):
        private = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(bytes([seed])).digest())
        # verify raises BadSignature on refusal and returns None on success
        assert verify(private.public_key().public_bytes_raw(), b"data", private.sign(b"data")) is None


@pytest.mark.parametrize("key", ALL_WEAK, ids=[k.hex()[:8] + "-" + k.hex()[-2:] for k in ALL_WEAK])
def test_a_round_spec_naming_a_small_order_shuffler_signing_key_is_refused(key):
    spec = make_spec()
    with pytest.raises(InvalidParameter, match="shuffler_signing_key"):
        dataclasses.replace(spec, shuffler_signing_key=key)
    # and the same spec as bytes does not decode
    with pytest.raises(MalformedMessage, match="shuffler_signing_key"):
        codec.decode(_spec_bytes_naming(key), type(spec))


def _spec_bytes_naming(key: bytes) -> bytes:
    """A spec's canonical bytes with its shuffler signing key replaced (no constructor involved)."""
    spec = make_spec(round_id=7)
    data = codec.canonical_encode(spec)
    assert data.count(spec.shuffler_signing_key) == 1
    return data.replace(spec.shuffler_signing_key, key)


def _signed_spec_naming(key: bytes) -> bytes:
    spec_bytes = _spec_bytes_naming(key)
    signature = sign_spec_bytes(DEPLOYMENT.analyzer_keys.signing_private, spec_bytes)
    return codec.encode(SignedRoundSpec(spec_bytes, signature))


def _forged_outcome(spec, outcome: str = "failed", reason: str = "forged") -> bytes:
    message = RoundOutcome(spec.session_id, spec.round_id, spec.digest, outcome, reason, 0, bytes(16), 0, IDENTITY_FORGERY)
    return codec.encode(message)


def test_a_device_not_pinning_its_shuffler_refuses_a_spec_naming_a_small_order_key():
    client = DEPLOYMENT.client(np.array([0.5]), PrivacyLedger(2.0))
    assert client.shuffler_signing_key is None  # the device trusts the spec's shuffler
    with pytest.raises(MalformedMessage, match="shuffler_signing_key"):
        client.answer(_signed_spec_naming(IDENTITY))
    assert client.ledger.spent_epsilon == 0 and client.sent == {}
    with pytest.raises(UnknownRound):  # nothing was sent, so no forged word about it is recorded
        client.settle_outcome(_forged_outcome(make_spec(round_id=7)))
    assert client.ledger.outcomes == {}


def test_a_forged_outcome_under_a_small_order_key_is_not_settled_even_if_a_spec_named_it():
    # Defence in depth: a spec object that got past its checks (built here by force) names
    # the neutral point; the forged outcome still does not verify, and nothing is recorded.
    client = DEPLOYMENT.client(np.array([0.5]), PrivacyLedger(2.0))
    spec = make_spec(round_id=8)
    assert spec.digest  # computed (and cached) first: a spec naming that key no longer encodes
    object.__setattr__(spec, "shuffler_signing_key", IDENTITY)
    client.answer_verified(spec, Sealer(spec.analyzer_key))
    with pytest.raises(BadSignature):
        client.settle_outcome(_forged_outcome(spec))
    assert client.ledger.outcomes == {} and client.ledger.lost_rounds() == []


def test_the_signed_spec_bytes_verify_under_the_analyzer_key():
    # The refusal above is the spec's content, not its signature: the analyzer's signature is genuine.
    signed = codec.decode(_signed_spec_naming(IDENTITY), SignedRoundSpec)
    assert verify(DEPLOYMENT.analyzer_keys.signing_public, spec_signing_string(signed.spec_bytes), signed.signature) is None


@pytest.mark.parametrize("pin", ["analyzer_signing_key", "shuffler_signing_key"])
def test_a_device_refuses_to_pin_a_small_order_key(pin):
    from shuffledp.client.client import device_settings

    good = DEPLOYMENT.analyzer_keys.signing_public
    options = {"analyzer_signing_key": good, "shuffler_signing_key": DEPLOYMENT.shuffler_keys.signing_public,
               "shuffler_key": DEPLOYMENT.shuffler_keys.hpke_public, pin: IDENTITY}
    with pytest.raises(InvalidParameter, match=pin):
        device_settings(**options)


def test_public_json_naming_a_small_order_key_is_refused(tmp_path):
    import json

    from shuffledp.deploy.keys import KeyFileError, init_keys, load_public

    init_keys(tmp_path)
    path = tmp_path / "public.json"
    for field in ("analyzer", "shuffler"):
        doc = json.loads(path.read_text())
        doc[field]["signing_public"] = IDENTITY.hex()
        path.write_text(json.dumps(doc))
        with pytest.raises(KeyFileError, match="signing_public"):
            load_public(tmp_path)
