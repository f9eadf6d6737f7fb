"""Per-mechanism client logic in one place: the randomizer a round runs, and the
range of values an honest randomizer of that round can report.

The device :class:`~shuffledp.client.Client`, the simulated
:class:`~shuffledp.simulation.client_pool.ClientPool` and the analyzer all go through these
two functions, so what a client may send and what the analyzer accepts are one
definition: the analyzer refuses (and counts) any value outside
:func:`report_ranges`, which an honest client never produces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from shuffledp.client.mean_randomizer import randomize_mean, randomize_mean_one, report_range
from shuffledp.client.range_randomizer import randomize_range, randomize_range_one
from shuffledp.protocol.errors import InvalidParameter, ValueOutOfRange
from shuffledp.client.local_data import as_real_array
from shuffledp.client.quantile_randomizer import randomize_coordinate_tree, randomize_shifted_norm
from shuffledp.client.summation import (
    randomize_local_vector,
    randomize_modular_sum,
    randomize_shifted_vector_sum,
    randomize_vector_sum,
)
from shuffledp.client.vector_randomizer import randomize_vector_mean, randomize_vector_range, rotation_of
from shuffledp.protocol.wire.messages import (
    CoordinateTreeParams,
    HadamardRangeParams,
    LocalVectorParams,
    MechanismParams,
    ModularSumParams,
    ProjectedMeanParams,
    RoundSpec,
    ShiftedNormParams,
    ShiftedVectorSumParams,
    VectorMeanParams,
    VectorRangeParams,
    VectorSumParams,
)
from shuffledp.protocol.mechanisms.randomness import RandomSource


class SpecFields(Protocol):
    """What :func:`report_ranges` reads of a round spec (a :class:`RoundSpec`, or a plan's fields)."""

    @property
    def params(self) -> Any: ...
    @property
    def epsilon0(self) -> float: ...
    @property
    def delta0(self) -> float: ...
    @property
    def mechanism(self) -> str: ...


@dataclass(frozen=True)
class ValueRange:
    """The integers ``low, low + stride, ..., high``."""

    low: int
    high: int
    stride: int = 1

    def __contains__(self, value: int) -> bool:
        return self.low <= value <= self.high and (value - self.low) % self.stride == 0


def randomize_round(
    params: MechanismParams, epsilon0: float, delta0: float, local_data: np.ndarray, source: RandomSource
) -> np.ndarray:
    """Every message of a batch of users for one round: int64 ``(n, messages per user, report width)``.

    ``local_data`` is one local mean per user (shape ``(n,)``) or, for vector
    mechanisms, one vector per user (``(n, d)``). The device client calls this with a
    batch of one (or, for the scalar mechanisms, its exact scalar twin :func:`randomize_one`),
    the simulation engines with everyone: one randomizer, two paths.
    """
    if isinstance(params, HadamardRangeParams):
        rows, bits = randomize_range(local_data, params, epsilon0, source)
        return np.stack([rows.astype(np.int64), bits.astype(np.int64)], axis=1)[:, None, :]
    if isinstance(params, ProjectedMeanParams):
        values = randomize_mean(local_data, params, epsilon0, source, delta=delta0)
        return np.asarray(values, dtype=np.int64)[:, None, None]
    if isinstance(params, VectorRangeParams):
        rotated = rotation_of(params).apply(as_real_array(local_data, "local_data", ndim=2))
        reports = randomize_vector_range(rotated, params.scalar, epsilon0, params.mode, source)
        rows, bits = reports.values
        per_user = params.messages_per_user
        return np.stack([reports.coords, rows, bits], axis=1).astype(np.int64).reshape(-1, per_user, 3)
    if isinstance(params, VectorMeanParams):
        rotated = rotation_of(params).apply(as_real_array(local_data, "local_data", ndim=2))
        reports, _ = randomize_vector_mean(
            rotated, params.ranges, epsilon0, source, noise=params.noise, grid_levels=params.grid_levels, delta0=delta0
        )
        return np.stack([reports.coords, reports.values[0]], axis=1).astype(np.int64)[:, None, :]
    if isinstance(params, ModularSumParams):
        return randomize_modular_sum(local_data, params, epsilon0, source)
    if isinstance(params, ShiftedVectorSumParams):  # before its base class
        return randomize_shifted_vector_sum(local_data, params, source)
    if isinstance(params, VectorSumParams):
        return randomize_vector_sum(local_data, params, source)
    if isinstance(params, CoordinateTreeParams):
        return randomize_coordinate_tree(local_data, params, epsilon0, source)[:, None, :]
    if isinstance(params, ShiftedNormParams):
        return randomize_shifted_norm(local_data, params, epsilon0, source)[:, None, :]
    if isinstance(params, LocalVectorParams):
        return randomize_local_vector(local_data, params, source)
    raise InvalidParameter("params", f"unsupported mechanism {getattr(params, 'MECHANISM', type(params).__name__)}")


def randomize_one(
    params: MechanismParams, epsilon0: float, delta0: float, local_mean: object, source: RandomSource
) -> list[tuple[int, ...]] | None:
    """One user's messages as int tuples, without arrays, or None: no scalar path here, use
    :func:`randomize_round`.

    For ``hadamard-range`` and ``projected-mean`` rounds and a float local mean, this is
    ``[tuple(m) for m in randomize_round(params, epsilon0, delta0, np.array([local_mean]),
    source)[0].tolist()]`` exactly, with the same calls to ``source`` (same methods, same
    arguments, same order), so the same draws: the same mechanism (Algorithm 4, Lemma 1;
    Algorithm 2 with discrete Laplace or Gaussian noise) with the same guarantee, at a
    fraction of the cost of numpy on 1-element arrays (:func:`~shuffledp.client.range_randomizer.
    randomize_range_one`, :func:`~shuffledp.client.mean_randomizer.randomize_mean_one`).
    A non-finite local mean is refused as the batch path refuses it. Anything else (other
    mechanisms, subclasses of the params, a local mean that is not a float) gets None.
    """
    if type(local_mean) is not float and type(local_mean) is not np.float64:
        return None
    if type(params) is HadamardRangeParams:
        return [randomize_range_one(local_mean, params, epsilon0, source)]
    if type(params) is ProjectedMeanParams:
        return [(randomize_mean_one(local_mean, params, epsilon0, source, delta=delta0),)]
    return None


def randomize_reports(spec: RoundSpec, local_data: np.ndarray, source: RandomSource) -> np.ndarray:
    """:func:`randomize_round` for a signed round's spec."""
    return randomize_round(spec.params, spec.epsilon0, spec.delta0, local_data, source)


def report_ranges(spec: SpecFields) -> tuple[ValueRange, ...]:
    """What an honest randomizer of ``spec``'s round can report, value by value.

    * ``hadamard-range``: ``row`` in ``[0, K)``, ``bit`` in ``{-1, +1}`` (Algorithm 4).
    * ``projected-mean``: ``[-B, G + B]`` (:func:`~shuffledp.client.mean_randomizer.report_range`).
    * ``vector-range``: a rotated coordinate in ``[0, D)``, then as ``hadamard-range``.
    * ``vector-mean``: a rotated coordinate, then as ``projected-mean`` (the range in grid
      units depends only on the grid size, the noise and the budget, not on the interval).
    * ``modular-sum``: a share in ``[0, q)``.
    * ``vector-sum`` and ``shifted-vector-sum``: a coordinate in ``[0, D)``, then a share in ``[0, q)``.
    * ``coordinate-tree``: a group in ``[0, D * levels)``, then as ``hadamard-range``. A node
      index past a level's width cannot be sent (the row is uniform, the bit a sign).
    * ``shifted-norm``: as ``hadamard-range``.
    * ``local-vector``: a rotated coordinate, then a value in ``[-bound, bound]``.

    A share mod ``q`` can be any residue, so for summation this bounds nothing: one
    client's shares can move the sum anywhere mod ``q`` (summation has no input
    validation; ``docs/threat-model.md``).
    """
    params = spec.params
    if isinstance(params, HadamardRangeParams):
        return ValueRange(0, params.padded_bins - 1), ValueRange(-1, 1, 2)
    if isinstance(params, ProjectedMeanParams):
        return (ValueRange(*report_range(params, spec.epsilon0, spec.delta0)),)
    if isinstance(params, VectorRangeParams):
        return ValueRange(0, params.padded_dim - 1), ValueRange(0, params.scalar.padded_bins - 1), ValueRange(-1, 1, 2)
    if isinstance(params, VectorMeanParams):
        proxy = ProjectedMeanParams(0.0, 1.0, params.noise, params.grid_levels)  # the value range depends on G and noise only
        return ValueRange(0, params.padded_dim - 1), ValueRange(*report_range(proxy, spec.epsilon0, spec.delta0))
    if isinstance(params, ModularSumParams):
        return (ValueRange(0, params.modulus - 1),)
    if isinstance(params, VectorSumParams):  # and ShiftedVectorSumParams
        return ValueRange(0, params.padded_dim - 1), ValueRange(0, params.modulus - 1)
    if isinstance(params, CoordinateTreeParams):
        return ValueRange(0, params.groups - 1), ValueRange(0, params.scalar.padded_bins - 1), ValueRange(-1, 1, 2)
    if isinstance(params, ShiftedNormParams):
        return ValueRange(0, params.scalar.padded_bins - 1), ValueRange(-1, 1, 2)
    if isinstance(params, LocalVectorParams):
        return ValueRange(0, params.padded_dim - 1), ValueRange(-params.bound, params.bound)
    raise InvalidParameter("spec.params", f"unsupported mechanism {spec.mechanism}")


def check_report_values(values: tuple[int, ...] | np.ndarray, ranges: tuple[ValueRange, ...]) -> None:
    """Raise :class:`ValueOutOfRange` unless every value lies in its range."""
    if len(values) != len(ranges):
        raise ValueOutOfRange(f"expected {len(ranges)} values, got {len(values)}")
    for index, (value, allowed) in enumerate(zip(values, ranges)):
        if value not in allowed:
            raise ValueOutOfRange(f"value {index} outside [{allowed.low}, {allowed.high}] (stride {allowed.stride})")
