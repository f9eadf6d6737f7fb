"""The random rotation ``U = H D / sqrt(D)`` through the FWHT.

``H`` is the ``D x D`` Sylvester–Hadamard matrix (``D`` = the dimension padded to a
power of two) and ``D`` (here ``signs``) a diagonal of i.i.d. uniform ±1 drawn from a
*public* seed that the RoundSpec carries, so every party builds the same ``U``.
``U`` is orthogonal (``H H = D I``), so ``U^{-1} = U^T = D H / sqrt(D)``. Applying
either costs one FWHT, O(D log D) per vector; the D x D matrix is never formed.

Why rotate (Levy et al. 2021, Lemma on random rotation; Girgis et al. 2022,
Lemma 2): each coordinate of ``U v`` is ``sum_k H[l, k] s_k v_k / sqrt(D)``, a
Rademacher sum with variance proxy ``||v||^2 / D``, so for any fixed v
``P(|(U v)_l| > t) <= 2 exp(-D t^2 / (2 ||v||^2))``. A union bound over n vectors and
D coordinates gives, with probability at least ``1 - gamma``,
``max_i ||U v_i||_inf <= max_i ||v_i||_2 sqrt(2 log(2 n D / gamma) / D)``
(:func:`linf_radius`). Lemma 2 states the same with constant 10 in place of
``sqrt(2)`` inside; ours is the sharper Hoeffding form, which implies it.
"""

from __future__ import annotations

import math

import numpy as np

from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.hadamard import fwht, next_power_of_two


class RandomRotation:
    """``U = H diag(signs) / sqrt(D)`` for vectors of dimension ``dim`` (zero-padded to ``D``)."""

    def __init__(self, dim: int, seed: int) -> None:
        if not (isinstance(dim, int) and dim >= 1):
            raise InvalidParameter("dim", f"must be an integer >= 1, got {dim}")
        if not (isinstance(seed, int) and 0 <= seed < 2**64):
            raise InvalidParameter("seed", f"must be an integer in [0, 2^64), got {seed}")
        self.dim = dim
        self.seed = seed
        self.padded_dim = next_power_of_two(dim)
        rng = np.random.default_rng(np.random.SeedSequence([seed, 0x207A7E]))
        self.signs = rng.choice(np.array([-1.0, 1.0]), size=self.padded_dim)
        self._scale = 1.0 / math.sqrt(self.padded_dim)

    def apply(self, x: np.ndarray) -> np.ndarray:
        """``U x`` for ``x`` of shape ``(..., dim)``; returns shape ``(..., D)``."""
        x = np.asarray(x, dtype=np.float64)
        if x.shape[-1] != self.dim:
            raise InvalidParameter("x", f"last axis must be {self.dim}, got {x.shape[-1]}")
        padded = np.zeros(x.shape[:-1] + (self.padded_dim,))
        np.multiply(x, self.signs[: self.dim], out=padded[..., : self.dim])
        out = fwht(padded)
        out *= self._scale
        return out

    def inverse(self, z: np.ndarray) -> np.ndarray:
        """``U^{-1} z`` for ``z`` of shape ``(..., D)``; returns the first ``dim`` coordinates."""
        z = np.asarray(z, dtype=np.float64)
        if z.shape[-1] != self.padded_dim:
            raise InvalidParameter("z", f"last axis must be {self.padded_dim}, got {z.shape[-1]}")
        return (fwht(z) * self._scale * self.signs)[..., : self.dim]

    def matrix(self) -> np.ndarray:
        """The dense ``D x D`` matrix ``U`` (acting on zero-padded vectors), for tests only."""
        return (fwht(np.diag(self.signs)) * self._scale).T


def linf_radius(l2_radius: float, n: int, padded_dim: int, gamma: float) -> float:
    """``r sqrt(2 log(2 n D / gamma) / D)``: bound on ``||U v_i||_inf`` for n vectors with ``||v_i|| <= r``."""
    if not (l2_radius > 0 and n >= 1 and padded_dim >= 1 and 0 < gamma < 1):
        raise InvalidParameter("l2_radius, n, padded_dim, gamma", "need r > 0, n >= 1, D >= 1, 0 < gamma < 1")
    return l2_radius * math.sqrt(2.0 * math.log(2.0 * n * padded_dim / gamma) / padded_dim)
