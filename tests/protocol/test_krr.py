"""k-ary randomized response (client/krr.py) and optimal unary encoding (the reference OUE in
analyzer/frequency.py): exact local privacy, sampler distribution, unbiasedness and exact
variance, equality with dense decoders, and the closed-form variances.

Statistical tests use fixed seeds (chosen before looking at any outcome) and tolerances
derived from the exact distributions, at family-wise level ALPHA per test function
(Bonferroni over all comparisons in it); the variance intervals are chi-square with
Satterthwaite's effective degrees of freedom ``2 / (2/(R-1) + kappa/R)`` where ``kappa``
is the exact excess kurtosis of the estimate (a sum of independent Bernoulli terms).
"""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from scipy import stats

from shuffledp.analyzer.frequency import (
    decode_krr,
    decode_krr_counts,
    decode_oue,
    krr_variance,
    oue_other_bit_probability,
    oue_variance,
    randomize_oue,
)
from shuffledp.client.krr import krr_keep_probability, randomize_krr
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.randomness import SeededSource, SystemSource

ALPHA = 1e-3
TWO_53 = 1 << 53
mpmath.mp.dps = 60


class ScriptedSource:
    """Returns prescribed draws (integers, then Bernoulli outcomes) and records the requests."""

    secure = False

    def __init__(self, uniforms: np.ndarray | None, outcomes: np.ndarray) -> None:
        self.uniforms, self.outcomes = uniforms, outcomes
        self.highs: list[int] = []
        self.probabilities: list[object] = []

    def integers(self, high, size):
        assert self.uniforms is not None and size == len(self.uniforms)
        self.highs.append(high)
        return self.uniforms.copy()

    def bernoulli(self, p, size):
        assert size == len(self.outcomes)
        self.probabilities.append(p)
        return self.outcomes.copy()

    def discrete_laplace(self, scale, size):  # pragma: no cover - not used
        raise AssertionError("not used")

    def discrete_gaussian(self, sigma2, size):  # pragma: no cover - not used
        raise AssertionError("not used")


def as_mpf(x: Fraction):
    return mpmath.mpf(x.numerator) / x.denominator


def krr_table(k: int, epsilon: float) -> tuple[np.ndarray, int]:
    """``table[x, y] / total`` = P(report y | symbol x), from the implementation (exact integers)."""
    x, z, keep = np.meshgrid(np.arange(k), np.arange(k - 1), [False, True], indexing="ij")
    x, z, keep = x.ravel(), z.ravel(), keep.ravel()
    source = ScriptedSource(z, keep)
    y = randomize_krr(x, k, epsilon, source)
    assert source.highs == [k - 1] and len(source.probabilities) == 1
    p = Fraction(source.probabilities[0])
    assert (p * TWO_53).denominator == 1  # realised exactly by both sources
    p_units = int(p * TWO_53)
    table = np.zeros((k, k), dtype=np.int64)
    np.add.at(table, (x, y), np.where(keep, p_units, TWO_53 - p_units))
    return table, (k - 1) * TWO_53


EPSILONS = [0.1, 0.5, 1.0, 2.0, 4.0, 8.0]


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("k", range(2, 34))
def test_krr_exact_ldp(k, epsilon):
    table, total = krr_table(k, epsilon)
    assert np.all(table.sum(axis=1) == total)
    p = Fraction(krr_keep_probability(k, epsilon))
    # the definition: p on the diagonal, (1 - p)/(k - 1) elsewhere
    assert np.all(np.diag(table) == int(p * TWO_53) * (k - 1))
    off = table[~np.eye(k, dtype=bool)]
    assert np.all(off == TWO_53 - int(p * TWO_53))
    worst = max(Fraction(int(c.max()), int(c.min())) for c in table.T)
    bound = mpmath.exp(mpmath.mpf(epsilon))
    assert as_mpf(worst) <= bound
    # equal up to the 2^-48 margin and 2^-53 rounding: relative (2^-48 + 2^-53/p)/(1-p) < 1e-9
    assert as_mpf(worst) >= bound * (1 - mpmath.mpf("1e-9"))
    # and p is never above the exact e^eps/(e^eps + k - 1)
    e = mpmath.exp(mpmath.mpf(epsilon))
    assert as_mpf(p) <= e / (e + k - 1)


def test_krr_keep_probability_never_above_exact():
    for k in (2, 3, 10, 1000, 10**6):
        for epsilon in np.geomspace(1e-3, 40.0, 300):
            p = Fraction(krr_keep_probability(k, float(epsilon)))
            e = mpmath.exp(mpmath.mpf(float(epsilon)))
            assert 1 / Fraction(k) < p < 1
            assert as_mpf(p) <= e / (e + k - 1)


# cases: (k, symbol, epsilon, seed, n)
KRR_SAMPLER_CASES = [
    (2, 1, 0.5, 201, 20_000),
    (7, 0, 1.0, 202, 20_000),
    (16, 15, 4.0, 203, 40_000),
    (33, 11, 2.0, 204, 40_000),
]


@pytest.mark.parametrize("k,x,epsilon,seed,n", KRR_SAMPLER_CASES)
def test_krr_sampler_matches_exact_probabilities(k, x, epsilon, seed, n):
    """Chi-square goodness of fit of the SeededSource sampler; level ALPHA / (cases + 1)."""
    y = randomize_krr(np.full(n, x), k, epsilon, SeededSource(seed))
    table, total = krr_table(k, epsilon)
    expected = n * (table[x] / total)
    assert expected.min() >= 5
    _, pvalue = stats.chisquare(np.bincount(y, minlength=k), expected)
    assert pvalue > ALPHA / (len(KRR_SAMPLER_CASES) + 1)


def test_krr_device_source_matches_exact_probabilities():
    k, x, epsilon, n = 5, 2, 1.5, 5000
    source = SystemSource()
    rng = random.Random(31415)
    source._randbelow, source._randbits = rng.randrange, rng.getrandbits
    y = randomize_krr(np.full(n, x), k, epsilon, source)
    table, total = krr_table(k, epsilon)
    _, pvalue = stats.chisquare(np.bincount(y, minlength=k), n * (table[x] / total))
    assert pvalue > ALPHA / (len(KRR_SAMPLER_CASES) + 1)


KRR_ESTIMATOR_CASES = [
    (7, 1.5, [50, 0, 10, 10, 5, 3, 2], 301),
    (12, 4.0, [30, 20, 10, 5, 5, 5, 0, 3, 2, 1, 1, 1], 302),
    (3, 0.5, [40, 30, 10], 303),
]
REPS = 4000


def test_krr_unbiased_with_exact_variance():
    comparisons = 2 * sum(k for k, *_ in KRR_ESTIMATOR_CASES)
    per_test = ALPHA / comparisons
    z_crit = stats.norm.isf(per_test / 2)
    for k, epsilon, counts, seed in KRR_ESTIMATOR_CASES:
        symbols = np.repeat(np.arange(k), counts)
        n = symbols.size
        f = np.asarray(counts, dtype=float) / n
        y = randomize_krr(np.tile(symbols, REPS), k, epsilon, SeededSource(seed))
        hist = np.bincount(np.repeat(np.arange(REPS), n) * k + y, minlength=REPS * k).reshape(REPS, k)
        estimates = decode_krr_counts(hist, k, epsilon)
        var = krr_variance(f, n, k, epsilon)
        z = (estimates.mean(axis=0) - f) / np.sqrt(var / REPS)
        assert np.all(np.abs(z) < z_crit), (k, epsilon, z)
        p = krr_keep_probability(k, epsilon)
        q = (1 - p) / (k - 1)
        ratio = estimates.var(axis=0, ddof=1) / var
        for x in range(k):
            # fhat[x] is affine in a sum of independent Bernoulli(p or q) indicators
            probs = np.where(symbols == x, p, q)
            pq = probs * (1 - probs)
            kappa = np.sum(pq * (1 - 6 * pq)) / np.sum(pq) ** 2
            dof = 2.0 / (2.0 / (REPS - 1) + kappa / REPS)
            lo, hi = stats.chi2.ppf(per_test / 2, dof) / dof, stats.chi2.isf(per_test / 2, dof) / dof
            assert lo < ratio[x] < hi, (k, epsilon, x, ratio[x], lo, hi)


def test_krr_variance_closed_form():
    """(e^eps + k - 2)/(e^eps - 1)^2 + f (k - 2)/(e^eps - 1), up to the 2^-48 rounding of p."""
    for k in (2, 3, 10, 1024):
        for epsilon in (0.5, 1.0, 4.0, 8.0):
            e = math.exp(epsilon)
            f = np.linspace(0.0, 1.0, k)
            closed = (e + k - 2) / (e - 1) ** 2 + f * (k - 2) / (e - 1)
            np.testing.assert_allclose(krr_variance(f, 100, k, epsilon) * 100, closed, rtol=1e-10)


def test_krr_decoder_equals_dense():
    k, epsilon, n = 9, 1.2, 300
    y = randomize_krr(np.random.default_rng(5).integers(0, k, n), k, epsilon, SeededSource(6))
    p = krr_keep_probability(k, epsilon)
    q = (1 - p) / (k - 1)
    dense = np.array([(np.sum(y == x) / n - q) / (p - q) for x in range(k)])
    np.testing.assert_allclose(decode_krr(y, k, epsilon), dense, rtol=0, atol=1e-12)
    chunks = np.array_split(y, 3)
    total = sum(np.bincount(c, minlength=k) for c in chunks)
    np.testing.assert_array_equal(decode_krr_counts(total, k, epsilon), decode_krr(y, k, epsilon))


# --------------------------------------------------------------------------
# OUE (reference)
# --------------------------------------------------------------------------


def oue_bit_laws(k: int, epsilon: float) -> list[list[Fraction]]:
    """``P[x][j]`` = P(bit j = 1 | symbol x), read from the implementation with scripted Bernoulli draws."""
    x = np.arange(k)
    ones = []
    for outcome in (False, True):
        source = ScriptedSource(None, np.full(k * k, outcome))
        bits = randomize_oue(x, k, epsilon, source)
        assert len(source.probabilities) == 1
        ones.append(bits)
    zero_p = np.asarray(source.probabilities[0]).reshape(k, k)
    # the report is the complement of the drawn event, whatever the draw
    assert np.all(ones[0]) and not np.any(ones[1])
    return [[1 - Fraction(float(zero_p[i, j])) for j in range(k)] for i in range(k)]


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("k", range(2, 9))
def test_oue_exact_ldp_by_enumerating_all_outputs(k, epsilon):
    laws = oue_bit_laws(k, epsilon)
    q = Fraction(oue_other_bit_probability(epsilon))
    for x in range(k):
        assert laws[x][x] == Fraction(1, 2)
        assert all(laws[x][j] == q for j in range(k) if j != x)
    worst = Fraction(1)
    for out in itertools.product((0, 1), repeat=k):
        probs = []
        for x in range(k):
            pr = Fraction(1)
            for j, bit in enumerate(out):
                pr *= laws[x][j] if bit else 1 - laws[x][j]
            probs.append(pr)
        worst = max(worst, max(probs) / min(probs))
    bound = mpmath.exp(mpmath.mpf(epsilon))
    assert as_mpf(worst) <= bound
    assert as_mpf(worst) >= bound * (1 - mpmath.mpf("1e-9"))


def test_oue_unbiased_with_exact_variance_and_closed_form():
    k, epsilon, reps = 6, 1.0, 2000
    counts = [30, 15, 10, 5, 0, 0]
    symbols = np.repeat(np.arange(k), counts)
    n = symbols.size
    f = np.asarray(counts) / n
    bits = randomize_oue(np.tile(symbols, reps), k, epsilon, SeededSource(401)).reshape(reps, n, k)
    estimates = np.array([decode_oue(b, epsilon) for b in bits])
    var = oue_variance(f, n, epsilon)
    e = math.exp(epsilon)
    np.testing.assert_allclose(var * n, 4 * e / (e - 1) ** 2 + f, rtol=1e-10)
    per_test = ALPHA / (2 * k)
    z = (estimates.mean(axis=0) - f) / np.sqrt(var / reps)
    assert np.all(np.abs(z) < stats.norm.isf(per_test / 2)), z
    q = oue_other_bit_probability(epsilon)
    ratio = estimates.var(axis=0, ddof=1) / var
    for x in range(k):
        probs = np.where(symbols == x, 0.5, q)
        pq = probs * (1 - probs)
        kappa = np.sum(pq * (1 - 6 * pq)) / np.sum(pq) ** 2
        dof = 2.0 / (2.0 / (reps - 1) + kappa / reps)
        lo, hi = stats.chi2.ppf(per_test / 2, dof) / dof, stats.chi2.isf(per_test / 2, dof) / dof
        assert lo < ratio[x] < hi, (x, ratio[x], lo, hi)


def test_validation():
    for k, eps in [(1, 1.0), (2.0, 1.0), (True, 1.0), (5, 0.0), (5, float("nan")), (5, -2.0), (5, float("inf"))]:
        with pytest.raises(InvalidParameter):
            randomize_krr(np.array([0]), k, eps, SeededSource(0))
    with pytest.raises(InvalidParameter):
        krr_keep_probability(10, 1e-17)  # rounds to p <= 1/k: no information
    for symbols in (np.array([5]), np.array([-1]), np.array([[0]]), np.array([1.0])):
        with pytest.raises(InvalidParameter):
            randomize_krr(symbols, 5, 1.0, SeededSource(0))
    for outputs in (np.array([], dtype=np.int64), np.array([5]), np.array([-1])):
        with pytest.raises(InvalidParameter):
            decode_krr(outputs, 5, 1.0)
    with pytest.raises(InvalidParameter):
        decode_krr_counts(np.zeros(5), 5, 1.0)
    with pytest.raises(InvalidParameter):
        krr_variance(np.ones(4) / 4, 10, 5, 1.0)
    with pytest.raises(InvalidParameter):
        decode_oue(np.zeros((0, 3)), 1.0)
