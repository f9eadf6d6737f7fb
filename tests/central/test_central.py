"""Central-model baselines (shuffledp.central): privacy calibration, clipping, consistency.

Statistical checks use fixed seeds. Unless stated otherwise a check is a two-sided test at
Z_CRIT = 4.5 standard errors (P(|N(0,1)| > 4.5) = 6.8e-6) or a chi-square test at tail
probability CHI_TAIL = 1e-6 per side; each derives its standard error in a comment.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from shuffledp.central import (
    PAPER_SPLIT,
    RELEASED_CODE_SPLIT,
    ApproxDP,
    BudgetSplit,
    HeavyTailedPopulation,
    ZCDP,
    advanced_composition_epsilon,
    clip_and_noise,
    clipped_mean,
    clipping_radius,
    clipping_rank,
    coarse_bucket_width,
    coarse_estimate,
    error_ratio,
    gaussian_concentration_radius,
    gaussian_sigma,
    heavy_tailed_mean,
    instance_optimal_mean,
    per_coordinate_pure_epsilon,
    private_quantile,
    private_range,
    pure_dp_to_zcdp,
    quantile_rank_error,
    rho_for_approx_dp,
    winsorized_mean,
    winsorized_mean_1d,
    zcdp_epsilon,
)
from shuffledp.central._data import clip_to_ball, clipped_average
from shuffledp.central.instance_optimal import gaussian_composition_rho
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.gaussian_calibration import analytic_gaussian_sigma, gaussian_delta
from shuffledp.protocol.mechanisms.rotation import RandomRotation

Z_CRIT = 4.5
CHI_TAIL = 1e-6


def _chi2_ok(statistic: float, dof: int) -> bool:
    p = stats.chi2.cdf(statistic, dof)
    return CHI_TAIL < p < 1.0 - CHI_TAIL


# --------------------------------------------------------------------------
# privacy conversions
# --------------------------------------------------------------------------


@pytest.mark.parametrize("epsilon, delta", [(0.1, 1e-9), (1.0, 1e-6), (8.0, 1e-5)])
def test_rho_for_approx_dp_inverts_the_zcdp_conversion(epsilon, delta):
    rho = rho_for_approx_dp(epsilon, delta)
    assert zcdp_epsilon(rho, delta) == pytest.approx(epsilon, rel=1e-12)
    assert ApproxDP(epsilon, delta).as_rho() == rho


def test_gaussian_sigma_matches_the_two_calibrations():
    assert gaussian_sigma(2.0, ZCDP(0.5)) == pytest.approx(2.0)  # Delta / sqrt(2 rho)
    assert gaussian_sigma(0.3, ApproxDP(2.0, 1e-6)) == analytic_gaussian_sigma(2.0, 1e-6, 0.3)
    assert pure_dp_to_zcdp(0.4) == pytest.approx(0.08)


def test_per_coordinate_epsilon_composes_back_to_the_budget():
    # zCDP: D coordinates of eps0^2/2 each add up to rho exactly.
    eps0 = per_coordinate_pure_epsilon(ZCDP(0.5), 64)
    assert 64 * eps0**2 / 2 == pytest.approx(0.5)
    # (eps, delta): whichever route is taken, the D-fold composition meets (eps, delta).
    for eps, delta, D in [(1.0, 1e-6, 16), (0.5, 1e-8, 1024), (50.0, 0.1, 1)]:
        spec = ApproxDP(eps, delta)
        e0 = per_coordinate_pure_epsilon(spec, D)
        via_zcdp = zcdp_epsilon(D * e0**2 / 2, delta) <= eps * (1 + 1e-12)
        via_advanced = advanced_composition_epsilon(e0, D, delta) <= eps * (1 + 1e-12)
        assert via_zcdp or via_advanced
    # Levy et al.'s eps / sqrt(8 d log(1/delta)) is invalid when eps > 2 log(1/delta):
    # at eps = 50, delta = 0.1, d = 1 it gives eps0 = 11.6 and the exact advanced
    # composition bound 11.6 (sqrt(2 log 10) + e^11.6 - 1) >> 50. The function falls back.
    levy = 50.0 / math.sqrt(8 * math.log(10.0))
    assert advanced_composition_epsilon(levy, 1, 0.1) > 50.0
    assert per_coordinate_pure_epsilon(ApproxDP(50.0, 0.1), 1) < levy


# --------------------------------------------------------------------------
# Levy et al.: winsorized mean
# --------------------------------------------------------------------------


def test_winsorized_1d_noise_is_the_printed_laplace():
    # Fixed data in [-1.5, 1.5]; B = 10, tau = 4: bins [-10,-2), [-2,6), [6,14) with midpoints
    # -6, 2, 10. Every X'_i is 2, so c(2) = 0 and c(-6) = c(10) = n: the exponential mechanism
    # picks 2 except w.p. 2 exp(-eps n / 4) (eps/2 for the range, /2 in the exponent), i.e.
    # never here, and [2 - 8, 2 + 8] holds all data. So output - mean(data) ~ Lap(8 tau/(eps n)).
    n, eps, tau, bound = 2000, 1.0, 4.0, 10.0
    x = np.random.default_rng(1).uniform(-1.5, 1.5, n)
    S = 3000
    resid = np.array([winsorized_mean_1d(x, eps, tau, bound, np.random.default_rng([7, s])) for s in range(S)]) - x.mean()
    b = 8 * tau / (eps * n)
    # Kolmogorov-Smirnov against Lap(b): p > 1e-5.
    assert stats.kstest(resid, stats.laplace(scale=b).cdf).pvalue > 1e-5
    # Variance: E[r^2] = 2 b^2; Var(r^2) = E r^4 - (E r^2)^2 = 24 b^4 - 4 b^4 = 20 b^4, so the
    # mean of S squares has relative sd sqrt(20 b^4 / S) / (2 b^2) = sqrt(5 / S).
    assert abs(np.mean(resid**2) / (2 * b * b) - 1) < Z_CRIT * math.sqrt(5 / S)


def test_private_range_finds_the_bulk():
    # (tau, 0)-concentrated data (all within tau = 0.5 of 3): Thm. 1's proof says the range
    # holds them all unless the mechanism picks a bin 2+ away, w.p. <= (B/tau) e^(-n eps/8).
    x = np.random.default_rng(2).uniform(2.6, 3.4, 500)
    a, b = private_range(x, 2.0, 0.5, 20.0, np.random.default_rng(3))
    assert b - a == pytest.approx(2.0)  # width 4 tau
    assert a <= x.min() and x.max() <= b


def test_winsorized_outlier_moves_the_estimate_by_at_most_the_sensitivity():
    # Same seed, one user replaced by the far end of the box. With the same Gumbel and
    # Laplace draws the chosen range is unchanged (costs move by <= 1, the margin is ~n),
    # so only the clipped mean moves, by at most (range width) / n = 4 tau / n.
    n, eps, tau, bound = 500, 1.0, 4.0, 10.0
    x = np.random.default_rng(4).uniform(-1.5, 1.5, n)
    y = x.copy()
    y[0] = bound
    for s in range(20):
        diff = winsorized_mean_1d(y, eps, tau, bound, np.random.default_rng(s)) - winsorized_mean_1d(x, eps, tau, bound, np.random.default_rng(s))
        assert 0 < diff <= 4 * tau / n + 1e-12
    # High-D: per rotated coordinate the clipped mean moves by <= 4 tau'/n, so in l2 by
    # <= 4 tau' sqrt(D) / n; the rotation is orthogonal.
    d = 16
    X = np.random.default_rng(5).uniform(-0.3, 0.3, (n, d))  # |(U x)_j| <= ||x||_1 / 4 <= 1.2
    Y = X.copy()
    Y[0] = 2.5
    for s in range(10):
        a = winsorized_mean(X, ZCDP(0.5), np.random.default_rng(s), bound=2.5, coordinate_radius=4.0).estimate
        b = winsorized_mean(Y, ZCDP(0.5), np.random.default_rng(s), bound=2.5, coordinate_radius=4.0).estimate
        assert np.linalg.norm(a - b) <= 4 * 4.0 * math.sqrt(d) / n + 1e-12


def test_winsorized_high_d_noise_variance_matches_the_calibration():
    # Fixed data as in the outlier test: every rotated coordinate lies in [-1.2, 1.2], inside
    # the bin [-2, 6) of B_rot = sqrt(16) * 2.5 = 10, tau' = 4, so every range is [-6, 10]
    # and est - mean = U^T L with L i.i.d. Lap(b), b = 8 tau' / (eps0 n), eps0 = sqrt(2 rho / D).
    # d = D = 16, so ||U^T L||^2 = ||L||^2 and (as in the 1-D test) the mean of the d S
    # squares has relative sd sqrt(5 / (d S)).
    n, d, rho, S = 500, 16, 0.5, 300
    X = np.random.default_rng(5).uniform(-0.3, 0.3, (n, d))
    total = 0.0
    for s in range(S):
        r = winsorized_mean(X, ZCDP(rho), np.random.default_rng([11, s]), bound=2.5, coordinate_radius=4.0)
        total += np.sum((r.estimate - X.mean(axis=0)) ** 2)
    eps0 = math.sqrt(2 * rho / d)
    assert r.epsilon0 == pytest.approx(eps0)
    b = 8 * 4.0 / (eps0 * n)
    assert r.laplace_scale == pytest.approx(b)
    assert abs(total / (S * d * 2 * b * b) - 1) < Z_CRIT * math.sqrt(5 / (d * S))


@pytest.mark.parametrize("n", [500, 8000])
def test_winsorized_high_d_is_unbiased_with_the_theoretical_error(n):
    # N(mu, I) samples, m = 2 per user (the (n, m, d) input path). If every range holds its
    # coordinate's data (w.p. >= 1 - gamma - ... by Thm. 2), the error is g + U^T L with
    # g ~ N(0, I/(n m)) and L i.i.d. Lap(b): E||e||^2 = d/(n m) + 2 d b^2 and
    # Var||e||^2 = 2 d s^4 + 20 d b^4 + 8 d s^2 b^2 (s^2 = 1/(n m); d = D so ||U^T L|| = ||L||).
    d, m, rho, S = 16, 2, 0.5, 60
    mu = 0.5 * np.sin(np.arange(1, d + 1))
    tau = gaussian_concentration_radius(1.0, d, m, n, 0.01)
    sq = []
    for s in range(S):
        rng = np.random.default_rng([n, s])
        data = mu + rng.standard_normal((n, m, d))
        r = winsorized_mean(data, ZCDP(rho), rng, bound=10.0, tau=tau, gamma=0.01)
        sq.append(np.sum((r.estimate - mu) ** 2))
    s2, b = 1.0 / (n * m), r.laplace_scale
    mean_theory = d * s2 + 2 * d * b * b
    sd_theory = math.sqrt(2 * d * s2**2 + 20 * d * b**4 + 8 * d * s2 * b * b) / math.sqrt(S)
    assert abs(np.mean(sq) - mean_theory) < Z_CRIT * sd_theory


def test_rotated_coordinate_bound_is_sqrt_d_times_b():
    # Levy et al. Alg. 2 line 3 prints the 1-D range as sqrt(dB); the bound is sqrt(d) B:
    # x_k = B sign(U_jk) attains |(U x)_j| = B sum_k |U_jk| = B d / sqrt(d) = sqrt(d) B.
    d, B = 16, 3.0
    U = RandomRotation(d, 1).matrix()
    x = B * np.sign(U[5])
    assert abs(U[5] @ x) == pytest.approx(math.sqrt(d) * B)
    assert math.sqrt(d * B) < math.sqrt(d) * B  # the printed form would clip this user


# --------------------------------------------------------------------------
# Huang, Liang & Yi: instance-optimal (shifted clipped) mean
# --------------------------------------------------------------------------


def test_private_quantile_rank_error_is_within_the_bound():
    # 400 independent searches (columns) over the same 1000 values at rho = 0.05, T = 16:
    # each misses tau = quantile_rank_error(rho, T, beta) w.p. <= beta = 0.1 (union bound),
    # plus the points inside the final interval (width 10 / 2^16; ~0 of 1000 N(0,1) values).
    n, k, rho, T, beta = 1000, 400, 0.05, 16, 0.1
    x = np.random.default_rng(8).standard_normal(n)
    out = private_quantile(np.repeat(x[:, None], k, axis=1), 700, -5.0, 5.0, rho, T, np.random.default_rng(9))
    ranks = np.searchsorted(np.sort(x), out, side="right")
    tau = quantile_rank_error(rho, T, beta)
    misses = int(np.sum(np.abs(ranks - 700) > tau + 2))
    # Binomial(400, <= 0.1): mean <= 40, sd <= 6.
    assert misses <= 40 + Z_CRIT * 6
    assert abs(np.median(ranks) - 700) < 10  # the noise is centred


def test_clipping_rank_is_lemma_3s_minimiser_with_the_noise_budget():
    # Lemma 3: E(C) = (1/n) sum (r_i - C)_+ + C sqrt(2d/rho_noise) / n on the shifted norms
    # r_i; its minimiser leaves sqrt(2d/rho_noise) points above C. With rho = 0.5 the noise
    # gets 9/16 rho (PAPER_SPLIT); Sec. 3.2 prints sqrt(2d/rho) with Theorem 2's rho = 3/4 of
    # it, which leaves sqrt(3/4) = 0.87 times the minimiser's count above C (74 vs 85 here).
    n, d, rho = 20000, 1024, 0.5
    r = np.sort(np.linalg.norm(np.random.default_rng(10).standard_normal((n, d)), axis=1))
    rho_noise = PAPER_SPLIT.noise * rho
    slope = math.sqrt(2 * d / rho_noise)
    cost = np.array([np.sum(np.maximum(r - c, 0)) + c * slope for c in r]) / n
    above_at_min = n - 1 - int(np.argmin(cost))
    assert abs(above_at_min - slope) <= 1
    # Our rank (tau small at rho_quantile = 100) is the minimiser; the printed one is not.
    assert n - clipping_rank(n, d, rho_noise, 100.0, 16) == pytest.approx(slope)
    printed = math.sqrt(2 * d / (0.75 * rho))
    assert abs(printed - above_at_min) > 10


def test_clipped_mean_outlier_moves_it_by_at_most_2c_over_n():
    n, d, C = 300, 8, 2.0
    x = np.random.default_rng(12).standard_normal((n, d))
    y = x.copy()
    y[3] = 1e9
    for s in range(10):
        a, _ = clipped_mean(x, C, 0.5, np.random.default_rng(s))
        b, _ = clipped_mean(y, C, 0.5, np.random.default_rng(s))
        assert np.linalg.norm(a - b) <= 2 * C / n + 1e-12


def _hly_deterministic_part(means, result):
    """``U^T (clipped mean + shift)`` recomputed from the diagnostics (no noise)."""
    d = means.shape[1]
    x, _ = clip_to_ball(means, np.zeros(d), result.radius)
    x_hat = RandomRotation(d, result.rotation_seed).apply(x)
    average, clipped = clipped_average(x_hat - result.shift, np.zeros(x_hat.shape[1]), result.threshold)
    return RandomRotation(d, result.rotation_seed).inverse(average + result.shift), x_hat, clipped


def test_instance_optimal_noise_is_the_calibrated_gaussian():
    # Data fixed, d = 12 (padded to D = 16). Given the private shift c and threshold C (in the
    # diagnostics), est = U^T(clipped mean + c + w)[:d] with w ~ N(0, sigma^2 I_D),
    # sigma = 2C / (n sqrt(2 rho_noise)); the first d coordinates of U^T w are i.i.d.
    # N(0, sigma^2) (U orthogonal). So sum_t ||r_t||^2 / sigma_t^2 ~ chi2(d S).
    n, d, rho, S = 800, 12, 0.5, 150
    means = np.random.default_rng(13).standard_normal((n, d)) + 2.0
    stat = 0.0
    for s in range(S):
        res = instance_optimal_mean(means, ZCDP(rho), np.random.default_rng([14, s]), radius=30.0)
        assert res.noise_sigma == pytest.approx(2 * res.threshold / (n * math.sqrt(2 * PAPER_SPLIT.noise * rho)))
        det, _, _ = _hly_deterministic_part(means, res)
        stat += np.sum((res.estimate - det) ** 2) / res.noise_sigma**2
    assert _chi2_ok(stat, d * S)


def test_instance_optimal_outlier_effect_is_bounded():
    # Same seed, user 0 replaced by a point of norm 1e6 (projected to the public ball of
    # radius R, then clipped at C). The noise draws are identical; the shift c and threshold
    # C may move (each count moves by <= 1). clip_C(a) + c is 1-Lipschitz in a, in C and in
    # c, and equals x_hat_i when ||x_hat_i - c|| <= C, so a user unclipped in both runs adds 0;
    # one clipped in either run moves by <= 2||dc|| + |dC|; user 0 by <= C + C' + ||dc||.
    # Hence ||est' - est|| <= (C + C' + ||dc|| + K (2||dc|| + |dC|)) / n, K = those clipped.
    n, d, R = 1000, 16, 40.0
    x = np.random.default_rng(15).standard_normal((n, d))
    y = x.copy()
    y[0] = 1e6 / math.sqrt(d)
    for s in range(8):
        a = instance_optimal_mean(x, ZCDP(0.5), np.random.default_rng(s), radius=R)
        b = instance_optimal_mean(y, ZCDP(0.5), np.random.default_rng(s), radius=R)
        _, xa, _ = _hly_deterministic_part(x, a)
        dc = float(np.linalg.norm(a.shift - b.shift))
        dC = abs(a.threshold - b.threshold)
        na = np.linalg.norm(xa - a.shift, axis=1) > a.threshold
        nb = np.linalg.norm(xa - b.shift, axis=1) > b.threshold
        K = int(np.sum((na | nb)[1:]))
        bound = (a.threshold + b.threshold + dc + K * (2 * dc + dC)) / n
        assert np.linalg.norm(a.estimate - b.estimate) <= bound + 1e-9
        assert np.linalg.norm(a.estimate - b.estimate) <= 8 * a.threshold / n  # and it is small


@pytest.mark.parametrize("n", [1000, 16000])
def test_instance_optimal_error_is_sampling_plus_calibrated_noise(n):
    # N(mu, I_d) users. e = (xbar - mu) + (clipping bias) + U^T w: xbar - mu ~ N(0, I/n),
    # w ~ N(0, sigma_t^2 I) given the run's C. The clipping bias is a sum of ~n - rank
    # (>= 31 here) clipped excesses in random directions, ~ sqrt(31) * 0.5 / n, below 1 % of
    # the error's sd, so sum_t ||e_t||^2 / (1/n + sigma_t^2) ~ chi2(d S) (unbiased; error ->
    # sqrt(d/n) as n grows since sigma_t^2 = O(1/n^2)).
    d, rho, S = 16, 0.5, 80
    mu = 3.0 * np.sin(np.arange(1, d + 1))
    stat = 0.0
    for s in range(S):
        rng = np.random.default_rng([n, 99, s])
        x = mu + rng.standard_normal((n, d))
        res = instance_optimal_mean(x, ZCDP(rho), rng, radius=100.0)
        stat += np.sum((res.estimate - mu) ** 2) / (1.0 / n + res.noise_sigma**2)
    assert _chi2_ok(stat, d * S)


def test_instance_optimal_ratio_at_small_d_matches_its_prediction_and_the_published_figure():
    # Quick version of the benchmark's HLY panel at d = 16 (n = 4000, N(0, I), rho = 0.5).
    # Given the run's sigma_t, ||e_t|| ~ sqrt(1/n + sigma_t^2) chi_d and the non-private
    # ||xbar|| ~ sqrt(1/n) chi_d, so E[mean_t a_t] / E[mean_t b_t] = mean_t sqrt(1 + n sigma_t^2)
    # (clipping bias < 1 %, previous test). The measured ratio of means must match it within
    # Z_CRIT standard errors (error_ratio's delta-method se), and the published 1.03 (PLAN,
    # PETS 2024) within 10 % plus the same Monte-Carlo margin.
    n, d, rho, S = 4000, 16, 0.5, 60
    a, b, pred = [], [], []
    for s in range(S):
        rng = np.random.default_rng([4000, s])
        x = rng.standard_normal((n, d))
        res = instance_optimal_mean(x, ZCDP(rho), rng, radius=25 * math.sqrt(d))
        a.append(np.linalg.norm(res.estimate))
        b.append(np.linalg.norm(x.mean(axis=0)))
        pred.append(math.sqrt(1 + n * res.noise_sigma**2))
    ratio, se = error_ratio(a, b)
    assert abs(ratio - np.mean(pred)) < Z_CRIT * se
    assert abs(ratio / 1.03 - 1) < 0.10 + Z_CRIT * se / 1.03


@pytest.mark.parametrize("epsilon, delta", [(1.0, 1e-6), (0.1, 1e-5), (4.0, 1e-9)])
def test_gaussian_composition_rho_sits_on_the_gaussian_privacy_curve(epsilon, delta):
    # A composition of Gaussian mechanisms of total zCDP cost rho is sqrt(2 rho)-GDP, i.e. the
    # Gaussian mechanism with Delta = 1, sigma = 1 / sqrt(2 rho) (Dong, Roth & Su 2022). Its
    # exact delta at epsilon (Balle & Wang, Thm. 8) must be <= delta at the returned rho and
    # exceed it 1e-6 (relative) above: the largest such rho. Prop. 1.3 (any zCDP mechanism)
    # can only give less rho.
    rho = gaussian_composition_rho(epsilon, delta)
    assert gaussian_delta(1.0 / math.sqrt(2.0 * rho), epsilon, 1.0) <= delta
    assert gaussian_delta(1.0 / math.sqrt(2.0 * rho * (1.0 + 1e-6)), epsilon, 1.0) > delta
    assert rho >= rho_for_approx_dp(epsilon, delta)


def test_instance_optimal_accepts_approx_dp_and_the_released_configuration():
    x = np.random.default_rng(16).standard_normal((500, 8))
    res = instance_optimal_mean(x, ApproxDP(1.0, 1e-6), np.random.default_rng(1), radius=20.0)
    assert res.rho == pytest.approx(gaussian_composition_rho(1.0, 1e-6))
    res = instance_optimal_mean(x, ApproxDP(1.0, 1e-6), np.random.default_rng(1), radius=20.0, conversion="zcdp")
    assert res.rho == pytest.approx(rho_for_approx_dp(1.0, 1e-6))
    res = instance_optimal_mean(
        x, ZCDP(0.5), np.random.default_rng(1), radius=20.0, split=RELEASED_CODE_SPLIT,
        rank_rule="released", steps=10, median_range=5.0, threshold_range=20.0,
    )
    assert res.noise_sigma == pytest.approx(2 * res.threshold / (500 * math.sqrt(2 * 0.7425 * 0.5)))
    assert 500 - res.rank == pytest.approx(2 * math.sqrt(16 / (0.7425 * 0.5)) + 2 * math.sqrt(10 / (2 * 0.0075 * 0.5)))


# --------------------------------------------------------------------------
# Agarwal et al.: clip-and-noise, heavy tails
# --------------------------------------------------------------------------


def test_clip_and_noise_is_the_calibrated_gaussian():
    # Data fixed: est - mean_i clip(Y_i) ~ N(0, sigma^2 I_d), sigma = gaussian_sigma(2r/n).
    n, d, r, S = 400, 6, 1.5, 300
    Y = np.random.default_rng(17).standard_normal((n, d))
    center = np.full(d, 0.2)
    target, moved = clipped_average(Y, center, r)
    assert moved > 0  # some users are clipped
    for privacy in (ZCDP(0.3), ApproxDP(2.0, 1e-5)):
        sigma = gaussian_sigma(2 * r / n, privacy)
        stat = 0.0
        for s in range(S):
            res = clip_and_noise(Y, privacy, np.random.default_rng([18, s]), center=center, radius=r)
            assert res.sigma == sigma
            stat += np.sum((res.estimate - target) ** 2) / sigma**2
        assert _chi2_ok(stat, d * S)
    # The printed calibration 2 r sqrt(2 ln(4/delta)) / (n eps), only for eps <= 1.
    res = clip_and_noise(Y, ApproxDP(0.5, 1e-6), np.random.default_rng(0), center=center, radius=r, calibration="paper")
    assert res.sigma == pytest.approx(2 * r * math.sqrt(2 * math.log(4e6)) / (n * 0.5))
    assert res.sigma > gaussian_sigma(2 * r / n, ApproxDP(0.5, 1e-6))  # looser than the exact one
    with pytest.raises(InvalidParameter):
        clip_and_noise(Y, ApproxDP(2.0, 1e-6), np.random.default_rng(0), center=center, radius=r, calibration="paper")


def test_clip_and_noise_outlier_moves_it_by_at_most_2r_over_n():
    n, d, r = 300, 5, 1.0
    Y = np.random.default_rng(19).standard_normal((n, d))
    Z = Y.copy()
    Z[7] = -1e12
    for s in range(10):
        a = clip_and_noise(Y, ZCDP(1.0), np.random.default_rng(s), center=np.zeros(d), radius=r).estimate
        b = clip_and_noise(Z, ZCDP(1.0), np.random.default_rng(s), center=np.zeros(d), radius=r).estimate
        assert np.linalg.norm(a - b) <= 2 * r / n + 1e-12


def test_clipping_radius_balances_noise_and_bias():
    # rho*^k = d^(k/2 - 1) n q / m^(k-1) where the balanced branch wins (Alg. 4 line 2), and
    # the radius scales with the moment bound; the sqrt(d/m) floor otherwise.
    n, m, d, k = 10**6, 3, 20, 4.0
    spec = ApproxDP(1.0, 1e-6)
    q = 1.0 / math.sqrt(math.log(1e6))
    r = clipping_radius(n, m, d, k, spec)
    assert r**k == pytest.approx(d ** (k / 2 - 1) * n * q / m ** (k - 1))
    assert clipping_radius(n, m, d, k, spec, moment_bound=2.5) == pytest.approx(2.5 * r)
    assert clipping_radius(10, 10**4, d, k, ZCDP(0.01)) == pytest.approx(math.sqrt(d / 10**4))
    # zCDP: q = 2 sqrt(rho).
    assert clipping_radius(n, m, d, k, ZCDP(0.25)) ** k == pytest.approx(d ** (k / 2 - 1) * n * 1.0 / m ** (k - 1))
    assert coarse_bucket_width(4.0, 4) == pytest.approx(16**0.25 / 2)


def test_coarse_estimate_is_within_two_buckets():
    # Thm. 3.2: |mu_j - centre_j| < 2 r per coordinate once n is large; here each coordinate's
    # largest noisy bucket holds the bulk of N(mu_j, 1) user means.
    d, n = 10, 3000
    mu = np.linspace(-7, 7, d)
    Y = mu + np.random.default_rng(20).standard_normal((n, d))
    res = coarse_estimate(Y, ZCDP(0.1), np.random.default_rng(21), width=2.0, bound=10.0)
    assert np.all(np.abs(res.center - mu) < 2 * 2.0)
    assert res.count_sigma == pytest.approx(math.sqrt(2 * d) / math.sqrt(0.2))


@pytest.mark.parametrize("n", [2000, 32000])
def test_heavy_tailed_mean_error_is_sampling_plus_calibrated_noise(n):
    # Multivariate t, nu = 5 (k = 4 moments: sigma_4 = 25^(1/4)), m = 5 samples per user.
    # rho* >= 8.7 while user means have norm ~ sqrt(d Var / m) = 1.6 with t_5-like tails
    # (P(||Ybar|| > 8.7) < 1e-4), so clipping is rare and its bias is negligible: the error is
    # (Ybar - mu) + w with Var(Ybar_j) = (5/3)/(n m) and w ~ N(0, sigma^2 I). E||e||^2 =
    # d (5/3)/(n m) + d sigma^2; with the CLT over n m samples, ||e||^2 / E ~ chi2_d / d,
    # relative sd sqrt(2/d) per trial; over S trials sqrt(2/(d S)). Allow Z_CRIT of it.
    # The theory error shrinks ~ 1/n (sampling) and faster (noise: sigma ~ rho*/n ~ n^(1/4 - 1)).
    pop = HeavyTailedPopulation("student-t", 8, 5, 5.0, mu=2.0)
    k, S = 4.0, 40
    sq, theory = [], []
    for s in range(S):
        rng = np.random.default_rng([n, 5, s])
        data = pop.samples(rng, n)
        res = heavy_tailed_mean(data, ZCDP(1.0), rng, k=k, bound=10.0, moment_bound=pop.moment(k))
        sq.append(np.sum((res.estimate - pop.mean) ** 2))
        theory.append(pop.dim * (pop.variance / (n * pop.m) + res.sigma**2))
    assert abs(np.mean(sq) / np.mean(theory) - 1) < Z_CRIT * math.sqrt(2 / (pop.dim * S))


def test_heavy_tailed_population_moments_are_exact():
    # Var = sigma_2^2: student-t nu/(nu-2), pareto-mixture alpha/(alpha-1) (times scale^2).
    t = HeavyTailedPopulation("student-t", 3, 1, 5.0, scale=2.0)
    p = HeavyTailedPopulation("pareto-mixture", 3, 1, 2.5)
    assert t.variance == pytest.approx(4 * 5 / 3)
    assert p.variance == pytest.approx(2.5 / 1.5)
    # E|t_nu| = 2 sqrt(nu) Gamma((nu+1)/2) / (sqrt(pi) (nu-1) Gamma(nu/2)).
    nu = 5.0
    e1 = 2 * math.sqrt(nu) * math.gamma((nu + 1) / 2) / (math.sqrt(math.pi) * (nu - 1) * math.gamma(nu / 2))
    assert t.moment(1.0) == pytest.approx(2.0 * e1)
    assert t.moment(4.0) == pytest.approx(2.0 * 25 ** 0.25)  # E t_5^4 = 25
    # Monte Carlo: sample variance along a direction, sd from the 4th moment:
    # Var(s^2) ~ (mu4 - sigma^4) / N with mu4 = 25 scale^4 (t_5), 15 (pareto alpha = 2.5).
    N = 200_000
    for pop, mu4 in ((t, 25 * 16), (p, 15.0)):
        v = pop.samples(np.random.default_rng(22), N)[:, 0, :] @ np.array([0.6, 0.0, 0.8])
        assert abs(np.var(v) - pop.variance) < Z_CRIT * math.sqrt((mu4 - pop.variance**2) / N)
    with pytest.raises(InvalidParameter):
        t.moment(5.0)  # infinite for k >= nu
    with pytest.raises(InvalidParameter):
        p.moment(5.0)  # infinite for k >= 2 alpha


# --------------------------------------------------------------------------
# bad inputs
# --------------------------------------------------------------------------


def test_bad_inputs_raise_invalid_parameter():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 4))
    bad_privacy = [lambda: ZCDP(0), lambda: ZCDP(-1.0), lambda: ZCDP(float("nan")), lambda: ApproxDP(1.0, 0.0),
                   lambda: ApproxDP(1.0, 1.0), lambda: ApproxDP(0.0, 1e-6), lambda: ZCDP(True)]
    for make in bad_privacy:
        with pytest.raises(InvalidParameter):
            make()
    nan = x.copy()
    nan[0, 0] = np.nan
    calls = [
        lambda: winsorized_mean(nan, ZCDP(1), rng, bound=5.0, tau=3.0),
        lambda: winsorized_mean(x[0], ZCDP(1), rng, bound=5.0, tau=3.0),  # 1-D data
        lambda: winsorized_mean(x[:1], ZCDP(1), rng, bound=5.0, tau=3.0),  # one user
        lambda: winsorized_mean(x, ZCDP(1), rng, bound=5.0),  # neither tau nor coordinate_radius
        lambda: winsorized_mean(x, ZCDP(1), rng, bound=5.0, tau=3.0, coordinate_radius=1.0),
        lambda: winsorized_mean(x, ZCDP(1), rng, bound=-1.0, tau=3.0),
        lambda: winsorized_mean(x, 0.5, rng, bound=5.0, tau=3.0),  # privacy not a spec
        lambda: winsorized_mean(x, ZCDP(1), 7, bound=5.0, tau=3.0),  # rng not a Generator
        lambda: winsorized_mean_1d([1.0], 1.0, 1.0, 2.0, rng),
        lambda: instance_optimal_mean(x, ZCDP(1), rng, radius=0.0),
        lambda: instance_optimal_mean(x, ZCDP(1), rng, radius=5.0, steps=0),
        lambda: instance_optimal_mean(x, ZCDP(1), rng, radius=5.0, rank_rule="median"),
        lambda: instance_optimal_mean(x, ZCDP(1), rng, radius=5.0, split=(0.25, 0.25, 0.5)),
        lambda: instance_optimal_mean(x, ApproxDP(1, 1e-6), rng, radius=5.0, conversion="rdp"),
        lambda: BudgetSplit(0.5, 0.5, 0.5),
        lambda: BudgetSplit(0.0, 0.5, 0.5),
        lambda: instance_optimal_mean(np.ones((5, 2, 3)), ZCDP(1), rng, radius=5.0, samples_per_user=3),
        lambda: instance_optimal_mean(x.astype(complex), ZCDP(1), rng, radius=5.0),
        lambda: private_quantile(x, 2, 1.0, -1.0, 1.0, 8, rng),
        lambda: clip_and_noise(x, ZCDP(1), rng, center=np.zeros(3), radius=1.0),
        lambda: clip_and_noise(x, ZCDP(1), rng, center=np.zeros(4), radius=1.0, calibration="loose"),
        lambda: clip_and_noise(x, ZCDP(1), rng, center=np.zeros(4), radius=-1.0),
        lambda: heavy_tailed_mean(x, ZCDP(1), rng, k=1.0, bound=5.0),
        lambda: heavy_tailed_mean(x, ZCDP(1), rng, k=4.0, bound=5.0, coarse_fraction=1.0),
        lambda: heavy_tailed_mean(x, ZCDP(1), rng, k=4.0, bound=5.0, samples_per_user=0),
        lambda: clipping_radius(1, 1, 4, 4.0, ZCDP(1)),
        lambda: coarse_estimate(x, ZCDP(1), rng, width=0.0, bound=5.0),
        lambda: gaussian_concentration_radius(1.0, 4, 1, 10, 1.5),
        lambda: HeavyTailedPopulation("cauchy", 2, 1, 1.0),
        lambda: HeavyTailedPopulation("student-t", 0, 1, 3.0),
        lambda: HeavyTailedPopulation("student-t", 2, 1, -3.0),
        lambda: error_ratio([1.0], [1.0]),
    ]
    for call in calls:
        with pytest.raises(InvalidParameter):
            call()
