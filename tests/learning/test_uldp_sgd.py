"""ULDP-SGD (Girgis, Data & Diggavi, Algorithm 6 / Theorem 5): accounting, clipping, unbiasedness, training.

Tolerances are stated at each check. Every randomized check uses fixed seeds.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from shuffledp.learning.data import breast_cancer_users, real_dataset_available, synthetic_logistic
from shuffledp.protocol.accounting import SessionAccountant, generic_guarantee, laplace_mean_guarantee
from shuffledp.protocol.accounting.steps import SubsampledStepAccountant
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.learning.uldp_sgd import (
    TrainingConfig,
    calibrate_epsilon0,
    calibrate_noise_multiplier,
    central_epsilon,
    clip_rows,
    exact_error_model,
    executed_guarantees,
    privatize_mean,
    STEP_GRID_LEVELS,
    step_guarantees,
    step_has_range_round,
    step_vector_config,
    train,
    uldp_accountant,
    uldp_privacy,
    user_gradients,
)

DELTA = 1e-5


# ------------------------------------------------------------------ accounting
def test_session_epsilon_increases_with_steps_and_rate():
    """More steps cost more; a larger sampling rate q at the same cohort (shuffled batch) size k,
    i.e. fewer users N = k / q, costs more. (At fixed N a larger q also enlarges the shuffled batch,
    which amplifies more: there the session epsilon need not increase with q.)"""
    e0, users = 6.0, 20_000
    by_steps = [uldp_accountant(e0, users, 400, T).epsilon(DELTA) for T in (10, 40, 160)]
    assert by_steps[0] < by_steps[1] < by_steps[2]
    k = 500
    by_rate = [uldp_accountant(e0, int(k / q), k, 50).epsilon(DELTA) for q in (0.01, 0.04, 0.16)]
    assert by_rate[0] < by_rate[1] < by_rate[2]


def test_without_subsampling_equals_session_accountant():
    """q = 1: the step accountant *is* SessionAccountant with both rounds added T times (exact)."""
    e0, n, T = 4.0, 1000, 5
    ours = uldp_accountant(e0, n, n, T)
    ref = SessionAccountant()
    for g in step_guarantees(e0):
        ref.add_round(g, n, count=T)
    assert ours.epsilon_breakdown(DELTA) == ref.epsilon_breakdown(DELTA)


def test_single_round_step_matches_session_accountant_subsampling():
    """A one-round step through the joint-subsampling path agrees with SessionAccountant's own
    per-round Poisson subsampling; the two differ only by re-discretizing the curve (tolerance 2 %)."""
    g = generic_guarantee(3.0)
    ours = SubsampledStepAccountant([g], 500, 0.05, 40).epsilon(DELTA)
    ref = SessionAccountant()
    ref.add_round(g, 500, sampling_rate=0.05, count=40)
    assert ours == pytest.approx(ref.epsilon(DELTA), rel=0.02)


def test_joint_subsampling_is_not_cheaper_than_independent():
    """Both rounds share the cohort: the jointly subsampled step cannot cost less than two
    independently subsampled rounds (what add_round(..., sampling_rate) per round would claim)."""
    e0, k, q, T = 8.0, 1000, 0.02, 50
    joint = uldp_accountant(e0, int(k / q), k, T).epsilon(DELTA)
    ref = SessionAccountant()
    for g in step_guarantees(e0):
        ref.add_round(g, k, sampling_rate=q, count=T)
    assert joint >= ref.epsilon(DELTA) * 0.999


def test_privacy_report_local_budgets():
    p = uldp_privacy(5.0, 10_000, 500, 20, DELTA)
    assert p["local_epsilon_worst_case"] == pytest.approx(100.0)
    assert p["expected_participations"] == pytest.approx(1.0)
    assert p["epsilon"] == min(p["epsilon_pld"], p["epsilon_rdp"])
    assert 0 < p["epsilon"] < 5.0  # amplified below one step's local budget


def test_calibrate_epsilon0_hits_target():
    target, users, k, T = 1.0, 20_000, 1000, 20
    e0 = calibrate_epsilon0(target, users, k, T, DELTA, rtol=0.02)
    assert uldp_accountant(e0, users, k, T).epsilon(DELTA) <= target
    assert uldp_accountant(e0 * 1.02, users, k, T).epsilon(DELTA) > target * 0.97


def test_central_noise_calibration():
    sigma = calibrate_noise_multiplier(2.0, 0.01, 100, DELTA)
    eps = central_epsilon(sigma, 0.01, 100, DELTA)
    assert eps <= 2.0 + 1e-6 and eps > 1.9  # tol 1e-3 on sigma


def test_executed_rounds_are_the_accounted_rounds():
    """Small D: tau' = C, one range bin, so no range round and the mean round gets the whole eps0
    over [-C, C]; large D (D = 256 > 2 log(2 k D / gamma) = 38): both rounds at eps0/2."""
    rng = np.random.default_rng(1)
    grads = clip_rows(rng.normal(size=(300, 5)), 1.0)
    cfg = step_vector_config(5, 1.0, 4.0, 300, rotation_seed=3)
    assert not cfg.range_round and not step_has_range_round(5, 1.0, 300)
    _, run = privatize_mean(grads, cfg, seed=0)
    assert executed_guarantees(run) == step_guarantees(4.0, range_round=False) == [laplace_mean_guarantee(4.0, STEP_GRID_LEVELS)]
    (only,) = run.rounds
    assert only.plan.epsilon0 == 4.0
    assert set(only.plan.params.lower) == {-1.0} and set(only.plan.params.upper) == {1.0}
    wide = clip_rows(rng.normal(size=(3000, 200)), 1.0)  # ~12 users per rotated coordinate
    cfg = step_vector_config(200, 1.0, 4.0, 3000, rotation_seed=3)
    assert cfg.range_round and step_has_range_round(200, 1.0, 3000)
    _, run = privatize_mean(wide, cfg, seed=0)
    assert executed_guarantees(run) == step_guarantees(4.0) == [generic_guarantee(2.0), laplace_mean_guarantee(2.0, STEP_GRID_LEVELS)]


def test_skipping_the_one_bin_range_round_saves_noise():
    """With one bin the two-round protocol announced [-3C, 3C] at eps0/2; the one-round protocol
    projects onto [-C, C] at eps0: the Laplace scale per report falls from 6C G/(eps0/2) / G to
    2C/eps0, a factor 6 (variance 36), exactly as the exact error model says."""
    rng = np.random.default_rng(2)
    grads = clip_rows(rng.normal(size=(2000, 6)), 1.0)
    cfg = step_vector_config(6, 1.0, 4.0, 2000, rotation_seed=5)
    assert not cfg.range_round
    _, unbiased_var = exact_error_model(grads, cfg, np.tile([-1.0, 1.0], (cfg.padded_dim, 1)))
    _, old_var = exact_error_model(grads, dataclasses.replace(cfg, epsilon0=2.0), np.tile([-3.0, 3.0], (cfg.padded_dim, 1)))
    assert old_var.sum() > 10.0 * unbiased_var.sum()


# -------------------------------------------------------------------- clipping
def test_clipping_bounds_every_contribution():
    rng = np.random.default_rng(2)
    data = synthetic_logistic(500, 10, 7, seed=2)
    theta = rng.normal(size=data.dim) * 5
    grads = user_gradients(theta, data.features, data.labels)
    clipped = clip_rows(grads, 0.3)
    norms = np.linalg.norm(clipped, axis=1)
    assert norms.max() <= 0.3 * (1 + 1e-12)
    inside = np.linalg.norm(grads, axis=1) <= 0.3
    np.testing.assert_array_equal(clipped[inside], grads[inside])  # rows inside are untouched
    cfg = step_vector_config(data.dim, 0.3, 4.0, 500, rotation_seed=7)
    rotated = cfg.rotation.apply(clipped)
    assert np.abs(rotated).max() <= cfg.rotated_bound * (1 + 1e-12)  # |(U g)_l| <= ||g|| <= C


# ---------------------------------------------------------------- unbiasedness
def test_privatized_gradient_unbiased_within_variance():
    """R = 300 runs on fixed clipped gradients (fixed rotation): every coordinate's mean estimate is
    within 4.5 standard errors of the truth (range [-3C, 3C] covers all users, so the projected mean
    is the true mean), and the empirical variance is within 4 sd of chi-square noise (+-35 %)."""
    rng = np.random.default_rng(3)
    k, dim, R = 400, 8, 300
    grads = clip_rows(rng.normal(0.2, 0.3, size=(k, dim)), 1.0)
    cfg = step_vector_config(dim, 1.0, 6.0, k, rotation_seed=11)
    estimates, ranges = [], None
    for seed in range(R):
        est, run = privatize_mean(grads, cfg, seed)
        estimates.append(est)
        ranges = run.result.ranges
    estimates = np.array(estimates)
    unbiased_for, variance = exact_error_model(grads, cfg, ranges)
    np.testing.assert_allclose(unbiased_for, grads.mean(axis=0), atol=1e-12)
    z = (estimates.mean(axis=0) - grads.mean(axis=0)) / np.sqrt(variance / R)
    assert np.abs(z).max() < 4.5, z
    ratio = estimates.var(axis=0, ddof=1) / variance
    assert np.all((ratio > 0.65) & (ratio < 1.35)), ratio


# -------------------------------------------------------------------- training
def test_trainer_beats_trivial_classifier():
    data = synthetic_logistic(5_000, 10, 7, test_users=500, seed=4)
    majority = max(data.test_labels.mean(), 1 - data.test_labels.mean())
    cfg = TrainingConfig(steps=150, cohort=1_000, learning_rate=0.3, clip=0.5, momentum=0.9, seed=4)
    result = train(data, cfg, "uldp-shuffle", epsilon0=8.0, account=False)
    assert result.accuracy > majority + 0.1, (result.accuracy, majority)
    assert result.skipped_steps == 0
    nonprivate = train(data, cfg, "nonprivate", account=False)
    assert nonprivate.accuracy >= result.accuracy - 0.02


def test_central_training_reports_its_epsilon():
    data = synthetic_logistic(2_000, 5, 4, test_users=200, seed=5)
    cfg = TrainingConfig(steps=20, cohort=200, learning_rate=0.5, clip=0.5)
    r = train(data, cfg, "central", noise_multiplier=1.0)
    assert r.privacy["epsilon"] == pytest.approx(central_epsilon(1.0, 0.1, 20, DELTA))


@pytest.mark.skipif(not real_dataset_available(), reason="scikit-learn (ships the breast-cancer table) is not installed")
def test_real_dataset_loads_and_learns():
    data = breast_cancer_users(samples_per_user=1)
    assert data.dim == 31 and data.users + data.test_labels.size == 569
    cfg = TrainingConfig(steps=200, cohort=100, learning_rate=1.0, momentum=0.5, seed=1)
    assert train(data, cfg, "nonprivate", account=False).accuracy > 0.9


# ------------------------------------------------------------------ bad inputs
@pytest.mark.parametrize(
    "make",
    [
        lambda: TrainingConfig(steps=0, cohort=10, learning_rate=0.1),
        lambda: TrainingConfig(steps=10, cohort=1, learning_rate=0.1),
        lambda: TrainingConfig(steps=10, cohort=10, learning_rate=-1.0),
        lambda: TrainingConfig(steps=10, cohort=10, learning_rate=0.1, clip=0.0),
        lambda: TrainingConfig(steps=10, cohort=10, learning_rate=0.1, momentum=1.0),
        lambda: TrainingConfig(steps=10, cohort=10, learning_rate=0.1, tail_average=0.0),
        lambda: clip_rows(np.ones((2, 2)), -1.0),
        lambda: uldp_accountant(4.0, 100, 200, 10),
        lambda: uldp_accountant(4.0, 100, 10, 0),
        lambda: uldp_accountant(-1.0, 100, 10, 5),
        lambda: uldp_accountant(4.0, 100, 10, 5).epsilon(0.0),
        lambda: SubsampledStepAccountant([], 10, 0.1, 5),
        lambda: SubsampledStepAccountant([generic_guarantee(1.0)], 10, 1.5, 5),
        lambda: calibrate_epsilon0(-1.0, 1000, 100, 10),
        lambda: calibrate_noise_multiplier(1.0, 0.0, 10),
        lambda: synthetic_logistic(1, 10, 5),
        lambda: step_vector_config(4, 1.0, 4.0, 100, 0, gamma=2.0),
    ],
)
def test_bad_inputs_raise(make):
    with pytest.raises(InvalidParameter):
        make()


def test_bad_training_calls_raise():
    data = synthetic_logistic(100, 2, 3, test_users=10, seed=0)
    cfg = TrainingConfig(steps=2, cohort=10, learning_rate=0.1)
    with pytest.raises(InvalidParameter):
        train(data, cfg, "sgd")
    with pytest.raises(InvalidParameter):
        train(data, cfg, "uldp-shuffle")
    with pytest.raises(InvalidParameter):
        train(data, cfg, "central")
    with pytest.raises(InvalidParameter):
        train(data, TrainingConfig(steps=2, cohort=200, learning_rate=0.1), "nonprivate")
    assert math.isfinite(train(data, cfg, "nonprivate", account=False).accuracy)
