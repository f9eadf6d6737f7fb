"""Block (multi-bit) Hadamard response in the accountant.

Every claimed parameter is recomputed from the output distributions by exact
enumeration, the round bound is checked against the exact shuffled divergence
maximised over every dataset (small n), and B = 1 is compared with one-bit Hadamard
response. Tolerances: 1e-12 for closed-form parameters against enumeration (float
rounding of sums of at most a few hundred terms), ``REL = 1e-9`` when an upper bound
is compared with an exact divergence (as in ``test_bounds.py``).
"""

from __future__ import annotations

import functools
import itertools
import json
import math

import numpy as np
import pytest

from shuffledp.cli import main
from shuffledp.client.hadamard_response import (
    HadamardResponseParams,
    hadamard_response_probabilities,
    randomize_hadamard_response,
)
from shuffledp.protocol.accounting import (
    ClonePair,
    SessionAccountant,
    WorstOfPairs,
    block_hadamard_pair_types,
    block_hadamard_response_guarantee,
    dominating_pairs,
    generic_guarantee,
    hadamard_response_guarantee,
    k_rr_guarantee,
    randomizer_matrix,
    shuffled_round,
    variation_ratio_parameters,
)
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.accounting.shuffle_round import blanket_laws, blanket_round_delta
from shuffledp.protocol.mechanisms.randomness import SeededSource

from .brute import clone_pair_delta

REL = 1e-9
TOL = 1e-12


def _same_block(x0: int, x1: int, B: int) -> bool:
    return x0 % B == x1 % B


def _rounded_matrix(local) -> np.ndarray:
    """The matrix of the mechanism the client really runs (rounded-down ``t``)."""
    P = HadamardResponseParams(local.k, local.epsilon0, local.num_blocks)
    p_in, p_out = hadamard_response_probabilities(P)
    R = randomizer_matrix(local)
    return np.where(R > R.min(axis=1, keepdims=True) * (1 + 1e-9), p_in, p_out)


# --------------------------------------------------------------- construction
def test_guarantee_resolves_blocks_like_the_client():
    for k, e0 in [(1024, 1.0), (1024, 4.0), (7, 2.0), (2, 0.5)]:
        g = block_hadamard_response_guarantee(e0, k)
        assert g.mechanism == "block-hadamard-response" and g.k == k
        assert g.num_blocks == HadamardResponseParams(k, e0).blocks
    assert block_hadamard_response_guarantee(3.0, 64, 5).num_blocks == 5
    for bad in [lambda: block_hadamard_response_guarantee(1.0, 1),
                lambda: block_hadamard_response_guarantee(1.0, 8, 9),
                lambda: block_hadamard_response_guarantee(1.0, 8, 0)]:
        with pytest.raises(InvalidParameter):
            bad()


@pytest.mark.parametrize("k,B,e0", [(7, 1, 2.0), (4, 2, 2.0), (6, 3, 2.0)])
def test_matrix_is_the_clients_mechanism(k, B, e0):
    """The enumerated matrix (rounded ``t``) reproduces the client's sampler: every
    output's empirical frequency is nearer its claimed probability than the other
    value (20000 draws per symbol, fixed seed; the two values differ by a factor e^2,
    tens of standard deviations apart)."""
    local = block_hadamard_response_guarantee(e0, k, B)
    params = HadamardResponseParams(k, e0, B)
    R = _rounded_matrix(local)
    p_in, p_out = hadamard_response_probabilities(params)
    source = SeededSource(20240611)
    draws = 20_000
    for x in range(k):
        y = randomize_hadamard_response(np.full(draws, x), params, source)
        freq = np.bincount(y, minlength=params.output_size) / draws
        other = np.where(R[x] == p_in, p_out, p_in)
        assert np.all(np.abs(freq - R[x]) < np.abs(freq - other)), x
    assert np.allclose(randomizer_matrix(local), R, rtol=1e-12, atol=0)


# ------------------------------------------------------ parameters by enumeration
@pytest.mark.parametrize("k,B", [(2, 2), (3, 1), (7, 1), (4, 2), (6, 3), (12, 2), (15, 1), (9, 4)])
@pytest.mark.parametrize("e0", [0.5, 3.0])
def test_pair_parameters_by_enumeration(k, B, e0):
    local = block_hadamard_response_guarantee(e0, k, B)
    P = HadamardResponseParams(k, e0, B)
    s = P.set_size
    R = randomizer_matrix(local)
    E = math.exp(e0)
    assert np.allclose(R.sum(axis=1), 1.0, rtol=0, atol=TOL)
    assert np.max(R[:, None, :] / R[None, :, :]) == pytest.approx(E, rel=TOL)  # p = q = e^eps0
    types = block_hadamard_pair_types(local)
    assert set(types) == ({"different-blocks"} if B >= 2 else set()) | ({"same-block"} if P.rows_per_block >= 2 else set())
    tvs = []
    for x0, x1 in itertools.permutations(range(k), 2):
        t = types["same-block" if _same_block(x0, x1, B) else "different-blocks"]
        inter = int(np.sum((R[x0] > R[x0].min()) & (R[x1] > R[x1].min())))
        assert inter == (s // 2 if _same_block(x0, x1, B) else 0)
        d = R[x0] - R[x1]
        tv = 0.5 * np.abs(d).sum()
        tvs.append(tv)
        assert tv == pytest.approx(t.tv, rel=TOL)
        assert np.max(R[x0] / R[x1]) == pytest.approx(t.a0 / t.a1, rel=TOL)
        # the decomposition R[x0] = a0 Q0 + a1 Q1 + a2 Q2, R[x1] = a1 Q0 + a0 Q1 + a2 Q2
        Q0 = np.maximum(d, 0) / tv  # R0 - R1 = (a0 - a1)(Q0 - Q1), disjoint supports
        Q1 = np.maximum(-d, 0) / tv
        assert Q0.sum() == pytest.approx(1.0, abs=TOL) and Q1.sum() == pytest.approx(1.0, abs=TOL)
        rest0 = R[x0] - t.a0 * Q0 - t.a1 * Q1
        rest1 = R[x1] - t.a1 * Q0 - t.a0 * Q1
        assert np.allclose(rest0, rest1, rtol=0, atol=TOL)
        assert rest0.min() >= -TOL and rest0.sum() == pytest.approx(t.a2, abs=TOL)
        if t.a2 > 0:
            Q2 = rest0 / t.a2
            blanket = t.r * Q0 + t.r * Q1 + t.r2 * Q2
        else:
            blanket = t.r * Q0 + t.r * Q1
        # every input (including x0, x1) holds the clones: R[x] >= blanket pointwise
        assert np.all(R - blanket[None, :] >= -TOL)
        if _same_block(x0, x1, B):
            assert t.r2 == pytest.approx(t.a2 / E, rel=TOL)
        else:  # the clone probabilities exhaust the uniform part: blanket = p_out everywhere
            assert np.allclose(blanket, R.min(), rtol=TOL, atol=0)
    assert max(tvs) == pytest.approx(variation_ratio_parameters(local).beta, rel=TOL)
    if B >= 2:  # different blocks is the pair with the largest TV (twice the same-block TV)
        assert max(tvs) == pytest.approx((E - 1) / (E - 1 + 2 * B), rel=TOL)
        if "same-block" in types:
            assert types["different-blocks"].tv == pytest.approx(2 * types["same-block"].tv, rel=TOL)


def test_different_blocks_pair_is_2B_ary_rr():
    for e0, B in [(1.0, 2), (4.0, 27), (2.0, 5)]:
        t = block_hadamard_pair_types(block_hadamard_response_guarantee(e0, 4 * B, B))["different-blocks"]
        vr = variation_ratio_parameters(k_rr_guarantee(e0, 2 * B))
        alpha = vr.beta / (vr.p - 1)
        assert (t.a0, t.a1, t.a2, t.r, t.r2) == pytest.approx((vr.p * alpha, alpha, vr.a2, alpha, vr.r2), rel=TOL)


# --------------------------------------------------------- B = 1 vs one-bit HR
@pytest.mark.parametrize("K", [2, 4, 8])
def test_b1_coincides_with_one_bit_hadamard_response(K):
    """With B = 1 and b = 2K, the symbols on rows K..2K-1 of H_b are one-bit Hadamard
    response over K columns, up to relabelling outputs: row K + x' of H_2K is
    (H_K[x'], -H_K[x']), so output v = j is the pair (j, +1) and v = K + j is (j, -1).
    The remaining symbols (rows 1..K-1) are extra inputs one-bit HR does not have, but
    every pair of distinct rows has the same overlap, hence the same parameters."""
    e0 = 1.5
    k = 2 * K - 1
    blk = block_hadamard_response_guarantee(e0, k, 1)
    assert HadamardResponseParams(k, e0, 1).block_size == 2 * K
    Rb = randomizer_matrix(blk)
    Rh = randomizer_matrix(hadamard_response_guarantee(e0, K))
    perm = np.empty(2 * K, dtype=int)  # one-bit output index -> block output index
    for j in range(K):
        perm[2 * j + 1], perm[2 * j] = j, K + j
    for xp in range(K):
        assert np.allclose(Rb[K - 1 + xp, perm], Rh[xp], rtol=TOL, atol=0)


@pytest.mark.parametrize("e0,k", [(0.5, 5), (2.0, 64), (4.0, 1000)])
def test_b1_parameters_equal_one_bit_hadamard(e0, k):
    blk = block_hadamard_response_guarantee(e0, k, 1)
    types = block_hadamard_pair_types(blk)
    assert set(types) == {"same-block"}
    t = types["same-block"]
    vr = variation_ratio_parameters(hadamard_response_guarantee(e0, 16))
    alpha = vr.beta / (vr.p - 1)
    assert (t.a0, t.a1, t.a2, t.r, t.r2) == pytest.approx((vr.p * alpha, alpha, vr.a2, alpha * vr.p / vr.q, vr.r2), rel=TOL)
    n = 300_000
    a = dominating_pairs(blk, n)["variation-ratio"].epsilon(1e-6)
    b = dominating_pairs(hadamard_response_guarantee(e0, 16), n)["variation-ratio"].epsilon(1e-6)
    assert a == pytest.approx(b, rel=TOL)


# ------------------------------------------------------ validity by enumeration
def _worst_over_datasets_and_pairs(R: np.ndarray, n: int, eps_list) -> dict[float, float]:
    """max over every multiset of the other n - 1 inputs and every input pair of the
    exact shuffled divergence (the others' histogram is built once per dataset and shared by
    the pairs).

    brute.py's primitives on the histograms that can occur (at most n reports; brute's dense
    array holds every count up to n per output, zeros elsewhere): each entry by the same
    operations in the same order, so the same numbers. Each divergence is the exact sum of its
    terms (``math.fsum``) rounded up by 64 ulps, hence at least numpy's pairwise sum of the
    same terms (off by less than 32 ulps for these lengths): never below brute.hockey."""
    k, d = R.shape
    zero, shifts = _histogram_states(d, n)
    best = {e: 0.0 for e in eps_list}
    for others in itertools.combinations_with_replacement(range(k), n - 1):
        base = np.zeros(len(shifts[0]))
        base[zero] = 1.0
        for x in others:
            base = _add_report(base, R[x], shifts)
        views = [_add_report(base, R[x], shifts) for x in range(k)]
        for x0, x1 in itertools.combinations(range(k), 2):
            for e in eps_list:
                best[e] = max(best[e], _hockey_up(views[x0], views[x1], e))
    return best


@functools.lru_cache(maxsize=4)
def _histogram_states(d: int, n: int) -> tuple[int, list[np.ndarray]]:
    """The count vectors (first d - 1 outputs) of at most n reports, in the order of brute's dense
    array: the index of the empty one and, per output o, each state's index with one report of o
    fewer (-1 where it has none)."""
    states = [s for s in itertools.product(range(n + 1), repeat=d - 1) if sum(s) <= n]
    index = {s: i for i, s in enumerate(states)}
    shifts = [np.array([index[s[:o] + (s[o] - 1,) + s[o + 1:]] if s[o] else -1 for s in states])
              for o in range(d - 1)]
    return index[(0,) * (d - 1)], shifts


def _add_report(D: np.ndarray, row: np.ndarray, shifts: list[np.ndarray]) -> np.ndarray:
    """brute.add_user on the states of :func:`_histogram_states`."""
    new = row[-1] * D
    for o, shift in enumerate(shifts):
        has = shift >= 0
        new[has] += row[o] * D[shift[has]]
    return new


def _hockey_up(P: np.ndarray, Q: np.ndarray, eps: float) -> float:
    """brute.hockey, each sum exact and rounded up by 64 ulps (see _worst_over_datasets_and_pairs)."""
    E = math.exp(eps)
    up = 1.0 + 64 * 2.0**-53
    return max(math.fsum(np.maximum(P - E * Q, 0).tolist()) * up, math.fsum(np.maximum(Q - E * P, 0).tolist()) * up)


def test_clone_pairs_match_enumeration():
    """The engine's divergence of each type's pair equals the (a, b, z) enumeration
    (it is an upper bound, and within the engine's refinement tolerance)."""
    local = block_hadamard_response_guarantee(2.0, 6, 2)
    m = 12
    for t in block_hadamard_pair_types(local).values():
        pair = ClonePair(m + 1, t.a0, t.a1, t.a2, t.r, t.r2)
        for eps in (0.2, 0.6, 1.2):
            exact = clone_pair_delta(eps, m, t.a0, t.a1, t.a2, t.r, t.r2)
            got = pair.delta(eps, rtol=1e-4)
            assert exact * (1 - REL) <= got <= exact * (1 + 2e-4) + 1e-15, (t.name, eps, got, exact)


@pytest.mark.parametrize(
    "k,B,e0,n",
    [
        (3, 1, 1.0, 12),  # K = 4, same-block pairs only
        (2, 2, 1.0, 12),  # K = 4, different-blocks pairs only
        (4, 2, 2.0, 5),  # K = 8, both types
        (4, 2, 4.0, 5),
    ],
    ids=["B1", "B2-diff", "B2-both-e2", "B2-both-e4"],
)
def test_bound_dominates_exact_worst_case(k, B, e0, n):
    """Exact shuffled divergence, maximised over every multiset of the other users'
    inputs and every input pair, for the ideal and the rounded (deployed) mechanism,
    is below the accountant's bound."""
    local = block_hadamard_response_guarantee(e0, k, B)
    pair = dominating_pairs(local, n)["variation-ratio"]
    assert isinstance(pair, WorstOfPairs)
    laws = blanket_laws(local)  # what rounds use: the worst of the pair types' blanket laws
    eps_list = (0.1, 0.3, 0.6, 0.9, 1.5)
    for R in (randomizer_matrix(local), _rounded_matrix(local)):
        worst = _worst_over_datasets_and_pairs(R, n, eps_list)
        for eps in eps_list:
            bound = pair.delta(eps, rtol=1e-4)
            assert bound >= worst[eps] * (1 - REL), (eps, bound, worst[eps])
            assert blanket_round_delta(laws, n, eps) >= worst[eps], eps


# ----------------------------------------------------------- shape of the bound
@pytest.fixture(scope="module")
def grid():
    out = {}
    for e0, k in [(1.0, 64), (4.0, 1024)]:
        loc = block_hadamard_response_guarantee(e0, k)
        for n in (1_000, 10_000, 100_000):
            out[(e0, n)] = (shuffled_round(loc, n, 1e-6), shuffled_round(generic_guarantee(e0), n, 1e-6))
    return out


def test_bound_below_generic_and_eps0_and_monotone(grid):
    for (e0, n), (rb, gen) in grid.items():
        vr = rb.candidates["blanket"]  # rounds use the blanket laws (test_blanket_mechanisms.py)
        assert vr is not None and vr <= e0
        assert rb.epsilon <= gen.epsilon <= e0
        assert rb.epsilon == min(v for v in rb.candidates.values() if v is not None)
        if n >= 10_000:  # amplification clearly kicks in: the mechanism-specific bound wins
            assert vr < gen.candidates["fmt21-numerical"]
            assert rb.method == "blanket"
        assert rb.lower_bound is None  # binary RR is not a floor for this mechanism
    for e0 in (1.0, 4.0):
        eps = [grid[(e0, n)][0].candidates["blanket"] for n in (1_000, 10_000, 100_000)]
        assert eps[0] > eps[1] > eps[2]


def test_worst_type_is_taken():
    """At eps0 = 4, k = 1024 (B = 27), n = 1000 the same-block pair's bound is the larger
    one; at n = 1e4 the different-blocks one. The round uses the larger in both."""
    loc = block_hadamard_response_guarantee(4.0, 1024)
    assert loc.num_blocks == 27
    for n, worst in [(1_000, "same-block"), (10_000, "different-blocks")]:
        w = dominating_pairs(loc, n)["variation-ratio"]
        per = {p.name.split("/")[1]: p.epsilon(1e-6) for p in w.pairs}
        assert max(per, key=per.get) == worst
        assert w.epsilon(1e-6) == max(per.values())


# ------------------------------------------------------------- session and CLI
def test_session_and_cli(capsys):
    loc = block_hadamard_response_guarantee(2.0, 64, 4)
    acc = SessionAccountant(value_discretization_interval=1e-4)
    acc.add_round(loc, 1_000_000, count=2)
    one = shuffled_round(loc, 1_000_000, 1e-6).epsilon
    eps = acc.epsilon(1e-6)
    assert one <= eps <= 2 * one
    row = acc.describe()[0]
    assert row["mechanism"] == "block-hadamard-response" and row["num_blocks"] == 4 and row["k"] == 64

    argv = ["account", "-e", "2", "--mechanism", "block-hadamard-response", "-k", "64", "--blocks", "4",
            "-n", "1000000", "--delta", "1e-6", "--json"]
    assert main(argv) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["num_blocks"] == 4 and rep["round"]["method"] == "blanket"
    assert rep["round"]["epsilon"] == pytest.approx(one, rel=1e-12)
    assert main(["account", "-e", "2", "--mechanism", "block-hadamard-response", "-k", "64", "-n", "1000000"]) == 0
    assert "B=" in capsys.readouterr().out
    assert main(["account", "-e", "2", "--mechanism", "block-hadamard-response", "-n", "1000"]) == 2
    assert "--symbols" in capsys.readouterr().err
    assert main(["account", "-e", "2", "--mechanism", "k-rr", "-k", "4", "--blocks", "2", "-n", "1000"]) == 2
    assert "blocks" in capsys.readouterr().err


@pytest.mark.parametrize("e0,n", [(4.0, 10**6), (2.0, 10**4), (4.0, 1000)])
def test_second_law_is_searched_only_where_it_is_worse(e0, n):
    """blanket_round_epsilon searches the first law and only checks the second at that epsilon:
    the value is certified for both laws and never above the maximum of the two searches."""
    from shuffledp.protocol.accounting.blanket import blanket_delta, blanket_epsilon
    from shuffledp.protocol.accounting.shuffle_round import blanket_laws, blanket_round_epsilon

    laws = blanket_laws(block_hadamard_response_guarantee(e0, 1024))
    assert len(laws) == 2
    got = blanket_round_epsilon(laws, n, 1e-6, e0)
    assert got <= max(blanket_epsilon(law, n, 1e-6, e0) for law in laws)
    assert got >= e0 or all(blanket_delta(law, n, got) <= 1e-6 for law in laws)
