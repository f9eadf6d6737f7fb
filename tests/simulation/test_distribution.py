"""Discrete distribution estimation: the vector-mean estimator's error falls with m as predicted."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shuffledp.simulation.distribution import DistributionConfig, _expected_tv, oracle_estimate, run_distribution


def _tv_tolerance(variances: np.ndarray) -> float:
    """4 standard deviations of 0.5 * sum |X_k|, X_k ~ N(0, v_k) independent:
    Var|X_k| = v_k (1 - 2/pi). (Estimates of different symbols are weakly correlated;
    the normal, independent model is the stated approximation.)"""
    return 4 * 0.5 * math.sqrt(float(np.sum(variances)) * (1 - 2 / math.pi))


@pytest.mark.parametrize("m", [30, 3000])
def test_vector_estimator_tv_error_matches_theory(m):
    config = DistributionConfig(k=16, n=10_000, m=m, epsilon0=4.0, seed=2)
    result = run_distribution(config)
    oracle, vector = result["estimators"]
    assert result["vector_ranges_hit"] == 1.0
    # Recover each estimator's variance scale from its l2 theory (sum of variances) for the tolerance.
    for row in (oracle, vector):
        tol = _tv_tolerance(np.array([row["l2_theory"] ** 2]))
        assert abs(row["tv_error"] - row["tv_theory"]) <= tol, row


def test_tv_error_falls_with_m_as_predicted():
    """From m = 50 to m = 5000 the radius tau' shrinks by 10 (it scales as 1/sqrt(m); at m = 50 it
    is still below the rotated bound 1/sqrt(D), so it is not capped). The predicted TV falls, by
    less than 10x because the coordinate-sampling term (D - 1)||y||^2 / n does not shrink; the
    measured TV follows the prediction at each m (within the 4-sd tolerance), while the
    oracle, which sees one sample per user, does not move."""
    small, large = (run_distribution(DistributionConfig(16, 10_000, m, 4.0, seed=3)) for m in (50, 5000))
    assert small["vector_rotated_tau"] / large["vector_rotated_tau"] == pytest.approx(10.0, rel=1e-9)
    for result in (small, large):
        vector = result["estimators"][1]
        assert abs(vector["tv_error"] - vector["tv_theory"]) <= _tv_tolerance(np.array([vector["l2_theory"] ** 2]))
    assert small["estimators"][1]["tv_theory"] > 4 * large["estimators"][1]["tv_theory"]
    assert small["estimators"][1]["tv_error"] > 2 * large["estimators"][1]["tv_error"]
    assert small["estimators"][0]["tv_theory"] == pytest.approx(large["estimators"][0]["tv_theory"], rel=1e-12)


def test_oracle_theory_is_exact_variance_plus_sampling():
    config = DistributionConfig(k=8, n=5000, m=1, epsilon0=1.0, seed=4)
    _, variance = oracle_estimate(config)
    p = config.population().probabilities
    assert np.all(variance > p * (1 - p) / config.n)
    assert _expected_tv(variance) > 0


def test_both_engines_give_one_distribution_estimate():
    """The vector estimator is the vector mean protocol on either engine: one seed, one estimate."""
    import dataclasses

    config = DistributionConfig(k=6, n=200, m=20, epsilon0=4.0, seed=5)
    fast, messages = run_distribution(config), run_distribution(dataclasses.replace(config, path="messages"))
    assert fast["estimators"] == messages["estimators"]
    assert (fast["vector_ranges_hit"], fast["vector_rotated_tau"]) == (messages["vector_ranges_hit"], messages["vector_rotated_tau"])
