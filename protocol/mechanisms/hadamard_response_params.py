"""Parameters of block Hadamard response: the block count ``B``, block size ``b`` and the exact
dyadic probability ``t`` (the mechanism, its guarantee and its reference are in
:mod:`shuffledp.client.hadamard_response`, which re-exports these).

Device-safe (numpy and device-safe ``shuffledp.protocol`` modules only): the accountant derives
the client's parameters here without importing the client package.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import overload

import numpy as np

from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.hadamard import next_power_of_two
from shuffledp.protocol.mechanisms.local_params import check_domain_size, check_epsilon, dyadic_floor

__all__ = ["HadamardResponseParams", "optimal_blocks", "worst_case_mean_variance"]


@overload
def _ceil_div(a: int, b: int) -> int: ...
@overload
def _ceil_div(a: np.ndarray | int, b: np.ndarray) -> np.ndarray: ...
def _ceil_div(a: np.ndarray | int, b: np.ndarray | int) -> np.ndarray | int:
    return -(-a // b)


def worst_case_mean_variance(k: int, epsilon: float, blocks: np.ndarray | int) -> np.ndarray | float:
    """``max`` over data sets of ``(1/k) sum_x n Var(fhat_x)``, for each block count ``B``.

    Equals ``(a + 2B)/a * (2/a + ceil(k/B)/k) - 1/k`` with ``a = e^eps - 1`` (ideal
    ``t``); attained by every data set when ``B`` divides ``k``. Vectorized over
    ``blocks``.
    """
    k = check_domain_size(k)
    a = math.expm1(check_epsilon(epsilon))
    b_arr = np.asarray(blocks, dtype=np.float64)
    per_block = _ceil_div(k, np.asarray(blocks, dtype=np.int64)).astype(np.float64)
    if math.isinf(a):  # t = 1 in the limit: only the block term is left
        value = per_block / k - 1.0 / k
    else:
        value = (a + 2.0 * b_arr) / a * (2.0 / a + per_block / k) - 1.0 / k
    return value if np.ndim(blocks) else float(value)


def optimal_blocks(k: int, epsilon: float) -> int:
    """The block count ``B in [1, k]`` minimising :func:`worst_case_mean_variance` (smallest on ties).

    For fixed ``m = ceil(k/B)`` the objective grows with ``B``, so the minimiser is
    the smallest ``B`` of its ``m``-plateau, ``ceil(k/m)``. Every such value is
    either ``<= ceil(sqrt(k))`` or ``ceil(k/m)`` for some ``m <= ceil(sqrt(k))``, so
    ``O(sqrt(k))`` candidates cover all of ``[1, k]`` exactly.
    """
    k = check_domain_size(k)
    eps = check_epsilon(epsilon)
    root = math.isqrt(k - 1) + 1  # ceil(sqrt(k)) for k >= 2
    small = np.arange(1, min(root, k) + 1, dtype=np.int64)
    large = _ceil_div(k, np.arange(1, root + 1, dtype=np.int64))
    candidates = np.unique(np.concatenate([small, large]))
    candidates = candidates[(candidates >= 1) & (candidates <= k)]
    values = worst_case_mean_variance(k, eps, candidates)
    return int(candidates[int(np.argmin(values))])  # np.unique sorts: argmin takes the smallest B


@dataclass(frozen=True)
class HadamardResponseParams:
    """Block Hadamard response over ``k`` symbols at local privacy ``epsilon``.

    ``num_blocks`` fixes ``B`` (``1 <= B <= k``; ``B = 1`` is the paper's
    high-privacy HR); left ``None`` it is set to :func:`optimal_blocks`. A round
    spec should carry ``B`` explicitly, so that a device and the analyzer never
    re-derive it from a floating-point ``exp`` on different platforms.
    """

    k: int
    epsilon: float
    num_blocks: int | None = None
    _t: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        k = check_domain_size(self.k)
        eps = check_epsilon(self.epsilon)
        if self.num_blocks is None:
            blocks = optimal_blocks(k, eps)
        else:
            nb = self.num_blocks
            if isinstance(nb, bool) or not isinstance(nb, (int, np.integer)):
                raise InvalidParameter("num_blocks", f"must be an integer or None, got {nb!r}")
            if not 1 <= nb <= k:
                raise InvalidParameter("num_blocks", f"must lie in [1, k = {k}], got {nb}")
            blocks = int(nb)
        a = math.expm1(eps)
        t_float = 1.0 if math.isinf(a) else a / (a + 2.0 * blocks)
        t = dyadic_floor(t_float)
        if not t > 0.0:
            raise InvalidParameter("epsilon", f"too small to represent for B = {blocks}: {self.epsilon!r}")
        object.__setattr__(self, "k", k)
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "num_blocks", blocks)
        object.__setattr__(self, "_t", t)

    @property
    def blocks(self) -> int:
        """``B``, the number of blocks."""
        return self.num_blocks  # type: ignore[return-value]

    @property
    def rows_per_block(self) -> int:
        """``ceil(k/B)``, the most symbols any block holds (block ``j`` holds ``x = j, j + B, ...``)."""
        return _ceil_div(self.k, self.blocks)

    @property
    def block_size(self) -> int:
        """``b``, the smallest power of two ``> ceil(k/B)`` (rows ``1..b-1`` of ``H_b`` are usable)."""
        return next_power_of_two(self.rows_per_block + 1)

    @property
    def output_size(self) -> int:
        """``K = B b``; reports lie in ``[0, K)``."""
        return self.blocks * self.block_size

    @property
    def set_size(self) -> int:
        """``s = b/2 = |C_x|``."""
        return self.block_size // 2

    @property
    def informative_probability(self) -> float:
        """``t``: the probability of reporting a uniform element of ``C_x`` rather than of ``[K]``.

        A multiple of ``2^-53``, at most ``(e^eps - 1)/(e^eps - 1 + 2B)``.
        """
        return self._t

    @property
    def message_bits(self) -> int:
        """Bits needed to send one report: ``ceil(log2 K)``."""
        return (self.output_size - 1).bit_length()
