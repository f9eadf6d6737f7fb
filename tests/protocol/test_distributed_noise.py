"""Tests for shuffledp.protocol.mechanisms.distributed_noise (Pólya and Skellam shares).

Statistical tests are chi-square goodness-of-fit tests (bins pooled until every
expected count is >= MIN_EXPECTED) and z-tests of the sample variance, at a
stated significance level, with fixed seeds: with a correct sampler a given seed
fails with probability ALPHA a priori, and the seeds were not chosen by trial.
Tolerances come from theory (chi-square quantiles; the standard error of the
sample variance, sqrt((kappa4 + 2 sigma^4) / N)), never widened to pass.

The device path (SystemSource) draws from the OS CSPRNG and, for the Pólya
shares, from random.SystemRandom, neither of which can be seeded, so those
tests are not reproducible; they use a smaller sample and the much smaller
significance level ALPHA_OS so that a correct sampler essentially never fails.
The exact Poisson sampler itself is also tested deterministically with a seeded
bit source substituted on a SystemSource instance.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from shuffledp.protocol.mechanisms import distributed_noise as dn
from shuffledp.protocol.mechanisms.distributed_noise import (
    discrete_laplace_variance,
    negative_binomial,
    polya_shares,
    skellam_shares,
    skellam_variance,
)
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.randomness import SeededSource, SystemSource

ALPHA = 1e-3  # significance level of every seeded statistical test
ALPHA_OS = 1e-6  # significance level of the unseedable real-CSPRNG tests
MIN_EXPECTED = 20
N_BIG = 10**6


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


class _DLap:
    """Exact discrete Laplace law, P(k) = (1-a)/(1+a) a^|k|."""

    def __init__(self, a: float) -> None:
        self.a = a

    def pmf(self, k):
        k = np.asarray(k, dtype=np.float64)
        return (1 - self.a) / (1 + self.a) * self.a ** np.abs(k)

    def cdf(self, k: int) -> float:  # P(X <= k)
        a = self.a
        return a ** (-k) / (1 + a) if k < 0 else 1 - a ** (k + 1) / (1 + a)

    def sf(self, k: int) -> float:  # P(X > k)
        a = self.a
        return a ** (k + 1) / (1 + a) if k >= 0 else 1 - a ** (-k) / (1 + a)


class _Tabulated:
    """A law on the integers given by a pmf table on [lo, lo + len(p))."""

    def __init__(self, lo: int, p: np.ndarray) -> None:
        self.lo, self.p = lo, p
        self.c = np.cumsum(p)

    def pmf(self, k):
        k = np.asarray(k)
        i = k - self.lo
        ok = (i >= 0) & (i < self.p.size)
        return np.where(ok, self.p[np.clip(i, 0, self.p.size - 1)], 0.0)

    def cdf(self, k: int) -> float:
        i = k - self.lo
        return 0.0 if i < 0 else float(self.c[min(i, self.c.size - 1)])

    def sf(self, k: int) -> float:
        return max(0.0, 1.0 - self.cdf(k))


def _share_law(r: float, p: float) -> _Tabulated:
    """Exact law of X - Y, X, Y i.i.d. NB(r, p), by convolution (tails beyond 1e-16 dropped)."""
    kmax = int(stats.nbinom(r, p).isf(1e-16)) + 1
    q = stats.nbinom(r, p).pmf(np.arange(kmax + 1))
    diff = np.convolve(q, q[::-1])  # index i <-> value i - kmax
    return _Tabulated(-kmax, diff)


def chi_square_pvalue(sample: np.ndarray, law) -> float:
    """Chi-square GOF p-value of an integer sample against ``law`` (pmf/cdf/sf).

    Bins are the integers in [min, max] of the sample, with the tails below/above
    folded into the end bins, merged left to right until each expected count is
    >= MIN_EXPECTED.
    """
    n = sample.size
    lo, hi = int(sample.min()), int(sample.max())
    ks = np.arange(lo, hi + 1)
    obs = np.bincount(sample - lo, minlength=ks.size).astype(np.float64)
    exp = n * np.asarray(law.pmf(ks), dtype=np.float64)
    exp[0] += n * law.cdf(lo - 1)
    exp[-1] += n * law.sf(hi)
    bins_o, bins_e = [], []
    acc_o = acc_e = 0.0
    for o, e in zip(obs, exp):
        acc_o += o
        acc_e += e
        if acc_e >= MIN_EXPECTED:
            bins_o.append(acc_o)
            bins_e.append(acc_e)
            acc_o = acc_e = 0.0
    if bins_e:
        bins_o[-1] += acc_o
        bins_e[-1] += acc_e
    else:
        bins_o, bins_e = [acc_o], [acc_e]
    bins_o, bins_e = np.array(bins_o), np.array(bins_e)
    if bins_o.size < 2:
        return 1.0
    stat = float(np.sum((bins_o - bins_e) ** 2 / bins_e))
    return float(stats.chi2.sf(stat, bins_o.size - 1))


def dlap_variance_se(a: float, n: int) -> float:
    """Standard error of the sample variance of n DLap(a) draws: sqrt((kappa4 + 2 sigma^4)/n).

    DLap = G1 - G2 with G geometric (failures, success prob p = 1 - a): even cumulants
    add, kappa2(G) = a/p^2, kappa4(G) = a (1 + 4a + a^2) / p^4.
    """
    p = 1 - a
    k2 = 2 * a / p**2
    k4 = 2 * a * (1 + 4 * a + a * a) / p**4
    return math.sqrt((k4 + 2 * k2 * k2) / n)


def skellam_variance_se(mu: float, n: int) -> float:
    """Same for Skellam(mu): kappa2 = 2 mu, kappa4 = 2 mu (Poisson cumulants are all mu)."""
    return math.sqrt((2 * mu + 2 * (2 * mu) ** 2) / n)


Z = float(stats.norm.isf(ALPHA / 2))  # two-sided z at level ALPHA

_SUM_CACHE: dict = {}


def polya_sum(a: float, users: int, draws: int, seed: int) -> np.ndarray:
    """``draws`` independent sums of ``users`` users' shares (vectorized path)."""
    key = (a, users, draws, seed)
    if key not in _SUM_CACHE:
        src = SeededSource(seed)
        _SUM_CACHE[key] = polya_shares(a, users, (users, draws), src).sum(axis=0)
    return _SUM_CACHE[key]


# (alpha, users, draws, seed): 10^6 sums for n = 10; n = 1000 needs 1000 shares per
# sum, so 10^4 sums keep the runtime bounded (10^7 shares per alpha).
SUM_CASES = [
    (0.5, 10, N_BIG, 11),
    (0.9, 10, N_BIG, 12),
    (0.99, 10, N_BIG, 13),
    (0.5, 1000, 10**4, 21),
    (0.9, 1000, 10**4, 22),
    (0.99, 1000, 10**4, 23),
]


# --------------------------------------------------------------------------
# simulation path: Pólya
# --------------------------------------------------------------------------


@pytest.mark.parametrize("a,users,seed", [(0.5, 10, 1), (0.9, 10, 2), (0.99, 10, 3), (0.9, 1000, 4)])
def test_nb_component_matches_scipy_nbinom(a, users, seed):
    """One user's NB component ~ scipy.stats.nbinom(1/n, 1 - alpha) (success prob 1 - alpha)."""
    x = negative_binomial(1.0 / users, 1.0 - a, N_BIG, SeededSource(seed))
    assert x.dtype == np.int64 and x.shape == (N_BIG,)
    assert chi_square_pvalue(x, stats.nbinom(1.0 / users, 1.0 - a)) > ALPHA


@pytest.mark.parametrize("a,users,seed", [(0.9, 10, 5), (0.99, 10, 6)])
def test_one_share_matches_nb_difference(a, users, seed):
    x = polya_shares(a, users, N_BIG, SeededSource(seed))
    assert chi_square_pvalue(x, _share_law(1.0 / users, 1.0 - a)) > ALPHA


@pytest.mark.parametrize("a,users,draws,seed", SUM_CASES)
def test_sum_of_shares_is_discrete_laplace(a, users, draws, seed):
    s = polya_sum(a, users, draws, seed)
    assert chi_square_pvalue(s, _DLap(a)) > ALPHA


def test_goodness_of_fit_has_power():
    """The same chi-square test rejects a nearby wrong law on the same sample."""
    s = polya_sum(*SUM_CASES[1])  # alpha = 0.9, n = 10, 10^6 sums
    assert chi_square_pvalue(s, _DLap(0.895)) < ALPHA


@pytest.mark.parametrize("a,users,draws,seed", SUM_CASES)
def test_sum_variance_matches_theory(a, users, draws, seed):
    s = polya_sum(a, users, draws, seed)
    theory = 2 * a / (1 - a) ** 2
    assert discrete_laplace_variance(a) == pytest.approx(theory, rel=1e-12)
    assert abs(s.var(ddof=1) - theory) <= Z * dlap_variance_se(a, draws)
    assert abs(s.mean()) <= Z * math.sqrt(theory / draws)


@pytest.mark.parametrize("a,seed", [(0.99, 31), (1 - 1e-3, 32)])
def test_reversed_convention_is_caught(a, seed):
    """Passing alpha as the success probability (the known bug) shrinks the noise.

    Buggy sum: NB(1/n, alpha) differences, variance 2(1-alpha)/alpha^2, smaller than
    the correct 2 alpha/(1-alpha)^2 by (alpha/(1-alpha))^3: ~9.7e5 at 0.99, ~1e9 at
    1 - 1e-3. Our variance test (same tolerance as above) accepts our function and
    rejects the buggy sampler.
    """
    users, draws = 10, 10**5
    g = SeededSource(seed).generator
    r = 1.0 / users
    buggy = (
        g.negative_binomial(r, a, size=(users, draws)) - g.negative_binomial(r, a, size=(users, draws))
    ).sum(axis=0)
    ours = polya_shares(a, users, (users, draws), SeededSource(seed + 100)).sum(axis=0)
    theory = discrete_laplace_variance(a)
    tol = Z * dlap_variance_se(a, draws)

    assert abs(ours.var(ddof=1) - theory) <= tol
    assert abs(buggy.var(ddof=1) - theory) > tol  # the test would catch the reversal
    factor = (a / (1 - a)) ** 3
    assert ours.var(ddof=1) / max(buggy.var(ddof=1), 1e-300) > 0.1 * factor
    assert factor > 9e5


# --------------------------------------------------------------------------
# simulation path: Skellam
# --------------------------------------------------------------------------


@pytest.mark.parametrize("mu,users,seed", [(3.0, 10, 41), (200.0, 10, 42), (50.0, 100, 43)])
def test_skellam_sum_of_shares(mu, users, seed):
    draws = N_BIG if users <= 10 else 10**5
    s = skellam_shares(mu, users, (users, draws), SeededSource(seed)).sum(axis=0)
    assert chi_square_pvalue(s, stats.skellam(mu, mu)) > ALPHA
    assert skellam_variance(mu) == 2 * mu
    assert abs(s.var(ddof=1) - 2 * mu) <= Z * skellam_variance_se(mu, draws)


def test_skellam_vector_shape_and_independence():
    v = skellam_shares(8.0, 4, (1000, 16), SeededSource(44))
    assert v.shape == (1000, 16) and v.dtype == np.int64
    # coordinates independent: sample correlation between two coordinates ~ N(0, 1/1000)
    c = np.corrcoef(v[:, 0], v[:, 1])[0, 1]
    assert abs(c) <= Z / math.sqrt(1000)


# --------------------------------------------------------------------------
# device path (OS CSPRNG)
# --------------------------------------------------------------------------

N_DEVICE = 2 * 10**4


def test_device_nb_component_unseeded():
    a, users = 0.9, 10
    x = negative_binomial(1.0 / users, 1.0 - a, N_DEVICE, SystemSource())
    assert x.dtype == np.int64 and x.shape == (N_DEVICE,)
    assert chi_square_pvalue(x, stats.nbinom(1.0 / users, 1.0 - a)) > ALPHA_OS


def test_device_polya_sum_unseeded():
    a, users = 0.9, 2
    draws = N_DEVICE // 2  # 2 users x 2 NB per share: 4 * 10^4 NB draws
    s = polya_shares(a, users, (users, draws), SystemSource()).sum(axis=0)
    assert chi_square_pvalue(s, _DLap(a)) > ALPHA_OS
    z_os = float(stats.norm.isf(ALPHA_OS / 2))
    assert abs(s.var(ddof=1) - discrete_laplace_variance(a)) <= z_os * dlap_variance_se(a, draws)


def test_device_skellam_unseeded():
    mu, users = 20.0, 4
    x = skellam_shares(mu, users, N_DEVICE, SystemSource())
    assert chi_square_pvalue(x, stats.skellam(mu / users, mu / users)) > ALPHA_OS


def test_device_exact_poisson_seeded_bits():
    """The exact Poisson (same code as on a device) with a seeded bit source."""
    rng = random.Random(51)
    src = SystemSource()
    src._randbelow = rng.randrange
    src._randbits = rng.getrandbits
    lam = Fraction(7, 3)
    x = np.array([dn._poisson_exact(lam, src._randbelow, src._randbits) for _ in range(5 * 10**4)])
    assert chi_square_pvalue(x, stats.poisson(float(lam))) > ALPHA
    # and Skellam shares through the public API with the seeded instance
    s = skellam_shares(2.5, 1, 2 * 10**4, src)
    assert chi_square_pvalue(s, stats.skellam(2.5, 2.5)) > ALPHA


def test_device_poisson_one_acceptance_is_exact():
    """Acceptance probability 2^k/(2 k!) never exceeds 1 (so the rejection step is valid)."""
    for k in range(0, 200):
        assert Fraction(2**k, 2 * math.factorial(k)) <= 1


# --------------------------------------------------------------------------
# parameter validation
# --------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0, 0.0, 1.0, 1, -0.5, 1.5, float("nan"), float("inf"), True, "0.5", None])
def test_bad_alpha(alpha):
    with pytest.raises(InvalidParameter, match="alpha"):
        polya_shares(alpha, 10, 5, SeededSource(0))


def test_alpha_too_close_to_one_exceeds_max_noise_scale():
    with pytest.raises(InvalidParameter, match="MAX_NOISE_SCALE"):
        polya_shares(1 - 1e-15, 10, 5, SeededSource(0))


@pytest.mark.parametrize("users", [0, -3, 1.5, True, "10", 2**41])
def test_bad_users(users):
    with pytest.raises(InvalidParameter, match="users"):
        polya_shares(0.5, users, 5, SeededSource(0))
    with pytest.raises(InvalidParameter, match="users"):
        skellam_shares(1.0, users, 5, SeededSource(0))


@pytest.mark.parametrize("mu", [0, -1.0, float("inf"), float("nan"), 2.0**50, "1"])
def test_bad_mu(mu):
    with pytest.raises(InvalidParameter, match="mu_total"):
        skellam_shares(mu, 10, 5, SeededSource(0))


@pytest.mark.parametrize("size", [-1, 1.5, (3, -1), (2, "a"), True, 2**32, (2**16, 2**16)])
def test_bad_size(size):
    with pytest.raises(InvalidParameter, match="size"):
        polya_shares(0.5, 10, size, SeededSource(0))


def test_bad_source():
    with pytest.raises(InvalidParameter, match="source"):
        polya_shares(0.5, 10, 5, np.random.default_rng(0))


def test_bad_nb_parameters():
    with pytest.raises(InvalidParameter, match="shape"):
        negative_binomial(0.0, 0.5, 5, SeededSource(0))
    with pytest.raises(InvalidParameter, match="success_prob"):
        negative_binomial(1.0, 0.0, 5, SeededSource(0))


def test_device_refuses_linear_time_blowup():
    with pytest.raises(InvalidParameter, match="DEVICE_MAX_MEAN"):
        polya_shares(1 - 1e-6, 10, 1, SystemSource())
    with pytest.raises(InvalidParameter, match="DEVICE_MAX_MEAN"):
        skellam_shares(1e6, 1, 1, SystemSource())


def test_empty_and_shapes():
    assert polya_shares(0.5, 3, 0, SeededSource(0)).shape == (0,)
    assert polya_shares(0.5, 3, (2, 3), SystemSource()).shape == (2, 3)
    assert skellam_shares(1.0, 3, 0, SystemSource()).shape == (0,)
