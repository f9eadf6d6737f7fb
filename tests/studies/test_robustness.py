"""Corrupted users (``shuffledp/studies/robustness.py``) and the analyzer's robust decoding (``analyzer/robust.py``).

Every tolerance below comes from the analysis it checks: a standard deviation computed from the
mechanism's exact variance, or a bound whose failure probability is stated (Hoeffding, union bound).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from shuffledp.analyzer.decoders import hadamard_scale
from shuffledp.analyzer.robust import (
    RobustOptions,
    _laplace_quantile,
    corruption_tolerance,
    guarded_range,
    median_estimate,
    median_shift_bound,
    noise_radius,
    plain_mean_shift,
)
from shuffledp.analyzer.scalar_mean import ScalarMeanConfig, ScalarMeanProtocol
from shuffledp.analyzer.summation import SummationProtocol, scalar_clipped_sum, scalar_rounding_variance
from shuffledp.analyzer.vector_mean import VectorMeanConfig, VectorMeanProtocol
from shuffledp.analyzer.protocols import RoundPlan
from shuffledp.client.mean_randomizer import laplace_scale, noise_variance, report_range, rounding_variance, randomize_mean
from shuffledp.client.range_randomizer import bin_index
from shuffledp.simulation.engine import run_fast
from shuffledp.protocol.errors import ValueOutOfRange
from shuffledp.protocol.wire.messages import ProjectedMeanParams
from shuffledp.protocol.mechanisms.randomness import SeededSource
from shuffledp.protocol.mechanisms.summation_params import choose_scalar_sum, scalar_sum_variance
from shuffledp.studies.robustness import Adversary, check_well_formed, run_attacked

N = 20_000
# 40 bins of width 1 over [-20, 20]; bin 20 is [0, 1), centre 0.5: every user sits in it.
CONFIG = ScalarMeanConfig(bound=20.0, tau=0.5, epsilon0=1.0)
HONEST_BIN = 20


def _means(seed: int, n: int = N) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.5, 0.05, n)


def test_no_corruption_is_the_fast_engine_run_exactly():
    means = _means(1)
    honest = run_fast(ScalarMeanProtocol(CONFIG), means, seed=3).result
    attacked = run_attacked(ScalarMeanProtocol(CONFIG), means, Adversary(0.0), seed=3)
    assert not attacked.corrupted.any()
    assert attacked.result.mean == honest.mean
    assert attacked.result.found_range.lower == honest.found_range.lower
    vector = VectorMeanConfig(dim=4, rotated_bound=4.0, rotated_tau=0.5, epsilon0=2.0, rotation_seed=5)
    data = np.random.default_rng(2).normal(0.3, 0.05, (4000, 4))
    a = run_attacked(VectorMeanProtocol(vector), data, Adversary(0.0), seed=4).result
    b = run_fast(VectorMeanProtocol(vector), data, seed=4).result
    assert np.array_equal(a.estimate, b.estimate) and np.array_equal(a.ranges, b.ranges)


def test_robust_options_off_leave_the_protocol_unchanged():
    means = _means(2)
    plain = run_fast(ScalarMeanProtocol(CONFIG), means, seed=1).result
    assert plain.robust is None
    median_only = run_fast(ScalarMeanProtocol(CONFIG, RobustOptions()), means, seed=1).result
    # the same reports: the range is the same, only round 2's decode differs
    assert median_only.found_range.lower == plain.found_range.lower and median_only.robust is not None


def test_the_check_refuses_ill_formed_rows():
    params = ProjectedMeanParams(0.0, 1.0)
    high = report_range(params, 0.5)[1]
    check_well_formed(RoundPlan(params, 0.5), np.array([[high]]))
    with pytest.raises(ValueOutOfRange):
        check_well_formed(RoundPlan(params, 0.5), np.array([[high + 1]]))


def test_plain_bias_under_the_extreme_attack_matches_the_formula():
    # f = 1 %: the range round holds (its certified tolerance exceeds f), the mean round's
    # attackers send G + B. Given the range, E[estimate] = (sum of honest projected means +
    # k (lower + step (G + B))) / n; its sd is sqrt(sum of honest noise + rounding variances) / n.
    means = _means(3)
    honest = run_fast(ScalarMeanProtocol(CONFIG), means, seed=5).result
    run = run_attacked(ScalarMeanProtocol(CONFIG), means, Adversary(0.01), seed=5)
    out, mask = run.result, run.corrupted
    params = out.mean_params
    assert params == honest.mean_params  # the range did not move
    k, n = int(mask.sum()), len(means)
    projected = np.clip(means, params.lower, params.upper)
    step = (params.upper - params.lower) / params.grid_levels
    expected = (projected[~mask].sum() + k * (params.lower + step * report_range(params, CONFIG.round_epsilon)[1])) / n
    sd = math.sqrt((n - k) * noise_variance(params, CONFIG.round_epsilon) + rounding_variance(means[~mask], params).sum()) / n
    assert abs(out.mean.estimate - expected) <= 4.5 * sd
    # and the formula's shift is the attack's whole effect. In honest standard errors
    # (sqrt(2) s step / sqrt(n), s = G / eps) it is f (G + B) / (sqrt(2) s / sqrt(n)) with
    # B = ceil(41 ln 2 s): about f (eps + 28.4) sqrt(n / 2) = 29 at f = 1 %.
    shift = plain_mean_shift(params, CONFIG.round_epsilon, 0.0, k / n, float(projected[mask].mean()))
    assert abs(expected - projected.mean() - shift) < 1e-9
    predicted = k / n * (CONFIG.round_epsilon + 41 * math.log(2)) * math.sqrt(n / 2)
    assert abs(shift / honest.mean.standard_error / predicted - 1) < 0.05


@pytest.mark.parametrize("fraction", [0.0, 0.01, 0.1, 0.3, 0.45])
@pytest.mark.parametrize("direction", [1, -1])
def test_the_median_stays_within_its_bound(fraction, direction):
    # The decoder alone, on one mean round: honest reports from the real randomizer, the corrupted
    # ones at the extreme valid value. The stated bound holds w.p. >= 1 - delta = 0.99 per case, and
    # the attack also reaches at least the median's predicted shift (the attackers sit beyond every
    # honest report, so the median is the honest order statistic of rank j).
    params, eps, n = ProjectedMeanParams(-1.0, 2.0), 0.5, N
    values = np.random.default_rng([int(fraction * 100), direction + 1]).normal(0.6, 0.2, n)
    k = int(round(fraction * n))
    honest = values[k:]
    reports = randomize_mean(honest, params, eps, SeededSource(np.random.SeedSequence([int(fraction * 1000), direction + 1, 10])))
    low_value, high_value = report_range(params, eps)
    reports = np.concatenate([reports, np.full(k, high_value if direction > 0 else low_value)])
    step = (params.upper - params.lower) / params.grid_levels
    projected = (np.clip(honest, params.lower, params.upper) - params.lower) / step
    spread, center = float(projected.max() - projected.min()), float(projected.mean())
    scale = float(laplace_scale(params, eps))
    low, high = median_shift_bound(n, k, scale, spread, delta=0.01)
    median = (median_estimate(reports, params).estimate - params.lower) / step
    assert low <= median - center <= high
    if k:
        n_h, eta = n - k, (spread + 2) ** 2 / (16 * scale**2)
        d = math.sqrt(math.log(2 / 0.01) / (2 * n_h))
        j = (n + 1) // 2 if direction > 0 else n // 2 + 1 - k
        reached = -1 + _laplace_quantile(j / n_h - eta - d, scale) if direction > 0 else 1 + _laplace_quantile(j / n_h + eta + d, scale)
        assert (median - center - reached) * direction >= 0
    # and far below what the plain average moves by, f (G + B - centre): the ratio is about
    # f (G + B) / (s ln((1 - f)/(1 - 2f)) + 2 s d), at least 6.6 over these cases
    if k:
        assert max(abs(low), abs(high)) < k / n * (high_value - center) / 4


def _range_run(fraction: float, seed: int, robust: RobustOptions | None, epsilon0: float):
    config = ScalarMeanConfig(bound=20.0, tau=0.5, epsilon0=epsilon0)
    return run_attacked(ScalarMeanProtocol(config, robust), _means(seed), Adversary(fraction), seed=seed).result, config


def test_the_guarded_range_keeps_the_honest_range_up_to_its_fraction():
    # eps0 = 2 (c = coth(1/2) = 2.16): the plain arg-max falls to the attack once (1 - f) - c f < c f,
    # f > 1 / (2c + 1) = 0.19. Guarded at f_max = 0.25, the range holds the honest bin's range
    # [0.5 - 1.5, 0.5 + 1.5] for every f <= f_max, w.p. >= 1 - alpha = 0.99 per run.
    fooled = 0
    for seed in range(3):
        for fraction in (0.05, 0.15, 0.22, 0.25):
            guarded, _ = _range_run(fraction, seed, RobustOptions(max_corrupted=0.25), 2.0)
            plain, _ = _range_run(fraction, seed, None, 2.0)
            assert guarded.found_range.lower <= -1.0 and guarded.found_range.upper >= 2.0
            fooled += plain.found_range.bin != HONEST_BIN
    assert fooled >= 3  # the attack works on the plain range, so the guard is what keeps it


def test_the_guarded_range_is_the_plain_one_without_attack():
    for seed in range(3):
        guarded, _ = _range_run(0.0, seed, RobustOptions(max_corrupted=0.05), 1.0)
        plain, _ = _range_run(0.0, seed, None, 1.0)
        assert (guarded.found_range.lower, guarded.found_range.upper) == (plain.found_range.lower, plain.found_range.upper)
        assert guarded.robust.candidate_bins == (HONEST_BIN,)


def test_the_margin_condition_certifies_the_announced_bin():
    # Whenever the corrupted fraction is at most the tolerance the analyzer computes from what it
    # sees, the arg-max is the honest mode (w.p. >= 1 - alpha per run); at f = 2 % the margin is
    # large enough that it is certified in every run (the expected tolerance is about
    # (1 - f - 2 c f - 2t) / (2c) = 0.07 at c = 4.08, t = 0.11).
    certified = 0
    for seed in range(3):
        for fraction in (0.0, 0.02, 0.05, 0.1, 0.2):
            out, config = _range_run(fraction, seed, RobustOptions(), 1.0)
            tolerance = out.robust.tolerance
            if fraction <= tolerance:
                assert out.found_range.bin == HONEST_BIN
                certified += 1
            if fraction == 0.02:
                assert tolerance >= 0.02
            if out.found_range.bin != HONEST_BIN:
                assert tolerance < fraction
    assert certified >= 6


def test_noise_radius_bounds_every_honest_bin():
    # The guarded range and the tolerance rest on |fhat[a] - N_H[a]/n| <= t for all bins (w.p. 1 - alpha).
    from shuffledp.analyzer.decoders import hadamard_frequencies
    from shuffledp.client.range_randomizer import randomize_range

    params, eps, n = CONFIG.range_params(), CONFIG.round_epsilon, 4000
    means = _means(9, n)
    truth = np.bincount(bin_index(means, params), minlength=params.num_bins) / n
    t = noise_radius(eps, params.num_bins, n, alpha=0.01)
    worst = []
    for rep in range(200):
        rows, bits = randomize_range(means, params, eps, SeededSource(rep))
        worst.append(np.abs(hadamard_frequencies(rows, bits, params.padded_bins, eps)[: params.num_bins] - truth).max())
    # Binomial(200, 0.01) exceeds 8 with probability < 1e-3
    assert sum(w > t for w in worst) <= 8
    assert t < 4 * hadamard_scale(eps) / math.sqrt(n) * math.sqrt(2 * math.log(2 * params.num_bins / 0.01))
    found = guarded_range(np.eye(params.num_bins)[HONEST_BIN], params, n, eps, 0.0)
    assert (found.lower, found.upper) == (-1.0, 2.0)
    assert corruption_tolerance(np.eye(params.num_bins)[HONEST_BIN], n, eps) > 0


def test_summation_attacks():
    # In-range input manipulation moves the mean by exactly k/n (upper - replaced users' clipped
    # values) in expectation (sd from the exact variance); one arbitrary residue moves it by ~q/2 steps.
    n, eps, delta = 5000, 1.0, 1e-6
    choice = choose_scalar_sum(n, eps, delta, -2.0, 2.0)
    params = choice.params
    data = np.random.default_rng(4).normal(0.3, 0.5, n)
    protocol = SummationProtocol(params, eps, delta)
    run = run_attacked(protocol, data, Adversary(0.05), seed=2)
    mask = run.corrupted
    clipped = np.clip(data, params.lower, params.upper)
    expected = (clipped[~mask].sum() + mask.sum() * params.upper) / n
    rounding = scalar_rounding_variance(data[~mask], params) + scalar_rounding_variance(np.full(int(mask.sum()), params.upper), params)
    sd = math.sqrt(scalar_sum_variance(params, eps, rounding)) / n
    assert abs(run.result.estimate.mean - expected) <= 4.5 * sd
    assert expected - scalar_clipped_sum(data, params) / n > 50 * sd
    residue = run_attacked(protocol, data, Adversary(0.05, residue=True), seed=2).result.estimate.mean
    step = (params.upper - params.lower) / params.precision
    assert abs(residue - expected) > 0.4 * params.modulus * step / n


@pytest.mark.parametrize("model", ["shuffle", "local"])
def test_instance_optimal_attacks_are_well_formed_and_the_detection_threshold_holds_them_off(model):
    """Every crafted row of the four instance-optimal rounds passes the round's report ranges
    (run_attacked checks each row); with no corrupted user the run is run_fast's exactly.

    The norm round's detection threshold is a tolerance: each attacker's claim adds c to the
    count estimate of the (honestly empty) top bin, whose noise has sd c sqrt(n). At n = 3,000
    with the default budget split and 320 norm bins (shuffle: c = 1.08, detection 268; local:
    c = 5.07, detection 1,264) 2 % of attackers (60) need 3.4+ sd of noise to reach detection, so
    the radius does not rise (their denials of the honest mode can only lower counts, so it may
    fall); 20 % (600) clear it by 6.4+ sd, and the radius jumps to the top of the grid."""
    from shuffledp.analyzer.instance_optimal import InstanceOptimalConfig, InstanceOptimalProtocol

    rng = np.random.default_rng(3)
    n = 3000
    data = np.array([3.0, -1.0, 2.0, 0.5]) + rng.normal(size=(n, 4)) * 0.5
    config = InstanceOptimalConfig(4, n, 40.0, 4.0, 1e-6, model=model, leaves=64)
    honest = InstanceOptimalProtocol(config)
    expected = run_fast(honest, data, seed=2).result
    clean = run_attacked(InstanceOptimalProtocol(config, honest.budgets), data, Adversary(0.0), seed=2)
    np.testing.assert_array_equal(clean.result.estimate, expected.estimate)
    few = run_attacked(InstanceOptimalProtocol(config, honest.budgets), data, Adversary(0.02), seed=2)
    assert [p.params.MECHANISM for p in few.plans][:2] == ["coordinate-tree", "shifted-norm"]
    assert few.result.threshold.radius <= expected.threshold.radius
    many = run_attacked(InstanceOptimalProtocol(config, honest.budgets), data, Adversary(0.2), seed=2)
    norm_params = many.plans[1].params
    assert many.result.threshold.radius == 2.0**norm_params.high
