"""Where randomness comes from.

Every randomizer in shuffledp draws its randomness through a :class:`RandomSource`,
vectorized over a batch of users. Two implementations exist:

* :class:`SeededSource` -- the *simulation* path. A ``numpy.random.Generator`` on a
  PCG64 stream: fast, fully vectorized and reproducible from a seed. It is **not**
  a cryptographic generator and its noise samplers use floating point, so it must
  never be used to protect real users' data (``secure = False``).
* :class:`SystemSource` -- the *device* path. All bits come from the operating
  system's CSPRNG through the :mod:`secrets` module, and the discrete Laplace and
  discrete Gaussian noises are drawn with the exact algorithms of Canonne, Kamath
  and Steinke, "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020;
  below "CKS20"), which use only uniform integers and exact rational arithmetic
  (:class:`fractions.Fraction`), so the output distribution is exactly the
  stated one -- no floating-point artefacts that could leak information
  (cf. Mironov 2012 on the textbook floating-point Laplace mechanism).
  ``secure = True``.

This module imports only the standard library and numpy (it runs on devices).
"""

from __future__ import annotations

import math
import secrets
from fractions import Fraction
from numbers import Rational
from typing import Protocol, runtime_checkable

import numpy as np

from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.local_params import check_integer

__all__ = ["MAX_NOISE_SCALE", "RandomSource", "SeededSource", "SystemSource"]

#: Largest noise scale either source samples: the discrete Laplace ``scale`` and the
#: discrete Gaussian's ``sqrt(sigma2)``. At 2**44 a draw exceeds 2**50 in magnitude
#: with probability below exp(-64), so values stay far inside int64 and numpy's
#: geometric sampler stays exact (past ~2**62 it saturates at the int64 maximum, and
#: the difference of two saturated draws is a noiseless 0). Round specs refuse
#: budgets that would need more (``ProjectedMeanParams.check_budget``).
MAX_NOISE_SCALE = float(2**44)

# Number of random bits behind one SystemSource Bernoulli draw.
_BERNOULLI_BITS = 53
_TWO_53 = 1 << _BERNOULLI_BITS


@runtime_checkable
class RandomSource(Protocol):
    """Everything a randomizer draws, vectorized over a batch of users.

    ``size`` is the batch size; every method returns a 1-d array of that length.
    """

    #: True only for sources backed by the operating system's CSPRNG.
    secure: bool

    def integers(self, high: int, size: int) -> np.ndarray:
        """int64 array, i.i.d. uniform on ``{0, ..., high - 1}``."""
        ...

    def bernoulli(self, p: float | Fraction | np.ndarray, size: int) -> np.ndarray:
        """bool array with ``P(True) = p`` (elementwise if ``p`` has shape ``(size,)``)."""
        ...

    def discrete_laplace(self, scale: Fraction | float, size: int) -> np.ndarray:
        """int64 array, i.i.d. with ``P(k)`` proportional to ``exp(-|k| / scale)``."""
        ...

    def discrete_gaussian(self, sigma2: Fraction | float, size: int) -> np.ndarray:
        """int64 array, i.i.d. with ``P(k)`` proportional to ``exp(-k^2 / (2 sigma2))``."""
        ...


# --------------------------------------------------------------------------
# Parameter validation shared by both sources
# --------------------------------------------------------------------------


def _check_size(size: object) -> int:
    return check_integer("size", size, 0)


def _check_high(high: object) -> int:
    return check_integer("high", high, 1)


def _check_positive_exact(name: str, value: object) -> Fraction:
    """Validate a positive finite real and convert it *exactly* to a Fraction."""
    if isinstance(value, bool):
        raise InvalidParameter(name, f"must be a positive number, got {value!r}")
    if isinstance(value, (Fraction, Rational, int, np.integer)):
        frac = Fraction(int(value)) if isinstance(value, np.integer) else Fraction(value)
    elif isinstance(value, (float, np.floating)):
        if not math.isfinite(float(value)):
            raise InvalidParameter(name, f"must be finite, got {value!r}")
        frac = Fraction(float(value))  # exact binary value of the float
    else:
        raise InvalidParameter(name, f"must be a real number, got {value!r}")
    if frac <= 0:
        raise InvalidParameter(name, f"must be > 0, got {value!r}")
    return frac


def _check_noise_scale(name: str, scale: Fraction, power: int = 1) -> None:
    """Refuse a noise scale (``power=2``: a variance) above :data:`MAX_NOISE_SCALE`."""
    if scale > Fraction(MAX_NOISE_SCALE) ** power:
        raise InvalidParameter(
            name, f"{float(scale):.3g} exceeds the largest noise scale sampled exactly, {MAX_NOISE_SCALE:.3g}^{power}"
        )


def _check_positive_float(name: str, value: object) -> float:
    frac = _check_positive_exact(name, value)
    out = float(frac)
    if not (out > 0 and math.isfinite(out)):
        raise InvalidParameter(name, f"must be a positive finite float, got {value!r}")
    return out


def _check_probability(p: object, size: int) -> float | Fraction | np.ndarray:
    """Return p as a float (a Fraction as given, exact) or a float64 array of shape (size,), validated in [0, 1]."""
    if isinstance(p, bool):
        raise InvalidParameter("p", f"must be a probability, got {p!r}")
    if isinstance(p, np.ndarray):
        if p.ndim == 0:
            p = p.item()
        else:
            if p.shape != (size,):
                raise InvalidParameter(
                    "p", f"array must have shape ({size},), got {p.shape}"
                )
            arr = np.asarray(p, dtype=np.float64)
            if not np.all((arr >= 0.0) & (arr <= 1.0)):  # also rejects NaN
                raise InvalidParameter("p", "every probability must lie in [0, 1]")
            return arr
    if not isinstance(p, (int, float, Fraction, np.integer, np.floating)):
        raise InvalidParameter("p", f"must be a probability, got {p!r}")
    pf = float(p)
    if not (0.0 <= pf <= 1.0):  # also rejects NaN
        raise InvalidParameter("p", f"must lie in [0, 1], got {p!r}")
    return p if isinstance(p, Fraction) else pf


# --------------------------------------------------------------------------
# Simulation path
# --------------------------------------------------------------------------


class SeededSource:
    """Reproducible, vectorized simulation source on ``Generator(PCG64(seed))``.

    Not cryptographically secure (``secure = False``); use it for simulation,
    benchmarks and tests only, never on a device.
    """

    secure = False

    def __init__(self, seed: int | np.random.SeedSequence | None) -> None:
        if isinstance(seed, np.random.SeedSequence):
            seq = seed
        elif seed is None or (isinstance(seed, (int, np.integer)) and not isinstance(seed, bool)):
            if seed is not None and seed < 0:
                raise InvalidParameter("seed", f"must be >= 0, got {seed}")
            seq = np.random.SeedSequence(None if seed is None else int(seed))
        else:
            raise InvalidParameter("seed", f"must be an int, a SeedSequence or None, got {seed!r}")
        self._seq = seq
        self._gen = np.random.Generator(np.random.PCG64(seq))

    @property
    def generator(self) -> np.random.Generator:
        """The underlying numpy Generator."""
        return self._gen

    def spawn(self, n: int) -> list["SeededSource"]:
        """``n`` independent child streams (``SeedSequence.spawn``), for chunked simulation.

        Children are a deterministic function of this source's seed and of how many
        children were spawned before; they do not consume this source's stream.
        """
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise InvalidParameter("n", f"must be an integer >= 0, got {n!r}")
        return [SeededSource(child) for child in self._seq.spawn(int(n))]

    def integers(self, high: int, size: int) -> np.ndarray:
        high = _check_high(high)
        size = _check_size(size)
        return self._gen.integers(0, high, size=size, dtype=np.int64)

    def bernoulli(self, p: float | Fraction | np.ndarray, size: int) -> np.ndarray:
        size = _check_size(size)
        p = _check_probability(p, size)
        if isinstance(p, Fraction):
            p = float(p)
        # generator.random is uniform on [0, 1) in multiples of 2^-53, so
        # P(u < p) = ceil(p 2^53) / 2^53 for p in [0, 1]: p = 0 never, p = 1 always.
        return self._gen.random(size) < p

    def discrete_laplace(self, scale: Fraction | float, size: int) -> np.ndarray:
        """Difference of two i.i.d. geometric variables.

        With ``q = exp(-1/scale)`` and ``G1, G2`` i.i.d. geometric on ``{1, 2, ...}``
        with ``P(G = j) = (1 - q) q^(j-1)`` (success probability ``1 - q``), for
        ``k >= 0``::

            P(G1 - G2 = k) = sum_{j>=1} (1-q)^2 q^(j+k-1) q^(j-1)
                           = (1-q)^2 q^k / (1 - q^2) = (1-q)/(1+q) * q^k,

        and by symmetry the same with ``|k|`` for ``k < 0``; i.e.
        ``P(k) = (1-q)/(1+q) exp(-|k|/scale)``, the discrete Laplace law.
        """
        _check_noise_scale("scale", _check_positive_exact("scale", scale))
        scale = _check_positive_float("scale", scale)
        size = _check_size(size)
        p_success = -math.expm1(-1.0 / scale)  # 1 - exp(-1/scale), accurately
        if p_success <= 0.0:
            raise InvalidParameter("scale", f"too large for float simulation: {scale!r}")
        g1 = self._gen.geometric(p_success, size=size).astype(np.int64)
        g2 = self._gen.geometric(p_success, size=size).astype(np.int64)
        return g1 - g2

    def discrete_gaussian(self, sigma2: Fraction | float, size: int) -> np.ndarray:
        """Vectorized rejection sampling from a discrete Laplace proposal (CKS20 Alg. 3).

        Proposal ``Y`` ~ discrete Laplace with scale ``t = floor(sigma) + 1``; accept
        with probability ``exp(-(|Y| - sigma2/t)^2 / (2 sigma2))``. Since
        ``-y^2/(2 s2) + |y|/t = -(|y| - s2/t)^2/(2 s2) + s2/(2 t^2)``, the accepted
        values have ``P(y)`` proportional to ``exp(-y^2 / (2 sigma2))`` (any ``t > 0``
        is correct; this ``t`` keeps the acceptance rate bounded below). Rejected
        slots are redrawn until every slot is filled.
        """
        _check_noise_scale("sigma2", _check_positive_exact("sigma2", sigma2), power=2)
        s2 = _check_positive_float("sigma2", sigma2)
        size = _check_size(size)
        t = math.floor(math.sqrt(s2)) + 1
        out = np.empty(size, dtype=np.int64)
        missing = np.arange(size)
        while missing.size:
            y = self.discrete_laplace(t, missing.size)
            a = np.abs(y).astype(np.float64) - s2 / t
            accept = self._gen.random(missing.size) < np.exp(-(a * a) / (2.0 * s2))
            out[missing[accept]] = y[accept]
            missing = missing[~accept]
        return out


# --------------------------------------------------------------------------
# Device path: OS CSPRNG + exact algorithms of CKS20
# --------------------------------------------------------------------------


class SystemSource:
    """Device source: every bit comes from the OS CSPRNG (:mod:`secrets`).

    * ``integers``: ``secrets.randbelow``, exactly uniform.
    * ``bernoulli``: draws a uniform 53-bit integer ``U`` and returns
      ``U < floor(p * 2**53)``, computed exactly (``p`` is converted with
      ``Fraction``). This realises probability ``floor(p 2^53) / 2^53``: ``p`` is
      rounded DOWN to a multiple of ``2^-53`` (by less than ``2^-53``), so the
      probability of ``True`` never exceeds the requested ``p``. A randomized-
      response client that passes its *keep* probability ``e^eps/(e^eps+k-1)``
      therefore keeps with at most that probability (and hence reports each other
      value with at least the complementary share), so its likelihood ratio stays
      ``<= e^eps``. ``p = 0`` never and ``p = 1`` always returns True.
    * ``discrete_laplace`` / ``discrete_gaussian``: the exact samplers of CKS20
      (Algorithm 1: Bernoulli(exp(-gamma)); Algorithm 2: discrete Laplace;
      Algorithm 3: discrete Gaussian) in exact rational arithmetic; floats are
      converted exactly with ``Fraction(x)``. They loop in Python over ``size``
      (devices draw ``size = 1``).

    Timing: these samplers are exact but not constant-time; their running time
    depends on the sample (as in CKS20).
    """

    secure = True

    def __init__(self) -> None:
        # Indirection so tests can substitute a seeded bit source on an
        # *instance* to make the exact algorithms reproducible; production code
        # never passes anything here.
        self._randbelow = secrets.randbelow
        self._randbits = secrets.randbits

    # -- primitives --------------------------------------------------------

    def integers(self, high: int, size: int) -> np.ndarray:
        high = _check_high(high)
        size = _check_size(size)
        rb = self._randbelow
        return np.fromiter((rb(high) for _ in range(size)), dtype=np.int64, count=size)

    def bernoulli(self, p: float | Fraction | np.ndarray, size: int) -> np.ndarray:
        size = _check_size(size)
        p = _check_probability(p, size)
        if isinstance(p, np.ndarray):
            thresholds = [self._threshold(float(pi)) for pi in p]
        else:
            thresholds = [self._threshold(p)] * size
        bits = self._randbits
        return np.fromiter(
            (bits(_BERNOULLI_BITS) < th for th in thresholds), dtype=bool, count=size
        )

    @staticmethod
    def _threshold(p: float | Fraction) -> int:
        # floor(p * 2^53), exactly (Fraction of a float is its exact binary value).
        return math.floor(Fraction(p) * _TWO_53)

    # -- CKS20 building blocks (exact, rational) ----------------------------

    def _bernoulli_rational(self, p: Fraction) -> bool:
        """Bernoulli(n/d) for rational 0 <= n/d <= 1: uniform D in {0..d-1}, return D < n."""
        return self._randbelow(p.denominator) < p.numerator

    def _bernoulli_exp_neg(self, gamma: Fraction) -> bool:
        """CKS20 Algorithm 1: Bernoulli(exp(-gamma)) for rational gamma >= 0.

        For gamma in [0, 1] (von Neumann / Forsythe): K <- 1; repeat draw
        A ~ Bernoulli(gamma/K), stop if A = 0 else K <- K + 1; return [K odd].
        For gamma > 1: floor(gamma) independent Bernoulli(exp(-1)) draws (stop at
        the first 0) times one Bernoulli(exp(-(gamma - floor(gamma)))).
        """
        return self._bernoulli_exp_neg_ratio(gamma.numerator, gamma.denominator)

    def _bernoulli_exp_neg_ratio(self, num: int, den: int) -> bool:
        """:meth:`_bernoulli_exp_neg` of ``gamma = num / den`` (integers, ``num >= 0``, ``den >= 1``).

        The same algorithm in integer arithmetic: Bernoulli(gamma/K) is
        :meth:`_bernoulli_rational` of ``gamma/K`` in lowest terms (``g = gcd(num, den K)``;
        uniform D on ``{0..den K/g - 1}``, return ``D < num/g``), so the bit source is asked
        for exactly what the rational version asks for, without building a Fraction per draw.
        """
        randbelow = self._randbelow
        if num <= den:
            k = 1
            while True:
                scaled = den * k
                g = math.gcd(num, scaled)
                if not randbelow(scaled // g) < num // g:
                    return k % 2 == 1
                k += 1
        for _ in range(num // den):
            if not self._bernoulli_exp_neg_ratio(1, 1):
                return False
        return self._bernoulli_exp_neg_ratio(num % den, den)

    def _discrete_laplace_one(self, scale: Fraction) -> int:
        """CKS20 Algorithm 2: one draw with P(z) proportional to exp(-|z| / scale).

        With scale = t/s (s, t positive integers, here the reduced numerator t and
        denominator s): U uniform on {0..t-1} accepted w.p. exp(-U/t), V counts
        successes of Bernoulli(exp(-1)) before the first failure, X = U + tV is
        then geometric with P(X = x) proportional to exp(-x/t), Y = floor(X/s) is
        geometric with P(Y = y) proportional to exp(-y s/t); a fair sign B is
        attached and (B = 1, Y = 0) is rejected so that 0 is not counted twice.
        """
        return self._discrete_laplace_ratio(scale.numerator, scale.denominator)

    def _discrete_laplace_ratio(self, t: int, s: int) -> int:
        """:meth:`_discrete_laplace_one` of ``scale = t / s`` in lowest terms, in integer arithmetic."""
        randbelow = self._randbelow
        exp_neg = self._bernoulli_exp_neg_ratio
        while True:
            u = randbelow(t)
            if not exp_neg(u, t):
                continue
            v = 0
            while exp_neg(1, 1):
                v += 1
            y = (u + t * v) // s
            b = randbelow(2)
            if b == 1 and y == 0:
                continue
            return -y if b == 1 else y

    def _discrete_gaussian_one(self, sigma2: Fraction) -> int:
        """CKS20 Algorithm 3: one draw with P(y) proportional to exp(-y^2 / (2 sigma2)).

        t = floor(sigma) + 1 (computed exactly as isqrt(floor(sigma2)) + 1);
        repeat: Y ~ discrete Laplace(t); accept with probability
        exp(-(|Y| - sigma2/t)^2 / (2 sigma2)). With sigma2 = p/q in lowest terms that
        exponent is ``(|Y| q t - p)^2 / (2 p q t^2)``, evaluated in integers.
        """
        p, q = sigma2.numerator, sigma2.denominator
        t = math.isqrt(p // q) + 1
        qt = q * t
        den = 2 * p * q * t * t
        while True:
            y = self._discrete_laplace_ratio(t, 1)
            if self._bernoulli_exp_neg_ratio((abs(y) * qt - p) ** 2, den):
                return y

    # -- public noise samplers ---------------------------------------------

    def discrete_laplace(self, scale: Fraction | float, size: int) -> np.ndarray:
        scale = _check_positive_exact("scale", scale)
        _check_noise_scale("scale", scale)
        size = _check_size(size)
        return np.fromiter(
            (self._discrete_laplace_one(scale) for _ in range(size)), dtype=np.int64, count=size
        )

    def discrete_gaussian(self, sigma2: Fraction | float, size: int) -> np.ndarray:
        sigma2 = _check_positive_exact("sigma2", sigma2)
        _check_noise_scale("sigma2", sigma2, power=2)
        size = _check_size(size)
        return np.fromiter(
            (self._discrete_gaussian_one(sigma2) for _ in range(size)), dtype=np.int64, count=size
        )
