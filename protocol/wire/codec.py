"""Versioned CBOR wire codec with hard size limits.

Every message is one CBOR map (RFC 8949, deterministic encoding) with two fixed
keys, ``"v"`` (wire version) and ``"t"`` (message type), plus one key per dataclass
field of :mod:`shuffledp.protocol.wire.messages`. Mechanism parameters are a nested
map whose ``"mechanism"`` key selects the parameter type. The schema, in CDDL, is
in ``docs/wire-format.md``; JSON test vectors are in ``tests/protocol/vectors/``.

Decoding is total and bounded: the size limit is checked before parsing; the bytes
are read by :mod:`shuffledp.protocol.wire.cbor_strict`, which accepts only the
deterministic CBOR subset the format uses (no tags, no indefinite lengths, no
simple values, no NaN or infinities, no duplicate keys) in time and memory linear
in the input; unknown or missing keys, wrong types and out-of-range values are
all rejected with :class:`~shuffledp.protocol.errors.MalformedMessage` (or a
subclass), never with a bare ``KeyError``, ``TypeError`` or ``ValueError``.
Encoding uses cbor2's canonical mode, which produces exactly that subset.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any, TypeVar, get_args, get_origin

import cbor2

from shuffledp.protocol.wire import messages as m
from shuffledp.protocol.wire.cbor_strict import StrictReader, as_bytes, byte_length
from shuffledp.protocol.errors import (
    InvalidParameter,
    MalformedMessage,
    MessageTooLarge,
    UnsupportedVersion,
)

#: Message type tag on the wire -> (class, hard size limit in bytes).
MESSAGE_TYPES: dict[str, tuple[type, int]] = {
    "round-spec": (m.RoundSpec, 24 * 1024),  # a vector-mean round names 2 bounds per coordinate
    "signed-round-spec": (m.SignedRoundSpec, 25 * 1024),
    "report": (m.Report, 256),
    "admission": (m.Admission, 2048),
    "envelope": (m.Envelope, 4096),
    "shuffled-batch": (m.ShuffledBatch, 512 * 1024 * 1024),
    "batch-ack": (m.BatchAck, 256),
    "admission-receipts": (m.AdmissionReceipts, 4 * 1024 * 1024),
    "round-outcome": (m.RoundOutcome, 512),
}
_TYPE_OF: dict[type, str] = {cls: tag for tag, (cls, _) in MESSAGE_TYPES.items()}
MAX_MESSAGE_BYTES = max(limit for _, limit in MESSAGE_TYPES.values())


def message_tag(cls: type) -> str:
    """The wire type tag of a message class (``"envelope"``, ``"shuffled-batch"``, ...)."""
    tag = _TYPE_OF.get(cls)
    if tag is None:
        raise InvalidParameter("message", f"{getattr(cls, '__name__', cls)!r} is not a wire message")
    return tag

T = TypeVar("T")


#: Types that go on the wire as they are (checked first: a batch or receipts message holds thousands).
_AS_IS = frozenset({bytes, str, int, float, bool, type(None)})


def _to_wire(value: Any) -> Any:
    if type(value) in _AS_IS:
        return value
    if dataclasses.is_dataclass(value):
        out = {f.name: _to_wire(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if hasattr(value, "MECHANISM"):
            out["mechanism"] = value.MECHANISM
        return out
    if isinstance(value, tuple):
        return [v if type(v) in _AS_IS else _to_wire(v) for v in value]
    return value


def encode(message: Any) -> bytes:
    """Encode a message dataclass as deterministic CBOR with its version and type."""
    tag = _TYPE_OF.get(type(message))
    if tag is None:
        raise InvalidParameter("message", f"{type(message).__name__} is not a wire message")
    body = _to_wire(message)
    body["v"] = m.WIRE_VERSION
    body["t"] = tag
    data = cbor2.dumps(body, canonical=True)
    limit = MESSAGE_TYPES[tag][1]
    if len(data) > limit:
        raise MessageTooLarge(f"{tag} encodes to {len(data)} bytes, over its limit of {limit}")
    return data


def canonical_encode(message: Any) -> bytes:
    """The one encoding a receiver re-creates from ``message``'s decoded form.

    A field typed float may be built from an int (``HadamardRangeParams(-4, 4, 1)``);
    :func:`encode` writes it as a CBOR integer, and a receiver decodes it as a float and
    re-encodes a float. A signed message whose digest must be the same on both sides (a
    round spec: :attr:`RoundSpec.digest`) is therefore signed and hashed in this form,
    the encoding of the decoded message."""
    return encode(decode(encode(message), type(message)))


def _check_scalar(value: Any, kind: type, where: str) -> Any:
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise MalformedMessage(f"{where}: expected a number, got {type(value).__name__}")
        try:
            return float(value)
        except OverflowError:
            raise MalformedMessage(f"{where}: integer too large for a float") from None
    if kind is int and isinstance(value, bool):
        raise MalformedMessage(f"{where}: expected an integer, got a boolean")
    if not isinstance(value, kind):
        raise MalformedMessage(f"{where}: expected {kind.__name__}, got {type(value).__name__}")
    return value


def _from_wire(kind: Any, value: Any, where: str) -> Any:
    origin = get_origin(kind)
    if origin is typing.Union:  # the mechanism parameter union
        if not isinstance(value, dict) or not isinstance(value.get("mechanism"), str):
            raise MalformedMessage(f"{where}: expected a parameter map with a 'mechanism' name")
        cls = m.MECHANISMS.get(value["mechanism"])
        if cls is None:
            raise MalformedMessage(f"{where}: unknown mechanism {m.short_repr(value['mechanism'])}")
        body = {k: v for k, v in value.items() if k != "mechanism"}
        return _build(cls, body, where)
    if origin is tuple:
        item_kind = get_args(kind)[0]
        if not isinstance(value, list):
            raise MalformedMessage(f"{where}: expected an array, got {type(value).__name__}")
        return tuple(_check_scalar(v, item_kind, where) for v in value)
    return _check_scalar(value, kind, where)


@functools.cache
def _schema(cls: type) -> tuple[dict[str, Any], dict[str, dataclasses.Field]]:
    """The field types and fields of a message class (resolved once; get_type_hints is slow)."""
    return typing.get_type_hints(cls), {f.name: f for f in dataclasses.fields(cls)}


def _build(cls: type[T], body: dict, where: str) -> T:
    message_class: type = cls
    hints, fields = _schema(message_class)
    unknown = set(body) - set(fields)
    if unknown:
        raise MalformedMessage(f"{where}: {len(unknown)} unknown key(s), e.g. {m.short_repr(min(map(str, unknown)))}")
    kwargs = {}
    for name in fields:
        # Every key is required, defaulted ones too: the deterministic encoding always writes
        # every field, so a message without one is not an encoding this format produces
        # (and a signed message stripped of its signature must not decode as unsigned).
        if name not in body:
            raise MalformedMessage(f"{where}: missing key {name!r}")
        kwargs[name] = _from_wire(hints[name], body[name], f"{where}.{name}")
    try:
        return cls(**kwargs)
    except InvalidParameter as exc:
        raise MalformedMessage(f"{where}: {exc}") from None


def decode(data: bytes, expected: type[T] | None = None, *, max_items: int | None = None) -> T:
    """Decode bytes into a validated message; ``expected`` pins the message class.

    ``max_items`` bounds every array and map (a batch decoder passes the round's
    ``max_batch``), checked when the length is read, before anything is allocated.
    Raises :class:`MessageTooLarge`, :class:`UnsupportedVersion` or
    :class:`MalformedMessage`; never anything else for any input bytes.
    """
    size = byte_length(data)
    limit = MESSAGE_TYPES[_TYPE_OF[expected]][1] if expected in _TYPE_OF else MAX_MESSAGE_BYTES
    if size > limit:
        raise MessageTooLarge(f"{size} bytes, over the limit of {limit}")
    raw = as_bytes(data)
    reader = StrictReader(raw, max_items=max_items)
    body = reader.read()
    if reader.pos != len(raw):
        raise MalformedMessage(f"{len(raw) - reader.pos} trailing bytes after the CBOR item")
    return _message_from_body(body, expected, len(raw))


def decode_padded(data: bytes, expected: type[T]) -> T:
    """Decode a message followed by zero padding (how report plaintexts travel; see ``report_format``).

    The general, schema-driven reader of a padded report: the analyzer's hot path
    (:meth:`ReportFormat.values`) must accept exactly what this accepts for the round.
    """
    if expected not in _TYPE_OF:
        raise InvalidParameter("expected", f"must be a wire message class, got {expected!r}")
    size = byte_length(data)
    limit = MESSAGE_TYPES[_TYPE_OF[expected]][1]
    if size > limit:
        raise MessageTooLarge(f"{size} bytes, over the limit of {limit}")
    raw = as_bytes(data)
    reader = StrictReader(raw)
    body = reader.read()
    if raw[reader.pos :].count(0) != len(raw) - reader.pos:
        raise MalformedMessage("padding after the CBOR item must be zero bytes")
    return _message_from_body(body, expected, reader.pos)


def _message_from_body(body: Any, expected: type | None, size: int) -> Any:
    if not isinstance(body, dict):
        raise MalformedMessage("top level must be a CBOR map")
    version = body.pop("v", None)
    if type(version) is not int:  # not float: the strict reader returns ints and floats apart
        raise MalformedMessage("missing or invalid wire version 'v'")
    if version != m.WIRE_VERSION:
        raise UnsupportedVersion(f"wire version {m.short_repr(version)}; this build speaks {m.WIRE_VERSION}")
    tag = body.pop("t", None)
    if not isinstance(tag, str) or tag not in MESSAGE_TYPES:
        raise MalformedMessage(f"unknown message type {m.short_repr(tag)}")
    cls, type_limit = MESSAGE_TYPES[tag]
    if expected is not None and cls is not expected:
        raise MalformedMessage(f"expected {_TYPE_OF.get(expected, expected)}, got {tag}")
    if size > type_limit:
        raise MessageTooLarge(f"{tag} of {size} bytes, over its limit of {type_limit}")
    return _build(cls, body, tag)
