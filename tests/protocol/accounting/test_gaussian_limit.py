"""The Gaussian-limit diagnostics (``gaussian_limit``): closed forms against the randomizer
matrices, and the convexity argument that puts the worst composition at a homogeneous dataset."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from shuffledp.protocol.accounting import (
    binary_rr_guarantee,
    block_hadamard_response_guarantee,
    hadamard_response_guarantee,
    k_rr_guarantee,
    randomizer_matrix,
)
from shuffledp.protocol.accounting import blanket
from shuffledp.protocol.accounting import gaussian_limit as gl

from .test_blanket import laplace_matrix


@pytest.mark.parametrize("K", [4, 8, 16])
@pytest.mark.parametrize("e0", [0.5, 2.0, 6.0])
def test_hadamard_every_column_is_equally_bad_and_the_blanket_is_2rho_above(K, e0):
    R = randomizer_matrix(hadamard_response_guarantee(e0, K))
    rho = 1 / (1 + math.exp(-e0))
    closed = gl.hadamard_homogeneous_fisher(e0)
    for x0 in range(K):
        for x1 in range(K):
            if x0 == x1:
                continue
            d2 = (R[x0] - R[x1]) ** 2
            per_column = [float(np.sum(d2 / R[c])) for c in range(K)]
            assert per_column == pytest.approx([closed] * K, rel=1e-12)
            assert gl.blanket_fisher_from_matrix(R, x0, x1) == pytest.approx(2 * rho * closed, rel=1e-12)
    assert gl.blanket_fisher(blanket.hadamard_response_law(e0, K)) == pytest.approx(2 * rho * closed, rel=1e-12)


@pytest.mark.parametrize("e0", [0.5, 2.0, 4.0])
def test_binary_rr_has_the_same_2rho_gap_between_blanket_and_worst_dataset(e0):
    # binary RR is where rr_any_n's all-dataset analysis recovers this factor
    R = randomizer_matrix(binary_rr_guarantee(e0))
    rho = 1 / (1 + math.exp(-e0))
    f_worst, _ = gl.homogeneous_fisher(R, 0, 1)
    assert gl.blanket_fisher_from_matrix(R, 0, 1) / f_worst == pytest.approx(2 * rho, rel=1e-12)


@pytest.mark.parametrize("local", [k_rr_guarantee(2.0, 7), block_hadamard_response_guarantee(3.0, 24, 3)],
                         ids=["7-rr", "block-hr"])
def test_k_rr_and_block_hadamard_have_no_gap(local):
    R = randomizer_matrix(local)
    for x0, x1 in [(0, 1), (1, 4)]:
        f_worst, c = gl.homogeneous_fisher(R, x0, x1)
        assert c not in (x0, x1)  # a third value / block
        assert gl.blanket_fisher_from_matrix(R, x0, x1) == pytest.approx(f_worst, rel=1e-12)


@pytest.mark.parametrize("e0", [0.5, 2.0, 5.0])
@pytest.mark.parametrize("G", [1, 6, 9])
def test_laplace_closed_forms_match_a_wide_matrix(e0, G):
    pad = int(60 * G / e0) + 60  # r^pad < e^-60: the folded tails are far below the checked digits
    R = laplace_matrix(e0, G, pad)
    f_blanket, f_worst, c = gl.laplace_fishers(e0, G)
    assert f_blanket == pytest.approx(gl.blanket_fisher_from_matrix(R, 0, G), rel=1e-10)
    ref_worst, ref_c = gl.homogeneous_fisher(R, 0, G)
    assert f_worst == pytest.approx(ref_worst, rel=1e-10)
    assert c in (0, G) and ref_c in (0, G)  # the others at an end of the grid
    law = blanket.laplace_report_law(e0, G)
    assert gl.blanket_fisher(law) == pytest.approx(f_blanket, rel=1e-10)


def _compositions(k: int, count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.vstack([rng.dirichlet(np.full(k, a), size=count // 3) for a in (0.2, 1.0, 5.0)])


@pytest.mark.parametrize("case", ["hadamard", "laplace", "k-rr"])
def test_no_composition_is_worse_than_the_worst_homogeneous_dataset(case):
    """F is convex in the composition, so its maximum is at a vertex. Random interior and near-vertex
    compositions never exceed it; at the vertices F equals the chi-square form."""
    if case == "hadamard":
        R, x0, x1 = randomizer_matrix(hadamard_response_guarantee(1.5, 8)), 0, 3
    elif case == "laplace":
        R, x0, x1 = laplace_matrix(2.0, 6, 90), 0, 6
    else:
        R, x0, x1 = randomizer_matrix(k_rr_guarantee(1.0, 5)), 0, 1
    f_worst, _ = gl.homogeneous_fisher(R, x0, x1)
    k = R.shape[0]
    vertices = [gl.fixed_composition_fisher(R, np.eye(k)[c], x0, x1) for c in range(k)]
    d2 = (R[x0] - R[x1]) ** 2
    assert vertices == pytest.approx([float(np.sum(d2 / R[c])) for c in range(k)], rel=1e-8)
    assert max(vertices) == pytest.approx(f_worst, rel=1e-8)
    for w in _compositions(k, 300, seed=11):
        assert gl.fixed_composition_fisher(R, w, x0, x1) <= f_worst * (1 + 1e-8)
    # and the fixed composition is never below the i.i.d. mixture's chi-square (Jensen on Q Q^T)
    for w in _compositions(k, 30, seed=12):
        assert gl.fixed_composition_fisher(R, w, x0, x1) >= float(np.sum(d2 / (w @ R))) * (1 - 1e-8)


@pytest.mark.parametrize("mu", [1e-4, 0.05, 1.0, 4.0])
@pytest.mark.parametrize("delta", [1e-9, 1e-6, 1e-2])
def test_gdp_epsilon_solves_the_gaussian_dp_curve(mu, delta):
    e = gl.gdp_epsilon(mu, delta)

    def curve(x):
        return special.ndtr(-x / mu + mu / 2) - math.exp(x) * special.ndtr(-x / mu - mu / 2)

    if e == 0.0:
        assert curve(0.0) <= delta
    else:
        assert curve(e) == pytest.approx(delta, rel=1e-6)
        assert curve(e * (1 - 1e-6)) > delta


def test_predicted_ratio_is_one_for_equal_constants_and_grows_with_the_gap():
    assert gl.predicted_ratio(2.0, 2.0, 10**6, 1e-6) == pytest.approx(1.0, rel=1e-12)
    small, large = gl.predicted_ratio(1.2, 1.0, 10**6, 1e-6), gl.predicted_ratio(1.5, 1.0, 10**6, 1e-6)
    assert 1.0 < small < large < math.sqrt(1.5) * 1.1
