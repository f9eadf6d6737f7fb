"""Hypothesis strategies for the fuzz suite: valid wire messages, and structure-aware mutations.

Valid messages are built from the message dataclasses and encoded by the codec, so
they are exactly what honest parties send: every wire type (round specs, reports,
envelopes with their outer layer, admissions, batch chunks, acknowledgements,
receipts and outcomes). Signed messages carry a random signature, or a real one
when a generator is given a signer (``ANALYZER_KEYS``, ``SHUFFLER_KEYS`` and the
credential ``ISSUER`` below are fixed test keys shared by the fuzz tests).
Mutations work at two levels:

* **tree level**: the message's first CBOR item is read back with
  ``cbor_strict`` (bytes after it, e.g. a report's zero padding, are kept), turned
  into a mutable tree, changed (a field replaced by a hostile value: 5,000-digit
  bignum tags, NaN, infinities, floats where integers belong, huge or negative
  integers, wrong types, shared-reference tags; keys dropped, added, duplicated or
  reordered; non-text and nested-map keys; indefinite lengths; non-shortest widths;
  deep nesting; declared lengths longer than the data) and re-emitted with
  :mod:`cbor_raw`;
* **byte level**: bit flips, interesting bytes, inserts, deletes, truncation,
  splices of two messages and repeated chunks.

Throughput: a Hypothesis draw costs ~80 µs, and one mutated message needs dozens of
choices. So each example draws one 64-bit seed from Hypothesis and makes its bulk
choices with a :class:`Rng` seeded by it (``random.Random``, ~1 µs a choice). Runs
stay reproducible (the suite derandomizes Hypothesis), Hypothesis never repeats a
seed within a run, and every failure message carries the failing bytes in hex.
The ``g_*`` functions take an :class:`Rng`; the module-level names ending in
strategies wrap them for ``@given``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random
import struct

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import strategies as st

import cbor_raw as raw
from cbor_raw import Array, Bytes, Float, FloatBits, Head, IndefString, Int, Map, Raw, Simple, Tag, Text

from shuffledp.protocol.wire import cbor_strict, codec
from shuffledp.protocol.wire.credentials import CredentialIssuer
from shuffledp.protocol.errors import InvalidParameter, MalformedMessage
from shuffledp.protocol.wire.messages import (
    MAX_BATCH,
    MAX_BINS,
    MAX_EPSILON,
    MAX_GRID_LEVELS,
    MAX_OUTER_BYTES,
    MAX_SHUFFLER_INSTANCES,
    MIN_EPSILON,
    ROUND_OUTCOMES,
    Admission,
    AdmissionReceipts,
    BatchAck,
    Envelope,
    HadamardRangeParams,
    ProjectedMeanParams,
    Report,
    RoundOutcome,
    RoundSpec,
    ShuffledBatch,
    SignedRoundSpec,
)
from shuffledp.protocol.wire.messages import MECHANISMS as MESSAGE_MECHANISMS
from shuffledp.protocol.wire.messages import (
    CoordinateTreeParams,
    LocalVectorParams,
    ShiftedNormParams,
    ShiftedVectorSumParams,
    VectorMeanParams,
    VectorRangeParams,
    messages_per_user,
)
from shuffledp.protocol.wire.onion import ShufflerKeys, envelope_format, signed
from shuffledp.protocol.mechanisms.summation_params import choose_scalar_sum, choose_vector_sum
from shuffledp.protocol.wire.report_format import VALUE_LIMIT, report_format
from shuffledp.protocol.wire.sealing import AnalyzerKeys

MECHANISMS = tuple(MESSAGE_MECHANISMS)
WIDTH = {name: cls.VALUES_PER_REPORT for name, cls in MESSAGE_MECHANISMS.items()}
MESSAGE_TAGS = tuple(codec.MESSAGE_TYPES)
SESSIONS = (bytes(range(16)), bytes(16))

#: Fixed test keys of the parties (the suite is reproducible; HPKE still draws a fresh
#: ephemeral key per seal). Never use them for anything real.
ANALYZER_KEYS = AnalyzerKeys(
    X25519PrivateKey.from_private_bytes(bytes(range(1, 33))),
    Ed25519PrivateKey.from_private_bytes(bytes(range(33, 65))),
)
SHUFFLER_KEYS = ShufflerKeys.from_bytes(bytes(range(65, 97)), bytes(range(97, 129)))
OTHER_SHUFFLER_KEYS = ShufflerKeys.from_bytes(bytes(range(66, 98)), bytes(range(98, 130)))
ISSUER = CredentialIssuer(bytes(range(129, 161)))
OTHER_ISSUER = CredentialIssuer(bytes(range(130, 162)))
#: Reasons a shuffler gives for a refused envelope, and other short texts a receipt or outcome may carry.
REASONS = ("malformed", "wrong-size", "unsealable", "unknown-round", "bad-credential", "replay", "duplicate",
           "quota", "round-full", "batch-too-small", "x" * 32, "\U0001f600" * 32)


class Rng:
    """The per-example source of choices (a ``random.Random`` seeded by Hypothesis)."""

    __slots__ = ("r",)

    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)

    def int(self, lo: int, hi: int) -> int:
        return self.r.randint(lo, hi)

    def below(self, n: int) -> int:
        return self.r.randrange(n)

    def one_in(self, n: int) -> bool:
        return self.r.randrange(n) == 0

    def bool(self) -> bool:
        return self.r.random() < 0.5

    def pick(self, seq):
        return seq[self.r.randrange(len(seq))]

    def bytes(self, n: int) -> bytes:
        return self.r.randbytes(n)

    def log_int(self, lo: int, hi: int) -> int:
        """An integer in ``[lo, hi]`` (``lo >= 0``) with a uniformly drawn bit length: small ones are common."""
        bits = self.r.randint(0, max(1, hi.bit_length()))
        return min(hi, max(lo, self.r.getrandbits(bits) if bits else 0))

    def log_float(self, lo: float, hi: float) -> float:
        """A float in ``[lo, hi]`` (``0 < lo``), log-uniform."""
        return min(hi, max(lo, math.exp(self.r.uniform(math.log(lo), math.log(hi)))))

    def float(self) -> float:
        """Any finite float: an interesting one, a small one, or one from random half/single/double bits."""
        k = self.r.randrange(6)
        if k == 0:
            return self.pick(INTERESTING_FLOATS)
        if k == 1:
            return self.r.uniform(-1e3, 1e3)
        if k == 2:
            return float(self.r.randint(-100, 100)) / 4.0
        fmt, n = ((">e", 2), (">f", 4), (">d", 8))[k - 3]
        value = struct.unpack(fmt, self.r.randbytes(n))[0]
        return value if math.isfinite(value) else 1.5

    def text(self, max_size: int, *, valid: bool = True) -> str:
        """A short string, mostly printable ASCII; with ``valid=False`` it may hold lone surrogates."""
        out = []
        for _ in range(self.r.randint(0, max_size)):
            k = self.r.randrange(10)
            if k < 6:
                out.append(chr(self.r.randint(0x20, 0x7E)))
            elif k < 8:
                out.append(chr(self.r.randint(0, 0x7F)))
            elif k == 8:
                out.append(chr(self.r.randint(0x80, 0xD7FF)))
            elif valid:
                out.append(chr(self.r.randint(0xE000, 0x10FFFF)))
            else:
                out.append(chr(self.r.randint(0xD800, 0xDFFF)))
        return "".join(out)


def seeded(gen, *args, **kwargs) -> st.SearchStrategy:
    """A Hypothesis strategy of ``gen(Rng(seed), *args, **kwargs)`` for a drawn 64-bit seed."""
    return st.integers(0, 2**64 - 1).map(lambda seed: gen(Rng(seed), *args, **kwargs))


seeds = st.integers(0, 2**64 - 1)

# ---------------------------------------------------------------------------
# pools of interesting values
# ---------------------------------------------------------------------------

BIG_DIGITS = 10**4999 + 123456789  # 5,000 decimal digits
KEY_POOL = (
    "v", "t", "round_id", "session_id", "mechanism", "values", "params", "payloads", "sealed", "nonce",
    "token", "credential", "outer", "batch_id", "chunk", "chunks", "total", "admitted", "refused", "reasons",
    "outcome", "reason", "shuffler_key", "shuffler_signing_key", "epsilon0", "delta0", "deadline", "min_batch", "max_batch", "messages_per_user", "low", "high",
    "tau", "lower", "upper", "noise", "grid_levels", "analyzer_key", "spec_bytes", "signature", "", "\x00",
    "zz", "vv", "t\x00",
)
TEXT_POOL = MESSAGE_TAGS + MECHANISMS + ROUND_OUTCOMES + REASONS + (
    "laplace", "gaussian", "", "é", "\U0001f600", "x" * 100, "x" * 33, "report\x00", "served", "open",
)
LOW_ORDER_X25519 = (
    bytes(32),
    bytes([1]) + bytes(31),
    bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800"),
    bytes.fromhex("5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157"),
    bytes.fromhex("ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f"),
    bytes.fromhex("edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f"),
    bytes.fromhex("eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f"),
)
INTERESTING_INTS = (
    0, 1, -1, 2, 3, 23, 24, -24, -25, 255, 256, 65535, 65536, 2**31, 2**32 - 1, 2**32, 2**53 + 1,
    2**62 - 1, 2**62, -(2**62), -(2**62) - 1, 2**63 - 1, 2**63, -(2**63), 2**64 - 1, -(2**64),
    MAX_BATCH, MAX_BATCH + 1, MAX_BINS, MAX_BINS + 1, MAX_GRID_LEVELS, MAX_GRID_LEVELS + 1, 64, 65,
)
INTERESTING_FLOATS = (
    0.0, -0.0, 0.5, 1.0, 1.5, 2.0, 1e-6, 9.9e-7, 30.0, 30.000000000000004, 65504.0, 65520.0, 1e300,
    -1e300, 1.7976931348623157e308, 5e-324, 2.2250738585072014e-308, 1e-300, 0.1, 2.0**63, 2.0**64,
    float(2**53 + 2), -4.0, 4.0, 1e12, 5.960464477539063e-08, 6.103515625e-05, 3.4028234663852886e38,
)


def _constants() -> tuple:
    nan_inf = [Float(float("nan"), w) for w in (2, 4, 8)]
    nan_inf += [Float(float(s + "inf"), w) for s in "+-" for w in (2, 4, 8)]
    nan_inf += [
        FloatBits(0x7FF8000000000001, 8), FloatBits(0x7FF0000000000001, 8), FloatBits(0xFFF8000000000000, 8),
        FloatBits(0x7FC00001, 4), FloatBits(0x7C01, 2), FloatBits(0xFC00, 2),
    ]
    tags = [
        raw.bignum(BIG_DIGITS), raw.bignum(-BIG_DIGITS), raw.bignum(0), raw.bignum(1), raw.bignum(5, pad=8),
        raw.bignum(2**64), raw.bignum(-(2**64) - 1), raw.bignum(2**70, pad=1), Tag(2, Bytes(b"")), Tag(2, "text"),
        Tag(3, []), Tag(2, raw.bignum(BIG_DIGITS)),
        raw.shared({"a": 1}), raw.shared([raw.shared_ref(0)]), raw.shared_ref(0), raw.shared_ref(2**64 - 1),
        Tag(28, raw.shared_ref(0)), Map([[raw.shared({"k": 1}), raw.shared_ref(0)]]),
        Tag(1, 1700000000), Tag(0, "2020-01-01T00:00:00Z"), Tag(24, Bytes(b"\xa1\x61v\x02")), Tag(55799, 2),
        Tag(2**64 - 1, 0, 8), Tag(4, [-2, 27315]), Tag(258, [1, 2]), Tag(30, [1, 0]), Tag(21, b"x"), Tag(6, 0),
    ]
    simple = [
        True, False, None, Simple(23), Simple(16), Simple(0), Simple(255), Simple(32), Simple(20, two_byte=True),
        Simple(23, two_byte=True), Raw(b"\xff"), Raw(b"\xfc"), Raw(b"\xfd"), Raw(b"\xfe"), Raw(b"\x1c"),
        Raw(b"\x3d"), Raw(b"\x5e"), Raw(b"\x7f"), Raw(b"\x1f"), Raw(b"\x3f"), Raw(b"\xdf\x00"), Raw(b""),
    ]
    wrong = [
        b"", b"\x00" * 15, b"\x00" * 16, b"\x00" * 17, b"\x01" * 32, b"\xff" * 64, "", "x", "\x00" * 16,
        [], [1], [1, 2], [1, 2, 3], [[]], {}, {"a": 1}, {"mechanism": "hadamard-range"},
        {"mechanism": "projected-mean", "lower": 0.0, "upper": 1.0}, 2.0, -0.0, 0.5,
        Text(b"\xff\xfe"), Text(b"\xed\xa0\x80"), Text(b"\xc0\x80"), Text(b"hadamard-rang\xe5"),
        Map([[{"nested": 1}, 1]]), Map([[[1], 1]]), Map([[1, 1]]), Map([[b"k", 1]]), Map([[1.5, 1]]),
        Map([["a", 1], ["a", 1]]), Map([["b", 1], ["a", 1]]),
    ]
    lengths = [
        Bytes(b"abc", declared=2**32), Bytes(b"", declared=2**64 - 1, width=8), Text("abc", declared=4),
        Array([], declared=2**63), Map([], declared=2**64 - 1, width=8), Array([1], declared=2),
        Bytes(b"\x00" * 16, declared=17), Array([], declared=MAX_BATCH + 1),
        IndefString(2, [b"ab", b"cd"]), IndefString(3, ["ab", "cd"]), IndefString(2, [Text("x")]),
        IndefString(2, [IndefString(2, [b"a"])]), Array([1, 2], indefinite=True), Map([["a", 1]], indefinite=True),
        Raw(b"\x9f"), Raw(b"\xbf\x61a"), Raw(b"\x5f\x41a"),
        Head(2, 2**63), Head(3, 2**64 - 1), Head(4, 2**32, 8), Head(5, 1), Head(6, 2), Head(6, 29),
        Head(0, 0, 8), Head(1, 0, 1), Head(7, info=28), Head(7, info=31), Head(0, info=30), Head(6, info=31),
    ]
    deep = [raw.nest(0, d, k) for d in (3, 4, 5, 6, 40, 1000) for k in ("array", "map")] + [raw.nest(0, 2000, "tag")]
    return tuple(nan_inf + tags + simple + wrong + lengths + deep)


HOSTILE_CONSTANTS = _constants()

# ---------------------------------------------------------------------------
# valid messages
# ---------------------------------------------------------------------------


def g_round_id(r: Rng) -> int:
    """Round ids around every CBOR width boundary, small ones, and any 63-bit one."""
    k = r.below(3)
    if k == 0:
        return r.int(0, 30)
    if k == 1:
        return r.pick((23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**62, 2**63 - 1))
    return r.log_int(0, 2**63 - 1)


def g_session(r: Rng) -> bytes:
    return r.pick(SESSIONS) if r.one_in(3) else r.bytes(16)


def g_mechanism(r: Rng) -> str:
    return r.pick(MECHANISMS)


def g_value(r: Rng) -> int:
    """A report value: small, at a width boundary, at the format's limits, or any in ``[-2**62, 2**62)``."""
    k = r.below(4)
    if k == 0:
        return r.int(-2, 40)
    if k == 1:
        return r.pick((-25, -24, 23, 24, 255, 256, -257, 65535, 65536, 2**32 - 1, 2**32, -(2**32) - 1))
    if k == 2:
        return r.pick((VALUE_LIMIT - 1, -VALUE_LIMIT, VALUE_LIMIT // 2, -VALUE_LIMIT + 1))
    v = r.log_int(0, VALUE_LIMIT - 1)
    return v if r.bool() else -1 - v


def g_report(r: Rng, round_id=None, mechanism=None) -> Report:
    round_id = g_round_id(r) if round_id is None else round_id
    mechanism = g_mechanism(r) if mechanism is None else mechanism
    return Report(round_id, mechanism, tuple(g_value(r) for _ in range(WIDTH[mechanism])))


def g_padded_report(r: Rng) -> bytes:
    report = g_report(r)
    return report_format(report.round_id, report.mechanism).pad(codec.encode(report))


HUGE_FLOATS = (1e300, -1e300, 4e307, -4e307, 1.7976931348623157e308 / 8, -8.98846567431158e307, 2.0**1000)


def g_low(r: Rng) -> float:
    """An interval end: ordinary, tiny, huge, or any finite float."""
    k = r.below(8)
    if k < 3:
        return r.pick((-4.0, 0.0, -1.0, -1e6, 1e-3, 5e-324, -1e-300))
    if k == 7:
        return r.pick(HUGE_FLOATS)
    return r.r.uniform(-1e9, 1e9) if k < 6 else r.float()


def g_hadamard_params(r: Rng) -> HadamardRangeParams:
    low = g_low(r)
    k = r.below(4)
    tau = r.pick((0.5, 1e-3, 1.0, 7.25)) if k < 2 else r.log_float(1e-6, 1e6) if k == 2 else r.log_float(1e-300, 1e307)
    k = r.below(3)
    bins = r.int(1, 64) if k == 0 else r.pick((MAX_BINS - 1, MAX_BINS)) if k == 1 else r.log_int(1, MAX_BINS)
    try:
        return HadamardRangeParams(low, low + 2.0 * tau * bins, tau)
    except InvalidParameter:
        return HadamardRangeParams(-4.0, 4.0, 0.5)


def g_mean_params(r: Rng) -> ProjectedMeanParams:
    lower = g_low(r)
    k = r.below(4)
    width = r.pick((1.0, 2.0, 1e-3)) if k < 2 else r.log_float(1e-6, 1e9) if k == 2 else r.log_float(1e-300, 1e308)
    noise = r.pick(("laplace", "gaussian"))
    levels = r.pick((1, 64, 4096, MAX_GRID_LEVELS)) if r.bool() else r.log_int(1, MAX_GRID_LEVELS)
    try:
        return ProjectedMeanParams(lower, lower + width, noise, levels)
    except InvalidParameter:
        return ProjectedMeanParams(0.0, 2.0, noise, 4096)


def g_vector_params(r: Rng):
    """Parameters of a vector or summation round, valid for the returned ``(epsilon0, delta0)``."""
    k = r.below(4)
    dim = r.pick((1, 2, 3, 8)) if r.bool() else r.int(1, 64)
    seed = r.pick((0, 2**64 - 1)) if r.one_in(3) else r.log_int(0, 2**64 - 1)
    if k == 0:
        h = g_hadamard_params(r)
        try:
            return VectorRangeParams(h.low, h.high, h.tau, dim, seed, r.pick(("sampled", "paper"))), 1.0, 0.0
        except InvalidParameter:
            return VectorRangeParams(-4.0, 4.0, 0.5, dim, seed), 1.0, 0.0
    if k == 1:
        mean = g_mean_params(r)
        width = 1 << (dim - 1).bit_length()
        delta0 = 1e-6 if mean.noise == "gaussian" else 0.0
        return VectorMeanParams(dim, seed, (mean.lower,) * width, (mean.upper,) * width, mean.noise, mean.grid_levels), 25.0, delta0
    users = r.pick((3, 50, 300)) if r.bool() else r.log_int(300, 10**6)
    epsilon, delta = r.pick((0.5, 1.0, 4.0)), r.pick((1e-6, 1e-9, 1e-3))
    if k == 2:
        low = r.pick((0.0, -1.0, -1e6))
        return choose_scalar_sum(users, epsilon, delta, low, low + r.pick((1.0, 2.0, 1e3))).params, epsilon, delta
    try:
        return choose_vector_sum(max(users, 300), epsilon, delta, min(dim, 8), r.pick((1.0, 20.0)), seed).params, epsilon, delta
    except InvalidParameter:  # noise beyond the device sampler at this size
        return choose_scalar_sum(users, epsilon, delta, 0.0, 1.0).params, epsilon, delta


def example_params(mechanism: str):
    """One valid ``(params, epsilon0, delta0)`` of each mechanism (for openers that only need the round's layout)."""
    if mechanism == "hadamard-range":
        return HadamardRangeParams(-4.0, 4.0, 0.5), 1.0, 0.0
    if mechanism == "projected-mean":
        return ProjectedMeanParams(0.0, 2.0), 1.0, 0.0
    if mechanism == "vector-range":
        return VectorRangeParams(-4.0, 4.0, 0.5, 3, 1), 1.0, 0.0
    if mechanism == "vector-mean":
        return VectorMeanParams(3, 1, (0.0,) * 4, (1.0,) * 4), 1.0, 0.0
    if mechanism == "modular-sum":
        return choose_scalar_sum(1000, 1.0, 1e-6, 0.0, 1.0).params, 1.0, 1e-6
    if mechanism == "coordinate-tree":
        return CoordinateTreeParams(-8.0, 8.0, 0.25, 3, 1), 2.0, 0.0
    if mechanism == "shifted-norm":
        return ShiftedNormParams((1.0, -2.0, 0.5), -20.0, 4.0, 0.125), 2.0, 0.0
    if mechanism == "local-vector":
        return LocalVectorParams(3, 1.0, 200, 1, 500_000.0, (1.0, -2.0, 0.5)), 2.0, 1e-6
    vector_sum = choose_vector_sum(1000, 1.0, 1e-6, 3, 1.0, 1).params
    if mechanism == "shifted-vector-sum":
        fields = {f.name: getattr(vector_sum, f.name) for f in dataclasses.fields(vector_sum)}
        return ShiftedVectorSumParams(**fields, center=(1.0, -2.0, 0.5)), 1.0, 1e-6
    return vector_sum, 1.0, 1e-6


def g_shuffler_keys(r: Rng) -> tuple[bytes, bytes]:
    """The (sealing, signing) public keys a spec names: mostly the test shuffler's, else random or low-order."""
    k = r.below(8)
    if k < 5:
        return SHUFFLER_KEYS.hpke_public, SHUFFLER_KEYS.signing_public
    if k == 5:
        return OTHER_SHUFFLER_KEYS.hpke_public, OTHER_SHUFFLER_KEYS.signing_public
    if k == 6:
        return r.pick(LOW_ORDER_X25519), r.bytes(32)
    return r.bytes(32), r.bytes(32)  # a small-order signing key (e.g. 32 zero bytes) makes no valid spec


def g_round_spec(
    r: Rng, session=None, analyzer_key=None, deadline=None, min_max_batch: int = 1, shuffler=None
) -> RoundSpec:
    """A valid RoundSpec (a fixed fallback when a drawn combination is out of domain).

    ``shuffler`` pins the (sealing, signing) keys it names; by default they are drawn
    by :func:`g_shuffler_keys`.
    """
    session = g_session(r) if session is None else session
    round_id = g_round_id(r)
    key = r.bytes(32) if analyzer_key is None else analyzer_key
    shuffler_key, shuffler_signing_key = g_shuffler_keys(r) if shuffler is None else shuffler
    keys = dict(analyzer_key=key, shuffler_key=shuffler_key, shuffler_signing_key=shuffler_signing_key)
    if deadline is None:
        deadline = 1e12 if r.bool() else r.float()
    params = g_hadamard_params(r) if r.bool() else g_mean_params(r)
    epsilon0 = r.pick((0.5, 1.0, MIN_EPSILON, MAX_EPSILON)) if r.one_in(3) else r.log_float(MIN_EPSILON, MAX_EPSILON)
    delta0 = 0.0
    if getattr(params, "noise", "laplace") == "gaussian":
        delta0 = r.pick((1e-6, 1e-12, 0.5)) if r.one_in(3) else r.log_float(1e-300, 0.999)
    if r.one_in(3):  # vectors and summations: their own budget rules
        params, epsilon0, delta0 = g_vector_params(r)
    floor = getattr(params, "min_reports", 1)
    max_batch = MAX_BATCH if r.bool() else r.log_int(max(min_max_batch, floor), MAX_BATCH)
    min_batch = floor if r.bool() else r.log_int(floor, max_batch)
    per_user = messages_per_user(params)  # the quota is exactly what the parameters make a user send
    instances = 1 if r.below(4) else r.pick((2, MAX_SHUFFLER_INSTANCES)) if r.bool() else r.int(1, MAX_SHUFFLER_INSTANCES)
    common = dict(session_id=session, round_id=round_id, deadline=deadline, messages_per_user=per_user,
                  shuffler_instances=instances, **keys)
    try:
        return RoundSpec(
            params=params, epsilon0=epsilon0, delta0=delta0, min_batch=min_batch, max_batch=max_batch, **common
        )
    except InvalidParameter:
        pass
    try:  # a budget every parameter set of the generators accepts
        return RoundSpec(
            params=params, epsilon0=25.0, delta0=delta0, min_batch=floor, max_batch=max(min_max_batch, floor), **common
        )
    except InvalidParameter:
        return RoundSpec(
            session_id=session, round_id=round_id, params=HadamardRangeParams(-4.0, 4.0, 0.5), epsilon0=0.5,
            min_batch=1, max_batch=max(min_max_batch, 1), deadline=deadline, **keys,
        )


def g_sealed_size(r: Rng, round_id: int) -> int:
    """The round's fixed sealed size (of a drawn mechanism), or one in four times any allowed size."""
    return r.int(1, 1024) if r.one_in(4) else report_format(round_id, g_mechanism(r)).sealed_size


def g_credential(r: Rng) -> bytes:
    """A 48-byte credential: issued by the test issuer, by another issuer, or random bytes."""
    k = r.below(4)
    if k < 2:
        return ISSUER.issue(r.bytes(16))
    if k == 2:
        return OTHER_ISSUER.issue(r.bytes(16))
    return r.bytes(48)


def g_envelope(r: Rng, session=None, round_id=None) -> Envelope:
    """An envelope with a random outer layer, mostly of the round's fixed outer size."""
    round_id = g_round_id(r) if round_id is None else round_id
    size = r.int(1, MAX_OUTER_BYTES) if r.one_in(4) else envelope_format(round_id, g_mechanism(r)).outer_size
    session = g_session(r) if session is None else session
    return Envelope(session, round_id, r.bytes(size))


def g_admission(r: Rng, round_id=None, sealed_size=None) -> Admission:
    """An outer-layer plaintext: credential, nonce and a sealed report of (mostly) the round's size."""
    round_id = g_round_id(r) if round_id is None else round_id
    sealed_size = g_sealed_size(r, round_id) if sealed_size is None else sealed_size
    return Admission(round_id, g_credential(r), r.bytes(16), r.bytes(sealed_size))


def maybe_signed(r: Rng, message, signer):
    """``message`` signed by ``signer`` (an Ed25519 private key), or with a random signature if None."""
    if signer is None:
        return message if r.one_in(8) else dataclasses.replace(message, signature=r.bytes(64))
    return signed(signer, message)


def g_chunk_shape(r: Rng, count: int) -> tuple[int, int, int]:
    """``(chunk, chunks, total)`` consistent with a chunk of ``count`` payloads (``count <= total``)."""
    k = r.below(3)
    total = count if k == 0 else count + (r.int(1, 8) if k == 1 else r.log_int(1, MAX_BATCH - count))
    chunks = 1 if k == 0 else r.int(1, min(total, 8)) if r.bool() else r.log_int(1, total)
    return r.int(0, chunks - 1) if r.bool() else chunks - 1, chunks, total


def g_spec_digest(r: Rng) -> bytes:
    """A spec digest: 32 random bytes (the digest of no spec a test signed), or zeros."""
    return bytes(32) if r.one_in(8) else r.bytes(32)


def g_batch(
    r: Rng, session=None, round_id=None, sealed_size=None, max_count: int = 6, signer=None, batch_id=None,
    spec_digest=None,
) -> ShuffledBatch:
    """One chunk of a shuffled batch: 1..max_count payloads (one in five has one of another size)."""
    session = g_session(r) if session is None else session
    spec_digest = g_spec_digest(r) if spec_digest is None else spec_digest
    round_id = g_round_id(r) if round_id is None else round_id
    if sealed_size is None:
        sealed_size = report_format(round_id, g_mechanism(r)).sealed_size
    count = r.int(1, max_count)
    sizes = [sealed_size] * count
    if r.one_in(5):  # one payload of another size
        sizes[r.below(count)] = r.int(1, 1024)
    chunk, chunks, total = g_chunk_shape(r, count)
    batch_id = r.bytes(16) if batch_id is None else batch_id
    batch = ShuffledBatch(session, round_id, spec_digest, batch_id, chunk, chunks, total, tuple(r.bytes(n) for n in sizes))
    return maybe_signed(r, batch, signer)


def g_batch_ack(r: Rng, session=None, round_id=None, signer=None, spec_digest=None) -> BatchAck:
    session = g_session(r) if session is None else session
    round_id = g_round_id(r) if round_id is None else round_id
    spec_digest = g_spec_digest(r) if spec_digest is None else spec_digest
    return maybe_signed(r, BatchAck(session, round_id, spec_digest, r.bytes(16), bytes(64)), signer)


def g_reason(r: Rng) -> str:
    """A refusal reason: 1..32 characters."""
    return r.pick(REASONS) if r.bool() else (r.text(32) or "x")


def g_receipts(r: Rng, session=None, round_id=None, signer=None, nonces=(), spec_digest=None) -> AdmissionReceipts:
    """Receipts naming random nonces, and ``nonces`` (each admitted, refused or left out)."""
    session = g_session(r) if session is None else session
    spec_digest = g_spec_digest(r) if spec_digest is None else spec_digest
    round_id = g_round_id(r) if round_id is None else round_id
    admitted = [r.bytes(16) for _ in range(r.int(0, 3))]
    refused = [r.bytes(16) for _ in range(r.int(0, 3))]
    for nonce in nonces:
        k = r.below(3)
        (admitted if k == 0 else refused if k == 1 else []).insert(r.int(0, 3), nonce)
    if r.one_in(16):  # many receipts at once
        admitted += [r.bytes(16) for _ in range(r.int(0, 40))]
    reasons = tuple(g_reason(r) for _ in refused)
    message = AdmissionReceipts(session, round_id, spec_digest, tuple(admitted), tuple(refused), reasons)
    return maybe_signed(r, message, signer)


def g_outcome(
    r: Rng, session=None, round_id=None, signer=None, instances: int | None = None, spec_digest=None
) -> RoundOutcome:
    """A round outcome of one of ``instances`` shuffler instances (default: any allowed instance)."""
    session = g_session(r) if session is None else session
    spec_digest = g_spec_digest(r) if spec_digest is None else spec_digest
    round_id = g_round_id(r) if round_id is None else round_id
    if instances is None:
        instance = 0 if r.bool() else r.pick((1, MAX_SHUFFLER_INSTANCES - 1, r.below(MAX_SHUFFLER_INSTANCES)))
    else:
        instance = r.below(instances)
    outcome = r.pick(ROUND_OUTCOMES)
    reason = "" if outcome == "released" and r.bool() else r.pick(("", *REASONS)) if r.bool() else r.text(32)
    admitted = r.pick((0, 1, MAX_BATCH)) if r.one_in(4) else r.log_int(0, MAX_BATCH)
    batch_id = bytes(16) if outcome == "failed" and r.bool() else r.bytes(16)
    message = RoundOutcome(session, round_id, spec_digest, outcome, reason, admitted, batch_id, instance)
    return maybe_signed(r, message, signer)


def g_signed_spec(r: Rng, analyzer=None) -> bytes:
    """An encoded SignedRoundSpec: really signed by ``analyzer``, or with a random signature."""
    spec = g_round_spec(r, analyzer_key=None if analyzer is None else analyzer.keys.hpke_public)
    if analyzer is not None:
        return analyzer.sign_spec(spec)
    return codec.encode(SignedRoundSpec(codec.encode(spec), r.bytes(64)))


_VALID_KINDS = (
    lambda r: codec.encode(g_round_spec(r)),
    g_signed_spec,
    lambda r: codec.encode(g_report(r)),
    g_padded_report,
    lambda r: codec.encode(g_admission(r)),
    lambda r: codec.encode(g_envelope(r)),
    lambda r: codec.encode(g_batch(r)),
    lambda r: codec.encode(g_batch_ack(r)),
    lambda r: codec.encode(g_receipts(r)),
    lambda r: codec.encode(g_outcome(r)),
)


def g_valid_message(r: Rng) -> bytes:
    """Any kind of valid wire message, as bytes."""
    return r.pick(_VALID_KINDS)(r)


# ---------------------------------------------------------------------------
# hostile values
# ---------------------------------------------------------------------------


def g_int(r: Rng) -> int:
    k = r.below(3)
    if k == 0:
        return r.pick(INTERESTING_INTS)
    v = r.log_int(0, 2**64 - 1)
    return v if k == 1 else -1 - v


def g_hostile(r: Rng):
    """One hostile CBOR value (a plain value or a fresh :mod:`cbor_raw` node)."""
    kind = r.below(8)
    if kind <= 2:
        return copy.deepcopy(r.pick(HOSTILE_CONSTANTS))
    if kind == 3:  # integers: boundaries, any size, at forced widths, as bignums
        v = g_int(r)
        form = r.below(4)
        if form == 1:
            need = raw.shortest_width(v if v >= 0 else -1 - v)
            return Int(v, r.pick([w for w in (1, 2, 4, 8) if w >= need]))
        if form == 2:
            return raw.bignum(v, pad=r.int(0, 2))
        return v
    if kind == 4:  # floats, shortest or at a forced width
        return Float(r.float(), r.pick((None, None, 2, 4, 8)))
    if kind == 5:
        return r.pick(TEXT_POOL) if r.bool() else r.text(12, valid=not r.one_in(4))
    if kind == 6:
        return r.bytes(r.pick((0, 1, 15, 16, 17, 31, 32, 33, 64, 65, 1025)))
    number = r.pick((2, 3, 28, 29, 0, 1, 24, 55799)) if r.bool() else r.log_int(0, 2**64 - 1)
    return Tag(number, copy.deepcopy(r.pick((0, -1, b"\x01", "x", [], {}, 1.5))))


def g_plausible(r: Rng, value):
    """A value of the same wire type as ``value`` but (usually) different: it reaches the validators."""
    if isinstance(value, bool) or value is None:
        return g_hostile(r)
    if isinstance(value, int):
        k = r.below(3)
        return g_int(r) if k == 0 else value + r.int(-3, 3) if k == 1 else r.log_int(0, 2**63)
    if isinstance(value, float):
        k = r.below(4)
        return r.float() if k < 2 else value * 2 if k == 2 else -value
    if isinstance(value, str):
        return r.pick(TEXT_POOL + KEY_POOL) if r.bool() else r.text(10)
    if isinstance(value, bytes):
        n = len(value)
        return r.bytes(max(0, r.pick((n, n, n - 1, n + 1, 0, 1, 16, 32, 64, 1024, 1025))))
    return g_hostile(r)


# ---------------------------------------------------------------------------
# tree-level mutation
# ---------------------------------------------------------------------------


def to_tree(value):
    """A decoded value as a mutable tree: maps become :class:`cbor_raw.Map` of ``[k, v]`` lists,
    in the deterministic order (keys sorted bytewise by their encodings)."""
    if isinstance(value, dict):
        pairs = sorted(value.items(), key=lambda kv: raw.encode(kv[0]))
        return Map([[k, to_tree(v)] for k, v in pairs])
    if isinstance(value, list):
        return [to_tree(v) for v in value]
    return value


def _slots(holder: list) -> list:
    """Every (container, index, is_key) position in the tree, in a deterministic order."""
    out = []
    stack = [(holder, 0, False)]
    while stack:
        seq, i, is_key = stack.pop()
        out.append((seq, i, is_key))
        node = seq[i]
        if isinstance(node, Map):
            for pair in reversed(node.pairs):
                stack.append((pair, 1, False))
                stack.append((pair, 0, True))
        elif isinstance(node, list):
            for j in reversed(range(len(node))):
                stack.append((node, j, False))
        elif isinstance(node, Array):
            for j in reversed(range(len(node.items))):
                stack.append((node.items, j, False))
    return out


def _can_widen(value) -> bool:
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, int):
        return -(2**64) <= value < 2**64
    if isinstance(value, float):
        return len(raw.encode(value)) < 9
    return isinstance(value, (bytes, str, list, Map))


def _widened(r: Rng, value):
    """``value`` with its head at a width wider than the shortest (never canonical), or None."""
    if not _can_widen(value):
        return None
    if isinstance(value, int):
        n = value if value >= 0 else -1 - value
        wider = [w for w in (1, 2, 4, 8) if w > raw.shortest_width(n)]
        return Int(value, r.pick(wider)) if wider else raw.bignum(value)
    if isinstance(value, float):
        shortest = len(raw.encode(value)) - 1
        return Float(value, r.pick([w for w in (4, 8) if w > shortest]))
    if isinstance(value, Map):
        n = len(value.pairs)
    else:
        n = len(value.encode("utf-8", "surrogatepass")) if isinstance(value, str) else len(value)
    wider = [w for w in (1, 2, 4, 8) if w > raw.shortest_width(n)]
    width = r.pick(wider)
    if isinstance(value, bytes):
        return Bytes(value, width)
    if isinstance(value, str):
        return Text(value, width)
    if isinstance(value, list):
        return Array(value, width)
    return Map(value.pairs, width)


def _indefinite(r: Rng, value):
    """``value`` in an indefinite-length encoding (never canonical), or None."""
    if isinstance(value, bytes):
        cut = r.int(0, len(value))
        return IndefString(2, [value[:cut], value[cut:]])
    if isinstance(value, str):
        cut = r.int(0, len(value))
        return IndefString(3, [value[:cut], value[cut:]])
    if isinstance(value, list):
        return Array(value, indefinite=True)
    if isinstance(value, Map):
        return Map(value.pairs, indefinite=True)
    return None


MAP_OPS = ("drop", "add", "duplicate", "reorder", "key", "nested-key")
TREE_OPS = MAP_OPS + (
    "replace", "replace", "replace", "replace", "plausible", "plausible", "plausible", "plausible", "plausible",
    "widen", "indefinite",
    "float-for-int", "shared", "nest", "declare-longer",
)


def mutate_tree(r: Rng, tree, op=None):
    """Apply one structural mutation to ``tree`` (in place where possible); returns the new root."""
    holder = [tree]
    slots = _slots(holder)
    op = op or r.pick(TREE_OPS)
    maps = [seq[i] for seq, i, _ in slots if isinstance(seq[i], Map)]
    if op in MAP_OPS and not maps:
        op = "replace"
    if op in MAP_OPS:
        m = r.pick(maps)
        n = len(m.pairs)
        if op == "drop" and n:
            del m.pairs[r.below(n)]
        elif op == "duplicate" and n:
            pair = copy.deepcopy(r.pick(m.pairs))
            if r.bool():
                pair[1] = g_plausible(r, pair[1])
            m.pairs.insert(r.int(0, n), pair)
        elif op == "reorder" and n:
            if n >= 2:
                a = r.below(n - 1)
                m.pairs[a], m.pairs[a + 1] = m.pairs[a + 1], m.pairs[a]
            if r.bool():
                m.pairs.reverse()
        elif op == "key" and n:
            pair = r.pick(m.pairs)
            pair[0] = g_hostile(r) if r.bool() else Text(r.pick(KEY_POOL), 1)
        elif op == "nested-key":  # a map (or array) as a key
            inner = copy.deepcopy(r.pick((m, {"a": 1}, [1, 2], Map([["t", "report"]]))))
            m.pairs.insert(r.int(0, n), [inner, 0])
        else:  # add (or an op on an empty map)
            key = r.pick(KEY_POOL) if r.bool() else r.text(8)
            value = g_hostile(r) if r.bool() else copy.deepcopy(r.pick((0, 2, 1.0, b"\x00" * 16, "report")))
            m.pairs.insert(r.int(0, n), [key, value])
            m.canonical = r.bool()  # sometimes a well-placed unknown key, sometimes misplaced
        return holder[0]
    seq, i, _ = r.pick([s for s in slots if not s[2]])
    node = seq[i]
    if op == "replace":
        seq[i] = g_hostile(r)
    elif op == "plausible":
        seq[i] = g_plausible(r, node)
    elif op == "widen":
        seq[i] = _widened(r, node) or g_hostile(r)
    elif op == "indefinite":
        seq[i] = _indefinite(r, node) or Raw(b"\x9f\xff")
    elif op == "float-for-int":
        if isinstance(node, int) and not isinstance(node, bool):
            seq[i] = Float(float(node), r.pick((None, 2, 4, 8)))
        elif isinstance(node, float):
            seq[i] = int(node) if r.bool() else Float(node, 8)
        else:
            seq[i] = Float(r.pick(INTERESTING_FLOATS))
    elif op == "shared":
        seq[i] = raw.shared(node) if r.bool() else raw.shared_ref(r.int(0, 3))
    elif op == "nest":
        seq[i] = raw.nest(node, r.pick((1, 2, 3, 5, 100)), r.pick(("array", "map", "tag")))
    else:  # declare-longer
        extra = r.pick((1, 2, 7, 2**16, 2**32, 2**63))
        if isinstance(node, bytes):
            seq[i] = Bytes(node, declared=len(node) + extra)
        elif isinstance(node, str):
            seq[i] = Text(node, declared=len(node.encode("utf-8", "surrogatepass")) + extra)
        elif isinstance(node, list):
            seq[i] = Array(node, declared=len(node) + extra)
        elif isinstance(node, Map):
            node.declared = len(node.pairs) + extra
        else:
            seq[i] = Array([node], declared=1 + extra)
    return holder[0]


# ---------------------------------------------------------------------------
# byte-level mutation
# ---------------------------------------------------------------------------

INTERESTING_BYTES = (0x00, 0xFF, 0x1F, 0x3F, 0x5F, 0x7F, 0x9F, 0xBF, 0xDF, 0xF9, 0xFA, 0xFB, 0xF7, 0xC2, 0xD8,
                     0x18, 0x19, 0x1A, 0x1B, 0x1C, 0x38, 0x3B, 0x58, 0x5B, 0x78, 0x98, 0x9B, 0xB8, 0xBB, 0x80, 0xA0)
BYTE_OPS = ("flip", "flip", "set", "insert", "delete", "truncate", "splice", "repeat", "append")


def _chunk(r: Rng) -> bytes:
    return r.bytes(r.int(1, 8)) if r.bool() else bytes([r.pick(INTERESTING_BYTES)])


def mutate_bytes(r: Rng, data: bytes, others=g_valid_message, op=None) -> bytes:
    """One byte-level mutation of ``data``; ``others(r)`` gives the second message of a splice."""
    op = op or r.pick(BYTE_OPS)
    n = len(data)
    if op == "splice":
        other = others(r)
        return data[: r.int(0, n)] + other[r.int(0, len(other)) :]
    if op == "append":
        return data + (_chunk(r) if r.bool() else r.pick((b"\x00", b"\xff", b"\x00" * 9)))
    if n == 0:
        return _chunk(r)
    pos = r.below(n)
    if op == "flip":
        return data[:pos] + bytes([data[pos] ^ (1 << r.below(8))]) + data[pos + 1 :]
    if op == "set":
        return data[:pos] + bytes([r.pick(INTERESTING_BYTES)]) + data[pos + 1 :]
    if op == "insert":
        return data[:pos] + _chunk(r) + data[pos:]
    if op == "delete":
        return data[:pos] + data[pos + r.int(1, 16) :]
    if op == "truncate":
        return data[:pos]
    stop = min(n, pos + r.int(1, 32))  # repeat a chunk
    return data[:stop] + data[pos:stop] * r.int(1, 4) + data[stop:]


def split_item(data: bytes):
    """``(tree, tail)``: the first strict CBOR item of ``data`` as a mutable tree, and the bytes after it."""
    reader = cbor_strict.StrictReader(data)
    value = reader.read()
    return to_tree(value), data[reader.pos :]


def mutate(r: Rng, data: bytes, *, others=g_valid_message, max_ops: int = 3) -> bytes:
    """1..max_ops mutations, each at tree level (2 in 3, when the bytes still parse) or byte level."""
    for _ in range(r.int(1, max_ops)):
        if not r.one_in(3):
            try:
                tree, tail = split_item(data)
            except MalformedMessage:
                data = mutate_bytes(r, data, others)
                continue
            data = raw.encode(mutate_tree(r, tree)) + tail
        else:
            data = mutate_bytes(r, data, others)
    return data


def g_mutated(r: Rng, base=g_valid_message, others=g_valid_message, max_ops: int = 3) -> bytes:
    return mutate(r, base(r), others=others, max_ops=max_ops)


def g_maybe_mutated(r: Rng, base=g_valid_message) -> bytes:
    """Mostly mutated, one in six the valid message itself."""
    data = base(r)
    return data if r.one_in(6) else mutate(r, data)


# ---------------------------------------------------------------------------
# documents for the strict reader alone
# ---------------------------------------------------------------------------


def g_atom(r: Rng):
    k = r.below(6)
    if k == 0:
        return g_int(r)
    if k == 1:
        return r.int(-30, 30)
    if k == 2:
        return r.float()
    if k == 3:
        return r.bytes(r.int(0, 20))
    if k == 4:
        return r.text(10)
    return r.pick(KEY_POOL)


def g_plain(r: Rng, depth: int = cbor_strict.MAX_DEPTH, budget: list | None = None):
    """A value the strict reader must accept: 64-bit integers, finite floats, bytes, text, arrays
    and text-keyed maps, at most ``depth`` containers deep and at most ~170 items in all (well
    inside the reader's allocation budget of 4 bytes of objects per input byte plus 128 KiB)."""
    budget = [150] if budget is None else budget
    budget[0] -= 1
    k = r.below(4)
    if depth == 0 or k < 2 or budget[0] < 10:
        return g_atom(r)
    if k == 2:
        return [g_plain(r, depth - 1, budget) for _ in range(r.int(0, 4))]
    out = {}
    for _ in range(r.int(0, 4)):
        budget[0] -= 1
        out[r.text(6) if r.bool() else r.pick(KEY_POOL)] = g_plain(r, depth - 1, budget)
    return out


def g_hostile_tree(r: Rng, depth: int = 4):
    """An arbitrary (mostly ill-formed or non-deterministic) CBOR document as an emitter tree."""
    k = r.below(7)
    if depth == 0 or k < 2:
        return g_atom(r) if r.bool() else g_hostile(r)
    items = [g_hostile_tree(r, depth - 1) for _ in range(r.int(0, 4))]
    if k == 2:
        return items
    if k == 3:
        return Array(items, indefinite=True)
    if k == 4:
        return Map([[g_hostile_tree(r, depth - 1) if r.one_in(3) else r.text(4), v] for v in items],
                   indefinite=r.one_in(4))
    if k == 5:
        return Map([[r.pick(KEY_POOL), v] for v in items], canonical=r.bool())
    return Tag(r.log_int(0, 2**64 - 1), items[0] if items else 0)


def g_noncanonical(r: Rng, value) -> bytes:
    """``value`` encoded with exactly one rule of the strict subset broken: must be refused."""
    holder = [to_tree(value)]
    candidates = []
    slots = _slots(holder)
    for seq, i, _ in slots:
        node = seq[i]
        candidates += [(seq, i, "tag"), (seq, i, "simple"), (seq, i, "nan")]
        if _can_widen(node):
            candidates.append((seq, i, "widen"))
        if isinstance(node, (bytes, str, list, Map)):
            candidates.append((seq, i, "indefinite"))
        if isinstance(node, Map) and len(node.pairs) >= 2:
            candidates.append((node, None, "swap"))
        if isinstance(node, Map) and node.pairs:
            candidates.append((node, None, "duplicate"))
    candidates.append((holder, 0, "deep"))
    seq, i, op = r.pick(candidates)
    if op == "swap":
        a = r.below(len(seq.pairs) - 1)
        seq.pairs[a], seq.pairs[a + 1] = seq.pairs[a + 1], seq.pairs[a]
    elif op == "duplicate":
        seq.pairs.insert(r.int(0, len(seq.pairs)), copy.deepcopy(r.pick(seq.pairs)))
    elif op == "widen":
        seq[i] = _widened(r, seq[i])
    elif op == "indefinite":
        seq[i] = _indefinite(r, seq[i])
    elif op == "tag":
        seq[i] = Tag(r.pick((0, 2, 3, 24, 28, 55799)), seq[i])
    elif op == "simple":
        seq[i] = r.pick((True, False, None, Simple(23), Simple(100)))
    elif op == "nan":
        seq[i] = r.pick((Float(float("nan"), 2), Float(float("inf"), 4), Float(float("-inf"), 8), FloatBits(0x7C01, 2)))
    else:
        holder[0] = raw.nest(holder[0], cbor_strict.MAX_DEPTH + 1)
    return raw.encode(holder[0])


# ---------------------------------------------------------------------------
# Hypothesis strategies
# ---------------------------------------------------------------------------

valid_messages = seeded(g_valid_message)
round_specs = seeded(g_round_spec)
padded_reports = seeded(g_padded_report)
hostile_documents = seeded(lambda r: raw.encode(g_hostile_tree(r)))
plain_values = seeded(g_plain)
round_ids = seeded(g_round_id)
mechanisms = st.sampled_from(MECHANISMS)


def mutated(base=g_valid_message, others=g_valid_message, max_ops: int = 3) -> st.SearchStrategy[bytes]:
    """Structure-aware mutations of messages from the generator ``base``."""
    return seeded(g_mutated, base, others, max_ops)


def maybe_mutated(base=g_valid_message) -> st.SearchStrategy[bytes]:
    return seeded(g_maybe_mutated, base)
