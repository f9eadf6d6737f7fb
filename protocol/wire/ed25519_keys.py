"""Ed25519 public keys under which anyone could sign, refused wherever a key is taken.

Verification checks ``[s]B = R + [k]A`` with ``k = SHA-512(R || A || M)``. If the key ``A`` is a
point of small order (its order divides the cofactor 8), ``[k]A`` is one of at most 8 points
whatever the message, so ``s = 0`` and ``R = -[k]A`` sign any message with no secret: under the
neutral point, ``R = neutral, s = 0`` verifies for every message. OpenSSL (through
``cryptography``) checks that equation as it stands and accepts such signatures, also when the
key is written in a non-canonical form. So the software refuses these keys itself:

* a **non-canonical encoding**: ``y >= p`` (the 255-bit y field not reduced mod ``p = 2^255 - 19``);
* a **small-order point**: ``y`` is one of the five y-coordinates of the 8 points of order
  dividing 8 (``1`` the neutral point, ``p - 1`` order 2, ``0`` the two points of order 4, and
  ``Y8``, ``p - Y8`` the four of order 8), with either sign bit. This covers the canonical
  encodings of all 8 points and the non-canonical ones whose y is reduced (the sign bit set
  on ``x = 0``); those with ``y + p`` are the case above.

These 14 encodings are the known small-order blocklist (as in libsodium's
``crypto_sign_verify_detached``); ``tests/protocol/test_ed25519_keys.py`` derives the 8 points
from the group itself and shows a forgery under each that OpenSSL accepts and this refuses.
A key of mixed order (a genuine key plus a small-order component) is not refused: forging under
it still takes the discrete logarithm of its prime-order part.
"""

from __future__ import annotations

from shuffledp.protocol.errors import InvalidParameter

#: The field prime of edwards25519.
P = 2**255 - 19
#: y of the four points of order 8 (with ``P - Y8``): the roots of ``d y^4 + 2 y^2 - 1 = 0``, where
#: doubling gives a point of order 4 (``y = 0``).
Y8 = 0x7A03AC9277FDC74EC6CC392CFA53202A0F67100D760B3CBA4FD84D3D706A17C7
#: The y-coordinates of the 8 points whose order divides 8.
SMALL_ORDER_Y = frozenset({0, 1, P - 1, Y8, P - Y8})
_Y_MASK = 2**255 - 1


def weak_ed25519_key(key: bytes) -> str | None:
    """Why ``key`` (32 bytes) must not be verified against, or None: a non-canonical encoding
    (``y >= p``) or a small-order point (anyone can make signatures that verify under it)."""
    y = int.from_bytes(key, "little") & _Y_MASK
    if y >= P:
        return "a non-canonical encoding (y >= p)"
    if y in SMALL_ORDER_Y:
        return "a small-order point (anyone could sign under it)"
    return None


def check_ed25519_key(key: object, name: str, size: int = 32) -> bytes:
    """``key`` if it is ``size`` bytes and a key signatures can be checked against; else
    :class:`InvalidParameter` naming ``name`` (see :func:`weak_ed25519_key`)."""
    if not isinstance(key, bytes) or len(key) != size:
        raise InvalidParameter(name, f"must be {size} bytes (an Ed25519 public key)")
    problem = weak_ed25519_key(key)
    if problem is not None:
        raise InvalidParameter(name, f"is {problem}, not a usable Ed25519 public key")
    return key
