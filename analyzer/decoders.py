"""Decoders shared by the simulated and the networked protocol: arrays in, estimates out.

Hadamard response (Girgis et al. 2022, Alg. 3 step 6). User ``i`` sends
``(j_i, b_i)``; its unbiased estimate of the one-hot vector ``e_{nu_i}`` is
``z_i = c b_i H[j_i, :]`` with ``c = (e^eps + 1)/(e^eps - 1)``, since
``E[z_i] = (1/K) sum_j H[j, :] H[j, nu_i] = e_{nu_i}``. The mean of the ``z_i`` is
``(c/n) (S @ H)`` where ``S[j] = sum_i b_i [j_i = j]`` is the signed histogram of rows,
so one FWHT of ``S`` gives all K frequency estimates in O(n + K log K).

Exact variance: every entry of ``z_i`` has square ``c^2``, so for fixed data
``Var(fhat[a]) = (c^2 - f[a]) / n`` where ``f[a]`` is the true fraction of users in
bin ``a`` (:func:`hadamard_estimate_variance`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shuffledp.analyzer.protocols import Collector
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.hadamard import fwht
from shuffledp.protocol.wire.messages import HadamardRangeParams


def hadamard_scale(epsilon: float) -> float:
    """``c = (e^eps + 1)/(e^eps - 1)``, the debiasing factor of one Hadamard-response bit."""
    return 1.0 / math.tanh(epsilon / 2.0)


def signed_row_histogram(rows: np.ndarray, bits: np.ndarray, num_rows: int) -> np.ndarray:
    """``S[j] = sum_i b_i [j_i = j]`` in O(n)."""
    rows = np.asarray(rows)
    if rows.size and (rows.min() < 0 or rows.max() >= num_rows):
        raise InvalidParameter("rows", f"must lie in [0, {num_rows})")
    return np.bincount(rows, weights=np.asarray(bits, dtype=np.float64), minlength=num_rows)


def hadamard_frequencies(rows: np.ndarray, bits: np.ndarray, num_rows: int, epsilon: float) -> np.ndarray:
    """Unbiased estimates of the fraction of users in each of the ``num_rows`` bins."""
    n = len(rows)
    if n == 0:
        raise InvalidParameter("rows", "no reports to decode")
    return frequencies_from_histogram(signed_row_histogram(rows, bits, num_rows), n, epsilon)


def frequencies_from_histogram(histogram: np.ndarray, reports: int, epsilon: float) -> np.ndarray:
    """The bins' frequency estimates from the signed row histogram of ``reports`` Hadamard
    responses at ``epsilon``: one FWHT, scaled by ``coth(eps/2) / reports``."""
    return fwht(np.asarray(histogram, dtype=np.float64)) * (hadamard_scale(epsilon) / reports)


def coordinate_rows(rows: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Report rows ``(coordinate, value)`` as int64, every coordinate checked to lie in ``[0, dim)``,
    and the number of rows per coordinate (what every coordinate-tagged collector folds first)."""
    rows = np.asarray(rows, dtype=np.int64).reshape(-1, 2)
    if rows.size and (rows[:, 0].min() < 0 or rows[:, 0].max() >= dim):
        raise InvalidParameter("rows", f"coordinates must lie in [0, {dim})")
    return rows, np.bincount(rows[:, 0], minlength=dim)


class HadamardRowCollector(Collector):
    """A Hadamard-response round's sufficient statistics: the signed histogram of the reported
    rows ``S[j] = sum_i b_i [j_i = j]`` (int64, exact) and the number of reports, from report rows
    ``(row, bit)``.

    :meth:`frequencies` is :func:`hadamard_frequencies` of the same reports to the last bit: that
    decoder builds the same histogram (as integer-valued float64) before its one FWHT."""

    statistics = ("histogram", "reports")

    def __init__(self, num_rows: int, epsilon: float) -> None:
        self.num_rows = int(num_rows)
        self.epsilon = epsilon
        self.histogram = np.zeros(self.num_rows, dtype=np.int64)
        self.reports = 0

    def add_rows(self, rows: np.ndarray) -> None:
        """Fold in report rows ``(row, bit)``."""
        rows = np.asarray(rows)
        # Integer sums: exact in float64 below 2^53 within one block, exact in int64 across blocks.
        self.histogram += signed_row_histogram(rows[:, 0], rows[:, 1], self.num_rows).astype(np.int64)
        self.reports += len(rows)

    def __len__(self) -> int:
        return self.reports

    def frequencies(self) -> np.ndarray:
        """Unbiased estimates of the fraction of users in each bin (:func:`hadamard_frequencies`)."""
        if self.reports == 0:
            raise InvalidParameter("rows", "no reports to decode")
        return frequencies_from_histogram(self.histogram, self.reports, self.epsilon)


def hadamard_estimate_variance(true_fractions: np.ndarray, n: int, epsilon: float) -> np.ndarray:
    """Exact per-bin variance ``(c^2 - f[a]) / n`` of :func:`hadamard_frequencies`."""
    return (hadamard_scale(epsilon) ** 2 - np.asarray(true_fractions, dtype=np.float64)) / n


@dataclass(frozen=True)
class RangeEstimate:
    """Output of the range round: the chosen bin, its centre, and the announced interval."""

    bin: int
    center: float
    lower: float
    upper: float
    frequencies: np.ndarray


def announce_range(frequencies: np.ndarray, params: HadamardRangeParams) -> RangeEstimate:
    """Arg-max over the real (unpadded) bins, and ``[a_max - 3 tau, a_max + 3 tau]`` (Alg. 3 step 8)."""
    real = np.asarray(frequencies)[: params.num_bins]
    best = int(np.argmax(real))
    center = params.bin_center(best)
    return RangeEstimate(best, center, center - 3 * params.tau, center + 3 * params.tau, real)


@dataclass(frozen=True)
class MeanEstimate:
    """A mean with its standard error: the empirical one (from the reports) and the theoretical one."""

    estimate: float
    standard_error: float
    n: int


def mean_from_reports(values: np.ndarray) -> MeanEstimate:
    """Average of decoded reports (Alg. 1 step 5) and the empirical standard error of that average.

    Both sums are correctly rounded (``math.fsum``), so the result is a function of the
    multiset of reports alone, to the last bit: the order the shuffler forwarded them in
    (random) does not reach it, and a seeded deployment and a simulation of it agree exactly."""
    values = np.asarray(values, dtype=np.float64).ravel()
    n = values.size
    if n < 2:
        raise InvalidParameter("values", f"need at least 2 reports, got {n}")
    mean = math.fsum(values) / n
    variance = math.fsum((values - mean) ** 2) / (n - 1)
    return MeanEstimate(mean, math.sqrt(variance) / math.sqrt(n), n)
