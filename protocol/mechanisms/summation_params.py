"""Parameters of multi-message summation: the analysis that makes a round private, and the chooser.

Privacy of one summation round (scalar or per coordinate) has two parts.

*Split and mix.* Every user sends ``M`` additive shares mod ``q`` of its noisy
encoding; the shuffler mixes all ``n M`` shares. For any two input vectors with the
same sum mod ``q`` the shuffled multisets are within statistical distance
``eta = 2^-sigma`` when ``n >= 3``, ``M >= 3`` and

    ``M >= (2 sigma + log2 q) / (log2 n - log2 e) + 1``

(Balle, Bell, Gascón & Nissim, "Improved Summation from Shuffling",
arXiv:1909.11225, Thm. 1; the analysis is reused in their CCS 2020 paper,
arXiv:2002.00817, Sec. 4). Check: their example, 32-bit inputs from ``n = 10^4``
parties (``q = n 2^32``) with 12 messages for ``sigma = 40``, is what
:func:`messages_needed` returns (``tests/protocol/test_summation_params.py``). This bound is
the one constant here we could not re-derive; it is applied as the note states it.
The chooser takes a prime ``q`` so that the field version of the same analysis
(Ghazi, Manurangsi, Pagh & Velingker, Eurocrypt 2020) applies as well.

*From secure summation to DP* (the standard reduction, e.g. BBGN CCS 2020 Lemma 4.1
in spirit, derived here): let ``V(x)`` be the shuffled view and ``Sim(S)`` the view
of a fixed input with the same sum ``S``. If the sum is ``(eps, delta_noise)``-DP,
then for every event ``E``,
``P[V(x) in E] <= P[Sim(S) in E] + eta <= e^eps P[Sim(S') in E] + delta_noise + eta
<= e^eps P[V(x') in E] + delta_noise + (1 + e^eps) eta``. With ``D`` independent
instances (one per coordinate) the views' distance adds: ``D eta``. So

    ``delta = delta_noise + (1 + e^eps) D eta``.

*Scalar noise:* Pólya shares summing to ``DLap(exp(-eps / p))``; the encoded sum has
sensitivity ``p`` (one user's encoding moves within ``[0, p]``), so the noise is pure
``eps``-DP: ``delta_noise = 0`` and all of ``delta`` goes to the split.

*Vector noise:* Skellam shares summing to ``Skellam(mu)`` (Poisson mean ``mu`` per
side, variance ``2 mu``) per coordinate; RDP of integer order ``a > 1`` (Agarwal,
Kairouz & Liu, NeurIPS 2021, arXiv:2110.04995, the Skellam mechanism's RDP bound,
written there with the variance ``2 mu``):

    ``eps(a) <= a D2^2 / (4 mu) + min(((2a - 1) D2^2 + 6 D1) / (16 mu^2), 3 D1 / (4 mu))``

with ``D2``, ``D1`` the l2 and l1 sensitivities of the encoded vector: encodings have
``||x||_2 <= L + sqrt(D)`` (radius ``L`` levels, randomized rounding moves each
coordinate by less than 1), so for a replaced user ``D2 = 2 (L + sqrt(D))`` and
``D1 = D2 min(sqrt(D), D2)`` (integer vectors have ``||x||_1 <= ||x||_2^2``). RDP
converts to ``(eps, delta_noise)`` by Canonne, Kamath & Steinke 2020, Prop. 12
(:func:`rdp_to_dp`). The chooser gives half of ``delta`` to the noise, half to the split.

*Wrap-around* (accuracy, not privacy): the analyzer decodes ``S mod q`` to
``(-q/2, q/2]``; the chooser takes ``q`` so that ``|S|`` exceeds ``q/2`` with
probability at most ``wrap_probability`` (reported), and refuses a ``q`` that
honest inputs without noise could already wrap.

This module is pure Python (math only): clients run :func:`check_scalar_sum` and
:func:`check_vector_sum` on every spec they decode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Generic, TypeVar

from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.wire.messages import (
    MAX_MESSAGES_PER_USER,
    ModularSumParams,
    VectorSumParams,
)
from shuffledp.protocol.mechanisms.distributed_noise import DEVICE_MAX_MEAN  # Pólya alpha/(1-alpha), Skellam mu/n
# Most Poisson mean a device draws in one vector-sum round, over all coordinates (D mu / users):
# the exact sampler takes a few microseconds per unit, so this is a few seconds of device CPU.
# skellam_shares refuses more on the device path, whatever the mechanism (local-vector too).
from shuffledp.protocol.mechanisms.distributed_noise import DEVICE_MAX_TOTAL_MEAN
from shuffledp.protocol.mechanisms.hadamard import next_power_of_two
from shuffledp.protocol.mechanisms.modular_sum import MAX_MODULUS, discrete_laplace_tail, wraparound_bound

LOG2_E = math.log2(math.e)
#: Orders at which the Skellam RDP bound is evaluated (integers, as the bound requires).
RDP_ORDERS = tuple(range(2, 257)) + tuple(range(264, 1025, 8)) + (1536, 2048, 4096, 8192)


# --------------------------------------------------------------------------
# Split and mix
# --------------------------------------------------------------------------


def split_sigma(users: int, messages: int, modulus: int) -> float:
    """The ``sigma`` (statistical distance ``2^-sigma``) BBGN's bound gives ``n`` users of ``M`` shares mod ``q``.

    ``-inf`` when the bound says nothing (``n < 3`` or ``M < 3``)."""
    if users < 3 or messages < 3:
        return -math.inf
    return ((messages - 1) * (math.log2(users) - LOG2_E) - math.log2(modulus)) / 2.0


def messages_needed(users: int, modulus: int, sigma: float) -> int:
    """Fewest shares per user with statistical distance ``2^-sigma`` (BBGN, arXiv:1909.11225, Thm. 1)."""
    if users < 3:
        raise InvalidParameter("users", f"split and mix needs at least 3 users, got {users}")
    need = (2.0 * sigma + math.log2(modulus)) / (math.log2(users) - LOG2_E) + 1.0
    return max(3, math.ceil(need - 1e-12))


def split_delta(users: int, messages: int, modulus: int, epsilon: float, instances: int = 1) -> float:
    """The ``delta`` the split costs: ``(1 + e^eps) instances 2^-sigma`` (module docstring)."""
    sigma = split_sigma(users, messages, modulus)
    if sigma == -math.inf:
        return math.inf
    return 2.0 ** min(1024.0, log2_one_plus_exp(epsilon) + math.log2(instances) - sigma)


def log2_one_plus_exp(epsilon: float) -> float:
    """``log2(1 + e^eps)`` without overflow."""
    return (epsilon + math.log1p(math.exp(-epsilon))) / math.log(2.0) if epsilon > 0 else math.log2(1.0 + math.exp(epsilon))


def sigma_needed(epsilon: float, delta: float, instances: int = 1) -> float:
    """The ``sigma`` with ``(1 + e^eps) instances 2^-sigma = delta``, in logs (no overflow at tiny delta)."""
    return log2_one_plus_exp(epsilon) + math.log2(instances) - math.log2(delta)


# --------------------------------------------------------------------------
# Skellam RDP and conversion
# --------------------------------------------------------------------------


def skellam_rdp(order: int, l1: float, l2: float, mu: float) -> float:
    """Agarwal, Kairouz & Liu 2021: RDP of ``Skellam(mu)`` noise (Poisson mean ``mu`` per side) at integer ``order``.

    Written as ratios (``l2 / mu``, ``l1 / mu``) so that no intermediate overflows or underflows."""
    a = order
    r2 = (l2 / mu) * l2  # l2^2 / mu
    r1 = l1 / mu
    return a * r2 / 4.0 + min(((2 * a - 1) * r2 + 6.0 * r1) / (16.0 * mu), 3.0 * r1 / 4.0)


def rdp_to_dp(orders, rdp, delta: float) -> float:
    """``eps`` of ``(eps, delta)``-DP from an RDP curve: Canonne, Kamath & Steinke 2020, Prop. 12,
    ``eps = min_a rdp(a) + log((a - 1) / a) - (log delta + log a) / (a - 1)`` (never below 0)."""
    if not 0.0 < delta < 1.0:
        raise InvalidParameter("delta", f"must be in (0, 1), got {delta}")
    best = math.inf
    for a, r in zip(orders, rdp):
        best = min(best, r + math.log((a - 1) / a) - (math.log(delta) + math.log(a)) / (a - 1))
    return max(0.0, best)


def vector_sensitivities(levels: int, padded_dim: int) -> tuple[float, float]:
    """``(D1, D2)`` of a replaced user's encoded vector (module docstring)."""
    l2 = 2.0 * (levels + math.sqrt(padded_dim))
    return l2 * min(math.sqrt(padded_dim), l2), l2


def skellam_epsilon(mu: float, levels: int, padded_dim: int, delta: float) -> float:
    """Central ``eps`` at ``delta`` of the sum with ``Skellam(mu)`` noise on every coordinate."""
    l1, l2 = vector_sensitivities(levels, padded_dim)
    return rdp_to_dp(RDP_ORDERS, [skellam_rdp(a, l1, l2, mu) for a in RDP_ORDERS], delta)


# --------------------------------------------------------------------------
# Checks clients run on every spec
# --------------------------------------------------------------------------


def _refuse(name: str, problem: str) -> None:
    raise InvalidParameter(name, problem)


def check_scalar_sum(params: ModularSumParams, epsilon: float, delta: float) -> None:
    """Refuse scalar summation parameters under which the round is not central ``(epsilon, delta)``-DP.

    Needs: ``delta > 0`` (the split gives approximate DP only); enough shares for
    ``(1 + e^eps) 2^-sigma <= delta``; a modulus honest noiseless sums cannot wrap
    (``q > 2 n p``); a noise the device sampler can draw.
    """
    if not delta > 0.0:
        _refuse("delta0", "summation is (eps, delta)-DP with delta > 0 (the split's statistical distance)")
    if params.modulus <= 2 * params.users * params.precision:
        _refuse("modulus", f"{params.modulus} <= 2 n p = {2 * params.users * params.precision}: honest sums would wrap around")
    cost = split_delta(params.users, params.messages, params.modulus, epsilon)
    if cost > delta:
        need = messages_needed(params.users, params.modulus, sigma_needed(epsilon, delta))
        _refuse(
            "messages",
            f"{params.messages} shares from {params.users} users mod {params.modulus} cost delta {cost:.3g} > {delta:.3g}; "
            f"the split-and-mix bound needs at least {need}",
        )
    one_minus_alpha = -math.expm1(-epsilon / params.precision)
    if not one_minus_alpha > 0.0 or not (1.0 - one_minus_alpha) / one_minus_alpha <= DEVICE_MAX_MEAN:
        _refuse("precision", f"noise alpha = exp(-eps/p) = exp(-{epsilon / params.precision:.3g}) is beyond the device sampler (lower the precision)")


def check_vector_sum(params: VectorSumParams, epsilon: float, delta: float) -> None:
    """Refuse vector summation parameters under which the round is not central ``(epsilon, delta)``-DP:
    the split's cost plus the Skellam noise's ``delta`` at ``epsilon`` must not exceed ``delta``."""
    if not delta > 0.0:
        _refuse("delta0", "vector summation is (eps, delta)-DP with delta > 0")
    split = split_delta(params.users, params.messages, params.modulus, epsilon, params.padded_dim)
    if split >= delta:
        _refuse("messages", f"the split of {params.messages} shares per coordinate costs delta {split:.3g} >= {delta:.3g}")
    eps_noise = skellam_epsilon(params.mu, params.levels, params.padded_dim, delta - split)
    if eps_noise > epsilon:
        _refuse("mu", f"Skellam noise mu = {params.mu:.6g} gives eps {eps_noise:.4g} > {epsilon:.4g} at delta {delta - split:.3g}")
    if params.padded_dim * params.mu / params.users > DEVICE_MAX_TOTAL_MEAN:
        _refuse(
            "mu",
            f"a device would draw Poisson means of {params.padded_dim * params.mu / params.users:.3g} in all "
            f"(D mu / users), over {DEVICE_MAX_TOTAL_MEAN:.3g}: the exact sampler's time is linear in it",
        )
    floor = 2.0 * params.users * params.levels * math.sqrt(2.0 * math.log(4.0 * params.padded_dim) / params.padded_dim)
    if params.modulus <= floor:
        _refuse("modulus", f"{params.modulus} cannot hold even a typical coordinate sum of {params.users} users ({floor:.3g})")


# --------------------------------------------------------------------------
# Primes and tails
# --------------------------------------------------------------------------


def is_prime(value: int) -> bool:
    """Deterministic Miller-Rabin for ``value < 3.3e24`` (bases 2..37)."""
    if value < 2:
        return False
    bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
    for p in bases:
        if value % p == 0:
            return value == p
    d, r = value - 1, 0
    while d % 2 == 0:
        d //= 2
        r += 1
    for a in bases:
        x = pow(a, d, value)
        if x in (1, value - 1):
            continue
        for _ in range(r - 1):
            x = x * x % value
            if x == value - 1:
                break
        else:
            return False
    return True


def prime_at_least(value: int) -> int:
    """The smallest prime ``>= value``."""
    candidate = max(2, value)
    while not is_prime(candidate):
        candidate += 1
    return candidate


def skellam_tail(mu: float, failure: float) -> int:
    """A ``t`` with ``P(|Skellam(mu)| >= t) <= failure``: Bernstein for a difference of Poisson
    sums (variance ``2 mu``, unit jumps): ``P(X >= t) <= exp(-t^2 / (2 (2 mu + t / 3)))``, twice."""
    log_target = math.log(failure / 2.0)
    # solve t^2 / (2 (2 mu + t/3)) = -log_target for t
    c = -log_target
    t = (2.0 * c / 3.0 + math.sqrt((2.0 * c / 3.0) ** 2 + 16.0 * mu * c)) / 2.0
    return math.ceil(t)


# --------------------------------------------------------------------------
# The chooser
# --------------------------------------------------------------------------


_Params = TypeVar("_Params", ModularSumParams, VectorSumParams)


@dataclass(frozen=True)
class SummationChoice(Generic[_Params]):
    """Chosen parameters (scalar :class:`ModularSumParams` or :class:`VectorSumParams`), the budget
    split, and the figures behind them."""

    params: _Params
    epsilon: float
    delta: float
    split_delta: float
    noise_delta: float
    wrap_probability: float
    #: Expected squared error of the estimated *sum* (real units) for inputs whose
    #: rounding is worst (f = 1/2); :func:`scalar_sum_variance` gives it for given inputs.
    worst_sum_variance: float
    bits_per_message: int
    messages_per_user: int


#: Rounding may add at most this fraction to the noise variance (worst case, all f = 1/2).
ROUNDING_SHARE = 0.01


def choose_scalar_sum(
    users: int,
    epsilon: float,
    delta: float,
    lower: float,
    upper: float,
    *,
    precision: int | None = None,
    modulus: int | None = None,
    messages: int | None = None,
    wrap_probability: float = 1e-9,
) -> SummationChoice[ModularSumParams]:
    """Parameters of scalar summation for ``users`` users at central ``(epsilon, delta)``.

    * ``precision`` ``p``: the smallest with rounding variance (at most ``n / 4``
      encoded units) at most ``ROUNDING_SHARE`` of the discrete Laplace's
      (``2 alpha / (1 - alpha)^2 ~ 2 p^2 / eps^2``): ``p = ceil(eps sqrt(n / (8 share)))``.
    * ``modulus`` ``q``: the smallest prime above ``2 (n p + t)``, ``t`` the noise tail
      exceeded with probability ``wrap_probability``.
    * ``messages`` ``M``: the fewest with ``(1 + e^eps) 2^-sigma <= delta`` (all of
      delta to the split, since the noise is pure).

    Overrides are checked by the same analysis (:func:`check_scalar_sum`) and
    refused with the reason when it does not hold.
    """
    if not (isinstance(users, int) and users >= 3):
        _refuse("users", f"summation needs at least 3 users, got {users}")
    if not 0.0 < delta < 1.0:
        _refuse("delta", f"must be in (0, 1), got {delta}")
    p = precision if precision is not None else max(1, math.ceil(epsilon * math.sqrt(users / (8.0 * ROUNDING_SHARE))))
    alpha = math.exp(-epsilon / p)
    tail = discrete_laplace_tail(alpha, wrap_probability)
    q = modulus if modulus is not None else prime_at_least(wraparound_bound(users, p, tail))
    if q > MAX_MODULUS:
        _refuse("modulus", f"{q} exceeds {MAX_MODULUS}: fewer users or a lower precision")
    m = messages if messages is not None else messages_needed(users, q, sigma_needed(epsilon, delta))
    if m > MAX_MESSAGES_PER_USER:
        _refuse("messages", f"{m} shares per user exceed {MAX_MESSAGES_PER_USER}")
    params = ModularSumParams(lower, upper, p, q, m, users)
    check_scalar_sum(params, epsilon, delta)
    wrap = 2.0 * alpha ** (max(0, (q - 1) // 2 - users * p) + 1) / (1.0 + alpha)
    step = (upper - lower) / p
    noise_var = 2.0 * alpha / (1.0 - alpha) ** 2
    return SummationChoice(
        params=params,
        epsilon=epsilon,
        delta=delta,
        split_delta=split_delta(users, m, q, epsilon),
        noise_delta=0.0,
        wrap_probability=min(1.0, wrap),
        worst_sum_variance=(noise_var + users / 4.0) * step**2,
        bits_per_message=q.bit_length(),
        messages_per_user=m,
    )


def scalar_sum_variance(params: ModularSumParams, epsilon: float, rounding_variance_encoded: float) -> float:
    """Exact variance of the estimated sum (real units): ``(Var DLap + sum_i f_i (1 - f_i)) step^2``
    (``rounding_variance_encoded`` is ``sum_i f_i (1 - f_i)``), absent wrap-around."""
    alpha = math.exp(-epsilon / params.precision)
    step = (params.upper - params.lower) / params.precision
    return (2.0 * alpha / (1.0 - alpha) ** 2 + rounding_variance_encoded) * step**2


def smallest_skellam_mu(levels: int, padded_dim: int, epsilon: float, delta: float) -> float:
    """Smallest ``mu`` (to 0.1 %) whose Skellam noise gives ``eps <= epsilon`` at ``delta``."""
    lo, hi = 1e-6, 1.0
    while skellam_epsilon(hi, levels, padded_dim, delta) > epsilon:
        lo, hi = hi, hi * 4.0
    while hi / lo > 1.001:
        mid = math.sqrt(lo * hi)
        if skellam_epsilon(mid, levels, padded_dim, delta) > epsilon:
            lo = mid
        else:
            hi = mid
    return hi


def choose_vector_sum(
    users: int,
    epsilon: float,
    delta: float,
    dim: int,
    radius: float,
    rotation_seed: int,
    *,
    levels: int | None = None,
    messages: int | None = None,
    wrap_probability: float = 1e-9,
) -> SummationChoice[VectorSumParams]:
    """Parameters of vector summation for ``users`` users at central ``(epsilon, delta)``.

    Half of ``delta`` to the split (``M`` per coordinate from the BBGN bound over ``D``
    instances), half to the Skellam noise, whose ``mu`` is the smallest giving
    ``epsilon``. ``levels`` (grid units per ``radius``) starts at ``100 sqrt(D)`` (so
    the rounding's ``sqrt(D)`` adds at most 1 % to the sensitivity) and doubles until
    the rounding variance (``n / 4`` per coordinate at worst) is at most
    ``ROUNDING_SHARE`` of the noise's ``2 mu``; with few users it halves instead while a
    device's Poisson draws (``D mu / users`` in all) exceed ``DEVICE_MAX_TOTAL_MEAN``, down
    to ``sqrt(D)``. ``q``: the smallest prime above twice
    the coordinate sum's bound (rotation flatness, Hoeffding over the public random
    signs, plus rounding, plus the Skellam tail), each exceeded with probability
    ``wrap_probability / 2``.
    """
    if not (isinstance(users, int) and users >= 3):
        _refuse("users", f"summation needs at least 3 users, got {users}")
    if not 0.0 < delta < 1.0:
        _refuse("delta", f"must be in (0, 1), got {delta}")
    padded = next_power_of_two(dim)
    noise_delta = delta / 2.0
    level = levels if levels is not None else max(16, math.ceil(100.0 * math.sqrt(padded)))
    mu = smallest_skellam_mu(level, padded, epsilon, noise_delta)
    while levels is None and users / 4.0 > ROUNDING_SHARE * 2.0 * mu:
        level *= 2
        mu = smallest_skellam_mu(level, padded, epsilon, noise_delta)
    # Fewer users share the noise, so each device draws more of it: when the devices' exact
    # sampler would exceed its budget, coarsen the grid (mu falls as levels^2) down to
    # levels ~ sqrt(D), where rounding at most doubles the sensitivity; below that, refuse.
    while levels is None and padded * mu / users > DEVICE_MAX_TOTAL_MEAN and level // 2 >= max(2.0, math.sqrt(padded)):
        level //= 2
        mu = smallest_skellam_mu(level, padded, epsilon, noise_delta)
    beta = wrap_probability / 2.0
    flat = users * level * math.sqrt(2.0 * math.log(2.0 * padded / beta) / padded)
    bound = math.ceil(flat) + users + skellam_tail(mu, beta / padded)
    q = prime_at_least(2 * bound + 1)
    if q > MAX_MODULUS:
        _refuse("modulus", f"{q} exceeds {MAX_MODULUS}: fewer users or fewer levels")
    sigma = sigma_needed(epsilon, delta - noise_delta, padded)
    m = messages if messages is not None else messages_needed(users, q, sigma)
    params = VectorSumParams(dim, radius, level, rotation_seed, q, m, users, mu)
    check_vector_sum(params, epsilon, delta)
    scale = level / radius
    return SummationChoice(
        params=params,
        epsilon=epsilon,
        delta=delta,
        split_delta=split_delta(users, m, q, epsilon, padded),
        noise_delta=noise_delta,
        wrap_probability=wrap_probability,
        worst_sum_variance=dim * (2.0 * mu + users / 4.0) / scale**2,
        bits_per_message=q.bit_length(),
        messages_per_user=m * padded,
    )
