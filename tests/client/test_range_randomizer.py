"""Hadamard-response range randomizer (client/range_randomizer.py) and its decoder
(analyzer/decoders.py): exact local privacy, sampler distribution, unbiasedness and
exact variance of the frequency estimate, and equality with the dense computation.

Statistical tests use fixed seeds (chosen before looking at any outcome) and
tolerances derived from the exact distributions:

* sampler goodness of fit: chi-square, family-wise level ALPHA over the cases of
  the test (Bonferroni);
* frequency estimate: for every bin (K = 8), a z-test of the mean of R repetitions
  against the truth and a chi-square interval for the sample variance against
  :func:`hadamard_estimate_variance`; 2K comparisons at family-wise level ALPHA
  (Bonferroni: ALPHA / (2K) each).

With a correct implementation each statistical test fails with probability at
most ALPHA for a seed drawn at random; the seeds are fixed, so runs are
deterministic.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from scipy.linalg import hadamard

from shuffledp.analyzer.decoders import (
    announce_range,
    hadamard_estimate_variance,
    hadamard_frequencies,
    hadamard_scale,
    signed_row_histogram,
)
from shuffledp.client.range_randomizer import bin_index, keep_probability, randomize_range
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.wire.messages import HadamardRangeParams
from shuffledp.protocol.mechanisms.randomness import SeededSource

ALPHA = 1e-3
EPSILONS = [0.1, 0.5, 1.0, 3.0, 5.0]
mpmath.mp.dps = 60


def params_with_bins(num_bins: int) -> HadamardRangeParams:
    params = HadamardRangeParams(0.0, float(num_bins), 0.5)  # bins of width 2 tau = 1
    assert params.num_bins == num_bins
    return params


class ScriptedSource:
    """A RandomSource that returns prescribed draws and records what it was asked."""

    secure = False

    def __init__(self, rows: np.ndarray, keeps: np.ndarray) -> None:
        self.rows, self.keeps = rows, keeps
        self.highs: list[int] = []
        self.probabilities: list[object] = []

    def integers(self, high, size):
        assert size == len(self.rows)
        self.highs.append(high)
        return self.rows.copy()

    def bernoulli(self, p, size):
        assert size == len(self.keeps)
        self.probabilities.append(p)
        return self.keeps.copy()

    def discrete_laplace(self, scale, size):  # pragma: no cover - not used here
        raise AssertionError("not used")

    def discrete_gaussian(self, sigma2, size):  # pragma: no cover - not used here
        raise AssertionError("not used")


def exact_output_probabilities(num_bins: int, epsilon: float, keep=None) -> np.ndarray:
    """P[nu, j, s] (s = 0 for bit -1, 1 for bit +1) as Fractions, from the implementation.

    Runs ``randomize_range`` on every (input bin, row draw, keep draw) combination
    with a scripted source and weights each outcome by the probability of its
    draws: the row is uniform over the ``high`` the mechanism asked for and the
    keep bit is Bernoulli with the probability it passed (or ``keep`` if given).
    """
    params = params_with_bins(num_bins)
    k = params.padded_bins
    nu, rows, keeps = np.meshgrid(np.arange(num_bins), np.arange(k), [False, True], indexing="ij")
    nu, rows, keeps = nu.ravel(), rows.ravel(), keeps.ravel()
    means = np.array([params.bin_center(int(v)) for v in nu])
    source = ScriptedSource(rows, keeps)
    out_rows, out_bits = randomize_range(means, params, epsilon, source)
    assert source.highs == [k]
    assert len(source.probabilities) == 1
    p = Fraction(keep if keep is not None else source.probabilities[0])
    np.testing.assert_array_equal(out_rows, rows)
    assert set(np.unique(out_bits).tolist()) <= {-1, 1}
    table = [[[Fraction(0), Fraction(0)] for _ in range(k)] for _ in range(num_bins)]
    for v, j, kept, r, b in zip(nu, rows, keeps, out_rows, out_bits):
        table[v][int(r)][int(b > 0)] += Fraction(1, k) * (p if kept else 1 - p)
    return np.array(table, dtype=object)


def worst_ratio(table: np.ndarray) -> Fraction:
    num_bins = table.shape[0]
    worst = Fraction(1)
    flat = table.reshape(num_bins, -1)
    for col in range(flat.shape[1]):
        column = list(flat[:, col])
        assert min(column) > 0  # every output possible from every input
        worst = max(worst, max(column) / min(column))
    return worst


def as_mpf(x: Fraction):
    return mpmath.mpf(x.numerator) / x.denominator


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("num_bins", range(1, 17))
def test_exact_ldp(num_bins, epsilon):
    table = exact_output_probabilities(num_bins, epsilon)
    # each input's output distribution sums to one
    for v in range(num_bins):
        assert sum(table[v].ravel()) == 1
    ratio = as_mpf(worst_ratio(table))
    bound = mpmath.exp(mpmath.mpf(epsilon))
    # keep_probability is a float; its rounding moves p/(1-p) by < 1e-12 relatively for eps <= 5
    assert ratio <= bound * (1 + mpmath.mpf("1e-12"))
    if num_bins >= 2:
        assert ratio >= bound * (1 - mpmath.mpf("1e-12"))
    else:
        assert ratio == 1  # one bin: the output does not depend on the input


def test_device_keep_probability_never_exceeds_e_eps_exactly():
    """With SystemSource the keep probability realised is floor(p 2^53)/2^53 (exact)."""
    for epsilon in EPSILONS:
        p = Fraction(keep_probability(epsilon))
        realised = Fraction(math.floor(p * 2**53), 2**53)
        ratio = worst_ratio(exact_output_probabilities(2, epsilon, keep=realised))
        assert as_mpf(ratio) <= mpmath.exp(mpmath.mpf(epsilon)), epsilon


def test_large_epsilon_still_randomizes():
    """Past MAX_EPSILON the keep probability would round to 1 (no privacy): refused. At the
    limit every output still has positive probability and the ratio is at most e^eps."""
    from shuffledp.protocol.wire.messages import MAX_EPSILON

    with pytest.raises(InvalidParameter):
        keep_probability(40.0)
    assert keep_probability(MAX_EPSILON) < 1.0
    ratio = worst_ratio(exact_output_probabilities(2, MAX_EPSILON))
    assert as_mpf(ratio) <= mpmath.exp(mpmath.mpf(MAX_EPSILON))


@settings(max_examples=200, deadline=None)
@given(
    y=st.floats(-1e9, 1e9, allow_nan=False),
    num_bins=st.integers(1, 40),
    low=st.floats(-100, 100),
)
def test_bin_index_always_a_real_bin(y, num_bins, low):
    """The output depends on the input only through nu, and nu is always a real bin."""
    params = HadamardRangeParams(low, low + num_bins, 0.5)
    nu = int(bin_index(np.array([y]), params)[0])
    assert 0 <= nu < params.num_bins
    if params.low <= y < params.high:
        # the nearest bin centre
        assert abs(y - params.bin_center(nu)) <= params.tau * (1 + 1e-9)


# cases: (num_bins, input bin, epsilon, seed)
SAMPLER_CASES = [(1, 0, 1.0, 11), (3, 0, 0.5, 12), (3, 2, 1.0, 13), (5, 4, 2.0, 14), (16, 7, 1.0, 15), (16, 15, 0.1, 16)]


@pytest.mark.parametrize("num_bins,nu,epsilon,seed", SAMPLER_CASES)
def test_sampler_matches_exact_probabilities(num_bins, nu, epsilon, seed):
    """Chi-square goodness of fit of (row, bit) counts; level ALPHA / len(SAMPLER_CASES)."""
    params = params_with_bins(num_bins)
    k = params.padded_bins
    n = 30_000
    rows, bits = randomize_range(np.full(n, params.bin_center(nu)), params, epsilon, SeededSource(seed))
    observed = np.bincount(2 * rows + (bits > 0), minlength=2 * k)
    table = exact_output_probabilities(num_bins, epsilon)
    expected = n * np.array([float(x) for x in table[nu].ravel()])
    assert expected.min() >= 20
    _, pvalue = stats.chisquare(observed, expected)
    assert pvalue > ALPHA / len(SAMPLER_CASES)


# --------------------------------------------------------------------------
# the frequency estimate
# --------------------------------------------------------------------------


def fixed_population(params: HadamardRangeParams, counts: list[int]) -> np.ndarray:
    """Local means with exactly ``counts[a]`` users in bin ``a`` (placed off-centre on purpose)."""
    rng = np.random.default_rng(7)
    means = []
    for a, c in enumerate(counts):
        # anywhere inside the bin: the randomizer must only use the bin
        means += list(params.low + 2 * params.tau * (a + rng.uniform(0.01, 0.99, size=c)))
    means = np.array(means)
    assert np.bincount(bin_index(means, params), minlength=params.num_bins).tolist() == counts
    return means


def test_variance_formula_matches_first_principles():
    """(c^2 - f)/n with c = (e^eps + 1)/(e^eps - 1): each term is +-c, with mean 1 or 0."""
    eps = 0.7
    c = (math.exp(eps) + 1) / (math.exp(eps) - 1)
    assert hadamard_scale(eps) == pytest.approx(c, rel=1e-14)
    f = np.array([0.5, 0.25, 0.25, 0.0])
    np.testing.assert_allclose(hadamard_estimate_variance(f, 40, eps), (c * c - f) / 40, rtol=1e-14)


@pytest.mark.parametrize("epsilon,seed", [(1.0, 2024), (0.5, 2025)])
def test_frequency_estimate_unbiased_with_exact_variance(epsilon, seed):
    params = params_with_bins(5)
    k = params.padded_bins  # 8
    counts = [80, 60, 40, 20, 0]
    n = sum(counts)
    f = np.array(counts + [0] * (k - len(counts)), dtype=float) / n
    means = fixed_population(params, counts)
    # R = 10000 makes the variance interval about +-6%, tight enough to tell (c^2 - f)/n from c^2/n
    # for the fullest bin (f = 0.4, a 9% difference at eps = 1)
    reps = 10_000
    source = SeededSource(seed)
    rows, bits = randomize_range(np.tile(means, reps), params, epsilon, source)
    estimates = np.array(
        [
            hadamard_frequencies(rows[r * n : (r + 1) * n], bits[r * n : (r + 1) * n], k, epsilon)
            for r in range(reps)
        ]
    )
    var = hadamard_estimate_variance(f, n, epsilon)

    # Exact excess kurtosis of fhat[a]: a sum over users of independent two-point
    # variables c*(+-1) with P(+1) = p (user in bin a) or 1/2 (any other bin).
    # Fourth cumulant of a {0,1}-Bernoulli(p) is pq(1 - 6pq); it is <= 0 here, so the
    # normal-theory chi-square interval for the sample variance is conservative.
    p = keep_probability(epsilon)
    for a in range(k):
        in_bin = f[a] * n
        pq = np.array([p * (1 - p)] * int(round(in_bin)) + [0.25] * int(round(n - in_bin)))
        excess_kurtosis = np.sum(pq * (1 - 6 * pq)) / np.sum(pq) ** 2
        assert excess_kurtosis <= 0

    per_test = ALPHA / (2 * k)
    z_crit = stats.norm.isf(per_test / 2)
    chi_lo = stats.chi2.ppf(per_test / 2, reps - 1) / (reps - 1)
    chi_hi = stats.chi2.isf(per_test / 2, reps - 1) / (reps - 1)
    sample_mean = estimates.mean(axis=0)
    sample_var = estimates.var(axis=0, ddof=1)
    z = (sample_mean - f) / np.sqrt(var / reps)
    assert np.all(np.abs(z) < z_crit), z
    ratio = sample_var / var
    assert np.all((ratio > chi_lo) & (ratio < chi_hi)), (ratio, chi_lo, chi_hi)


@pytest.mark.parametrize("num_bins,n,seed", [(5, 37, 1), (16, 60, 2), (30, 25, 3)])
def test_decoder_equals_dense_computation(num_bins, n, seed):
    params = HadamardRangeParams(0.0, float(num_bins), 0.5)
    k = params.padded_bins
    epsilon = 0.8
    rng = np.random.default_rng([seed, 0xDA7A])  # not the randomizer's stream
    means = rng.uniform(0.0, num_bins, size=n)
    rows, bits = randomize_range(means, params, epsilon, SeededSource(seed))
    h = hadamard(k)
    c = hadamard_scale(epsilon)
    dense = np.zeros(k)
    for j, b in zip(rows, bits):
        dense += c * float(b) * h[j, :]  # z_i = c b_i H[j_i, :]
    dense /= n
    fast = hadamard_frequencies(rows, bits, k, epsilon)
    assert fast.shape == (k,)
    # both are (c/n) times the same integer vector; only the rounding differs
    np.testing.assert_allclose(fast, dense, rtol=0, atol=1e-12 * c)
    integer_sums = (bits.astype(np.int64)[:, None] * h[rows, :].astype(np.int64)).sum(axis=0)
    np.testing.assert_array_equal(np.rint(fast * n / c).astype(np.int64), integer_sums)
    np.testing.assert_array_equal(signed_row_histogram(rows, bits, k), np.bincount(rows, weights=bits, minlength=k))


def test_decoder_rejects_bad_input():
    with pytest.raises(InvalidParameter):
        hadamard_frequencies(np.array([], dtype=np.int64), np.array([], dtype=np.int8), 8, 1.0)
    with pytest.raises(InvalidParameter):
        hadamard_frequencies(np.array([8]), np.array([1]), 8, 1.0)
    with pytest.raises(InvalidParameter):
        hadamard_frequencies(np.array([-1]), np.array([1]), 8, 1.0)


def test_announce_range_ignores_padding_bins():
    params = params_with_bins(5)  # K = 8, bins 5..7 are padding
    freqs = np.array([0.1, 0.3, 0.2, 0.0, 0.1, 0.9, 0.9, 0.9])
    found = announce_range(freqs, params)
    assert found.bin == 1
    assert found.center == params.bin_center(1)
    assert (found.lower, found.upper) == (found.center - 3 * params.tau, found.center + 3 * params.tau)
    assert len(found.frequencies) == 5


def test_randomizer_validates_input():
    params = params_with_bins(3)
    with pytest.raises(InvalidParameter):
        randomize_range(np.zeros((2, 2)), params, 1.0, SeededSource(0))
    for eps in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(InvalidParameter):
            keep_probability(eps)
