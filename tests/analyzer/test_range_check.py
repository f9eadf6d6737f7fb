"""The analyzer's check of its own range round: an empty announced bin passes with probability at
most alpha (Hoeffding + union bound), the a-priori requirement holds, runs that fail are warned
about, and the simulation reports warnings and misses over many seeds."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shuffledp.analyzer.decoders import announce_range, hadamard_frequencies
from shuffledp.analyzer.range_check import check_range_round, detection_threshold, users_needed
from shuffledp.cli import main
from shuffledp.client.range_randomizer import randomize_range
from shuffledp.simulation.population import Population
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.wire.messages import HadamardRangeParams
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
    assert not check.ok and check.reasons and check.as_dict()["status"] == "warning"
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
    assert result["range_check"]["status"] == "warning" and not result["range_contains_true_mean"]
    assert main(["simulate", "-n", "500", "-B", "200", "-e", "0.5", "--seeds", "10", "--json", "-q"]) == 0
    study = json.loads(capsys.readouterr().out)
    assert study["runs"] == 10 and study["missed"] == 0 and "missed_rate" in study


def test_the_vector_range_round_is_checked_per_coordinate(capsys):
    # B = 200 with n = 2,000 users spread over 16 coordinates (about 125 reports each, against the
    # 1,000s a coordinate needs): every coordinate's range misses, and every one is warned about.
    assert main(["vector", "-n", "2000", "-B", "200", "-e", "1", "-d", "16", "--json", "-q"]) == 0
    hard = json.loads(capsys.readouterr().out)
    assert hard["fraction_coordinates_ranges_hit"] < 0.5
    assert hard["range_check"]["status"] == "warning" and hard["range_check"]["coordinates"] == 16
    assert len(hard["range_check"]["warned_coordinates"]) >= 8
    assert main(["vector", "-n", "20000", "-d", "16", "--json", "-q"]) == 0
    easy = json.loads(capsys.readouterr().out)
    assert easy["fraction_coordinates_ranges_hit"] > 0.99 and easy["range_check"]["status"] == "ok"
