"""Projected mean report (Girgis, Data & Diggavi 2022, Algorithm 2 and Remark 3).

A user projects its local mean onto the announced range ``[lower, upper]``, maps it
to the fixed-point grid ``lower + step * u`` with ``u`` in ``{0, ..., G}``
(``G = grid_levels``) by unbiased randomized rounding, and adds integer noise:

* ``laplace``: discrete Laplace with ``P(k) ∝ exp(-eps |k| / G)``. Two inputs move
  ``u`` by at most ``G``, so the likelihood ratio is at most ``e^eps``: pure
  ``eps``-LDP (the discrete analogue of Remark 3 / Appendix D's ``Lap(2(b-a)/eps0)``
  at budget ``eps0/2``). This is the report the shuffle model needs.
* ``gaussian``: discrete Gaussian ``N_Z(0, sigma^2)`` with ``sigma^2`` the smallest
  value whose exact hockey-stick divergence at sensitivity ``G`` is at most
  ``delta`` (Canonne, Kamath & Steinke 2020, Thm. 7). This replaces the paper's
  ``sigma^2 = 12 (b-a)^2 log(1.25/delta) / eps0^2`` (classical Gaussian mechanism,
  valid only for eps <= 1) with a calibration that is exact for every eps.

Sampling on the integer grid avoids the floating-point Laplace leak (Mironov 2012):
the report is an integer, and the accounting covers the discretisation, because
the sensitivity is taken in grid units after projection and rounding.

Written once, vectorized over a batch of users (:func:`randomize_mean`), with a scalar
twin for one user (:func:`randomize_mean_one`, what a device runs): the same Algorithm 2,
the same noise and the same guarantee, drawing the same values from the same source
calls in the same order, with the arithmetic around them in plain Python.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Union

import numpy as np

from shuffledp.client.local_data import as_real_array
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.gaussian_calibration import (
    calibrate_discrete_gaussian,
    discrete_gaussian_variance,
    discrete_laplace_variance,
)
from shuffledp.protocol.wire.messages import ProjectedMeanParams
from shuffledp.protocol.mechanisms.randomness import RandomSource


@dataclass(frozen=True)
class PerUserGrid:
    """Projection intervals given per user (arrays), with one noise kind and grid size.

    The vector protocol uses it: each user reports one sampled coordinate, and each
    coordinate has its own announced range. Every function below that takes
    ``params`` accepts a :class:`ProjectedMeanParams` or a :class:`PerUserGrid`;
    privacy is unchanged, since each user's sensitivity in grid units is still ``G``.
    """

    lower: np.ndarray
    upper: np.ndarray
    noise: str
    grid_levels: int

    @property
    def step(self) -> np.ndarray:
        return (self.upper - self.lower) / self.grid_levels


GridParams = Union[ProjectedMeanParams, PerUserGrid]


def laplace_scale(params: GridParams, epsilon: float) -> Fraction:
    """Discrete Laplace scale ``G / eps`` in grid units, as an exact rational."""
    if not epsilon > 0:
        raise InvalidParameter("epsilon", f"must be > 0, got {epsilon}")
    return Fraction(params.grid_levels) / Fraction(epsilon)


def gaussian_sigma2(params: GridParams, epsilon: float, delta: float) -> float:
    """Discrete Gaussian variance parameter (grid units) for ``(eps, delta)`` at sensitivity ``G``."""
    if not 0 < delta < 1:
        raise InvalidParameter("delta", f"must be in (0, 1) for Gaussian noise, got {delta}")
    return _calibrated_sigma2(epsilon, delta, params.grid_levels)


@functools.lru_cache(maxsize=64)
def _calibrated_sigma2(epsilon: float, delta: float, grid_levels: int) -> float:
    return calibrate_discrete_gaussian(epsilon, delta, grid_levels)


def noise_variance(params: GridParams, epsilon: float, delta: float = 0.0) -> float | np.ndarray:
    """Exact variance of one report's noise, in the data's units (grid variance times step^2)."""
    if params.noise == "laplace":
        grid_var = discrete_laplace_variance(laplace_scale(params, epsilon))
    else:
        grid_var = discrete_gaussian_variance(gaussian_sigma2(params, epsilon, delta))
    return grid_var * params.step**2


#: A mean report's noise is clamped with probability below 2**-TAIL_BITS (see report_range).
TAIL_BITS = 40


def noise_tail_bound(params: GridParams, epsilon: float, delta: float = 0.0) -> int:
    """An integer ``B`` with ``P(|noise| > B) <= 2**-TAIL_BITS`` for one report's noise.

    Discrete Laplace, ``q = exp(-1/s)``, ``s = G/eps``:
    ``P(|X| > B) = 2 q^(B+1) / (1+q) < 2 exp(-(B+1)/s)``, at most ``2**-T`` once
    ``B + 1 >= (T + 1) s ln 2``.
    Discrete Gaussian: it is ``sigma^2``-subgaussian (Canonne, Kamath & Steinke 2020,
    Prop. 25), so ``P(|X| > B) <= 2 exp(-B^2 / (2 sigma^2))``, at most ``2**-T`` once
    ``B >= sigma sqrt(2 (T + 1) ln 2)``.
    """
    tail = (TAIL_BITS + 1) * math.log(2.0)
    if params.noise == "laplace":
        return math.ceil(float(laplace_scale(params, epsilon)) * tail)
    return math.ceil(math.sqrt(gaussian_sigma2(params, epsilon, delta) * 2.0 * tail))


def report_range(params: GridParams, epsilon: float, delta: float = 0.0) -> tuple[int, int]:
    """``[-B, G + B]``: every grid value an honest report can take (:func:`randomize_mean` clamps to it).

    Clamping ``u + noise`` to a public interval is post-processing of the noisy value,
    so the report keeps its ``eps`` (or ``(eps, delta)``) guarantee exactly (Dwork &
    Roth 2014, Prop. 2.1). Its cost is a bias: the clamp moves a report only when
    ``|noise| > B`` (probability below ``2**-40``), by at most ``|noise| - B``, so
    ``|bias| <= step * E[(|noise| - B)+] <= step * 2**-40 / (1 - q)``, about
    ``step * s * 2**-40`` for Laplace with ``s = G/eps`` (``(upper - lower) / eps * 1e-12``
    in the data's units); the Gaussian case is smaller still. In exchange the
    analyzer can refuse any value outside the interval, so one report moves a mean
    of n reports by at most ``(G + 2B) step / n``.
    """
    bound = noise_tail_bound(params, epsilon, delta)
    return -bound, params.grid_levels + bound


def to_grid(local_means: np.ndarray, params: GridParams) -> tuple[np.ndarray, np.ndarray]:
    """Projection onto ``[lower, upper]`` in grid units: integer part and fractional part."""
    y = np.clip(np.asarray(local_means, dtype=np.float64), params.lower, params.upper)
    u = (y - params.lower) / params.step
    floor = np.clip(np.floor(u), 0, params.grid_levels)
    frac = np.clip(u - floor, 0.0, 1.0)
    return floor.astype(np.int64), frac


def rounding_variance(local_means: np.ndarray, params: GridParams) -> np.ndarray:
    """Exact variance of the randomized rounding of each user, ``frac (1 - frac) step^2``."""
    _, frac = to_grid(local_means, params)
    return frac * (1.0 - frac) * params.step**2


def randomize_mean(
    local_means: np.ndarray,
    params: GridParams,
    epsilon: float,
    source: RandomSource,
    delta: float = 0.0,
) -> np.ndarray:
    """Algorithm 2 for a batch of users: integer grid values ``u + noise`` (int64), clamped to
    :func:`report_range` (post-processing; see there for the bias it can add)."""
    y = as_real_array(local_means, "local_means")
    n = y.shape[0]
    floor, frac = to_grid(y, params)
    grid = floor + source.bernoulli(frac, n).astype(np.int64)
    grid = np.minimum(grid, params.grid_levels)
    if params.noise == "laplace":
        noise = source.discrete_laplace(laplace_scale(params, epsilon), n)
    else:
        noise = source.discrete_gaussian(gaussian_sigma2(params, epsilon, delta), n)
    low, high = report_range(params, epsilon, delta)
    return np.clip(grid + noise.astype(np.int64), low, high)


# --------------------------------------------------------------------------
# One user, without arrays: the device's path
# --------------------------------------------------------------------------
#
# Each function below is its vectorized twin above for a batch of one (and a
# ProjectedMeanParams, not a PerUserGrid), line by line: the same source calls in the
# same order with the same arguments (``bernoulli(frac, 1)``, then ``discrete_laplace(G /
# eps, 1)`` or ``discrete_gaussian(sigma2, 1)``), and the same IEEE double operations in
# the same order (Python floats are doubles, rounded as numpy's float64), so for any
# source the result equals ``twin(np.array([y]), ...)[0]`` exactly.
#
# One argument changes form, not value: the twin passes the rounding probability as a
# 1-element float64 array, this path as the same double. Both sources treat the two
# alike (``_check_probability`` applies the same ``[0, 1]`` test to either; SeededSource
# compares one ``random(1)`` draw with it; SystemSource draws one 53-bit integer against
# ``floor(p * 2**53)`` of the same double), so the draws and the realised probability
# are identical, and a secure source still rounds it down.


def _real_scalar(value: object, name: str) -> float:
    """``value`` as the one float a batch of one would hold; refused exactly as :func:`as_real_array`
    refuses ``np.array([value])`` (same type, same message) if it is not a finite real."""
    if (type(value) is float or type(value) is np.float64) and math.isfinite(value):
        return float(value)
    return float(as_real_array(np.array([value]), name)[0])


def _clip(x, low, high):
    """``np.clip`` of one number (``low <= high``): a value equal to a bound is kept as it is."""
    return low if x < low else (high if x > high else x)


def to_grid_one(local_mean: float, params: ProjectedMeanParams) -> tuple[int, float]:
    """:func:`to_grid` of one finite local mean: ``(integer part, fractional part)``.

    The same double operations as the twin: clip to ``[lower, upper]`` first,
    ``u = (y - lower) / step``, ``floor(u)`` clipped to ``[0, G]`` (a double, -0.0 kept as
    ``np.floor`` keeps it), then ``u - floor`` clipped to ``[0, 1]``. The validated params
    keep ``upper - lower`` finite, so ``u`` lies in about ``[0, G]`` and every step is exact
    as in numpy.
    """
    lower = float(params.lower)
    y = _clip(local_mean, lower, float(params.upper))
    u = (y - lower) / params.step
    whole = math.floor(u)
    floor = _clip(u if whole == u else float(whole), 0.0, float(params.grid_levels))
    frac = _clip(u - floor, 0.0, 1.0)
    return int(floor), frac


def randomize_mean_one(
    local_mean: float,
    params: ProjectedMeanParams,
    epsilon: float,
    source: RandomSource,
    delta: float = 0.0,
) -> int:
    """Algorithm 2 for one user: the grid value ``u + noise`` as an int, clamped to
    :func:`report_range`, equal to ``randomize_mean(np.array([local_mean]), ...)[0]`` with the
    same draws from ``source``. The same mechanism as the batch, without arrays, so the same
    guarantee: pure ``eps``-LDP with Laplace noise, ``(eps, delta)`` with Gaussian noise
    (CKS20 Thm. 7), the clamp being post-processing (see the module docstring)."""
    y = _real_scalar(local_mean, "local_means")
    floor, frac = to_grid_one(y, params)
    grid = floor + int(source.bernoulli(frac, 1)[0])
    if grid > params.grid_levels:  # np.minimum(grid, G)
        grid = params.grid_levels
    if params.noise == "laplace":
        noise = source.discrete_laplace(laplace_scale(params, epsilon), 1)
    else:
        noise = source.discrete_gaussian(gaussian_sigma2(params, epsilon, delta), 1)
    low, high = report_range(params, epsilon, delta)  # looked up here, as the batch path does (an audit's planted fault reaches both)
    return _clip(grid + int(noise[0]), low, high)


def decode_values(grid_values: np.ndarray, params: GridParams) -> np.ndarray:
    """Map reported grid integers back to the data's units: ``lower + step * value``."""
    return params.lower + params.step * np.asarray(grid_values, dtype=np.float64)
