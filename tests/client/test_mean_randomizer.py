"""Projected mean report (client/mean_randomizer.py): unbiasedness, exact variance,
exact epsilon-LDP of the Laplace report, and the projection.

Statistical tests use fixed seeds and tolerances from the exact distributions:

* unbiasedness: Z = sum_i (x_i - E_i) / sqrt(sum_i var_i) over N users with known
  per-user means E_i = clip(y_i) and variances var_i = noise_variance +
  rounding_variance_i; |Z| below the normal quantile (N = 200000 independent
  terms: the CLT applies);
* variance: T = sum_i (x_i - E_i)^2 has mean sum_i var_i and variance
  sum_i (mu4_i - var_i^2), with the exact fourth central moments mu4_i computed
  from the noise pmf and the Bernoulli rounding; Z = (T - E T) / sd(T) is again
  compared with the normal quantile.

All comparisons of the unbiasedness/variance test share family-wise level
ALPHA = 1e-3 (Bonferroni over 4 configurations x 2 statistics); the chi-square
goodness-of-fit checks of the sampler share another ALPHA.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from shuffledp.client.mean_randomizer import (
    decode_values,
    gaussian_sigma2,
    laplace_scale,
    noise_variance,
    randomize_mean,
    rounding_variance,
    to_grid,
)
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.wire.messages import ProjectedMeanParams
from shuffledp.protocol.mechanisms.randomness import SeededSource

ALPHA = 1e-3

# (noise, grid_levels, epsilon, delta, seed). Small grids with a large epsilon make the
# rounding variance comparable to the noise variance, so both terms are tested.
CONFIGS = [
    ("laplace", 8, 20.0, 0.0, 101),
    ("laplace", 4096, 1.0, 0.0, 102),
    ("gaussian", 8, 20.0, 1e-6, 103),
    ("gaussian", 4096, 1.0, 1e-6, 104),
]
LOWER, UPPER = -1.0, 3.0


def noise_pmf(params: ProjectedMeanParams, epsilon: float, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """Support window and exact pmf (grid units) of the noise the module claims to add."""
    if params.noise == "laplace":
        scale = float(laplace_scale(params, epsilon))
        half = int(math.ceil(60 * scale)) + 5  # mass beyond < e^-60
        k = np.arange(-half, half + 1)
        q = math.exp(-1.0 / scale)
        p = (1 - q) / (1 + q) * np.exp(-np.abs(k) / scale)
    else:
        s2 = gaussian_sigma2(params, epsilon, delta)
        half = int(math.ceil(40 * math.sqrt(s2))) + 2  # mass beyond < e^-800
        k = np.arange(-half, half + 1)
        w = np.exp(-(k.astype(float) ** 2) / (2 * s2))
        p = w / w.sum()
    return k, p


def test_noise_variance_matches_noise_pmf():
    for noise, g, eps, delta, _ in CONFIGS:
        params = ProjectedMeanParams(LOWER, UPPER, noise, g)
        k, p = noise_pmf(params, eps, delta)
        assert abs(p.sum() - 1) < 1e-12
        grid_var = float(np.sum(p * k.astype(float) ** 2))
        assert noise_variance(params, eps, delta) == pytest.approx(grid_var * params.step**2, rel=1e-9)


def test_laplace_scale_is_sensitivity_over_epsilon():
    params = ProjectedMeanParams(LOWER, UPPER, "laplace", 4096)
    for eps in (0.1, 0.5, 1.0, 2.5):
        scale = laplace_scale(params, eps)
        assert isinstance(scale, Fraction)
        # sensitivity G (grid units) over scale is exactly epsilon
        assert Fraction(params.grid_levels) / scale == Fraction(eps)


def user_means(n: int, seed: int) -> np.ndarray:
    """Local means spread over and beyond [LOWER, UPPER] (a fifth of them clipped), plus boundary points."""
    # a stream distinct from SeededSource(seed): numpy's default_rng(seed) IS PCG64(SeedSequence(seed)),
    # and reusing it would correlate the data with the randomizer's coins
    rng = np.random.default_rng([seed, 0xDA7A])
    y = rng.uniform(LOWER - 0.5, UPPER + 0.5, size=n)
    y[:4] = [LOWER, UPPER, LOWER - 100.0, UPPER + 100.0]
    return y


@pytest.mark.parametrize("noise,g,eps,delta,seed", CONFIGS)
def test_unbiased_with_exact_variance(noise, g, eps, delta, seed):
    params = ProjectedMeanParams(LOWER, UPPER, noise, g)
    n = 200_000
    y = user_means(n, seed)
    x = decode_values(randomize_mean(y, params, eps, SeededSource(seed), delta=delta), params)
    expected = np.clip(y, LOWER, UPPER)

    step = params.step
    _, frac = to_grid(y, params)
    k, p = noise_pmf(params, eps, delta)
    kf = k.astype(float)
    noise_var = float(np.sum(p * kf**2)) * step**2
    noise_mu4 = float(np.sum(p * kf**4)) * step**4
    round_var = frac * (1 - frac) * step**2
    round_mu4 = frac * (1 - frac) * (1 - 3 * frac * (1 - frac)) * step**4
    var_i = noise_variance(params, eps, delta) + rounding_variance(y, params)
    np.testing.assert_allclose(var_i, noise_var + round_var, rtol=1e-9)
    mu4_i = noise_mu4 + 6 * noise_var * round_var + round_mu4

    z_crit = stats.norm.isf(ALPHA / (2 * len(CONFIGS)) / 2)
    resid = x - expected
    z_mean = resid.sum() / math.sqrt(var_i.sum())
    assert abs(z_mean) < z_crit, z_mean
    t = np.sum(resid**2)
    z_var = (t - var_i.sum()) / math.sqrt(np.sum(mu4_i - var_i**2))
    assert abs(z_var) < z_crit, z_var


class ScriptedSource:
    """Bernoulli draws and noise prescribed by the test (to read the mechanism off exactly)."""

    secure = False

    def __init__(self, round_up: bool) -> None:
        self.round_up = round_up
        self.p = None

    def integers(self, high, size):  # pragma: no cover - not used
        raise AssertionError

    def bernoulli(self, p, size):
        self.p = np.broadcast_to(np.asarray(p, dtype=float), (size,)).copy()
        return np.full(size, self.round_up)

    def discrete_laplace(self, scale, size):
        return np.zeros(size, dtype=np.int64)

    def discrete_gaussian(self, sigma2, size):
        return np.zeros(size, dtype=np.int64)


@pytest.mark.parametrize("g", [1, 8, 4096])
def test_randomized_rounding_is_exactly_unbiased(g):
    """E[grid] = (1-f) floor + f (floor+1) = projected value, from the probability actually passed."""
    params = ProjectedMeanParams(LOWER, UPPER, "laplace", g)
    y = np.concatenate([np.linspace(LOWER - 1, UPPER + 1, 1001), [LOWER, UPPER, np.nextafter(UPPER, 0)]])
    down_src, up_src = ScriptedSource(False), ScriptedSource(True)
    down = randomize_mean(y, params, 1.0, down_src)
    up = randomize_mean(y, params, 1.0, up_src)
    f = up_src.p
    assert np.all((0 <= f) & (f <= 1))
    assert np.all((0 <= down) & (up <= g))  # never leaves the grid {0..G}
    assert np.all((up - down == 1) | ((up == down) & ((f == 0) | (down == g))))
    mean = decode_values(down, params) * (1 - f) + decode_values(up, params) * f
    np.testing.assert_allclose(mean, np.clip(y, LOWER, UPPER), rtol=0, atol=1e-12 * (UPPER - LOWER))
    np.testing.assert_allclose(rounding_variance(y, params), f * (1 - f) * params.step**2, rtol=0, atol=1e-15)


def test_projection_clips_out_of_range_means():
    params = ProjectedMeanParams(LOWER, UPPER, "laplace", 64)
    floor, frac = to_grid(np.array([LOWER - 5, -1e300, UPPER + 5, 1e300, LOWER, UPPER]), params)
    assert floor.tolist() == [0, 0, 64, 64, 0, 64]
    assert frac.tolist() == [0.0] * 6
    assert rounding_variance(np.array([LOWER - 5, UPPER + 5]), params).tolist() == [0.0, 0.0]
    # a whole population far above the range decodes, on average, to the upper end
    n, eps = 100_000, 5.0
    x = decode_values(randomize_mean(np.full(n, UPPER + 50.0), params, eps, SeededSource(7)), params)
    sd = math.sqrt(noise_variance(params, eps) / n)
    assert abs(x.mean() - UPPER) < stats.norm.isf(ALPHA / 2) * sd


# --------------------------------------------------------------------------
# exact epsilon-LDP of the Laplace report
# --------------------------------------------------------------------------


def log_output_pmf(y: float, params: ProjectedMeanParams, epsilon: float, k: np.ndarray) -> np.ndarray:
    """log P(report = k | local mean y): randomized rounding to {floor, floor+1}, then discrete Laplace."""
    floor, frac = to_grid(np.array([y]), params)
    fl, f = int(floor[0]), float(frac[0])
    scale = float(laplace_scale(params, epsilon))
    q = math.exp(-1.0 / scale)
    log_norm = math.log((1 - q) / (1 + q))
    lo = log_norm - np.abs(k - fl) / scale
    hi = log_norm - np.abs(k - min(fl + 1, params.grid_levels)) / scale
    if f == 0.0:
        return lo
    return np.logaddexp(math.log1p(-f) + lo, math.log(f) + hi)


@pytest.mark.parametrize("epsilon", [0.25, 1.0, 3.0])
@pytest.mark.parametrize("g", [1, 4, 16])
def test_laplace_report_exact_ldp(g, epsilon):
    params = ProjectedMeanParams(0.0, 1.0, "laplace", g)
    # beyond this window log P(k|y) is linear in k with slope +-1/scale for every input,
    # so ratios there equal those at the window's ends
    k = np.arange(-3 * g - 5, 4 * g + 6)
    inputs = [-1.0, 0.0, 1.0, 2.0] + list(np.linspace(0, 1, 4 * g + 1)) + [0.37 / g, 1 - 0.61 / g]
    logs = np.array([log_output_pmf(y, params, epsilon, k) for y in inputs])
    worst = float((logs.max(axis=0) - logs.min(axis=0)).max())
    assert worst <= epsilon * (1 + 1e-12) + 1e-12
    # attained by the grid endpoints 0 and G (inputs lower and upper)
    endpoints = log_output_pmf(0.0, params, epsilon, k) - log_output_pmf(1.0, params, epsilon, k)
    assert np.abs(endpoints).max() == pytest.approx(epsilon, rel=1e-12)
    # analytically: log P(k|0) - log P(k|G) = (|k - G| - |k|) / scale = G / scale = eps for k <= 0
    assert endpoints[k <= 0] == pytest.approx(float(Fraction(g) / laplace_scale(params, epsilon)), rel=1e-12)


# (grid_levels, epsilon, local mean, seed) for the sampler checks
SAMPLER_CASES = [(8, 2.0, 0.0, 31), (8, 2.0, 1.0, 32), (8, 2.0, 0.3, 33), (16, 0.5, 0.71, 34)]


@pytest.mark.parametrize("g,eps,y,seed", SAMPLER_CASES)
def test_sampler_matches_exact_output_pmf(g, eps, y, seed):
    """Chi-square goodness of fit at level ALPHA / len(SAMPLER_CASES); bins pooled to >= 20 expected."""
    params = ProjectedMeanParams(0.0, 1.0, "laplace", g)
    n = 60_000
    out = randomize_mean(np.full(n, y), params, eps, SeededSource(seed))
    scale = float(laplace_scale(params, eps))
    half = int(60 * scale) + g + 5
    k = np.arange(-half, half + 1)
    p = np.exp(log_output_pmf(y, params, eps, k))
    assert abs(p.sum() - 1) < 1e-12 and out.min() >= -half and out.max() <= half
    counts = np.bincount(out + half, minlength=len(k))
    # pool the tails until every pooled bin expects at least 20
    expected = n * p
    keep = expected >= 20
    first, last = np.argmax(keep), len(k) - 1 - np.argmax(keep[::-1])
    obs = np.concatenate([[counts[: first + 1].sum()], counts[first + 1 : last], [counts[last:].sum()]])
    exp = np.concatenate([[expected[: first + 1].sum()], expected[first + 1 : last], [expected[last:].sum()]])
    _, pvalue = stats.chisquare(obs, exp * obs.sum() / exp.sum())
    assert pvalue > ALPHA / len(SAMPLER_CASES)


def test_invalid_parameters():
    params = ProjectedMeanParams(0.0, 1.0, "laplace", 8)
    with pytest.raises(InvalidParameter):
        laplace_scale(params, 0.0)
    with pytest.raises(InvalidParameter):
        gaussian_sigma2(ProjectedMeanParams(0.0, 1.0, "gaussian", 8), 1.0, 0.0)
    with pytest.raises(InvalidParameter):
        randomize_mean(np.zeros((2, 2)), params, 1.0, SeededSource(0))
