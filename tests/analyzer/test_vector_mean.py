"""Random rotation and the vector mean protocol (Girgis et al. 2022, Algorithm 5, Lemma 2)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from shuffledp.analyzer.vector_mean import VectorMeanAccumulator, VectorMeanConfig, VectorRangeAccumulator
from shuffledp.client.vector_randomizer import randomize_vector_mean, randomize_vector_range
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.randomness import SeededSource
from shuffledp.protocol.mechanisms.rotation import RandomRotation, linf_radius
from shuffledp.simulation.vector_population import VectorPopulation
from shuffledp.simulation.vector import VectorSimulationConfig, run_vector_simulation


@pytest.mark.parametrize("dim", [1, 2, 5, 16, 100, 256])
def test_rotation_is_orthogonal_and_matches_the_dense_product(dim):
    rot = RandomRotation(dim, seed=11)
    u = rot.matrix()
    assert np.allclose(u @ u.T, np.eye(rot.padded_dim), atol=1e-12)
    x = np.random.default_rng(0).normal(size=(7, dim))
    padded = np.zeros((7, rot.padded_dim))
    padded[:, :dim] = x
    assert np.allclose(rot.apply(x), padded @ u.T, atol=1e-12)
    assert np.allclose(rot.inverse(rot.apply(x)), x, atol=1e-12)
    # Same seed, same public rotation on every party; another seed, another one.
    assert np.array_equal(RandomRotation(dim, 11).signs, rot.signs)
    if dim >= 16:
        assert not np.array_equal(RandomRotation(dim, 12).signs, rot.signs)


def test_rotation_rejects_bad_parameters():
    with pytest.raises(InvalidParameter):
        RandomRotation(0, 1)
    with pytest.raises(InvalidParameter):
        RandomRotation(4, -1).apply(np.zeros(4))
    with pytest.raises(InvalidParameter):
        RandomRotation(4, 1).apply(np.zeros(5))


def test_lemma2_linf_bound_holds_empirically():
    """Over 200 independent rotations, the l_inf bound (Hoeffding form, implying Lemma 2's
    constant 10) fails in at most a gamma fraction: the failure count is stochastically below
    Binomial(200, gamma), so the test's limit is that binomial's upper 1e-4 quantile."""
    n, dim, gamma, trials = 50, 64, 0.05, 200
    rng = np.random.default_rng(2)
    vectors = rng.normal(size=(n, dim)) * np.linspace(0.1, 3.0, dim)  # anisotropic: worst coordinates big
    center = vectors.mean(axis=0)
    radius = np.linalg.norm(vectors - center, axis=1).max()
    bound = linf_radius(radius, n, dim, gamma)
    paper_bound = 10 * radius * math.sqrt(math.log(dim * n / gamma)) / math.sqrt(dim)
    assert bound < paper_bound
    failures = 0
    for t in range(trials):
        rot = RandomRotation(dim, 1000 + t)
        deviation = np.abs(rot.apply(vectors) - rot.apply(center)).max()
        failures += deviation > bound
    assert failures <= stats.binom.isf(1e-4, trials, gamma)


def _config(mode: str, dim: int = 8) -> VectorMeanConfig:
    return VectorMeanConfig(dim=dim, rotated_bound=4.0, rotated_tau=0.5, epsilon0=4.0, mode=mode, rotation_seed=5)


def test_vector_estimator_is_unbiased_with_the_exact_per_coordinate_variance():
    """Fixed data and ranges; R repetitions of the mean round. Each coordinate's mean is
    within 4 standard errors (Bonferroni over 8 coordinates at ~5e-4 total), and the
    sample variance lies in the chi-square interval at 1e-4 per coordinate."""
    config = _config("sampled")
    rng = np.random.default_rng(3)
    n, reps = 400, 600
    means = rng.normal(0.3, 0.2, size=(n, config.dim))
    rotated = config.rotation.apply(means)
    ranges = np.stack([np.full(config.padded_dim, -1.5), np.full(config.padded_dim, 1.5)], axis=1)
    estimates = np.empty((reps, config.dim))
    model = VectorMeanAccumulator(config, ranges)
    model.add_truth(rotated)
    model.n = n
    for r in range(reps):
        acc = VectorMeanAccumulator(config, ranges)
        reports, grid = randomize_vector_mean(rotated, ranges, config.epsilon0 / 2.0, SeededSource(100 + r))
        acc.add(reports, grid)
        estimates[r] = acc.estimate()
    target = model.projected_mean()
    variance = model.variance()
    z = (estimates.mean(axis=0) - target) / np.sqrt(variance / reps)
    assert np.all(np.abs(z) < 4.0), z
    sample_var = estimates.var(axis=0, ddof=1)
    lo = stats.chi2.ppf(5e-5, reps - 1) / (reps - 1)
    hi = stats.chi2.ppf(1 - 5e-5, reps - 1) / (reps - 1)
    ratio = sample_var / variance
    assert np.all((ratio > lo) & (ratio < hi)), ratio


@pytest.mark.parametrize("mode", ["sampled", "paper"])
def test_range_round_finds_each_coordinates_bin(mode):
    config = VectorMeanConfig(dim=4, rotated_bound=8.0, rotated_tau=0.5, epsilon0=8.0, mode=mode, rotation_seed=1)
    rng = np.random.default_rng(4)
    means = rng.normal(1.0, 0.05, size=(20000, 4))
    rotated = config.rotation.apply(means)
    acc = VectorRangeAccumulator(config)
    acc.add(randomize_vector_range(rotated, config.range_params(), config.epsilon0 / 2.0, mode, SeededSource(9)))
    ranges = acc.ranges()
    assert np.all((rotated >= ranges[:, 0]) & (rotated <= ranges[:, 1]))
    assert acc.counts.sum() == (20000 if mode == "sampled" else 20000 * config.padded_dim)


def test_streaming_gives_the_same_result_as_one_batch(monkeypatch):
    """The fast engine folds each draw block's reports into the analyzer's collectors, or holds
    the round whole; the message engine opens real envelopes: one estimate, bit for bit."""
    import shuffledp.simulation.engine as engine
    from shuffledp.analyzer.vector_mean import VectorMeanProtocol
    from shuffledp.simulation.engine import run_fast

    monkeypatch.setattr(engine, "FAST_BLOCK", 512)  # 5000 users: ten draw blocks
    population = VectorPopulation("gaussian", 40, 20)
    assert population.block_users * 2 < 5000  # several population blocks too
    config = VectorSimulationConfig(population, 5000, 4.0, seed=8)
    protocol = VectorMeanProtocol(config.protocol_config())
    users = population.users(5000, 8)
    streamed = run_fast(protocol, users, 8, stream=True).result
    held = run_fast(protocol, np.asarray(users), 8, stream=False).result
    assert np.array_equal(streamed.estimate, held.estimate)
    assert np.array_equal(streamed.rotated_sums, held.rotated_sums)
    assert np.array_equal(run_vector_simulation(config).estimate, streamed.estimate)


def test_error_stays_within_theory_for_both_data_kinds():
    """Estimation error within 4x the exact RMSE (by Chebyshev, probability >= 15/16 at a fixed seed)."""
    for population, eps in ((VectorPopulation("gaussian", 16, 20), 4.0), (VectorPopulation("categorical", 16, 200), 4.0)):
        result = run_vector_simulation(VectorSimulationConfig(population, 20000, eps, seed=1))
        assert result.fraction_coordinates_ranges_hit == 1.0
        assert result.l2_error < 4 * math.sqrt(result.mse_theory)


@pytest.mark.parametrize("kind,mode", [("gaussian", "sampled"), ("gaussian", "paper"), ("categorical", "sampled")])
def test_the_simulation_gives_one_result_on_both_engines(kind, mode):
    """``shuffledp vector --fast`` and ``--messages`` with one seed: the same estimate, error and theory."""
    import dataclasses

    population = VectorPopulation(kind, 4, 30)
    config = VectorSimulationConfig(population, 300, 8.0, mode=mode, seed=1)
    fast, messages = run_vector_simulation(config), run_vector_simulation(dataclasses.replace(config, path="messages"))
    assert np.array_equal(fast.estimate, messages.estimate)
    for key in ("l2_error", "mse_theory", "theorem2_mse_bound", "fraction_coordinates_ranges_hit", "range_check"):
        assert getattr(fast, key) == getattr(messages, key), key
