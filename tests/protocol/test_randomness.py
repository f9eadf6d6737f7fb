"""Tests for shuffledp.protocol.mechanisms.randomness.

Statistical tests are goodness-of-fit / two-sample chi-square tests at a stated
significance level ALPHA with fixed seeds, so they are deterministic: with a
correct sampler a given seed fails with probability ALPHA a priori, and the seed
was not chosen by trial. The exact (CKS20) samplers of SystemSource are tested
with a *seeded* bit source substituted on the instance (``_randbelow`` /
``_randbits``), which makes them reproducible while exercising exactly the same
code as on a device; a few smoke tests use the real OS CSPRNG at a much smaller
significance level (ALPHA_OS) since those cannot be seeded.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.randomness import RandomSource, SeededSource, SystemSource

ALPHA = 1e-3  # significance level of every seeded statistical test
ALPHA_OS = 1e-6  # significance level of the (unseedable) real-CSPRNG smoke tests
MIN_EXPECTED = 20  # pool bins until every expected count is at least this


# --------------------------------------------------------------------------
# exact pmfs and chi-square helpers
# --------------------------------------------------------------------------


def laplace_pmf(scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Support window and exact pmf of P(k) = (1-q)/(1+q) q^|k|, q = e^{-1/scale}."""
    big_k = int(math.ceil(60 * scale)) + 5  # mass beyond is < e^-60
    k = np.arange(-big_k, big_k + 1)
    q = math.exp(-1.0 / scale)
    p = (1 - q) / (1 + q) * np.exp(-np.abs(k) / scale)
    return k, p


def gaussian_pmf(sigma2: float) -> tuple[np.ndarray, np.ndarray]:
    """Support window and exact (normalised) pmf of N_Z(0, sigma2); mass beyond < e^-800."""
    big_k = int(math.ceil(40 * math.sqrt(sigma2))) + 2
    k = np.arange(-big_k, big_k + 1)
    w = np.exp(-(k.astype(float) ** 2) / (2 * sigma2))
    return k, w / w.sum()


def make_bins(p: np.ndarray, n: int) -> np.ndarray:
    """Group consecutive support points so that each bin has expected count >= MIN_EXPECTED.

    Returns an array mapping each support index to a bin index (tails pooled).
    """
    bin_of = np.empty(p.size, dtype=np.int64)
    b = 0
    acc = 0.0
    for i, pi in enumerate(p):
        bin_of[i] = b
        acc += pi * n
        if acc >= MIN_EXPECTED:
            b += 1
            acc = 0.0
    # merge an under-filled last bin into the previous one
    if acc < MIN_EXPECTED and b > 0:
        bin_of[bin_of == b] = b - 1
    return bin_of


def binned(samples: np.ndarray, k: np.ndarray, bin_of: np.ndarray) -> np.ndarray:
    idx = np.clip(samples - k[0], 0, k.size - 1)
    return np.bincount(bin_of[idx], minlength=bin_of.max() + 1)


def gof_pvalue(samples: np.ndarray, k: np.ndarray, p: np.ndarray) -> float:
    bin_of = make_bins(p, samples.size)
    assert bin_of.max() >= 1, "test needs at least two bins"
    assert samples.min() >= k[0] and samples.max() <= k[-1]
    obs = binned(samples, k, bin_of)
    exp = np.bincount(bin_of, weights=p, minlength=obs.size)
    exp = exp / exp.sum() * samples.size
    return stats.chisquare(obs, exp).pvalue


def two_sample_pvalue(a: np.ndarray, b: np.ndarray, k: np.ndarray, p: np.ndarray) -> float:
    """Chi-square homogeneity test on bins pooled by the exact pmf at the smaller size."""
    bin_of = make_bins(p, min(a.size, b.size))
    table = np.vstack([binned(a, k, bin_of), binned(b, k, bin_of)])
    table = table[:, table.sum(axis=0) > 0]
    return stats.chi2_contingency(table, correction=False).pvalue


def seeded_system_source(seed: int) -> SystemSource:
    """A SystemSource whose bits come from random.Random(seed): reproducible, same code."""
    src = SystemSource()
    rng = random.Random(seed)
    src._randbelow = rng.randrange
    src._randbits = rng.getrandbits
    return src


# --------------------------------------------------------------------------
# basic properties
# --------------------------------------------------------------------------


def test_protocol_and_flags():
    assert isinstance(SeededSource(1), RandomSource)
    assert isinstance(SystemSource(), RandomSource)
    assert SeededSource(1).secure is False
    assert SystemSource().secure is True


@pytest.mark.parametrize("make", [lambda: SeededSource(5), lambda: seeded_system_source(5), SystemSource])
def test_shapes_and_dtypes(make):
    src = make()
    for arr, dtype in [
        (src.integers(10, 7), np.int64),
        (src.bernoulli(0.5, 7), np.bool_),
        (src.bernoulli(np.linspace(0, 1, 7), 7), np.bool_),
        (src.discrete_laplace(2.0, 7), np.int64),
        (src.discrete_gaussian(3.0, 7), np.int64),
    ]:
        assert arr.shape == (7,)
        assert arr.dtype == dtype
    assert src.integers(1, 5).tolist() == [0] * 5
    assert src.discrete_gaussian(Fraction(9, 4), 0).shape == (0,)


def test_seeded_reproducible_and_spawn():
    a, b = SeededSource(123), SeededSource(123)
    assert np.array_equal(a.discrete_gaussian(10.0, 100), b.discrete_gaussian(10.0, 100))
    assert isinstance(a.generator, np.random.Generator)
    kids1 = SeededSource(7).spawn(3)
    kids2 = SeededSource(7).spawn(3)
    draws1 = [k.integers(1 << 30, 4).tolist() for k in kids1]
    draws2 = [k.integers(1 << 30, 4).tolist() for k in kids2]
    assert draws1 == draws2  # deterministic
    assert len({tuple(d) for d in draws1}) == 3  # distinct streams
    ss = np.random.SeedSequence(99)
    assert np.array_equal(SeededSource(ss).integers(100, 10), SeededSource(np.random.SeedSequence(99)).integers(100, 10))


def test_bernoulli_extremes():
    for src in (SeededSource(3), seeded_system_source(3), SystemSource()):
        assert not src.bernoulli(0.0, 200).any()
        assert src.bernoulli(1.0, 200).all()
        p = np.array([0.0, 1.0] * 50)
        out = src.bernoulli(p, 100)
        assert np.array_equal(out, p == 1.0)


def test_system_bernoulli_rounds_down_exactly():
    """P(True) = floor(p 2^53)/2^53 <= p: check the threshold and the comparison boundary."""
    for p in [1 / 3, 0.1, math.exp(1) / (math.exp(1) + 1), 1 - 2**-53, 2**-60, Fraction(1, 3)]:
        th = SystemSource._threshold(p)
        assert th == math.floor(Fraction(p) * 2**53)
        assert Fraction(th, 2**53) <= Fraction(p) < Fraction(th + 1, 2**53)
    p = 1 / 3
    th = SystemSource._threshold(p)
    src = SystemSource()
    src._randbits = lambda k: th - 1
    assert src.bernoulli(p, 3).all()
    src._randbits = lambda k: th
    assert not src.bernoulli(p, 3).any()
    # a probability below 2^-53 is rounded to 0: never True
    src._randbits = lambda k: 0
    assert not src.bernoulli(2**-60, 3).any()


# --------------------------------------------------------------------------
# goodness of fit: SeededSource (large samples)
# --------------------------------------------------------------------------

N_SEEDED = 200_000


@pytest.mark.parametrize("scale", [0.4, 3.0, Fraction(5, 2), 250.0])
def test_seeded_discrete_laplace_gof(scale):
    k, p = laplace_pmf(float(scale))
    x = SeededSource(20240601).discrete_laplace(scale, N_SEEDED)
    assert gof_pvalue(x, k, p) > ALPHA


@pytest.mark.parametrize("sigma2", [0.2, 1.0, 7.3, Fraction(49, 4), 2500.0])
def test_seeded_discrete_gaussian_gof(sigma2):
    k, p = gaussian_pmf(float(sigma2))
    x = SeededSource(20240602).discrete_gaussian(sigma2, N_SEEDED)
    assert gof_pvalue(x, k, p) > ALPHA


def test_seeded_integers_and_bernoulli_gof():
    src = SeededSource(20240603)
    x = src.integers(13, N_SEEDED)
    assert stats.chisquare(np.bincount(x, minlength=13)).pvalue > ALPHA
    b = src.bernoulli(0.3, N_SEEDED)
    assert stats.binomtest(int(b.sum()), N_SEEDED, 0.3).pvalue > ALPHA
    # elementwise probabilities: two groups
    p = np.where(np.arange(N_SEEDED) % 2 == 0, 0.1, 0.8)
    b = src.bernoulli(p, N_SEEDED)
    assert stats.binomtest(int(b[::2].sum()), N_SEEDED // 2, 0.1).pvalue > ALPHA
    assert stats.binomtest(int(b[1::2].sum()), N_SEEDED // 2, 0.8).pvalue > ALPHA


# --------------------------------------------------------------------------
# goodness of fit: SystemSource exact samplers (seeded bits, a few thousand)
# --------------------------------------------------------------------------

N_SYSTEM = 3000


@pytest.mark.parametrize("scale", [0.4, Fraction(5, 2), 3.3, 40.0])
def test_system_discrete_laplace_gof(scale):
    k, p = laplace_pmf(float(scale))
    x = seeded_system_source(11).discrete_laplace(scale, N_SYSTEM)
    assert gof_pvalue(x, k, p) > ALPHA


@pytest.mark.parametrize("sigma2", [0.2, 1.0, 2.7, Fraction(49, 4), 1e4])
def test_system_discrete_gaussian_gof(sigma2):
    k, p = gaussian_pmf(float(sigma2))
    x = seeded_system_source(12).discrete_gaussian(sigma2, N_SYSTEM)
    assert gof_pvalue(x, k, p) > ALPHA


def test_system_bernoulli_exp_neg_exact_probability():
    """CKS20 Algorithm 1 on its own: frequency of Bernoulli(exp(-gamma))."""
    src = seeded_system_source(13)
    n = 20_000
    for gamma in [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(7, 3)]:
        hits = sum(src._bernoulli_exp_neg(gamma) for _ in range(n))
        assert stats.binomtest(hits, n, math.exp(-float(gamma))).pvalue > ALPHA


def test_system_real_csprng_smoke():
    """Unseeded OS randomness; ALPHA_OS keeps the chance of a spurious failure at 1e-6."""
    src = SystemSource()
    n = 2000
    k, p = gaussian_pmf(5.0)
    assert gof_pvalue(src.discrete_gaussian(5.0, n), k, p) > ALPHA_OS
    k, p = laplace_pmf(2.0)
    assert gof_pvalue(src.discrete_laplace(2.0, n), k, p) > ALPHA_OS
    assert stats.chisquare(np.bincount(src.integers(6, n), minlength=6)).pvalue > ALPHA_OS
    assert stats.binomtest(int(src.bernoulli(0.25, n).sum()), n, 0.25).pvalue > ALPHA_OS


# --------------------------------------------------------------------------
# SystemSource and SeededSource agree (two-sample tests)
# --------------------------------------------------------------------------

N_TWO_SAMPLE_SYS = 4000
N_TWO_SAMPLE_SEEDED = 40_000


def test_two_sample_integers_and_bernoulli():
    sys_src, sim = seeded_system_source(21), SeededSource(21)
    a = sys_src.integers(7, N_TWO_SAMPLE_SYS)
    b = sim.integers(7, N_TWO_SAMPLE_SEEDED)
    table = np.vstack([np.bincount(a, minlength=7), np.bincount(b, minlength=7)])
    assert stats.chi2_contingency(table, correction=False).pvalue > ALPHA

    p = np.where(np.arange(N_TWO_SAMPLE_SYS) % 2 == 0, 0.2, 0.65)
    a = sys_src.bernoulli(p, N_TWO_SAMPLE_SYS)
    pb = np.where(np.arange(N_TWO_SAMPLE_SEEDED) % 2 == 0, 0.2, 0.65)
    b = sim.bernoulli(pb, N_TWO_SAMPLE_SEEDED)
    for par in (0, 1):
        table = np.array(
            [
                [a[par::2].sum(), (~a[par::2]).sum()],
                [b[par::2].sum(), (~b[par::2]).sum()],
            ]
        )
        assert stats.chi2_contingency(table, correction=False).pvalue > ALPHA


@pytest.mark.parametrize("scale", [0.7, 6.0])
def test_two_sample_discrete_laplace(scale):
    k, p = laplace_pmf(scale)
    a = seeded_system_source(22).discrete_laplace(scale, N_TWO_SAMPLE_SYS)
    b = SeededSource(22).discrete_laplace(scale, N_TWO_SAMPLE_SEEDED)
    assert two_sample_pvalue(a, b, k, p) > ALPHA


@pytest.mark.parametrize("sigma2", [0.5, 30.0])
def test_two_sample_discrete_gaussian(sigma2):
    k, p = gaussian_pmf(sigma2)
    a = seeded_system_source(23).discrete_gaussian(sigma2, N_TWO_SAMPLE_SYS)
    b = SeededSource(23).discrete_gaussian(sigma2, N_TWO_SAMPLE_SEEDED)
    assert two_sample_pvalue(a, b, k, p) > ALPHA


# --------------------------------------------------------------------------
# parameter validation
# --------------------------------------------------------------------------


@pytest.mark.parametrize("make", [lambda: SeededSource(0), SystemSource])
def test_validation(make):
    src = make()
    bad_calls = [
        lambda: src.integers(0, 3),
        lambda: src.integers(-2, 3),
        lambda: src.integers(2.5, 3),
        lambda: src.integers(5, -1),
        lambda: src.integers(5, 2.0),
        lambda: src.bernoulli(-0.1, 3),
        lambda: src.bernoulli(1.5, 3),
        lambda: src.bernoulli(float("nan"), 3),
        lambda: src.bernoulli(np.array([0.5, 0.5]), 3),
        lambda: src.bernoulli(np.array([0.5, 1.2, 0.1]), 3),
        lambda: src.bernoulli(0.5, -1),
        lambda: src.discrete_laplace(0, 3),
        lambda: src.discrete_laplace(-1.0, 3),
        lambda: src.discrete_laplace(float("inf"), 3),
        lambda: src.discrete_laplace(Fraction(-1, 2), 3),
        lambda: src.discrete_laplace("2", 3),
        lambda: src.discrete_gaussian(0.0, 3),
        lambda: src.discrete_gaussian(-4, 3),
        lambda: src.discrete_gaussian(float("nan"), 3),
        lambda: src.discrete_gaussian(1.0, -3),
    ]
    for call in bad_calls:
        with pytest.raises(InvalidParameter):
            call()


def test_seed_validation():
    with pytest.raises(InvalidParameter):
        SeededSource("seed")
    with pytest.raises(InvalidParameter):
        SeededSource(-1)
    with pytest.raises(InvalidParameter):
        SeededSource(1).spawn(-1)
