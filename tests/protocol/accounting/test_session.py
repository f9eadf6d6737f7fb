"""Composition: dp-accounting regression values, our curve->PLD path, the session ledger."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import stats

from shuffledp.protocol.accounting import (
    AmplificationNotClaimed,
    SessionAccountant,
    binary_rr_guarantee,
    clone_pair_rdp,
    fmt21_pair,
    gaussian_mean_guarantee,
    generic_guarantee,
    girgis_rdp,
    hadamard_response_guarantee,
    rdp_epsilon,
    shuffled_round,
    strong_clone_pair,
    wor_subsampled_rdp,
)
from shuffledp.protocol.accounting.rr_exact import _log_views
from shuffledp.protocol.accounting.session import _pld_from_curve
from shuffledp.protocol.errors import InvalidParameter

D = 1e-4  # PLD discretisation used throughout



def _outcome(f, *args):
    try:
        return f(*args)
    except OverflowError:
        return "overflow"


def test_session_pld_steps_are_dp_accountings_numbers():
    """The session composes a round's PLD and reads its epsilon with dp-accounting's own arithmetic,
    done faster (``session._self_convolve_bounds``, ``_dense_self_compose``, ``_dense_epsilon_for_delta``):
    the truncation window, the composed pmf and the epsilon are dp-accounting's, bit for bit."""
    from dp_accounting.pld import common, pld_pmf

    from shuffledp.protocol.accounting import session

    rng = np.random.default_rng(7)
    for size, count in ((1, 10**9), (3, 2), (50, 65), (2_000, 30), (100_000, 2)):
        probs = np.zeros(size)
        probs[rng.choice(size, size=min(size, 40), replace=False)] = rng.random(min(size, 40))
        probs /= probs.sum()
        dense = pld_pmf.DensePLDPmf(D, -size // 3, probs, 1e-12, True)
        lower, upper = session._self_convolve_bounds(dense, count)
        assert (lower, upper) == tuple(int(v) for v in common.compute_self_convolve_bounds(probs, count, 1e-15))
        ours = session._dense_self_compose(dense, count, lower, upper)
        theirs = dense.self_compose(count)
        assert (ours._lower_loss, ours._infinity_mass) == (theirs._lower_loss, theirs._infinity_mass)
        assert np.array_equal(ours._probs, theirs._probs)
        for delta in (1e-15, 1e-9, 1e-6, 1e-2, 0.5):  # (dp-accounting overflows below a loss of -709)
            assert _outcome(session._dense_epsilon_for_delta, theirs, delta) == _outcome(
                type(theirs).get_epsilon_for_delta, theirs, delta)
        sparse = pld_pmf.SparsePLDPmf({int(i) - size // 3: float(probs[i]) for i in np.flatnonzero(probs)}, D, 1e-12,
                                      True)
        assert np.array_equal(session._dense_pmf(sparse)._probs, sparse.to_dense_pmf()._probs)


# ------------------------------------------------ dp-accounting's own regression values
def _gaussian_curve(sigma, eps):
    mu = 1.0 / sigma
    return stats.norm.cdf(-eps / mu + mu / 2) - np.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)


def test_curve_pld_reproduces_dp_accounting_gaussian_regression():
    # dp-accounting's pld_privacy_accountant_test.test_gaussian_basic: three Gaussian
    # mechanisms with noise multiplier sqrt(3) give delta(eps=1) = 0.126936.
    sigma = math.sqrt(3)
    grid = np.linspace(0, 12, 600)
    pld = _pld_from_curve(grid, _gaussian_curve(sigma, grid), D)
    composed = pld.self_compose(3)
    delta = composed.get_delta_for_epsilon(1.0)
    assert delta == pytest.approx(0.126936, abs=1e-3)
    assert delta >= 0.126936 - 1e-6  # pessimistic
    assert composed.get_epsilon_for_delta(0.126936) >= 1.0 - 1e-3


def test_curve_pld_reproduces_dp_accounting_laplace_regression():
    # dp-accounting's test_laplace_basic: Lap(1) three times and Lap(2) twice is pure 4-DP.
    def lap_curve(b, eps):
        return np.maximum(0.0, 1.0 - np.exp((eps - 1.0 / b) / 2.0))

    g1 = np.linspace(0, 1.0, 300)
    g2 = np.linspace(0, 0.5, 300)
    total = _pld_from_curve(g1, lap_curve(1.0, g1), D).self_compose(3).compose(
        _pld_from_curve(g2, lap_curve(2.0, g2), D).self_compose(2)
    )
    eps = total.get_epsilon_for_delta(1e-14)
    assert 4.0 - 1e-9 <= eps <= 4.0 + 10 * D
    ref = pld_lib.from_laplace_mechanism(1.0, value_discretization_interval=D).self_compose(3).compose(
        pld_lib.from_laplace_mechanism(2.0, value_discretization_interval=D).self_compose(2)
    )
    for e in (0.5, 1.0, 2.0, 3.0):
        ours, theirs = total.get_delta_for_epsilon(e), ref.get_delta_for_epsilon(e)
        assert ours >= theirs * (1 - 1e-3) - 1e-12  # ours is the pessimistic side
        assert ours == pytest.approx(theirs, rel=2e-2, abs=1e-9)


def test_rdp_conversion_matches_dp_accounting_regression():
    # rdp_privacy_accountant_test.test_compute_epsilon_delta_pure_dp
    assert rdp_epsilon(range(2, 33), [1.1] * 31, 1e-5) == pytest.approx(1.32783806176)


def test_wor_subsampling_matches_dp_accounting_gaussian():
    sigma, q = 2.0, 0.05
    orders = list(range(2, 41))
    inner = np.array([o / (2 * sigma**2) for o in orders])
    ours = wor_subsampled_rdp(inner, orders, q)
    theirs = rdp_privacy_accountant._compute_rdp_sample_wor_gaussian(q, sigma, orders)
    assert ours[0] == pytest.approx(theirs[0], rel=1e-12)  # order 2: same term
    assert np.all(ours >= theirs * (1 - 1e-12))  # dp-accounting uses the sharper Thm 27


# ---------------------------------------------------------------- RDP of rounds
def _rr_rdp(n, e0, orders):
    lp, lq = _log_views(n, e0, 0)
    o = np.asarray(orders, dtype=float)[:, None]
    from scipy.special import logsumexp

    a = logsumexp(o * lp + (1 - o) * lq, axis=1) / (o[:, 0] - 1)
    b = logsumexp(o * lq + (1 - o) * lp, axis=1) / (o[:, 0] - 1)
    return np.maximum(a, b)


@pytest.mark.parametrize("n,e0", [(1000, 1.0), (20_000, 2.0), (100_000, 4.0)])
def test_rdp_bounds_dominate_exact_rr(n, e0):
    orders = list(range(2, 65))
    exact = _rr_rdp(n, e0, orders)  # one dataset pair: a lower bound on the round's RDP
    for curve in (girgis_rdp(e0, n, orders), clone_pair_rdp(fmt21_pair(e0, n), orders),
                  clone_pair_rdp(strong_clone_pair(e0, n), orders)):
        assert np.all(curve >= exact * (1 - 1e-9))
        assert np.all(curve <= e0 + 1e-12)


# ---------------------------------------------------------------- session ledger
@pytest.fixture(scope="module")
def generic_round():
    return shuffled_round(generic_guarantee(1.0), 10_000, 1e-6)


def test_one_round_session_equals_round_bound(generic_round):
    acc = SessionAccountant(value_discretization_interval=D)
    acc.add_round(generic_guarantee(1.0), 10_000)
    eps = acc.epsilon(1e-6)
    numerical = generic_round.candidates["fmt21-numerical"]
    assert eps >= numerical * (1 - 1e-4)  # the PLD never undercuts the curve it discretises
    assert eps <= numerical + 2e-3


def test_one_round_session_binary_rr_small_n_uses_exact_curve():
    local = binary_rr_guarantee(2.0)
    rb = shuffled_round(local, 800, 1e-6)
    assert rb.method == "rr-exact" and rb.lower_bound == rb.epsilon
    acc = SessionAccountant(value_discretization_interval=D)
    acc.add_round(local, 800)
    eps = acc.epsilon(1e-6)
    assert rb.epsilon * (1 - 1e-4) <= eps <= rb.epsilon + 2e-3


def test_composition_between_single_round_and_k_times(generic_round):
    eps1 = generic_round.candidates["fmt21-numerical"]
    prev = eps1
    for k in (2, 5, 20):
        acc = SessionAccountant(value_discretization_interval=D)
        acc.add_round(generic_guarantee(1.0), 10_000, count=k)
        epsk = acc.epsilon(1e-6)
        assert eps1 <= epsk <= k * eps1
        assert epsk >= prev
        prev = epsk


def test_mixed_rounds_and_ledger_rows():
    acc = SessionAccountant(value_discretization_interval=D)
    acc.add_round(generic_guarantee(1.0), 10_000, count=3)
    acc.add_round(binary_rr_guarantee(0.5), 5_000)
    acc.add_round(generic_guarantee(1.0), 10_000, sampling_rate=0.05, sampling="uniform", count=4)
    rows = acc.describe()
    assert len(rows) == 3 and len(acc) == 8
    assert rows[0]["count"] == 3 and rows[1]["mechanism"] == "binary-rr"
    assert rows[2]["sampling"] == "uniform" and rows[2]["sampling_rate"] == 0.05
    assert rows[0]["round_epsilon"] > 0
    eps = acc.epsilon(1e-6)
    only_first = SessionAccountant(value_discretization_interval=D)
    only_first.add_round(generic_guarantee(1.0), 10_000, count=3)
    assert eps >= only_first.epsilon(1e-6)
    assert acc.delta(eps) <= 1e-6 * (1 + 1e-6)


@pytest.mark.parametrize("sampling", ["poisson", "uniform"])
def test_subsampling_reduces_epsilon(sampling):
    base = SessionAccountant(value_discretization_interval=D)
    base.add_round(generic_guarantee(1.0), 10_000, count=10)
    sub = SessionAccountant(value_discretization_interval=D)
    sub.add_round(generic_guarantee(1.0), 10_000, count=10, sampling_rate=0.1, sampling=sampling)
    lower_rate = SessionAccountant(value_discretization_interval=D)
    lower_rate.add_round(generic_guarantee(1.0), 10_000, count=10, sampling_rate=0.01, sampling=sampling)
    e_base, e_sub, e_low = base.epsilon(1e-6), sub.epsilon(1e-6), lower_rate.epsilon(1e-6)
    assert e_low < e_sub < e_base


def test_session_refuses_gaussian_and_bad_input():
    acc = SessionAccountant()
    with pytest.raises(AmplificationNotClaimed):
        acc.add_round(gaussian_mean_guarantee(1.0, 1e-6), 1000)
    with pytest.raises(InvalidParameter):
        acc.add_round(generic_guarantee(1.0), 1000, count=0)
    with pytest.raises(InvalidParameter):
        acc.add_round(generic_guarantee(1.0), 1000, sampling_rate=1.5)
    with pytest.raises(InvalidParameter):
        acc.add_round(generic_guarantee(1.0), 1000, sampling_rate=0.1, sampling="bernoulli")
    with pytest.raises(InvalidParameter):
        acc.epsilon(1e-6)  # empty session
    acc.add_round(generic_guarantee(1.0), 1000)
    with pytest.raises(InvalidParameter):
        acc.epsilon(0.0)


def test_hadamard_round_in_session():
    acc = SessionAccountant(value_discretization_interval=D)
    acc.add_round(hadamard_response_guarantee(2.0, 64), 1_000_000, count=2)
    single = shuffled_round(hadamard_response_guarantee(2.0, 64), 1_000_000, 1e-6)
    assert single.epsilon <= acc.epsilon(1e-6) <= 2 * single.epsilon


# ------------------------------------------------ skipping work that cannot win
def _sessions():
    from shuffledp.protocol.accounting import laplace_mean_guarantee

    out = []
    a = SessionAccountant()  # the default simulation's two rounds: the PLD route wins
    a.add_round(hadamard_response_guarantee(1.0, 32), 20_000)
    a.add_round(laplace_mean_guarantee(1.0, 4096), 20_000)
    out.append(a)
    b = SessionAccountant()  # many small subsampled rounds
    b.add_round(generic_guarantee(1.0), 2_000, sampling_rate=0.05, count=60)
    out.append(b)
    c = SessionAccountant()
    c.add_round(binary_rr_guarantee(2.0), 500, count=40)
    out.append(c)
    d = SessionAccountant()
    d.add_round(binary_rr_guarantee(4.0), 300, sampling_rate=0.1, sampling="uniform", count=5)
    out.append(d)
    return out


@pytest.mark.parametrize("i", range(4))
def test_rdp_floor_is_below_the_rdp_route_and_epsilon_is_the_smaller_route(i):
    """The floor (binary RR's exact RDP on one dataset, through the same subsampling, count and
    conversion) never exceeds the RDP route it stands in for, and ``epsilon`` always equals the
    smaller of the two routes, whether or not it skipped the RDP route."""
    acc = _sessions()[i]
    delta = 1e-6
    routes = acc.epsilon_breakdown(delta)
    assert acc.rdp_floor_epsilon(delta) <= routes["rdp"] * (1 + 1e-12)
    assert acc.epsilon(delta) == min(routes["pld"], routes["rdp"])


def test_rdp_floor_of_one_round_is_below_every_curve_it_stands_in_for():
    from shuffledp.protocol.accounting.rdp import EXTENDED_ORDERS, binary_rr_rdp_floor

    for e0, n in [(1.0, 20_000), (4.0, 1_000), (0.5, 10**6), (8.0, 100), (1.0, 2), (0.5, 10**7)]:
        floor = binary_rr_rdp_floor(e0, n, EXTENDED_ORDERS)
        for curve in (girgis_rdp(e0, n, EXTENDED_ORDERS), clone_pair_rdp(fmt21_pair(e0, n), EXTENDED_ORDERS),
                      clone_pair_rdp(strong_clone_pair(e0, n), EXTENDED_ORDERS)):
            assert np.all(floor <= curve), (e0, n)
        assert floor[0] > 0.0


def test_binary_rr_rdp_floor_is_the_exact_divergence_at_small_n():
    """At n = 6 the window holds every count: the floor is the exact Rényi divergence of the one
    dataset (all others at 0), checked against a direct sum over the view."""
    from shuffledp.protocol.accounting.rdp import binary_rr_rdp_floor

    e0, n = 1.5, 6
    rho = 1 / (1 + math.exp(-e0))
    m = n - 1
    x = stats.binom.pmf(np.arange(m + 1), m, 1 - rho)
    p1 = np.convolve(x, [1 - rho, rho])
    p0 = np.convolve(x, [rho, 1 - rho])
    for lam in (2, 3, 10):
        exact = max(math.log(np.sum(p1**lam * p0 ** (1 - lam))), math.log(np.sum(p0**lam * p1 ** (1 - lam)))) / (lam - 1)
        got = binary_rr_rdp_floor(e0, n, [lam])[0]
        assert exact * (1 - 2e-9) <= got <= exact


def test_blanket_curve_is_below_the_clone_pairs_it_replaces():
    """Curves of mechanisms with blanket laws skip the clone pairs (Su, Cheng & Wang 2025: the
    blanket is the optimal decomposition); on this grid every pair's curve is indeed above."""
    from shuffledp.protocol.accounting import block_hadamard_response_guarantee, k_rr_guarantee, laplace_mean_guarantee
    from shuffledp.protocol.accounting.shuffle_round import blanket_laws, blanket_round_delta, round_pairs

    for g in (hadamard_response_guarantee(1.0, 32), laplace_mean_guarantee(4.0, 1024), k_rr_guarantee(1.0, 8),
              block_hadamard_response_guarantee(2.0, 1024)):
        n = 5_000
        for e in np.linspace(0.0, g.epsilon0 / 2, 6)[1:]:
            b = blanket_round_delta(blanket_laws(g), n, float(e))
            for name, pair in round_pairs(g, n).items():
                assert b <= pair.delta(float(e), rtol=2e-2), (g.mechanism, name, e)


def test_threaded_blanket_curve_equals_the_sequential_one():
    from shuffledp.protocol.accounting.shuffle_round import blanket_laws, blanket_round_delta, round_delta_curve

    g = hadamard_response_guarantee(1.0, 32)
    grid = np.linspace(0.0, 0.05, 9)
    seq = np.array([blanket_round_delta(blanket_laws(g), 20_000, float(e)) for e in grid])
    assert np.array_equal(round_delta_curve(g, 20_000, grid), seq)


@pytest.mark.parametrize("spread", [1.0, 4.0, 20.0])
def test_power_sums_by_repeated_multiplication_bound_the_log_space_sums(spread):
    """The clone-pair moments now raise e^d to successive orders by multiplication (one exp per
    point): never below the log-space sums they replace, and within their stated padding, also
    where a gap between orders over- or underflows (spread 20: e^(20 * 64))."""
    from shuffledp.protocol.accounting.rdp import EXTENDED_ORDERS, CLONE_RDP_MAX_ORDER, _log_power_sums

    rng = np.random.default_rng(7)
    log_w = rng.normal(-50.0, 20.0, 4000)
    d = rng.uniform(-spread, spread, 4000)
    orders = [o for o in EXTENDED_ORDERS if o <= CLONE_RDP_MAX_ORDER]
    got = _log_power_sums(log_w, d, orders)
    o = np.asarray(orders, dtype=np.float64)
    x = log_w[None, :] + o[:, None] * d[None, :]
    top = x.max(axis=1)
    exact = np.log(np.exp(x - top[:, None]).sum(axis=1)) + top
    ref_err = 8 * 2.0**-52 * np.abs(x).max(axis=1)  # the log-space reference's own rounding
    assert np.all(got >= exact - ref_err)
    scale_err = 4 * 2.0**-52 * np.cumsum(np.abs(exact) + np.abs(np.diff(exact, prepend=exact[0])) + 1.0)
    assert np.all(got - exact <= (2 * o + 8 + len(d)) * 2.0**-52 * 1.01 + scale_err + ref_err)


def test_session_at_large_n_is_never_reported_as_zero():
    """gammaln-based log-pmfs (off by ~1e-7 at n ~ 1e8) would make the clone pair's order-2
    Rényi moment (~1e-8) negative, clipped to 0, and dp-accounting turns an RDP of 0 into
    epsilon = 0. The moments come from exact pmf ratios: the session stays above the exact
    shuffled-RR floor (a lower bound for every eps0-only bound)."""
    from shuffledp.protocol.accounting import rr_lower_epsilon

    n, e0 = 3 * 10**7, 0.5
    acc = SessionAccountant()
    acc.add_round(generic_guarantee(e0), n)
    floor = rr_lower_epsilon(1e-6, n, e0)
    routes = acc.epsilon_breakdown(1e-6)
    assert routes["rdp"] >= floor and routes["pld"] >= floor
    assert acc.epsilon(1e-6) >= floor > 0
    assert np.all(clone_pair_rdp(fmt21_pair(e0, n), [2, 3, 4]) > 0)


def test_power_sums_keep_terms_that_underflowed_at_lower_orders():
    """A term below e^-745 of the largest at order 2 can be the largest at order
    256 (a likelihood ratio of e^10 on a Bin(1100, 1/2) window); the running products must not
    lose it."""
    from scipy import special

    from shuffledp.protocol.accounting.rdp import _log_power_sums

    for s_, spread in ((1100, 10.0), (5000, 20.0)):
        a = np.arange(0, s_ + 1.0)
        log_w = special.gammaln(s_ + 1) - special.gammaln(a + 1) - special.gammaln(s_ - a + 1) - s_ * math.log(2)
        d = np.linspace(-spread, spread, len(a))
        orders = list(range(2, 65)) + [80, 96, 128, 192, 256]
        got = _log_power_sums(log_w, d, orders)
        o = np.asarray(orders, dtype=np.float64)
        x = log_w[None, :] + o[:, None] * d[None, :]
        top = x.max(axis=1)
        exact = np.log(np.exp(x - top[:, None]).sum(axis=1)) + top
        assert np.all(got >= exact - 8 * 2.0**-52 * np.abs(x).max(axis=1))
