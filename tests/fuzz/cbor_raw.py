"""A raw CBOR emitter for hostile test inputs (tests only; deliberately not cbor2).

cbor2 refuses to *write* most of what the fuzz suite needs to send: non-shortest
argument widths, unsorted or duplicate map keys, declared lengths longer than the
data, bare break bytes, reserved additional-information values. This module writes
any of them. Plain Python values encode deterministically (RFC 8949 §4.2.1: shortest
integers, lengths and floats, map keys sorted bytewise by their encodings), which is
exactly the subset ``shuffledp.protocol.wire.cbor_strict`` accepts; the node classes
below encode everything else.

Plain values: ``int`` (outside 64 bits: a tag 2/3 bignum), ``float`` (shortest exact
width; NaN as ``f97e00``), ``bool``/``None`` (simple values), ``bytes``, ``str``,
``list``/``tuple`` (arrays), ``dict`` (canonically sorted maps, keys of any type).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any

#: argument width in bytes -> additional information value
_INFO_OF_WIDTH = {1: 24, 2: 25, 4: 26, 8: 27}


def shortest_width(arg: int) -> int:
    """Bytes the shortest head of ``arg`` needs after the initial byte (0 = inline)."""
    if arg < 24:
        return 0
    for width in (1, 2, 4, 8):
        if arg < 1 << (8 * width):
            return width
    raise ValueError("CBOR arguments are at most 64 bits")


def head(major: int, arg: int, width: int | None = None) -> bytes:
    """Initial byte and argument; ``width`` forces 0 (inline), 1, 2, 4 or 8 argument bytes.

    A forced width smaller than the argument needs keeps the low bytes (so the caller
    can also write a *wrong* argument on purpose).
    """
    if width is None:
        width = shortest_width(arg)
    if width == 0:
        return bytes([(major << 5) | (arg & 0x1F if arg >= 24 else arg)])
    return bytes([(major << 5) | _INFO_OF_WIDTH[width]]) + (arg % (1 << (8 * width))).to_bytes(width, "big")


class Node:
    """Base class of the explicit encodings below."""

    def encode(self) -> bytes:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass
class Raw(Node):
    """Literal bytes, inserted as they are (e.g. a lone break ``ff`` or a reserved head ``fc``)."""

    data: bytes

    def encode(self) -> bytes:
        return bytes(self.data)


@dataclass
class Head(Node):
    """A bare head of any major type: ``arg`` at a forced ``width``, or a raw ``info`` value
    (24..31: e.g. 28-30 reserved, 31 indefinite/break) with no argument bytes. Nothing follows
    it, so a head that declares content (a string length, an item count, a tag) dangles."""

    major: int
    arg: int = 0
    width: int | None = None
    info: int | None = None

    def encode(self) -> bytes:
        if self.info is not None:
            return bytes([(self.major << 5) | self.info])
        return head(self.major, self.arg, self.width)


@dataclass
class Int(Node):
    """An integer, optionally with a forced argument width; outside 64 bits it becomes a bignum tag."""

    value: int
    width: int | None = None

    def encode(self) -> bytes:
        v = self.value
        if v >= 0:
            if v >= 1 << 64:
                return encode(bignum(v))
            return head(0, v, self.width)
        n = -1 - v
        if n >= 1 << 64:
            return encode(bignum(v))
        return head(1, n, self.width)


@dataclass
class Bytes(Node):
    """A byte string; ``declared`` overrides the length in the head (e.g. longer than the data)."""

    data: bytes
    width: int | None = None
    declared: int | None = None

    def encode(self) -> bytes:
        n = len(self.data) if self.declared is None else self.declared
        return head(2, n, self.width) + bytes(self.data)


@dataclass
class Text(Node):
    """A text string from ``str`` or raw ``bytes`` (which may be invalid UTF-8)."""

    text: str | bytes
    width: int | None = None
    declared: int | None = None

    def encode(self) -> bytes:
        raw = self.text.encode("utf-8", "surrogatepass") if isinstance(self.text, str) else bytes(self.text)
        n = len(raw) if self.declared is None else self.declared
        return head(3, n, self.width) + raw


@dataclass
class Array(Node):
    """An array; ``indefinite`` uses ``9f ... ff``; ``declared`` overrides the item count."""

    items: list = field(default_factory=list)
    width: int | None = None
    declared: int | None = None
    indefinite: bool = False

    def encode(self) -> bytes:
        body = b"".join(encode(item) for item in self.items)
        if self.indefinite:
            return b"\x9f" + body + b"\xff"
        n = len(self.items) if self.declared is None else self.declared
        return head(4, n, self.width) + body


@dataclass
class Map(Node):
    """A map from a list of ``(key, value)`` pairs, emitted in the given order.

    Duplicate keys, keys of any type and any order are allowed; ``canonical=True``
    sorts the pairs bytewise by their encoded keys, as the deterministic encoding does.
    """

    pairs: list = field(default_factory=list)
    width: int | None = None
    declared: int | None = None
    indefinite: bool = False
    canonical: bool = False

    def encode(self) -> bytes:
        encoded = [(encode(k), encode(v)) for k, v in self.pairs]
        if self.canonical:
            encoded.sort(key=lambda kv: kv[0])
        body = b"".join(k + v for k, v in encoded)
        if self.indefinite:
            return b"\xbf" + body + b"\xff"
        n = len(self.pairs) if self.declared is None else self.declared
        return head(5, n, self.width) + body


@dataclass
class IndefString(Node):
    """An indefinite-length byte (major 2) or text (major 3) string of chunks.

    Chunks are normally ``bytes``/``str`` of the same major type; any node may be
    given instead, to write a chunk of the wrong type.
    """

    major: int
    chunks: list = field(default_factory=list)

    def encode(self) -> bytes:
        body = []
        for chunk in self.chunks:
            if isinstance(chunk, Node):
                body.append(chunk.encode())
            elif self.major == 2:
                body.append(Bytes(bytes(chunk)).encode())
            else:
                body.append(Text(chunk).encode())
        return bytes([(self.major << 5) | 31]) + b"".join(body) + b"\xff"


@dataclass
class Tag(Node):
    """Tag ``number`` (any 64-bit value, optionally with a forced width) around ``value``."""

    number: int
    value: Any
    width: int | None = None

    def encode(self) -> bytes:
        return head(6, self.number, self.width) + encode(self.value)


@dataclass
class Simple(Node):
    """A simple value (major 7): 20 false, 21 true, 22 null, 23 undefined, others unassigned.

    ``two_byte=True`` writes ``f8 xx`` even for a value below 32 (ill-formed in CBOR).
    """

    value: int
    two_byte: bool = False

    def encode(self) -> bytes:
        if self.value < 24 and not self.two_byte:
            return bytes([0xE0 | self.value])
        return bytes([0xF8, self.value & 0xFF])


@dataclass
class Float(Node):
    """A float at a forced width (2, 4 or 8 bytes) or the shortest exact one (``width=None``)."""

    value: float
    width: int | None = None

    def encode(self) -> bytes:
        if self.width is None:
            return _shortest_float(self.value)
        fmt, info = {2: (">e", 25), 4: (">f", 26), 8: (">d", 27)}[self.width]
        try:
            packed = struct.pack(fmt, self.value)
        except OverflowError:  # too large for the width: write infinity of the sign
            packed = struct.pack(fmt, math.copysign(math.inf, self.value))
        return bytes([0xE0 | info]) + packed


@dataclass
class FloatBits(Node):
    """A float from its raw bits (e.g. a NaN with a payload, a signalling NaN)."""

    bits: int
    width: int = 8

    def encode(self) -> bytes:
        info = {2: 25, 4: 26, 8: 27}[self.width]
        return bytes([0xE0 | info]) + (self.bits % (1 << (8 * self.width))).to_bytes(self.width, "big")


BREAK = Raw(b"\xff")
UNDEFINED = Simple(23)


def _shortest_float(value: float) -> bytes:
    if math.isnan(value):
        return b"\xf9\x7e\x00"
    for fmt, info in ((">e", 25), (">f", 26)):
        try:
            packed = struct.pack(fmt, value)
        except OverflowError:
            continue
        if struct.unpack(fmt, packed)[0] == value:
            return bytes([0xE0 | info]) + packed
    return b"\xfb" + struct.pack(">d", value)


def bignum(value: int, *, pad: int = 0) -> Tag:
    """Tag 2 (unsigned) or tag 3 (negative) bignum of ``value`` (any size, even small),
    with ``pad`` leading zero bytes (a non-minimal bignum)."""
    n = value if value >= 0 else -1 - value
    length = max(1, (n.bit_length() + 7) // 8) + pad
    return Tag(2 if value >= 0 else 3, Bytes(n.to_bytes(length, "big")))


def shared(value: Any) -> Tag:
    """Tag 28: mark ``value`` as shareable (the value-sharing extension)."""
    return Tag(28, value)


def shared_ref(index: int) -> Tag:
    """Tag 29: a reference to the ``index``-th shared value (may point at its own container)."""
    return Tag(29, Int(index))


def nest(value: Any, depth: int, kind: str = "array") -> Any:
    """``value`` wrapped in ``depth`` arrays (or single-entry maps, or tags).

    Deep nests are returned as :class:`Raw` bytes, so encoding (and copying) them
    never recurses ``depth`` times in Python.
    """
    prefix = {"array": b"\x81", "map": b"\xa1\x61k", "tag": b"\xc0"}[kind]
    if depth > 50:
        return Raw(prefix * depth + encode(value))
    for _ in range(depth):
        if kind == "array":
            value = Array([value])
        elif kind == "map":
            value = Map([["k", value]])
        else:
            value = Tag(0, value)
    return value


def encode(obj: Any) -> bytes:
    """The CBOR bytes of a plain value or :class:`Node` (see the module docstring)."""
    if isinstance(obj, Node):
        return obj.encode()
    if obj is True:
        return b"\xf5"
    if obj is False:
        return b"\xf4"
    if obj is None:
        return b"\xf6"
    if isinstance(obj, int):
        return Int(obj).encode()
    if isinstance(obj, float):
        return _shortest_float(obj)
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return Bytes(bytes(obj)).encode()
    if isinstance(obj, str):
        return Text(obj).encode()
    if isinstance(obj, (list, tuple)):
        return Array(list(obj)).encode()
    if isinstance(obj, dict):
        return Map(list(obj.items()), canonical=True).encode()
    raise TypeError(f"cannot encode {type(obj).__name__}")


dumps = encode
