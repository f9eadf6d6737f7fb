"""The JavaScript client's samplers against the exact laws, and its rotation signs against numpy.

Draws come from ``js/test/support/draw.mjs`` (the compiled package). The laws are checked on
``SeededSource`` with fixed seeds, so each check is reproducible; both sources feed the same
samplers (``WordSource``) and differ only in where their 32-bit words come from, so one more
check runs the platform CSPRNG (``SystemSource``, not reproducible) through the uniform
integers at a false-failure probability of ``SYSTEM_FALSE_FAILURE = 1e-9``, which a source that
is not uniform fails at once. Each law is checked by a chi-square goodness-of-fit test
against its exact pmf, after merging bins until every expected count is at least 5 (the
usual condition for the chi-square approximation). The threshold is the chi-square
quantile at ``1 - FALSE_FAILURE``: an exact sampler fails a check with probability
about ``FALSE_FAILURE = 1e-4`` over seeds (up to the chi-square approximation).

The rotation signs and the rotation itself must equal Python's ``RandomRotation`` exactly
(bit for bit): the signs come from the same generator (numpy's SeedSequence, PCG64 and
bounded integers, reimplemented), and ``apply`` performs the same IEEE-754 double
operations in the same order (one multiply by a sign, the FWHT butterflies ``top +
bottom`` / ``top - bottom`` stage by stage, one multiply by the correctly rounded
``1/sqrt(D)``), each correctly rounded in both languages; so no tolerance is needed.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from scipy import special, stats

from shuffledp.protocol.mechanisms.rotation import RandomRotation

from .conftest import run_node

DRAW = Path(__file__).resolve().parents[2] / "js" / "test" / "support" / "draw.mjs"

#: Probability that one chi-square test below fails although the sampler is exact.
FALSE_FAILURE = 1e-4
#: The same for the one check on the platform CSPRNG, whose draws no seed fixes.
SYSTEM_FALSE_FAILURE = 1e-9
N_DRAWS = 200_000


def draw(sampler: str, params: dict, count: int = 0, seed: int | None = None, dtype=np.int64) -> np.ndarray:
    request = {"sampler": sampler, "params": params, "count": count, "seed": None if seed is None else str(seed)}
    out = run_node(DRAW, input=json.dumps(request).encode(), timeout=120)
    return np.frombuffer(out, dtype=np.dtype(dtype).newbyteorder("<"))


def chi_square_check(samples: np.ndarray, pmf: dict[int, float], false_failure: float = FALSE_FAILURE) -> None:
    """Chi-square goodness of fit of integer ``samples`` to ``pmf`` (a dict k -> P(k)).

    ``pmf`` covers a contiguous range ``[lo, hi]``; samples below ``lo`` (above ``hi``) are
    counted in the first (last) bin, whose expected probability gets half of the mass outside
    the range (``1 - sum``): the laws tested are symmetric or have no mass outside.
    """
    keys = sorted(pmf)
    lo, hi = keys[0], keys[-1]
    probs = np.array([pmf[k] for k in keys], dtype=np.float64)
    below = max(0.0, 1.0 - probs.sum()) / 2  # symmetric or negligible tails: split evenly
    probs[0] += below
    probs[-1] += below
    clipped = np.clip(samples, lo, hi) - lo
    observed = np.bincount(clipped, minlength=len(keys)).astype(np.float64)
    expected = probs * len(samples)
    # Merge adjacent bins from the left until each has expected >= 5; a short remainder
    # joins the last merged bin.
    merged_obs: list[float] = []
    merged_exp: list[float] = []
    acc_o = acc_e = 0.0
    for o, e in zip(observed, expected):
        acc_o += o
        acc_e += e
        if acc_e >= 5.0:
            merged_obs.append(acc_o)
            merged_exp.append(acc_e)
            acc_o = acc_e = 0.0
    if acc_e > 0.0 or acc_o > 0.0:
        merged_obs[-1] += acc_o
        merged_exp[-1] += acc_e
    o = np.array(merged_obs)
    e = np.array(merged_exp)
    statistic = float(((o - e) ** 2 / e).sum())
    df = len(o) - 1
    threshold = float(stats.chi2.ppf(1.0 - false_failure, df))
    assert df >= 1, f"too few bins ({len(o)}) for a meaningful test"
    assert statistic <= threshold, f"chi-square {statistic:.1f} > {threshold:.1f} (df {df})"


def discrete_laplace_pmf(q: float, radius: int) -> dict[int, float]:
    """``P(k) = (1-q)/(1+q) q^|k|`` on ``[-radius, radius]``."""
    c = (1.0 - q) / (1.0 + q)
    return {k: c * q ** abs(k) for k in range(-radius, radius + 1)}


def discrete_gaussian_pmf(sigma2: float) -> dict[int, float]:
    radius = int(40 * math.sqrt(sigma2)) + 10  # outside: mass below exp(-800)
    ks = np.arange(-radius, radius + 1)
    w = np.exp(-(ks.astype(np.float64) ** 2) / (2.0 * sigma2))
    w /= w.sum()
    return dict(zip(ks.tolist(), w.tolist()))


def skellam_pmf(mu: float, radius: int) -> dict[int, float]:
    """``P(k) = exp(-2 mu) I_|k|(2 mu)`` (difference of two Poisson(mu)); ``ive`` is ``I_v(x) e^-x``."""
    return {k: float(special.ive(abs(k), 2.0 * mu)) for k in range(-radius, radius + 1)}


def test_discrete_laplace_law(js_package):
    # scale t/s = 7/3: q = exp(-3/7); a non-integer scale exercises Y = floor(X / s).
    samples = draw("discreteLaplace", {"num": "7", "den": "3"}, N_DRAWS, seed=101)
    chi_square_check(samples, discrete_laplace_pmf(math.exp(-3 / 7), 60))


def test_discrete_gaussian_law(js_package):
    # sigma2 = 0.1 (as its exact double) and 9/2: a tiny and a moderate variance.
    sigma2 = Fraction(0.1)
    samples = draw("discreteGaussian", {"num": str(sigma2.numerator), "den": str(sigma2.denominator)}, N_DRAWS // 4, seed=102)
    chi_square_check(samples, discrete_gaussian_pmf(float(sigma2)))
    samples = draw("discreteGaussian", {"num": "9", "den": "2"}, N_DRAWS, seed=103)
    chi_square_check(samples, discrete_gaussian_pmf(4.5))


def test_polya_shares_sum_is_discrete_laplace(js_package):
    # The sum of `users` shares is DLap(alpha) (up to the double-precision gamma step, far
    # below what 50k samples can detect).
    alpha, users, sums = 0.7, 3, 50_000
    shares = draw("polyaShares", {"alpha": alpha, "users": users}, users * sums, seed=104)
    total = shares.reshape(sums, users).sum(axis=1)
    chi_square_check(total, discrete_laplace_pmf(alpha, 80))


def test_skellam_shares_and_their_sum(js_package):
    # mu / users = 3/4 exercises the binomial thinning of the exact Poisson.
    mu, users, sums = 3.0, 4, 50_000
    shares = draw("skellamShares", {"mu": mu, "users": users}, users * sums, seed=105)
    chi_square_check(shares, skellam_pmf(mu / users, 40))
    chi_square_check(shares.reshape(sums, users).sum(axis=1), skellam_pmf(mu, 60))


def test_uniform_integers_and_bernoulli(js_package):
    samples = draw("integer", {"high": "7"}, N_DRAWS // 4, seed=106)
    chi_square_check(samples, {k: 1 / 7 for k in range(7)})
    # p = 0.3 realises floor(0.3 * 2^53) / 2^53, within 2^-53 of 0.3; a two-outcome test
    # with expected counts in the tens of thousands cannot see that difference.
    flips = draw("bernoulli", {"p": 0.3}, N_DRAWS // 4, seed=107)
    chi_square_check(flips, {0: 0.7, 1: 0.3})


def test_the_platform_csprng_feeds_the_samplers_uniformly(js_package):
    samples = draw("integer", {"high": "7"}, N_DRAWS // 4)  # SystemSource: no seed
    chi_square_check(samples, {k: 1 / 7 for k in range(7)}, SYSTEM_FALSE_FAILURE)


SEEDS = [0, 1, 2**63, 2**64 - 1, 12345]
DIMS = [1, 3, 8, 100, 1024]


@pytest.mark.parametrize("seed", SEEDS)
def test_rotation_signs_equal_numpy(js_package, seed):
    for dim in DIMS:
        js = draw("rotationSigns", {"dim": dim, "seed": str(seed)}, dtype=np.float64)
        np.testing.assert_array_equal(js, RandomRotation(dim, seed).signs, err_msg=f"dim {dim}")


@pytest.mark.parametrize("dim", [1, 5, 100, 1024])
def test_rotation_apply_equals_python_bit_for_bit(js_package, dim):
    rng = np.random.default_rng(dim)
    x = rng.normal(size=dim) * 10.0 ** rng.integers(-3, 4, size=dim)
    seed = 2**64 - 1 - dim
    js = draw("rotationApply", {"dim": dim, "seed": str(seed), "x": x.tolist()}, dtype=np.float64)
    np.testing.assert_array_equal(js, RandomRotation(dim, seed).apply(x))
