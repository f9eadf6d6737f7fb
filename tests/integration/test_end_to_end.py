"""End to end: shuffledp/simulation.run_simulation on both execution paths, and the
concentration radius of analyzer/scalar_mean.

Error model (exact, given the range announced in round 1): the estimate minus the
mean of all samples is ``bias + noise`` where ``bias`` is the clipping bias and
``noise`` an average of n independent zero-mean terms, and
``E[error^2 | range] = rmse_theory^2`` exactly (that is how simulation.py defines
``rmse_theory``). Hence:

* single runs (fixed seeds): ``|error| <= 4 rmse_theory``. By Chebyshev the
  probability of exceeding it is at most 1/16 for any seed; since ``noise`` is a
  sum of thousands of independent bounded-variance terms it is Gaussian to a very
  good approximation, which makes it at most 2 Phi(-4) ~ 6e-5 (worst case: no bias);
* the fast and message paths must give the same error distribution: a two-sample
  Kolmogorov-Smirnov test on independent runs (disjoint seeds), and for each path
  ``sum_k (error_k / rmse_theory_k)^2`` over the runs whose range covered every
  user (bias exactly 0, so each term is a squared standard normal) against the
  chi-square distribution with that many degrees of freedom. The three
  statistics share family-wise level ALPHA = 1e-3 (Bonferroni, ALPHA/3 each).

The central guarantee comes from the real accountant (memoized per configuration,
so the many runs of one configuration pay for it once); each run checks that it is a
valid amplified bound: positive, below the local eps0 it composes, and labelled.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from shuffledp.analyzer.scalar_mean import concentration_radius
from shuffledp.simulation.population import Population
from shuffledp.simulation import SimulationConfig, run_simulation

ALPHA = 1e-3
POPULATION = Population("gaussian", 1.7, 1.0, 20.0, 50)
# For the n = 300 comparisons: a smaller data bound B gives 6 bins instead of 31, so the
# range round (whose per-bin noise sd is c / sqrt(n) ~ 0.24 here) rarely picks a wrong bin.
SMALL_POPULATION = Population("gaussian", 1.7, 1.0, 4.0, 50)


def check_central(result, config):
    central = result.central
    assert 0 < central["epsilon"] <= config.epsilon0
    assert central["epsilon"] <= central["basic_composition_epsilon"]
    assert central["delta"] == pytest.approx(config.delta)
    assert [r["method"] for r in central["per_round"]] and all(r["epsilon"] < config.epsilon0 / 2 + 1e-12 for r in central["per_round"])


def check_run(result, config):
    check_central(result, config)
    assert result.true_mean == pytest.approx(result.population_mean, abs=6 * math.sqrt(POPULATION.variance / (config.n * POPULATION.m)))
    assert result.error == result.estimate - result.true_mean
    assert result.rmse_theory > 0
    assert abs(result.error) <= 4 * result.rmse_theory, (result.error, result.rmse_theory)
    low, high = result.range_found
    assert low <= result.true_mean <= high
    assert result.range_contains_true_mean
    assert high - low == pytest.approx(6 * result.config["tau"])
    assert result.local_epsilon == config.epsilon0


def test_fast_path_accuracy():
    config = SimulationConfig(POPULATION, 20_000, 1.0, seed=11, path="fast")
    result = run_simulation(config)
    check_run(result, config)
    assert [r["messages"] for r in result.rounds] == [config.n, config.n]


def test_message_path_accuracy():
    config = SimulationConfig(POPULATION, 2_000, 1.0, seed=12, path="messages")
    result = run_simulation(config)
    check_run(result, config)
    for r in result.rounds:
        # every user's report went through shuffler and analyzer; nothing rejected
        assert r["messages"] == config.n
        assert r["rejected_at_shuffler"] == {} and r["rejected_at_analyzer"] == {}
    assert [r["mechanism"] for r in result.rounds] == ["hadamard-range", "projected-mean"]


def test_fast_path_counts_the_bytes_the_message_path_sends():
    """Reports are padded to one size per round, so both paths count the same envelope bytes."""
    fast, messages = (
        run_simulation(SimulationConfig(SMALL_POPULATION, 300, 1.0, seed=3, path=path)) for path in ("fast", "messages")
    )
    assert [r["envelope_bytes"] for r in fast.rounds] == [r["envelope_bytes"] for r in messages.rounds]


def runs(path: str, seeds) -> list:
    return [run_simulation(SimulationConfig(SMALL_POPULATION, 300, 1.0, seed=s, path=path)) for s in seeds]


def test_fast_and_message_paths_have_the_same_error_distribution():
    fast = runs("fast", range(0, 200))  # the fast path is cheap: more runs, more power
    messages = runs("messages", range(1000, 1020))  # disjoint seeds: independent samples
    per_test = ALPHA / 3

    e_fast = np.array([r.error for r in fast])
    e_msg = np.array([r.error for r in messages])
    assert stats.ks_2samp(e_fast, e_msg).pvalue > per_test

    # Range round failures are rare (a wrong arg-max needs a ~3 sd noise excursion among
    # 5 competitors, ~1e-2 per run); far fewer than 20% of runs may lose a user.
    covered = [r for r in fast + messages if r.fraction_users_in_range == 1.0]
    assert len(covered) >= 0.8 * (len(fast) + len(messages))
    for label, group in (("fast", fast), ("messages", messages)):
        z2 = np.array([(r.error / r.rmse_theory) ** 2 for r in group if r.fraction_users_in_range == 1.0])
        k = len(z2)
        lo, hi = stats.chi2.ppf(per_test / 2, k), stats.chi2.isf(per_test / 2, k)
        assert lo < z2.sum() < hi, (label, z2.sum(), lo, hi)


# --------------------------------------------------------------------------
# concentration radius
# --------------------------------------------------------------------------


def exact_miss_probability(tau: float, sigma: float, n: int, m: int) -> float:
    """P(max_i |y_i - mu| > tau) for n local means of m i.i.d. N(mu, sigma^2) samples."""
    per_user = 2 * stats.norm.sf(tau * math.sqrt(m) / sigma)
    return -math.expm1(n * math.log1p(-per_user))


@pytest.mark.parametrize("n,m,gamma,seed", [(50, 10, 0.2, 77), (200, 4, 0.5, 78)])
def test_concentration_radius_covers_all_users(n, m, gamma, seed):
    sigma, mu = 1.3, -0.4
    tau = concentration_radius(sigma, n, m, gamma)
    assert tau == pytest.approx(sigma * math.sqrt(2 * math.log(2 * n / gamma) / m))
    p_miss = exact_miss_probability(tau, sigma, n, m)
    assert p_miss <= gamma  # the union bound holds
    # the paper's radius sigma sqrt(log(2n/gamma)/m) would not: this gamma makes the check meaningful
    assert exact_miss_probability(sigma * math.sqrt(math.log(2 * n / gamma) / m), sigma, n, m) > gamma

    trials = 2000
    rng = np.random.default_rng(seed)
    local_means = rng.normal(mu, sigma, size=(trials, n, m)).mean(axis=2)
    misses = int(np.sum(np.abs(local_means - mu).max(axis=1) > tau))
    # the observed miss count is consistent with the exact probability (two-sided binomial test) ...
    assert stats.binomtest(misses, trials, p_miss).pvalue > ALPHA
    # ... and not significantly above gamma (one-sided)
    assert stats.binom.sf(misses - 1, trials, gamma) > ALPHA
