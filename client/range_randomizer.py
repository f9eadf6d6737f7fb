"""Hadamard-response range randomizer (Girgis, Data & Diggavi 2022, Algorithm 4).

A user maps its local mean ``y`` to the nearest of ``k`` bin centres over
``[low, high]`` (bins of width ``2 tau``, index ``nu``), draws a uniform row ``j`` of
the ``K x K`` Sylvester–Hadamard matrix (``K`` = ``k`` padded to a power of two) and
sends ``(j, b)`` where ``b = H[j, nu]`` with probability ``e^eps / (e^eps + 1)`` and
``-H[j, nu]`` otherwise.

Guarantee: pure ``eps``-LDP at the user level (Lemma 1 / Appendix A). For any
output ``(j, b)`` the probability is ``p/K`` or ``(1-p)/K`` with
``p = e^eps/(e^eps+1)``, so the likelihood ratio between any two inputs is at most
``p/(1-p) = e^eps``. The keep-probability passed to the random source is rounded
*down* by secure sources (never up), which keeps the ratio at most ``e^eps``.

Written once, vectorized over a batch of users; the device client calls it with a
batch of one.
"""

from __future__ import annotations

import math

import numpy as np

from shuffledp.client.local_data import as_real_array
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.hadamard import hadamard_entry
from shuffledp.protocol.wire.messages import MAX_EPSILON, MIN_EPSILON, HadamardRangeParams
from shuffledp.protocol.mechanisms.randomness import RandomSource


def keep_probability(epsilon: float) -> float:
    """A double ``p <= e^eps / (e^eps + 1)``, the probability of sending the true Hadamard sign.

    Computing ``1 / (1 + exp(-eps))`` in double precision has relative error below
    3 ulps (exp within 1 ulp, the sum and the quotient each within half an ulp), so
    stepping the result down 4 ulps gives a value at most the exact one. Since
    ``p / (1 - p)`` increases in p, the realised likelihood ratio is then at most
    ``e^eps`` exactly (the loss in accuracy is ~1e-15).
    """
    if not (MIN_EPSILON <= epsilon <= MAX_EPSILON):
        raise InvalidParameter("epsilon", f"must be in [{MIN_EPSILON}, {MAX_EPSILON}], got {epsilon!r}")
    p = 1.0 / (1.0 + math.exp(-epsilon))
    for _ in range(4):
        p = math.nextafter(p, 0.0)
    return p


def bin_index(local_means: np.ndarray, params: HadamardRangeParams) -> np.ndarray:
    """Index of the bin centre nearest to each local mean (values outside are clamped)."""
    y = np.clip(np.asarray(local_means, dtype=np.float64), params.low, params.high)  # before the cast: no int64 wrap
    index = np.floor((y - params.low) / (2.0 * params.tau)).astype(np.int64)
    return np.clip(index, 0, params.num_bins - 1)


def randomize_range(
    local_means: np.ndarray, params: HadamardRangeParams, epsilon: float, source: RandomSource
) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 4 for a batch of users: returns ``(rows, bits)``, int64 and int8 (+1/-1)."""
    y = as_real_array(local_means, "local_means")
    return hadamard_response(bin_index(y, params), params.padded_bins, epsilon, source)


def hadamard_response(nu: np.ndarray, padded_bins: int, epsilon: float, source: RandomSource) -> tuple[np.ndarray, np.ndarray]:
    """Hadamard response of the input indices ``nu`` (each in ``[0, padded_bins)``): a uniform
    row ``j`` of the ``K x K`` Sylvester–Hadamard matrix and ``H[j, nu]``, kept with probability
    ``e^eps / (e^eps + 1)`` and flipped otherwise. Pure ``eps``-LDP for any input index.
    Returns ``(rows, bits)``, int64 and int8 (+1/-1)."""
    n = nu.shape[0]
    rows = source.integers(padded_bins, n)
    keep = source.bernoulli(keep_probability(epsilon), n)
    true_sign = hadamard_entry(rows, nu)
    bits = np.where(keep, true_sign, -true_sign).astype(np.int8)
    return rows.astype(np.int64), bits
