"""The summation analysis and chooser: the paper's example, exact privacy of the noise, refusals."""

from __future__ import annotations

import math

import cbor2
import numpy as np
import pytest
from scipy import stats

from shuffledp.protocol.wire import codec
from shuffledp.protocol.errors import InvalidParameter, MalformedMessage
from shuffledp.protocol.wire.messages import ModularSumParams, VectorSumParams
from shuffledp.protocol.mechanisms.summation_params import (
    check_scalar_sum,
    choose_scalar_sum,
    choose_vector_sum,
    is_prime,
    messages_needed,
    rdp_to_dp,
    skellam_rdp,
    skellam_tail,
    split_delta,
    split_sigma,
    vector_sensitivities,
)
from tests.parties import make_spec


def test_messages_needed_reproduces_bbgn_example():
    """BBGN (arXiv:1909.11225): 32-bit numbers from 10^4 parties, 12 messages, security 2^-40."""
    n = 10**4
    assert messages_needed(n, n * 2**32, 40) == 12
    assert split_sigma(n, 12, n * 2**32) >= 40 > split_sigma(n, 11, n * 2**32)


def test_split_bound_says_nothing_below_three_users_or_messages():
    assert split_delta(2, 10, 101, 1.0) == math.inf
    assert split_delta(100, 2, 101, 1.0) == math.inf
    with pytest.raises(InvalidParameter, match="users"):
        messages_needed(2, 101, 10)


@pytest.mark.parametrize("n", [1000, 10**4, 10**5, 10**6])
def test_scalar_choice_holds_its_analysis(n):
    c = choose_scalar_sum(n, 1.0, 1e-6, -1.0, 1.0)
    p = c.params
    assert is_prime(p.modulus) and p.modulus > 2 * n * p.precision
    assert c.split_delta <= 1e-6 and c.noise_delta == 0.0
    assert p.messages == messages_needed(n, p.modulus, math.log2((1 + math.e) / 1e-6))
    assert c.wrap_probability <= 1e-9
    # worst-case rounding adds at most 1 % to the discrete Laplace, which is below the Laplace's 2 (2/eps)^2
    assert c.worst_sum_variance <= 1.01 * 2 * (2.0 / 1.0) ** 2
    check_scalar_sum(p, 1.0, 1e-6)


def test_scalar_overrides_are_checked():
    with pytest.raises(InvalidParameter, match="messages") as info:
        choose_scalar_sum(1000, 1.0, 1e-6, 0.0, 1.0, messages=3)
    assert "needs at least" in str(info.value)
    with pytest.raises(InvalidParameter, match="modulus"):
        choose_scalar_sum(1000, 1.0, 1e-6, 0.0, 1.0, precision=100, modulus=2 * 1000 * 100)
    with pytest.raises(InvalidParameter, match="users"):
        choose_scalar_sum(2, 1.0, 1e-6, 0.0, 1.0)
    with pytest.raises(InvalidParameter, match="precision"):  # alpha beyond the device sampler
        choose_scalar_sum(1000, 1e-3, 1e-6, 0.0, 1.0, precision=10**8, modulus=(1 << 61) - 1)


def test_a_spec_whose_parameters_miss_its_claim_does_not_decode():
    """Clients check the central claim they are charged for when they decode a spec."""
    params = choose_scalar_sum(1000, 1.0, 1e-6, 0.0, 1.0).params
    spec = make_spec(params=params, epsilon0=1.0, delta0=1e-6, messages_per_user=params.messages,
                     min_batch=params.min_reports, max_batch=params.min_reports)
    data = codec.encode(spec)
    assert codec.decode(data) == spec
    tighter = data.replace(cbor2.dumps(1e-6), cbor2.dumps(1e-9))  # claim delta 1e-9 with the same shares
    assert tighter != data
    with pytest.raises(MalformedMessage, match="messages"):
        codec.decode(tighter)
    with pytest.raises(InvalidParameter, match="delta0"):
        make_spec(params=params, epsilon0=1.0, delta0=0.0, messages_per_user=params.messages,
                  min_batch=params.min_reports, max_batch=params.min_reports)


def _skellam_delta(mu: float, shift: int, epsilon: float) -> float:
    """Exact hockey-stick divergence of Skellam(mu) + shift against Skellam(mu), both directions."""
    k = np.arange(-int(60 * math.sqrt(mu)) - 50, int(60 * math.sqrt(mu)) + 50 + shift)
    p = stats.skellam.pmf(k - shift, mu, mu)
    q = stats.skellam.pmf(k, mu, mu)
    return max(np.maximum(p - math.exp(epsilon) * q, 0).sum(), np.maximum(q - math.exp(epsilon) * p, 0).sum())


@pytest.mark.parametrize("mu,shift", [(20.0, 1), (200.0, 3), (2000.0, 10)])
def test_skellam_epsilon_is_an_upper_bound_on_the_exact_divergence(mu, shift):
    """The RDP route's (eps, delta) holds for the exact Skellam likelihood ratio (scalar shift)."""
    orders = list(range(2, 257))
    delta = 1e-6
    eps = rdp_to_dp(orders, [skellam_rdp(a, shift, shift, mu) for a in orders], delta)
    assert _skellam_delta(mu, shift, eps) <= delta
    # and it is not vacuous: a noticeably smaller eps does not hold
    assert _skellam_delta(mu, shift, 0.5 * eps) > delta


def test_rdp_conversion_matches_dp_accounting():
    from shuffledp.protocol.accounting import rdp_epsilon

    orders = list(range(2, 257))
    l1, l2 = vector_sensitivities(400, 16)
    curve = [skellam_rdp(a, l1, l2, 7.1e6) for a in orders]
    ours = rdp_to_dp(orders, curve, 1e-6)
    assert ours == pytest.approx(rdp_epsilon(orders, curve, 1e-6), rel=1e-9)


def test_vector_choice_holds_its_analysis():
    c = choose_vector_sum(10**4, 1.0, 1e-6, 16, 2.0, 7)
    p = c.params
    assert is_prime(p.modulus)
    assert c.split_delta <= 0.5e-6 and c.noise_delta == 0.5e-6
    p.check_budget(1.0, 1e-6)
    with pytest.raises(InvalidParameter, match="mu"):  # less noise than the claim needs
        VectorSumParams(p.dim, p.radius, p.levels, p.rotation_seed, p.modulus, p.messages, p.users, p.mu * 0.9).check_budget(1.0, 1e-6)
    with pytest.raises(InvalidParameter, match="messages"):
        VectorSumParams(p.dim, p.radius, p.levels, p.rotation_seed, p.modulus, 3, p.users, p.mu).check_budget(1.0, 1e-6)
    # rounding is at most 1 % of the noise, as the chooser promises
    assert p.users / 4 <= 0.01 * 2 * p.mu


def test_skellam_tail_is_a_tail_bound():
    for mu in (10.0, 1e4, 1e7):
        t = skellam_tail(mu, 1e-9)
        assert 2 * stats.skellam.sf(t - 1, mu, mu) <= 1e-9


def test_is_prime_agrees_with_a_sieve():
    limit = 20000
    sieve = np.ones(limit, dtype=bool)
    sieve[:2] = False
    for i in range(2, int(limit**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = False
    assert [is_prime(i) for i in range(limit)] == sieve.tolist()
    assert is_prime((1 << 61) - 1) and not is_prime((1 << 61) + 1)


@pytest.mark.parametrize(
    "kwargs,param",
    [
        (dict(messages=1), "messages"),
        (dict(users=1), "users"),
        (dict(modulus=2), "modulus"),
        (dict(noise="laplace"), "noise"),
        (dict(upper=-1.0), "upper"),
        (dict(precision=0), "precision"),
    ],
)
def test_modular_sum_params_validation(kwargs, param):
    base = dict(lower=0.0, upper=1.0, precision=10, modulus=10007, messages=5, users=100)
    with pytest.raises(InvalidParameter, match=param):
        ModularSumParams(**{**base, **kwargs})


@pytest.mark.parametrize(
    "params,epsilon0,delta0",
    [
        (ModularSumParams(0.0, 1.0, 2**40, (1 << 62) - 57, 10, 1000), 1e-6, 1e-6),  # alpha rounds to 1
        (ModularSumParams(0.0, 1.0, 100, 200_003, 3, 1000), 30.0, 1e-300),  # (1 + e^eps) / delta overflows
        (VectorSumParams(4, 1.0, 200, 1, 4_000_037, 10, 1000, 1.0), 1.0, 1e-6),  # mu at its floor: too little noise
    ],
)
def test_extreme_budgets_get_typed_refusals(params, epsilon0, delta0):
    """Extreme budgets are refused with a typed error, never a ZeroDivisionError / OverflowError out of a spec's decoding."""
    from parties import make_spec

    with pytest.raises(InvalidParameter):
        make_spec(params=params, epsilon0=epsilon0, delta0=delta0, messages_per_user=params.messages_per_user,
                  min_batch=params.min_reports, max_batch=params.min_reports)
    with pytest.raises(InvalidParameter, match="mu"):
        VectorSumParams(4, 1.0, 200, 1, 4_000_037, 10, 1000, 1e-200)


def test_a_modulus_too_small_for_any_sum_is_refused():
    c = choose_vector_sum(1000, 1.0, 1e-6, 4, 1.0, 1)
    p = c.params
    with pytest.raises(InvalidParameter, match="modulus"):
        VectorSumParams(p.dim, p.radius, p.levels, p.rotation_seed, 3, p.messages, p.users, p.mu).check_budget(1.0, 1e-6)


def test_vector_chooser_coarsens_the_grid_for_few_users_rather_than_refuse():
    """With few users each device draws ``D mu / users`` of Poisson mean; the chooser halves
    ``levels`` (mu falls as levels^2) until that fits the exact sampler's budget, and the
    parameters still pass the budget check. At n = 1,000, d = 64, eps = 0.5 the default grid
    (800 levels) would need ~7e6."""
    from shuffledp.protocol.mechanisms.summation_params import DEVICE_MAX_TOTAL_MEAN, check_vector_sum, choose_vector_sum

    choice = choose_vector_sum(1000, 0.5, 5e-7, 64, 1.0, 0)
    p = choice.params
    assert p.padded_dim * p.mu / p.users <= DEVICE_MAX_TOTAL_MEAN
    assert 8 <= p.levels < 800  # coarser than the default, not below sqrt(D)
    check_vector_sum(p, 0.5, 5e-7)
    many = choose_vector_sum(100_000, 0.5, 5e-7, 64, 1.0, 0).params
    assert many.levels >= 800  # enough users: the grid is not coarsened
