"""Lower bounds from one i.i.d. dataset (``protocol/accounting/iid_dataset.py``) against brute force.

Each check can fail: the closed-form sum equals the three-class multinomial view's divergence
enumerated outcome by outcome (both directions), lies below the real mechanism's exact shuffled
divergence on that dataset (it is a post-processing of it), reproduces the independent thinned-RR
code, and stays below the round's reported upper bound at scale.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

import pytest

from shuffledp.protocol.accounting import (
    block_hadamard_response_guarantee,
    hadamard_response_guarantee,
    k_rr_guarantee,
    laplace_mean_guarantee,
    randomizer_matrix,
    shuffled_round,
)
from shuffledp.protocol.accounting.iid_dataset import (
    PMF_RTOL,
    ThreeClassView,
    best_lower_epsilon,
    block_hadamard_third_block_view,
    hadamard_third_column_view,
    iid_delta,
    iid_lower_epsilon,
    k_rr_third_value_view,
    laplace_endpoint_view,
    laplace_middle_view,
    lower_bound_candidates,
    thinned_rr_view,
)
from shuffledp.protocol.accounting.thinned_rr import k_rr_tau, laplace_report_tau, thinned_rr_delta
from shuffledp.protocol.errors import InvalidParameter

from .brute import add_user, histogram_distribution, hockey
from .test_blanket import laplace_matrix


def exact_round_deltas(R, x0, x1, others, eps_list):
    """``brute.exact_round_delta`` at each eps of ``eps_list``: the two views built once for all."""
    base = histogram_distribution(R, others)
    p, q = add_user(base, R[x0]), add_user(base, R[x1])
    return [hockey(p, q, eps) for eps in eps_list]


def _classes(v: ThreeClassView):
    """(user 1 under x0, under x1, the others) per class: A, B and U, or A, B, U1, U2 if U is split."""
    if not v.split:
        return [(v.a0, v.a1, v.pi_a), (v.a1, v.a0, v.pi_b), (v.a2, v.a2, v.pi_u)]
    u2_user, u2_others = v.a2 - v.u1_user, v.pi_u - v.u1_others
    return [(v.a0, v.a1, v.pi_a), (v.a1, v.a0, v.pi_b), (v.u1_user, v.u1_user, v.u1_others),
            (u2_user, u2_user, u2_others)]


def multinomial_view_delta(v: ThreeClassView, n: int, eps: float) -> float:
    """max of both directions of the sum over every class-count vector of [P - e^eps Q]_+
    (user 1 + n - 1 others), enumerated outcome by outcome."""
    E = math.exp(eps)
    classes = _classes(v)
    c = len(classes)

    def others(counts) -> float:
        if min(counts) < 0:
            return 0.0
        coef = math.factorial(n - 1) / math.prod(math.factorial(count) for count in counts)
        return coef * math.prod(pi**count for count, (_, _, pi) in zip(counts, classes))

    fwd = bwd = 0.0
    for counts in itertools.product(range(n + 1), repeat=c - 1):
        last = n - sum(counts)
        if last < 0:
            continue
        full = list(counts) + [last]
        p = q = 0.0
        for i, (u0, u1, _) in enumerate(classes):
            base = full.copy()
            base[i] -= 1
            o = others(base)
            p += u0 * o
            q += u1 * o
        fwd += max(p - E * q, 0.0)
        bwd += max(q - E * p, 0.0)
    return max(fwd, bwd)


VIEWS = {
    "thinned-e4": thinned_rr_view(4.0, k_rr_tau(4.0, 16)),
    "thinned-e1": thinned_rr_view(1.0, 0.5),
    "5rr-third": k_rr_third_value_view(2.0, 5),
    "hr-third": hadamard_third_column_view(1.5),
    "bhr-third": block_hadamard_third_block_view(3.0, 3),
    "lap-middle": laplace_middle_view(2.0, 4),
    "lap-cut": laplace_endpoint_view(2.0, 8, 2),
}


@pytest.mark.parametrize("name", list(VIEWS))
@pytest.mark.parametrize("n", [1, 2, 7, 30])
def test_closed_form_equals_the_enumerated_view(name, n):
    v = VIEWS[name]
    for eps in (0.0, 0.1, 0.3, 0.8):
        exact = multinomial_view_delta(v, n, eps)
        got = iid_delta(v, n, eps)
        assert got <= exact * (1 + 1e-12) + 1e-300  # lowered, never above
        assert got >= exact * (1 - 3 * PMF_RTOL) - 1e-15, (eps, got, exact)


@pytest.mark.parametrize("local,x0,x1,other,view,n", [
    (k_rr_guarantee(2.0, 5), 0, 1, 2, k_rr_third_value_view(2.0, 5), 6),
    (k_rr_guarantee(1.0, 4), 0, 1, 1, thinned_rr_view(1.0, k_rr_tau(1.0, 4)), 6),
    (hadamard_response_guarantee(1.5, 4), 0, 1, 2, hadamard_third_column_view(1.5), 5),
    (block_hadamard_response_guarantee(3.0, 3, 3), 0, 1, 2, block_hadamard_third_block_view(3.0, 3), 5),
], ids=["5rr-third", "4rr-thinned", "hr4-third", "bhr-third"])
def test_below_the_mechanisms_exact_divergence_on_that_dataset(local, x0, x1, other, view, n):
    R = randomizer_matrix(local)
    eps_list = (0.0, 0.2, 0.5)
    for eps, exact in zip(eps_list, exact_round_deltas(R, x0, x1, [other] * (n - 1), eps_list)):
        got = iid_delta(view, n, eps)
        assert 0 < got <= exact * (1 + 1e-12), (eps, got, exact)


def test_laplace_middle_view_below_the_report_on_that_dataset():
    G, e0, n = 2, 2.0, 5
    R = laplace_matrix(e0, G, 1)
    eps_list = (0.0, 0.3, 0.8)
    for eps, exact in zip(eps_list, exact_round_deltas(R, 0, G, [G // 2] * (n - 1), eps_list)):
        assert 0 < iid_delta(laplace_middle_view(e0, G), n, eps) <= exact * (1 + 1e-12)


@pytest.mark.parametrize("G,cut", [(4, 0), (4, 1), (7, 3)])
def test_laplace_endpoint_view_is_the_reports_classes_on_that_dataset(G, cut):
    """Class probabilities are the report's own (summed over its outputs), and the divergence is
    below the report's exact one with the others at G (every output kept)."""
    e0, n, clamp = 1.5, 5, 1
    R = laplace_matrix(e0, G, clamp)
    ys = np.arange(-clamp, G + clamp + 1)
    v = laplace_endpoint_view(e0, G, cut)
    low, high = ys <= cut, ys >= G - cut
    assert R[0, low].sum() == pytest.approx(v.a0, rel=1e-12) and R[0, high].sum() == pytest.approx(v.a1, rel=1e-12)
    assert R[G, low].sum() == pytest.approx(v.pi_a, rel=1e-12) and R[G, high].sum() == pytest.approx(v.pi_b, rel=1e-12)
    eps_list = (0.0, 0.3, 0.8)
    for eps, exact in zip(eps_list, exact_round_deltas(R, 0, G, [G] * (n - 1), eps_list)):
        assert 0 < iid_delta(v, n, eps) <= exact * (1 + 1e-12)


def test_laplace_cut_zero_is_the_thinned_rr_view():
    thinned = thinned_rr_view(2.0, laplace_report_tau(2.0, 64))
    cut0 = laplace_endpoint_view(2.0, 64, 0)
    for field in ("a0", "a1", "a2", "pi_a", "pi_b", "pi_u"):
        assert getattr(cut0, field) == pytest.approx(getattr(thinned, field), rel=1e-12, abs=1e-15)
    with pytest.raises(InvalidParameter):
        laplace_endpoint_view(2.0, 64, 32)


@pytest.mark.parametrize("e0,n,eps", [(1.0, 2_000, 0.08), (4.0, 5_000, 0.3), (2.0, 20_000, 0.05)])
def test_reproduces_thinned_rr(e0, n, eps):
    """Two lower bounds on one exact value: thinned_rr sums a 6-sd window of (t, c), which drops
    up to ~1e-3 of a tail divergence; this module sums 9 sd of M and the exact tail in N_A, so it
    may only be the larger, by little."""
    tau = k_rr_tau(e0, 16)
    ref = thinned_rr_delta(eps, n, e0, tau)
    got = iid_delta(thinned_rr_view(e0, tau), n, eps)
    assert ref * (1 - 3 * PMF_RTOL) <= got <= ref * (1 + 2e-3)


@pytest.mark.parametrize("local", [k_rr_guarantee(1.0, 16), hadamard_response_guarantee(2.0, 64),
                                   laplace_mean_guarantee(1.0, 4096), block_hadamard_response_guarantee(4.0, 1024)],
                         ids=["krr", "hr", "lap", "bhr"])
def test_lower_bound_below_the_reported_round(local):
    n = 100_000
    views = lower_bound_candidates(local.mechanism, local.epsilon0, k=local.k, num_bins=local.num_bins,
                                   grid_levels=local.grid_levels, num_blocks=local.num_blocks)
    lower, name = best_lower_epsilon(views, n, 1e-6, local.epsilon0)
    upper = shuffled_round(local, n, 1e-6).epsilon
    assert 0 < lower <= upper, name
    if local.mechanism in ("k-rr", "block-hadamard-response"):
        # their blanket law differs from these datasets' only in merging uninformative atoms
        assert upper <= 1.01 * lower


def test_a_split_too_large_to_sum_is_merged(monkeypatch):
    """Above SPLIT_BUDGET the split view is evaluated merged: the merged view's value (a
    post-processing of the split one, so smaller: both are lower bounds)."""
    import shuffledp.protocol.accounting.iid_dataset as iid

    split = k_rr_third_value_view(8.0, 16)
    merged = ThreeClassView(split.a0, split.a1, split.a2, split.pi_a, split.pi_b, split.pi_u)
    n, eps = 10_000, 6.45
    full = iid_delta(split, n, eps)
    monkeypatch.setattr(iid, "SPLIT_BUDGET", 0)
    assert iid_delta(split, n, eps) == iid_delta(merged, n, eps) < full


def test_the_split_matters_where_few_reports_are_blanket():
    """16-RR at eps0 = 8, n = 1e4: keeping c apart from the other 13 values lifts the lower bound
    from 6.39 to 6.52 (the blanket bound is 6.53)."""
    split = k_rr_third_value_view(8.0, 16)
    merged = ThreeClassView(split.a0, split.a1, split.a2, split.pi_a, split.pi_b, split.pi_u)
    lower_split = iid_lower_epsilon(split, 10_000, 1e-6, 8.0)
    lower_merged = iid_lower_epsilon(merged, 10_000, 1e-6, 8.0)
    upper = shuffled_round(k_rr_guarantee(8.0, 16), 10_000, 1e-6).epsilon
    assert lower_merged < lower_split <= upper <= 1.02 * lower_split


def test_bad_views_are_refused():
    with pytest.raises(InvalidParameter):
        ThreeClassView(0.5, 0.5, 0.1, 0.3, 0.3, 0.4)
    with pytest.raises(InvalidParameter):  # half a split
        ThreeClassView(0.4, 0.2, 0.4, 0.2, 0.2, 0.6, u1_user=0.1)
    with pytest.raises(InvalidParameter):  # U1 larger than U
        ThreeClassView(0.4, 0.2, 0.4, 0.2, 0.2, 0.6, u1_user=0.5, u1_others=0.1)
    with pytest.raises(InvalidParameter):  # user 1 reaches U2, the others do not
        ThreeClassView(0.4, 0.2, 0.4, 0.2, 0.2, 0.6, u1_user=0.1, u1_others=0.6)
    with pytest.raises(InvalidParameter):
        ThreeClassView(0.5, 0.3, 0.2, 0.0, 0.6, 0.4)
    with pytest.raises(InvalidParameter):
        k_rr_third_value_view(1.0, 2)
    with pytest.raises(InvalidParameter):
        iid_delta(VIEWS["thinned-e1"], 0, 0.1)
    assert lower_bound_candidates("block-hadamard-response", 1.0, num_blocks=1) == []


def test_binary_k_rr_gets_only_the_thinned_dataset():
    """k = 2 has no third value, and its informative fraction (e^eps0 + 1)/(e^eps0 + 1) may round
    above 1: the CLI once failed on it with a typed error instead of reporting the round."""
    views = lower_bound_candidates("k-rr", 1.0, k=2)
    assert [v.name.split("(")[0] for v in views] == ["thinned-rr"]
    assert views[0].a2 == 0.0 and views[0].pi_u == 0.0
    assert 0 < best_lower_epsilon(views, 1000, 1e-6, 1.0)[0] <= shuffled_round(k_rr_guarantee(1.0, 2), 1000, 1e-6).epsilon
