"""Fixed-size report plaintexts: padding before sealing, and the strict reader on open.

Size is a side channel. A CBOR integer takes 1, 2, 3, 5 or 9 bytes depending on its
magnitude, so an unpadded sealed report would tell the shuffler, the broker and
anyone on the network something about each user's value. The rule (wire format
version 2, ``docs/wire-format.md``):

    every report plaintext of a round is padded with zero bytes to
    ``size = len(encode(Report(round_id, mechanism, (-2**62,) * k)))``,
    the deterministic encoding of the round's report with each of its ``k`` values
    at the widest an integer of the format can take (9 bytes).

``size`` depends only on the round id and the mechanism, never on a value, so every
sealed payload of a round is ``size + 48`` bytes (HPKE's 32-byte encapsulated key
and 16-byte tag) and every envelope of a round has one length too. CBOR items are
self-delimiting, so the padding needs no length prefix: the opener reads one item
and requires every byte after it to be zero.

:meth:`ReportFormat.values` is the analyzer's hot path. Because the wire format
admits only the deterministic encoding, a valid report of the round has exactly one
encoding: a fixed prefix (map header, ``t``, ``v``, the ``values`` key), the values
array, a fixed suffix (``round_id``, ``mechanism``), then zeros. The reader checks
the prefix and suffix byte for byte and parses only the integers, each in its
shortest form. The test suite checks that it accepts exactly what the general
strict decoder (:func:`shuffledp.protocol.codec.decode`) accepts.
"""

from __future__ import annotations

import functools

from shuffledp.protocol import codec
from shuffledp.protocol.cbor_strict import StrictReader, as_bytes
from shuffledp.protocol.errors import MalformedMessage, MessageTooLarge
from shuffledp.protocol.messages import MECHANISMS, WIRE_VERSION, Report

#: Bytes HPKE adds to a plaintext: the X25519 encapsulated key (32) and the AEAD tag (16).
HPKE_OVERHEAD = 48
#: Magnitude every report value stays below (``messages.Report`` enforces it).
VALUE_LIMIT = 2**62


class WrongSize(MalformedMessage):
    """A sealed payload or report plaintext that is not the round's fixed size."""

    reason = "wrong-size"


class BadPadding(MalformedMessage):
    """A report plaintext whose bytes after the report are not all zero."""

    reason = "bad-padding"


class ReportFormat:
    """The fixed layout of one round's report plaintext (see the module docstring)."""

    def __init__(self, round_id: int, mechanism: str) -> None:
        cls = MECHANISMS.get(mechanism)
        if cls is None:
            raise MalformedMessage(f"unknown mechanism {mechanism!r}")
        self.round_id = round_id
        self.mechanism = mechanism
        self.width = cls.VALUES_PER_REPORT
        widest = codec.encode(Report(round_id, mechanism, (-VALUE_LIMIT,) * self.width))
        #: Length every report plaintext of the round is padded to.
        self.size = len(widest)
        #: Length of every sealed payload of the round.
        self.sealed_size = self.size + HPKE_OVERHEAD
        template = codec.encode(Report(round_id, mechanism, (0,) * self.width))
        array = bytes([0x80 | self.width]) + bytes(self.width)  # [0, 0, ...]: zero encodes as 0x00
        key = b"\x66values"
        cut = template.index(key + array) + len(key)
        self._prefix = template[:cut]
        self._suffix = template[cut + len(array) :]
        self._array_header = 0x80 | self.width
        if self._prefix + array + self._suffix != template:  # pragma: no cover - layout invariant
            raise AssertionError("report template does not split around its values array")

    def pad(self, encoded_report: bytes) -> bytes:
        """``encoded_report`` followed by zeros up to :attr:`size`."""
        if len(encoded_report) > self.size:
            raise WrongSize(f"report of {len(encoded_report)} bytes exceeds the round's {self.size}")
        return encoded_report + bytes(self.size - len(encoded_report))

    def values(self, plaintext: bytes) -> tuple[int, ...]:
        """The values of a padded report plaintext of this round, or a typed error.

        Refuses (``MalformedMessage`` or a subclass): a wrong length, another round,
        mechanism or shape, a non-shortest integer, non-zero padding. Value *ranges*
        beyond the format's ``|v| < 2**62`` are the mechanism's to check.
        """
        data = as_bytes(plaintext)
        if len(data) != self.size:
            raise WrongSize(f"report plaintext of {len(data)} bytes, expected {self.size}")
        prefix = self._prefix
        if not data.startswith(prefix):
            raise MalformedMessage("not a report of this round's layout")
        pos = len(prefix)
        if data[pos] != self._array_header:
            raise MalformedMessage(f"report values must be an array of {self.width}")
        pos += 1
        out = []
        for _ in range(self.width):
            initial = data[pos]
            major = initial >> 5
            info = initial & 0x1F
            pos += 1
            if major > 1:
                raise MalformedMessage("report values must be integers")
            if info < 24:
                argument = info
            else:
                width = _ARGUMENT_WIDTH.get(info)
                if width is None:
                    raise MalformedMessage("report value has an invalid integer header")
                argument = int.from_bytes(data[pos : pos + width], "big")
                if argument < _SHORTEST[info]:
                    raise MalformedMessage("report value not in its shortest form")
                pos += width
            value = argument if major == 0 else -1 - argument
            if not -VALUE_LIMIT <= value < VALUE_LIMIT:
                raise MalformedMessage("report value outside the format's range")
            out.append(value)
        suffix = self._suffix
        end = pos + len(suffix)
        if data[pos:end] != suffix:
            raise MalformedMessage("not a report of this round's layout")
        if data[end:].count(0) != self.size - end:
            raise BadPadding("report padding must be zero bytes")
        return tuple(out)


_ARGUMENT_WIDTH = {24: 1, 25: 2, 26: 4, 27: 8}
_SHORTEST = {24: 24, 25: 256, 26: 65536, 27: 1 << 32}


@functools.lru_cache(maxsize=64)
def report_format(round_id: int, mechanism: str) -> ReportFormat:
    """The (cached) layout of a round's reports."""
    return ReportFormat(round_id, mechanism)


def _uint_header(major: int, value: int) -> bytes:
    """The shortest CBOR header of ``major`` type with argument ``value``."""
    top = major << 5
    if value < 24:
        return bytes([top | value])
    for info, width in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if value < 1 << (8 * width):
            return bytes([top | info]) + value.to_bytes(width, "big")
    raise ValueError("argument too large for CBOR")  # pragma: no cover - lengths are far below 2**64


def batch_payloads(data: bytes, session_id: bytes, round_id: int, sealed_size: int, max_batch: int) -> list[bytes]:
    """The sealed payloads of an encoded ``shuffled-batch`` of one round, read by its fixed layout.

    In the deterministic encoding, a batch of the round whose payloads are all
    ``sealed_size`` bytes has exactly one shape: a fixed prefix, the array header,
    ``n`` equal-length byte strings, a fixed suffix (round id, session id). So the
    reader checks the total length against ``n`` first (O(1)), then the prefix,
    suffix and every payload header byte for byte, and slices. Memory is the
    payloads themselves (about 1.3 times the input), whatever the bytes claim;
    ``n > max_batch`` is refused before anything is allocated. A batch of any
    other shape raises :class:`MalformedMessage`; ``codec.decode`` reads it in
    general form (and the test suite checks the two agree).
    """
    data = as_bytes(data)
    limit = codec.MESSAGE_TYPES["shuffled-batch"][1]
    if len(data) > limit:
        raise MessageTooLarge(f"batch of {len(data)} bytes, over the limit of {limit}")
    prefix = b"\xa5\x61t\x6eshuffled-batch\x61v" + _uint_header(0, WIRE_VERSION) + b"\x68payloads"
    suffix = b"\x68round_id" + _uint_header(0, round_id) + b"\x6asession_id" + _uint_header(2, len(session_id)) + session_id
    if not data.startswith(prefix):
        raise MalformedMessage("not a shuffled-batch of this wire version in deterministic layout")
    reader = StrictReader(data)
    reader.pos = len(prefix)
    initial = data[reader.pos] if reader.pos < len(data) else -1
    if initial >> 5 != 4:
        raise MalformedMessage("batch payloads must be an array")
    reader.pos += 1
    count = reader._argument(initial & 0x1F)
    if count > max_batch:
        raise MalformedMessage(f"batch of {count} payloads, over the round's max_batch of {max_batch}")
    header = _uint_header(2, sealed_size)
    stride = len(header) + sealed_size
    start = reader.pos
    end = start + count * stride
    if len(data) != end + len(suffix):
        raise MalformedMessage(
            f"batch of {len(data)} bytes; {count} payloads of {sealed_size} bytes take {end + len(suffix)}"
        )
    if data[end:] != suffix:
        raise MalformedMessage("batch is for another session or round")
    for offset, expected in enumerate(header):
        if data[start + offset : end : stride].count(expected) != count:
            raise MalformedMessage(f"every payload of this round must be {sealed_size} bytes")
    skip = len(header)
    return [data[o + skip : o + stride] for o in range(start, end, stride)]
