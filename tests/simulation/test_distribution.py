"""Discrete distribution estimation: the vector-mean estimator's error falls with m as predicted."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from shuffledp.simulation.distribution import (
    DistributionConfig,
    _expected_tv,
    estimator_privacy,
    oracle_estimate,
    run_distribution,
    vector_one_round,
    vector_rounds,
)


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


def test_the_tv_spike_is_the_range_round_and_one_round_removes_it():
    """The vector estimator's TV rises when tau' falls below B = 1/sqrt(D) (here between m = 30 and
    m = 50): the protocol adds its range round, which halves the mean round's budget and widens its
    window from 2B to 6 tau'. Decisive check, 4 seeds: the same users at m = 50 through the one-round
    protocol (mean round at eps0 over [-B, B]) come back below the m = 30 error, while the two-round
    error is over 3 times it, as the exact error model predicts."""
    k, n, e0, seeds = 16, 10_000, 4.0, range(4)
    below, above = (vector_rounds(DistributionConfig(k, n, m, e0)) for m in (30, 50))
    assert not below["range_round"] and below["mean_epsilon"] == e0 and below["noise_ratio_to_one_round"] == 1.0
    assert above["range_round"] and above["mean_epsilon"] == e0 / 2
    assert above["mean_window_width"] > 2 * above["rotated_bound"] and above["noise_ratio_to_one_round"] > 4
    assert below["range_round_from_m"] == above["range_round_from_m"] == 35

    def vector_tv(m):
        rows = [run_distribution(DistributionConfig(k, n, m, e0, seed=s))["estimators"][1] for s in seeds]
        return np.mean([r["tv_error"] for r in rows]), np.mean([r["tv_theory"] for r in rows])

    def one_round_tv(m):
        rows = [vector_one_round(DistributionConfig(k, n, m, e0, seed=s)) for s in seeds]
        assert all(not r["range_round"] and r["mean_epsilon"] == e0 for r in rows)
        return np.mean([r["tv_error"] for r in rows]), np.mean([r["tv_theory"] for r in rows])

    tv30, theory30 = vector_tv(30)
    tv50, theory50 = vector_tv(50)
    one50, one_theory50 = one_round_tv(50)
    assert tv50 > 3 * tv30 and theory50 > 3 * theory30  # the spike, measured and predicted
    assert one50 < 1.1 * tv30  # gone without the range round, same users and seeds
    # both follow the exact error model (mean of 4 seeds: the sd of one TV is ~10 % here)
    assert tv50 == pytest.approx(theory50, rel=0.15) and one50 == pytest.approx(one_theory50, rel=0.25)


def test_the_range_round_pays_only_once_tau_is_below_a_sixth_of_the_bound():
    rounds = vector_rounds(DistributionConfig(64, 50_000, 100, 4.0))
    first, pays = rounds["range_round_from_m"], rounds["range_round_pays_from_m"]
    assert (first, pays) == (41, 1460)
    for m, costs_more in ((first, True), (pays - 1, True), (pays, False), (10 * pays, False)):
        r = vector_rounds(DistributionConfig(64, 50_000, m, 4.0))
        assert r["range_round"] and (r["noise_ratio_to_one_round"] > 1) == costs_more, (m, r)
    assert vector_rounds(DistributionConfig(64, 50_000, pays, 4.0))["rotated_tau"] == pytest.approx(
        rounds["rotated_bound"] / 6, rel=0.01)


def test_each_estimator_states_its_local_and_central_guarantee():
    config = DistributionConfig(k=16, n=10_000, m=50, epsilon0=4.0, delta=1e-6)
    privacy = estimator_privacy(config)
    oracle, vector = privacy["oracle"], privacy["vector"]
    assert oracle["local_epsilon0"] == vector["local_epsilon0"] == 4.0
    assert [r["accounted_as"] for r in oracle["rounds"]] == ["block-hadamard-response"]
    assert [(r["mechanism"], r["report_epsilon0"]) for r in vector["rounds"]] == [("vector-range", 2.0), ("vector-mean", 2.0)]
    assert all(r["accounted_as"] is not None for r in vector["rounds"])
    for entry in (oracle, vector):
        assert 0 < entry["central"]["epsilon"] < 4.0 and entry["central"]["delta"] == 1e-6
    one = estimator_privacy(DistributionConfig(k=16, n=10_000, m=10, epsilon0=4.0, delta=1e-6))["vector"]
    assert [(r["mechanism"], r["report_epsilon0"]) for r in one["rounds"]] == [("vector-mean", 4.0)]
    # no delta given: the default every command uses, min(1e-6, n^-1.1)
    default = estimator_privacy(DistributionConfig(k=16, n=10_000, m=10, epsilon0=4.0))
    assert default["vector"]["central"] == one["central"] and default["oracle"]["central"]["delta"] == 1e-6


def test_the_command_prints_tv_l2_rounds_and_both_guarantees(capsys):
    from shuffledp.cli import main
    from shuffledp.cli.common import default_delta

    argv = ["distribution", "-k", "16", "-n", "3000", "-m", "10,100", "-q", "--seed", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "oracle TV" in out and "vector TV" in out and out.count("l2") >= 2
    assert "range + mean" in out and "mean only" in out and "not monotone in m" in out
    assert f"delta = {default_delta(3000):.3g}" in out and out.count("central after shuffling: eps = ") == 3
    assert main([*argv, "--json"]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert len(results) == 2
    for r in results:
        assert r["config"]["delta"] == default_delta(3000)
        for e in r["estimators"]:
            assert {"tv_error", "tv_theory", "l2_error", "l2_theory"} <= set(e)
            assert e["privacy"]["local_epsilon0"] == 4.0 and e["privacy"]["central"]["epsilon"] > 0
