"""Exhaustive worst-dataset search (``shuffledp/studies/worst_dataset.py``) against brute force.

Each check can fail: the report laws against the client's randomizers (sampling), the symmetry
groups against their known orders and the float laws, the search (merged outputs, symmetry
reduction, segment solver) against an independent brute force over every dataset with the full
report alphabet, binary RR against ``rr_exact``, and the finding: at one cell the homogeneous
dataset is not the worst, by more than the certified error, and the accountant is above both.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from shuffledp.client.mean_randomizer import randomize_mean
from shuffledp.client.range_randomizer import hadamard_response
from shuffledp.protocol.accounting import hadamard_response_guarantee, shuffled_round
from shuffledp.protocol.accounting.rr_exact import rr_exact_epsilon
from shuffledp.protocol.mechanisms.randomness import SeededSource
from shuffledp.protocol.wire.messages import ProjectedMeanParams
from shuffledp.studies.worst_dataset import (
    dataset_epsilon,
    hadamard_law,
    laplace_law,
    search,
    symmetry_group,
)

SAMPLES = 200_000
#: A correct law fails the chi-square test with probability 1e-6 (fixed seed: deterministic).
CHI2_LEVEL = 1e-6


def _chi2_ok(counts: np.ndarray, probabilities: np.ndarray) -> bool:
    expected = counts.sum() * probabilities
    statistic = float(((counts - expected) ** 2 / expected).sum())
    return statistic <= stats.chi2.ppf(1 - CHI2_LEVEL, len(probabilities) - 1)


def test_hadamard_law_is_the_randomizers_law():
    law = hadamard_law(1.0, 4)
    for column in (0, 3):
        rows, bits = hadamard_response(np.full(SAMPLES, column), 4, 1.0, SeededSource(11 + column))
        merged = np.where(rows == 0, 0, 2 * rows - 1 + (bits == -1))  # row 0 merged; (j, +1), (j, -1)
        counts = np.bincount(merged, minlength=law.outputs)
        assert _chi2_ok(counts, law.probabilities[column])
        assert not _chi2_ok(counts, law.probabilities[column ^ 1])  # the test can tell columns apart


def test_laplace_law_is_the_randomizers_law_clipped():
    G, e0 = 3, 1.5
    params = ProjectedMeanParams(0.0, 3.0, "laplace", G)
    law = laplace_law(e0, G)
    for u in (0, 1):
        reports = randomize_mean(np.full(SAMPLES, float(u)), params, e0, SeededSource(21 + u))
        counts = np.bincount(np.clip(reports, 0, G), minlength=G + 1)
        assert _chi2_ok(counts, law.probabilities[u])
        assert not _chi2_ok(counts, law.probabilities[u + 1])


def test_symmetry_groups_are_symmetries_of_the_float_laws():
    for law, order in ((hadamard_law(1.0, 4), 24), (hadamard_law(1.0, 8), 1344), (laplace_law(1.0, 3), 2),
                       (laplace_law(1.0, 1), 2)):
        group = symmetry_group(law)
        assert len(group) == order, law.name  # AGL(m, 2); the reflection
        columns = sorted(map(tuple, law.probabilities.T))
        for sigma in group[:: max(1, len(group) // 50)]:
            assert sorted(map(tuple, law.probabilities[sigma].T)) == columns


def _full_hadamard(e0: float, K: int) -> np.ndarray:
    """Every (row, bit) output, ideal keep probability: built here from H, not from the module."""
    rho = math.exp(e0) / (math.exp(e0) + 1)
    R = np.zeros((K, 2 * K))
    for x, j in itertools.product(range(K), range(K)):
        h = 1 - 2 * (bin(j & x).count("1") % 2)
        R[x, 2 * j + (h == 1)], R[x, 2 * j + (h == -1)] = rho / K, (1 - rho) / K
    return R


def _full_laplace(e0: float, G: int, clamp: int) -> np.ndarray:
    """Reports -clamp..G+clamp of the clamped discrete Laplace report (scale G/eps0)."""
    r = math.exp(-e0 / G)
    ys = np.arange(-clamp, G + clamp + 1)
    R = (1 - r) / (1 + r) * r ** np.abs(ys[None, :] - np.arange(G + 1)[:, None])
    R[:, 0] = r ** (np.arange(G + 1) + clamp) / (1 + r)
    R[:, -1] = r ** (G + clamp - np.arange(G + 1)) / (1 + r)
    return R


def _brute_worst_delta(R: np.ndarray, n: int, eps: float) -> float:
    """max over every ordered pair and multiset of the others of D_{e^eps}(P||Q), every tuple of outputs."""
    k, d = R.shape
    tuples = np.array(list(itertools.product(range(d), repeat=n)))
    _, histogram = np.unique(np.sort(tuples, axis=1), axis=0, return_inverse=True)
    histogram = histogram.ravel()
    E, worst = math.exp(eps), 0.0
    for others in itertools.combinations_with_replacement(range(k), n - 1):
        for a, b in itertools.permutations(range(k), 2):
            laws = []
            for first in (a, b):
                mass = np.prod([R[x][tuples[:, i]] for i, x in enumerate((first, *others))], axis=0)
                laws.append(np.bincount(histogram, weights=mass))
            worst = max(worst, float(np.maximum(laws[0] - E * laws[1], 0).sum()))
    return worst


@pytest.mark.parametrize("name,e0,n,delta", [("hadamard", 2.0, 4, 1e-2), ("laplace", 1.0, 4, 1e-2)])
def test_search_agrees_with_brute_force_over_every_dataset(name, e0, n, delta):
    """At the search's worst epsilon the brute-force worst divergence is delta itself (the solver is
    exact: 1e-9 relative, far above the certified float error of ~1e-14 here)."""
    if name == "hadamard":
        law, R = hadamard_law(e0, 4, keep=math.exp(e0) / (math.exp(e0) + 1)), _full_hadamard(e0, 4)
    else:
        law, R = laplace_law(e0, 2), _full_laplace(e0, 2, 1)
    result = search(law, n, (delta,))
    lower, upper = result.exact_epsilon(0)
    assert upper - lower < 1e-9
    worst = result.worst(0).epsilon[0, 0]
    assert _brute_worst_delta(R, n, worst) == pytest.approx(delta, rel=1e-9)
    assert _brute_worst_delta(R, n, worst - 1e-3) > delta * (1 + 1e-6)  # and not a smaller epsilon


def test_binary_rr_is_the_one_level_laplace_report():
    for n, e0, delta in ((12, 1.0, 1e-3), (7, 3.0, 1e-2)):
        lower, upper = search(laplace_law(e0, 1), n, (delta,)).exact_epsilon(0)
        assert lower - 1e-9 <= rr_exact_epsilon(delta, n, e0) <= upper + 1e-9


def test_homogeneous_is_not_always_the_worst():
    """Hadamard response, K = 4, eps0 = 0.5, n = 6, delta = 1e-3: the others split between user 1's
    first column and a third column beat every homogeneous dataset by more than the certified error;
    the accountant's epsilon is above both."""
    e0, n, delta = 0.5, 6, 1e-3
    law = hadamard_law(e0, 4)
    result = search(law, n, (delta,))
    worst, homogeneous = result.worst(0), result.worst_homogeneous(0)
    assert worst.homogeneous is None
    assert worst.epsilon[0, 1] > homogeneous.epsilon[0, 2]  # certified: lower bound above upper bound
    mixed = dataset_epsilon(law, (0, 1), (2, 0, 3, 0), (delta,))  # the dataset the docs state
    assert mixed.epsilon[0, 0] == pytest.approx(worst.epsilon[0, 0], rel=1e-12)
    for column in range(4):
        assert dataset_epsilon(law, (0, 1), [n - 1 if x == column else 0 for x in range(4)],
                               (delta,)).epsilon[0, 2] < mixed.epsilon[0, 1]
    assert shuffled_round(hadamard_response_guarantee(e0, 4), n, delta).epsilon >= result.exact_epsilon(0)[1]
