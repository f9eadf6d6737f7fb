"""Tests for shuffledp.protocol.mechanisms.modular_sum (fixed point, shares mod q, decoding).

Statistical tests use fixed seeds (not chosen by trial) and a significance level
ALPHA from theory: chi-square quantiles for uniformity, and for means / variances
z-tests at 4 standard errors with the standard error computed from the exact
law (rounding_variance, cumulants of the discrete Laplace), never widened to pass.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from shuffledp.protocol.mechanisms.distributed_noise import discrete_laplace_variance, polya_shares
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.modular_sum import (
    MAX_MODULUS,
    FixedPoint,
    centered,
    decode_estimate,
    discrete_laplace_tail,
    modular_sum,
    split,
    wraparound_bound,
)
from shuffledp.protocol.mechanisms.randomness import SeededSource, SystemSource

ALPHA = 1e-3  # significance level of every chi-square test
Z = 4.0  # z-tests at 4 standard errors (two-sided level ~6e-5)


def _uniform_pvalue(cells: np.ndarray, k: int) -> float:
    """Chi-square GOF p-value of integer cell labels in [0, k) against the uniform law."""
    obs = np.bincount(cells, minlength=k)
    assert obs.size == k
    return float(stats.chisquare(obs).pvalue)


# --------------------------------------------------------------------------
# split: shares are uniform and hide the value
# --------------------------------------------------------------------------


@pytest.mark.parametrize("q", [11, 16])
def test_any_one_of_two_shares_is_uniform(q):
    n = 200_000
    src = SeededSource(101 + q)
    v = np.full(n, 7 % q, dtype=np.int64)
    sh = split(v, q, 2, src)
    assert sh.shape == (n, 2) and sh.dtype == np.int64
    assert np.all((sh >= 0) & (sh < q))
    assert np.all((sh.sum(axis=1) - v) % q == 0)
    for j in range(2):  # the drawn share and the computed one
        assert _uniform_pvalue(sh[:, j], q) > ALPHA


@pytest.mark.parametrize("q", [11, 16])
def test_any_two_of_three_shares_are_jointly_uniform(q):
    """M = 3, fixed value: every pair of shares is uniform on Z_q^2 (2-D chi-square, q^2 cells)."""
    n = 300_000
    src = SeededSource(202 + q)
    v = np.full(n, 5, dtype=np.int64)
    sh = split(v, q, 3, src)
    assert np.all(sh.sum(axis=1) % q == 5)
    for i, j in [(0, 1), (0, 2), (1, 2)]:
        assert _uniform_pvalue(sh[:, i] * q + sh[:, j], q * q) > ALPHA, (i, j)


def test_first_shares_do_not_depend_on_the_value():
    """Shares of different values: first M-1 coordinates identically distributed (2-sample chi-square)."""
    q, n = 11, 200_000
    src = SeededSource(303)
    a = split(np.zeros(n, dtype=np.int64), q, 3, src)
    b = split(np.full(n, 9, dtype=np.int64), q, 3, src)
    ca = np.bincount(a[:, 0] * q + a[:, 1], minlength=q * q)
    cb = np.bincount(b[:, 0] * q + b[:, 1], minlength=q * q)
    res = stats.chi2_contingency(np.vstack([ca, cb]), correction=False)
    assert res.pvalue > ALPHA
    # the last coordinate is also uniform in both cases (but determined by the value given the rest)
    assert _uniform_pvalue(a[:, 2], q) > ALPHA and _uniform_pvalue(b[:, 2], q) > ALPHA


def test_single_message_is_the_reduced_value():
    v = np.array([0, 3, -1, 25, -23], dtype=np.int64)
    sh = split(v, 11, 1, SeededSource(1))
    assert sh.shape == (5, 1)
    assert sh[:, 0].tolist() == [0, 3, 10, 3, 10]


def test_split_device_source():
    v = np.array([0, 1, 2**61, -5], dtype=np.int64)
    q = 2**62
    sh = split(v, q, 4, SystemSource())
    assert sh.shape == (4, 4)
    assert np.all((sh >= 0) & (sh < q))
    assert [sum(int(x) for x in row) % q for row in sh] == [int(x) % q for x in v]


def test_split_at_max_modulus_no_overflow():
    q = MAX_MODULUS
    v = np.array([q - 1, q - 2, 0, -(2**62)], dtype=np.int64)
    sh = split(v, q, 6, SeededSource(4))
    assert np.all((sh >= 0) & (sh < q))
    assert [sum(int(x) for x in row) % q for row in sh] == [int(x) % q for x in v]


# --------------------------------------------------------------------------
# modular_sum / centered: exact recovery without noise
# --------------------------------------------------------------------------


def test_modular_sum_large_entries_exact():
    q = MAX_MODULUS
    a = np.full(10_000, q - 1, dtype=np.int64)
    assert modular_sum(a, q) == (10_000 * (q - 1)) % q
    rng = np.random.default_rng(5)
    b = rng.integers(0, q, size=(300, 7), dtype=np.int64)
    assert modular_sum(b, q) == sum(int(x) for x in b.ravel()) % q
    c = rng.integers(-(2**63), 2**63 - 1, size=1000, dtype=np.int64)  # reduced mod q first
    assert modular_sum(c, q - 3) == sum(int(x) for x in c) % (q - 3)
    assert modular_sum(np.zeros(0, dtype=np.int64), 7) == 0


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(
    values=st.lists(st.integers(-(10**12), 10**12), min_size=1, max_size=60),
    messages=st.integers(1, 5),
    extra=st.integers(0, 2**40),
    seed=st.integers(0, 2**32),
)
def test_noiseless_split_sum_centered_recovers_exact_sum(values, messages, extra, seed):
    """Any integers (negative too), any q > 2 * max|partial sum|: the centered modular sum is the sum."""
    v = np.array(values, dtype=np.int64)
    bound = sum(abs(x) for x in values)
    q = min(MAX_MODULUS, max(2, 2 * bound + 1 + extra))
    sh = split(np.mod(v, q), q, messages, SeededSource(seed))
    assert sh.shape == (len(values), messages)
    assert centered(modular_sum(sh, q), q) == sum(values)


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(
    xs=st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=40),
    precision=st.integers(1, 2**20),
    seed=st.integers(0, 2**32),
)
def test_noiseless_decode_estimate_equals_encoded_sum(xs, precision, seed):
    fp = FixedPoint(-2.0, 3.0, precision)
    src = SeededSource(seed)
    enc = fp.encode(np.array(xs), src)
    n = len(xs)
    q = wraparound_bound(n, precision)
    est = decode_estimate(modular_sum(split(enc, q, 3, src), q), n, fp, q)
    assert est.encoded_total == int(enc.sum())
    assert est.sum == pytest.approx(fp.decode_sum(int(enc.sum()), n), rel=1e-12, abs=1e-9)
    assert est.mean == pytest.approx(est.sum / n)
    # rounding error is below one step per user
    clipped = np.clip(np.array(xs), -2.0, 3.0)
    assert abs(est.sum - clipped.sum()) <= n * fp.step * (1 + 1e-9) + 1e-9


def test_centered_range():
    assert centered(0, 10) == 0
    assert centered(5, 10) == 5  # q/2 belongs to (-q/2, q/2]
    assert centered(6, 10) == -4
    assert centered(5, 11) == 5 and centered(6, 11) == -5
    assert centered(-3, 10) == -3 and centered(23, 10) == 3
    arr = centered(np.arange(10), 10)
    assert arr.tolist() == [0, 1, 2, 3, 4, 5, -4, -3, -2, -1]


def test_wraparound_when_modulus_too_small():
    """Below the bound the centered value is off by a multiple of q (documented failure mode)."""
    q = 11
    values = [5, 4, 3]  # sum 12 > q/2
    s = centered(modular_sum(split(np.array(values), q, 2, SeededSource(9)), q), q)
    assert s != 12 and (s - 12) % q == 0


def test_wraparound_bound_and_tail():
    assert wraparound_bound(10, 10) == 201
    assert wraparound_bound(10, 10, 3) == 207
    assert wraparound_bound(1, 1, 0.25) == 3  # q > 2.5
    a, b = 0.8, 1e-12
    t = discrete_laplace_tail(a, b)
    assert 2 * a ** (t + 1) / (1 + a) <= b < 2 * a**t / (1 + a)


# --------------------------------------------------------------------------
# Fixed point: randomized rounding
# --------------------------------------------------------------------------


@pytest.mark.parametrize("x", [0.37, -0.999, 2.9])
def test_randomized_rounding_is_unbiased(x):
    fp = FixedPoint(-1.0, 3.0, 10)
    n = 10**6
    enc = fp.encode(np.full(n, x), SeededSource(int(1000 * (x + 2))))
    expected = 10 * (x + 1.0) / 4.0
    lo = math.floor(expected)
    assert set(np.unique(enc).tolist()) <= {lo, lo + 1}
    var = float(fp.rounding_variance(x, encoded=True))
    assert var == pytest.approx((expected - lo) * (1 - expected + lo))
    assert float(fp.rounding_variance(x)) == pytest.approx(var * fp.step**2)
    se = math.sqrt(var / n)
    assert abs(enc.mean() - expected) < Z * se
    # sample variance against the exact Bernoulli variance; se from kappa4 = v (1 - 6 v)
    se_var = math.sqrt((var * (1 - 6 * var) + 2 * var**2) / n)
    assert abs(enc.var(ddof=1) - var) < Z * se_var


def test_encode_clips_and_hits_endpoints():
    fp = FixedPoint(0.0, 1.0, 8)
    src = SeededSource(11)
    enc = fp.encode(np.array([-5.0, 0.0, 1.0, 7.0, 0.5, -np.inf, np.inf]), src)
    assert enc.tolist() == [0, 0, 8, 8, 4, 0, 8]
    assert fp.rounding_variance(np.array([0.0, 1.0, 0.5])).tolist() == [0.0, 0.0, 0.0]
    assert fp.decode_sum(16, 2) == pytest.approx(2.0)
    assert fp.decode_sum(np.array([0, 8]), 1).tolist() == [0.0, 1.0]


def test_encode_device_source():
    fp = FixedPoint(-1.0, 1.0, 4)
    enc = fp.encode(np.array([0.1, -0.6, 1.0]), SystemSource())
    assert enc[0] in (2, 3) and enc[1] in (0, 1) and enc[2] == 4


# --------------------------------------------------------------------------
# End to end with Pólya noise: variance of the decoded estimate
# --------------------------------------------------------------------------


def _dlap_kappa4(a: float) -> float:
    """Fourth cumulant of DLap(a) = G1 - G2, G geometric failures with success prob 1 - a."""
    return 2 * a * (1 + 4 * a + a * a) / (1 - a) ** 4


def test_decode_estimate_with_polya_noise_has_theoretical_variance():
    """Error (encoded units) = sum of rounding errors + DLap(alpha): variance n v_round + 2a/(1-a)^2."""
    n, trials, alpha, p, m = 200, 5000, 0.8, 16, 3
    fp = FixedPoint(0.0, 1.0, p)
    src = SeededSource(2024)
    x = src.generator.uniform(-0.1, 1.1, size=n)  # a few clipped users too
    f = fp.rounding_variance(x, encoded=True)  # per-user f(1-f)
    exact = float(fp.scaled(x).sum())
    tail = discrete_laplace_tail(alpha, 1e-15)
    q = wraparound_bound(n, p, tail)
    enc = fp.encode(np.tile(x, trials), src)
    noise = polya_shares(alpha, n, trials * n, src)
    shares = split(np.mod(enc + noise, q), q, m, src).reshape(trials, n, m)
    err = np.empty(trials)
    sums = np.empty(trials)
    for r in range(trials):
        est = decode_estimate(modular_sum(shares[r], q), n, fp, q)
        err[r] = est.encoded_total - exact
        sums[r] = est.sum
    # exact integer recovery (no wrap-around at this q): encoded_total is the true noisy sum
    rows = (enc + noise).reshape(trials, n).sum(axis=1)
    assert np.array_equal(err + exact, rows.astype(np.float64))
    assert np.allclose(sums, fp.decode_sum(rows, n))

    var_round = float(f.sum())
    var_noise = discrete_laplace_variance(alpha)
    assert var_noise == pytest.approx(2 * alpha / (1 - alpha) ** 2)
    sigma2 = var_round + var_noise
    # kappa4 of a centred Bernoulli(f): f(1-f)(1 - 6 f(1-f)); cumulants of independent terms add
    kappa4 = float(np.sum(f * (1 - 6 * f))) + _dlap_kappa4(alpha)
    se_var = math.sqrt((kappa4 + 2 * sigma2**2) / trials)
    assert abs(err.mean()) < Z * math.sqrt(sigma2 / trials)
    assert abs(err.var(ddof=1) - sigma2) < Z * se_var


# --------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, param",
    [
        (dict(lower=1.0, upper=1.0, precision=4), "upper"),
        (dict(lower=2.0, upper=1.0, precision=4), "upper"),
        (dict(lower=float("nan"), upper=1.0, precision=4), "lower"),
        (dict(lower=0.0, upper=float("inf"), precision=4), "upper"),
        (dict(lower=0.0, upper=1.0, precision=0), "precision"),
        (dict(lower=0.0, upper=1.0, precision=2**53), "precision"),
        (dict(lower=0.0, upper=1.0, precision=2.5), "precision"),
        (dict(lower=0.0, upper=1.0, precision=True), "precision"),
    ],
)
def test_fixed_point_validation(kwargs, param):
    with pytest.raises(InvalidParameter) as exc:
        FixedPoint(**kwargs)
    assert exc.value.parameter == param


def test_encode_validation():
    fp = FixedPoint(0.0, 1.0, 4)
    with pytest.raises(InvalidParameter, match="NaN"):
        fp.encode(np.array([0.1, np.nan]), SeededSource(0))
    with pytest.raises(InvalidParameter, match="1-d"):
        fp.encode(np.zeros((2, 2)), SeededSource(0))
    with pytest.raises(InvalidParameter, match="RandomSource"):
        fp.encode(np.zeros(2), np.random.default_rng(0))
    with pytest.raises(InvalidParameter, match="n"):
        fp.decode_sum(3, -1)


@pytest.mark.parametrize(
    "values, modulus, messages, param",
    [
        (np.array([1, 2]), 1, 2, "modulus"),
        (np.array([1, 2]), 2**62 + 1, 2, "modulus"),
        (np.array([1, 2]), 11.0, 2, "modulus"),
        (np.array([1, 2]), 11, 0, "messages"),
        (np.array([1, 2]), 11, 2.0, "messages"),
        (np.array([1.0, 2.0]), 11, 2, "values"),
        (np.array([True, False]), 11, 2, "values"),
        (np.zeros((2, 2), dtype=np.int64), 11, 2, "values"),
    ],
)
def test_split_validation(values, modulus, messages, param):
    with pytest.raises(InvalidParameter) as exc:
        split(values, modulus, messages, SeededSource(0))
    assert exc.value.parameter == param
    assert str(exc.value).startswith(f"{param}: ")


def test_sum_and_decode_validation():
    fp = FixedPoint(0.0, 1.0, 10)
    with pytest.raises(InvalidParameter, match="modulus"):
        modular_sum(np.array([1, 2]), 1)
    with pytest.raises(InvalidParameter, match="integers"):
        modular_sum(np.array([1.5]), 7)
    with pytest.raises(InvalidParameter, match="modulus"):
        centered(3, 2**63)
    with pytest.raises(InvalidParameter, match="wrap around"):
        decode_estimate(3, 10, fp, 200)  # 200 <= 2 * 10 * 10
    with pytest.raises(InvalidParameter, match="total_mod_q"):
        decode_estimate(201, 10, fp, 201)
    with pytest.raises(InvalidParameter, match="fixed_point"):
        decode_estimate(3, 10, object(), 201)
    with pytest.raises(InvalidParameter, match="n"):
        decode_estimate(3, 0, fp, 201)
    with pytest.raises(InvalidParameter, match="noise_tail"):
        wraparound_bound(10, 10, -1)
    with pytest.raises(InvalidParameter, match="users"):
        wraparound_bound(0, 10)
    with pytest.raises(InvalidParameter, match="alpha"):
        discrete_laplace_tail(1.0, 1e-9)
    with pytest.raises(InvalidParameter, match="failure_prob"):
        discrete_laplace_tail(0.5, 0.0)
