"""Robust decoding for the scalar range -> mean protocol, against corrupted users.

Threat. A fraction ``f`` of the ``n`` users is corrupted: their reports are
*well-formed* (inside :func:`~shuffledp.client.mechanisms.report_ranges`, so the
analyzer accepts them) but chosen by an adversary who knows the data. Everything
here is **post-processing of the same reports**: the clients, their randomizers and
the round parameters are unchanged, so the options cost no privacy (Dwork & Roth
2014, Prop. 2.1); they change only what the analyzer computes. Off by default
(``ScalarMeanProtocol(config, robust=None)``).

**Range round: the guarded range.** In Hadamard response (Girgis, Data & Diggavi
2022, Alg. 3/4) a report adds ``c b H[j, a] / n`` to bin ``a``'s estimate, ``c =
coth(eps/2)``, so *any* report, honest or not, moves the gap between two bins'
estimates by at most ``2c/n``: a corrupted user weighs ``c`` honest ones (for eps/2 =
0.5, c = 4). With ``N_H[a]`` the honest users in bin ``a``, Hoeffding's inequality and a
union bound over the ``K`` bins (as in ``analyzer/range_check.py``, two-sided) give,
with probability at least ``1 - alpha``, for every bin,
``|fhat[a] - N_H[a]/n| <= t + c k/n`` where ``t = c sqrt(2 ln(2K/alpha)/n)`` and ``k`` is
the number of corrupted reports. Hence the honest users' mode ``a*`` satisfies
``fhat[a*] >= max_a fhat[a] - 2t - 2c k/n``, and

* :func:`guarded_range`: for an assumed ``f_max >= k/n``, the set
  ``S = {a : fhat[a] >= max fhat - 2t - 2c f_max}`` contains ``a*``; announcing the
  hull ``[min_S centre - 3 tau, max_S centre + 3 tau]`` keeps the honest mode's
  range (what the protocol's Theorem 1 relies on) under any attack with ``k <= f_max n``.
  When ``S`` is one bin the range is the plain one. The price of a far attacked bin
  in ``S`` is a wider range, hence proportionally more noise in the mean round.
* :func:`corruption_tolerance`: ``f_cert = (fhat_(1) - fhat_(2) - 2t) / (2c)`` from the
  observed top two estimates; if ``k/n <= f_cert`` the plain arg-max *is* the honest
  mode. This is the margin condition: the corrupted mass, weighted by ``2c``, must be
  below the gap between the top two estimates minus the noise bound ``2t``.

Merging adjacent bins after the fact (a coarser mode) does *not* help: the merged
estimate of ``w`` bins is a sum whose per-report range is ``w c / n`` (rows constant on
the block exist), so it multiplies an attacker's weight by ``w`` and the noise's
standard deviation by ``sqrt(w)``; it gains only when honest users straddle bins.

**Mean round: the median.** A mean report is ``v + N`` in grid units (``v`` in
``{0..G}`` after randomized rounding, ``N`` discrete Laplace of scale ``s = G/eps``),
and a corrupted report may be anything in ``[-B, G + B]`` with ``B ~ 28.4 s``
(:func:`~shuffledp.client.mean_randomizer.report_range`). The plain average therefore
moves by up to ``f (G + B)`` grid units, about ``f (b - a)(1 + 28.4 / eps)`` in the
data's units (:func:`plain_mean_shift`). The median moves far less:
with ``k`` corrupted among ``n`` reports, the sample median lies between the honest
order statistics of ranks ``j - k`` and ``j`` (deterministic), and
:func:`median_shift_bound` turns that into a finite-sample bound with probability
``1 - delta``: about ``s ln((1 - f)/(1 - 2f))`` grid units, ``~ s f`` for small f, i.e.
``f (b - a)/eps`` in the data's units, which is the order of the manipulation lower
bound for eps-LDP protocols (Cheu, Smith & Ullman, IEEE S&P 2021). With no corruption
the median of near-Laplace reports also has about half the mean's variance; its
price is a second-order bias ``eta`` from the spread of the honest values (see
:func:`median_shift_bound`). Esfandiari, Mirrokni & Narayanan (2022) tolerate up to
49 % corruption with a central curator; here the same fraction is tolerated
(``f < 1/2``), with an error that grows like ``ln(1/(1 - 2f))``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shuffledp.analyzer.decoders import MeanEstimate, RangeEstimate, hadamard_scale, mean_from_reports
from shuffledp.analyzer.range_check import DEFAULT_ALPHA
from shuffledp.client.mean_randomizer import decode_values, laplace_scale, report_range
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.wire.messages import HadamardRangeParams, ProjectedMeanParams


@dataclass(frozen=True)
class RobustOptions:
    """The analyzer's robust decoding of the scalar protocol (post-processing: no privacy cost).

    ``max_corrupted``: the fraction ``f_max`` the range round is guarded against
    (:func:`guarded_range`; 0 keeps the plain arg-max range). ``median``: decode the mean
    round by the median (:func:`median_estimate`). ``alpha``: failure probability of the
    range round's noise bound; ``delta``: of the median's stated bound."""

    max_corrupted: float = 0.0
    median: bool = True
    alpha: float = DEFAULT_ALPHA
    delta: float = 0.01

    def __post_init__(self) -> None:
        if not 0 <= self.max_corrupted < 0.5:
            raise InvalidParameter("max_corrupted", f"must be in [0, 0.5), got {self.max_corrupted!r}")
        for name in ("alpha", "delta"):
            if not 0 < getattr(self, name) < 1:
                raise InvalidParameter(name, f"must be in (0, 1), got {getattr(self, name)!r}")


@dataclass(frozen=True)
class RobustSummary:
    """What the robust decode states about its own run.

    ``tolerance``: :func:`corruption_tolerance` of the range round (the arg-max is the
    honest mode if at most this fraction is corrupted, w.p. >= 1 - alpha).
    ``candidate_bins``: the guarded set ``S`` (one bin: the plain range was kept).
    ``median_bound``: with ``max_corrupted`` of the reports corrupted, the median lies within
    ``[low, high]`` (data units) of the honest users' projected mean, w.p. >= 1 - delta
    (``None`` without the median or for Gaussian noise)."""

    options: RobustOptions
    tolerance: float
    candidate_bins: tuple[int, ...]
    median_bound: tuple[float, float] | None


def noise_radius(epsilon: float, bins: int, n: int, alpha: float = DEFAULT_ALPHA) -> float:
    """``t = c sqrt(2 ln(2K/alpha) / n)``: every one of ``K`` bins' estimates is within ``t`` of its mean
    (honest part, Hoeffding two-sided with a union bound) w.p. >= 1 - alpha."""
    if not (epsilon > 0 and bins >= 1 and n >= 1 and 0 < alpha < 1):
        raise InvalidParameter("epsilon, bins, n, alpha", "need epsilon > 0, bins >= 1, n >= 1, 0 < alpha < 1")
    return hadamard_scale(epsilon) * math.sqrt(2.0 * math.log(2.0 * bins / alpha) / n)


def corruption_tolerance(frequencies: np.ndarray, n: int, epsilon: float, alpha: float = DEFAULT_ALPHA) -> float:
    """``f_cert = (fhat_(1) - fhat_(2) - 2t) / (2c)`` (0 when negative): if at most ``f_cert n`` of the ``n``
    range reports are corrupted, the announced arg-max bin holds the most honest users, w.p. >= 1 - alpha
    (module docstring)."""
    freqs = np.sort(np.asarray(frequencies, dtype=np.float64))[::-1]
    if freqs.size < 2:
        return 0.5
    gap = float(freqs[0] - freqs[1]) - 2.0 * noise_radius(epsilon, freqs.size, n, alpha)
    return max(0.0, gap / (2.0 * hadamard_scale(epsilon)))


def candidate_bins(frequencies: np.ndarray, n: int, epsilon: float, max_corrupted: float, alpha: float = DEFAULT_ALPHA) -> np.ndarray:
    """``S = {a : fhat[a] >= max fhat - 2t - 2c f_max}``: holds the honest mode whenever at most
    ``max_corrupted`` of the reports are corrupted, w.p. >= 1 - alpha."""
    freqs = np.asarray(frequencies, dtype=np.float64)
    cut = freqs.max() - 2.0 * noise_radius(epsilon, freqs.size, n, alpha) - 2.0 * hadamard_scale(epsilon) * max_corrupted
    return np.flatnonzero(freqs >= cut)


def guarded_range(
    frequencies: np.ndarray, params: HadamardRangeParams, n: int, epsilon: float, max_corrupted: float,
    alpha: float = DEFAULT_ALPHA,
) -> RangeEstimate:
    """The hull of ``centre +- 3 tau`` over :func:`candidate_bins`: contains the honest mode's range
    ``[a* centre - 3 tau, a* centre + 3 tau]`` under any corruption of at most ``max_corrupted`` of the
    reports, w.p. >= 1 - alpha. ``bin`` stays the arg-max (what ``range_check`` judges)."""
    real = np.asarray(frequencies, dtype=np.float64)[: params.num_bins]
    bins = candidate_bins(real, n, epsilon, max_corrupted, alpha)
    low, high = params.bin_center(int(bins.min())), params.bin_center(int(bins.max()))
    return RangeEstimate(int(np.argmax(real)), (low + high) / 2.0, low - 3 * params.tau, high + 3 * params.tau, real)


def median_estimate(grid_values: np.ndarray, params: ProjectedMeanParams) -> MeanEstimate:
    """The median of the decoded mean reports, with an order-statistic standard error
    ``(X_(n/2 + sqrt(n)/2) - X_(n/2 - sqrt(n)/2)) / 2`` (the distribution-free 68 % interval's half-width)."""
    values = np.sort(np.asarray(grid_values, dtype=np.float64))
    n = values.size
    if n < 2:
        raise InvalidParameter("values", f"need at least 2 reports, got {n}")
    half = math.sqrt(n) / 2.0
    lo, hi = max(0, math.floor(n / 2 - half)), min(n - 1, math.ceil(n / 2 + half) - 1)
    step = float(params.upper - params.lower) / params.grid_levels
    center = float(decode_values(np.array([np.median(values)]), params)[0])
    return MeanEstimate(center, step * float(values[hi] - values[lo]) / 2.0, n)


def _laplace_quantile(p: float, scale: float) -> float:
    if not 0 < p < 1:
        return math.copysign(math.inf, p - 0.5)
    return scale * math.log(2.0 * p) if p <= 0.5 else -scale * math.log(2.0 * (1.0 - p))


def median_shift_bound(n: int, corrupted: int, scale: float, spread: float, delta: float = 0.01) -> tuple[float, float]:
    """Grid units: w.p. >= 1 - delta the median of ``n`` mean reports, ``corrupted`` of them arbitrary,
    minus the honest users' mean projected grid value ``m`` lies in the returned ``[low, high]``.

    Honest report ``R = V + N``: ``V`` the randomized rounding of the projected value (``E V = u``),
    ``N`` discrete Laplace of ``scale`` ``s``, clamped to the report range (monotone, harmless here).
    Steps: (1) the median lies between the honest order statistics of ranks ``j_lo - k`` and ``j_hi``
    (``j_lo = ceil(n/2)``, ``j_hi = floor(n/2) + 1``), whatever the corrupted values; (2) ``N`` is the
    difference of two geometric variables, the floors of two exponentials, so ``|N - L| < 1`` for a
    continuous Laplace ``L``; (3) the Laplace density is ``1/(2 s^2)``-Lipschitz, so the honest mixture's
    CDF is within ``eta = Var/(4 s^2)`` of ``Phi_L(x - m)``, ``Var <= ((spread + 2)/2)^2`` by
    Popoviciu (``spread``: max - min of the honest projected values, grid units); (4) Hoeffding at the
    two points, ``d = sqrt(ln(2/delta) / (2 n_h))``. Result: ``high = 1 + q_L(j_hi/n_h + eta + d)``,
    ``low = -1 + q_L((j_lo - k)/n_h - eta - d)`` (infinite when a level leaves (0, 1)).
    """
    if not (0 <= corrupted < n and scale > 0 and spread >= 0 and 0 < delta < 1):
        raise InvalidParameter("n, corrupted, scale, spread, delta", "need 0 <= corrupted < n, scale > 0, spread >= 0, 0 < delta < 1")
    honest = n - corrupted
    eta = (spread + 2.0) ** 2 / (16.0 * scale**2)
    d = math.sqrt(math.log(2.0 / delta) / (2.0 * honest))
    j_lo, j_hi = (n + 1) // 2, n // 2 + 1
    high = 1.0 + _laplace_quantile(j_hi / honest + eta + d, scale)
    low = -1.0 + _laplace_quantile((j_lo - corrupted) / honest - eta - d, scale)
    return low, high


def median_bound_for(params: ProjectedMeanParams, epsilon: float, n: int, fraction: float, delta: float = 0.01,
                     spread: float | None = None) -> tuple[float, float] | None:
    """:func:`median_shift_bound` in the data's units for a mean round at ``epsilon`` over ``params``'
    interval, ``floor(fraction n)`` corrupted reports; ``spread`` (data units) defaults to the whole
    interval. ``None`` for Gaussian noise (the bound above is derived for discrete Laplace)."""
    if params.noise != "laplace":
        return None
    step = (params.upper - params.lower) / params.grid_levels
    spread_grid = params.grid_levels if spread is None else min(params.grid_levels, spread / step)
    low, high = median_shift_bound(n, math.floor(fraction * n), float(laplace_scale(params, epsilon)), spread_grid, delta)
    return low * step, high * step


def plain_mean_shift(params: ProjectedMeanParams, epsilon: float, delta0: float, fraction: float,
                     replaced_mean: float) -> float:
    """The plain estimator's largest upward shift in expectation: a ``fraction`` of the users, whose
    projected values average ``replaced_mean`` (data units), each send the largest valid grid value
    ``G + B``: ``fraction * (lower + step (G + B) - replaced_mean)``."""
    high = report_range(params, epsilon, delta0)[1]
    step = (params.upper - params.lower) / params.grid_levels
    return fraction * (params.lower + step * high - replaced_mean)



def robust_range_round(found: RangeEstimate, params: HadamardRangeParams, n: int, epsilon: float,
                       options: RobustOptions) -> RangeEstimate:
    """Round 1 under ``options``: :func:`guarded_range` when ``max_corrupted > 0``, else the plain range."""
    if options.max_corrupted <= 0:
        return found
    return guarded_range(found.frequencies, params, n, epsilon, options.max_corrupted, options.alpha)


def robust_mean_round(grid_values: np.ndarray, found: RangeEstimate, params: ProjectedMeanParams, epsilon: float,
                      options: RobustOptions, range_reports: int) -> tuple[MeanEstimate, RobustSummary]:
    """Round 2 under ``options`` (the median, or the plain average) and the run's :class:`RobustSummary`."""
    values = np.asarray(grid_values)
    if options.median:
        mean = median_estimate(values, params)
        bound = median_bound_for(params, epsilon, values.size, options.max_corrupted, options.delta)
    else:
        mean = mean_from_reports(decode_values(values, params))
        bound = None
    tolerance = corruption_tolerance(found.frequencies, range_reports, epsilon, options.alpha)
    bins = candidate_bins(found.frequencies, range_reports, epsilon, options.max_corrupted, options.alpha)
    return mean, RobustSummary(options, tolerance, tuple(int(b) for b in bins), bound)

__all__ = [
    "RobustOptions", "RobustSummary", "candidate_bins", "corruption_tolerance", "guarded_range", "median_bound_for",
    "median_estimate", "median_shift_bound", "noise_radius", "plain_mean_shift", "robust_mean_round", "robust_range_round",
]
