"""Client randomizers of multi-message summation, scalar and vector.

Scalar (:func:`randomize_modular_sum`; Balle, Bell, Gascón & Nissim, CCS 2020,
arXiv:2002.00817, Sec. 4; Ghazi, Manurangsi, Pagh & Velingker, Eurocrypt 2020):
a user clips its value to ``[lower, upper]``, encodes it in ``{0, ..., p}`` by
unbiased randomized rounding, adds its Pólya noise share (``users`` shares sum to
``DLap(alpha)``, ``alpha = exp(-eps / p)``: the sum has sensitivity ``p`` in encoded
units, so it is ``eps``-DP), and splits the result into ``M`` additive shares mod
``q``. Each share is one report.

Vector (:func:`randomize_vector_sum`; Huang, Liang & Yi, NeurIPS 2021, Sec. 5,
Lemma 5, with Skellam noise after Agarwal, Kairouz & Liu, NeurIPS 2021): a user
clips its vector to the l2 ball of ``radius``, rotates it (``U = H D / sqrt(D)``,
public seed), scales by ``levels / radius`` and rounds every coordinate at random
to an integer, adds per-coordinate Skellam shares (``users`` shares sum to
``Skellam(mu)``), and splits every coordinate into ``M`` additive shares mod ``q``.
Every share is one report ``(coordinate, share)``: ``D M`` reports per user.

Both run the same on a device (``SystemSource``: OS CSPRNG, exact Skellam) and in
simulation (``SeededSource``), vectorized over a batch of users. The privacy of a
round (central, and only with all ``users`` users' shares mixed by an honest
shuffler) is checked by ``protocol/mechanisms/summation_params.py``.
"""

from __future__ import annotations

import math

import numpy as np

from shuffledp.client.local_data import as_real_array
from shuffledp.protocol.mechanisms.distributed_noise import polya_shares, skellam_shares
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.wire.messages import LocalVectorParams, ModularSumParams, ShiftedVectorSumParams, VectorSumParams
from shuffledp.protocol.mechanisms.modular_sum import FixedPoint, split
from shuffledp.protocol.mechanisms.randomness import RandomSource
from shuffledp.protocol.mechanisms.rotation import RandomRotation


def sum_alpha(epsilon: float, precision: int) -> float:
    """``alpha = exp(-eps / p)``: the discrete Laplace on the encoded sum (sensitivity ``p``) that is ``eps``-DP."""
    return math.exp(-epsilon / precision)


def randomize_modular_sum(
    local_means: np.ndarray, params: ModularSumParams, epsilon: float, source: RandomSource
) -> np.ndarray:
    """Shares of a batch of users: int64 ``(n, M, 1)``, every entry in ``[0, q)``."""
    values = as_real_array(local_means, "local_means")
    encoded = FixedPoint(params.lower, params.upper, params.precision).encode(values, source)
    noise = polya_shares(sum_alpha(epsilon, params.precision), params.users, values.size, source)
    shares = split(encoded + noise, params.modulus, params.messages, source)
    return shares[:, :, None]


def vector_grid_scale(params: VectorSumParams | LocalVectorParams) -> float:
    """Encoded units per unit of the (rotated) input: ``levels / radius``."""
    return params.levels / params.radius


def clip_to_ball(vectors: np.ndarray, radius: float) -> np.ndarray:
    """Each row scaled down to l2 norm at most ``radius`` (rows inside are unchanged)."""
    x = as_real_array(vectors, "vectors", ndim=2)
    largest = np.maximum(np.abs(x).max(axis=1, initial=0.0), np.finfo(float).tiny)
    unit = x / largest[:, None]  # entries in [-1, 1]: the norm cannot overflow, even for entries near 1e308
    relative = np.linalg.norm(unit, axis=1)  # ||x|| / largest, 0 for a zero row
    with np.errstate(under="ignore"):
        limit = radius / largest  # the radius in units of largest (subnormal for rows near 1e308: still exact enough)
    # inside the ball: x itself; outside: x / ||x|| * radius = unit / relative * radius
    scale = np.where(relative <= limit, largest, radius / np.where(relative > 0, relative, 1.0))
    return unit * scale[:, None]


def scaled_rotation(vectors: np.ndarray, params: VectorSumParams | LocalVectorParams) -> np.ndarray:
    """Clipped, rotated and scaled to grid units (float ``(n, D)``): what the encoding rounds."""
    clipped = clip_to_ball(vectors, params.radius)
    return RandomRotation(params.dim, params.rotation_seed).apply(clipped) * vector_grid_scale(params)


def encode_vectors(vectors: np.ndarray, params: VectorSumParams | LocalVectorParams, source: RandomSource) -> np.ndarray:
    """Clip to the l2 ball, rotate, scale and round at random: int64 ``(n, D)``.

    Unbiased for the rotated, clipped, scaled vector; each coordinate moves by less
    than 1 in rounding, so ``||encoded||_2 <= levels + sqrt(D)``.
    """
    scaled = scaled_rotation(vectors, params)
    base = np.floor(scaled)
    up = source.bernoulli((scaled - base).ravel(), scaled.size).reshape(scaled.shape)
    return base.astype(np.int64) + up.astype(np.int64)


def randomize_vector_sum(vectors: np.ndarray, params: VectorSumParams, source: RandomSource) -> np.ndarray:
    """Reports of a batch of users: int64 ``(n, D * M, 2)``, rows ``(coordinate, share mod q)``."""
    encoded = encode_vectors(vectors, params, source)
    n, dim = encoded.shape
    noisy = encoded + skellam_shares(params.mu, params.users, (n, dim), source)
    shares = split(noisy.ravel(), params.modulus, params.messages, source).reshape(n, dim * params.messages)
    coords = np.repeat(np.arange(dim, dtype=np.int64), params.messages)
    return np.stack([np.broadcast_to(coords, shares.shape), shares], axis=2)


def shifted_vectors(vectors: np.ndarray, params: ShiftedVectorSumParams | LocalVectorParams) -> np.ndarray:
    """``x - center`` per row, for clipping to the ball of ``params.radius`` about the centre.

    Data of another dimension than the round's is refused (``InvalidParameter``), never
    broadcast. A difference past the largest double (``x = -1e308``, ``center = 1e308``) is far
    outside any ball of finite radius, so such a row becomes its direction at the full radius,
    which is what clipping the exact difference gives: a device answers whatever its data,
    where refusing would tell on them (whether a device answers is visible).
    """
    x = as_real_array(vectors, "vectors", ndim=2)
    if x.shape[1] != params.dim:
        raise InvalidParameter("vectors", f"have {x.shape[1]} coordinates; the round is for {params.dim}")
    center = np.asarray(params.center, dtype=np.float64)
    with np.errstate(over="ignore"):
        shifted = x - center[None, :]
    overflowed = ~np.all(np.isfinite(shifted), axis=1)
    if overflowed.any():
        halves = x[overflowed] / 2.0 - center[None, :] / 2.0  # finite; some entry above 2^1023 in size
        shifted[overflowed] = clip_to_ball(halves, 1.0) * params.radius
    return shifted


def randomize_local_vector(vectors: np.ndarray, params: LocalVectorParams, source: RandomSource) -> np.ndarray:
    """Local reports of a batch of users: int64 ``(n, D, 2)``, rows ``(coordinate, value)``.

    ``x - center`` encoded as vector summation encodes (clip, rotate, scale, round at
    random), plus ``Skellam(mu)`` per coordinate from this user alone, clamped to
    ``[-bound, bound]`` (post-processing of the noisy value: no privacy cost; the clamp
    binds with probability below ``2^-64`` per value). The Skellam RDP bound of Agarwal,
    Kairouz & Liu (NeurIPS 2021) at the encoding's sensitivities makes one report
    ``(eps0, delta0)``-LDP (:meth:`LocalVectorParams.check_budget`).
    """
    encoded = encode_vectors(shifted_vectors(vectors, params), params, source)
    n, dim = encoded.shape
    noisy = np.clip(encoded + skellam_shares(params.mu, 1, (n, dim), source), -params.bound, params.bound)
    coords = np.broadcast_to(np.arange(dim, dtype=np.int64), (n, dim))
    return np.stack([coords, noisy], axis=2)


def randomize_shifted_vector_sum(vectors: np.ndarray, params: ShiftedVectorSumParams, source: RandomSource) -> np.ndarray:
    """:func:`randomize_vector_sum` of ``x - center`` (a public shift: the same guarantee)."""
    return randomize_vector_sum(shifted_vectors(vectors, params), params, source)
