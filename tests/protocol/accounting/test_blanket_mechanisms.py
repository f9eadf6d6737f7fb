"""Blanket laws of Hadamard response, block Hadamard response and k-RR against brute force.

Each check can fail: the analytic law of every mechanism equals the law rebuilt from its
randomizer matrix for *every* input pair (so the one law covers every pair); the FFT bound
is above the exact shuffled divergence maximised over every dataset of the other users and
every input pair; rounds of these mechanisms use the blanket bound, which agrees with the
independent corrected variation-ratio pair; the wide-pmf path of the FFT (characteristic
function from the FFT itself) agrees with the direct sums it replaces.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from shuffledp.protocol.accounting import (
    block_hadamard_response_guarantee,
    dominating_pairs,
    hadamard_response_guarantee,
    k_rr_guarantee,
    randomizer_matrix,
    shuffled_round,
)
from shuffledp.protocol.accounting.blanket import (
    BlanketLaw,
    blanket_delta,
    block_hadamard_laws,
    hadamard_response_law,
    k_rr_law,
    laplace_report_law,
)
from shuffledp.protocol.accounting.shuffle_round import blanket_laws, round_pairs

from .brute import worst_dataset_delta
from .test_blanket import law_atoms, law_mismatch


def _law_with_floor(R: np.ndarray, x1: int, x2: int, w: np.ndarray) -> BlanketLaw:
    return BlanketLaw(R[x1] / w, R[x2] / w, w / w.sum(), float(w.sum()), "matrix")


@pytest.mark.parametrize("K", [2, 4, 8, 16])
@pytest.mark.parametrize("e0", [0.5, 2.0])
def test_hadamard_law_is_every_pairs_law(K, e0):
    R = randomizer_matrix(hadamard_response_guarantee(e0, K))
    w = R.min(axis=0)
    law = hadamard_response_law(e0, K)
    for x0, x1 in itertools.permutations(range(K), 2):
        mismatch = law_mismatch(law, _law_with_floor(R, x0, x1, w))
        assert mismatch is None, (x0, x1, mismatch)


@pytest.mark.parametrize("k,B", [(6, 1), (6, 2), (7, 3), (12, 4), (5, 5)])
@pytest.mark.parametrize("e0", [0.7, 3.0])
def test_block_hadamard_laws_cover_every_pair(k, B, e0):
    """Every pair's law (with the floor p_out the law assumes) is one of the analytic laws; each
    analytic law is some pair's; the floor is a floor of every input."""
    local = block_hadamard_response_guarantee(e0, k, B)
    R = randomizer_matrix(local)
    p_out = float(R.min())
    assert np.all(R.min(axis=0) >= p_out * (1 - 1e-12))
    w = np.full(R.shape[1], p_out)
    laws = blanket_laws(local)
    analytic = block_hadamard_laws(e0, local.num_blocks, math.ceil(k / local.num_blocks))
    assert [law.name for law in laws] == [law.name for law in analytic]
    for a, b in zip(laws, analytic):
        assert law_mismatch(a, b) is None
    seen = set()
    for x0, x1 in itertools.permutations(range(k), 2):
        got = _law_with_floor(R, x0, x1, w)
        matches = [i for i, law in enumerate(laws) if law_atoms(law).keys() == law_atoms(got).keys()]
        assert matches, (x0, x1)
        mismatch = law_mismatch(laws[matches[0]], got)
        assert mismatch is None, (x0, x1, mismatch)
        seen.add(matches[0])
    assert seen == set(range(len(laws)))


@pytest.mark.parametrize("k", [3, 5])
def test_k_rr_law_is_every_pairs_law(k):
    R = randomizer_matrix(k_rr_guarantee(1.3, k))
    w = R.min(axis=0)
    for x0, x1 in itertools.permutations(range(k), 2):
        mismatch = law_mismatch(k_rr_law(1.3, k), _law_with_floor(R, x0, x1, w))
        assert mismatch is None, (x0, x1, mismatch)


@pytest.mark.parametrize("local,n", [
    (hadamard_response_guarantee(1.0, 4), 4),
    (hadamard_response_guarantee(3.0, 4), 4),
    (k_rr_guarantee(2.0, 3), 8),
    (block_hadamard_response_guarantee(2.0, 3, 2), 5),
], ids=["hr4-e1", "hr4-e3", "3rr-e2", "bhr3-B2-e2"])
def test_bound_dominates_the_exact_shuffled_divergence(local, n):
    """Brute force over every multiset of the others' inputs and every ordered input pair."""
    R = randomizer_matrix(local)
    eps_list = (0.05, 0.2, 0.5, 1.0)
    pairs = tuple(itertools.permutations(range(R.shape[0]), 2))
    worst = worst_dataset_delta(R, n, eps_list, pairs)
    laws = blanket_laws(local)
    for eps in eps_list:
        exact = worst[eps][0]
        assert exact > 0
        bound = max(blanket_delta(law, n, eps) for law in laws)
        assert bound >= exact, (eps, bound, exact)


@pytest.mark.parametrize("local", [hadamard_response_guarantee(1.0, 64), k_rr_guarantee(4.0, 16),
                                   block_hadamard_response_guarantee(4.0, 1024)], ids=["hr", "krr", "bhr"])
@pytest.mark.parametrize("n", [1_000, 20_000])
def test_rounds_use_the_blanket_within_its_measured_distance_of_variation_ratio(local, n):
    """Two certified upper bounds on one divergence (the blanket is the smaller in exact arithmetic):
    the blanket may exceed the variation-ratio value only by its lattice's variance inflation."""
    rb = shuffled_round(local, n, 1e-6)
    assert rb.method == "blanket"
    assert rb.candidates["variation-ratio"] is None  # rounds do not compute it
    assert "variation-ratio" not in round_pairs(local, n)
    vr = min(local.epsilon0, dominating_pairs(local, n)["variation-ratio"].epsilon(1e-6))
    assert rb.epsilon <= vr * (1 + 2e-3)


@pytest.mark.parametrize("law,n,eps", [(hadamard_response_law(8.0, 64), 300_000, 0.4),
                                       (laplace_report_law(8.0, 4096), 300_000, 0.45),
                                       (k_rr_law(6.0, 16), 50_000, 0.5)], ids=["hr", "lap", "krr"])
def test_fft_characteristic_function_agrees_with_direct_sums(law, n, eps, monkeypatch):
    """Both paths bound the same sum; the FFT path carries a larger error term (``count * e_fft`` per
    frequency instead of the direct sums' ``(m + 8) u``), so it is the higher, by under 1e-4 of
    delta here (measured 1e-6 - 3e-5): a negligible price in epsilon for 10-50x less time."""
    import shuffledp.protocol.accounting.blanket as blanket

    monkeypatch.setattr(blanket, "DIRECT_BUDGET", 0)
    via_fft = blanket_delta(law, n, eps)
    monkeypatch.setattr(blanket, "DIRECT_BUDGET", math.inf)
    direct = blanket_delta(law, n, eps)
    assert 0 < direct < 1
    assert direct * (1 - 1e-12) <= via_fft <= direct * (1 + 1e-4)
