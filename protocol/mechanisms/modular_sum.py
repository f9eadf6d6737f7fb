"""Pure arithmetic of the scalar multi-message summation protocol.

Mechanism (Balle, Bell, Gascón & Nissim, "Private Summation in the Multi-Message
Shuffle Model", CCS 2020, arXiv:2002.00817; Ghazi, Manurangsi, Pagh & Velingker,
"Private Aggregation from Fewer Anonymous Messages", Eurocrypt 2020,
arXiv:1909.11073):

1. Each user encodes its real input ``x`` in ``[lower, upper]`` as an integer in
   ``{0, ..., precision}`` by *randomized rounding* (:class:`FixedPoint`), so that
   the encoding is unbiased.
2. The user adds its share of the distributed noise (e.g.
   :func:`shuffledp.protocol.mechanisms.distributed_noise.polya_shares`, whose ``n`` shares
   sum to a discrete Laplace), reduces the result mod ``q`` and splits it into
   ``M`` additive shares mod ``q`` (:func:`split`): ``M - 1`` uniform, the last one
   fixing the sum. Any ``M - 1`` of one user's shares are i.i.d. uniform mod ``q``,
   whatever the value.
3. The shuffler mixes all ``n M`` shares; the analyzer sums them mod ``q``
   (:func:`modular_sum`), maps the result into ``(-q/2, q/2]`` (:func:`centered`)
   and decodes it (:func:`decode_estimate`).

Guarantee: the privacy of the *sum* comes from the distributed noise (with Pólya
shares and ``alpha = exp(-eps / precision)`` the total is ``eps``-DP for a change of
one user's encoding); the multi-message split makes the shuffled multiset reveal
(statistically close to) nothing but the sum mod ``q`` (BBGN20, Thm. 1; GMPV20).
This module implements only the arithmetic: no wire format, no parties, no
accounting of the splitting's statistical distance.

Wrap-around: the analyzer learns ``S mod q`` where ``S`` is the integer sum of all
encodings plus all noise shares. If ``|S| < q/2`` then ``centered(S mod q) == S``
exactly. Encodings lie in ``[0, n p]`` (``p = precision``), so with a noise tail
bound ``|noise| <= t`` it suffices that ``q > 2 (n p + t)``
(:func:`wraparound_bound`); a discrete-Laplace tail is given by
:func:`discrete_laplace_tail`.

This module imports only the standard library and numpy (it runs on devices).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import NamedTuple, overload

import numpy as np

from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.randomness import RandomSource

__all__ = [
    "MAX_MODULUS",
    "MAX_PRECISION",
    "Estimate",
    "FixedPoint",
    "centered",
    "decode_estimate",
    "discrete_laplace_tail",
    "modular_sum",
    "split",
    "wraparound_bound",
]

#: Largest modulus: shares are < 2**62, so the sum of two fits in int64.
MAX_MODULUS = 2**62

#: Largest fixed-point precision: every integer up to 2**52 is a double, so the
#: scaled value's floor is exact and the encodings fit comfortably in int64.
MAX_PRECISION = 2**52

#: Largest number of shares one :func:`split` call draws (as distributed_noise.MAX_DRAWS).
MAX_DRAWS = 2**31

_LOW_BITS = 31
_LOW_MASK = (1 << _LOW_BITS) - 1


# --------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------


def _check_int(name: str, value: object, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidParameter(name, f"must be an integer, got {value!r}")
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise InvalidParameter(name, f"must be {rng}, got {v}")
    return v


def _check_modulus(modulus: object) -> int:
    if isinstance(modulus, bool) or not isinstance(modulus, (int, np.integer)):
        raise InvalidParameter("modulus", f"must be an integer, got {modulus!r}")
    q = int(modulus)
    if not (2 <= q <= MAX_MODULUS):
        raise InvalidParameter("modulus", f"must lie in [2, 2^62], got {q}")
    return q


def _check_real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction, np.integer, np.floating)):
        raise InvalidParameter(name, f"must be a real number, got {value!r}")
    out = float(value)
    if not math.isfinite(out):
        raise InvalidParameter(name, f"must be finite, got {value!r}")
    return out


def _check_int_array(name: str, values: object) -> np.ndarray:
    """An integer array (any integer dtype that fits int64); rejects floats, bools, objects."""
    arr = np.asarray(values)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise InvalidParameter(name, f"must be an array of integers, got dtype {arr.dtype}")
    if arr.dtype == np.uint64 and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise InvalidParameter(name, "entries must fit in int64")
    return arr.astype(np.int64, copy=False)


def _check_source(source: object) -> None:
    if not isinstance(source, RandomSource):
        raise InvalidParameter("source", f"must be a RandomSource, got {type(source).__name__}")


# --------------------------------------------------------------------------
# Fixed-point encoding with randomized rounding
# --------------------------------------------------------------------------


class FixedPoint:
    """Unbiased fixed-point encoding of reals in ``[lower, upper]`` as ``{0, ..., precision}``.

    Mechanism: clip ``x`` to ``[lower, upper]``, scale to
    ``s = precision (x - lower) / (upper - lower)`` in ``[0, precision]`` and round
    at random: ``floor(s) + Bernoulli(s - floor(s))``. Guarantee: for ``x`` inside
    the interval, ``E[encode(x)] = s`` (unbiased), with variance
    ``f (1 - f)`` in encoded units, ``f = s - floor(s)``, i.e.
    ``f (1 - f) step^2`` in real units with ``step = (upper - lower) / precision``
    (:meth:`rounding_variance`). "Exactly" up to floating point: ``s`` is computed
    in double precision, and the Bernoulli probability is realised to within
    ``2^-53`` (:class:`~shuffledp.protocol.mechanisms.randomness.SeededSource` rounds it up,
    :class:`~shuffledp.protocol.mechanisms.randomness.SystemSource` down). Clipped inputs are
    encoded deterministically (biased towards the interval, by design).
    Reference: BBGN20 (arXiv:2002.00817), Sec. 4 (randomized rounding to
    ``{0, ..., p}``).
    """

    def __init__(self, lower: float, upper: float, precision: int) -> None:
        lo = _check_real("lower", lower)
        hi = _check_real("upper", upper)
        if not lo < hi:
            raise InvalidParameter("upper", f"must be > lower = {lo!r}, got {hi!r}")
        if not math.isfinite(hi - lo):
            raise InvalidParameter("upper", "upper - lower overflows a double")
        self.lower = lo
        self.upper = hi
        self.precision = _check_int("precision", precision, 1, MAX_PRECISION)

    def __repr__(self) -> str:
        return f"FixedPoint(lower={self.lower!r}, upper={self.upper!r}, precision={self.precision})"

    @property
    def step(self) -> float:
        """Real value of one encoded unit, ``(upper - lower) / precision``."""
        return (self.upper - self.lower) / self.precision

    def scaled(self, x: float | np.ndarray) -> np.ndarray:
        """``precision (clip(x) - lower) / (upper - lower)`` in ``[0, precision]`` (float64): ``E[encode(x)]``."""
        arr = np.asarray(x, dtype=np.float64)
        if np.isnan(arr).any():
            raise InvalidParameter("x", "must not contain NaN")
        c = np.clip(arr, self.lower, self.upper)
        s = self.precision * ((c - self.lower) / (self.upper - self.lower))
        return np.clip(s, 0.0, float(self.precision))

    def encode(self, x: float | np.ndarray, source: RandomSource) -> np.ndarray:
        """Encode a 1-d batch of users' inputs: int64 array in ``[0, precision]``, one per user."""
        _check_source(source)
        s = np.atleast_1d(self.scaled(x))
        if s.ndim != 1:
            raise InvalidParameter("x", f"must be a scalar or a 1-d array, got shape {s.shape}")
        base = np.floor(s)
        frac = s - base
        up = source.bernoulli(frac, s.size)
        return base.astype(np.int64) + up.astype(np.int64)

    def rounding_variance(self, x: float | np.ndarray, *, encoded: bool = False) -> np.ndarray:
        """Exact per-user variance of the encoding: ``f (1 - f) step^2`` (``encoded=True``: ``f (1 - f)``)."""
        s = self.scaled(x)
        frac = s - np.floor(s)
        var = frac * (1.0 - frac)
        return var if encoded else var * self.step**2

    @overload
    def decode_sum(self, total: int | np.integer, n: int) -> float: ...
    @overload
    def decode_sum(self, total: np.ndarray, n: int) -> np.ndarray: ...
    def decode_sum(self, total: int | np.integer | np.ndarray, n: int) -> float | np.ndarray:
        """Real sum of ``n`` users from the integer sum ``total`` of their encodings.

        The inverse affine map ``n lower + total step`` (``total`` may be any
        integer, e.g. negative when noise is included; floating-point result).
        """
        n = _check_int("n", n, 0)
        if isinstance(total, (int, np.integer)) and not isinstance(total, bool):
            return n * self.lower + float(total) * self.step
        t = _check_int_array("total", total).astype(np.float64)
        return n * self.lower + t * self.step


# --------------------------------------------------------------------------
# Additive secret sharing mod q
# --------------------------------------------------------------------------


def split(values: np.ndarray, modulus: int, messages: int, source: RandomSource) -> np.ndarray:
    """Split each user's integer into ``messages`` additive shares mod ``modulus``.

    Mechanism: ``v`` is reduced mod ``q`` (so a negative ``encoding + noise`` is
    fine); shares ``1 .. M-1`` are i.i.d. uniform on ``{0, ..., q-1}`` drawn with
    ``source.integers``, and the last is ``v - (sum of the others) mod q``.
    Guarantee: the ``M`` shares sum to ``v`` mod ``q`` and any ``M - 1`` of them
    are i.i.d. uniform mod ``q``, independently of ``v`` (BBGN20 Sec. 3, GMPV20).
    ``messages = 1`` returns the value itself (``v mod q``).

    ``values``: 1-d integer array, one entry per user. Returns an ``(n, M)`` int64
    array with entries in ``[0, q)``. No intermediate exceeds ``2^63 - 1``: the
    ``M - 1`` random shares are summed in one pass when ``(M - 1)(q - 1)`` fits in int64,
    else reduced after every addition of two values ``< 2^62`` (the same sum mod ``q``).
    """
    q = _check_modulus(modulus)
    m = _check_int("messages", messages, 1)
    _check_source(source)
    v = _check_int_array("values", values)
    if v.ndim != 1:
        raise InvalidParameter("values", f"must be a 1-d array (one value per user), got shape {v.shape}")
    n = v.size
    if n * m > MAX_DRAWS:
        raise InvalidParameter("messages", f"{n} users x {m} messages exceed the limit of {MAX_DRAWS} shares")
    v = np.mod(v, q)  # floor mod: in [0, q) for q > 0
    out = np.empty((n, m), dtype=np.int64)
    if m > 1:
        out[:, : m - 1] = source.integers(q, n * (m - 1)).reshape(n, m - 1)
    if (m - 1) * (q - 1) <= np.iinfo(np.int64).max:
        acc = np.mod(out[:, : m - 1].sum(axis=1), q)  # each row's sum fits in int64
    else:
        acc = np.zeros(n, dtype=np.int64)
        for j in range(m - 1):
            acc = np.mod(acc + out[:, j], q)  # both < 2^62: no overflow
    out[:, m - 1] = np.mod(v - acc, q)  # in (-q, q): no overflow
    return out


def modular_sum(shares: np.ndarray, modulus: int) -> int:
    """Sum of all ``shares`` (any shape) mod ``modulus``, as a Python int in ``[0, q)``.

    Entries are first reduced mod ``q`` (floor mod); the sum is exact for any array
    size: each reduced entry ``< 2^62`` is split as ``hi 2^31 + lo`` with ``hi, lo <
    2^31``, and ``lo`` and ``hi`` are summed in int64 over chunks of at most
    ``2^31`` entries (each partial sum ``< 2^62``), then combined in Python integers.
    """
    q = _check_modulus(modulus)
    a = np.mod(_check_int_array("shares", shares).ravel(), q)
    lo_sum = 0
    hi_sum = 0
    chunk = 1 << _LOW_BITS
    for start in range(0, a.size, chunk):
        part = a[start : start + chunk]
        lo_sum += int(np.sum(part & _LOW_MASK, dtype=np.int64))
        hi_sum += int(np.sum(part >> _LOW_BITS, dtype=np.int64))
    return ((hi_sum << _LOW_BITS) + lo_sum) % q


@overload
def centered(total: int | np.integer, modulus: int) -> int: ...
@overload
def centered(total: np.ndarray, modulus: int) -> np.ndarray: ...
def centered(total: int | np.integer | np.ndarray, modulus: int) -> int | np.ndarray:
    """Representative of ``total`` mod ``q`` in ``(-q/2, q/2]``.

    If the true integer ``S`` satisfies ``-q/2 < S <= q/2`` then
    ``centered(S mod q) == S``. Python ints in, Python int out; arrays in, int64 out.
    """
    q = _check_modulus(modulus)
    if isinstance(total, (int, np.integer)) and not isinstance(total, bool):
        t = int(total) % q
        return t if 2 * t <= q else t - q
    t = np.mod(_check_int_array("total", total), q)
    return np.where(t <= q // 2, t, t - q)


# --------------------------------------------------------------------------
# Decoding and parameters
# --------------------------------------------------------------------------


class Estimate(NamedTuple):
    """Analyzer output of one summation round."""

    #: The decoded integer: sum of all encodings plus all noise shares (if no wrap-around).
    encoded_total: int
    #: Estimate of the real sum of the users' (clipped) inputs.
    sum: float
    #: ``sum / n``.
    mean: float


def wraparound_bound(users: int, precision: int, noise_tail: int | float | Fraction = 0) -> int:
    """Smallest modulus ``q`` with ``q > 2 (users precision + noise_tail)``.

    With such a ``q``, every integer sum ``S`` of ``users`` encodings in
    ``[0, precision]`` plus noise of magnitude ``<= noise_tail`` satisfies
    ``|S| < q/2``, so ``centered(S mod q) == S`` and :func:`decode_estimate` is
    exact. The result may exceed :data:`MAX_MODULUS`; then no admissible modulus
    avoids wrap-around.
    """
    n = _check_int("users", users, 1)
    p = _check_int("precision", precision, 1)
    if isinstance(noise_tail, bool) or not isinstance(noise_tail, (int, float, Fraction, np.integer, np.floating)):
        raise InvalidParameter("noise_tail", f"must be a real number, got {noise_tail!r}")
    if isinstance(noise_tail, (float, np.floating)) and not math.isfinite(float(noise_tail)):
        raise InvalidParameter("noise_tail", f"must be finite, got {noise_tail!r}")
    t = Fraction(int(noise_tail)) if isinstance(noise_tail, np.integer) else Fraction(noise_tail)
    if t < 0:
        raise InvalidParameter("noise_tail", f"must be >= 0, got {noise_tail!r}")
    return math.floor(2 * (n * p + t)) + 1


def discrete_laplace_tail(alpha: float, failure_prob: float) -> int:
    """Smallest integer ``t >= 0`` with ``P(|DLap(alpha)| > t) <= failure_prob``.

    For ``P(k)`` proportional to ``alpha^|k|``: ``P(|X| > t) = 2 alpha^(t+1) / (1 + alpha)``.
    Combined with :func:`wraparound_bound`, wrap-around has probability at most
    ``failure_prob``.
    """
    a = _check_real("alpha", alpha)
    if not (0.0 < a < 1.0):
        raise InvalidParameter("alpha", f"must lie in the open interval (0, 1), got {alpha!r}")
    b = _check_real("failure_prob", failure_prob)
    if not (0.0 < b < 1.0):
        raise InvalidParameter("failure_prob", f"must lie in the open interval (0, 1), got {failure_prob!r}")
    # alpha^(t+1) <= b (1 + a) / 2  <=>  t + 1 >= log(b (1+a)/2) / log(a)
    t = max(0, math.ceil(math.log(b * (1.0 + a) / 2.0) / math.log(a)) - 1)
    while 2.0 * a ** (t + 1) / (1.0 + a) > b:  # guard the float ceil
        t += 1
    return t


def decode_estimate(total_mod_q: int, n: int, fixed_point: FixedPoint, modulus: int) -> Estimate:
    """Analyzer decoding: the real sum and mean from the modular sum of all shares.

    ``S = centered(total_mod_q, q)`` is taken as the integer sum of the ``n``
    encodings plus the noise; the estimate is ``fixed_point.decode_sum(S, n)``.
    Exact (``S`` equals the true integer sum) when ``|true sum + noise| < q/2``,
    guaranteed for ``q >= wraparound_bound(n, precision, t)`` and noise bounded by
    ``t``. Raises :class:`InvalidParameter` if ``q <= 2 n precision``: then even
    noiseless honest inputs can wrap around. With unbiased rounding and zero-mean
    noise the estimate is unbiased for the sum of the clipped inputs, with
    variance (encoded units) ``sum_i f_i (1 - f_i) + Var(noise)``
    (Pólya shares: ``2 alpha / (1 - alpha)^2``).
    """
    q = _check_modulus(modulus)
    n = _check_int("n", n, 1)
    if not isinstance(fixed_point, FixedPoint):
        raise InvalidParameter("fixed_point", f"must be a FixedPoint, got {type(fixed_point).__name__}")
    if isinstance(total_mod_q, bool) or not isinstance(total_mod_q, (int, np.integer)):
        raise InvalidParameter("total_mod_q", f"must be an integer, got {total_mod_q!r}")
    if not 0 <= int(total_mod_q) < q:
        raise InvalidParameter("total_mod_q", f"must lie in [0, modulus), got {total_mod_q}")
    if q <= 2 * n * fixed_point.precision:
        raise InvalidParameter(
            "modulus",
            f"{q} <= 2 n precision = {2 * n * fixed_point.precision}: sums of honest inputs would wrap "
            "around; use wraparound_bound(n, precision, noise_tail)",
        )
    s = centered(int(total_mod_q), q)
    total = fixed_point.decode_sum(s, n)
    return Estimate(encoded_total=s, sum=total, mean=total / n)
