"""Randomizers of the vector mean protocol (Girgis, Data & Diggavi 2022, Algorithm 5).

Users hold rotated local means ``U y_i`` (shape ``(n, D)``; see
:mod:`shuffledp.protocol.mechanisms.rotation`). Two budget modes for the range round:

* ``paper``: every user answers the Hadamard range round for *every* coordinate at
  ``eps0 / (2 D)`` (Algorithm 5 lines 4-10); by basic composition over D coordinates
  the round is ``eps0/2``-LDP.
* ``sampled``: every user draws one uniform coordinate and answers its range round
  at ``eps0 / 2``, so users split across coordinates. The coordinate is drawn
  independently of the data, so the round is ``eps0/2``-LDP.

The mean round is the same in both modes (lines 11-14): one uniform coordinate per
user, projected onto that coordinate's announced range and noised as in Algorithm 2
at ``eps0/2`` (plus ``delta0`` for Gaussian noise). Total: ``(eps0, delta0)``-LDP.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from shuffledp.client.local_data import as_real_array
from shuffledp.client.mean_randomizer import PerUserGrid, randomize_mean
from shuffledp.client.range_randomizer import randomize_range
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.wire.messages import VECTOR_MODES, HadamardRangeParams
from shuffledp.protocol.mechanisms.randomness import RandomSource
from shuffledp.protocol.mechanisms.rotation import RandomRotation


@functools.lru_cache(maxsize=16)
def _rotation(dim: int, seed: int) -> RandomRotation:
    return RandomRotation(dim, seed)


def rotation_of(params) -> RandomRotation:
    """The (cached) public rotation a vector round's parameters name."""
    return _rotation(params.dim, params.rotation_seed)


@dataclass(frozen=True)
class CoordinateReports:
    """Reports tagged with the (rotated) coordinate they are about."""

    coords: np.ndarray
    values: tuple[np.ndarray, ...]


def _check_rotated(rotated: np.ndarray) -> np.ndarray:
    return as_real_array(rotated, "rotated", ndim=2)


def randomize_vector_range(
    rotated: np.ndarray, params: HadamardRangeParams, round_epsilon: float, mode: str, source: RandomSource
) -> CoordinateReports:
    """Range-round reports ``(coord, row, bit)``: one per user (sampled) or D per user (paper),
    ``round_epsilon``-LDP in all (``eps0 / 2`` in Algorithm 5)."""
    rotated = _check_rotated(rotated)
    n, dim = rotated.shape
    if mode == "sampled":
        coords = source.integers(dim, n)
        rows, bits = randomize_range(rotated[np.arange(n), coords], params, round_epsilon, source)
    elif mode == "paper":
        coords = np.tile(np.arange(dim, dtype=np.int64), n)
        rows, bits = randomize_range(rotated.ravel(), params, round_epsilon / dim, source)
    else:
        raise InvalidParameter("mode", f"must be one of {VECTOR_MODES}, got {mode!r}")
    return CoordinateReports(coords, (rows, bits))


def randomize_vector_mean(
    rotated: np.ndarray,
    ranges: np.ndarray,
    round_epsilon: float,
    source: RandomSource,
    *,
    noise: str = "laplace",
    grid_levels: int = 4096,
    delta0: float = 0.0,
) -> tuple[CoordinateReports, PerUserGrid]:
    """Mean-round reports ``(coord, grid value)``, ``(round_epsilon, delta0)``-LDP (``eps0 / 2`` in
    Algorithm 5), and the per-user grid they are on."""
    rotated = _check_rotated(rotated)
    n, dim = rotated.shape
    ranges = np.asarray(ranges, dtype=np.float64)
    if ranges.shape != (dim, 2):
        raise InvalidParameter("ranges", f"must have shape ({dim}, 2), got {ranges.shape}")
    coords = source.integers(dim, n)
    grid = PerUserGrid(ranges[coords, 0], ranges[coords, 1], noise, grid_levels)
    values = randomize_mean(rotated[np.arange(n), coords], grid, round_epsilon, source, delta=delta0)
    return CoordinateReports(coords, (values,)), grid
