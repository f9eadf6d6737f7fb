"""Per-mechanism client logic in one place: the randomizer a round runs, and the
range of values an honest randomizer of that round can report.

The device :class:`~shuffledp.client.Client`, the simulated
:class:`~shuffledp.client.pool.ClientPool` and the analyzer all go through these
two functions, so what a client may send and what the analyzer accepts are one
definition: the analyzer refuses (and counts) any value outside
:func:`report_ranges`, which an honest client never produces.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shuffledp.client.mean_randomizer import randomize_mean, report_range
from shuffledp.client.range_randomizer import randomize_range
from shuffledp.protocol.errors import InvalidParameter, ValueOutOfRange
from shuffledp.client.summation import randomize_modular_sum, randomize_vector_sum
from shuffledp.protocol.messages import (
    HadamardRangeParams,
    MechanismParams,
    ModularSumParams,
    ProjectedMeanParams,
    RoundSpec,
    VectorSumParams,
)
from shuffledp.protocol.randomness import RandomSource


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
    batch of one, the simulation engines with everyone: one randomizer, two paths.
    """
    if isinstance(params, HadamardRangeParams):
        rows, bits = randomize_range(local_data, params, epsilon0, source)
        return np.stack([rows.astype(np.int64), bits.astype(np.int64)], axis=1)[:, None, :]
    if isinstance(params, ProjectedMeanParams):
        values = randomize_mean(local_data, params, epsilon0, source, delta=delta0)
        return np.asarray(values, dtype=np.int64)[:, None, None]
    if isinstance(params, ModularSumParams):
        return randomize_modular_sum(local_data, params, epsilon0, source)
    if isinstance(params, VectorSumParams):
        return randomize_vector_sum(local_data, params, source)
    raise InvalidParameter("params", f"unsupported mechanism {getattr(params, 'MECHANISM', type(params).__name__)}")


def randomize_reports(spec: RoundSpec, local_data: np.ndarray, source: RandomSource) -> np.ndarray:
    """:func:`randomize_round` for a signed round's spec."""
    return randomize_round(spec.params, spec.epsilon0, spec.delta0, local_data, source)


def report_ranges(spec: RoundSpec) -> tuple[ValueRange, ...]:
    """What an honest randomizer of ``spec``'s round can report, value by value.

    * ``hadamard-range``: ``row`` in ``[0, K)``, ``bit`` in ``{-1, +1}`` (Algorithm 4).
    * ``projected-mean``: ``[-B, G + B]`` (:func:`~shuffledp.client.mean_randomizer.report_range`).
    * ``modular-sum``: a share in ``[0, q)``.
    * ``vector-sum``: a coordinate in ``[0, D)``, then a share in ``[0, q)``.

    A share mod ``q`` can be any residue, so for summation this bounds nothing: one
    client's shares can move the sum anywhere mod ``q`` (summation has no input
    validation; ``docs/threat-model.md``).
    """
    params = spec.params
    if isinstance(params, HadamardRangeParams):
        return ValueRange(0, params.padded_bins - 1), ValueRange(-1, 1, 2)
    if isinstance(params, ProjectedMeanParams):
        return (ValueRange(*report_range(params, spec.epsilon0, spec.delta0)),)
    if isinstance(params, ModularSumParams):
        return (ValueRange(0, params.modulus - 1),)
    if isinstance(params, VectorSumParams):
        return ValueRange(0, params.padded_dim - 1), ValueRange(0, params.modulus - 1)
    raise InvalidParameter("spec.params", f"unsupported mechanism {spec.mechanism}")


def check_report_values(values: tuple[int, ...] | np.ndarray, ranges: tuple[ValueRange, ...]) -> None:
    """Raise :class:`ValueOutOfRange` unless every value lies in its range."""
    if len(values) != len(ranges):
        raise ValueOutOfRange(f"expected {len(ranges)} values, got {len(values)}")
    for index, (value, allowed) in enumerate(zip(values, ranges)):
        if value not in allowed:
            raise ValueOutOfRange(f"value {index} outside [{allowed.low}, {allowed.high}] (stride {allowed.stride})")
