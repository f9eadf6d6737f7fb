"""Thinned binary RR (``protocol/accounting/thinned_rr.py``) against brute-force histograms."""

from __future__ import annotations

import math

import pytest

from shuffledp.protocol.accounting import hadamard_response_guarantee, k_rr_guarantee, randomizer_matrix, shuffled_round
from shuffledp.protocol.accounting.thinned_rr import (
    k_rr_tau,
    laplace_report_tau,
    thinned_rr_delta,
    thinned_rr_lower_epsilon,
)

from .brute import exact_round_delta
from .test_blanket import laplace_matrix


@pytest.mark.parametrize("k,e0,n", [(3, 1.0, 7), (4, 2.0, 6), (5, 0.5, 5)])
def test_equals_k_rr_on_the_dataset_at_one_input(k, e0, n):
    R = randomizer_matrix(k_rr_guarantee(e0, k))
    for eps in (0.0, 0.2, 0.6):
        exact = exact_round_delta(R, 0, 1, [1] * (n - 1), eps)
        assert thinned_rr_delta(eps, n, e0, k_rr_tau(e0, k)) == pytest.approx(exact, rel=1e-9, abs=1e-14)


@pytest.mark.parametrize("K,e0,n", [(2, 1.0, 8), (4, 1.5, 5)])
def test_equals_hadamard_response_on_the_dataset_at_one_input(K, e0, n):
    R = randomizer_matrix(hadamard_response_guarantee(e0, K))
    for eps in (0.0, 0.3, 0.8):
        exact = exact_round_delta(R, 0, 1, [1] * (n - 1), eps)
        assert thinned_rr_delta(eps, n, e0, 0.5) == pytest.approx(exact, rel=1e-9, abs=1e-14)


@pytest.mark.parametrize("G,e0,n", [(2, 1.0, 6), (3, 2.0, 5)])
def test_is_below_the_laplace_report_on_the_dataset_at_one_input(G, e0, n):
    R = laplace_matrix(e0, G, 2)
    for eps in (0.0, 0.3, 0.8):
        exact = exact_round_delta(R, 0, G, [G] * (n - 1), eps)
        lower = thinned_rr_delta(eps, n, e0, laplace_report_tau(e0, G))
        assert lower <= exact * (1 + 1e-9)
        assert lower >= 0.5 * exact  # the three-level statistic keeps most of it at small G


def test_lower_epsilon_is_below_the_reported_one_at_scale():
    e0, n, k = 1.0, 20_000, 16
    lower = thinned_rr_lower_epsilon(1e-6, n, e0, k_rr_tau(e0, k))
    reported = shuffled_round(k_rr_guarantee(e0, k), n, 1e-6).epsilon
    assert 0 < lower <= reported
    assert thinned_rr_delta(lower, n, e0, k_rr_tau(e0, k)) > 1e-6
    assert math.isfinite(lower)
