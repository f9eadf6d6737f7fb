"""Multi-message summation, analyzer side: decoders and the one-round protocols.

The analyzer sums every share it receives mod ``q`` (per coordinate for vectors),
maps the result to ``(-q/2, q/2]`` and undoes the fixed-point encoding
(``protocol/mechanisms/modular_sum.py``). With every user's ``M`` shares present and no
wrap-around the result is exactly the sum of the encodings plus the noise, so the
estimate is unbiased for the sum of the clipped inputs with the exact variance
``(Var noise + sum_i f_i (1 - f_i)) step^2`` (:func:`shuffledp.protocol.mechanisms.summation_params.scalar_sum_variance`).

A batch whose size is not a whole number of users' shares cannot be decoded
(a missing share turns the sum into noise mod ``q``): :class:`IncompleteShares`.
References: Balle, Bell, Gascón & Nissim, CCS 2020; Huang, Liang & Yi, NeurIPS
2021, Sec. 5, Lemma 5.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np

from shuffledp.client.summation import clip_to_ball, scaled_rotation
from shuffledp.analyzer.decoders import coordinate_rows
from shuffledp.analyzer.protocols import Collector, Protocol, RoundPlan, Rounds, collected
from shuffledp.protocol.errors import InvalidParameter, ShuffleDPError
from shuffledp.protocol.wire.messages import ModularSumParams, VectorSumParams
from shuffledp.protocol.mechanisms.modular_sum import FixedPoint, centered, decode_estimate, modular_sum
from shuffledp.protocol.mechanisms.rotation import RandomRotation


class IncompleteShares(ShuffleDPError):
    """A summation batch that is not every share of a whole number of users."""

    reason = "incomplete-shares"


@dataclass(frozen=True)
class SumEstimate:
    """A decoded summation round: the estimated sum and mean (real units) and the decoded integer."""

    users: int
    sum: float | np.ndarray
    mean: float | np.ndarray
    encoded_total: int | np.ndarray


def _users(count: int, per_user: int) -> int:
    if count == 0 or count % per_user:
        raise IncompleteShares(f"{count} reports are not the {per_user} shares of a whole number of users")
    return count // per_user


def decode_scalar_sum(values: np.ndarray, params: ModularSumParams) -> SumEstimate:
    """Sum of every share mod ``q``, centered and decoded (no wrap-around assumed: see the chooser)."""
    shares = np.asarray(values, dtype=np.int64).reshape(-1)
    users = _users(shares.size, params.messages)
    fixed_point = FixedPoint(params.lower, params.upper, params.precision)
    decoded = decode_estimate(modular_sum(shares, params.modulus), users, fixed_point, params.modulus)
    return SumEstimate(users, decoded.sum, decoded.mean, decoded.encoded_total)


def coordinate_sums(values: np.ndarray, padded_dim: int, modulus: int) -> np.ndarray:
    """Per-coordinate sums mod ``q`` of ``(coordinate, share)`` rows, int64 in ``[0, q)``
    (each coordinate's shares summed exactly by :func:`~shuffledp.protocol.mechanisms.modular_sum.modular_sum`)."""
    rows = np.asarray(values, dtype=np.int64)
    order = np.argsort(rows[:, 0], kind="stable")
    shares = rows[order, 1]
    bounds = np.searchsorted(rows[order, 0], np.arange(padded_dim + 1))
    return np.array([modular_sum(shares[bounds[j] : bounds[j + 1]], modulus) for j in range(padded_dim)], dtype=np.int64)


def decode_vector_sum(values: np.ndarray, params: VectorSumParams) -> SumEstimate:
    """Per-coordinate modular sums, centered, unscaled and rotated back: the sum of the clipped vectors."""
    rows = np.asarray(values, dtype=np.int64).reshape(-1, 2)
    per_coordinate = np.bincount(rows[:, 0], minlength=params.padded_dim)
    return _decode_vector_totals(rows.shape[0], per_coordinate, coordinate_sums(rows, params.padded_dim, params.modulus), params)


def _decode_vector_totals(reports: int, per_coordinate: np.ndarray, sums: np.ndarray, params: VectorSumParams) -> SumEstimate:
    """:func:`decode_vector_sum` from its statistics: the report count, the shares per coordinate and
    each coordinate's sum mod ``q``."""
    users = _users(reports, params.messages_per_user)
    if not np.all(per_coordinate == users * params.messages):
        raise IncompleteShares(f"coordinates hold {per_coordinate.min()}..{per_coordinate.max()} shares, not {users * params.messages} each")
    total = centered(sums, params.modulus)
    rotated_sum = total.astype(np.float64) * (params.radius / params.levels)
    estimate = RandomRotation(params.dim, params.rotation_seed).inverse(rotated_sum)
    return SumEstimate(users, estimate, estimate / users, total)


class ModularSumCollector(Collector):
    """A scalar summation round's sufficient statistics: the number of shares and their sum mod ``q``
    (exact integers). :meth:`estimate` is :func:`decode_scalar_sum` of the same shares."""

    def __init__(self, params: ModularSumParams) -> None:
        self.params = params
        self.reports = 0
        self.total = 0

    def add_rows(self, rows: np.ndarray) -> None:
        """Fold in ``modular-sum`` report rows ``(share,)``."""
        shares = np.asarray(rows, dtype=np.int64).reshape(-1)
        self.reports += shares.size
        self.total = (self.total + modular_sum(shares, self.params.modulus)) % self.params.modulus

    def merge(self, other: Collector) -> "ModularSumCollector":
        if not isinstance(other, ModularSumCollector):
            raise InvalidParameter("other", f"cannot merge a {type(other).__name__} into a ModularSumCollector")
        self.reports += other.reports
        self.total = (self.total + other.total) % self.params.modulus
        return self

    def __len__(self) -> int:
        return self.reports

    def estimate(self) -> SumEstimate:
        users = _users(self.reports, self.params.messages)
        p = self.params
        decoded = decode_estimate(self.total, users, FixedPoint(p.lower, p.upper, p.precision), p.modulus)
        return SumEstimate(users, decoded.sum, decoded.mean, decoded.encoded_total)


class VectorSumCollector(Collector):
    """A vector summation round's sufficient statistics: the number of reports, the shares per
    rotated coordinate and each coordinate's sum mod ``q`` (exact integers). :meth:`estimate` is
    :func:`decode_vector_sum` of the same reports."""

    def __init__(self, params: VectorSumParams) -> None:
        self.params = params
        self.reports = 0
        self.per_coordinate = np.zeros(params.padded_dim, dtype=np.int64)
        self.sums = np.zeros(params.padded_dim, dtype=np.int64)

    def add_rows(self, rows: np.ndarray) -> None:
        """Fold in ``vector-sum`` report rows ``(coordinate, share)``."""
        dim = self.params.padded_dim
        rows, counts = coordinate_rows(rows, dim)
        self.reports += rows.shape[0]
        self.per_coordinate += counts
        self._add_sums(coordinate_sums(rows, dim, self.params.modulus))

    def _add_sums(self, sums: np.ndarray) -> None:
        # Both terms lie in [0, q) with q <= 2^62 (MAX_MODULUS), so their sum fits in int64.
        self.sums = np.mod(self.sums + sums, self.params.modulus)

    def merge(self, other: Collector) -> "VectorSumCollector":
        if not isinstance(other, VectorSumCollector):
            raise InvalidParameter("other", f"cannot merge a {type(other).__name__} into a VectorSumCollector")
        self.reports += other.reports
        self.per_coordinate = self.per_coordinate + other.per_coordinate
        self._add_sums(other.sums)
        return self

    def __len__(self) -> int:
        return self.reports

    def estimate(self) -> SumEstimate:
        return _decode_vector_totals(self.reports, self.per_coordinate, self.sums, self.params)


@dataclass(frozen=True)
class SumOutcome:
    """What a summation protocol returns: the estimate and the parameters it ran with."""

    estimate: SumEstimate
    params: ModularSumParams | VectorSumParams


class SummationProtocol(Protocol):
    """One round of multi-message summation at central ``(epsilon, delta)``: scalar
    (:class:`ModularSumParams`) or vector (:class:`VectorSumParams`, rotation, l2 clipping, Skellam)."""

    name = "sum"

    def __init__(self, params: ModularSumParams | VectorSumParams, epsilon: float, delta: float) -> None:
        params.check_budget(epsilon, delta)
        self.params = params
        self.epsilon = epsilon
        self.delta = delta
        vector = isinstance(params, VectorSumParams)
        self.name = "vector-sum" if vector else "sum"
        self.data_rank = 2 if vector else 1
        self._decode = decode_vector_sum if vector else decode_scalar_sum

    @property
    def budget(self) -> tuple[float, float]:
        return self.epsilon, self.delta

    def rounds(self) -> Rounds:
        collect: Callable[[], Collector]
        if isinstance(self.params, VectorSumParams):
            collect = partial(VectorSumCollector, self.params)
        else:
            collect = partial(ModularSumCollector, self.params)
        plan = RoundPlan(self.params, self.epsilon, self.delta, collect=collect)
        return SumOutcome(collected(plan, (yield plan)).estimate(), self.params)


def vector_sum_variance(params: VectorSumParams, rounding_variance_encoded: np.ndarray) -> float:
    """Exact expected squared l2 error of the estimated vector *sum*, absent wrap-around.

    Noise ``Skellam(mu)`` (variance ``2 mu``) and rounding (``sum_i f_ij (1 - f_ij)`` on
    rotated coordinate ``j``, given as ``rounding_variance_encoded``) are independent
    across rotated coordinates; rotating back and keeping the first ``dim`` of ``D``
    coordinates keeps ``dim / D`` of each coordinate's variance (``|U_jk| = 1/sqrt(D)``).
    """
    scale = params.levels / params.radius
    total = params.padded_dim * 2.0 * params.mu + float(np.sum(rounding_variance_encoded))
    return params.dim / params.padded_dim * total / scale**2


def scalar_rounding_variance(local_means: np.ndarray, params: ModularSumParams) -> float:
    """``sum_i f_i (1 - f_i)`` of the users' encodings (encoded units)."""
    return float(FixedPoint(params.lower, params.upper, params.precision).rounding_variance(local_means, encoded=True).sum())


def vector_rounding_variance(vectors: np.ndarray, params: VectorSumParams) -> np.ndarray:
    """Per rotated coordinate, ``sum_i f_ij (1 - f_ij)`` of the users' encodings."""
    scaled = scaled_rotation(vectors, params)
    frac = scaled - np.floor(scaled)
    return (frac * (1.0 - frac)).sum(axis=0)


def clipped_sum(vectors: np.ndarray, radius: float) -> np.ndarray:
    """The sum of the vectors after l2 clipping to ``radius``: what vector summation estimates."""
    return clip_to_ball(vectors, radius).sum(axis=0)


def scalar_clipped_sum(local_means: np.ndarray, params: ModularSumParams) -> float:
    """The sum of the values after clipping to ``[lower, upper]``: what scalar summation estimates."""
    return float(np.clip(np.asarray(local_means, dtype=np.float64), params.lower, params.upper).sum())
