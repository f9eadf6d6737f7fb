"""Sealing report payloads to the analyzer, and signing round specs.

* **Sealing** is HPKE (RFC 9180) in base mode with the suite
  DHKEM(X25519, HKDF-SHA256) / HKDF-SHA256 / ChaCha20-Poly1305, through
  ``cryptography.hazmat.primitives.hpke``. The session id, the round id and the
  digest of the round's exact signed spec (:attr:`RoundSpec.digest`) are bound into
  HPKE's ``info``, so a payload sealed for one round, or under another spec of the
  same round, does not open, and any change to the ciphertext fails the AEAD tag. The sealed form is
  ``enc (32 bytes) || ciphertext+tag`` as the library produces it.
* **Signing** is Ed25519 over the canonical encoding of a RoundSpec, so a client
  answers only rounds its pinned analyzer really announced.
"""

from __future__ import annotations

from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hpke, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from shuffledp.protocol.errors import BadSignature, InvalidParameter, SealingError
from shuffledp.protocol.wire.ed25519_keys import weak_ed25519_key
from shuffledp.protocol.wire.messages import ED25519_KEY_BYTES, SESSION_ID_BYTES, SPEC_DIGEST_BYTES

SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)
INFO_LABEL = b"shuffledp/v3/report"
_RAW = serialization.Encoding.Raw


def report_info(session_id: bytes, round_id: int, spec_digest: bytes) -> bytes:
    """HPKE ``info`` for a report: label || session id (16 bytes) || round id (8 bytes,
    big-endian) || the spec's digest (32 bytes)."""
    return INFO_LABEL + round_binding(session_id, round_id, spec_digest)


def round_binding(session_id: bytes, round_id: int, spec_digest: bytes) -> bytes:
    """session id (16 bytes) || round id (8 bytes, big-endian) || spec digest (32 bytes): what
    every HPKE ``info`` of a round binds, after its label."""
    if len(session_id) != SESSION_ID_BYTES:
        raise InvalidParameter("session_id", f"must be {SESSION_ID_BYTES} bytes")
    if len(spec_digest) != SPEC_DIGEST_BYTES:
        raise InvalidParameter("spec_digest", f"must be {SPEC_DIGEST_BYTES} bytes")
    return session_id + round_id.to_bytes(8, "big") + spec_digest


def public_bytes(key: X25519PublicKey | Ed25519PublicKey) -> bytes:
    return key.public_bytes(_RAW, serialization.PublicFormat.Raw)


@dataclass(frozen=True)
class PartyKeys:
    """A party's long-term secrets: an X25519 key others seal to (HPKE) and an Ed25519 signing key."""

    hpke_private: X25519PrivateKey
    signing_private: Ed25519PrivateKey

    @classmethod
    def generate(cls):
        return cls(X25519PrivateKey.generate(), Ed25519PrivateKey.generate())

    @classmethod
    def from_bytes(cls, hpke_private: bytes, signing_seed: bytes):
        """Keys from their raw 32-byte private encodings, or :class:`InvalidParameter`."""
        try:
            return cls(X25519PrivateKey.from_private_bytes(hpke_private), Ed25519PrivateKey.from_private_bytes(signing_seed))
        except (TypeError, ValueError) as exc:
            raise InvalidParameter(f"{cls.__name__} key bytes", str(exc)) from None

    @property
    def hpke_public(self) -> bytes:
        """Raw 32-byte X25519 public key (named in every RoundSpec)."""
        return public_bytes(self.hpke_private.public_key())

    @property
    def signing_public(self) -> bytes:
        """Raw 32-byte Ed25519 public key (pinned by whoever checks this party's signatures)."""
        return public_bytes(self.signing_private.public_key())


class AnalyzerKeys(PartyKeys):
    """The analyzer's keys: clients seal reports to its X25519 key and pin its Ed25519 key to verify round specs."""


class Sealer:
    """Client side: seals payloads to one analyzer public key."""

    def __init__(self, analyzer_public: bytes) -> None:
        try:
            self._key = X25519PublicKey.from_public_bytes(analyzer_public)
        except ValueError as exc:
            raise InvalidParameter("analyzer_public", str(exc)) from None

    def seal(self, payload: bytes, session_id: bytes, round_id: int, spec_digest: bytes) -> bytes:
        """HPKE-seal ``payload`` for the round whose spec has ``spec_digest``; a key the suite
        refuses (e.g. a low-order point) is a :class:`SealingError`."""
        try:
            return SUITE.encrypt(payload, self._key, info=report_info(session_id, round_id, spec_digest))
        except ValueError as exc:
            raise SealingError(f"cannot seal to the round's analyzer key ({exc})") from None


    def for_round(self, session_id: bytes, round_id: int, spec_digest: bytes) -> "RoundSealer":
        """A sealer of one round's payloads, its HPKE ``info`` computed once."""
        return RoundSealer(self._key, report_info(session_id, round_id, spec_digest))


class RoundSealer:
    """Client side: seals one round's payloads (what :meth:`Sealer.seal` does, with the
    round's ``info`` and the parsed key held); every call is a fresh HPKE encapsulation."""

    def __init__(self, key: X25519PublicKey, info: bytes) -> None:
        self._key = key
        self._info = info

    def seal(self, payload: bytes) -> bytes:
        try:
            return SUITE.encrypt(payload, self._key, info=self._info)
        except ValueError as exc:
            raise SealingError(f"cannot seal to the round's analyzer key ({exc})") from None


#: Length of HPKE's encapsulated key (X25519's ephemeral public key) at the start of a sealed payload.
ENCAPSULATED_KEY_BYTES = 32


class ReportOpener:
    """Analyzer side: opens the sealed payloads of one round (its HPKE ``info`` computed once)."""

    def __init__(self, private: X25519PrivateKey, session_id: bytes, round_id: int, spec_digest: bytes) -> None:
        self._private = private
        self._info = report_info(session_id, round_id, spec_digest)

    def open(self, sealed: bytes) -> bytes:
        """The plaintext, or :class:`SealingError`."""
        try:
            return SUITE.decrypt(sealed, self._private, info=self._info)
        except (InvalidTag, ValueError) as exc:
            raise SealingError(f"payload does not open for this session, round and spec ({type(exc).__name__})") from None


def open_sealed(private: X25519PrivateKey, sealed: bytes, session_id: bytes, round_id: int, spec_digest: bytes) -> bytes:
    """Analyzer side: open one sealed payload, or raise :class:`SealingError`."""
    return ReportOpener(private, session_id, round_id, spec_digest).open(sealed)


def sign(private: Ed25519PrivateKey, data: bytes) -> bytes:
    return private.sign(data)


def verify(public: bytes, data: bytes, signature: bytes, what: str = "round spec") -> None:
    """Raise :class:`BadSignature` (naming ``what`` was signed) unless ``signature`` is
    ``public``'s Ed25519 signature of ``data``.

    A ``public`` that is a small-order point or a non-canonical encoding is refused before
    OpenSSL sees it (:func:`~shuffledp.protocol.wire.ed25519_keys.weak_ed25519_key`): OpenSSL
    checks the cofactorless equation only, under which such a key verifies signatures anyone
    can make. A signature whose ``s`` is not below the group order is refused by OpenSSL."""
    problem = weak_ed25519_key(public) if isinstance(public, bytes) and len(public) == ED25519_KEY_BYTES else None
    if problem is not None:
        raise BadSignature(f"{what} signature refused: the signing key is {problem}")
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, data)
    except (InvalidSignature, ValueError) as exc:
        raise BadSignature(f"{what} signature does not verify ({type(exc).__name__})") from None
