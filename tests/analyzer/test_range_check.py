"""The analyzer's check of its own range round: an empty bin's agreement count is exactly
Binomial(n, 1/2), so an empty announced bin passes the frequency test with probability at most
alpha (exact tail + union bound), the mean round's sign test has its exact null when every user is
clipped to one end, the weighted combination of the two is super-uniform, the two-round verdict
misses no failure and rarely distrusts a good range in a hard regime, and the simulation reports
both over many seeds."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shuffledp.analyzer.decoders import announce_range, hadamard_frequencies
from shuffledp.analyzer.range_check import (
    binomial_lower_tail,
    check_range_round,
    clipping_p_value,
    combined_p_value,
    combined_survival,
    combined_threshold,
    count_threshold,
    detection_threshold,
    range_p_value,
    range_weight,
    users_needed,
    weighted_threshold,
)
from shuffledp.client.mean_randomizer import randomize_mean
from shuffledp.cli import main
from shuffledp.client.range_randomizer import randomize_range
from shuffledp.simulation.population import Population
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.wire.messages import HadamardRangeParams, ProjectedMeanParams
from shuffledp.protocol.mechanisms.randomness import SeededSource
from shuffledp.studies.range_check import range_study
from shuffledp.simulation import SimulationConfig

PARAMS = HadamardRangeParams(-16.0, 16.0, 0.5)  # 32 bins
EPS = 0.5


def _round_frequencies(n: int, reps: int, seed: int) -> np.ndarray:
    """``reps`` range rounds of the real randomizer, all ``n`` users in bin 0: ``(reps, K)`` estimates."""
    source = SeededSource(seed)
    values = np.full(n, PARAMS.bin_center(0))
    out = np.empty((reps, PARAMS.num_bins))
    for r in range(reps):
        rows, bits = randomize_range(values, PARAMS, EPS, source)
        out[r] = hadamard_frequencies(rows, bits, PARAMS.padded_bins, EPS)[: PARAMS.num_bins]
    return out


def test_an_empty_bin_reaches_the_threshold_at_most_alpha_of_the_time():
    # All users in bin 0: bins 1..31 are empty. The check's guarantee: P(any empty bin >= t_alpha)
    # <= alpha = 0.01. Over 1,000 rounds the count is at most Binomial(1000, 0.01): P(count > 22) < 1e-4.
    n, reps = 400, 1000
    freqs = _round_frequencies(n, reps, seed=11)
    threshold = detection_threshold(EPS, PARAMS.num_bins, n)
    exceed = int(np.sum(freqs[:, 1:].max(axis=1) >= threshold))
    assert exceed <= 22
    # and it is not vacuous: the occupied bin clears it in most rounds (its mean is 1, threshold < 1)
    assert threshold < 1.0 and np.mean(freqs[:, 0] >= threshold) > 0.5


def test_users_needed_finds_the_right_bin():
    # At n = users_needed(beta = 0.05), the arg-max is bin 0 except with probability <= 0.05:
    # over 200 rounds the failures are at most Binomial(200, 0.05): P(> 22) < 1e-4.
    n = users_needed(EPS, PARAMS.num_bins, beta=0.05)
    freqs = _round_frequencies(n, 200, seed=12)
    wrong = int(np.sum(freqs.argmax(axis=1) != 0))
    assert wrong <= 22
    assert all(check_range_round(f, int(f.argmax()), n, EPS).ok for f in freqs[:20] if f.argmax() == 0)


def test_an_empty_announced_bin_is_warned_about():
    n = 300
    freqs = _round_frequencies(n, 1, seed=13)[0]
    empty = int(1 + np.argmax(freqs[1:]))  # the best-looking empty bin
    check = check_range_round(freqs, empty, n, EPS)
    assert not check.ok and check.reasons and check.as_dict()["status"] == "untrusted"
    found = announce_range(freqs, PARAMS)
    assert check_range_round(freqs, found.bin, n, EPS).users_needed == users_needed(EPS, PARAMS.num_bins)


@pytest.mark.parametrize("bad", [{"epsilon": 0.0}, {"n": 0}, {"announced_bin": 99}, {"alpha": 1.5}])
def test_bad_arguments_are_typed(bad):
    args = {"frequencies": np.zeros(4), "announced_bin": 0, "n": 10, "epsilon": 1.0} | bad
    alpha = args.pop("alpha", 0.01)
    with pytest.raises(InvalidParameter):
        check_range_round(**args, alpha=alpha)


def test_the_study_warns_on_every_failure_in_the_hard_regime_and_not_in_the_easy_one():
    # n = 500, B = 200, eps0 = 0.5: about half the range rounds announce an empty bin.
    hard = SimulationConfig(Population("gaussian", 1.7, 1.0, 200.0, 50), n=500, epsilon0=0.5)
    study = range_study(hard, 40)
    assert study.failed >= 5  # the hard regime: failures happen
    assert study.missed == 0  # each is warned about (a miss has probability <= 0.01 per run)
    assert study.worst_warned_z > 20 and study.worst_unwarned_z < 5
    easy = SimulationConfig(Population("gaussian", 1.7, 1.0, 20.0, 50), n=20_000, epsilon0=1.0)
    easy_study = range_study(easy, 5)
    assert easy_study.failed == easy_study.warned == 0


def test_simulate_reports_the_check_and_the_study(capsys):
    assert main(["simulate", "--fast", "-n", "500", "-B", "200", "-e", "0.5", "--seed", "1", "--json", "-q"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["range_check"]["status"] == "untrusted" and not result["range_contains_true_mean"]
    assert result["range_check"]["clipping_p_value"] is not None
    assert main(["simulate", "-n", "500", "-B", "200", "-e", "0.5", "--seeds", "10", "--json", "-q"]) == 0
    study = json.loads(capsys.readouterr().out)
    assert study["runs"] == 10 and study["missed"] == 0 and "missed_rate" in study


def test_the_vector_range_round_is_checked_per_coordinate(capsys):
    # B = 200 with n = 2,000 users spread over 16 coordinates (about 125 reports each, against the
    # 1,000s a coordinate needs): every coordinate's range misses, and every one is warned about.
    assert main(["vector", "-n", "2000", "-B", "200", "-e", "1", "-d", "16", "--json", "-q"]) == 0
    hard = json.loads(capsys.readouterr().out)
    assert hard["fraction_coordinates_ranges_hit"] < 0.5
    assert hard["range_check"]["status"] == "untrusted" and hard["range_check"]["coordinates"] == 16
    assert len(hard["range_check"]["warned_coordinates"]) >= 8
    assert main(["vector", "-n", "20000", "-d", "16", "--json", "-q"]) == 0
    easy = json.loads(capsys.readouterr().out)
    assert easy["fraction_coordinates_ranges_hit"] > 0.99 and easy["range_check"]["status"] == "ok"


def test_binomial_lower_tail_is_the_exact_tail():
    from scipy.stats import binom

    # The rounding margin grows with n log n; at a billion users it is still under 0.1 %.
    for count, n, p, rel in ((0, 10, 0.3, 1e-9), (3, 10, 0.5, 1e-9), (880, 2000, 0.4999, 1e-7), (4_900, 10_000, 0.5, 1e-7),
                             (12, 1_000_000, 1e-4, 1e-5), (499_900_000, 10**9, 0.5, 1e-3)):
        exact = float(binom.cdf(count, n, p))
        assert binomial_lower_tail(count, n, p) == pytest.approx(exact, rel=rel)
        assert binomial_lower_tail(count, n, p) >= exact  # never below: a p-value's guarantee
    assert binomial_lower_tail(6, 10, 0.5) == 1.0  # at or above the mean: rounded up to 1
    with pytest.raises(InvalidParameter):
        binomial_lower_tail(11, 10, 0.5)


def test_combined_threshold_solves_its_equation():
    for alpha in (0.1, 0.01, 0.001):
        k = combined_threshold(alpha)
        assert k * (1 - np.log(k)) == pytest.approx(alpha, rel=1e-9)
    # The bound it relies on: two independent uniforms' product is <= k with probability k (1 - ln k).
    rng = np.random.default_rng(5)
    product = rng.random(400_000) * rng.random(400_000)
    k = combined_threshold(0.01)
    # Binomial(400000, 0.01): sd 63; 5 sd each side.
    assert abs(int(np.sum(product <= k)) - 4_000) < 5 * 63


@pytest.mark.parametrize("noise,delta,eps", [("laplace", 0.0, 0.25), ("gaussian", 1e-6, 2.0)])
def test_the_sign_test_has_its_exact_null_when_every_user_is_clipped(noise, delta, eps):
    # Every user's local mean lies above the announced range, so every report is G + noise.
    # The upper end's p-value is then an exact binomial tail: P(p <= x) <= x, and close to x once
    # the lower end's is negligible (the null is composite: the larger of the two is reported), which
    # at n = 300 needs P(noise < -G) well below 1/2: Laplace at eps 0.25 (0.39), Gaussian at eps 2 (0.31).
    params = ProjectedMeanParams(-2.0, 2.0, noise, 4096)
    n, reps = 300, 2_000
    source = SeededSource(21)
    pvalues = np.empty(reps)
    for r in range(reps):
        reports = randomize_mean(np.full(n, 7.5), params, eps, source, delta)
        values, counts = np.unique(reports, return_counts=True)
        pvalues[r] = clipping_p_value(values, counts, params, eps, delta)
    # Binomial(2000, x) upper tails at 5 sd: P(p <= 0.05) <= 0.05 and P(p <= 0.2) <= 0.2.
    for x, sd in ((0.05, 9.7), (0.2, 17.9)):
        hits = int(np.sum(pvalues <= x))
        assert hits <= reps * x + 5 * sd
        assert hits >= reps * x - 10 * sd  # not vacuous: a test that never rejects would pass the first
    # The same users inside the range: the reports beyond the ends are far fewer, p is tiny.
    inside = randomize_mean(np.full(n * 20, 0.0), params, eps, source, delta)
    values, counts = np.unique(inside, return_counts=True)
    assert clipping_p_value(values, counts, params, eps, delta) < 1e-3


def test_an_empty_bins_count_is_exactly_a_fair_binomial():
    # All users in bin 0 of 32 (padded to 32): for every other bin a, b_i H[j_i, a] = s_i H[j_i, a xor 0]
    # with j_i uniform, a fair +-1, so the agreement count (n + S_a) / 2 is Binomial(n, 1/2) exactly.
    # Over 1,000 rounds x 31 bins, the counts' mean (n/2 = 100) and variance (n/4 = 50) hold to within
    # 5 standard errors: mean se = sqrt(50 / 31000) = 0.04; variance se ~ 50 sqrt(2 / 31000) = 0.4
    # (the bins of one round are dependent, so the check uses per-round means: se x sqrt(31) at most).
    n = 200
    freqs = _round_frequencies(n, 1000, seed=14)
    counts = (n + np.rint(freqs[:, 1:] * n / (1 / np.tanh(EPS / 2)))) / 2
    assert abs(counts.mean() - n / 2) < 5 * 0.04 * np.sqrt(31)
    assert abs(counts.var() - n / 4) < 5 * 0.4 * np.sqrt(31)
    assert np.all(counts == np.floor(counts))  # integer counts: the estimate is c (2A - n) / n exactly


def test_range_p_value_is_the_exact_binomial_tail_times_the_bins():
    from scipy.stats import binom

    n, bins, alpha = 2_000, 623, 0.01
    scale = 1 / np.tanh(EPS / 2)
    for agree in (1_000, 1_050, 1_090, 1_150):
        estimate = scale * (2 * agree - n) / n
        exact = min(1.0, bins * float(binom.sf(agree - 1, n, 0.5)))
        assert range_p_value(estimate, EPS, bins, n) == pytest.approx(exact, rel=1e-7)
        assert range_p_value(estimate, EPS, bins, n) >= exact
    # The exact tail is never above Hoeffding's, and the exact threshold is never above its threshold.
    t = detection_threshold(EPS, bins, n, alpha)
    assert range_p_value(t, EPS, bins, n) <= alpha
    exact_t = count_threshold(EPS, bins, n, alpha)
    assert exact_t < t and range_p_value(exact_t, EPS, bins, n) <= alpha
    assert range_p_value(exact_t - 2 * scale / n, EPS, bins, n) > alpha  # one agreement fewer fails
    assert range_p_value(-0.2, EPS, bins, n) == 1.0 and range_p_value(0.0, EPS, bins, n) == 1.0


def test_combined_survival_is_the_law_of_the_weighted_exponentials():
    # P(w E1 + (1 - w) E2 >= t) against 400,000 draws: Binomial sd <= sqrt(400000 / 4) = 316; 5 sd each side.
    rng = np.random.default_rng(6)
    e1, e2 = rng.exponential(size=(2, 400_000))
    for weight in (0.0, 0.25, 0.5, 0.85, 1.0):
        t = 3.0
        hits = int(np.sum(weight * e1 + (1 - weight) * e2 >= t))
        assert abs(hits - 400_000 * combined_survival(weight, t)) < 5 * 316
        k = weighted_threshold(0.01, weight)
        assert combined_survival(weight, -np.log(k)) == pytest.approx(0.01, rel=1e-9)
    # w = 1/2 is Fisher's product: its threshold is the square root of the product's.
    assert weighted_threshold(0.01, 0.5) ** 2 == pytest.approx(combined_threshold(0.01), rel=1e-9)
    assert combined_p_value(1.0, 1.0, 0.3) == 1.0 and combined_p_value(1e-3, 1.0, 1.0) == pytest.approx(1e-3)


def test_the_combined_p_value_is_super_uniform_for_uniform_inputs():
    # Two independent uniforms (the worst case of two super-uniform p-values): P(p <= x) = x.
    # 20,000 draws per weight: Binomial sd at x = 0.05 is 31, at 0.01 is 14; 5 sd.
    rng = np.random.default_rng(7)
    u = rng.random((2, 20_000))
    for weight in (0.3, 0.5, 0.9):
        p = np.array([combined_p_value(a, b, weight) for a, b in u.T])
        for x, sd in ((0.05, 31), (0.01, 14)):
            assert abs(int(np.sum(p <= x)) - 20_000 * x) < 5 * sd


def test_the_range_round_weight_follows_the_evidence_each_round_can_give():
    # B = 1000, n = 2,000, eps = 0.25 per round: the range round's design z is sqrt(n)/c = 5.6. With Laplace
    # noise (scale 4G) the sign test's design z is about 5 too, so the weight stays near 1/2; with Gaussian
    # noise (sigma about 20 G) it is about 1, and the weight moves to the range round.
    laplace = range_weight(2_000, 623, 0.25, 2_000, ProjectedMeanParams(-2.0, 2.0, "laplace", 4096), 0.25)
    gaussian = range_weight(2_000, 623, 0.25, 2_000, ProjectedMeanParams(-2.0, 2.0, "gaussian", 4096), 0.25, 1e-6)
    assert 0.4 <= laplace <= 0.6 and gaussian >= laplace + 0.1


def test_the_two_round_verdict_misses_nothing_and_rarely_distrusts_in_the_hard_regime():
    # B = 1000, n = 2,000, m = 10, eps0 = 0.5: about 2 % of range rounds announce a range holding no
    # user. The verdict lets such a range pass w.p. <= 0.001 per run (joint), so over 1,000 seeds the
    # misses are at most Binomial(1000, 0.001): P(> 5) < 6e-4. It distrusts 1.6 % [1.2, 2.1] of the runs
    # over 3,000 seeds (`benchmarks/bench_range_check.py --regimes`, first row); over these 1,000 seeds a
    # rate of 2.1 % gives mean 21 and sd 4.5, so 35 false warnings (3 sd above) would mean the verdict
    # lost power; the frequency test alone (alpha = 0.01) distrusted about 10 %.
    config = SimulationConfig(Population("gaussian", 1.7, 1.0, 1000.0, 10), n=2_000, epsilon0=0.5)
    study = range_study(config, 1_000)
    assert study.failed >= 8  # the regime is hard: Binomial(1000, 0.02) has mean 20
    assert study.missed <= 5 and study.silent_misses <= 5
    assert study.false_warnings <= 35
    assert study.frequency_only_false_warnings > 2 * study.false_warnings  # the mean round's evidence counts
    assert study.worst_warned_z > 50
