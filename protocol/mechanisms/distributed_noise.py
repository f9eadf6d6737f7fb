"""Distributed noise for multi-message summation: Pólya and Skellam shares.

In a summation protocol each of ``n`` users adds a *share* of noise to its own
(integer) contribution; no single share protects anything, but the sum of the
``n`` shares that the analyzer sees is a full noise draw of a known law. This
module samples those shares.

Mathematics
-----------

*Discrete Laplace.* ``DLap(alpha)``, ``0 < alpha < 1``, is the law on the
integers with ``P(k) = (1 - alpha) / (1 + alpha) * alpha^|k|``. Added to a sum
of sensitivity ``Delta`` with ``alpha = exp(-eps / Delta)`` it gives ``eps``-DP
(pure). Its variance is ``2 alpha / (1 - alpha)^2``.

*Geometric difference.* Let ``G`` count the failures before the first success
of independent trials with success probability ``1 - alpha``:
``P(G = k) = (1 - alpha) alpha^k``, ``k >= 0``. For two i.i.d. copies,
``P(G1 - G2 = k) = sum_j (1-alpha)^2 alpha^(j+k) alpha^j
= (1-alpha)/(1+alpha) alpha^k`` for ``k >= 0`` (symmetric for ``k < 0``), so
``G1 - G2 ~ DLap(alpha)``.

*Pólya shares.* ``G`` is the negative binomial ``NB(r = 1, p = 1 - alpha)``
(failures before ``r`` successes, success probability ``p``). The negative
binomial is infinitely divisible in its shape: the sum of independent
``NB(r_i, p)`` is ``NB(sum r_i, p)``, for real ``r_i > 0`` (its probability
generating function is ``(p / (1 - (1-p) z))^r``). ``NB(r, p)`` with real ``r``
is the Pólya distribution. Hence if each of ``n`` users adds the share

    ``Z_i = X_i - Y_i``,   ``X_i, Y_i`` i.i.d. ``NB(1/n, 1 - alpha)``,

then ``sum_i Z_i = NB(1, 1-alpha) - NB(1, 1-alpha) ~ DLap(alpha)`` *exactly*
(Goryczka & Xiong, "A Comprehensive Comparison of Multiparty Secure Additions
with Differential Privacy", IEEE TDSC 2017; Balle, Bell, Gascón & Nissim,
"Private Summation in the Multi-Message Shuffle Model", CCS 2020,
arXiv:2002.00817). One user's share has variance ``2 alpha / (n (1-alpha)^2)``.
If only ``t < n`` users add their share honestly, the sum's noise is the
difference of two ``NB(t/n, 1-alpha)``: less than a full ``DLap(alpha)``; the
guarantee is for the round in which all ``n`` shares are present.

*Skellam shares.* ``Skellam(mu) = P1 - P2`` with ``P1, P2`` i.i.d.
``Poisson(mu)``; variance ``2 mu``. Poisson is infinitely divisible, so each of
``n`` users adds ``Skellam(mu / n)`` and the ``n`` shares sum to
``Skellam(mu)`` exactly. Agarwal, Kairouz & Liu, "The Skellam Mechanism for
Differentially Private Federated Learning", NeurIPS 2021, give its
(Rényi) DP guarantee for vectors; coordinates are independent, so a vector
share is ``size`` independent draws.

Library convention (the trap)
-----------------------------

``numpy.random.Generator.negative_binomial(n, p)`` draws the number of
*failures* before ``n`` successes, ``p`` being the *success* probability (mean
``n (1-p) / p``); ``scipy.stats.nbinom(n, p)`` is the same law. The Pólya share
therefore passes ``p = 1 - alpha``, never ``alpha``. Passing ``alpha`` (as a
public implementation of this very protocol does) draws ``NB(1/n, alpha)``,
whose sum has variance ``2 (1-alpha) / alpha^2`` instead of
``2 alpha / (1-alpha)^2`` -- a factor ``(alpha / (1-alpha))^3`` smaller, about
``10^6`` at ``alpha = 0.99`` -- and is not private. To keep the convention in
one place the NB sampler here takes ``success_prob`` by name.

The two paths
-------------

* :class:`~shuffledp.protocol.mechanisms.randomness.SeededSource` (simulation): vectorized
  numpy (``negative_binomial`` with real shape, ``poisson``) on the source's
  PCG64 generator. numpy's NB is itself a Gamma-Poisson mixture in double
  precision; fine for simulation, not a cryptographic source.
* :class:`~shuffledp.protocol.mechanisms.randomness.SystemSource` (device): OS CSPRNG.

  - Skellam shares are **exact**: ``mu / n`` is converted exactly to a rational
    (``Fraction(mu) / n``) and Poisson is drawn exactly from uniform integers
    (:func:`_poisson_exact`), so the share's law is exactly
    ``Skellam(Fraction(mu) / n)``.
  - Pólya shares are **not exact**. ``NB(r, p)`` is drawn as the Gamma-Poisson
    mixture ``Poisson(Lambda)``, ``Lambda ~ Gamma(shape r, scale (1-p)/p)``.
    ``Lambda`` comes from :meth:`random.SystemRandom.gammavariate` (uniforms
    from ``os.urandom``, but the gamma algorithm -- Ahrens-Dieter GS for shape
    < 1 -- uses double-precision ``exp``/``log``/``pow``, and the scale
    ``alpha / (1 - alpha)`` is a rounded double): its law is a floating-point
    approximation of the gamma law. Given the double ``Lambda``, the Poisson
    draw is exact (``Fraction(Lambda)`` is the exact value of the double).
    So the share is an exact Poisson mixture over a double-precision gamma;
    the sum of ``n`` shares is ``DLap(alpha)`` only up to that floating-point
    error. We do not claim exactness for it. (An exact sampler would need an
    exact gamma or an exact compound Poisson-logarithmic representation; not
    implemented.)

  The exact Poisson's running time is linear in its mean, so the device path
  refuses parameters whose per-user mean exceeds :data:`DEVICE_MAX_MEAN`
  (Skellam: ``mu / n``; Pólya: the gamma scale ``alpha / (1-alpha)``, which
  bounds ``Lambda`` stochastically, since ``Gamma(r <= 1, theta)`` is dominated
  by ``Exp(theta)``). Running time depends on the sample (not constant-time).

This module imports only the standard library and numpy (it runs on devices).
"""

from __future__ import annotations

import math
import random
import secrets
from fractions import Fraction

import numpy as np

from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.randomness import MAX_NOISE_SCALE, SeededSource, SystemSource

__all__ = [
    "DEVICE_MAX_MEAN",
    "DEVICE_MAX_TOTAL_MEAN",
    "discrete_laplace_variance",
    "negative_binomial",
    "polya_shares",
    "skellam_shares",
    "skellam_variance",
]

#: Largest per-user mean the device path (exact Poisson, linear time) accepts:
#: the Skellam share's Poisson mean ``mu / n`` and the Pólya share's gamma scale
#: ``alpha / (1 - alpha)`` (i.e. ``alpha <= 1 - 1/(2^16 + 1)``).
DEVICE_MAX_MEAN = float(2**16)
#: Largest total Poisson mean one device call draws (``mu_total / users`` times the number of
#: Skellam draws): the exact sampler takes a few microseconds per unit, so this is a few seconds
#: of device CPU. Without it a spec whose every draw is at :data:`DEVICE_MAX_MEAN` over 1,024
#: coordinates (a valid ``local-vector`` round) took the device 2 x 2^26 units, many minutes.
DEVICE_MAX_TOTAL_MEAN = float(2**18)

#: Largest number of draws (product of ``size``) one call returns.
MAX_DRAWS = 2**31

_MAX_USERS = 2**40


# --------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------


def _check_real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction, np.integer, np.floating)):
        raise InvalidParameter(name, f"must be a real number, got {value!r}")
    out = float(value)
    if not math.isfinite(out):
        raise InvalidParameter(name, f"must be finite, got {value!r}")
    return out


def _check_alpha(alpha: object) -> float:
    a = _check_real("alpha", alpha)
    if not (0.0 < a < 1.0):
        raise InvalidParameter("alpha", f"must lie in the open interval (0, 1), got {alpha!r}")
    # Discrete Laplace scale 1/eps = -1/ln(alpha) (per unit sensitivity).
    scale = -1.0 / math.log(a)
    if scale > MAX_NOISE_SCALE:
        raise InvalidParameter(
            "alpha",
            f"noise scale -1/ln(alpha) = {scale:.3g} exceeds MAX_NOISE_SCALE = {MAX_NOISE_SCALE:.3g}",
        )
    return a


def _check_users(users: object) -> int:
    if isinstance(users, bool) or not isinstance(users, (int, np.integer)):
        raise InvalidParameter("users", f"must be an integer, got {users!r}")
    if not (1 <= users <= _MAX_USERS):
        raise InvalidParameter("users", f"must lie in [1, 2^40], got {users}")
    return int(users)


def _check_mu(mu_total: object) -> float:
    mu = _check_real("mu_total", mu_total)
    if not mu > 0.0:
        raise InvalidParameter("mu_total", f"must be > 0, got {mu_total!r}")
    # Each Poisson of the total has mean mu; keeping it <= MAX_NOISE_SCALE keeps the
    # values far inside int64 (and inside numpy's Poisson range).
    if mu > MAX_NOISE_SCALE:
        raise InvalidParameter(
            "mu_total", f"{mu:.3g} exceeds MAX_NOISE_SCALE = {MAX_NOISE_SCALE:.3g}"
        )
    return mu


def _check_size(size: object) -> tuple[int, ...]:
    """``size``: a non-negative int or a tuple of them (numpy shape); at most MAX_DRAWS draws."""

    def one(s: object) -> int:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
            raise InvalidParameter("size", f"must be an int or a tuple of ints, got {size!r}")
        if s < 0:
            raise InvalidParameter("size", f"must be >= 0, got {size!r}")
        return int(s)

    shape = tuple(one(s) for s in size) if isinstance(size, tuple) else (one(size),)
    if math.prod(shape) > MAX_DRAWS:
        raise InvalidParameter("size", f"{math.prod(shape)} draws exceed the limit {MAX_DRAWS}")
    return shape


def _check_source(source: object) -> None:
    if not isinstance(source, (SeededSource, SystemSource)):
        raise InvalidParameter(
            "source", f"must be a SeededSource or a SystemSource, got {type(source).__name__}"
        )


# --------------------------------------------------------------------------
# Exact Poisson from uniform integers (device path)
# --------------------------------------------------------------------------


def _geometric_half(randbits) -> int:
    """``k >= 0`` with ``P(k) = 2^-(k+1)``: the number of trailing zero bits of a fair bit stream."""
    k = 0
    while True:
        x = randbits(32)
        if x:
            return k + (x & -x).bit_length() - 1
        k += 32


def _poisson_one_exact(randbelow, randbits) -> int:
    """Exact ``Poisson(1)`` by rejection from ``Geometric(1/2)``.

    Proposal ``P(k) = 2^-(k+1)``; accept with probability ``2^k / (2 k!)``, which is
    ``<= 1`` for every ``k >= 0`` (1/2, 1, 1, 2/3, ...) and is decided exactly by
    ``randbelow(2 k!) < 2^k``. Accepted values have ``P(k)`` proportional to
    ``2^-(k+1) 2^k / (2 k!) = 1 / (4 k!)``, i.e. ``Poisson(1)``. Acceptance rate e/4.
    """
    while True:
        k = _geometric_half(randbits)
        if randbelow(2 * math.factorial(k)) < (1 << k):
            return k


def _poisson_exact(lam: Fraction, randbelow, randbits) -> int:
    """Exact ``Poisson(lam)`` for rational ``lam >= 0``, in time linear in ``lam``.

    With ``m = ceil(lam)``: ``N = sum of m i.i.d. Poisson(1)`` is ``Poisson(m)``, and
    binomial thinning ``X | N ~ Binomial(N, lam/m)`` (each of the ``N`` kept iff
    ``randbelow(den) < num`` for ``lam/m = num/den``) gives ``X ~ Poisson(lam)``.
    Only uniform integers and exact integer comparisons are used.
    """
    if lam <= 0:
        return 0
    m = math.ceil(lam)
    n = 0
    for _ in range(m):
        n += _poisson_one_exact(randbelow, randbits)
    if lam == m:
        return n
    thin = lam / m
    num, den = thin.numerator, thin.denominator
    return sum(1 for _ in range(n) if randbelow(den) < num)


def _device_bits(source: SystemSource):
    # SystemSource keeps its CSPRNG primitives on the instance (tests may substitute a
    # seeded bit source there); default to the secrets module otherwise.
    return (getattr(source, "_randbelow", secrets.randbelow), getattr(source, "_randbits", secrets.randbits))


# --------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------


def discrete_laplace_variance(alpha: float) -> float:
    """Variance ``2 alpha / (1 - alpha)^2`` of ``DLap(alpha)`` (``P(k)`` proportional to ``alpha^|k|``)."""
    a = _check_alpha(alpha)
    return 2.0 * a / (1.0 - a) ** 2


def skellam_variance(mu_total: float) -> float:
    """Variance ``2 mu`` of ``Skellam(mu) = Poisson(mu) - Poisson(mu)``."""
    return 2.0 * _check_mu(mu_total)


def negative_binomial(shape: float, success_prob: float, size, source) -> np.ndarray:
    """Pólya / negative binomial ``NB(shape, success_prob)`` with real ``shape > 0``.

    The number of *failures* before ``shape`` successes with *success* probability
    ``success_prob``: ``P(k) = Gamma(k+shape) / (k! Gamma(shape)) p^shape (1-p)^k``,
    mean ``shape (1-p)/p`` -- numpy's ``Generator.negative_binomial(shape, p)`` and
    ``scipy.stats.nbinom(shape, p)``. Simulation path: numpy. Device path:
    ``Poisson(Lambda)`` with ``Lambda ~ Gamma(shape, scale (1-p)/p)`` from
    ``random.SystemRandom().gammavariate`` (double precision) and an exact Poisson
    given the double ``Lambda`` (see the module docstring: not exact overall).
    Returns int64 of shape ``size``.
    """
    _check_source(source)
    r = _check_real("shape", shape)
    if not r > 0.0:
        raise InvalidParameter("shape", f"must be > 0, got {shape!r}")
    p = _check_real("success_prob", success_prob)
    if not (0.0 < p <= 1.0):
        raise InvalidParameter("success_prob", f"must lie in (0, 1], got {success_prob!r}")
    theta = (1.0 - p) / p  # gamma scale
    if theta * r > MAX_NOISE_SCALE:
        raise InvalidParameter(
            "success_prob", f"mean {theta * r:.3g} exceeds MAX_NOISE_SCALE = {MAX_NOISE_SCALE:.3g}"
        )
    shp = _check_size(size)
    if isinstance(source, SeededSource):
        return source.generator.negative_binomial(r, p, size=shp).astype(np.int64, copy=False)
    if theta > DEVICE_MAX_MEAN:
        raise InvalidParameter(
            "success_prob",
            f"gamma scale (1-p)/p = {theta:.3g} exceeds DEVICE_MAX_MEAN = {DEVICE_MAX_MEAN:.3g} "
            "(the exact Poisson runs in time linear in its mean)",
        )
    randbelow, randbits = _device_bits(source)
    sysrand = random.SystemRandom()
    count = math.prod(shp)

    def draw() -> int:
        lam = sysrand.gammavariate(r, theta) if theta > 0 else 0.0
        return _poisson_exact(Fraction(lam), randbelow, randbits)

    return np.fromiter((draw() for _ in range(count)), dtype=np.int64, count=count).reshape(shp)


def polya_shares(alpha: float, users: int, size, source) -> np.ndarray:
    """One user's Pólya noise shares: ``NB(1/users, 1-alpha) - NB(1/users, 1-alpha)``.

    Mechanism: every one of ``users`` users adds one independent share to each
    coordinate of its contribution; the ``users`` shares of a coordinate sum to a
    discrete Laplace ``DLap(alpha)``, ``P(k)`` proportional to ``alpha^|k|``
    (variance :func:`discrete_laplace_variance`). Guarantee: with
    ``alpha = exp(-eps / Delta)`` the *sum* of all ``users`` shares makes a sum of
    sensitivity ``Delta`` ``eps``-DP; one share alone gives (almost) nothing.
    The sum is exactly ``DLap(alpha)`` for exact NB draws; the samplers here are
    not exact: simulation path = numpy's NB (a double-precision Gamma-Poisson
    mixture on PCG64); device path = double-precision gamma from the OS CSPRNG,
    then an exact Poisson given that double (see the module docstring).
    Reference: Balle, Bell, Gascón & Nissim, CCS 2020 (arXiv:2002.00817);
    Goryczka & Xiong, IEEE TDSC 2017.

    Note the convention: the success probability passed to the NB is ``1 - alpha``.
    Returns int64 of shape ``size``.
    """
    a = _check_alpha(alpha)
    n = _check_users(users)
    shp = _check_size(size)
    _check_source(source)
    p = 1.0 - a  # success probability: NOT alpha (see the module docstring)
    x = negative_binomial(1.0 / n, p, shp, source)
    y = negative_binomial(1.0 / n, p, shp, source)
    return x - y


def skellam_shares(mu_total: float, users: int, size, source) -> np.ndarray:
    """One user's Skellam noise shares: ``Poisson(mu_total/users) - Poisson(mu_total/users)``.

    Mechanism: every one of ``users`` users adds one independent share per
    coordinate (``size`` is the vector's shape); the shares sum to
    ``Skellam(mu_total)`` per coordinate (variance :func:`skellam_variance`).
    Guarantee: the Skellam mechanism's Rényi-DP bound (Agarwal, Kairouz & Liu,
    NeurIPS 2021) for the *sum* of all shares. Simulation path: numpy Poisson
    (double precision, PCG64). Device path: exact -- every draw is
    ``Poisson(Fraction(mu_total) / users)`` sampled exactly from CSPRNG integers.
    Returns int64 of shape ``size``.
    """
    mu = _check_mu(mu_total)
    n = _check_users(users)
    shp = _check_size(size)
    _check_source(source)
    if isinstance(source, SeededSource):
        g = source.generator
        lam = mu / n
        return g.poisson(lam, size=shp).astype(np.int64, copy=False) - g.poisson(lam, size=shp).astype(np.int64, copy=False)
    lam_exact = Fraction(mu) / n  # exact rational value of the double mu, divided by n
    if lam_exact > DEVICE_MAX_MEAN:
        raise InvalidParameter(
            "mu_total",
            f"per-user mean mu_total/users = {float(lam_exact):.3g} exceeds DEVICE_MAX_MEAN = "
            f"{DEVICE_MAX_MEAN:.3g} (the exact Poisson runs in time linear in its mean)",
        )
    count = math.prod(shp)
    if float(lam_exact) * count > DEVICE_MAX_TOTAL_MEAN * (1 + 1e-9):  # the slack: what check_vector_sum computes in floats passes
        raise InvalidParameter(
            "mu_total",
            f"{count} draws of mean mu_total/users = {float(lam_exact):.3g} total {float(lam_exact) * count:.3g}, over "
            f"DEVICE_MAX_TOTAL_MEAN = {DEVICE_MAX_TOTAL_MEAN:.3g} (the exact Poisson runs in time linear in its mean)",
        )
    randbelow, randbits = _device_bits(source)
    out = np.fromiter(
        (
            _poisson_exact(lam_exact, randbelow, randbits) - _poisson_exact(lam_exact, randbelow, randbits)
            for _ in range(count)
        ),
        dtype=np.int64,
        count=count,
    )
    return out.reshape(shp)
