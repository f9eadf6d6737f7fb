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
from shuffledp.protocol.messages import HadamardRangeParams, ProjectedMeanParams, RoundSpec
from shuffledp.protocol.randomness import RandomSource


@dataclass(frozen=True)
class ValueRange:
    """The integers ``low, low + stride, ..., high``."""

    low: int
    high: int
    stride: int = 1

    def __contains__(self, value: int) -> bool:
        return self.low <= value <= self.high and (value - self.low) % self.stride == 0


def randomize_reports(spec: RoundSpec, local_means: np.ndarray, source: RandomSource) -> list[tuple[int, ...]]:
    """The report values of a batch of users for one round (one tuple per user)."""
    params = spec.params
    if isinstance(params, HadamardRangeParams):
        rows, bits = randomize_range(local_means, params, spec.epsilon0, source)
        return [(int(r), int(b)) for r, b in zip(rows, bits)]
    if isinstance(params, ProjectedMeanParams):
        values = randomize_mean(local_means, params, spec.epsilon0, source, delta=spec.delta0)
        return [(int(v),) for v in values]
    raise InvalidParameter("spec.params", f"unsupported mechanism {spec.mechanism}")


def report_ranges(spec: RoundSpec) -> tuple[ValueRange, ...]:
    """What an honest randomizer of ``spec``'s round can report, value by value.

    * ``hadamard-range``: ``row`` in ``[0, K)``, ``bit`` in ``{-1, +1}`` (Algorithm 4).
    * ``projected-mean``: ``[-B, G + B]`` (:func:`~shuffledp.client.mean_randomizer.report_range`).
    """
    params = spec.params
    if isinstance(params, HadamardRangeParams):
        return ValueRange(0, params.padded_bins - 1), ValueRange(-1, 1, 2)
    if isinstance(params, ProjectedMeanParams):
        return (ValueRange(*report_range(params, spec.epsilon0, spec.delta0)),)
    raise InvalidParameter("spec.params", f"unsupported mechanism {spec.mechanism}")


def check_report_values(values: tuple[int, ...], ranges: tuple[ValueRange, ...]) -> None:
    """Raise :class:`ValueOutOfRange` unless every value lies in its range."""
    if len(values) != len(ranges):
        raise ValueOutOfRange(f"expected {len(ranges)} values, got {len(values)}")
    for index, (value, allowed) in enumerate(zip(values, ranges)):
        if value not in allowed:
            raise ValueOutOfRange(f"value {index} outside [{allowed.low}, {allowed.high}] (stride {allowed.stride})")
