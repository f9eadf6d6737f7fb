"""Budgets of the instance-optimal protocol's rounds (``analyzer/instance_optimal.py``).

Shuffle model: rounds 1 and 2 send one pure ``eps0``-LDP report per user each, so
their central epsilon is the accountant's amplification bound for a batch of
``users`` (``shuffled_round``; the generic bound for the ``coordinate-tree`` mixture,
Hadamard response's own for the norm bins); each gets the largest ``eps0`` whose bound
at ``delta / 4`` is within its share of ``epsilon``. Round 3 is multi-message vector
summation, chosen (``choose_vector_sum``) for its share at ``delta / 2``. The session
is the basic composition of the three central guarantees (Dwork & Roth, Thm 3.16):
``(eps, delta)`` at most.

Local model: the shares are the rounds' local guarantees; the mean round's Skellam
``mu`` is the smallest with the Skellam RDP bound (Agarwal, Kairouz & Liu 2021) within
``(epsilon share, delta)``. Basic composition again.

Server-side only (the accountant imports scipy and dp-accounting).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from shuffledp.analyzer.instance_optimal import InstanceOptimalConfig, RoundBudgets
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.hadamard import next_power_of_two
from shuffledp.protocol.wire.messages import MAX_EPSILON, LocalVectorParams, ShiftedVectorSumParams
from shuffledp.protocol.mechanisms.summation_params import choose_vector_sum, smallest_skellam_mu


def local_levels(padded_dim: int) -> int:
    """Grid units per clipping radius of the local report: ``100 sqrt(D)``, so that rounding's
    ``sqrt(D)`` adds at most 1 % to the l2 sensitivity (as the summation chooser starts)."""
    return max(16, math.ceil(100.0 * math.sqrt(padded_dim)))


def _guarantee(kind: str, epsilon0: float, bins: int):
    from shuffledp.protocol.accounting import generic_guarantee, hadamard_response_guarantee

    return generic_guarantee(epsilon0) if kind == "generic" else hadamard_response_guarantee(epsilon0, bins)


@functools.lru_cache(maxsize=64)
def amplified_epsilon0(kind: str, bins: int, users: int, target: float, delta: float, rtol: float = 0.01) -> tuple[float, float]:
    """Largest ``eps0`` (within ``1 + rtol``, bisection in ``log eps0`` over ``[1e-3, 30]``) whose
    shuffled round of ``users`` reports has central epsilon ``<= target`` at ``delta``; returns
    ``(eps0, that central epsilon)``. The bound is non-decreasing in ``eps0``."""
    from shuffledp.protocol.accounting import shuffled_round

    def central(e0: float) -> float:
        return shuffled_round(_guarantee(kind, e0, bins), users, delta).epsilon

    lo, hi = 1e-3, MAX_EPSILON
    if central(lo) > target:
        raise InvalidParameter("epsilon", f"a shuffled round of {users} users cannot reach {target:.4g} at delta {delta:.3g}")
    if central(hi) <= target:
        return hi, central(hi)
    while hi / lo > 1 + rtol:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if central(mid) <= target else (lo, mid)
    return lo, central(lo)


def round_budgets(config: InstanceOptimalConfig) -> RoundBudgets:
    """Each round's guarantee for ``config`` (see the module docstring).

    Whatever ``config.split`` is, the session's guarantee is a proven upper bound: rounds 1-2 each
    send one pure ``eps0``-LDP report per user, and their central ``(c_i, delta / 4)`` is the
    smallest of the accountant's proven upper bounds for that batch
    (``protocol/accounting/shuffle_round.py::shuffled_round``: Feldman, McMillan & Talwar 2021's
    bounds and Girgis et al.'s RDP bound for any pure ``eps0``-LDP randomizer, and Hadamard
    response's own for round 2), with ``c_i`` at most the round's share;
    round 3's summation is calibrated to ``(s_3, delta / 2)`` (``choose_vector_sum``); basic
    composition (Dwork & Roth, Thm 3.16) gives ``(c_1 + c_2 + s_3, delta) <= (eps, delta)``. The
    local model's ``s_i``-LDP rounds compose the same way to ``(eps, delta)``-LDP."""
    eps, delta = config.epsilon, config.delta
    s1, s2, s3 = (share * eps for share in config.split)
    norm_bins = next_power_of_two(config.octaves * config.bins_per_octave)
    if config.model == "local":
        return RoundBudgets(s1, s2, s3, delta, s1 + s2 + s3, delta, "basic composition of three local guarantees")
    e1, c1 = amplified_epsilon0("generic", 2, config.users, s1, delta / 4.0)
    e2, c2 = amplified_epsilon0("hadamard", max(2, norm_bins), config.users, s2, delta / 4.0)
    per_round = (
        {"round": "coordinate-tree", "epsilon0": e1, "central_epsilon": c1, "delta": delta / 4.0},
        {"round": "shifted-norm", "epsilon0": e2, "central_epsilon": c2, "delta": delta / 4.0},
        {"round": "shifted-vector-sum", "central_epsilon": s3, "delta": delta / 2.0},
    )
    return RoundBudgets(
        e1, e2, s3, delta / 2.0, c1 + c2 + s3, delta, "basic composition of the rounds' central guarantees", per_round
    )


def final_round_params(config: InstanceOptimalConfig, budgets: RoundBudgets, center: np.ndarray, radius: float):
    """The clipped-mean round's parameters about ``center`` with clipping ``radius``."""
    center_tuple = tuple(float(v) for v in np.asarray(center, dtype=np.float64))
    if config.model == "local":
        levels = local_levels(config.padded_dim)
        mu = smallest_skellam_mu(levels, config.padded_dim, budgets.mean_epsilon0, budgets.mean_delta0)
        return LocalVectorParams(config.dim, float(radius), levels, config.rotation_seed, mu, center_tuple)
    choice = _summation(config.users, budgets.mean_epsilon0, budgets.mean_delta0, config.dim, config.sum_rotation_seed)
    fields = dataclasses.asdict(choice)
    fields["radius"] = float(radius)
    return ShiftedVectorSumParams(**fields, center=center_tuple)


@functools.lru_cache(maxsize=32)
def _summation(users: int, epsilon: float, delta: float, dim: int, seed: int):
    return choose_vector_sum(users, epsilon, delta, dim, 1.0, seed).params
