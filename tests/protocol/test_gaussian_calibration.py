"""Tests for shuffledp.protocol.mechanisms.gaussian_calibration.

Reference values are computed independently here: the continuous delta with
scipy's normal CDF, the discrete delta by brute-force summation of the
hockey-stick divergence over a wide window in high precision (mpmath), exact
variances by direct pmf sums. Sampling checks use fixed seeds and z-tests at
Z_CRIT standard errors, the standard errors computed from exact moments.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from scipy import stats

from shuffledp.protocol.mechanisms import gaussian_calibration as gc
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.gaussian_calibration import (
    analytic_gaussian_sigma,
    calibrate_discrete_gaussian,
    classical_gaussian_sigma,
    discrete_gaussian_delta,
    discrete_gaussian_variance,
    discrete_laplace_variance,
    gaussian_delta,
)
from shuffledp.protocol.mechanisms.randomness import SeededSource

# Two-sided z-test at 4.5 standard errors: P(|N(0,1)| > 4.5) = 6.8e-6 per check.
Z_CRIT = 4.5


# --------------------------------------------------------------------------
# independent references
# --------------------------------------------------------------------------


def ref_gaussian_delta(sigma, eps, sens):
    """Balle & Wang Thm 8 via scipy's log-CDF (independent of the module's special functions)."""
    a = sens / (2 * sigma) - eps * sigma / sens
    b = -sens / (2 * sigma) - eps * sigma / sens
    la, lb = stats.norm.logcdf(a), stats.norm.logcdf(b)
    return math.exp(la) * -math.expm1(eps + lb - la)


def brute_discrete_delta(sigma2, eps, sens, dps=40):
    """sum_y max(0, p(y) - e^eps p(y - sens)) over |y| <= 45 sigma + sens, in mpmath.

    Mass outside the window is < e^-1000 relative, far below the tolerances used.
    """
    mpmath.mp.dps = dps
    s2 = mpmath.mpf(sigma2)
    big_k = int(math.ceil(45 * math.sqrt(sigma2))) + sens + 2
    f = [mpmath.exp(-mpmath.mpf(k) ** 2 / (2 * s2)) for k in range(-big_k - sens, big_k + 1)]
    off = big_k + sens  # f[k + off] = f(k)
    z = mpmath.fsum(f[sens:])  # k in [-big_k, big_k]
    e = mpmath.e ** mpmath.mpf(eps)
    tot = mpmath.fsum(
        max(mpmath.mpf(0), f[y + off] - e * f[y - sens + off]) for y in range(-big_k, big_k + 1)
    )
    return float(tot / z)


def discrete_gaussian_pmf(sigma2):
    big_k = int(math.ceil(40 * math.sqrt(sigma2))) + 2
    k = np.arange(-big_k, big_k + 1, dtype=float)
    w = np.exp(-(k**2) / (2 * sigma2))
    return k, w / w.sum()


# --------------------------------------------------------------------------
# continuous Gaussian
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sigma,eps,sens",
    [(1.0, 0.5, 1.0), (3.7, 1.0, 1.0), (0.3, 8.0, 1.0), (50.0, 0.1, 7.0), (0.05, 30.0, 1.0), (2e5, 1.0, 65536.0)],
)
def test_gaussian_delta_matches_reference(sigma, eps, sens):
    ref = ref_gaussian_delta(sigma, eps, sens)
    assert gaussian_delta(sigma, eps, sens) == pytest.approx(ref, rel=1e-11)


def test_gaussian_delta_no_overflow_at_large_epsilon():
    # e^eps overflows a double at eps = 710; the log-space evaluation must not.
    v = gaussian_delta(0.03, 800.0, 1.0)
    assert 0.0 <= v < 1.0 and math.isfinite(v)
    assert gaussian_delta(1.0, 0.0, 1.0) == pytest.approx(math.erf(0.5 / math.sqrt(2)), rel=1e-13)
    # degenerate noise: delta -> 1 as sigma -> 0, without domain errors
    assert gaussian_delta(1e-300, 1.0, 1.0) == pytest.approx(1.0)
    assert discrete_gaussian_delta(1e-300, 1.0, 1) == pytest.approx(1.0)


EPS_GRID = [0.05, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0]
DELTA_GRID = [1e-3, 1e-6, 1e-10]


@pytest.mark.parametrize("eps", EPS_GRID)
@pytest.mark.parametrize("delta", DELTA_GRID)
def test_analytic_sigma_valid_and_tight(eps, delta):
    for sens in (1.0, 65536.0):
        sigma = analytic_gaussian_sigma(eps, delta, sens)
        d = gaussian_delta(sigma, eps, sens)
        assert d <= delta
        # the bisection stops at relative width 1e-12 in sigma; |d log delta / d log sigma|
        # is moderate here, so the delta reached is within 1e-6 of the target
        assert d >= delta * (1 - 1e-6)
        # and it also satisfies the independent reference within its rounding
        assert ref_gaussian_delta(sigma, eps, sens) <= delta * (1 + 1e-9)
        if eps <= 1.0:
            assert sigma < classical_gaussian_sigma(eps, delta, sens)


@pytest.mark.parametrize("eps,delta", [(8.0, 1e-3), (16.0, 1e-5), (32.0, 1e-10)])
def test_classical_formula_fails_at_large_epsilon(eps, delta):
    classical = math.sqrt(2 * math.log(1.25 / delta)) / eps  # Dwork-Roth, sensitivity 1
    assert ref_gaussian_delta(classical, eps, 1.0) > delta  # the classical sigma is NOT (eps, delta)-DP
    assert gaussian_delta(classical, eps, 1.0) > delta
    sigma = analytic_gaussian_sigma(eps, delta, 1.0)
    assert sigma > classical
    assert ref_gaussian_delta(sigma, eps, 1.0) <= delta * (1 + 1e-9)
    with pytest.raises(InvalidParameter):
        classical_gaussian_sigma(eps, delta, 1.0)


# --------------------------------------------------------------------------
# discrete Gaussian delta
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sigma2,eps,sens",
    [
        (0.25, 1.0, 1),
        (1.0, 1.0, 1),
        (4.0, 0.5, 3),
        (100.0, 1.0, 5),
        (100.0, 3.0, 1),  # deep tail, delta ~ 1e-199
        (2500.0, 2.0, 7),
        (900.0, 0.05, 40),
        (40000.0, 0.1, 3),
    ],
)
def test_discrete_delta_is_tight_upper_bound(sigma2, eps, sens):
    ref = brute_discrete_delta(sigma2, eps, sens)
    d = discrete_gaussian_delta(sigma2, eps, sens)
    # upper bound (the reference is accurate to ~1e-30 relative) and tight: the only
    # slack is the documented 1e-12 floating-point margins and the e^-75 tail bounds
    assert ref <= d <= ref * (1 + 1e-10)


@pytest.mark.parametrize("sigma2,eps,sens", [(1e6, 4.0, 1000), (2.5e5, 1.0, 300)])
def test_euler_maclaurin_path_is_tight_upper_bound(sigma2, eps, sens):
    """The large-sigma evaluator, forced at a sigma small enough to brute-force."""
    ref = brute_discrete_delta(sigma2, eps, sens, dps=30)
    d = gc._dg_delta_em(sigma2, eps, sens)
    # remainder bound is O(sigma^-4) relative to Z; plus the 1e-12 margins
    assert ref <= d <= ref * (1 + 1e-9)


@pytest.mark.parametrize("sigma", [1500.0, 3000.0, 5000.0])
@pytest.mark.parametrize("eps,sens", [(0.5, 1), (1.0, 500), (4.0, 2000), (0.1, 50)])
def test_direct_and_euler_maclaurin_paths_agree(sigma, eps, sens):
    d1 = gc._dg_delta_direct(sigma * sigma, eps, sens)
    d2 = gc._dg_delta_em(sigma * sigma, eps, sens)
    assert d2 == pytest.approx(d1, rel=1e-9)


@pytest.mark.parametrize(
    "eps,delta,sens",
    [(1.0, 1e-5, 1), (4.0, 1e-6, 1), (0.5, 1e-9, 20), (8.0, 1e-10, 1000), (1.0, 1e-6, 65536), (0.2, 1e-8, 65536)],
)
def test_calibrated_discrete_sigma2(eps, delta, sens):
    s2 = calibrate_discrete_gaussian(eps, delta, sens)
    d = discrete_gaussian_delta(s2, eps, sens)
    assert d <= delta
    # bisection to relative 1e-10 in sigma2: the reached delta is essentially the target
    assert d >= delta * (1 - 1e-6)
    if s2 < 1e4:  # cross-check with brute force where affordable
        assert brute_discrete_delta(s2, eps, sens, dps=25) <= delta
    # for sigma >> 1 discrete and continuous calibrations nearly coincide
    sigma_c = analytic_gaussian_sigma(eps, delta, sens)
    if sigma_c > 100:
        assert math.sqrt(s2) == pytest.approx(sigma_c, rel=1e-4)


@pytest.mark.parametrize(
    "sigma,eps,sens",
    [
        (3e3, 1.0, 100),
        (1e4, 1.0, 1000),
        (1e5, 0.5, 65536),
        (1e5, 1.0, 65536),
        (1e5, 2.0, 16384),
        (1e6, 0.5, 65536),
        (1e6, 1.0, 65536),
        (1e6, 0.1, 4096),
    ],
)
def test_discrete_matches_continuous_for_large_sigma(sigma, eps, sens):
    """Discrete and continuous delta agree up to a derived discretisation error.

    By the midpoint rule, P[X > c] = P[X >= m] ~ P[N >= m - 1/2] (X discrete,
    N ~ N(0, sigma^2), m = floor(c) + 1), i.e. the discrete delta is the continuous
    expression at a threshold shifted by s = m - 1/2 - c, |s| <= 1/2, for BOTH tails.
    At the exact threshold c the first derivative in c vanishes (phi(c) = e^eps
    phi(c + D) there), and the second derivative is -phi(c/sigma) D / sigma^3, so the
    shift costs <= phi(c/sigma) D / (8 sigma^3); the midpoint-rule errors
    (f'(m)/24 per tail) cancel to the same order, <= phi(c/sigma) D / (24 sigma^3).
    Tolerance: phi(c/sigma) D / sigma^3 (covers these with room for higher orders)
    plus the documented floating-point margins
    (1e-12 direct, 1e-13 Euler-Maclaurin) on each of the two tail sums, taken as 1e-11 P[N > c].
    """
    d_disc = discrete_gaussian_delta(sigma * sigma, eps, sens)
    d_cont = gaussian_delta(sigma, eps, sens)
    c = eps * sigma / sens - sens / (2 * sigma)  # threshold in units of sigma
    assert d_cont > 0
    tol = stats.norm.pdf(c) * sens / sigma**3 + 1e-11 * stats.norm.sf(c)
    assert abs(d_disc - d_cont) <= tol


@pytest.mark.parametrize("sigma2", [0.3, 1.0, 4.0, 25.0, 400.0])
@pytest.mark.parametrize("eps", [0.1, 1.0, 3.0])
def test_discrete_delta_monotone_in_sensitivity(sigma2, eps):
    ds = [discrete_gaussian_delta(sigma2, eps, sens) for sens in range(1, 41)]
    for lo, hi in zip(ds, ds[1:]):
        # allow only the relative floating-point margin of the evaluation
        assert hi >= lo * (1 - 1e-11)


def test_discrete_delta_decreasing_in_sigma():
    ds = [discrete_gaussian_delta(s2, 1.0, 5) for s2 in np.geomspace(1, 1e4, 60)]
    assert all(b <= a for a, b in zip(ds, ds[1:]))


# --------------------------------------------------------------------------
# exact variances
# --------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [0.2, 1.0, 3.0, Fraction(7, 2), 1e3])
def test_discrete_laplace_variance_formula(scale):
    s = float(scale)
    big_k = int(60 * s) + 10
    k = np.arange(-big_k, big_k + 1, dtype=float)
    w = np.exp(-np.abs(k) / s)
    v = float((k**2 * w).sum() / w.sum())
    assert discrete_laplace_variance(scale) == pytest.approx(v, rel=1e-12)


def _mp_dgauss_var(sigma2):
    mpmath.mp.dps = 40
    s2 = mpmath.mpf(sigma2)
    big_k = int(math.ceil(45 * math.sqrt(sigma2))) + 2
    w = [mpmath.exp(-mpmath.mpf(k) ** 2 / (2 * s2)) for k in range(-big_k, big_k + 1)]
    num = mpmath.fsum(mpmath.mpf(k) ** 2 * wk for k, wk in zip(range(-big_k, big_k + 1), w))
    return num / mpmath.fsum(w)


@pytest.mark.parametrize("sigma2", [0.05, 0.3, 1.0, 2.0, 3.999, 4.0, 9.0, 123.4])
def test_discrete_gaussian_variance_exact(sigma2):
    ref = _mp_dgauss_var(sigma2)
    assert discrete_gaussian_variance(sigma2) == pytest.approx(float(ref), rel=1e-14)


def test_discrete_gaussian_variance_poisson_bound():
    # the docstring's bound on sigma2 - Var at the threshold sigma2 = 4, in high precision
    mpmath.mp.dps = 60
    s2 = mpmath.mpf(4)
    w = [mpmath.exp(-mpmath.mpf(k) ** 2 / 8) for k in range(-200, 201)]
    var = mpmath.fsum(mpmath.mpf(k) ** 2 * wk for k, wk in zip(range(-200, 201), w)) / mpmath.fsum(w)
    rel_err = (s2 - var) / s2
    bound = 8 * mpmath.pi**2 * s2 * mpmath.exp(-2 * mpmath.pi**2 * s2) * (1 + mpmath.mpf(10) ** -100)
    assert 0 <= rel_err <= bound < mpmath.mpf("2e-32")
    assert discrete_gaussian_variance(0.25) < 0.25  # small sigma: strictly below sigma2


@pytest.mark.parametrize("scale", [0.5, 4.0, 300.0])
def test_discrete_laplace_empirical_moments(scale):
    n = 200_000
    x = SeededSource(31).discrete_laplace(scale, n).astype(float)
    q = math.exp(-1 / scale)
    var = discrete_laplace_variance(scale)
    # exact 4th moment E[X^4] = 2 q (1 + 11 q + 11 q^2 + q^3) / ((1 - q)^4 (1 + q))
    m4 = 2 * q * (1 + 11 * q + 11 * q**2 + q**3) / ((1 - q) ** 4 * (1 + q))
    assert abs(x.mean()) <= Z_CRIT * math.sqrt(var / n)
    # sample second moment (mean known = 0): SE = sqrt((m4 - var^2) / n)
    assert abs((x**2).mean() - var) <= Z_CRIT * math.sqrt((m4 - var**2) / n)


@pytest.mark.parametrize("sigma2", [0.3, 2.0, 50.0, 1e6])
def test_discrete_gaussian_empirical_moments(sigma2):
    n = 200_000
    x = SeededSource(32).discrete_gaussian(sigma2, n).astype(float)
    var = discrete_gaussian_variance(sigma2)
    k, p = discrete_gaussian_pmf(sigma2)
    m4 = float((k**4 * p).sum())  # exact 4th moment by summing the pmf
    assert abs(x.mean()) <= Z_CRIT * math.sqrt(var / n)
    assert abs((x**2).mean() - var) <= Z_CRIT * math.sqrt((m4 - var**2) / n)


# --------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------


def test_validation():
    nan, inf = float("nan"), float("inf")
    bad = [
        lambda: gaussian_delta(0.0, 1.0, 1.0),
        lambda: gaussian_delta(1.0, -0.1, 1.0),
        lambda: gaussian_delta(1.0, 1.0, 0.0),
        lambda: gaussian_delta(nan, 1.0, 1.0),
        lambda: gaussian_delta(1.0, inf, 1.0),
        lambda: analytic_gaussian_sigma(1.0, 0.0, 1.0),
        lambda: analytic_gaussian_sigma(1.0, 1.0, 1.0),
        lambda: analytic_gaussian_sigma(-1.0, 1e-5, 1.0),
        lambda: analytic_gaussian_sigma(1.0, 1e-5, -2.0),
        lambda: classical_gaussian_sigma(1.5, 1e-5, 1.0),
        lambda: classical_gaussian_sigma(0.0, 1e-5, 1.0),
        lambda: classical_gaussian_sigma(0.5, 2.0, 1.0),
        lambda: discrete_gaussian_delta(0.0, 1.0, 1),
        lambda: discrete_gaussian_delta(1.0, 1.0, 0),
        lambda: discrete_gaussian_delta(1.0, 1.0, 1.5),
        lambda: discrete_gaussian_delta(1.0, 1.0, True),
        lambda: discrete_gaussian_delta(1.0, -1.0, 1),
        lambda: calibrate_discrete_gaussian(1.0, 1e-5, 0),
        lambda: calibrate_discrete_gaussian(1.0, 0.0, 1),
        lambda: calibrate_discrete_gaussian(1.0, 1e-5, 2.5),
        lambda: discrete_laplace_variance(0.0),
        lambda: discrete_laplace_variance(-1.0),
        lambda: discrete_gaussian_variance(0.0),
        lambda: discrete_gaussian_variance("1"),
    ]
    for call in bad:
        with pytest.raises(InvalidParameter):
            call()
    # integral floats are accepted as sensitivities
    assert discrete_gaussian_delta(4.0, 1.0, 2.0) == discrete_gaussian_delta(4.0, 1.0, 2)
