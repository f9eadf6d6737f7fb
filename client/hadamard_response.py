"""Block ("general-eps", multi-bit) Hadamard response for k-ary frequency estimation.

Reference: J. Acharya, Z. Sun and H. Zhang, "Hadamard Response: Estimating
Distributions Privately, Efficiently, and with Little Communication", AISTATS 2019
(arXiv:1802.04705), Section 5 (general privacy); the high-privacy HR of their
Section 4 is the case ``B = 1``. ``docs/frequency-oracles.md`` has the derivations
and the differences from the paper.

Mechanism. The ``K = B b`` outputs are cut into ``B`` blocks of ``b`` (``b`` a power
of two). Symbol ``x`` lives in block ``j(x) = x mod B`` at row ``r(x) = x // B + 1``
of the Sylvester-Hadamard matrix ``H_b`` (never row 0, the all-ones row), and

    C_x = { j(x) b + v : H_b[r(x), v] = +1 },    |C_x| = s = b/2.

A user with symbol ``x`` reports ``Y`` with

    P(Y = y) = p_in  = t/s + (1 - t)/K   for y in C_x,
    P(Y = y) = p_out = (1 - t)/K         otherwise,

i.e. with probability ``t`` a uniform element of ``C_x`` and otherwise a uniform
element of ``[K]``. With ``t = (e^eps - 1)/(e^eps - 1 + 2B)`` this is the paper's
``e^eps/Z`` vs ``1/Z`` with ``Z = s e^eps + K - s``.

Guarantee: pure ``eps``-LDP. Every output has probability ``p_in`` or ``p_out``
under every input, and ``p_in/p_out = 1 + 2B t/(1 - t)``, increasing in ``t`` and
equal to ``e^eps`` at the ideal ``t``. The ``t`` used
(:attr:`HadamardResponseParams.informative_probability`) is the float value lowered
by a relative ``2^-48`` and rounded *down* to a multiple of ``2^-53``: never above
the ideal value (so the ratio is at most ``e^eps``), and realised exactly by both
random sources. The decoder uses the same ``t``.

Parameters. ``b`` does not enter the variance at all, only the constraint that a
block must hold its ``ceil(k/B)`` symbols in the ``b - 1`` non-constant rows, so
``b`` is the smallest power of two ``> ceil(k/B)``. ``B`` minimises the exact
worst-case (over the data) average variance of the estimator,

    (1/k) sum_x n Var(fhat_x) <= (a + 2B)/a * (2/a + ceil(k/B)/k) - 1/k,   a = e^eps - 1,

with equality for every data set when ``B`` divides ``k``
(:func:`worst_case_mean_variance`); its continuous minimiser is ``B = a/2``, where
the average variance is ``8/(n a)``, within a factor ``2a/(a+1) -> 2`` of optimal
unary encoding. This differs from the paper's ``B ~ e^eps``; see the docs.

Written once, vectorized over a batch of users against a RandomSource; a device
calls it with a batch of one. Imports only numpy and device-safe
``shuffledp.protocol`` modules.
"""

from __future__ import annotations

import numpy as np

from shuffledp.client.krr import as_symbol_array
from shuffledp.protocol.mechanisms.hadamard import popcount_parity
from shuffledp.protocol.mechanisms.hadamard_response_params import (
    HadamardResponseParams,
    optimal_blocks,
    worst_case_mean_variance,
)
from shuffledp.protocol.mechanisms.randomness import RandomSource

__all__ = [
    "HadamardResponseParams",
    "choose_hadamard_response",
    "hadamard_response_probabilities",
    "optimal_blocks",
    "randomize_hadamard_response",
    "symbol_location",
    "worst_case_mean_variance",
]


def choose_hadamard_response(k: int, epsilon: float) -> HadamardResponseParams:
    """Parameters with the variance-minimising ``B`` (:func:`optimal_blocks`) and ``b``."""
    return HadamardResponseParams(k, epsilon)


def symbol_location(symbols: np.ndarray, params: HadamardResponseParams) -> tuple[np.ndarray, np.ndarray]:
    """``(j(x), r(x)) = (x mod B, x // B + 1)``: the block and the Hadamard row of each symbol."""
    x = as_symbol_array(symbols, params.k)
    return x % params.blocks, x // params.blocks + 1


def hadamard_response_probabilities(params: HadamardResponseParams) -> tuple[float, float]:
    """``(p_in, p_out)``: the probability of each output inside ``C_x``, and outside it.

    ``p_in = t/s + (1-t)/K`` and ``p_out = (1-t)/K`` with the ``t`` the sampler uses;
    ``s p_in + (K - s) p_out = 1`` and ``p_in/p_out <= e^eps``.
    """
    t = params.informative_probability
    k_out = params.output_size
    p_out = (1.0 - t) / k_out
    return t / params.set_size + p_out, p_out


def randomize_hadamard_response(
    symbols: np.ndarray, params: HadamardResponseParams, source: RandomSource
) -> np.ndarray:
    """Block Hadamard response for a batch of users: int64 reports in ``[0, B b)``.

    Draws per user: ``u = integers(K)`` then ``bernoulli(t)``. If the Bernoulli is
    false the report is ``u`` (uniform on ``[K]``). Otherwise it is the position
    ``v = u mod b`` (uniform on ``[b]``) moved into ``C_x``: if ``H_b[r, v] = -1``,
    ``v`` is replaced by ``v XOR lowbit(r)``, which flips the parity of
    ``popcount(r & v)``; this map is two-to-one from ``[b]`` onto the ``+1``
    positions of row ``r``, so the result is uniform on ``C_x``; the report is
    ``j b + v``.
    """
    j, r = symbol_location(symbols, params)
    n = j.shape[0]
    b = params.block_size
    u = source.integers(params.output_size, n)
    informative = source.bernoulli(params.informative_probability, n)
    v = u & (b - 1)
    v = np.where(popcount_parity(r & v) == 1, v ^ (r & -r), v)
    return np.where(informative, j * b + v, u).astype(np.int64)
