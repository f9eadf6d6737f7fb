"""The JavaScript wire codec against Python's, on the same few thousand hostile inputs.

Inputs come from a fixed-seed generator (``random.Random(SEED)``): every vector of
``tests/protocol/vectors/codec.json`` and ``refused.json`` (plain, with their own expected type
and with a wrong one), a few hand-built size and allocation cases at their limits, every
numeric field of the vectors set to its neighbours, to the schema's limits (``MAX_EPSILON``,
``MAX_BATCH``, ...) and their neighbours and to other edge numbers (ints as floats and back,
2**53 + 1, 2**64 - 1, half/single/double boundaries, ...), every text field set to strings
of 0..33 characters of 1..4 UTF-8 bytes and to invalid UTF-8, random bytes, and random
mutations of the vectors, both structural (decode the CBOR, change one value or
key, re-encode deterministically: int/float swaps, boundary numbers, byte strings one byte
too short or long, unknown, missing, renamed and swapped keys, another message type or
mechanism, a field taken from another vector, ...) and byte-level (flipped, changed,
inserted and deleted bytes, truncations, trailing bytes, length fields off by one or not in
their shortest form, swapped major types, ints written as floats and back, widened floats,
swapped and duplicated map keys, indefinite lengths, tags, items spliced in from another
vector). Some inputs pin the expected type or pass an array-length limit (``max_items``).
Every round-spec vector is also given each of the 14 Ed25519 keys anyone could sign under
(``WEAK_SIGNING_KEYS``) as its ``shuffler_signing_key``, alone and with a fault the spec's checks
meet before it or after it: both codecs must refuse each, and name the same field first.

Python decodes each with :func:`shuffledp.protocol.wire.codec.decode` and re-encodes what it
accepts with :func:`~shuffledp.protocol.wire.codec.encode`; the package does the same with
``decodeMessage`` / ``encodeMessage`` (``js/test/support/decode_many.mjs``, one Node process
for all inputs). The two must agree on every input: accepted or refused, the refusal's
``reason`` (the error class's ``reason`` attribute in both languages), and, when accepted,
the message type and the re-encoded bytes. Refusal message texts are not compared (they are
worded differently, e.g. ``('polya',)`` against ``polya``, ``1e-06`` against ``0.000001``).
"""

from __future__ import annotations

import json
import math
import re
import random
import struct
from collections import Counter
from pathlib import Path
from typing import Any

import cbor2
import pytest

from shuffledp.protocol.errors import ShuffleDPError
from shuffledp.protocol.wire import codec
from shuffledp.protocol.wire import messages as wire_messages
from shuffledp.protocol.wire.cbor_strict import ALLOCATION_FACTOR, ALLOCATION_SLACK, ITEM_COST
from shuffledp.protocol.wire.ed25519_keys import P as FIELD_PRIME
from shuffledp.protocol.wire.ed25519_keys import SMALL_ORDER_Y

from .conftest import run_node

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "tests" / "protocol" / "vectors"
DECODE_MANY = ROOT / "js" / "test" / "support" / "decode_many.mjs"

SEED = 20261207
N_FIELD_EDGES = 20  # variants of each numeric field of the vectors
N_STRUCTURAL = 900
N_BYTE_LEVEL = 1000
N_RANDOM = 250
#: Share of generated inputs that pin an expected type, and of those, that pin a wrong one.
P_EXPECTED = 0.25
P_WRONG_EXPECTED = 0.2
#: Share of generated inputs decoded under an array-length limit.
P_MAX_ITEMS = 0.08

TAGS = sorted(codec.MESSAGE_TYPES)
INT_EDGES = [
    0, 1, -1, 2, 3, 4, 15, 16, 17, 23, 24, 63, 64, 255, 256, 1023, 1024, 1025, 2047, 2048,
    65535, 65536, 2000003, 2**24, 2**24 + 1, 2**31 - 1, 2**31, 2**32, 2**44, 2**44 + 1,
    2**53 - 1, 2**53, 2**53 + 1, 2**62 - 1, 2**62, 2**62 + 1, 2**63 - 1, 2**63, 2**64 - 1,
    -(2**31), -(2**53) - 1, -(2**62), -(2**62) - 1, -(2**63), -(2**64),
]
FLOAT_EDGES = [
    0.0, -0.0, 1.0, -1.0, 0.5, 1e-6, 1e-6 * (1 - 2**-52), 30.0, math.nextafter(30.0, math.inf),
    1e-300, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 65504.0, 65505.0, 65520.0,
    5.960464477539063e-08, 6.103515625e-05, 6.097555160522461e-05, 3.4028234663852886e38,
    1.401298464324817e-45, 1.1754943508222875e-38, 1 / 3, 0.1, 2.0**53, 2.0**53 + 2, 2.0**63,
    2.0**64, 1e20, -1e20, 1.5, 1e-11, 0.999999, 4.5e15, 2.0**44, 1e6,
]

#: The numeric limits of the message schema (MAX_EPSILON, MAX_BATCH, ...) and their neighbours:
#: where a range check written with a wrong bound or comparison shows.
_LIMITS = [
    value for name, value in vars(wire_messages).items()
    if name.isupper() and type(value) in (int, float)
]
INT_LIMIT_EDGES = sorted({int(c) + d for c in _LIMITS for d in (-1, 0, 1)})
FLOAT_LIMIT_EDGES = sorted(
    {x for c in _LIMITS for x in (math.nextafter(float(c), -math.inf), float(c), math.nextafter(float(c), math.inf))}
    | {float(c) * 1.01 for c in _LIMITS} | {float(c) * 0.99 for c in _LIMITS}
)

#: The 14 encodings ``weak_ed25519_key`` refuses: each small-order y with either sign bit, and
#: y + p (a non-canonical encoding) where it fits in 255 bits (y = 0, 1), with either sign bit.
#: ``tests/protocol/test_ed25519_keys.py`` derives the same 14 from the group itself.
WEAK_SIGNING_KEYS = sorted(
    {(y | sign << 255).to_bytes(32, "little") for y in SMALL_ORDER_Y for sign in (0, 1)}
    | {(y + FIELD_PRIME | sign << 255).to_bytes(32, "little") for y in SMALL_ORDER_Y if y + FIELD_PRIME < 2**255 for sign in (0, 1)}
)
assert len(WEAK_SIGNING_KEYS) == 14
#: Faults combined with a weak shuffler_signing_key: RoundSpec checks the first two before the
#: key (the analyzer's key, the budget) and the last three after it.
WEAK_KEY_COMPANIONS = {
    "analyzer_key": bytes(31),
    "epsilon0": 31.0,
    "max_batch": 0,
    "min_batch": 0,
    "messages_per_user": 2,
}
ROUND_SPEC_FIELDS = (
    "session_id", "round_id", "params", "epsilon0", "delta0", "analyzer_key", "shuffler_key",
    "shuffler_signing_key", "max_batch", "min_batch", "deadline", "messages_per_user", "shuffler_instances",
)


# --- CBOR helpers --------------------------------------------------------------------------------


def head(major: int, arg: int, width: int | None = None) -> bytes:
    """A CBOR head; ``width`` (1, 2, 4, 8 argument bytes) forces a non-shortest form."""
    if width is None:
        if arg < 24:
            return bytes([major << 5 | arg])
        width = 1 if arg < 256 else 2 if arg < 65536 else 4 if arg < 2**32 else 8
    info = {1: 24, 2: 25, 4: 26, 8: 27}[width]
    return bytes([major << 5 | info]) + arg.to_bytes(width, "big")


def float_bytes(value: float, smallest: int = 2) -> bytes:
    """The shortest exact CBOR float of ``value`` at least ``smallest`` bytes wide."""
    for width, fmt, info in ((2, ">e", 25), (4, ">f", 26), (8, ">d", 27)):
        if width < smallest:
            continue
        try:
            packed = struct.pack(fmt, value)
        except (OverflowError, struct.error):
            continue
        back = struct.unpack(fmt, packed)[0]
        if back == value and math.copysign(1, back) == math.copysign(1, value):
            return bytes([0xE0 | info]) + packed
    return bytes([0xFB]) + struct.pack(">d", value)


class Item:
    """One CBOR item's place in the input: head ``[start, body)``, whole item ``[start, end)``."""

    __slots__ = ("start", "body", "end", "major", "info", "arg", "children")

    def __init__(self, start: int, body: int, major: int, info: int, arg: int) -> None:
        self.start, self.body, self.end = start, body, body
        self.major, self.info, self.arg = major, info, arg
        self.children: list[Item] = []


def walk(data: bytes) -> list[Item] | None:
    """Every item of a well-formed definite-length CBOR input, outermost first; None otherwise."""
    items: list[Item] = []

    def read(pos: int, depth: int) -> Item:
        if depth > 8 or pos >= len(data):
            raise ValueError
        major, info = data[pos] >> 5, data[pos] & 0x1F
        if info < 24:
            arg, size = info, 1
        elif info <= 27:
            width = 1 << (info - 24)
            if pos + 1 + width > len(data):
                raise ValueError
            arg, size = int.from_bytes(data[pos + 1 : pos + 1 + width], "big"), 1 + width
        else:
            raise ValueError
        item = Item(pos, pos + size, major, info, arg)
        items.append(item)
        end = pos + size
        if major in (2, 3):
            end += arg
        elif major in (4, 5):
            for _ in range(arg * (2 if major == 5 else 1)):
                child = read(end, depth + 1)
                item.children.append(child)
                end = child.end
        elif major == 6:
            child = read(end, depth + 1)
            item.children.append(child)
            end = child.end
        if end > len(data):
            raise ValueError
        item.end = end
        return item

    try:
        top = read(0, 0)
    except (ValueError, RecursionError):
        return None
    return items if top.end == len(data) else None


# --- The generator ------------------------------------------------------------------------------


class Generator:
    """Builds the differential test's inputs from the vectors and one fixed seed."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        codec_vectors = json.loads((VECTORS / "codec.json").read_text())
        refused_vectors = json.loads((VECTORS / "refused.json").read_text())
        self.valid = [(bytes.fromhex(v["cbor_hex"]), v["type"]) for v in codec_vectors]
        self.refused = [bytes.fromhex(v["hex"]) for v in refused_vectors]
        self.trees = [(cbor2.loads(data), tag) for data, tag in self.valid]
        self.keys = sorted({key for tree, _ in self.trees for key in self._keys(tree)})
        self.strings = sorted({s for tree, _ in self.trees for s in self._strings(tree)})
        self.cases: list[dict[str, Any]] = []

    # Pools of what the vectors hold.

    def _keys(self, value: Any) -> list[str]:
        if isinstance(value, dict):
            return [k for k, v in value.items() for k in [k, *self._keys(v)]]
        return []

    def _strings(self, value: Any) -> list[str]:
        if isinstance(value, str):
            return [value]
        if isinstance(value, dict):
            return [s for v in value.values() for s in self._strings(v)]
        if isinstance(value, list):
            return [s for v in value for s in self._strings(v)]
        return []

    def add(self, data: bytes, expected: str | None = None, max_items: int | None = None, origin: str = "") -> None:
        self.cases.append({"hex": data.hex(), "expected": expected, "maxItems": max_items, "origin": origin})

    def add_generated(self, data: bytes, own_type: str | None, origin: str) -> None:
        rng = self.rng
        expected = None
        if rng.random() < P_EXPECTED:
            expected = rng.choice(TAGS) if own_type is None or rng.random() < P_WRONG_EXPECTED else own_type
        max_items = rng.choice([0, 1, 2, 3, 4, 16]) if rng.random() < P_MAX_ITEMS else None
        self.add(data, expected, max_items, origin)

    # Fixed cases.

    def vectors(self) -> None:
        for data, tag in self.valid:
            self.add(data, None, None, f"vector {tag}")
            self.add(data, tag, None, f"vector {tag} as itself")
            self.add(data, self.rng.choice([t for t in TAGS if t != tag]), None, f"vector {tag} as another")
        for data in self.refused:
            self.add(data, None, None, "refused vector")

    def limits(self) -> None:
        """Sizes at the type limits and the reader's allocation allowance at its edge."""
        report = next(data for data, tag in self.valid if tag == "report")
        limit = codec.MESSAGE_TYPES["report"][1]
        for size in (limit - 1, limit, limit + 1):
            padded = report + bytes(size - len(report))
            self.add(padded, "report", None, f"report zero-padded to {size} bytes, expected report")
            self.add(padded, None, None, f"report zero-padded to {size} bytes")
        tree = dict(cbor2.loads(report))
        for extra in (limit - len(report) - 6, limit - len(report) - 5, limit - len(report) - 4):
            body = dict(tree, zz=bytes(extra))  # an unknown key: too-large wins if over the limit
            data = cbor2.dumps(body, canonical=True)
            self.add(data, None, None, f"report with unknown key, {len(data)} bytes")
        # A report-typed map holding an array of n zeros parses (and is then too large for a
        # report) while the reader's charge stays within its allowance, and is refused by the
        # reader as soon as it does not: both codecs must switch at the same n.
        def charge(n: int) -> tuple[int, int]:
            data = cbor2.dumps({"t": "report", "v": 3, "x": [0] * n}, canonical=True)
            items = 7 + n  # the map, three keys, two scalar values, the array and its n items
            return ITEM_COST * items + len("t" "report" "v" "x"), ALLOCATION_FACTOR * len(data) + ALLOCATION_SLACK

        n = next(n for n in range(1, 1 << 16) if charge(n)[0] > charge(n)[1])
        for k in (n - 2, n - 1, n, n + 1):
            data = cbor2.dumps({"t": "report", "v": 3, "x": [0] * k}, canonical=True)
            self.add(data, None, None, f"allocation edge, array of {k} zeros")
        batch = next(data for data, tag in self.valid if tag == "shuffled-batch")
        for max_items in range(0, 6):
            self.add(batch, "shuffled-batch", max_items, f"shuffled batch under max_items={max_items}")

    def random_bytes(self, count: int) -> None:
        rng = self.rng
        for _ in range(count):
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(48)))
            if data and rng.random() < 0.5:  # start with a map head so the reader gets further
                data = bytes([0xA0 | rng.randrange(12)]) + data[1:]
            self.add_generated(data, None, "random bytes")

    def weak_signing_keys(self) -> None:
        """Each round-spec vector naming each weak shuffler signing key, alone and with another
        fault (``WEAK_KEY_COMPANIONS``), plain and as an expected round-spec (no draws from the
        generator's random stream: the other inputs stay as they were)."""
        for tree, tag in self.trees:
            if tag != "round-spec":
                continue
            for key in WEAK_SIGNING_KEYS:
                for companion in (None, *WEAK_KEY_COMPANIONS):
                    body = dict(tree, shuffler_signing_key=key)
                    if companion is not None:
                        body[companion] = WEAK_KEY_COMPANIONS[companion]
                    data = cbor2.dumps(body, canonical=True)
                    origin = f"weak shuffler_signing_key {key.hex()}" + (f" and bad {companion}" if companion else "")
                    self.add(data, None, None, origin)
                    if companion is None:
                        self.add(data, "round-spec", None, origin + ", expected round-spec")

    # Numeric fields at their edges.

    def _numeric_leaves(self, value: Any, path: tuple = ()) -> list[tuple[tuple, Any]]:
        """(path, value) of every number, in lists only the first and last."""
        if isinstance(value, dict):
            return [leaf for key, child in value.items() for leaf in self._numeric_leaves(child, (*path, key))]
        if isinstance(value, list):
            indices = sorted({0, len(value) - 1}) if value else []
            return [leaf for i in indices for leaf in self._numeric_leaves(value[i], (*path, i))]
        if type(value) in (int, float):
            return [(path, value)]
        return []

    def _edge_values(self, value: int | float) -> list[int | float]:
        rng = self.rng
        if type(value) is int:
            near = [value - 1, value + 1, float(value), -value, 0, value * 2]
            limits, generic = INT_LIMIT_EDGES, INT_EDGES
        else:
            near = [
                math.nextafter(value, math.inf), math.nextafter(value, -math.inf), -value, value * 2, value / 2,
                int(value) if value == int(value) else math.floor(value),
            ]
            limits, generic = FLOAT_LIMIT_EDGES, FLOAT_EDGES
        picks = N_FIELD_EDGES - len(near)
        limit_picks = [rng.choice(limits) for _ in range(picks // 2)]
        other = [
            rng.choice(generic) if rng.random() < 0.8 else rng.choice(FLOAT_EDGES if type(value) is int else INT_EDGES)
            for _ in range(picks - len(limit_picks))
        ]
        return near + limit_picks + other

    def field_edges(self) -> None:
        """Each numeric field of the vectors (one group per message type, mechanism and path)
        set to its neighbours, the schema's limits and their neighbours, and other edge numbers."""
        groups: dict[tuple, list[tuple[Any, str, Any]]] = {}
        for tree, tag in self.trees:
            mechanism = tree.get("params", {}).get("mechanism")
            for path, value in self._numeric_leaves(tree):
                key = (tag, mechanism if path[0] == "params" else None, path)
                groups.setdefault(key, []).append((tree, tag, value))
        for key in sorted(groups, key=repr):
            tag, _, path = key
            members = groups[key]
            _, _, first = members[0]
            for new in self._edge_values(first):
                tree, _, _ = self.rng.choice(members)
                tree = cbor2.loads(cbor2.dumps(tree))
                parent = tree
                for step in path[:-1]:
                    parent = parent[step]
                parent[path[-1]] = new
                self.add_generated(cbor2.dumps(tree, canonical=True), tag, f"field {'.'.join(map(str, path))}")

    # Text fields: lengths counted in code points, and UTF-8 both languages must read alike.

    def _text_leaves(self, value: Any, path: tuple = ()) -> list[tuple]:
        if isinstance(value, dict):
            return [leaf for key, child in value.items() for leaf in self._text_leaves(child, (*path, key))]
        if isinstance(value, list):
            return [leaf for i, child in enumerate(value[:2]) for leaf in self._text_leaves(child, (*path, i))]
        return [path] if isinstance(value, str) else []

    def text_edges(self) -> None:
        """Each text field of the vectors set to strings of 0, 1 and 31..33 characters of one,
        two, three and four UTF-8 bytes (so two UTF-16 units), and to raw bytes that are or are
        not valid UTF-8 (surrogates, overlong forms, beyond U+10FFFF, truncated, BOM, U+FFFE)."""
        texts = [c * n for c in ("a", "\u00e9", "\u2603", "\U0001F600") for n in (0, 1, 31, 32, 33)]
        raws = [
            b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xed\xa0\xbd\xed\xb8\x80", b"\xc0\x80", b"\xe0\x80\xaf", b"\xf4\x90\x80\x80",
            b"\xf0\x9f\x98", b"a\xc3", b"\x80", b"\xff", b"\xef\xbb\xbfreleased", b"\xef\xbf\xbe", b"\x00", b"released\x00",
        ]
        marker = "\x01marker\x01"
        seen = set()
        for tree, tag in self.trees:
            for path in self._text_leaves(tree):
                key = (tag, tree.get("params", {}).get("mechanism") if path[0] == "params" else None, path)
                if key in seen:
                    continue
                seen.add(key)
                copy = cbor2.loads(cbor2.dumps(tree))
                parent = copy
                for step in path[:-1]:
                    parent = parent[step]
                for text in texts:
                    parent[path[-1]] = text
                    self.add_generated(cbor2.dumps(copy, canonical=True), tag, f"text {'.'.join(map(str, path))}")
                parent[path[-1]] = marker
                template = cbor2.dumps(copy, canonical=True)
                encoded_marker = cbor2.dumps(marker)
                assert template.count(encoded_marker) == 1
                for raw in raws:
                    data = template.replace(encoded_marker, head(3, len(raw)) + raw)
                    self.add_generated(data, tag, f"raw text {'.'.join(map(str, path))}")

    # Structural mutations.

    def _nodes(self, value: Any) -> list[tuple[Any, Any]]:
        out: list[tuple[Any, Any]] = []
        if isinstance(value, dict):
            for key, child in value.items():
                out.append((value, key))
                out.extend(self._nodes(child))
        elif isinstance(value, list):
            for index, child in enumerate(value):
                out.append((value, index))
                out.extend(self._nodes(child))
        return out

    def _dicts(self, value: Any) -> list[dict]:
        if isinstance(value, dict):
            return [value, *(d for v in value.values() for d in self._dicts(v))]
        if isinstance(value, list):
            return [d for v in value for d in self._dicts(v)]
        return []

    def _random_float(self) -> float:
        rng = self.rng
        kind = rng.randrange(4)
        if kind == 0:
            while True:
                value = struct.unpack(">d", rng.randbytes(8))[0]
                if math.isfinite(value):
                    return value
        if kind == 1:
            while True:
                value = struct.unpack(">f", rng.randbytes(4))[0]
                if math.isfinite(value):
                    return value
        if kind == 2:
            while True:
                value = struct.unpack(">e", rng.randbytes(2))[0]
                if math.isfinite(value):
                    return value
        return rng.uniform(-100, 100)

    def _other_value(self) -> Any:
        rng = self.rng
        return rng.choice([
            rng.choice(INT_EDGES), rng.choice(FLOAT_EDGES), rng.choice(self.strings), rng.randbytes(rng.choice([0, 16, 32])),
            [], [1], {}, {"mechanism": rng.choice(self.strings)}, True, False, None, 2**64, -(2**64) - 1,
        ])

    def _mutate_value(self, value: Any) -> Any:
        rng = self.rng
        if rng.random() < 0.12:
            return self._other_value()
        if isinstance(value, bool) or value is None:
            return self._other_value()
        if isinstance(value, int):
            return rng.choice([
                float(value) if abs(value) < 2**1000 else value,  # the same number as a float
                value + rng.choice([-1, 1]), -value, value * 2, value ^ (1 << rng.randrange(64)),
                rng.choice(INT_EDGES), rng.choice(INT_EDGES), 0,
            ])
        if isinstance(value, float):
            return rng.choice([
                int(value) if value == int(value) else math.floor(value),  # the same (or floor) as an int
                math.nextafter(value, math.inf), math.nextafter(value, -math.inf), value * 2, value / 2, -value,
                rng.choice(FLOAT_EDGES), rng.choice(FLOAT_EDGES), self._random_float(), self._random_float(),
            ])
        if isinstance(value, bytes):
            size = rng.choice([len(value) - 1, len(value) + 1, 0, 1, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65,
                               1023, 1024, 1025, 2048, 2049, rng.randrange(100)])
            size = max(size, 0)
            return value[:size] + rng.randbytes(max(0, size - len(value)))
        if isinstance(value, str):
            choice = rng.randrange(6)
            if choice == 0 and value:
                at = rng.randrange(len(value))
                return value[:at] + chr(rng.choice([0x1F, 0x41, 0x7F, 0xE9, 0x2603, 0x1F600])) + value[at + 1 :]
            if choice == 1:
                return ""
            if choice == 2:
                return value + rng.choice(["", "x", " ", "\x00"]) * rng.choice([1, 32])
            if choice == 3:
                return value.upper()
            return rng.choice(self.strings)
        if isinstance(value, list):
            items = list(value)
            choice = rng.randrange(7)
            if choice == 0 and items:
                del items[rng.randrange(len(items))]
            elif choice == 1 and items:
                items.insert(rng.randrange(len(items)), rng.choice(items))
            elif choice == 2:
                items = []
            elif choice == 3:
                items.reverse()
            elif choice == 4 and items:
                at = rng.randrange(len(items))
                items[at] = self._mutate_value(items[at])
            elif choice == 5 and items:
                items = items * rng.choice([2, 8, 40])
            else:
                items.append(self._other_value())
            return items
        if isinstance(value, dict):
            return self._mutate_map(dict(value))
        return self._other_value()

    def _mutate_map(self, body: dict) -> dict:
        rng = self.rng
        choice = rng.randrange(7)
        keys = list(body)
        if choice == 0 and keys:
            del body[rng.choice(keys)]
        elif choice == 1:
            body[rng.choice(self.keys + ["zz", "V", "t ", "mechanismx"])] = self._other_value()
        elif choice == 2 and keys:  # rename a key (to one of another message's, or a fixed one)
            key = rng.choice(keys)
            body[rng.choice(self.keys + ["v", "t", "mechanism"])] = body.pop(key)
        elif choice == 3 and len(keys) >= 2:  # swap two keys' values
            a, b = rng.sample(keys, 2)
            body[a], body[b] = body[b], body[a]
        elif choice == 4:  # a field from another vector (another mechanism's params, ...)
            donors = [d for tree, _ in self.trees for d in self._dicts(tree)]
            donor = rng.choice(donors)
            shared = [k for k in donor if k in body] or list(donor)
            key = rng.choice(shared)
            body[key] = donor[key]
        elif choice == 5:
            if "t" in body:
                body["t"] = rng.choice(TAGS + ["Report", "", "signed-round-spec "])
            elif "mechanism" in body:
                body["mechanism"] = rng.choice([s for s in self.strings if "-" in s] + ["", "hadamard"])
            else:
                body[rng.choice(self.keys)] = self._other_value()
        elif "v" in body and choice == 6:
            body["v"] = rng.choice([2, 4, 3.0, -3, 0, 2**64 - 1, "3", b"\x03"])
        elif keys:
            key = rng.choice(keys)
            body[key] = self._mutate_value(body[key])
        return body

    def structural(self, count: int) -> None:
        rng = self.rng
        for _ in range(count):
            tree, tag = rng.choice(self.trees)
            tree = cbor2.loads(cbor2.dumps(tree))  # a private deep copy
            for _ in range(rng.choice([1, 1, 1, 2, 2, 3])):
                nodes = self._nodes(tree)
                if rng.random() < 0.3 or not nodes:
                    target = rng.choice(self._dicts(tree))
                    mutated = self._mutate_map(dict(target))
                    target.clear()
                    target.update(mutated)
                else:
                    parent, key = rng.choice(nodes)
                    parent[key] = self._mutate_value(parent[key])
            try:
                data = cbor2.dumps(tree, canonical=True)
            except (ValueError, OverflowError, cbor2.CBOREncodeError):
                continue
            if rng.random() < 0.15:
                data = self._mutate_bytes(data)
            self.add_generated(data, tag, "structural")

    # Byte-level mutations.

    def _mutate_bytes(self, data: bytes) -> bytes:
        rng = self.rng
        items = walk(data)
        choice = rng.randrange(18) if items else rng.randrange(7)
        d = bytearray(data)
        if not d:
            return bytes([rng.randrange(256)])
        at = rng.randrange(len(d))
        if choice == 0:
            d[at] = rng.randrange(256)
        elif choice == 1:
            d[at] ^= 1 << rng.randrange(8)
        elif choice == 2:
            d[at] = (d[at] + rng.choice([-1, 1])) % 256
        elif choice == 3:
            d[at:at] = bytes([rng.randrange(256)])
        elif choice == 4:
            del d[at]
        elif choice == 5:
            del d[at:]
        elif choice == 6:
            d += bytes(rng.choice([1, 2, 7])) if rng.random() < 0.5 else rng.randbytes(rng.choice([1, 2, 9]))
        else:
            assert items is not None
            return self._mutate_items(data, items, choice)
        return bytes(d)

    def _mutate_items(self, data: bytes, items: list[Item], choice: int) -> bytes:
        rng = self.rng
        item = rng.choice(items)

        def replace(start: int, end: int, new: bytes) -> bytes:
            return data[:start] + new + data[end:]

        counted = [i for i in items if i.major <= 5]
        if choice == 7 and counted:  # a length or integer off by one
            it = rng.choice(counted)
            return replace(it.start, it.body, head(it.major, min(max(0, it.arg + rng.choice([-1, 1])), 2**64 - 1)))
        widenable = [i for i in counted if i.body - i.start < 9]
        if choice == 8 and widenable:  # a head not in its shortest form
            it = rng.choice(widenable)
            widths = [w for w in (1, 2, 4, 8) if it.arg < 1 << (8 * w) and it.body - it.start - 1 < w]
            return replace(it.start, it.body, head(it.major, it.arg, rng.choice(widths)))
        if choice == 9:  # another major type in the same head
            new = (data[item.start] & 0x1F) | (rng.choice([m for m in range(8) if m != item.major]) << 5)
            return replace(item.start, item.start + 1, bytes([new]))
        if choice == 10:  # an integer written as a float, or an integral float as an integer
            ints = [i for i in items if i.major in (0, 1)]
            floats = [i for i in items if i.major == 7 and i.info in (25, 26, 27)]
            if floats and (not ints or rng.random() < 0.5):
                it = rng.choice(floats)
                fmt = {25: ">e", 26: ">f", 27: ">d"}[it.info]
                value = struct.unpack(fmt, data[it.start + 1 : it.end])[0]
                if math.isfinite(value):
                    number = int(value)
                    new = head(0, number) if number >= 0 else head(1, -1 - number)
                    if abs(number) < 2**64:
                        return replace(it.start, it.end, new)
            if ints:
                it = rng.choice(ints)
                value = it.arg if it.major == 0 else -1 - it.arg
                return replace(it.start, it.end, float_bytes(float(value)))
        if choice == 11:  # a float wider than it needs
            floats = [i for i in items if i.major == 7 and i.info in (25, 26)]
            if floats:
                it = rng.choice(floats)
                fmt = ">e" if it.info == 25 else ">f"
                value = struct.unpack(fmt, data[it.start + 1 : it.end])[0]
                return replace(it.start, it.end, float_bytes(value, smallest=8 if it.info == 26 else rng.choice([4, 8])))
        maps = [i for i in items if i.major == 5 and i.arg >= 2]
        if choice in (12, 13) and maps:
            it = rng.choice(maps)
            entries = [(it.children[2 * k], it.children[2 * k + 1]) for k in range(it.arg)]
            a = rng.randrange(len(entries) - 1)
            (ka, va), (kb, vb) = entries[a], entries[a + 1]
            if choice == 12:  # two adjacent entries swapped
                return replace(ka.start, vb.end, data[kb.start : vb.end] + data[ka.start : va.end])
            return replace(kb.start, kb.end, data[ka.start : ka.end])  # a duplicated key
        if choice == 14:  # an item spliced in from another vector
            donor, _ = rng.choice(self.valid)
            donor_items = walk(donor)
            if donor_items:
                piece = rng.choice(donor_items)
                return replace(item.start, item.end, donor[piece.start : piece.end])
        containers = [i for i in items if i.major in (4, 5)]
        if choice == 15 and containers:  # indefinite length
            it = rng.choice(containers)
            return data[: it.start] + bytes([it.major << 5 | 31]) + data[it.body : it.end] + b"\xff" + data[it.end :]
        if choice == 16:  # a tag in front of an item
            tag = rng.choice([0, 1, 2, 3, 24, 28, 29, 55799])
            return replace(item.start, item.start, head(6, tag))
        if choice == 17 and item is not items[0]:  # an item removed without fixing its container's count
            return replace(item.start, item.end, b"")
        return self._mutate_bytes(data[:-1] if rng.random() < 0.5 else data + b"\x00")

    def byte_level(self, count: int) -> None:
        rng = self.rng
        for _ in range(count):
            if rng.random() < 0.85:
                data, tag = rng.choice(self.valid)
            else:
                data, tag = rng.choice(self.refused), None
            for _ in range(rng.choice([1, 1, 1, 2, 2, 3])):
                data = self._mutate_bytes(data)
            self.add_generated(data, tag, "byte-level")


def generate_cases() -> list[dict[str, Any]]:
    generator = Generator(SEED)
    generator.vectors()
    generator.limits()
    generator.field_edges()
    generator.text_edges()
    generator.random_bytes(N_RANDOM)
    generator.structural(N_STRUCTURAL)
    generator.byte_level(N_BYTE_LEVEL)
    generator.weak_signing_keys()
    return generator.cases


# --- The two decoders -----------------------------------------------------------------------------


def python_answer(case: dict[str, Any]) -> dict[str, Any]:
    """Python's answer in the form of decode_many.mjs."""
    data = bytes.fromhex(case["hex"])
    expected = codec.MESSAGE_TYPES[case["expected"]][0] if case["expected"] else None
    try:
        message = codec.decode(data, expected, max_items=case["maxItems"])
    except ShuffleDPError as exc:
        return {"ok": False, "reason": exc.reason, "message": str(exc)}
    except Exception as exc:  # noqa: BLE001 - a decoder bug, reported as a failure below
        return {"ok": False, "reason": f"untyped {type(exc).__name__}", "message": str(exc)}
    tag = codec.message_tag(type(message))
    try:
        return {"ok": True, "type": tag, "hex": codec.encode(message).hex()}
    except ShuffleDPError as exc:
        return {"ok": True, "type": tag, "encodeReason": exc.reason, "message": str(exc)}
    except Exception as exc:  # noqa: BLE001 - an encoder bug, reported as a failure below
        return {"ok": True, "type": tag, "encodeReason": f"untyped {type(exc).__name__}", "message": str(exc)}


def verdict(answer: dict[str, Any]) -> tuple:
    """What must agree: accepted or not, then the type and re-encoding, or the refusal's reason."""
    if answer["ok"]:
        return (True, answer["type"], answer.get("hex"), answer.get("encodeReason"))
    return (False, answer["reason"])


@pytest.fixture(scope="module")
def answers(js_package: Path) -> tuple[list[dict], list[dict], list[dict]]:
    cases = generate_cases()
    python = [python_answer(case) for case in cases]
    request = [{key: case[key] for key in ("hex", "expected", "maxItems")} for case in cases]
    js = json.loads(run_node(DECODE_MANY, input=json.dumps(request).encode(), timeout=300))
    assert len(js) == len(cases)
    return cases, python, js


def test_python_decoder_is_total(answers):
    """The reference itself raises only its typed errors (else the comparison means little)."""
    cases, python, _ = answers
    untyped = [
        (case["hex"], answer)
        for case, answer in zip(cases, python)
        if answer.get("reason", answer.get("encodeReason", "")).startswith("untyped")
    ]
    assert not untyped, f"Python's decoder raised untyped errors on {len(untyped)} inputs, e.g. {untyped[:3]}"


def test_inputs_reach_every_outcome(answers):
    """The generator exercises acceptance and each refusal reason of the codec, not only CBOR errors."""
    _, python, _ = answers
    outcomes = Counter("accepted" if a["ok"] else a["reason"] for a in python)
    accepted_types = Counter(a["type"] for a in python if a["ok"])
    assert set(outcomes) >= {"accepted", "malformed", "too-large", "unsupported-version"}, outcomes
    assert set(accepted_types) == set(TAGS), accepted_types
    # Mutants the schema refuses, not only the CBOR reader: enough of each to mean something.
    assert outcomes["accepted"] >= 100 and outcomes["unsupported-version"] >= 20, outcomes


def test_javascript_codec_agrees_with_python(answers):
    cases, python, js = answers
    disagreements = [
        (case, py, ours) for case, py, ours in zip(cases, python, js) if verdict(py) != verdict(ours)
    ]
    lines = [f"{len(disagreements)} of {len(cases)} inputs decode differently; the first ones:"]
    for case, py, ours in disagreements[:12]:
        lines.append(
            f"- {case['origin']}, expected={case['expected']}, maxItems={case['maxItems']}\n"
            f"  input   {case['hex'][:400]}\n  python  {json.dumps(py)[:400]}\n  js      {json.dumps(ours)[:400]}"
        )
    assert cases and not disagreements, "\n".join(lines)


def _fields_named(message: str) -> set[str]:
    return {name for name in ROUND_SPEC_FIELDS if re.search(rf"\b{name}\b", message)}


def test_a_weak_shuffler_signing_key_is_refused_where_python_refuses_it(answers):
    """A round spec naming a key anyone could sign under is malformed in both codecs, and with a
    second fault both name the same field first: the key is checked at the same point."""
    cases, python, js = answers
    weak = [(case, py, ours) for case, py, ours in zip(cases, python, js) if case["origin"].startswith("weak shuffler_signing_key")]
    assert len(weak) == 10 * len(WEAK_SIGNING_KEYS) * (len(WEAK_KEY_COMPANIONS) + 2), len(weak)
    named = Counter()
    for case, py, ours in weak:
        assert not py["ok"] and py["reason"] == "malformed", (case["origin"], py)
        assert not ours["ok"] and ours["reason"] == "malformed", (case["origin"], ours)
        fields = _fields_named(py["message"])
        assert len(fields) == 1 and fields == _fields_named(ours["message"]), (case["origin"], py["message"], ours["message"])
        named[fields.pop()] += 1
    # the key alone, and with a fault checked after it, is what both name; a fault checked before wins
    per_key_and_vector = len(WEAK_SIGNING_KEYS) * 10
    assert named == {
        "shuffler_signing_key": per_key_and_vector * 5,
        "analyzer_key": per_key_and_vector,
        "epsilon0": per_key_and_vector,
    }, named
