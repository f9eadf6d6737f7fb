"""The shuffled audit: its event probabilities are the shipped randomizers', its bounds are valid and
tight at the audit's target (binary RR within 2x of exact), and it catches a randomizer that keeps too often."""

from __future__ import annotations

import numpy as np
import pytest

from shuffledp.audit.local import clopper_pearson
from shuffledp.audit.shuffled import audit_shuffled, count_histograms, event_probabilities
from shuffledp.client import krr
from shuffledp.client.krr import randomize_krr
from shuffledp.client.range_randomizer import randomize_range
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.hadamard import hadamard_entry
from shuffledp.protocol.wire.messages import HadamardRangeParams
from shuffledp.protocol.mechanisms.randomness import SeededSource

#: Confidence of the frequency checks: a correct randomizer fails one once in 10^5 runs.
CONFIDENCE = 1.0 - 1e-5
#: Level of the two-sample tests of the count histograms.
ALPHA = 1e-3


def _within(hits: int, trials: int, p: float) -> bool:
    low, high = clopper_pearson(hits, trials, CONFIDENCE)
    return low <= p <= high


@pytest.mark.parametrize("epsilon0", [0.5, 1.0, 4.0])
def test_binary_rr_event_probabilities_are_the_shipped_randomizers(epsilon0):
    a, b, _ = event_probabilities("binary-rr", epsilon0)
    trials = 200_000
    from_x = randomize_krr(np.zeros(trials, dtype=np.int64), 2, epsilon0, SeededSource(1))
    from_x_prime = randomize_krr(np.ones(trials, dtype=np.int64), 2, epsilon0, SeededSource(2))
    assert _within(int((from_x == 1).sum()), trials, a)
    assert _within(int((from_x_prime == 1).sum()), trials, b)


@pytest.mark.parametrize("epsilon0,bins", [(1.0, 2), (4.0, 16)])
def test_hadamard_event_probabilities_are_the_shipped_randomizers(epsilon0, bins):
    a, b, _ = event_probabilities("hadamard-range", epsilon0, bins)
    params = HadamardRangeParams(0.0, 2.0 * bins, 1.0)  # bin v is [2v, 2v + 2)
    trials = 200_000
    for value, expected, seed in ((0.5, a, 3), (2.5, b, 4)):  # bin 0, then bin 1
        rows, bits = randomize_range(np.full(trials, value), params, epsilon0, SeededSource(seed))
        differ = hadamard_entry(rows, np.zeros_like(rows)) != hadamard_entry(rows, np.ones_like(rows))
        in_event = differ & (bits == hadamard_entry(rows, np.ones_like(rows)))
        assert _within(int(in_event.sum()), trials, expected)


@pytest.mark.parametrize("n,a,b", [(50, 0.3, 0.9), (1000, 0.018, 0.982), (7, 0.5, 0.5)])
def test_count_histograms_are_those_of_independent_rounds(n, a, b):
    """The histograms drawn whole (multinomial, by binary splitting) against rounds drawn one by one
    (``C = Bin(n, a)`` under D0, ``Bin(n - 1, a) + Bern(b)`` under D1): a two-sample chi-square test per
    dataset (cells pooled to 20 expected), each at level ALPHA = 1e-3 with fixed seeds."""
    from scipy.stats import chi2_contingency

    rounds = 20_000
    whole = count_histograms(n, a, b, rounds, np.random.default_rng(11))
    rng = np.random.default_rng(12)
    one_by_one = (np.bincount(rng.binomial(n, a, rounds), minlength=n + 1),
                  np.bincount(rng.binomial(n - 1, a, rounds) + (rng.random(rounds) < b), minlength=n + 1))
    for drawn, direct in zip(whole, one_by_one):
        assert drawn.sum() == rounds and drawn.shape == (n + 1,)
        cells, pooled = [], np.zeros(2, dtype=np.int64)
        for pair in np.stack([drawn, direct], axis=1):
            pooled += pair
            if pooled.sum() >= 40:
                cells.append(pooled.copy())
                pooled[:] = 0
        cells[-1] += pooled
        assert chi2_contingency(np.array(cells).T, correction=False).pvalue > ALPHA


@pytest.mark.parametrize("n,epsilon0", [(100, 1.0), (100, 4.0), (1000, 1.0), (1000, 4.0)])
def test_lower_bound_stays_below_the_exact_epsilon(n, epsilon0):
    result = audit_shuffled("binary-rr", n, epsilon0, rounds=10**6, seed=n)
    assert result.exact_epsilon is not None
    assert result.lower_bound <= result.exact_epsilon <= result.claimed_epsilon * (1 + 1e-9)
    assert result.passed


def test_lower_bound_is_within_2x_of_exact_for_rr_at_n_1000():
    """The audit's target: within 2x of exact for binary RR, n = 1000, eps0 = 4, 10^7 shuffled
    rounds per sample."""
    result = audit_shuffled("binary-rr", 1000, 4.0, seed=7)
    assert result.exact_epsilon / 2 <= result.lower_bound <= result.exact_epsilon


def test_a_randomizer_that_keeps_too_often_is_caught(monkeypatch):
    """At n = 100 and eps0 = 4 shuffling amplifies little, so a keep probability of eps0 + 0.25 shows.

    (The Hadamard range randomizer's shuffled count statistic is too weak for this: half its rows
    carry nothing. Its keep probability is audited locally, ``shuffledp/audit/local.py``.)"""
    correct = audit_shuffled("binary-rr", 100, 4.0, rounds=10**6, seed=1)
    assert correct.passed
    original = krr.krr_keep_probability
    monkeypatch.setattr(krr, "krr_keep_probability", lambda k, eps: original(k, eps + 0.25))
    faulty = audit_shuffled("binary-rr", 100, 4.0, rounds=10**6, seed=1)
    assert faulty.claimed_epsilon == correct.claimed_epsilon  # the accountant still claims eps0 = 4
    assert not faulty.passed and faulty.lower_bound > correct.claimed_epsilon


def test_an_understated_claim_fails_the_audit():
    honest = audit_shuffled("binary-rr", 1000, 4.0, rounds=10**6, seed=2)
    wrong = audit_shuffled("binary-rr", 1000, 4.0, rounds=10**6, seed=2, claim=(honest.lower_bound / 2, "planted", None))
    assert honest.passed and not wrong.passed


@pytest.mark.parametrize(
    "kwargs,param",
    [
        (dict(n=1), "n"),
        (dict(rounds=10), "rounds"),
        (dict(confidence=1.0), "confidence"),
        (dict(delta=1.0), "delta"),
        (dict(mechanism="laplace"), "mechanism"),
    ],
)
def test_bad_arguments_are_refused(kwargs, param):
    args = dict(mechanism="binary-rr", n=100, epsilon0=1.0, rounds=1000)
    args.update(kwargs)
    with pytest.raises(InvalidParameter, match=param):
        audit_shuffled(args.pop("mechanism"), args.pop("n"), args.pop("epsilon0"), **args)
