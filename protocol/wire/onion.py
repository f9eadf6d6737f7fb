"""Onion envelopes, and the signatures on what the shuffler and analyzer tell each other.

An envelope has two layers:

* the **inner** layer is the padded report sealed to the analyzer
  (:mod:`shuffledp.protocol.wire.sealing`); the shuffler cannot open it;
* the **outer** layer seals an :class:`~shuffledp.protocol.wire.messages.Admission` (the
  client's credential, a fresh nonce and the inner sealed report) to the shuffler,
  with HPKE in the same suite, ``info = "shuffledp/v3/envelope" || session || round || spec digest``.

So the broker, the network and other clients see only the session, the round and a
ciphertext whose length is fixed for the round (:class:`EnvelopeFormat`); the
shuffler sees the credential and the inner ciphertext, never a value; the analyzer
sees the inner ciphertext only, never a credential, an arrival time or an order.

**Signed messages.** Batch chunks, admission receipts and round outcomes are signed
by the shuffler's Ed25519 key, batch acknowledgements by the analyzer's. A message's
signature field is 64 bytes; the signature covers

    "shuffledp/v3/signed/" || type tag || SHA-256(encoding with the signature field zeroed)

The field has a fixed size, so "the encoding with the signature zeroed" is the same
bytes whether one re-encodes the message or zeroes the field in place: a signer encodes a
message once and writes the signature over the zeroed field (:func:`signed_encoding`), and a
receiver hashes the bytes it received once, where they lie (:func:`verify_encoded` for the
analyzer's batch chunks, :func:`decode_verified` for any signed message). The type tag in the signed string keeps a signature on one
message type from being replayed as another. Every signed message of a round carries
the round's spec digest (:attr:`RoundSpec.digest`) as a field, so the signature also
covers which exact spec it speaks of; receivers compare it with the spec they hold.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import threading
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from shuffledp.protocol.wire import codec
from shuffledp.protocol.wire.cbor_strict import as_bytes, byte_length
from shuffledp.protocol.errors import MalformedMessage, MessageTooLarge, SealingError, UnknownRound
from shuffledp.protocol.wire.messages import (
    CREDENTIAL_BYTES,
    NONCE_BYTES,
    SESSION_ID_BYTES,
    SIGNATURE_BYTES,
    Admission,
    Envelope,
    RoundSpec,
    SignedRoundSpec,
)
from shuffledp.protocol.wire.report_format import HPKE_OVERHEAD, WrongSize, encoded_digest, report_format
from shuffledp.protocol.wire.sealing import SUITE, PartyKeys, round_binding, verify

ENVELOPE_INFO_LABEL = b"shuffledp/v3/envelope"
SIGNED_LABEL = b"shuffledp/v3/signed/"

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


class SignedMessage(Protocol):
    """A signed wire message: a dataclass with a ``signature`` field (see the module docstring)."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    @property
    def signature(self) -> bytes: ...


M = TypeVar("M", bound=SignedMessage)


def envelope_info(session_id: bytes, round_id: int, spec_digest: bytes) -> bytes:
    """HPKE ``info`` of the outer layer: label || session id (16 bytes) || round id (8 bytes,
    big-endian) || the spec's digest (32 bytes)."""
    return ENVELOPE_INFO_LABEL + round_binding(session_id, round_id, spec_digest)


class ShufflerKeys(PartyKeys):
    """The shuffler's keys: clients seal envelopes' outer layer to its X25519 key; it signs
    batches, receipts and outcomes with its Ed25519 key (both named in every RoundSpec)."""


class EnvelopeFormat:
    """The fixed sizes of one round's envelopes: every field has one length per round.

    ``admission_size`` is the encoded :class:`Admission` (round id, a 48-byte
    credential, a 16-byte nonce, the round's sealed report); ``outer_size`` adds
    HPKE's 48 bytes; ``size`` is the encoded :class:`Envelope`.
    """

    def __init__(self, round_id: int, mechanism: str) -> None:
        self.sealed_size = report_format(round_id, mechanism).sealed_size
        admission = Admission(round_id, bytes(CREDENTIAL_BYTES), bytes(NONCE_BYTES), bytes(self.sealed_size))
        self.admission_size = len(codec.encode(admission))
        self.outer_size = self.admission_size + HPKE_OVERHEAD
        self.size = len(codec.encode(Envelope(bytes(SESSION_ID_BYTES), round_id, bytes(self.outer_size))))


@functools.lru_cache(maxsize=64)
def envelope_format(round_id: int, mechanism: str) -> EnvelopeFormat:
    return EnvelopeFormat(round_id, mechanism)


def wrap(spec: RoundSpec, credential: bytes, sealed: bytes, nonce: bytes | None = None) -> tuple[bytes, bytes]:
    """Client side: the encoded envelope carrying ``sealed`` under ``credential``, and its nonce."""
    nonce = os.urandom(NONCE_BYTES) if nonce is None else nonce
    admission = codec.encode(Admission(spec.round_id, credential, nonce, sealed))
    try:
        key = X25519PublicKey.from_public_bytes(spec.shuffler_key)
        outer = SUITE.encrypt(admission, key, info=envelope_info(spec.session_id, spec.round_id, spec.digest))
    except ValueError as exc:
        raise SealingError(f"cannot seal to the round's shuffler key ({exc})") from None
    return codec.encode(Envelope(spec.session_id, spec.round_id, outer)), nonce


#: Nonces an :class:`EnvelopeWrapper` reads from the OS CSPRNG at once.
NONCES_PER_READ = 256


class EnvelopeWrapper:
    """Client side: wraps sealed reports of one round into envelopes (:func:`wrap`, with the
    round's constants computed once: the shuffler's parsed key, the HPKE ``info``, and the
    fixed layouts of the round's :class:`Admission` and :class:`Envelope`).

    :meth:`wrap` returns exactly the bytes :func:`wrap` returns for the same arguments
    (and nonce): a fresh HPKE encapsulation to the shuffler per envelope. A key the suite
    refuses is a :class:`SealingError` here, as there."""

    def __init__(self, spec: RoundSpec) -> None:
        try:
            self._key = X25519PublicKey.from_public_bytes(spec.shuffler_key)
        except ValueError as exc:
            raise SealingError(f"cannot seal to the round's shuffler key ({exc})") from None
        self.spec = spec
        self._info = envelope_info(spec.session_id, spec.round_id, spec.digest)
        f = envelope_format(spec.round_id, spec.mechanism)
        self._admission = FixedLayout(
            Admission(spec.round_id, bytes(CREDENTIAL_BYTES), bytes(NONCE_BYTES), bytes(f.sealed_size)),
            ("credential", "nonce", "sealed"),
        )
        self._envelope = FixedLayout(Envelope(spec.session_id, spec.round_id, bytes(f.outer_size)), ("outer",))
        self._nonces = b""
        self._nonce_at = 0
        self._nonces_pid = 0
        self._nonce_lock = threading.Lock()

    def _fresh_nonce(self) -> bytes:
        """16 fresh bytes of the OS CSPRNG, read :data:`NONCES_PER_READ` nonces at a time (one
        system call for many envelopes); each is handed out once, and never in a forked process."""
        with self._nonce_lock:  # clients answering on several threads share a round's wrapper
            at = self._nonce_at
            if at >= len(self._nonces) or self._nonces_pid != os.getpid():
                self._nonces = os.urandom(NONCE_BYTES * NONCES_PER_READ)
                self._nonces_pid = os.getpid()
                at = 0
            self._nonce_at = at + NONCE_BYTES
            return self._nonces[at : at + NONCE_BYTES]

    def wrap(self, credential: bytes, sealed: bytes, nonce: bytes | None = None) -> tuple[bytes, bytes]:
        """The encoded envelope carrying ``sealed`` under ``credential``, and its nonce."""
        spec = self.spec
        nonce = self._fresh_nonce() if nonce is None else nonce
        admission = self._admission.build(credential, nonce, sealed)
        if admission is None:  # not the round's field lengths: the general encoder (and its typed errors)
            admission = codec.encode(Admission(spec.round_id, credential, nonce, sealed))
        try:
            outer = SUITE.encrypt(admission, self._key, info=self._info)
        except ValueError as exc:
            raise SealingError(f"cannot seal to the round's shuffler key ({exc})") from None
        envelope = self._envelope.build(outer)
        if envelope is None:
            envelope = codec.encode(Envelope(spec.session_id, spec.round_id, outer))
        return envelope, nonce


class FixedLayout:
    """The one deterministic encoding of a message whose every field has a fixed length in a round.

    Built from a template message in which the ``variable`` bytes fields hold random
    markers: everything else (map header, keys, the round's fixed values) is the same
    bytes in every valid message of the round. :meth:`values` checks those bytes and
    slices the variable fields out, with no general CBOR parse. Because the wire format
    admits only the deterministic encoding, bytes that pass are exactly the valid
    messages of the round with those field lengths; callers fall back to the general
    decoder on a mismatch, for its precise typed error.
    """

    def __init__(self, template: DataclassInstance, variable: tuple[str, ...]) -> None:
        markers = {name: os.urandom(len(getattr(template, name))) for name in variable}
        encoded = codec.encode(dataclasses.replace(template, **markers))
        spans = sorted((encoded.index(marker), name, len(marker)) for name, marker in markers.items())
        self.size = len(encoded)
        self._fixed: list[tuple[int, bytes]] = []
        position = 0
        for start, name, length in spans:
            self._fixed.append((position, encoded[position:start]))
            position = start + length
        self._fixed.append((position, encoded[position:]))
        #: For :meth:`build`: which given value goes in each field's place, and its length.
        self._order = [variable.index(name) for _, name, _ in spans]
        #: For :meth:`values`: each given field's slice, in the ``variable`` order.
        self._spans_in_given_order = [(start, start + length) for start, name, length in
                                      sorted(spans, key=lambda span: variable.index(span[1]))]
        self._lengths = [length for _, name, length in spans]

    def build(self, *values: bytes) -> bytes | None:
        """The encoding of the template with its variable fields set to ``values`` (in the
        ``variable`` order given at construction), or None if a value is not ``bytes`` of its
        field's length (then only the general encoder knows its form). Exactly
        ``codec.encode(dataclasses.replace(template, **fields))``: the fixed bytes are the
        template's, and each field keeps its place and its length."""
        parts = []
        for (_, fixed), value, length in zip(self._fixed, self._ordered(values), self._lengths):
            if type(value) is not bytes or len(value) != length:
                return None
            parts.append(fixed)
            parts.append(value)
        parts.append(self._fixed[-1][1])
        return b"".join(parts)

    def _ordered(self, values: tuple[bytes, ...]) -> list[bytes]:
        """``values`` (in the constructor's ``variable`` order) in their order in the encoding."""
        if len(values) != len(self._order):
            raise TypeError(f"expected {len(self._order)} field values, got {len(values)}")
        return [values[i] for i in self._order]

    def values(self, data: bytes) -> tuple[bytes, ...] | None:
        """The variable fields of ``data`` in the constructor's ``variable`` order, or None if it is
        not this layout."""
        if len(data) != self.size:
            return None
        for start, expected in self._fixed:
            if data[start : start + len(expected)] != expected:
                return None
        return tuple([data[start:end] for start, end in self._spans_in_given_order])


#: An opened admission's ``(credential, nonce, sealed)`` (:meth:`EnvelopeOpener.open_fields`).
OpenedFields = tuple[bytes, bytes, bytes]


class EnvelopeOpener:
    """Shuffler side: opens the envelopes of one round, strictly.

    :meth:`open` returns the :class:`Admission` inside, or raises a typed error: a
    malformed envelope, another session or round (:class:`UnknownRound`), an outer
    layer or sealed report not of the round's fixed size (:class:`WrongSize`), an
    outer layer that does not open (:class:`SealingError`) or an admission for
    another round.
    """

    def __init__(self, private: X25519PrivateKey, spec: RoundSpec) -> None:
        self._private = private
        self._spec = spec
        self._info = envelope_info(spec.session_id, spec.round_id, spec.digest)
        self.format = envelope_format(spec.round_id, spec.mechanism)
        f = self.format
        self._envelope_layout = FixedLayout(Envelope(spec.session_id, spec.round_id, bytes(f.outer_size)), ("outer",))
        self._admission_layout = FixedLayout(
            Admission(spec.round_id, bytes(CREDENTIAL_BYTES), bytes(NONCE_BYTES), bytes(f.sealed_size)),
            ("credential", "nonce", "sealed"),
        )

    @property
    def spec(self) -> RoundSpec:
        """The round spec this opener admits envelopes of."""
        return self._spec

    def open(self, data: bytes) -> Admission:
        """The :class:`Admission` inside ``data``, or the typed error (class docstring)."""
        return Admission(self._spec.round_id, *self.open_fields(data))

    def open_fields(self, data: bytes) -> OpenedFields:
        """:meth:`open`'s admission as its ``(credential, nonce, sealed)``, every one checked as
        :meth:`open` checks it (the shuffler's per-envelope path, which needs no object)."""
        if not isinstance(data, bytes):
            if byte_length(data) > codec.MESSAGE_TYPES["envelope"][1]:  # typed refusal of non-bytes, before copying
                raise MessageTooLarge("envelope over its size limit")
            data = as_bytes(data)
        fields = self._envelope_layout.values(data)
        outer = fields[0] if fields is not None else self._outer_slow(data)
        try:
            plaintext = SUITE.decrypt(outer, self._private, info=self._info)
        except (InvalidTag, ValueError) as exc:
            raise SealingError(f"envelope does not open for this session, round and spec ({type(exc).__name__})") from None
        fields = self._admission_layout.values(plaintext)
        if fields is not None:  # the one valid encoding: the constructor's checks all hold
            credential, nonce, sealed = fields
            return credential, nonce, sealed
        admission = self._admission_slow(plaintext)
        return admission.credential, admission.nonce, admission.sealed

    def _outer_slow(self, data: bytes) -> bytes:
        """The general decoder's reading of an envelope not in the round's layout (raises its typed error)."""
        spec = self._spec
        envelope = codec.decode(data, Envelope)
        if envelope.session_id != spec.session_id or envelope.round_id != spec.round_id:
            raise UnknownRound(f"envelope for session {envelope.session_id.hex()} round {envelope.round_id}")
        if len(envelope.outer) != self.format.outer_size:
            raise WrongSize(f"outer layer of {len(envelope.outer)} bytes; this round's are {self.format.outer_size}")
        return envelope.outer

    def _admission_slow(self, plaintext: bytes) -> Admission:
        spec = self._spec
        admission = codec.decode(plaintext, Admission)
        if admission.round_id != spec.round_id:
            raise UnknownRound(f"admission for round {admission.round_id} inside an envelope of round {spec.round_id}")
        if len(admission.sealed) != self.format.sealed_size:
            raise WrongSize(f"sealed report of {len(admission.sealed)} bytes; this round's are {self.format.sealed_size}")
        return admission


def _label(message_type: type) -> bytes:
    return SIGNED_LABEL + codec.message_tag(message_type).encode()


def signed(private: Ed25519PrivateKey, message: M) -> M:
    """``message`` with its ``signature`` field set to ``private``'s signature (see the module docstring)."""
    return dataclasses.replace(message, signature=private.sign(_label(type(message)) + _digest(message)))


#: A signature field in a message's deterministic encoding: the key ``"signature"``, then the head of
#: a 64-byte string (the 64 bytes follow).
_SIGNATURE_FIELD = b"\x69signature\x58\x40"


def _signature_at(data: bytes, signature: bytes) -> int | None:
    """Where ``signature`` lies in ``data``, an encoded signed message: just after the signature
    field's head, if ``data`` holds that head exactly once and ``signature`` follows it; else None
    (the callers then take the general path, which re-encodes the message)."""
    at = data.find(_SIGNATURE_FIELD)
    if at < 0 or data.find(_SIGNATURE_FIELD, at + 1) >= 0:
        return None
    at += len(_SIGNATURE_FIELD)
    return at if data[at : at + SIGNATURE_BYTES] == signature else None


def signed_encoding(private: Ed25519PrivateKey, message: SignedMessage) -> bytes:
    """``codec.encode(signed(private, message))``, the same bytes, with the message encoded once.

    The message is encoded with its signature field zeroed, that encoding hashed and signed, and
    the signature written over the zeroed field where it lies (the field has a fixed size, so the
    bytes around it do not move: see the module docstring). A large batch chunk or a burst's
    receipts is so encoded and checked once instead of three times."""
    zeroed = message if message.signature == bytes(SIGNATURE_BYTES) else dataclasses.replace(message, signature=bytes(SIGNATURE_BYTES))
    data = codec.encode(zeroed)
    at = _signature_at(data, bytes(SIGNATURE_BYTES))
    if at is None:  # the field's head also occurs inside another field: the general path
        return codec.encode(signed(private, message))
    signature = private.sign(_label(type(message)) + hashlib.sha256(data).digest())
    return data[:at] + signature + data[at + SIGNATURE_BYTES :]


def verify_signed(public: bytes, message: SignedMessage) -> None:
    """Raise :class:`BadSignature` unless ``message.signature`` is ``public``'s signature of it."""
    _verify(public, _label(type(message)) + _digest(message), message.signature, type(message))


def _digest(message: SignedMessage) -> bytes:
    """SHA-256 of a signed message's encoding with its signature field zeroed."""
    return hashlib.sha256(codec.encode(dataclasses.replace(message, signature=bytes(SIGNATURE_BYTES)))).digest()


def verify_encoded(public: bytes, message_type: type, digest: bytes, signature: bytes) -> None:
    """Check a signature over an encoding's zeroed digest (:func:`encoded_digest`) without decoding it."""
    _verify(public, _label(message_type) + digest, signature, message_type)


def _verify(public: bytes, data: bytes, signature: bytes, message_type: type) -> None:
    verify(public, data, signature, what=codec.message_tag(message_type))


def spec_signing_string(spec_bytes: bytes) -> bytes:
    """What the analyzer's signature on a round spec covers: ``"shuffledp/v3/signed/round-spec" ||
    SHA-256(spec bytes)``, the rule of every other signed message. The label keeps a signature
    the analyzer made on anything else (an acknowledgement, say) from verifying as a spec."""
    return _label(RoundSpec) + hashlib.sha256(spec_bytes).digest()


def sign_spec_bytes(private: Ed25519PrivateKey, spec_bytes: bytes) -> bytes:
    """The analyzer's signature on an encoded RoundSpec (see :func:`spec_signing_string`)."""
    return private.sign(spec_signing_string(spec_bytes))


def verified_spec(signed: SignedRoundSpec | bytes, analyzer_signing_key: bytes) -> RoundSpec:
    """The RoundSpec inside a signed spec (encoded or decoded), if the analyzer's signature over
    its canonical bytes verifies; a typed error otherwise. Clients and shufflers both use it."""
    if not isinstance(signed, SignedRoundSpec):
        signed = codec.decode(signed, SignedRoundSpec)  # bytes-like, or a typed MalformedMessage
    verify(analyzer_signing_key, spec_signing_string(signed.spec_bytes), signed.signature)
    spec = codec.decode(signed.spec_bytes, RoundSpec)
    if codec.encode(spec) != signed.spec_bytes:
        # An integer in a float field: the bytes every party re-creates, and so the spec
        # digest the round is bound to, would differ from what was signed.
        raise MalformedMessage("the signed spec is not in its canonical encoding (a float field written as an integer)")
    return spec


def decode_verified(data: bytes, expected: type[M], public: bytes) -> M:
    """Decode a signed message and check its signature, or raise a typed error.

    The signed digest is computed from ``data`` as received, its signature field zeroed in place
    (:func:`encoded_digest`), not from a re-encoding of the decoded message. For the one deterministic
    encoding of a message the two are the same bytes. Bytes in any other form cannot verify: the
    signer hashes only deterministic encodings, so a form whose zeroed bytes it never hashed would
    need a SHA-256 second preimage. Where the field's position is not plain (its head occurs twice)
    the message is re-encoded, as :func:`verify_signed` does."""
    message = codec.decode(data, expected)
    data = as_bytes(data)
    at = _signature_at(data, message.signature)
    if at is None:
        verify_signed(public, message)
    else:
        verify_encoded(public, expected, encoded_digest(data, at), message.signature)
    return message


__all__ = [
    "EnvelopeFormat",
    "EnvelopeOpener",
    "EnvelopeWrapper",
    "ShufflerKeys",
    "decode_verified",
    "encoded_digest",
    "envelope_format",
    "envelope_info",
    "sign_spec_bytes",
    "signed",
    "signed_encoding",
    "spec_signing_string",
    "verified_spec",
    "verify_encoded",
    "verify_signed",
    "wrap",
]
