"""The vector mean protocol's analyzer side (Girgis, Data & Diggavi 2022, Algorithm 5).

The two rounds' collectors (``analyzer/protocols.py``): reports arrive block by block, in
any order, and only the sufficient statistics are kept, as exact integers, so the result
does not depend on the blocks or their order (memory O(D K) whatever n is):

* :class:`VectorRangeAccumulator` keeps the signed row histogram per coordinate,
  ``S[l, j]``, and the report count per coordinate; one FWHT per coordinate gives the
  frequency estimates, and each coordinate's range is its arg-max bin ± 3 tau'.
* :class:`VectorMeanAccumulator` keeps per coordinate the report count and the sum of
  the reported grid integers, from which the sum of decoded reports is
  ``count lower + step sum``. The estimate is ``z_hat = (D / n) sum_i z_i e_{l_i}``
  (Algorithm 5 line 15: each user's report scaled by D in its sampled coordinate), then
  ``x_hat = U^{-1} z_hat``.

Exact error model (fixed data, the ranges given). With ``y~_i`` the projected rotated
mean of user i, ``s_l^2`` the noise variance in coordinate l and ``r_il`` the
randomized-rounding variance, ``Cov(z_hat) = (1/n^2) sum_i [D diag(y~_i^2 + s^2 + r_i) -
y~_i y~_i^T]``. Because ``U_lk^2 = 1/D``, the variance of coordinate k of
``x_hat = U^T z_hat`` is ``(1/n^2) sum_i [A_i - (U^T y~_i)_k^2]`` with
``A_i = ||y~_i||^2 + sum_l (s_l^2 + r_il)`` (:meth:`VectorMeanAccumulator.variance`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from shuffledp.analyzer.range_check import CoordinateRangeCheck, check_coordinate_ranges
from shuffledp.analyzer.decoders import hadamard_scale
from shuffledp.analyzer.scalar_mean import paper_noise_variance
from shuffledp.client.mean_randomizer import PerUserGrid, noise_variance, rounding_variance
from shuffledp.client.vector_randomizer import VECTOR_MODES, CoordinateReports, rotation_of
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.hadamard import fwht
from shuffledp.analyzer.protocols import Collector, Protocol, RoundPlan, Rounds, collected
from shuffledp.protocol.wire.messages import HadamardRangeParams, VectorMeanParams, VectorRangeParams, check_local_budget
from shuffledp.protocol.mechanisms.rotation import RandomRotation


@dataclass(frozen=True)
class VectorMeanConfig:
    """Public parameters of Algorithm 5, in the rotated domain.

    ``rotated_bound``: every rotated coordinate of an admissible local mean lies in
    ``[-rotated_bound, rotated_bound]`` (the range round's interval).
    ``rotated_tau``: per-coordinate concentration radius of the rotated local means.
    """

    dim: int
    rotated_bound: float
    rotated_tau: float
    epsilon0: float
    delta0: float = 0.0
    noise: str = "laplace"
    grid_levels: int = 4096
    mode: str = "sampled"
    rotation_seed: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.dim, int) and self.dim >= 1):
            raise InvalidParameter("dim", f"must be an integer >= 1, got {self.dim}")
        if not (self.rotated_bound > 0 and math.isfinite(self.rotated_bound)):
            raise InvalidParameter("rotated_bound", f"must be finite and > 0, got {self.rotated_bound}")
        if not 0 < self.rotated_tau:
            raise InvalidParameter("rotated_tau", f"must be > 0, got {self.rotated_tau}")
        check_local_budget(self.epsilon0, self.delta0, self.noise)
        if self.mode not in VECTOR_MODES:
            raise InvalidParameter("mode", f"must be one of {VECTOR_MODES}, got {self.mode!r}")

    @property
    def rotation(self) -> RandomRotation:
        return rotation_of(self)

    @property
    def padded_dim(self) -> int:
        return self.rotation.padded_dim

    @property
    def range_round(self) -> bool:
        """Whether the range round runs. With one bin over ``[-bound, bound]`` (``tau' >= bound``)
        Algorithm 3 announces ``[-3 tau', 3 tau']`` whatever the reports say: the round is
        data-independent, so it is skipped and the mean round gets the whole ``eps0`` over the
        public ``[-bound, bound]`` (narrower than ``+-3 tau'``, and every rotated coordinate lies
        in it)."""
        return self.range_params().num_bins > 1

    @property
    def mean_epsilon(self) -> float:
        """Local epsilon of the mean round: ``eps0 / 2``, or ``eps0`` when the range round is skipped."""
        return self.epsilon0 / 2.0 if self.range_round else self.epsilon0

    @property
    def range_epsilon(self) -> float:
        """Local epsilon of one range report: eps0/2 (sampled) or eps0/(2D) (paper)."""
        return self.epsilon0 / 2.0 if self.mode == "sampled" else self.epsilon0 / (2.0 * self.padded_dim)

    def range_params(self) -> HadamardRangeParams:
        tau = min(self.rotated_tau, self.rotated_bound)
        return HadamardRangeParams(-self.rotated_bound, self.rotated_bound, tau)


class VectorRangeAccumulator(Collector):
    """Per-coordinate signed histograms of range reports; :meth:`ranges` decodes them."""

    #: Exact sums (integer-valued float64 histogram, int64 counts): :meth:`Collector.merge` adds them.
    statistics = ("histogram", "counts")

    def __init__(self, config: VectorMeanConfig) -> None:
        self.config = config
        self.params = config.range_params()
        dim, rows = config.padded_dim, self.params.padded_bins
        self.histogram = np.zeros((dim, rows))
        self.counts = np.zeros(dim, dtype=np.int64)

    def add(self, reports: CoordinateReports) -> None:
        rows, bits = reports.values
        dim, k = self.histogram.shape
        flat = reports.coords * k + rows
        self.histogram += np.bincount(flat, weights=bits.astype(np.float64), minlength=dim * k).reshape(dim, k)
        self.counts += np.bincount(reports.coords, minlength=dim)

    def add_rows(self, rows: np.ndarray) -> None:
        """Fold in ``vector-range`` report rows ``(coord, row, bit)``."""
        self.add(CoordinateReports(rows[:, 0], (rows[:, 1], rows[:, 2])))

    def frequencies(self) -> np.ndarray:
        """``(D, K)`` unbiased frequency estimates, one FWHT per coordinate."""
        if (self.counts == 0).any():
            raise InvalidParameter("reports", "some coordinate received no range report; n is too small for D")
        scale = hadamard_scale(self.config.range_epsilon) / self.counts[:, None]
        return fwht(self.histogram) * scale

    def announced_bins(self) -> np.ndarray:
        """The arg-max bin of every coordinate."""
        return np.argmax(self.frequencies()[:, : self.params.num_bins], axis=1)

    def ranges(self) -> np.ndarray:
        """``(D, 2)``: ``[a_max - 3 tau', a_max + 3 tau']`` per coordinate (Algorithm 3 step 8)."""
        p = self.params
        centers = p.low + p.tau * (2 * self.announced_bins() + 1)
        return np.stack([centers - 3 * p.tau, centers + 3 * p.tau], axis=1)

    def check(self) -> CoordinateRangeCheck:
        """The analyzer's check of every coordinate's range round (``analyzer/range_check.py``)."""
        freqs = self.frequencies()[:, : self.params.num_bins]
        return check_coordinate_ranges(freqs, freqs.argmax(axis=1), self.counts, self.config.range_epsilon)


@dataclass
class VectorMeanAccumulator(Collector):
    """Per-coordinate report counts and sums of reported grid integers (exact), and the
    exact error-model terms (:meth:`add_truth`, simulation only)."""

    #: What :meth:`Collector.merge` adds: the exact integer report statistics, and the error-model terms.
    statistics = ("n", "counts", "grid_sums", "a_total", "w_squared", "w_sum")

    config: VectorMeanConfig
    ranges: np.ndarray
    n: int = 0
    counts: np.ndarray = field(init=False)
    grid_sums: np.ndarray = field(init=False)
    a_total: float = 0.0
    w_squared: np.ndarray = field(init=False)
    w_sum: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        dim = self.config.padded_dim
        self.ranges = np.asarray(self.ranges, dtype=np.float64)
        self.counts = np.zeros(dim, dtype=np.int64)
        self.grid_sums = np.zeros(dim, dtype=np.int64)
        self.w_squared = np.zeros(dim)
        self.w_sum = np.zeros(dim)

    def add(self, reports: CoordinateReports, grid: PerUserGrid | None = None) -> None:
        """Fold in mean reports. Each report's grid is its coordinate's announced range
        (``grid``, if given, must be that per-user grid: it is not read)."""
        self._add(np.asarray(reports.coords), np.asarray(reports.values[0]))

    def add_rows(self, rows: np.ndarray) -> None:
        """Fold in ``vector-mean`` report rows ``(coord, grid value)``."""
        self._add(rows[:, 0], rows[:, 1])

    def _add(self, coords: np.ndarray, values: np.ndarray) -> None:
        dim = self.config.padded_dim
        # Integer sums: exact in float64 below 2^53 within one block, exact in int64 across blocks.
        self.grid_sums += np.bincount(coords, weights=values.astype(np.float64), minlength=dim).astype(np.int64)
        self.counts += np.bincount(coords, minlength=dim)
        self.n += len(coords)

    @property
    def sums(self) -> np.ndarray:
        """Per rotated coordinate, the sum of the decoded reports: ``count lower + step sum(grid values)``."""
        lower, upper = self.ranges[:, 0], self.ranges[:, 1]
        return self.counts * lower + (upper - lower) / self.config.grid_levels * self.grid_sums

    def add_truth(self, rotated: np.ndarray) -> None:
        """Accumulate the exact error model from the users' true rotated means (simulation only)."""
        c = self.config
        lower, upper = self.ranges[:, 0], self.ranges[:, 1]
        projected = np.clip(rotated, lower, upper)
        full = PerUserGrid(np.broadcast_to(lower, rotated.shape), np.broadcast_to(upper, rotated.shape), c.noise, c.grid_levels)
        noise = noise_variance(PerUserGrid(lower, upper, c.noise, c.grid_levels), c.mean_epsilon, c.delta0)
        self.a_total += float((projected**2).sum() + len(rotated) * np.sum(noise) + rounding_variance(rotated, full).sum())
        back = fwht(projected) / math.sqrt(c.padded_dim) * c.rotation.signs  # U^T y~_i, padded
        self.w_squared += (back**2).sum(axis=0)
        self.w_sum += back.sum(axis=0)

    def rotated_estimate(self) -> np.ndarray:
        if self.n == 0:
            raise InvalidParameter("reports", "no mean reports")
        return self.config.padded_dim * self.sums / self.n

    def estimate(self) -> np.ndarray:
        """``x_hat = U^{-1} z_hat`` in the original coordinates."""
        return self.config.rotation.inverse(self.rotated_estimate())

    def variance(self) -> np.ndarray:
        """Exact per-coordinate variance of :meth:`estimate` (original coordinates)."""
        dim = self.config.dim
        return (self.a_total - self.w_squared[:dim]) / self.n**2

    def projected_mean(self) -> np.ndarray:
        """Mean of ``U^T y~_i`` (what the estimator is unbiased for), original coordinates."""
        return self.w_sum[: self.config.dim] / self.n


def theorem2_mse_bound(config: VectorMeanConfig, n: int, mean_sq_norm: float) -> float:
    """Theorem 2's error as its proof (Appendix B) evaluates it, for comparison:
    ``(D^2 var_noise + (D - 1) mean ||y~_i||^2) / n`` with the paper's noise variance for a
    range of width ``6 tau'`` at ``eps0/2`` (:func:`paper_noise_variance`)."""
    var = paper_noise_variance(config.range_params().tau, config.epsilon0, config.noise, config.delta0)
    dim = config.padded_dim
    return (dim**2 * var + (dim - 1) * mean_sq_norm) / n


@dataclass(frozen=True)
class VectorMeanOutcome:
    """Algorithm 5's result: the announced per-coordinate ranges and the estimate (original coordinates)."""

    ranges: np.ndarray
    estimate: np.ndarray
    reports: int
    #: Per rotated coordinate, the sum of decoded mean reports (what the estimate scales and rotates back).
    rotated_sums: np.ndarray
    #: The analyzer's check of the range round, per coordinate (a warning: some range may hold no user).
    range_check: CoordinateRangeCheck | None = None


class VectorMeanProtocol(Protocol):
    """Algorithm 5 as rounds: the vector range round at ``eps0/2`` (sampled or paper mode), then the
    vector mean round at ``eps0/2`` (plus ``delta0`` for Gaussian noise) over the announced ranges.
    With a single range bin the range round is skipped (:attr:`VectorMeanConfig.range_round`)."""

    name = "vector-mean"
    data_rank = 2

    def __init__(self, config: VectorMeanConfig) -> None:
        self.config = config

    @property
    def budget(self) -> tuple[float, float]:
        return self.config.epsilon0, self.config.delta0

    def rounds(self) -> Rounds:
        c = self.config
        check = None
        if c.range_round:
            scalar = c.range_params()
            range_params = VectorRangeParams(scalar.low, scalar.high, scalar.tau, c.dim, c.rotation_seed, c.mode)
            plan = RoundPlan(range_params, c.epsilon0 / 2.0, collect=lambda: VectorRangeAccumulator(c))
            ranges = collected(plan, (yield plan))
            announced = ranges.ranges()
            check = ranges.check()
        else:
            announced = np.tile([-c.rotated_bound, c.rotated_bound], (c.padded_dim, 1))
        mean_params = VectorMeanParams(
            c.dim, c.rotation_seed, tuple(announced[:, 0].tolist()), tuple(announced[:, 1].tolist()), c.noise, c.grid_levels
        )
        plan = RoundPlan(mean_params, c.mean_epsilon, c.delta0, collect=lambda: VectorMeanAccumulator(c, announced))
        accumulator = collected(plan, (yield plan))
        return VectorMeanOutcome(announced, accumulator.estimate(), accumulator.n, accumulator.sums, check)
