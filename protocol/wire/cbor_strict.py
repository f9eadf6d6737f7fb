"""A strict reader for the deterministic CBOR subset the wire format uses.

Why not ``cbor2.loads``: cbor2 is a general decoder. Before any hook could refuse
them it materialises bignums of any length (tags 2/3; a 5,000-digit integer then
breaks error formatting), resolves shared references (tags 28/29, which can build
self-referential or unhashable map keys), follows indefinite lengths and accepts
duplicate map keys. None of these is part of the shuffledp wire format, so this
module reads *only* the subset the format uses and refuses everything else at the
first byte that shows it, before it costs anything:

* major types 0/1 (integers up to 64 bits), 2 (byte strings), 3 (UTF-8 text),
  4 (arrays), 5 (maps with text keys), and 7 only for half/single/double floats;
* definite lengths only; no tags (major type 6); no simple values (no
  ``true``/``false``/``null``/``undefined``); no NaN or infinities;
* the deterministic encoding of RFC 8949 §4.2.1: every integer and length in its
  shortest form, floats in the shortest of half/single/double that holds the value
  exactly, map keys in strictly increasing bytewise order of their encodings (which
  also refuses duplicate keys);
* nesting depth at most :data:`MAX_DEPTH`, array and map lengths at most
  ``max_items`` (arrays only) and never more than the bytes that remain (every item takes at
  least one byte), so a declared length cannot make the reader allocate ahead of
  the input.

Cost: every item consumes at least one input byte and is handled in O(1) work
plus the copy of its own bytes, so reading an input of L bytes takes O(L) time.
Memory is bounded too: each item is charged :data:`ITEM_COST` bytes (about what a
small Python object and its list slot take) plus its string length, and reading
stops once the charge passes ``ALLOCATION_FACTOR * L + ALLOCATION_SLACK`` (4 L plus
128 KiB). Without it a batch of one-byte strings (2 input bytes each) would become
about 20 times its size in Python objects. :attr:`StrictReader.items` counts the items read; the fuzz
tests check ``items <= L``.

Every refusal raises :class:`~shuffledp.protocol.errors.MalformedMessage` with a
short message (offsets and sizes only, never the offending value).
"""

from __future__ import annotations

import math
import struct
from typing import Any

from shuffledp.protocol.errors import MalformedMessage

#: Deepest nesting the wire format uses is 2 (a message map holding a parameter map
#: or an array); 4 leaves room for compatible growth.
MAX_DEPTH = 4

#: Bytes charged per item read, on top of its string length (a small object plus a list slot).
ITEM_COST = 40
#: Reading stops once the charge exceeds ALLOCATION_FACTOR * len(input) + ALLOCATION_SLACK.
ALLOCATION_FACTOR = 4
#: Enough for the largest honest round spec: a vector-mean round over 1,024 coordinates
#: names 2,048 bounds, each a 3..9-byte float charged 40 bytes (up to 13 times its size).
ALLOCATION_SLACK = 128 * 1024

_HALF = struct.Struct(">e")
_SINGLE = struct.Struct(">f")
_DOUBLE = struct.Struct(">d")
_UINT = {24: (1, 24), 25: (2, 256), 26: (4, 65536), 27: (8, 1 << 32)}  # width, smallest value that needs it


class StrictReader:
    """Reads one CBOR data item from ``data`` under the rules in the module docstring."""

    __slots__ = ("data", "pos", "end", "items", "max_items", "charge", "allowance")

    def __init__(self, data: bytes, *, max_items: int | None = None) -> None:
        data = as_bytes(data)
        self.data = data
        self.pos = 0
        self.end = len(data)
        self.items = 0
        self.max_items = max_items
        self.charge = 0
        self.allowance = ALLOCATION_FACTOR * len(data) + ALLOCATION_SLACK

    def fail(self, problem: str) -> MalformedMessage:
        return MalformedMessage(f"CBOR at byte {self.pos}: {problem}")

    def _argument(self, info: int) -> int:
        if info < 24:
            return info
        spec = _UINT.get(info)
        if spec is None:
            if info == 31:
                raise self.fail("indefinite lengths are not allowed")
            raise self.fail(f"reserved additional information {info}")
        width, smallest = spec
        start = self.pos
        stop = start + width
        if stop > self.end:
            raise self.fail("truncated")
        value = int.from_bytes(self.data[start:stop], "big")
        if value < smallest:
            raise self.fail("integer or length not in its shortest form")
        self.pos = stop
        return value

    def _length(self, info: int, what: str) -> int:
        length = self._argument(info)
        if length > self.end - self.pos:
            raise self.fail(f"{what} of {length} declared, only {self.end - self.pos} bytes remain")
        return length

    def read(self, depth: int = 0) -> Any:
        """The next data item as Python ``int``, ``float``, ``bytes``, ``str``, ``list`` or ``dict``."""
        if self.pos >= self.end:
            raise self.fail("truncated")
        self.items += 1
        self.charge += ITEM_COST
        if self.charge > self.allowance:
            raise self.fail(f"expands past {ALLOCATION_FACTOR} times its {self.end} bytes in objects")
        initial = self.data[self.pos]
        self.pos += 1
        major = initial >> 5
        info = initial & 0x1F
        if major == 0:
            return self._argument(info)
        if major == 1:
            return -1 - self._argument(info)
        if major == 2:
            length = self._length(info, "byte string")
            self.charge += length
            start = self.pos
            self.pos += length
            return self.data[start : self.pos]
        if major == 3:
            length = self._length(info, "text string")
            self.charge += length
            start = self.pos
            self.pos += length
            try:
                return self.data[start : self.pos].decode("utf-8")
            except UnicodeDecodeError:
                raise self.fail("text string is not valid UTF-8") from None
        if major == 4:
            count = self._container(info, depth, "array")
            return [self.read(depth + 1) for _ in range(count)]
        if major == 5:
            return self._map(self._container(info, depth, "map"), depth)
        if major == 6:
            raise self.fail("tags are not allowed")
        return self._float(info)

    def _container(self, info: int, depth: int, what: str) -> int:
        if depth >= MAX_DEPTH:
            raise self.fail(f"nesting deeper than {MAX_DEPTH}")
        count = self._length(info, what)
        if what == "array" and self.max_items is not None and count > self.max_items:
            raise self.fail(f"{what} of {count} items, over the limit of {self.max_items}")
        return count

    def _map(self, count: int, depth: int) -> dict:
        out: dict[str, Any] = {}
        previous = b""
        data = self.data
        for _ in range(count):
            start = self.pos
            key = self.read(depth + 1)
            if not isinstance(key, str):
                raise self.fail("map keys must be text strings")
            encoded = data[start : self.pos]
            if encoded <= previous:
                raise self.fail("map keys not in strictly increasing deterministic order (or duplicated)")
            previous = encoded
            out[key] = self.read(depth + 1)
        return out

    def _float(self, info: int) -> float:
        if info == 25:
            width, codec = 2, _HALF
        elif info == 26:
            width, codec = 4, _SINGLE
        elif info == 27:
            width, codec = 8, _DOUBLE
        else:
            raise self.fail("simple values (true, false, null, undefined) are not allowed")
        start = self.pos
        stop = start + width
        if stop > self.end:
            raise self.fail("truncated")
        (value,) = codec.unpack(self.data[start:stop])
        if not math.isfinite(value):
            raise self.fail("NaN and infinities are not allowed")
        if width > 2 and _fits(value, _HALF if width == 4 else _SINGLE):
            raise self.fail("float not in its shortest exact form")
        if width == 8 and _fits(value, _HALF):
            raise self.fail("float not in its shortest exact form")
        self.pos = stop
        return value


def byte_length(data: object) -> int:
    """The number of bytes in a bytes-like ``data`` (a memoryview's ``nbytes``, not its first
    dimension), without copying; :class:`MalformedMessage` for anything else or a released buffer."""
    if isinstance(data, (bytes, bytearray)):
        return len(data)
    if isinstance(data, memoryview):
        try:
            return data.nbytes
        except ValueError as exc:  # a released memoryview
            raise MalformedMessage(f"unreadable buffer ({exc})") from None
    raise MalformedMessage(f"expected bytes, got {type(data).__name__}")


def as_bytes(data: object) -> bytes:
    """``data`` as ``bytes`` if it is bytes-like, else :class:`MalformedMessage` (never an untyped error)."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        try:
            return bytes(data)
        except (TypeError, ValueError, BufferError) as exc:
            raise MalformedMessage(f"unreadable buffer ({type(exc).__name__})") from None
    raise MalformedMessage(f"expected bytes, got {type(data).__name__}")


def _fits(value: float, narrower: struct.Struct) -> bool:
    try:
        return narrower.unpack(narrower.pack(value))[0] == value
    except OverflowError:
        return False


def loads(data: bytes, *, max_items: int | None = None) -> Any:
    """Read exactly one strict CBOR item that spans all of ``data``."""
    reader = StrictReader(data, max_items=max_items)
    value = reader.read()
    if reader.pos != reader.end:
        raise MalformedMessage(f"{reader.end - reader.pos} trailing bytes after the CBOR item")
    return value
