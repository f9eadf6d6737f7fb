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

Written once, vectorized over a batch of users (the simulation engines), with a scalar
twin for one user (:func:`randomize_range_one`, what a device runs): the same mechanism,
the same Algorithm 4 and the same guarantee, drawing the same values from the same
source calls in the same order, with the arithmetic around them in plain Python
instead of numpy on 1-element arrays.
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


# --------------------------------------------------------------------------
# One user, without arrays: the device's path
# --------------------------------------------------------------------------
#
# Each function below is its vectorized twin above for a batch of one, line by line:
# the same source calls (``integers(K, 1)``, then ``bernoulli(p, 1)`` with the same
# float ``p``) in the same order, and the same IEEE double operations in the same order
# (Python floats are doubles, rounded as numpy's float64), so for any source the result
# equals ``twin(np.array([y]), ...)[0]`` exactly. The keep probability reaches
# ``bernoulli`` as the very float the twin passes, so a secure source rounds it down the
# same way and consumes the same bits; only the draws are read back as Python ints.


def _real_scalar(value: object, name: str) -> float:
    """``value`` as the one float a batch of one would hold; refused exactly as :func:`as_real_array`
    refuses ``np.array([value])`` (same type, same message) if it is not a finite real."""
    if (type(value) is float or type(value) is np.float64) and math.isfinite(value):
        return float(value)
    return float(as_real_array(np.array([value]), name)[0])


def bin_index_one(local_mean: float, params: HadamardRangeParams) -> int:
    """:func:`bin_index` of one finite local mean: the nearest bin centre's index (clamped).

    The same double operations as the twin: clip to ``[low, high]`` before anything else
    (a value equal to a bound is kept, as ``np.clip`` keeps it), ``(y - low) / (2 tau)``,
    floor, clip to ``[0, k - 1]``. The params' validation bounds ``(high - low) / (2 tau)``
    by ``MAX_BINS``, so the quotient is finite and the floor an exact small int.
    """
    low = float(params.low)
    high = float(params.high)
    y = low if local_mean < low else (high if local_mean > high else local_mean)
    index = math.floor((y - low) / (2.0 * params.tau))
    last = params.num_bins - 1
    return 0 if index < 0 else (last if index > last else index)


def hadamard_response_one(nu: int, padded_bins: int, epsilon: float, source: RandomSource) -> tuple[int, int]:
    """:func:`hadamard_response` of one input index ``nu`` in ``[0, padded_bins)``: ``(row, bit)``
    as Python ints, ``row`` uniform on ``[0, K)`` and ``bit = ±H[row, nu]``, kept with probability
    ``e^eps / (e^eps + 1)`` (rounded down by secure sources). Pure ``eps``-LDP for any input
    index (Lemma 1 / Appendix A), as the twin: the same draws, ``source.integers(K, 1)`` then
    ``source.bernoulli(keep_probability(eps), 1)``."""
    row = int(source.integers(padded_bins, 1)[0])
    keep = source.bernoulli(keep_probability(epsilon), 1)[0]
    if row < 0 or nu < 0:
        raise InvalidParameter("j, v", "Hadamard indices must be non-negative")  # as hadamard_entry
    true_sign = 1 - 2 * ((row & nu).bit_count() & 1)  # H[row, nu] = (-1)^popcount(row & nu)
    return row, (true_sign if keep else -true_sign)


def randomize_range_one(
    local_mean: float, params: HadamardRangeParams, epsilon: float, source: RandomSource
) -> tuple[int, int]:
    """Algorithm 4 for one user: ``(row, bit)``, equal to ``randomize_range(np.array([local_mean]),
    ...)`` read back as ints, with the same draws from ``source``. Pure ``eps``-LDP (Lemma 1 /
    Appendix A; see the module docstring): the same mechanism as the batch, without arrays."""
    y = _real_scalar(local_mean, "local_means")
    return hadamard_response_one(bin_index_one(y, params), params.padded_bins, epsilon, source)
