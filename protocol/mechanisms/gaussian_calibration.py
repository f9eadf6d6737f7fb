"""Gaussian noise calibration and exact noise variances.

Two families of mechanisms are calibrated here:

* the continuous Gaussian mechanism ``M(x) = q(x) + N(0, sigma^2)``, with the exact
  ("analytic") privacy curve of Balle & Wang, "Improving the Gaussian Mechanism for
  Differential Privacy: Analytical Calibration and Optimal Denoising", ICML 2018
  (Theorem 8), and the classical Dwork & Roth bound for comparison;
* the discrete Gaussian mechanism ``M(x) = q(x) + N_Z(0, sigma^2)`` on an
  integer-valued query, with the exact privacy curve of Canonne, Kamath & Steinke,
  "The Discrete Gaussian for Differential Privacy", NeurIPS 2020 (Theorem 7).

Every ``delta`` returned here is an **upper bound** on the true delta of the
mechanism (exact up to the documented, conservative error terms), and every
calibrated ``sigma`` / ``sigma2`` is on the safe side: the mechanism with that
noise is (epsilon, delta)-DP.

This module runs on devices: it imports only the standard library and numpy.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from shuffledp.protocol.errors import InvalidParameter

__all__ = [
    "gaussian_delta",
    "analytic_gaussian_sigma",
    "classical_gaussian_sigma",
    "discrete_gaussian_delta",
    "calibrate_discrete_gaussian",
    "discrete_laplace_variance",
    "discrete_gaussian_variance",
]

_SQRT2 = math.sqrt(2.0)
_SQRT_PI = math.sqrt(math.pi)
_LOG_HALF = math.log(0.5)
_SQRT_PI_OVER_2 = math.sqrt(math.pi / 2.0)
_SQRT_2PI = math.sqrt(2.0 * math.pi)

# ----------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(
        value, (int, float, Fraction, np.integer, np.floating)
    ):
        raise InvalidParameter(name, f"must be a real number, got {value!r}")
    out = float(value)
    if not math.isfinite(out):
        raise InvalidParameter(name, f"must be finite, got {value!r}")
    return out


def _positive(name: str, value: object) -> float:
    out = _real(name, value)
    if out <= 0.0:
        raise InvalidParameter(name, f"must be > 0, got {value!r}")
    return out


def _epsilon(value: object) -> float:
    out = _real("epsilon", value)
    if out < 0.0:
        raise InvalidParameter("epsilon", f"must be >= 0, got {value!r}")
    return out


def _delta(value: object) -> float:
    out = _real("delta", value)
    if not 0.0 < out < 1.0:
        raise InvalidParameter("delta", f"must lie in (0, 1), got {value!r}")
    return out


def _int_sensitivity(value: object) -> int:
    if isinstance(value, bool):
        raise InvalidParameter("sensitivity", f"must be a positive integer, got {value!r}")
    if isinstance(value, (int, np.integer)):
        out = int(value)
    elif isinstance(value, (float, np.floating, Fraction)) and math.isfinite(float(value)) and float(value).is_integer():
        out = int(value)
    else:
        raise InvalidParameter("sensitivity", f"must be a positive integer, got {value!r}")
    if out < 1:
        raise InvalidParameter("sensitivity", f"must be >= 1, got {value!r}")
    return out


# ----------------------------------------------------------------------------
# special functions (stdlib only)
# ----------------------------------------------------------------------------


def _erfcx(z: float) -> float:
    """Scaled complementary error function ``exp(z^2) erfc(z)`` for ``z >= 0``.

    For ``z < 5`` it is computed directly (``z^2 < 25``, so rounding is a few ulps).
    For ``z >= 5`` it uses the Laplace continued fraction
    ``erfcx(z) = (1/sqrt(pi)) / (z + (1/2)/(z + 1/(z + (3/2)/(z + ...))))``, evaluated
    backwards from 60 levels, which is converged to machine precision for z >= 5.
    """
    if z < 5.0:
        return math.erfc(z) * math.exp(z * z)
    acc = z
    for k in range(60, 0, -1):
        acc = z + (k / 2.0) / acc
    return 1.0 / (_SQRT_PI * acc)


def _log_erfc(z: float) -> float:
    """``log(erfc(z))`` for any real ``z``, without underflow for large ``z``."""
    if z < 5.0:
        return math.log(math.erfc(z))
    if math.isinf(z):
        return -math.inf
    return -z * z + math.log(_erfcx(z))


def _log_ndtr(x: float) -> float:
    """``log Phi(x)`` (standard normal CDF), stable in both tails."""
    if x > 0.0:
        return math.log1p(-0.5 * math.erfc(x / _SQRT2))
    return _LOG_HALF + _log_erfc(-x / _SQRT2)


# ----------------------------------------------------------------------------
# continuous Gaussian mechanism
# ----------------------------------------------------------------------------


def gaussian_delta(sigma: float, epsilon: float, sensitivity: float) -> float:
    """Exact delta(epsilon) of the Gaussian mechanism with noise N(0, sigma^2).

    For a query of L2 sensitivity ``Delta``, Balle & Wang (2018), Theorem 8: the
    mechanism is (epsilon, delta)-DP if and only if::

        delta >= Phi(Delta/(2 sigma) - eps sigma/Delta)
                 - e^eps Phi(-Delta/(2 sigma) - eps sigma/Delta).

    The right-hand side is returned. It is computed as
    ``Phi(a) * (1 - exp(eps + log Phi(b) - log Phi(a)))`` with ``log Phi`` evaluated
    stably in the tails, so ``e^eps * Phi(b)`` never overflows or underflows
    prematurely.
    """
    sigma = _positive("sigma", sigma)
    epsilon = _epsilon(epsilon)
    sensitivity = _positive("sensitivity", sensitivity)
    r = sensitivity / (2.0 * sigma)
    s = epsilon * sigma / sensitivity
    la = _log_ndtr(r - s)
    lb = _log_ndtr(-r - s)
    expo = epsilon + lb - la
    if expo >= 0.0:  # only by rounding: the true value is <= 0
        return 0.0
    return max(0.0, math.exp(la) * -math.expm1(expo))


def _shrink_bracket(ok, lo: float, hi: float, *, rtol: float) -> float:
    """Geometric bisection of ``[lo, hi]`` with ``ok(hi)`` true and ``ok(lo)`` false, to relative
    width ``rtol``; returns the ``ok`` end, so the caller's guarantee holds at the value returned."""
    for _ in range(200):
        if hi - lo <= rtol * hi:
            break
        mid = math.sqrt(lo * hi)
        if not lo < mid < hi:
            break
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Smallest sigma with ``gaussian_delta(sigma, epsilon, sensitivity) <= delta``.

    This is the analytic Gaussian mechanism of Balle & Wang (2018, Algorithm 1 /
    Theorem 8): because ``gaussian_delta`` is the *exact* privacy curve, adding
    N(0, sigma^2) with the returned sigma is (epsilon, delta)-DP for every
    ``epsilon >= 0`` (the classical ``Delta sqrt(2 ln(1.25/delta))/epsilon`` is only
    valid for ``epsilon <= 1``) and no smaller sigma is.

    ``delta(sigma)`` is decreasing in sigma; the root is bracketed by doubling /
    halving and then bisected in log-sigma down to a relative width of 1e-12. The
    *upper* end of the final bracket is returned, which satisfies the constraint.
    """
    epsilon = _epsilon(epsilon)
    delta = _delta(delta)
    sensitivity = _positive("sensitivity", sensitivity)

    def ok(sig: float) -> bool:
        return gaussian_delta(sig, epsilon, sensitivity) <= delta

    hi = sensitivity
    while not ok(hi):
        hi *= 2.0
    lo = hi
    while ok(lo):
        lo *= 0.5
        if lo < 1e-300:  # pragma: no cover - delta < 1 keeps this unreachable
            return hi
    return _shrink_bracket(ok, lo, hi, rtol=1e-12)


def classical_gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Classical calibration ``sigma = Delta sqrt(2 ln(1.25/delta)) / epsilon``.

    Dwork & Roth, "The Algorithmic Foundations of Differential Privacy", Theorem 3.22:
    valid only for ``0 < epsilon < 1`` (accepted here up to ``epsilon = 1``). For
    comparison only -- it is looser than :func:`analytic_gaussian_sigma`. Raises
    :class:`InvalidParameter` for ``epsilon > 1``, where the formula can violate
    the requested delta.
    """
    epsilon = _positive("epsilon", epsilon)
    if epsilon > 1.0:
        raise InvalidParameter(
            "epsilon", f"classical Gaussian calibration holds only for epsilon <= 1, got {epsilon!r}"
        )
    delta = _delta(delta)
    sensitivity = _positive("sensitivity", sensitivity)
    return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


# ----------------------------------------------------------------------------
# discrete Gaussian mechanism
# ----------------------------------------------------------------------------
#
# Notation: f(x) = exp(-x^2 / (2 s2)) is the unnormalised pmf of N_Z(0, s2),
# Z = sum_k f(k) its normaliser. For X ~ N_Z(0, s2) and an integer query of
# sensitivity D (CKS20, Theorem 7):
#
#     delta = P[X > c] - e^eps P[X > c + D],   c = eps s2 / D - D / 2,
#
# which is exactly the hockey-stick divergence sum_y max(0, p(y) - e^eps p(y - D)):
# p(y) / p(y - D) = exp((D^2 - 2 y D) / (2 s2)) > e^eps  iff  y < -c, and by the
# symmetry y -> -y this is sum_{x > c} (p(x) - e^eps p(x + D)), every term >= 0.
# Neighbouring inputs whose query values differ by D' <= D are covered by the
# value at D when delta is non-decreasing in the sensitivity; this is checked
# numerically by the tests (small sigma, D = 1..40), not proved here.
#
# Two evaluators, both returning an UPPER bound:
#  * direct: sum the non-negative terms over a window, bound the rest by a
#    rigorous tail bound, divide by a LOWER bound on Z (used for small sigma);
#  * Euler-Maclaurin: each tail sum in closed form with a rigorous remainder
#    (used for large sigma, where the window would be too long).

# Window half-width: terms beyond are < exp(-_TAIL_L) times the largest one.
_TAIL_L = 75.0
# sigma beyond which the Euler-Maclaurin evaluator is used (window > ~2^17 terms).
_DIRECT_MAX_HALF_WIDTH = 1 << 16
# Relative floating-point safety margins (heuristic rounding allowances, not a
# formal error analysis). Direct path: a sum of non-negative terms, each a few
# ulps accurate; numpy's pairwise summation has relative error about
# log2(n) * 2^-53 < 3e-15 for n <= 2^18, so 1e-12 covers it with a wide margin.
# Euler-Maclaurin path: each tail is a handful of operations on erfc/exp values
# accurate to < ~5e-15 relative, and the two tails are then subtracted, so their
# margins are amplified by T(m)/(delta Z) in the result; 1e-13 (20x the estimate)
# keeps that amplification small while still dominating the rounding.
_FP_MARGIN = 1e-12
_FP_MARGIN_EM = 1e-13
# sqrt(3 + sqrt(6)): for u >= this, He4(u) = u^4 - 6u^2 + 3 >= 0.
_HE4_LAST_ROOT = math.sqrt(3.0 + math.sqrt(6.0))


def _log_gauss_tail_integral(a: float, sigma: float) -> float:
    """``log int_a^inf exp(-x^2/(2 sigma^2)) dx = log(sigma sqrt(pi/2) erfc(a/(sigma sqrt2)))``."""
    return math.log(sigma * _SQRT_PI_OVER_2) + _log_erfc(a / (sigma * _SQRT2))


def _dg_delta_direct(sigma2: float, epsilon: float, sensitivity: int) -> float:
    """Upper bound on the discrete Gaussian delta by windowed summation.

    Sums ``h(x) = f(x) (1 - exp(eps - D(2x + D)/(2 s2)))`` (the non-negative
    hockey-stick terms, written without cancellation) over the integers ``x > c``
    inside a window ``[lo, hi]``, where

    * ``hi = ceil(sqrt(x0^2 + 2 s2 L))``, ``x0 = max(m, 0)``, ``m = floor(c) + 1``,
      so every excluded term on the right is below ``e^-L f(x0)`` (L = 75);
    * ``lo = max(m, -K)`` with ``K = ceil(sigma sqrt(2L))``.

    Because ``0 <= h(x) <= f(x)``, the excluded terms are bounded by the tail sums
    ``sum_{x >= n} f(x) <= f(n) + int_n^inf f`` (f decreasing on [0, inf)), once
    for ``n = hi + 1`` and, if ``m < -K``, once more for ``n = K + 1`` (by symmetry).
    The sum is divided by a lower bound on Z: the larger of the partial sum
    ``sum_{|k| <= K} f(k)`` and ``sigma sqrt(2 pi)`` (by Poisson summation
    ``Z = sigma sqrt(2 pi) sum_n exp(-2 pi^2 s2 n^2) >= sigma sqrt(2 pi)``).
    """
    sigma = math.sqrt(sigma2)
    c = epsilon * sigma2 / sensitivity - sensitivity / 2.0
    m = math.floor(c) + 1
    big_k = math.ceil(sigma * math.sqrt(2.0 * _TAIL_L))
    x0 = max(m, 0)
    hi = math.ceil(math.sqrt(float(x0) * x0 + 2.0 * sigma2 * _TAIL_L))
    lo = max(m, -big_k)
    # reference scale: log f(x0)
    s0 = -(float(x0) * x0) / (2.0 * sigma2)

    x = np.arange(lo, hi + 1, dtype=np.float64)
    rel = -((x - x0) * (x + x0)) / (2.0 * sigma2)  # log f(x) - s0, exact-ish for large x0
    expo = epsilon - sensitivity * (2.0 * x + sensitivity) / (2.0 * sigma2)
    factor = np.maximum(0.0, -np.expm1(np.minimum(expo, 0.0)))
    total = float(np.sum(np.exp(rel) * factor))

    # excluded right tail: sum_{x >= hi+1} f(x) <= f(hi+1) + int_{hi+1}^inf f
    n = hi + 1
    log_fn = -(float(n - x0) * (n + x0)) / (2.0 * sigma2)  # relative to s0
    log_int = _log_gauss_tail_integral(float(n), sigma) - s0
    total += math.exp(log_fn) + math.exp(log_int)
    # excluded left part (only when m < -K; then x0 = 0 and s0 = 0)
    if m < -big_k:
        n = big_k + 1
        total += math.exp(-(float(n) * n) / (2.0 * sigma2)) + math.exp(
            _log_gauss_tail_integral(float(n), sigma)
        )

    k = np.arange(-big_k, big_k + 1, dtype=np.float64)
    z_partial = float(np.sum(np.exp(-(k * k) / (2.0 * sigma2))))
    z_lower = max(z_partial * (1.0 - _FP_MARGIN), sigma * _SQRT_2PI)

    if total <= 0.0:
        return 0.0
    log_delta = s0 + math.log(total * (1.0 + _FP_MARGIN)) - math.log(z_lower)
    return min(1.0, math.exp(log_delta))


def _em_tail(n: int, sigma: float, sigma2: float) -> tuple[float, float, float]:
    """Euler-Maclaurin bounds on ``T(n) = sum_{k >= n} f(k)``.

    Euler-Maclaurin with p = 2 (Bernoulli numbers B2 = 1/6, B4 = -1/30), letting the
    upper limit go to infinity (f and all its derivatives vanish there)::

        T(n) = int_n^inf f + f(n)/2 - f'(n)/12 + f'''(n)/720 + R,
        |R| <= (2 zeta(4) / (2 pi)^4) int_n^inf |f''''| = (1/720) int_n^inf |f''''|.

    With ``u = n/sigma`` and Hermite polynomials, ``f^(k)(x) = (-1)^k He_k(x/sigma)
    f(x) / sigma^k``, so ``-f'(n)/12 = f(n) u/(12 sigma)`` and
    ``f'''(n)/720 = -f(n) He3(u)/(720 sigma^3)``. Remainder: if ``u >= sqrt(3+sqrt6)``
    then ``f'''' >= 0`` on ``[n, inf)`` and ``int |f''''| = -f'''(n) = He3(u) f(n)/
    sigma^3``; otherwise ``int_R |f''''| = sigma^-3 sqrt(2pi) E|He4(N)| <=
    sigma^-3 sqrt(2 pi) sqrt(4!)`` (Cauchy-Schwarz, ``E He4(N)^2 = 4!``).

    Returns ``(log_scale, lower, upper)`` with ``lower <= T(n) / exp(log_scale) <=
    upper``; ``log_scale = log f(n)`` when ``n >= 0`` (so deep tails do not
    underflow) and 0 otherwise. ``lower`` may be 0.
    """
    u = n / sigma
    he3 = u * (u * u - 3.0)
    if n >= 0:
        log_scale = -(float(n) * n) / (2.0 * sigma2)
        integral = sigma * _SQRT_PI_OVER_2 * _erfcx(u / _SQRT2)
        corr = 0.5 + u / (12.0 * sigma) - he3 / (720.0 * sigma2 * sigma)
        if u >= _HE4_LAST_ROOT:
            rem = he3 / (720.0 * sigma2 * sigma)
        else:
            rem = math.sqrt(48.0 * math.pi) / (720.0 * sigma2 * sigma) * math.exp(-log_scale)
        value = integral + corr
    else:
        log_scale = 0.0
        fn = math.exp(-(float(n) * n) / (2.0 * sigma2))
        integral = sigma * _SQRT_PI_OVER_2 * math.erfc(u / _SQRT2)
        corr = fn * (0.5 + u / (12.0 * sigma) - he3 / (720.0 * sigma2 * sigma))
        rem = math.sqrt(48.0 * math.pi) / (720.0 * sigma2 * sigma)
        value = integral + corr
    lower = max(0.0, (value - rem) * (1.0 - _FP_MARGIN_EM))
    upper = (value + rem) * (1.0 + _FP_MARGIN_EM)
    return log_scale, lower, upper


def _dg_delta_em(sigma2: float, epsilon: float, sensitivity: int) -> float:
    """Upper bound on the discrete Gaussian delta via closed-form tail sums.

    ``delta Z = T(m) - e^eps T(m + D)`` with ``m = floor(c) + 1`` (CKS20 Thm 7);
    we take the Euler-Maclaurin upper bound of ``T(m)``, the lower bound of
    ``T(m + D)`` and divide by ``Z >= sigma sqrt(2 pi)`` (Poisson summation).
    When both tails are deep (``m >= 0``) the ratio of their Gaussian factors
    ``f(m + D)/f(m) = exp(-D (2m + D)/(2 s2))`` is formed from exact integers, so
    there is no cancellation between two large exponents.
    """
    sigma = math.sqrt(sigma2)
    c = epsilon * sigma2 / sensitivity - sensitivity / 2.0
    m1 = math.floor(c) + 1
    m2 = m1 + sensitivity
    ls1, _lo1, up1 = _em_tail(m1, sigma, sigma2)
    ls2, lo2, _up2 = _em_tail(m2, sigma, sigma2)
    if m1 >= 0:
        scale_diff = -(sensitivity * (2 * m1 + sensitivity)) / (2.0 * sigma2)  # ls2 - ls1
    else:
        scale_diff = ls2 - ls1
    log_z_lower = math.log(sigma * _SQRT_2PI)
    if lo2 <= 0.0:
        return min(1.0, math.exp(ls1 + math.log(up1) - log_z_lower))
    expo = epsilon + scale_diff + math.log(lo2) - math.log(up1)
    if expo >= 0.0:  # only by rounding; the true T(m) >= e^eps T(m + D)
        return 0.0
    log_delta = ls1 + math.log(up1) + math.log(-math.expm1(expo)) - log_z_lower
    return min(1.0, math.exp(log_delta))


def discrete_gaussian_delta(sigma2: float, epsilon: float, sensitivity: int) -> float:
    """Delta(epsilon) of adding discrete Gaussian noise N_Z(0, sigma2) to an integer query.

    Privacy guarantee: for an integer-valued query whose values on neighbouring
    inputs differ by at most ``sensitivity`` (= D), ``q(x) + N_Z(0, sigma2)`` is
    (epsilon, delta)-DP with delta the returned value. It is the hockey-stick
    divergence ``sum_y max(0, p(y) - e^eps p(y - D))`` between the noise and its
    shift by D, which CKS20 (Canonne, Kamath & Steinke 2020, Theorem 7) write as
    tail probabilities::

        delta = P[X > eps sigma2/D - D/2] - e^eps P[X > eps sigma2/D + D/2],
        X ~ N_Z(0, sigma2).

    The value is exact up to small, explicitly bounded error terms, always on the
    upper side:

    * ``sigma <= ~5350`` (window of at most 2^17 + 2 terms): direct summation of the
      non-negative terms over the window where they matter (every term outside is
      below ``e^-75`` times the largest), plus a rigorous bound
      ``f(n) + int_n^inf f`` on all excluded terms, divided by a lower bound on the
      normaliser.
    * larger sigma: each tail sum by Euler-Maclaurin with a rigorous remainder
      bound of relative size ``O(sigma^-4)`` (see ``_em_tail``); constant time.

    Both add a relative floating-point margin to each sum (1e-12 direct, 1e-13 on
    each of the two tails in the Euler-Maclaurin path; there the margin is
    amplified by ``P[X > c] / delta`` because delta is a difference of tails, e.g.
    to ~2.5e-7 relative at eps = 0, D = 1, sigma = 1e6). Values below
    the smallest positive double underflow to 0.0.
    """
    sigma2 = _positive("sigma2", sigma2)
    epsilon = _epsilon(epsilon)
    sensitivity = _int_sensitivity(sensitivity)
    if math.sqrt(sigma2) * math.sqrt(2.0 * _TAIL_L) <= _DIRECT_MAX_HALF_WIDTH:
        return _dg_delta_direct(sigma2, epsilon, sensitivity)
    return _dg_delta_em(sigma2, epsilon, sensitivity)


def calibrate_discrete_gaussian(epsilon: float, delta: float, sensitivity: int) -> float:
    """Smallest sigma2 (to relative 1e-10) with ``discrete_gaussian_delta <= delta``.

    Privacy guarantee: adding N_Z(0, sigma2) with the returned ``sigma2`` to an
    integer query of sensitivity ``sensitivity`` is (epsilon, delta)-DP (CKS20,
    Theorem 7, evaluated as an upper bound by :func:`discrete_gaussian_delta`).

    Starts from the analytic continuous Gaussian sigma (Balle & Wang 2018), brackets
    the threshold by factors of 1.1 and bisects. The upper end of the bracket is
    returned, so the constraint holds for the returned value even where the
    discrete delta is not exactly monotone in sigma2 (tiny sigma).
    """
    epsilon = _epsilon(epsilon)
    delta = _delta(delta)
    sensitivity = _int_sensitivity(sensitivity)

    def ok(s2: float) -> bool:
        return discrete_gaussian_delta(s2, epsilon, sensitivity) <= delta

    sigma = analytic_gaussian_sigma(epsilon, delta, sensitivity)
    hi = sigma * sigma
    while not ok(hi):
        hi *= 1.1
    lo = hi / 1.1
    while ok(lo):
        hi = lo
        lo /= 1.1
        if lo < 1e-300:  # pragma: no cover - delta < 1 keeps this unreachable
            return hi
    return _shrink_bracket(ok, lo, hi, rtol=1e-10)


# ----------------------------------------------------------------------------
# exact variances
# ----------------------------------------------------------------------------


def discrete_laplace_variance(scale: Fraction | float) -> float:
    """Exact variance of the discrete Laplace law ``P(k) ∝ exp(-|k|/scale)``.

    With ``q = exp(-1/scale)``: ``Var = 2 q / (1 - q)^2`` (``1 - q`` via ``expm1``).
    """
    s = _positive("scale", scale)
    q = math.exp(-1.0 / s)
    one_minus_q = -math.expm1(-1.0 / s)
    return 2.0 * q / (one_minus_q * one_minus_q)


# sigma2 at and above which the discrete Gaussian variance is returned as sigma2.
_VARIANCE_POISSON_THRESHOLD = 4.0


def discrete_gaussian_variance(sigma2: Fraction | float) -> float:
    """Exact variance of N_Z(0, sigma2), ``P(k) ∝ exp(-k^2 / (2 sigma2))``.

    By Poisson summation, with ``S = sum_{n>=1} exp(-2 pi^2 sigma2 n^2)``::

        Var = sigma2 - 8 pi^2 sigma2^2 (sum_{n>=1} n^2 exp(-2 pi^2 sigma2 n^2)) / (1 + 2S),

    so ``0 <= sigma2 - Var <= sigma2 * 8 pi^2 sigma2 sum_n n^2 e^{-2pi^2 sigma2 n^2}``.
    For ``sigma2 >= 4`` the relative error of returning ``sigma2`` is therefore below
    ``32 pi^2 e^{-8 pi^2} (1 + 1e-100) < 2e-32`` (far below 1e-15, and below the
    rounding of a double), and ``sigma2`` is returned. For ``sigma2 < 4`` the pmf is
    summed directly over ``|k| <= 40 sigma + 1`` (terms beyond are
    ``< exp(-800)``, below double precision relative to the k = 0 term).
    """
    s2 = _positive("sigma2", sigma2)
    if s2 >= _VARIANCE_POISSON_THRESHOLD:
        return s2
    big_k = math.ceil(40.0 * math.sqrt(s2)) + 1
    k = np.arange(-big_k, big_k + 1, dtype=np.float64)
    w = np.exp(-(k * k) / (2.0 * s2))
    return float(np.sum(k * k * w) / np.sum(w))
