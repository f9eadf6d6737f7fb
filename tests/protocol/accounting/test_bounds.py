"""Single-round bounds: published values, validity against exact enumeration, ordering.

Tolerances come from the theory: every upper bound must dominate the exact
divergence (up to float rounding, 1e-9 relative), every published value is checked
to the precision it was printed with.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from shuffledp.protocol.accounting import (
    AmplificationNotClaimed,
    LocalGuarantee,
    binary_rr_guarantee,
    dominating_pairs,
    fmt21_closed_form,
    fmt21_pair,
    gaussian_mean_guarantee,
    generic_guarantee,
    hadamard_response_guarantee,
    k_rr_guarantee,
    laplace_mean_guarantee,
    randomizer_matrix,
    rr_delta,
    rr_exact_delta,
    rr_lower_delta,
    rr_lower_epsilon,
    shuffled_round,
    strong_clone_pair,
    variation_ratio_pair,
    variation_ratio_parameters,
)
from shuffledp.protocol.errors import InvalidParameter

from .brute import clone_pair_delta, exact_round_delta, paper_variation_ratio_delta, worst_dataset_delta

REL = 1e-9  # float rounding allowance when comparing an upper bound with an exact value


# ---------------------------------------------------------------- published values
def test_fmt21_example_numerical_in_published_bracket():
    # FMT21's own numerical evaluation brackets the bound in [0.1675, 0.1755].
    eps = fmt21_pair(4.0, 100_000).epsilon(1e-6)
    assert 0.1675 <= eps <= 0.1755


def test_fmt21_example_closed_form_printed_value():
    assert round(fmt21_closed_form(4.0, 100_000, 1e-6), 4) == 0.5378


def test_fmt21_closed_form_validity_condition():
    # eps0 <= log(n / (16 log(4/delta))) fails for n = 1000, eps0 = 4.
    assert fmt21_closed_form(4.0, 1000, 1e-6) is None
    assert fmt21_closed_form(0.5, 1000, 1e-6) is not None
    rb = shuffled_round(generic_guarantee(4.0), 1000, 1e-6)
    assert rb.candidates["fmt21-closed"] is None


def test_example_tighter_bounds_below_fmt21_and_above_floor():
    n, e0, delta = 100_000, 4.0, 1e-6
    fmt = fmt21_pair(e0, n).epsilon(delta)
    floor = rr_lower_epsilon(delta, n, e0)
    rb = shuffled_round(binary_rr_guarantee(e0), n, delta)
    vr = rb.candidates["variation-ratio"]
    assert vr is not None and floor <= vr < fmt
    assert rb.candidates["strong-clone"] == pytest.approx(vr, rel=1e-4)
    assert rb.lower_bound == pytest.approx(floor)
    # k-RR and Hadamard response: their blanket bound (in place of the corrected variation-ratio
    # pair, test_blanket_mechanisms.py) beats FMT21 too.
    for local in (k_rr_guarantee(e0, 8), hadamard_response_guarantee(e0, 64)):
        r = shuffled_round(local, n, delta)
        assert r.method == "blanket" and r.epsilon < fmt


# --------------------------------------------------- ordering and monotonicity
GRID_N = (100, 1000, 10_000)
GRID_E0 = (0.5, 1.0, 2.0, 4.0)


@pytest.fixture(scope="module")
def generic_grid():
    out = {}
    for e0 in GRID_E0:
        for n in GRID_N:
            out[e0, n] = shuffled_round(generic_guarantee(e0), n, 1e-6)
    return out


def test_upper_bounds_respect_floor_and_local(generic_grid):
    for (e0, n), rb in generic_grid.items():
        assert rb.lower_bound is not None
        for name, eps in rb.candidates.items():
            if eps is None:
                continue
            assert eps <= e0 + 1e-12, (name, e0, n)
            assert eps >= rb.lower_bound * (1 - 1e-6), (name, e0, n, eps, rb.lower_bound)
        assert rb.epsilon == min(v for v in rb.candidates.values() if v is not None)


def test_bounds_monotone_in_n_and_eps0(generic_grid):
    for name in ("fmt21-numerical", "rdp-girgis"):
        for e0 in GRID_E0:
            vals = [generic_grid[e0, n].candidates[name] for n in GRID_N]
            assert all(a >= b - 1e-9 for a, b in zip(vals, vals[1:])), (name, e0, vals)
        for n in GRID_N:
            vals = [generic_grid[e0, n].candidates[name] for e0 in GRID_E0]
            assert all(a <= b + 1e-9 for a, b in zip(vals, vals[1:])), (name, n, vals)
    for e0 in GRID_E0:
        floors = [generic_grid[e0, n].lower_bound for n in GRID_N]
        assert all(a >= b for a, b in zip(floors, floors[1:]))


def test_strong_clone_and_vr_monotone_in_n():
    for e0 in (1.0, 3.0):
        vals = [strong_clone_pair(e0, n).epsilon(1e-6) for n in (300, 3000, 30_000)]
        assert vals[0] > vals[1] > vals[2]
        E = math.exp(e0)
        hr = [variation_ratio_pair(E, (E - 1) / (2 * (E + 1)), E, n, r2=1 / (2 * E)).epsilon(1e-6)
              for n in (300, 3000)]
        assert hr[0] > hr[1]


# ------------------------------------------------- exact shuffled RR references
def _rr_by_enumeration(n, e0, ones, eps):
    """Shuffled binary RR by explicit outcome enumeration (independent of rr_exact)."""
    R = randomizer_matrix(binary_rr_guarantee(e0))
    others = [1] * ones + [0] * (n - 1 - ones)
    return exact_round_delta(R, 0, 1, others, eps)


@pytest.mark.parametrize("n,e0,ones", [(12, 1.0, 0), (12, 2.0, 3), (20, 0.5, 7), (25, 3.0, 24)])
def test_rr_delta_matches_enumeration(n, e0, ones):
    for eps in (0.05, 0.3, 0.9):
        assert rr_delta(eps, n, e0, ones) == pytest.approx(_rr_by_enumeration(n, e0, ones, eps), rel=1e-10, abs=1e-300)


def test_rr_exact_is_max_over_datasets_and_lower_is_below():
    n, e0 = 30, 1.5
    for eps in (0.1, 0.4, 0.8):
        brute = max(_rr_by_enumeration(n, e0, k, eps) for k in range(n))
        assert rr_exact_delta(eps, n, e0) == pytest.approx(brute, rel=1e-10)
        assert rr_lower_delta(eps, n, e0) <= brute * (1 + REL)


# --------------------------------------------- the clone engine is exact (small n)
@pytest.mark.parametrize(
    "make",
    [
        lambda: fmt21_pair(1.5, 14),
        lambda: strong_clone_pair(0.7, 14),
        lambda: variation_ratio_pair(math.e, (math.e - 1) / (2 * (math.e + 1)), math.e, 14, r2=1 / (2 * math.e)),
        lambda: variation_ratio_pair(math.exp(2), (math.exp(2) - 1) / (math.exp(2) + 4), math.exp(2), 12,
                                     r2=3 / (math.exp(2) + 4)),
    ],
    ids=["fmt21", "strong", "vr-hadamard", "vr-5rr"],
)
def test_clone_engine_matches_enumeration(make):
    pair = make()
    for eps in (0.05, 0.3, 0.8, 1.4):
        brute = clone_pair_delta(eps, pair.m, pair.a0, pair.a1, pair.a2, pair.r, pair.r2)
        lo, up = pair.delta_bounds(eps, 5, 5)
        assert lo <= brute * (1 + REL) + 1e-300 and up >= brute * (1 - REL)
        assert pair.delta(eps, rtol=1e-6) == pytest.approx(brute, rel=1e-6, abs=1e-300)


# --------------------------------------- validity of every bound by enumeration
def _bound_deltas(local, n, eps):
    return {name: pair.delta(eps, rtol=1e-4) for name, pair in dominating_pairs(local, n).items()}


@pytest.mark.parametrize(
    "local,n,pairs",
    [
        (binary_rr_guarantee(1.0), 30, ((0, 1),)),
        (binary_rr_guarantee(3.0), 20, ((0, 1),)),
        (k_rr_guarantee(1.0, 3), 14, ((0, 1),)),
        (k_rr_guarantee(2.0, 4), 9, ((0, 1),)),
        (hadamard_response_guarantee(1.0, 2), 18, ((0, 1),)),
        (hadamard_response_guarantee(2.0, 4), 5, ((0, 1), (0, 3), (1, 2))),
    ],
    ids=["rr-e1", "rr-e3", "3rr", "4rr", "hr2", "hr4"],
)
def test_every_bound_dominates_exact_worst_case(local, n, pairs):
    R = randomizer_matrix(local)
    eps_list = (0.1, 0.3, 0.6, 0.9)
    worst = worst_dataset_delta(R, n, eps_list, pairs)
    for eps in eps_list:
        exact = worst[eps][0]
        for name, bound in _bound_deltas(local, n, eps).items():
            assert bound >= exact * (1 - REL), (name, eps, bound, exact, worst[eps][1])


def test_published_variation_ratio_is_violated_by_4rr():
    """Wang et al.'s (a, b)-only computation is not an upper bound (our correction is).

    4-ary RR, eps0 = 1, n = 16: when every other user holds the value 3, the exact
    shuffled divergence at eps = 0.5 exceeds the published numerical bound.
    """
    local = k_rr_guarantee(1.0, 4)
    vr = variation_ratio_parameters(local)
    n, eps = 16, 0.5
    exact = exact_round_delta(randomizer_matrix(local), 0, 1, [3] * (n - 1), eps)
    published = paper_variation_ratio_delta(eps, n - 1, vr.p, vr.beta, vr.q)
    corrected = dominating_pairs(local, n)["variation-ratio"].delta(eps, rtol=1e-4)
    assert exact > published * 1.05
    assert corrected >= exact


def test_published_variation_ratio_is_violated_by_hadamard_response():
    local = hadamard_response_guarantee(1.0, 2)
    vr = variation_ratio_parameters(local)
    n, eps = 30, 0.8
    exact = exact_round_delta(randomizer_matrix(local), 0, 1, [1] * (n - 1), eps)
    published = paper_variation_ratio_delta(eps, n - 1, vr.p, vr.beta, vr.q)
    assert exact > 10 * published
    assert dominating_pairs(local, n)["variation-ratio"].delta(eps, rtol=1e-4) >= exact


# -------------------------------------------------- mechanism parameters by enumeration
def _pair_decomposition(R, x0, x1, p, beta):
    """Q0, Q1, Q2 of the variation-ratio decomposition of (R[x0], R[x1])."""
    alpha = beta / (p - 1)
    a2 = 1 - (p + 1) * alpha
    d = R[x0] - R[x1]
    Q0 = np.maximum(d, 0) / beta
    Q1 = np.maximum(-d, 0) / beta
    Q2 = (R[x0] - p * alpha * Q0 - alpha * Q1) / a2 if a2 > 1e-15 else np.zeros_like(Q0)
    return alpha, a2, Q0, Q1, Q2


@pytest.mark.parametrize("K", [2, 4, 8, 16])
@pytest.mark.parametrize("e0", [0.5, 2.0])
def test_hadamard_response_parameters_by_enumeration(K, e0):
    local = hadamard_response_guarantee(e0, K)
    R = randomizer_matrix(local)
    assert np.allclose(R.sum(axis=1), 1.0)
    vr = variation_ratio_parameters(local)
    E = math.exp(e0)
    ratios = R[:, None, :] / R[None, :, :]
    assert ratios.max() == pytest.approx(E)  # p = q = e^eps0
    assert vr.p == pytest.approx(E) and vr.q == pytest.approx(E)
    tv = 0.5 * np.abs(R[:, None, :] - R[None, :, :]).sum(axis=2)
    off = ~np.eye(K, dtype=bool)
    assert np.allclose(tv[off], vr.beta)  # every distinct pair has TV exactly beta
    assert vr.beta == pytest.approx((E - 1) / (2 * (E + 1)))
    assert vr.beta < (E - 1) / (E + 1)  # half of binary RR's
    for x0 in range(K):
        for x1 in range(K):
            if x0 == x1:
                continue
            alpha, a2, Q0, Q1, Q2 = _pair_decomposition(R, x0, x1, vr.p, vr.beta)
            assert a2 == pytest.approx(0.5)
            assert np.allclose(R[x0], vr.p * alpha * Q0 + alpha * Q1 + a2 * Q2)
            assert np.allclose(R[x1], alpha * Q0 + vr.p * alpha * Q1 + a2 * Q2)
            assert (Q2 >= -1e-15).all() and Q2.sum() == pytest.approx(1.0)
            r = alpha * vr.p / vr.q
            for x in range(K):  # every other input contains the clones
                assert (R[x] - r * (Q0 + Q1) - vr.r2 * Q2 >= -1e-15).all()
    # not in the stronger-clone class: some R(x) < (R(x0) + R(x1)) / (e^eps0 + 1)
    if K >= 4:
        lhs = R[None, None, :, :]
        rhs = (R[:, None, None, :] + R[None, :, None, :]) / (E + 1)
        assert (lhs < rhs - 1e-15).any()


@pytest.mark.parametrize("k", [3, 5, 8])
def test_k_rr_parameters_by_enumeration(k):
    e0 = 1.3
    local = k_rr_guarantee(e0, k)
    R = randomizer_matrix(local)
    vr = variation_ratio_parameters(local)
    tv = 0.5 * np.abs(R[0] - R[1]).sum()
    assert tv == pytest.approx(vr.beta)
    alpha, a2, Q0, Q1, Q2 = _pair_decomposition(R, 0, 1, vr.p, vr.beta)
    for x in range(k):
        assert (R[x] - alpha * (Q0 + Q1) - vr.r2 * Q2 >= -1e-15).all()
        # stronger-clone class
        assert (R[x] >= (R[0] + R[1]) / (math.exp(e0) + 1) - 1e-15).all()


# ---------------------------------------------------------------- refusals / input
def test_gaussian_reports_are_refused_with_reason():
    with pytest.raises(AmplificationNotClaimed, match="pure eps0-LDP"):
        shuffled_round(gaussian_mean_guarantee(1.0, 1e-6), 1000, 1e-6)


@pytest.mark.parametrize(
    "call",
    [
        lambda: shuffled_round(generic_guarantee(1.0), 0, 1e-6),
        lambda: shuffled_round(generic_guarantee(1.0), 100, 0.0),
        lambda: shuffled_round(generic_guarantee(1.0), 100, 1.5),
        lambda: shuffled_round(generic_guarantee(1.0), 10.5, 1e-6),
        lambda: generic_guarantee(-1.0),
        lambda: generic_guarantee(float("nan")),
        lambda: hadamard_response_guarantee(1.0, 12),
        lambda: k_rr_guarantee(1.0, 1),
        lambda: LocalGuarantee("magic", 1.0),
        lambda: LocalGuarantee("generic", 1.0, delta0=1e-6),
        lambda: gaussian_mean_guarantee(1.0, 0.0),
    ],
)
def test_bad_parameters_raise_invalid_parameter(call):
    with pytest.raises(InvalidParameter):
        call()


def test_laplace_mean_uses_generic_bounds():
    a = shuffled_round(laplace_mean_guarantee(2.0), 5000, 1e-6)
    b = shuffled_round(generic_guarantee(2.0), 5000, 1e-6)
    assert a.epsilon == b.epsilon and a.candidates == b.candidates
    assert a.candidates["variation-ratio"] is None and a.candidates["strong-clone"] is None
