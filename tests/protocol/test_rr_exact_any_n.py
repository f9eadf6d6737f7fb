"""Certified shuffled binary randomized response at any n (``protocol/accounting/rr_any_n.py``).

* Exhaustive check at small n: every dataset of the other users (all ``2^(n-1)`` bit vectors,
  not only the counts) and both neighbouring directions, in 40-digit arithmetic: the certified
  delta(eps) and eps(delta) are never below the true maximum and exceed it by at most their
  numerical padding.
* Monotone in n across the direct exact code's 1,500 limit, agreement with that code (n <= 1,500),
  the FFT error bound against a direct convolution, and the block bounds at large n.
"""

from __future__ import annotations

import itertools
import math

import mpmath
import numpy as np
import pytest

from shuffledp.protocol.accounting import binary_rr_guarantee, shuffled_round
from shuffledp.protocol.accounting import rr_any_n
from shuffledp.protocol.accounting.rr_any_n import (
    certified_delta,
    certify_epsilon,
    dataset_epsilon,
    rr_monotone_epsilon,
)
from shuffledp.protocol.accounting._numerics import search_epsilon
from shuffledp.protocol.accounting.rr_exact import rr_exact_delta, rr_exact_epsilon

DPS = 40


def _step(dist, b, rho):
    """The law of the count after one more report of a user holding ``b`` (40 digits)."""
    p1 = rho if b == 1 else 1 - rho
    new = [mpmath.mpf(0)] * (len(dist) + 1)
    for s, w in enumerate(dist):
        new[s] += w * (1 - p1)
        new[s + 1] += w * p1
    return new


def _view(bits, user1, epsilon0):
    """Law of the number of ones among n shuffled RR reports (40 digits), user 1 holding ``user1``."""
    e = mpmath.exp(mpmath.mpf(epsilon0))
    rho = e / (1 + e)
    dist = [mpmath.mpf(1)]
    for b in (user1, *bits):
        dist = _step(dist, b, rho)
    return dist


def _every_view(length, user1, epsilon0):
    """:func:`_view` of every bit vector of ``length`` others, in ``itertools.product`` order: each
    vector's law by the same steps in the same order, the steps of a shared prefix taken once."""
    e = mpmath.exp(mpmath.mpf(epsilon0))
    rho = e / (1 + e)
    level = [_step([mpmath.mpf(1)], user1, rho)]
    for _ in range(length):
        level = [_step(dist, b, rho) for dist in level for b in (0, 1)]
    return level


#: Largest difference between the laws of two bit vectors with the same number of ones (the same
#: law, computed in another order: they agree to ~1e-39 at 40 digits).
SAME_COUNT_SPREAD = 1e-30


def _true_delta_fn(n, epsilon0):
    """delta(eps) maximised over every dataset of the others and both directions (40 digits).

    Every one of the ``2^(n-1)`` bit vectors gets its own pair of laws. Vectors with the same number
    of ones have the same laws (the count is a sum of independent reports): that is checked, to
    :data:`SAME_COUNT_SPREAD`, not assumed. Each such group is evaluated once, at its envelope: the
    hockey-stick divergence ``D(a || b)`` only grows with ``a`` and falls with ``b``, so the
    elementwise maximum of the one law and minimum of the other bound every member's divergence from
    above, by at most ``SAME_COUNT_SPREAD (1 + e^eps)`` per entry more."""
    with mpmath.workdps(DPS):
        groups: dict[int, list] = {}
        for bits, p, q in zip(itertools.product((0, 1), repeat=n - 1), _every_view(n - 1, 1, epsilon0),
                              _every_view(n - 1, 0, epsilon0)):
            groups.setdefault(sum(bits), []).append((p, q))
        envelopes = []
        for members in groups.values():
            hi_p, lo_p = _envelope([p for p, _ in members])
            hi_q, lo_q = _envelope([q for _, q in members])
            envelopes += [(hi_p, lo_q), (hi_q, lo_p)]  # both directions, (P1, P0) and (P0, P1)

    def delta(eps):
        with mpmath.workdps(DPS):
            c = mpmath.exp(mpmath.mpf(eps))
            return max(mpmath.fsum(max(x - c * y, 0) for x, y in zip(a, b)) for a, b in envelopes)

    return delta


def _envelope(laws):
    """Elementwise maximum and minimum of laws that must agree to :data:`SAME_COUNT_SPREAD`."""
    hi = [max(col) for col in zip(*laws)]
    lo = [min(col) for col in zip(*laws)]
    assert max(h - l for h, l in zip(hi, lo)) <= SAME_COUNT_SPREAD
    return hi, lo


def _true_epsilon(delta_fn, delta, epsilon0):
    with mpmath.workdps(DPS):
        lo, hi = mpmath.mpf(0), mpmath.mpf(epsilon0)
        if delta_fn(lo) <= delta:
            return 0.0
        for _ in range(80):
            mid = (lo + hi) / 2
            if delta_fn(mid) <= delta:
                hi = mid
            else:
                lo = mid
        return float(hi)


# Padding of the certified values for n <= 12 (module docstring, Step 4): A_t and B_t are padded
# by a relative eta <= 7u * 13 + (L + 9)u with L <= 13 window points, eta ~ 1.2e-14 (u = 2^-53),
# so delta = max_t A_t - e^eps B_t is overstated by at most eta (1 + e^eps) (A_t, B_t <= 1) plus
# the window cut-off (1e-25) and 4u relative: DELTA_ABS_GAP = 2e-14 (1 + e^eps) covers it.
# eps(delta) = log max_t (A_t - delta) / B_t is overstated by at most eta (A_t/(A_t - delta) + 1)
# plus the 1e-10 * delta cut-off, relative to (A_t - delta)/B_t >= 1 at the optimum: with
# delta <= 1e-2 and A_t >= delta at the optimum this is < 1e-9 absolute on eps on these grids.
DELTA_ABS_GAP = 2e-14
EPS_ABS_GAP = 1e-9


@pytest.mark.parametrize("n,epsilon0", [(2, 1.0), (5, 0.5), (8, 2.0), (10, 1.0), (12, 3.0)])
def test_certified_delta_bounds_every_dataset_pair_at_small_n(n, epsilon0):
    true_delta = _true_delta_fn(n, epsilon0)
    for eps in (0.0, 0.05, 0.3, 0.9, epsilon0 * 0.99):
        truth = float(true_delta(eps))
        got = certified_delta(eps, n, epsilon0)
        assert got >= truth, (eps, got, truth)
        assert got - truth <= DELTA_ABS_GAP * (1 + math.exp(eps)) + 4e-16 * truth, (eps, got, truth)


@pytest.mark.parametrize("n,epsilon0", [(3, 1.0), (7, 2.0), (10, 4.0)])
def test_certified_epsilon_bounds_the_true_epsilon_at_small_n(n, epsilon0):
    true_delta = _true_delta_fn(n, epsilon0)
    for delta in (1e-2, 1e-4):
        truth = _true_epsilon(true_delta, delta, epsilon0)
        cert = certify_epsilon(delta, n, epsilon0)
        assert cert.exact
        assert cert.lower <= truth <= cert.upper, (delta, cert, truth)
        assert cert.upper - truth <= EPS_ABS_GAP, (delta, cert.upper, truth)


def test_monotone_in_n_across_the_old_limit():
    """eps0 = 1, delta = 1e-6: no jump from 0.1010 (n = 1,500) to the variation-ratio 0.1196 (n = 1,501)."""
    ns = [1499, 1500, 1501, 1502, 2000, 2001, 2031, 2032, 5000, 10**5]
    eps = [shuffled_round(binary_rr_guarantee(1.0), n, 1e-6).epsilon for n in ns]
    assert all(b <= a for a, b in zip(eps, eps[1:])), dict(zip(ns, eps))
    assert eps[2] < 0.1011  # no jump at 1,501 (variation-ratio: 0.1196)


def test_monotone_helper_is_a_minimum_over_a_growing_grid():
    vals = [rr_monotone_epsilon(1e-6, n, 4.0).epsilon for n in (1990, 2000, 2010, 2031, 2032, 2100)]
    assert all(b <= a for a, b in zip(vals, vals[1:])), vals


@pytest.mark.parametrize("n,epsilon0", [(40, 1.5), (300, 0.5), (800, 2.0), (1500, 1.0), (1500, 4.0)])
def test_agrees_with_the_previous_exact_code(n, epsilon0):
    """The direct code's delta (rr_exact) carries a 1e-12 relative pad; a bracket search on it gives
    the upper end of a 1e-6 bracket.

    The certified delta is padded by eta (1 + e^eps) absolute with eta <= (7 * steps + L + 9) u, at most
    ~1.5e-13 for the <= 150-step, <= 310-point windows of n <= 300 (module docstring, Step 4).
    """
    for eps in (0.05, 0.2, 0.6):
        old = rr_exact_delta(eps, n, epsilon0)
        new = certified_delta(eps, n, epsilon0) if n <= 300 else None
        if new is not None:
            assert abs(new - old) <= 3e-12 * old + 2e-13 * (1 + math.exp(eps)), (eps, new, old)
    # a bracket search: upper end of a 1e-6 bracket on the direct all-datasets delta
    old_eps = search_epsilon(lambda e: rr_exact_delta(e, n, epsilon0), 1e-6, 0.0, epsilon0, rtol=1e-6)[1]
    cert = certify_epsilon(1e-6, n, epsilon0)
    assert cert.exact and cert.upper - cert.lower <= 1e-9 * cert.upper
    assert old_eps * (1 - 1.01e-6) <= cert.upper <= old_eps * (1 + 1e-9), (cert.upper, old_eps)
    assert rr_exact_epsilon(1e-6, n, epsilon0) == cert.upper  # computed by rr_any_n


def test_fft_error_bound_holds_against_direct_convolution(monkeypatch):
    """The FFT path's 2-norm bound covers the difference to the direct (positive-term) convolution."""
    j, l, e0 = 4000, 6000, 1.0
    tail = 1e-25
    monkeypatch.setattr(rr_any_n, "_DIRECT_MAX", 10**12)
    direct = rr_any_n._view.__wrapped__(j, l, e0, tail)
    monkeypatch.setattr(rr_any_n, "_DIRECT_MAX", 0)
    fft = rr_any_n._view.__wrapped__(j, l, e0, tail)
    assert direct.e2 == 0.0 and fft.e2 > 0.0 and direct.lo == fft.lo
    diff = fft.pmf - direct.pmf
    slack = direct.rel * direct.pmf  # the direct result's own error
    assert float(np.linalg.norm(np.maximum(np.abs(diff) - slack, 0.0))) <= fft.e2
    assert abs(float(direct.pmf.sum()) - 1.0) <= direct.out + 1e-12


@pytest.mark.parametrize("n,epsilon0", [(10**4, 1.0), (10**5, 4.0)])
def test_block_bounds_at_large_n(n, epsilon0):
    cert = certify_epsilon(1e-6, n, epsilon0)
    assert 0.0 < cert.lower <= cert.upper <= epsilon0
    # any single dataset is a lower bound (here all others hold 1, and all hold 0)
    m = n - 1
    for ones in (0, m):
        assert dataset_epsilon(1e-6, ones, m - ones, epsilon0)[1] <= cert.upper
    # the certified gap is what the block loss allows: a block of width b costs ~ b / (2n)
    assert cert.upper <= cert.lower * 1.03
    rb = shuffled_round(binary_rr_guarantee(epsilon0), n, 1e-6)
    assert rb.epsilon <= rb.candidates["variation-ratio"]
    assert rb.lower_bound <= rb.epsilon


def test_dataset_epsilon_matches_old_single_dataset_code():
    from shuffledp.protocol.accounting.rr_exact import rr_delta

    n, e0 = 200, 2.0
    m = n - 1
    for ones in (0, 3, 77, m):
        for eps in (0.1, 0.5):
            old = rr_delta(eps, n, e0, ones)  # max of both directions
            up1 = rr_any_n.dataset_delta(eps, ones, m - ones, e0)[0]
            up2 = rr_any_n.dataset_delta(eps, m - ones, ones, e0)[0]  # the other direction (Step 1)
            assert max(up1, up2) >= old * (1 - 1e-12)
            assert max(up1, up2) <= old * (1 + 1e-11) + 1e-300
    assert math.isfinite(dataset_epsilon(1e-6, 0, m, e0)[0])


# ------------------------------------------------------------ delta curves for composition
@pytest.mark.parametrize("n,e0,evals", [(300, 1.0, 30), (2_500, 2.0, 40), (40, 4.0, 12)])
def test_delta_curve_is_above_every_dataset(n, e0, evals):
    """Blocks refined at one eps bound every dataset at every eps of the grid (cores by
    post-processing): never below the all-dataset maximum, even with few evaluations; with the
    default budget (up to 4n + 64 at n <= 2000) the refinement stops only within BLOCK_TOL of a
    dataset's lower bound, so at the reference eps it meets the maximum to that tolerance."""
    from shuffledp.protocol.accounting.rr_any_n import BLOCK_TOL, certified_delta, certified_delta_curve

    grid = np.linspace(0.0, min(e0, 0.6), 6)
    # the largest certified *lower* bound over every dataset (dataset_delta's lower side), at each eps
    # of the grid: dataset by dataset, so that each dataset's view is built once for the whole grid
    lower = np.max([[rr_any_n._dataset_delta_side(float(e), k, n - 1 - k, e0, False) for e in grid]
                    for k in range(n)], axis=0)
    capped = certified_delta_curve(grid, n, e0, float(grid[3]), max_evaluations=evals)
    for e, c, low in zip(grid, capped, lower):
        assert c >= low, e
    if n <= 2000:
        full = certified_delta_curve(grid, n, e0, float(grid[3]))
        exact = certified_delta(float(grid[3]), n, e0)
        assert exact <= full[3] <= exact * (1 + BLOCK_TOL) + 1e-15


def test_binary_rr_session_curve_uses_the_certified_curve_above_1500():
    """A session of binary-RR rounds above the direct exact limit composes the all-dataset curve,
    tighter than the stronger-clone pair, and never below one round."""
    from shuffledp.protocol.accounting import SessionAccountant, strong_clone_pair
    from shuffledp.protocol.accounting.shuffle_round import binary_rr_delta_curve, round_delta_curve

    n, e0 = 50_000, 1.0
    grid = np.linspace(0.0, 0.05, 11)
    rr = binary_rr_delta_curve(grid, n, e0)
    clone = np.array([strong_clone_pair(e0, n).delta(float(e), rtol=1e-3) for e in grid])
    # above the FFT error floor of the views (~5e-13 here), where the round takes the clone pair
    big = clone > 1e-10
    assert np.all(rr[big] <= clone[big] * (1 + 1e-2)) and rr[3] < 0.5 * clone[3]
    curve = round_delta_curve(binary_rr_guarantee(e0), n, grid)
    assert np.all(curve <= np.minimum(rr, clone) * (1 + 2e-2))
    acc = SessionAccountant()
    acc.add_round(binary_rr_guarantee(e0), n, count=2)
    one = shuffled_round(binary_rr_guarantee(e0), n, 1e-6).epsilon
    assert one < acc.epsilon(1e-6) < 2 * one


# ------------------------------------------------------------ blocks with fair coins (Step 3)
def _count_law(ones, zeros, coins, user1, epsilon0):
    """Law of the count of ones (40 digits): user 1, ``ones``/``zeros`` others and ``coins`` fair coins."""
    with mpmath.workdps(DPS):
        dist = _view((1,) * ones + (0,) * zeros, user1, epsilon0)
        for _ in range(coins):
            new = [mpmath.mpf(0)] * (len(dist) + 1)
            for s, w in enumerate(dist):
                new[s] += w / 2
                new[s + 1] += w / 2
            dist = new
        return dist


def _hockey(p, q, eps):
    with mpmath.workdps(DPS):
        c = mpmath.exp(mpmath.mpf(eps))
        return mpmath.fsum(max(x - c * y, 0) for x, y in zip(p, q))


@pytest.mark.parametrize("epsilon0,k1,k2,m", [(1.0, 2, 11, 13), (0.5, 0, 12, 12), (2.0, 3, 9, 11)])
def test_block_with_coins_bounds_every_dataset_in_the_block(epsilon0, k1, k2, m):
    """The decomposition RR(b) = 2r Bern(1/2) + (1 - 2r) delta_b of the block's extra users: every
    dataset with k in [k1, k2] ones among the m others has divergence at most
    Pr[Bin(k2 - k1, 2r) < w] + D(core + w fair coins), for every w (exact, 40 digits)."""
    b = k2 - k1
    q = 2.0 / (1.0 + math.exp(epsilon0))
    for eps in (0.0, 0.2, 0.6):
        truth = max(_hockey(_count_law(k, m - k, 0, 1, epsilon0), _count_law(k, m - k, 0, 0, epsilon0), eps)
                    for k in range(k1, k2 + 1))
        core = _hockey(_count_law(k1, m - k2, 0, 1, epsilon0), _count_law(k1, m - k2, 0, 0, epsilon0), eps)
        assert truth <= core  # the plain core bound (post-processing)
        for w in range(1, b + 1):
            with mpmath.workdps(DPS):
                short = mpmath.fsum(mpmath.binomial(b, i) * mpmath.mpf(q) ** i * (1 - mpmath.mpf(q)) ** (b - i)
                                    for i in range(w))
            coin_core = _hockey(_count_law(k1, m - k2, w, 1, epsilon0), _count_law(k1, m - k2, w, 0, epsilon0), eps)
            with mpmath.workdps(DPS):
                assert truth <= short + coin_core, (eps, w, float(truth), float(short + coin_core))
            # and the float code's certified value of the coin core is above the exact one
            got = rr_any_n._dataset_delta_side(eps, k1, m - k2, epsilon0, True, w) if eps < epsilon0 else 0.0
            assert got >= float(coin_core) * (1 - 1e-12)


def test_block_coins_tail_is_certified():
    """``block_coins`` keeps Pr[Bin(extra, 2r) < w] below the requested mass (exact tail)."""
    from scipy import stats

    for extra, e0, mass in [(10, 1.0, 1e-3), (1000, 1.0, 1e-12), (10**6, 4.0, 1e-26), (5000, 0.5, 1e-26)]:
        w = rr_any_n.block_coins(extra, e0, mass)
        q = 2.0 / (1.0 + math.exp(e0))
        assert 0 <= w <= extra * q
        assert stats.binom.cdf(w - 1, extra, q) <= mass
    assert rr_any_n.block_coins(0, 1.0, 1e-6) == 0


def test_three_way_fft_error_bound_holds_against_direct_convolution(monkeypatch):
    """The one-pass FFT of the core and its coins (three windows): the 2-norm bound covers the
    difference to the direct (positive-term) convolution."""
    j, l, coins, e0 = 3000, 5000, 1500, 1.0
    tail = 1e-25
    monkeypatch.setattr(rr_any_n, "_DIRECT_MAX", 10**12)
    direct = rr_any_n._view.__wrapped__(j, l, e0, tail, coins)
    monkeypatch.setattr(rr_any_n, "_DIRECT_MAX", 0)
    fft = rr_any_n._view.__wrapped__(j, l, e0, tail, coins)
    assert direct.e2 == 0.0 and fft.e2 > 0.0 and direct.lo == fft.lo and len(direct.pmf) == len(fft.pmf)
    diff = fft.pmf - direct.pmf
    slack = direct.rel * direct.pmf
    assert float(np.linalg.norm(np.maximum(np.abs(diff) - slack, 0.0))) <= fft.e2
    assert abs(float(direct.pmf.sum()) - 1.0) <= direct.out + 1e-12


@pytest.mark.parametrize("n,epsilon0", [(10**5, 1.0), (10**5, 4.0)])
def test_coins_tighten_the_certificate(n, epsilon0):
    """With the blanket part of each block's extra users kept as fair coins, a block of width b
    loses about (1 - q/(4 r rho)) b / (2n) = (1 - 1/(2 rho)) b / (2n) instead of b / (2n) (q = 2r:
    the coins restore that share of the removed users' variance), so the certified gap shrinks
    by that factor: the plain-core certificate was held to 3 % here (it measured 0.7-1.5 %)."""
    cert = certify_epsilon(1e-6, n, epsilon0)
    r = 1.0 / (1.0 + math.exp(epsilon0))
    kept = 1.0 - (2 * r / 4) / (r * (1 - r))  # fraction of a removed user's variance the coins do not restore
    assert kept < 0.5
    assert cert.upper <= cert.lower * (1 + 0.03 * kept)
    m = n - 1
    assert max(dataset_epsilon(1e-6, k, m - k, epsilon0)[1] for k in (0, m // 2, m)) <= cert.upper


def test_certificate_refines_towards_the_lower_bound_below_it():
    """rr_monotone_epsilon passes the all-equal lower bound at the grid point below as a target:
    the certificate at the grid point keeps refining (within TARGET_EXTRA_EVALUATIONS) until it is
    below it, so no grid point below needs a certificate of its own; the value is unchanged."""
    calls = []

    def certify(delta, g, e0, target=None):
        calls.append((g, target))
        return certify_epsilon(delta, g, e0, target=target)

    n, e0 = 10**6, 4.0
    mono = rr_monotone_epsilon(1e-6, n, e0, certify=certify)
    assert len(calls) == 1 and calls[0][1] is not None
    g, target = calls[0]
    assert mono.certificate.upper <= target
    plain = certify_epsilon(1e-6, g, e0)
    assert plain.upper > target  # without the target the budget stops above it (measured 0.49 % gap)
    assert mono.epsilon == mono.certificate.upper <= plain.upper



def test_certificate_at_tiny_delta_keeps_its_plain_cores():
    """At delta = 1e-12 the coins' window lets the FFT error bound swamp B in the tail, so a block
    with coins alone would report eps0 (n = 1e6, eps0 = 1: a certificate of 1.0). Below
    COIN_PLAIN_BELOW_DELTA a block also takes its plain core; one-point windows stay out of the FFT."""
    for n, e0 in ((10**6, 1.0), (10**5, 0.05)):
        cert = certify_epsilon(1e-12, n, e0)
        assert cert.lower <= cert.upper <= cert.lower * 1.05, cert
