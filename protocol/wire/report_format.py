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
strict decoder (:func:`shuffledp.protocol.wire.codec.decode`) accepts.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

from shuffledp.protocol.wire import codec
from shuffledp.protocol.wire.cbor_strict import StrictReader, as_bytes
from shuffledp.protocol.errors import MalformedMessage, MessageTooLarge
from shuffledp.protocol.wire.messages import MECHANISMS, SIGNATURE_BYTES, WIRE_VERSION, Report

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
        self._array_byte = bytes([self._array_header])
        if self._prefix + array + self._suffix != template:  # pragma: no cover - layout invariant
            raise AssertionError("report template does not split around its values array")

    def encode_padded(self, values: tuple[int, ...]) -> bytes:
        """The padded plaintext of this round's report of ``values``: exactly
        ``pad(codec.encode(Report(round_id, mechanism, values)))``, written from the round's
        fixed prefix and suffix (the values are the only bytes that vary). Values the
        general encoder would refuse (wrong count, not an int, outside ``|v| < 2**62``) go
        through it, for its typed error."""
        if len(values) == self.width:
            parts = [self._prefix, self._array_byte]
            for v in values:
                encoded = _INTS.get(v) if type(v) is int else None
                if encoded is None:
                    if type(v) is not int or not -VALUE_LIMIT <= v < VALUE_LIMIT:
                        break
                    encoded = _cbor_int(v)
                parts.append(encoded)
            else:
                parts.append(self._suffix)
                encoded = b"".join(parts)
                return encoded + bytes(self.size - len(encoded))
        return self.pad(codec.encode(Report(self.round_id, self.mechanism, tuple(values))))

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


def _cbor_int(value: int) -> bytes:
    """The shortest (deterministic) CBOR encoding of an integer with ``|value| < 2**64``."""
    if value >= 0:
        return _uint_header(0, value)
    return _uint_header(1, -1 - value)


#: The encodings of the small integers reports mostly carry, looked up by :meth:`ReportFormat.encode_padded`.
_INTS = {v: _cbor_int(v) for v in range(-1024, 4096)}


@dataclass(frozen=True)
class BatchChunk:
    """One chunk of a shuffled batch as read by :func:`read_batch_chunk`; ``digest`` is what its signature covers."""

    batch_id: bytes
    chunk: int
    chunks: int
    total: int
    payloads: list[bytes]
    signature: bytes
    digest: bytes

    @property
    def size(self) -> int:
        return len(self.payloads)


def _expect(data: bytes, pos: int, literal: bytes, what: str) -> int:
    if data[pos : pos + len(literal)] != literal:
        raise MalformedMessage(f"not a shuffled-batch of this round in deterministic layout ({what})")
    return pos + len(literal)


def read_batch_chunk(
    data: bytes, session_id: bytes, round_id: int, spec_digest: bytes, sealed_size: int, max_batch: int
) -> BatchChunk:
    """One encoded ``shuffled-batch`` chunk of a round, read by its fixed layout.

    In the deterministic encoding a chunk of the round whose payloads are all
    ``sealed_size`` bytes has exactly one shape: the map header and ``t``/``v``, three
    shortest-form integers (``chunk``, ``total``, ``chunks``), the 16-byte batch id,
    the array header, ``n`` equal-length byte strings, the round id, the 64-byte
    signature, the session id and the spec digest (a chunk of another spec of the
    round is refused here, before its signature is checked). The reader checks the total length against ``n``
    first (O(1)), then every fixed byte and every payload header, and slices: memory
    is the payloads themselves, whatever the bytes claim; ``total > max_batch`` is
    refused before anything is allocated. It also hashes the chunk once, with its
    signature zeroed in place, for the caller to check the shuffler's signature
    (:func:`shuffledp.protocol.wire.onion.verify_encoded`). Anything else raises
    :class:`MalformedMessage`; ``codec.decode`` reads the general form, and the test
    suite checks the two agree.
    """
    data = as_bytes(data)
    limit = codec.MESSAGE_TYPES["shuffled-batch"][1]
    if len(data) > limit:
        raise MessageTooLarge(f"batch chunk of {len(data)} bytes, over the limit of {limit}")
    reader = StrictReader(data)
    pos = _expect(data, 0, b"\xab\x61t\x6eshuffled-batch\x61v" + _uint_header(0, WIRE_VERSION) + b"\x65chunk", "header")
    numbers = []
    for key in (b"\x65total", b"\x66chunks", None):
        if pos >= len(data) or data[pos] >> 5 != 0:
            raise MalformedMessage("batch chunk: expected an unsigned integer")
        reader.pos = pos + 1
        numbers.append(reader._argument(data[pos] & 0x1F))  # shortest form enforced by the strict reader
        pos = reader.pos
        if key is not None:
            pos = _expect(data, pos, key, "keys")
    chunk, total, chunks = numbers
    if not (1 <= total <= max_batch and 1 <= chunks <= total and chunk < chunks):
        raise MalformedMessage(f"batch chunk {chunk} of {chunks}, {total} reports: outside the round's max_batch {max_batch}")
    pos = _expect(data, pos, b"\x68batch_id\x50", "batch id")
    batch_id = data[pos : pos + 16]
    pos = _expect(data, pos + 16, b"\x68payloads", "payloads key")
    if pos >= len(data) or data[pos] >> 5 != 4:
        raise MalformedMessage("batch payloads must be an array")
    reader.pos = pos + 1
    count = reader._argument(data[pos] & 0x1F)
    if not 1 <= count <= total:
        raise MalformedMessage(f"batch chunk of {count} payloads; the batch holds {total}")
    header = _uint_header(2, sealed_size)
    stride = len(header) + sealed_size
    start = reader.pos
    end = start + count * stride
    suffix_head = b"\x68round_id" + _uint_header(0, round_id) + b"\x69signature\x58\x40"
    suffix_tail = (b"\x6asession_id" + _uint_header(2, len(session_id)) + session_id
                   + b"\x6bspec_digest" + _uint_header(2, len(spec_digest)) + spec_digest)
    if len(data) != end + len(suffix_head) + SIGNATURE_BYTES + len(suffix_tail):
        raise MalformedMessage(f"batch chunk of {len(data)} bytes does not hold {count} payloads of {sealed_size} bytes")
    signature_at = _expect(data, end, suffix_head, "another round")
    _expect(data, signature_at + SIGNATURE_BYTES, suffix_tail, "another session or spec")
    for offset, expected in enumerate(header):
        if data[start + offset : end : stride].count(expected) != count:
            raise MalformedMessage(f"every payload of this round must be {sealed_size} bytes")
    skip = len(header)
    payloads = [data[o + skip : o + stride] for o in range(start, end, stride)]
    digest = encoded_digest(data, signature_at)
    return BatchChunk(batch_id, chunk, chunks, total, payloads, data[signature_at : signature_at + SIGNATURE_BYTES], digest)


def encoded_digest(encoded: bytes | memoryview, signature_at: int) -> bytes:
    """SHA-256 of an encoding with the 64 signature bytes at ``signature_at`` read as zeros, hashed
    in place: what a signed message's signature covers (``protocol/wire/onion.py``, "Signed messages")."""
    view = memoryview(encoded)
    h = hashlib.sha256()
    h.update(view[:signature_at])
    h.update(bytes(SIGNATURE_BYTES))
    h.update(view[signature_at + SIGNATURE_BYTES :])
    return h.digest()
