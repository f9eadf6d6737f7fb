"""The scalar range -> mean protocol (Girgis, Data & Diggavi 2022, Algorithm 1).

Round 1 (Algorithm 3/4): Hadamard-response range estimation at ``eps0 / 2``; the
analyzer announces ``[a_max - 3 tau, a_max + 3 tau]``.
Round 2 (Algorithm 2): every user reports its local mean projected onto that range,
with discrete noise at ``eps0 / 2`` (and ``delta0`` for Gaussian noise).

By basic composition the user-level local guarantee is ``(eps0, delta0)``
(Theorem 1). This module holds the protocol's logic on arrays, shared by the
vectorized simulation and the networked coordinator.

Concentration radius. For i.i.d. samples that are sub-Gaussian with variance proxy
``sigma^2`` (``E exp(s X) <= exp(s^2 sigma^2 / 2)``), a local mean of ``m`` samples has
``P(|y - mu| > t) <= 2 exp(-m t^2 / (2 sigma^2))``; a union bound over ``n`` users
gives radius ``tau = sigma sqrt(2 log(2n / gamma) / m)`` with probability
``>= 1 - gamma``. The paper states ``sigma sqrt(log(2n/gamma)/m)`` (Theorem 1),
which is missing the factor 2 under this definition and so can under-cover;
:func:`concentration_radius` uses the corrected form (tested in
``tests/test_scalar_mean.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import partial

import numpy as np

from shuffledp.analyzer.decoders import (
    HadamardRowCollector,
    MeanEstimate,
    RangeEstimate,
    announce_range,
    hadamard_frequencies,
    mean_from_reports,
)
from shuffledp.analyzer.protocols import Collector, Protocol, RoundPlan, Rounds, collected
from shuffledp.analyzer.range_check import RangeCheck, check_range_round
from shuffledp.analyzer.robust import RobustOptions, RobustSummary, robust_mean_round, robust_range_round
from shuffledp.client.mean_randomizer import decode_values
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.wire.messages import HadamardRangeParams, ProjectedMeanParams, check_local_budget


def concentration_radius(proxy_sigma: float, n: int, m: int, gamma: float) -> float:
    """``sigma sqrt(2 log(2n/gamma) / m)``: all n local means within it of the mean w.p. ``>= 1 - gamma``."""
    if not (proxy_sigma > 0 and n >= 1 and m >= 1 and 0 < gamma < 1):
        raise InvalidParameter("proxy_sigma, n, m, gamma", "need sigma > 0, n >= 1, m >= 1, 0 < gamma < 1")
    return proxy_sigma * math.sqrt(2.0 * math.log(2.0 * n / gamma) / m)


@dataclass(frozen=True)
class ScalarMeanConfig:
    """Public parameters of Algorithm 1: data bound ``B``, radius ``tau``, local budget ``(eps0, delta0)``."""

    bound: float
    tau: float
    epsilon0: float
    delta0: float = 0.0
    noise: str = "laplace"
    grid_levels: int = 4096

    def __post_init__(self) -> None:
        if not (self.bound > 0 and math.isfinite(self.bound)):
            raise InvalidParameter("bound", f"must be finite and > 0, got {self.bound}")
        if not (0 < self.tau <= self.bound):
            raise InvalidParameter("tau", f"must be in (0, bound={self.bound}], got {self.tau}")
        check_local_budget(self.epsilon0, self.delta0, self.noise)

    @property
    def round_epsilon(self) -> float:
        """Each of the two rounds spends half the local budget (Algorithm 1)."""
        return self.epsilon0 / 2.0

    def range_params(self) -> HadamardRangeParams:
        return HadamardRangeParams(-self.bound, self.bound, self.tau)

    def mean_params(self, found: RangeEstimate) -> ProjectedMeanParams:
        return ProjectedMeanParams(found.lower, found.upper, self.noise, self.grid_levels)


def estimate_range(rows: np.ndarray, bits: np.ndarray, config: ScalarMeanConfig) -> RangeEstimate:
    """Round 1 decoding: Hadamard frequencies by one FWHT, then the announced range."""
    params = config.range_params()
    freqs = hadamard_frequencies(rows, bits, params.padded_bins, config.round_epsilon)
    return announce_range(freqs, params)


def estimate_mean(grid_values: np.ndarray, params: ProjectedMeanParams) -> MeanEstimate:
    """Round 2 decoding: the average of the decoded reports (Algorithm 1 step 5)."""
    return mean_from_reports(decode_values(grid_values, params))


def paper_noise_variance(tau: float, epsilon0: float, noise: str, delta0: float = 0.0) -> float:
    """The paper's noise variance for a range of width ``6 tau`` at budget ``eps0/2``.

    Gaussian (Algorithm 2): ``12 (6 tau)^2 log(1.25/delta) / eps0^2 = 432 tau^2 log(1.25/delta)/eps0^2``.
    Laplace (Remark 3): ``Lap(12 tau/eps0)`` has variance ``288 tau^2 / eps0^2``.
    """
    if noise == "gaussian":
        return 432.0 * tau**2 * math.log(1.25 / delta0) / epsilon0**2
    return 288.0 * tau**2 / epsilon0**2


def theorem1_mse_bound(config: ScalarMeanConfig, n: int) -> float:
    """The noise term of Theorem 1 as its proof evaluates it, for comparison:
    :func:`paper_noise_variance` over n. It holds on the event that the range round
    succeeds (probability ``1 - beta``)."""
    return paper_noise_variance(config.tau, config.epsilon0, config.noise, config.delta0) / n


@dataclass(frozen=True)
class ScalarMeanOutcome:
    """Algorithm 1's result: the range round 1 found, the analyzer's check of that round
    (:mod:`~shuffledp.analyzer.range_check`, from both rounds: ``untrusted`` means the range may
    hold none of the users and the estimate be far off), and round 2's mean over the range."""

    found_range: RangeEstimate
    mean: MeanEstimate
    mean_params: ProjectedMeanParams
    range_check: RangeCheck | None = None
    #: Set only with ``ScalarMeanProtocol(config, robust=...)`` (``analyzer/robust.py``).
    robust: RobustSummary | None = None


class HadamardRangeCollector(HadamardRowCollector):
    """Round 1's sufficient statistics (:class:`~shuffledp.analyzer.decoders.HadamardRowCollector`
    over the range's Hadamard rows). :meth:`estimate` is :func:`estimate_range` of the same reports
    to the last bit."""

    def __init__(self, config: ScalarMeanConfig) -> None:
        super().__init__(config.range_params().padded_bins, config.round_epsilon)
        self.config = config

    def estimate(self) -> RangeEstimate:
        """The announced range (:func:`estimate_range`): one FWHT of the histogram, then the arg-max bin."""
        return announce_range(self.frequencies(), self.config.range_params())


def _exact_sum(values: np.ndarray, counts: np.ndarray) -> float:
    """``sum_u counts[u] * values[u]`` computed exactly, then rounded once (half to even): the same
    float as ``math.fsum`` of the multiset, which is also the correctly rounded exact sum."""
    by_denominator: dict[int, int] = {}
    for value, count in zip(values.tolist(), counts.tolist()):
        numerator, denominator = value.as_integer_ratio()  # a power of two
        by_denominator[denominator] = by_denominator.get(denominator, 0) + numerator * count
    return float(sum((Fraction(p, q) for q, p in by_denominator.items()), Fraction(0)))


class GridValueCollector(Collector):
    """Round 2's sufficient statistics: the histogram of the reported grid integers (each
    distinct value and its int64 count), i.e. the multiset of reports, whatever their order.

    :meth:`estimate` is :func:`estimate_mean` of the same reports to the last bit: each
    distinct value is decoded and its deviation squared by the same float operations, and
    both sums are exact before their one rounding, as ``math.fsum`` is. Merging adds counts."""

    def __init__(self, params: ProjectedMeanParams) -> None:
        self.params = params
        self.values = np.zeros(0, dtype=np.int64)
        self.counts = np.zeros(0, dtype=np.int64)

    def _fold(self, values: np.ndarray, counts: np.ndarray) -> None:
        distinct, where = np.unique(np.concatenate([self.values, values]), return_inverse=True)
        total = np.zeros(len(distinct), dtype=np.int64)
        np.add.at(total, where, np.concatenate([self.counts, counts]))
        self.values, self.counts = distinct, total

    def add_rows(self, rows: np.ndarray) -> None:
        """Fold in ``projected-mean`` report rows ``(grid value,)``."""
        values, counts = np.unique(np.asarray(rows, dtype=np.int64)[:, 0], return_counts=True)
        self._fold(values, counts.astype(np.int64))

    def merge(self, other: Collector) -> "GridValueCollector":
        if not isinstance(other, GridValueCollector):
            raise InvalidParameter("other", f"cannot merge a {type(other).__name__} into a GridValueCollector")
        self._fold(other.values, other.counts)
        return self

    def __len__(self) -> int:
        return int(self.counts.sum())

    def grid_values(self) -> np.ndarray:
        """The reported grid integers, sorted (the multiset, for decoders that need every report)."""
        return np.repeat(self.values, self.counts)

    def estimate(self) -> MeanEstimate:
        """:func:`estimate_mean` of the reports (:func:`~shuffledp.analyzer.decoders.mean_from_reports`)."""
        n = len(self)
        if n < 2:
            raise InvalidParameter("values", f"need at least 2 reports, got {n}")
        decoded = decode_values(self.values, self.params)
        mean = _exact_sum(decoded, self.counts) / n
        variance = _exact_sum((decoded - mean) ** 2, self.counts) / (n - 1)
        return MeanEstimate(mean, math.sqrt(variance) / math.sqrt(n), n)


class ScalarMeanProtocol(Protocol):
    """Algorithm 1 (Girgis, Data & Diggavi 2022): Hadamard range round at ``eps0/2``, then
    the projected mean round at ``eps0/2`` (plus ``delta0`` for Gaussian noise) over the
    range the first round announced.

    ``robust`` (default off): the analyzer's robust decoding against corrupted users
    (``analyzer/robust.py``), post-processing of the same reports, so no privacy cost."""

    name = "mean"

    def __init__(self, config: ScalarMeanConfig, robust: RobustOptions | None = None) -> None:
        self.config = config
        self.robust = robust

    @property
    def budget(self) -> tuple[float, float]:
        return self.config.epsilon0, self.config.delta0

    def rounds(self) -> Rounds:
        config = self.config
        range_plan = RoundPlan(config.range_params(), config.round_epsilon, collect=partial(HadamardRangeCollector, config))
        first = collected(range_plan, (yield range_plan))
        found = first.estimate()
        check = check_range_round(found.frequencies, found.bin, len(first), config.round_epsilon)
        if self.robust is not None:
            found = robust_range_round(found, config.range_params(), len(first), config.round_epsilon, self.robust)
        mean_params = config.mean_params(found)
        mean_plan = RoundPlan(mean_params, config.round_epsilon, config.delta0, collect=partial(GridValueCollector, mean_params))
        second = collected(mean_plan, (yield mean_plan))
        # The verdict uses both rounds: a range holding no user clips every report to one end.
        check = check.with_mean_round(second.values, second.counts, mean_params, config.round_epsilon, config.delta0)
        if self.robust is not None:
            mean, summary = robust_mean_round(second.grid_values(), found, mean_params, config.round_epsilon, self.robust, len(first))
            return ScalarMeanOutcome(found, mean, mean_params, check, summary)
        return ScalarMeanOutcome(found, second.estimate(), mean_params, check)
