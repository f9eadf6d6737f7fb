"""Randomizers of the quantile rounds of the instance-optimal mean, local and shuffle
versions (Huang, Liang & Yi, NeurIPS 2021, Sec. 5, steps 2 and 3).

* :func:`randomize_coordinate_tree` (``coordinate-tree``): after the public rotation,
  one rotated coordinate and one level of the dyadic tree over ``[low, high]`` drawn
  uniformly, and Hadamard response of the user's node at that level. From these the
  analyzer counts any node of any coordinate's tree and finds each coordinate's
  median by descending the tree (binary search over noisy range counts).
* :func:`randomize_shifted_norm` (``shifted-norm``): Hadamard response of the bin of
  ``log2 ||x - center||``; the analyzer reads a quantile of the shifted norms off the
  noisy histogram.

Both are pure ``eps``-LDP: the coordinate and level are drawn independently of the
data, and Hadamard response is ``eps``-LDP for any input index
(:func:`~shuffledp.client.range_randomizer.hadamard_response`).
"""

from __future__ import annotations

import numpy as np

from shuffledp.client.local_data import as_real_array
from shuffledp.client.range_randomizer import bin_index, hadamard_response
from shuffledp.client.vector_randomizer import rotation_of
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.wire.messages import CoordinateTreeParams, ShiftedNormParams
from shuffledp.protocol.mechanisms.randomness import RandomSource


def tree_node(leaf: np.ndarray, levels: int, level: np.ndarray) -> np.ndarray:
    """Index of the node at ``level`` (1 = the root's children, ``levels`` = the leaves) above ``leaf``."""
    return np.right_shift(leaf, levels - level)


def randomize_coordinate_tree(vectors: np.ndarray, params: CoordinateTreeParams, epsilon: float, source: RandomSource) -> np.ndarray:
    """Reports ``(group, row, bit)`` of a batch of users: int64 ``(n, 3)``, ``group = coord * levels + level - 1``."""
    x = as_real_array(vectors, "vectors", ndim=2)
    rotated = rotation_of(params).apply(x)
    n = rotated.shape[0]
    coords = source.integers(params.padded_dim, n)
    level = source.integers(params.levels, n) + 1
    leaf = bin_index(rotated[np.arange(n), coords], params.scalar)
    rows, bits = hadamard_response(tree_node(leaf, params.levels, level), params.scalar.padded_bins, epsilon, source)
    groups = coords * params.levels + level - 1
    return np.stack([groups, rows, bits.astype(np.int64)], axis=1).astype(np.int64)


def shifted_log_norms(vectors: np.ndarray, center: np.ndarray) -> np.ndarray:
    """``log2 ||x - center||`` per row (``-inf`` for a zero distance; overflow-safe).

    A difference past the largest double (``x = -1e308``, ``center = 1e308``) is a norm above
    ``2^1024``, beyond any grid (``ShiftedNormParams`` keeps ``high <= 1000``): ``+inf``, so the
    bin is the top one. (It was NaN, which ``bin_index`` cast to bin 0, the smallest norms.)
    """
    x = as_real_array(vectors, "vectors", ndim=2)
    center = np.asarray(center, dtype=np.float64)
    if center.shape != (x.shape[1],):
        raise InvalidParameter("vectors", f"have {x.shape[1]} coordinates; the round's center has {center.shape[-1] if center.ndim else 0}")
    with np.errstate(over="ignore"):
        diff = x - center[None, :]
    largest = np.abs(diff).max(axis=1, initial=0.0)
    finite = np.isfinite(largest)
    safe = np.where((largest > 0) & finite, largest, 1.0)
    relative = np.linalg.norm(np.where(finite[:, None], diff, 0.0) / safe[:, None], axis=1)
    with np.errstate(divide="ignore"):
        logs = np.where(largest > 0, np.log2(safe) + np.log2(np.maximum(relative, 1.0)), -np.inf)
    return np.where(finite, logs, np.inf)


def randomize_shifted_norm(vectors: np.ndarray, params: ShiftedNormParams, epsilon: float, source: RandomSource) -> np.ndarray:
    """Reports ``(row, bit)`` of a batch of users: int64 ``(n, 2)``. Data of another dimension than
    the round's centre is refused (``InvalidParameter``), never broadcast."""
    logs = shifted_log_norms(vectors, np.asarray(params.center))
    leaf = bin_index(np.maximum(logs, params.low), params.scalar)
    rows, bits = hadamard_response(leaf, params.scalar.padded_bins, epsilon, source)
    return np.stack([rows, bits.astype(np.int64)], axis=1)
