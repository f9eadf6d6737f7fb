"""The whole-report lower bound of the Laplace report's homogeneous dataset (``iid_lattice``):
below the exact divergence (brute force, both directions), a convex-order contraction, and above
the three-class views it joins."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import special

from shuffledp.protocol.accounting import iid_lattice as L
from shuffledp.protocol.accounting import laplace_mean_guarantee, shuffled_round
from shuffledp.protocol.accounting.iid_dataset import best_lower_epsilon, lower_bound_candidates
from shuffledp.protocol.errors import InvalidParameter

from .brute import add_user, histogram_distribution
from .test_blanket import laplace_matrix


def _directed(P: np.ndarray, Q: np.ndarray, eps: float) -> float:
    return float(np.maximum(P - math.exp(eps) * Q, 0).sum())


def _z_law(e0: float, G: int) -> tuple[np.ndarray, np.ndarray]:
    """``Z = R(0)/R(G)`` under ``R(G)`` (the module's atoms, built independently from the report's matrix)."""
    R = laplace_matrix(e0, G, 1)  # clamping merges only reports with equal Z: the same law
    z = R[0] / R[G]
    values, where = np.unique(np.round(z, 12), return_inverse=True)
    mass = np.zeros(len(values))
    np.add.at(mass, where, R[G])
    return values, mass


@pytest.mark.parametrize("G,e0,n", [(2, 1.0, 4), (3, 3.0, 4), (2, 2.5, 6), (4, 0.7, 3)])
def test_below_the_exact_divergence_in_both_directions(G, e0, n):
    R = laplace_matrix(e0, G, 1)
    base = histogram_distribution(R, [G] * (n - 1))
    P0, P1 = add_user(base, R[0]), add_user(base, R[G])
    law = L.laplace_endpoint_law(e0, G, 10)
    for eps in (0.0, 0.1, 0.4, 1.0):
        forward = L.lattice_delta(law, n, eps, directions=("forward",))
        reverse = L.lattice_delta(law, n, eps, directions=("reverse",))
        assert forward <= _directed(P0, P1, eps) * (1 + 1e-12) + 1e-300, eps
        assert reverse <= _directed(P1, P0, eps) * (1 + 1e-12) + 1e-300, eps
        assert L.lattice_delta(law, n, eps) == reverse
    assert L.lattice_delta(law, n, 0.1) > 0


def _iid_exact(values: np.ndarray, mass: np.ndarray, n: int, eps: float) -> tuple[float, float]:
    """Both directions' ``(1/n) E[(.)_+]`` by enumerating every composition of n draws."""
    E = math.exp(eps)
    fwd = rev = 0.0
    for counts in itertools.product(range(n + 1), repeat=len(values) - 1):
        last = n - sum(counts)
        if last < 0:
            continue
        c = np.array((*counts, last), dtype=np.float64)
        log_p = special.gammaln(n + 1) - np.sum(special.gammaln(c + 1)) + np.sum(special.xlogy(c, mass))
        s = float(c @ values)
        fwd += math.exp(log_p) * max(s - n * E, 0.0)
        rev += math.exp(log_p) * max(n - E * s, 0.0)
    return fwd / n, rev / n


@pytest.mark.parametrize("G,e0,n", [(5, 2.0, 12), (6, 1.0, 10)])
def test_below_the_exact_iid_sum_on_a_finer_grid(G, e0, n):
    values, mass = _z_law(e0, G)
    law = L.laplace_endpoint_law(e0, G, 10)
    for eps in (0.05, 0.2, 0.5):
        fwd, rev = _iid_exact(values, mass, n, eps)
        assert 0 < L.lattice_delta(law, n, eps, ("forward",)) <= fwd * (1 + 1e-12)
        assert 0 < L.lattice_delta(law, n, eps, ("reverse",)) <= rev * (1 + 1e-12)


def _stop_loss(values: np.ndarray, mass: np.ndarray, t: np.ndarray) -> np.ndarray:
    return np.maximum(values[None, :] - t[:, None], 0.0) @ mass


@pytest.mark.parametrize("e0,G,R", [(2.0, 64, 10), (1.0, 4096, 10), (4.0, 512, 6)])
def test_the_lattice_law_is_a_contraction_of_z(e0, G, R):
    """Every class mean on the lattice and ``W <=_cx Z``: equal means, stop-loss never above."""
    values, mass = _z_law(e0, G) if G <= 512 else L_atoms(e0, G)
    law = L.laplace_endpoint_law(e0, G, R)
    assert law.remainder == 0.0
    w = law.a + law.k * law.h
    assert float(law.q_down @ w) == pytest.approx(float(mass @ values), abs=law.eta + 1e-12)
    t = np.unique(np.concatenate([w, values, [values.min() - 1, values.max() + 1]]))
    slack = law.eta + 1e-12
    assert np.all(_stop_loss(w, law.q_down, t) <= _stop_loss(values, mass, t) + slack)
    assert law.h <= math.sqrt(float(mass @ (values - 1.0) ** 2)) / R * (1 + 1e-12)  # the step asked for


def L_atoms(e0: float, G: int) -> tuple[np.ndarray, np.ndarray]:
    """The atoms of Z for a large grid, in closed form (as the module builds them, for the check above)."""
    r = math.exp(-e0 / G)
    c = (1 - r) / (1 + r)
    y = np.arange(1, G)
    values = np.concatenate([[math.exp(-e0)], np.exp(e0 * (G - 2.0 * y) / G), [math.exp(e0)]])
    mass = np.concatenate([[1 / (1 + r)], c * r ** (G - y), [r**G / (1 + r)]])
    order = np.argsort(values)
    return values[order], mass[order]


@pytest.mark.parametrize("e0", [1.0, 4.0])
def test_tighter_than_the_three_class_views_and_below_the_reported_round(e0):
    G, n, delta = 4096, 10_000, 1e-6
    views = lower_bound_candidates("laplace-mean", e0, grid_levels=G)
    assert isinstance(views[0], L.LaplaceEndpointLattice)
    whole = views[0].lower_epsilon(n, delta, e0)
    three_class = max(v.lower_epsilon(n, delta, e0) for v in views[1:])
    upper = shuffled_round(laplace_mean_guarantee(e0, G), n, delta).epsilon
    assert three_class < whole <= upper
    assert best_lower_epsilon(views, n, delta, e0) == (whole, views[0].name)


def test_heavy_tails_fall_back_to_a_finer_lattice_or_a_valid_remainder():
    law = L.law_for(lambda R: L.laplace_endpoint_law(8.0, 4096, R), 10_000)
    assert law is not None
    e = L.LaplaceEndpointLattice(8.0, 4096).lower_epsilon(10_000, 1e-6, 8.0)
    assert 0 <= e <= shuffled_round(laplace_mean_guarantee(8.0, 4096), 10_000, 1e-6).epsilon


def test_a_batch_too_large_for_the_circle_gets_no_lattice():
    assert L.law_for(lambda R: L.laplace_endpoint_law(1.0, 64, R), 10**14) is None


def test_bad_laws_are_refused():
    with pytest.raises(InvalidParameter):
        L.contract(np.array([1.0, 2.0]), np.array([0.5, 0.6]), 10)
    with pytest.raises(InvalidParameter):
        L.contract(np.array([1.0, 1.0]), np.array([0.5, 0.5]), 10)
    with pytest.raises(InvalidParameter):
        L.laplace_endpoint_law(0.0, 16)
    with pytest.raises(InvalidParameter):
        L.lattice_lower_epsilon(L.laplace_endpoint_law(1.0, 16), 0, 1e-6, 1.0)


def test_repeated_values_are_merged_and_random_laws_contract():
    """Repeated values once divided by zero in the sweep (a class whose target equalled the next atom);
    random laws, repeated values included, must give a contraction with no remainder lost."""
    rng = np.random.default_rng(5)
    for trial in range(200):
        m = int(rng.integers(2, 30))
        values = rng.integers(1, 6, m).astype(float) if trial % 2 else np.exp(rng.normal(0, 1, m))
        if len(np.unique(values)) < 2:
            continue
        mass = rng.dirichlet(np.ones(m))
        values = values / float(mass @ values)
        law = L.contract(values, mass, 10.0)
        w = law.a + law.k * law.h
        t = np.unique(np.concatenate([w, values]))
        slack = law.eta + 1e-12
        # forward uses q_down (remainder rounded down): below Z in increasing convex order (stop-loss);
        # reverse uses q_up (rounded up): above Z in increasing concave order (E[(t - .)_+] below Z's)
        assert np.all(_stop_loss(w, law.q_down, t) <= _stop_loss(values, mass, t) + slack)
        assert np.all(_stop_loss(-w, law.q_up, -t) <= _stop_loss(-values, mass, -t) + slack)


def test_results_in_subnormal_range_are_reported_as_zero():
    """Subnormal floats carry no relative accuracy: a certified lower bound there is 0 (found by review:
    G = 1, n = 1396, eps = 0.767 gave 1.5464e-321 against an exact 1.5456e-321)."""
    law = L.laplace_endpoint_law(1.0, 1, 7.0)
    assert L.lattice_delta(law, 1396, 0.7666408185802664, directions=("forward",)) == 0.0
