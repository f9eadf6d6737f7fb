"""The fewest false warnings any valid range check can give: a Neyman–Pearson computation.

The analyzer's two-round verdict (:mod:`shuffledp.analyzer.range_check`) must keep
``P(the range holds no user AND it is reported trusted) <= alpha`` for *every* set of users
whose local means span less than the range's width. This module bounds, by Monte Carlo, the
false-warning rate of *every* verdict with that guarantee, so a study can print what is
impossible at a given ``n`` next to what the analyzer achieves.

**The bound.** Restrict the users to one point: all at ``x_a = centre(a) + delta`` for a bin ``a``
(``delta``: the population mean's offset in its own bin), and draw ``a`` uniformly over the ``K``
bins. One run's observation ``O`` is round 1's reports (rows and signs) and round 2's reports over
the range announced from them (bin ``a'``, the arg-max). Let ``mu_1`` be the law of ``O`` on the
event "the range holds the users" (``|a - a'| <= 1``) and ``mu_0`` its law on "it holds none"
(``|a - a'| >= 2``; the users are then clipped to one end), both averaged over ``a``. A valid verdict
``phi`` has ``mu_0(phi trusts) <= alpha`` (it holds for every ``a``, so for the average), hence by the
Neyman–Pearson lemma ``mu_1(phi trusts) <= mu_1(Lambda > k)``, where ``Lambda = log d mu_1 / d mu_0``
and ``mu_0(Lambda > k) = alpha``. The false-warning rate averaged over where the users are is then at
least ``mu_1(Lambda <= k)``: that is the limit. Telling the verdict that the users sit at one point
at offset ``delta`` only helps it, so the limit binds the analyzer's verdict too.

**Spread users.** Users at one point make "the range holds none of them" easy to refute: they must
then be in one other bin, whose count would stand out. A valid verdict must also hold for users
spread over neighbouring bins (span below ``6 tau``), so with ``spread = 3`` the null is instead
every user drawn independently and uniformly from bins ``b, b + 1, b + 2`` (span ``4 tau``; each draw
is a configuration the guarantee covers, so a valid verdict's level holds for their mixture), ``b``
uniform over the ``K - 2`` windows; a window wholly beyond the range clips the users to that end.
A report's likelihood is then ``(1/K') ((1 - p) + (2p - 1) m / 3)`` with ``m`` the number of the three
columns its sign agrees with; the sum of its log over the reports is a cubic in ``m`` whose terms
``sum_i m_i``, ``sum_i C(m_i, 2)``, ``sum_i C(m_i, 3)`` come from the FWHT of the signed and of the
unsigned row histograms (``H[j, x] H[j, y] = H[j, x xor y]``). The runs are still drawn from the
one-point alternative, and each run's ``mu_0``-weight is the ratio of the two mixtures' densities.
The limit is valid with either null; the spread one is the tighter where the users' own bin would
otherwise give them away.

Both likelihoods are exact. Round 1: with every user in bin ``a``, a report ``(j, b)`` has
probability ``p / K`` or ``(1 - p) / K`` as ``b`` agrees with ``H[j, a]`` or not, so the reports'
likelihood is ``const * exp(eps S_a / 2)`` with ``S_a = sum_i b_i H[j_i, a]`` (one FWHT gives all ``K``).
Round 2: users at grid position ``u`` (``floor(u)`` or ``floor(u) + 1`` by unbiased rounding) plus the
public integer noise; a bin beyond the range puts them at ``0`` or ``G`` exactly. Since every
``a`` is either near ``a'`` or not, ``mu_0 + mu_1`` is the law the runs are drawn from, so
``mu_1``-weights are ``sigmoid(Lambda)`` and ``mu_0``-weights ``sigmoid(-Lambda)`` (importance
sampling without a second simulation); ``k`` is the smallest threshold whose estimated ``mu_0`` mass
is at most ``alpha``. The reports are drawn by the real randomizers
(:func:`~shuffledp.client.range_randomizer.hadamard_response`,
:func:`~shuffledp.client.mean_randomizer.randomize_mean`); the clamp of a mean report to its
range (probability below ``2**-40`` per report) is left out of the likelihood.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from shuffledp.protocol.errors import InvalidParameter

Progress = Callable[[str, int], None]


@dataclass(frozen=True)
class NeymanPearsonLimit:
    """The Monte Carlo estimate of the smallest false-warning rate a valid verdict can have."""

    runs: int
    #: Runs whose announced range held the users, and those the best valid test must still distrust.
    held: int
    must_warn: int
    alpha: float
    #: ``log d mu_1 / d mu_0`` the best test needs (its threshold ``k``).
    threshold: float
    #: The null's users: at one point (1) or spread over three neighbouring bins (3).
    spread: int = 1
    #: The estimated total mass of ``mu_0`` (for ``spread = 1``: the chance the range holds none of the
    #: users, which the runs also count directly as ``runs - held``).
    null_mass: float = 0.0

    def rate(self) -> tuple[float, float, float]:
        """``(rate, low, high)``: ``must_warn / runs`` and its Clopper–Pearson 95 % interval (``k`` held fixed)."""
        from shuffledp.audit.local import clopper_pearson

        low, high = clopper_pearson(self.must_warn, self.runs, 0.95)
        return self.must_warn / self.runs, low, high

    def as_dict(self) -> dict[str, Any]:
        rate, low, high = self.rate()
        return {"runs": self.runs, "held": self.held, "must_warn": self.must_warn, "alpha": self.alpha,
                "threshold": self.threshold, "spread": self.spread, "null_mass": self.null_mass, "must_warn_rate": {"rate": rate, "ci95": [low, high]}}


def _log_noise(params: Any, epsilon: float, delta: float) -> Callable[[np.ndarray], np.ndarray]:
    """The noise's log-probability up to a constant: ``-|k| / s`` (discrete Laplace), ``-k^2 / (2 sigma^2)``."""
    from shuffledp.client.mean_randomizer import gaussian_sigma2, laplace_scale

    if params.noise == "laplace":
        scale = float(laplace_scale(params, epsilon))
        return lambda k: -np.abs(k) / scale
    sigma2 = float(gaussian_sigma2(params, epsilon, delta))
    return lambda k: -(k.astype(np.float64) ** 2) / (2.0 * sigma2)


def _log_likelihood(values: np.ndarray, counts: np.ndarray, position: float, log_noise) -> float:
    """Round 2's log-likelihood (up to the constant shared by every position) for users all at ``position``."""
    whole = math.floor(position)
    frac = position - whole
    low = log_noise(values - whole)
    if frac <= 0.0:
        return float(np.dot(counts, low))
    high = log_noise(values - whole - 1)
    return float(np.dot(counts, np.logaddexp(math.log1p(-frac) + low, math.log(frac) + high)))


def _spread_log_likelihoods(signed: np.ndarray, unsigned: np.ndarray, n: int, bins: int, keep: float) -> np.ndarray:
    """``log P(round 1 | users uniform over bins b, b+1, b+2)`` for every window ``b`` in ``[0, bins - 2)``, up to
    the ``-n log K'`` every hypothesis shares. ``signed``/``unsigned``: FWHT of the signed and unsigned row
    histograms over all ``K'`` columns."""
    g = [math.log((1.0 - keep) + (2.0 * keep - 1.0) * m / 3.0) for m in range(4)]
    d1, d2, d3 = g[1] - g[0], g[2] - 2 * g[1] + g[0], g[3] - 3 * g[2] + 3 * g[1] - g[0]
    x = np.arange(bins - 2)
    cols = (x, x + 1, x + 2)
    ones = sum((n + signed[c]) / 2.0 for c in cols)
    pairs = sum((n + signed[a] + signed[b] + unsigned[a ^ b]) / 4.0 for a, b in ((cols[0], cols[1]), (cols[0], cols[2]),
                                                                                 (cols[1], cols[2])))
    a, b, c = cols
    triples = (n + signed[a] + signed[b] + signed[c] + unsigned[a ^ b] + unsigned[a ^ c] + unsigned[b ^ c]
               + signed[a ^ b ^ c]) / 8.0
    return n * g[0] + d1 * ones + d2 * pairs + d3 * triples


def neyman_pearson_limit(config, runs: int, first_seed: int = 0, alpha: float | None = None,
                         progress: Progress | None = None, spread: int = 1) -> NeymanPearsonLimit:
    """Estimate the limit (module docstring) for a :class:`~shuffledp.simulation.SimulationConfig`'s
    protocol and population mean, over ``runs`` Monte Carlo runs; ``spread``: 1 (null users at one
    point) or 3 (spread over three neighbouring bins)."""
    from shuffledp.analyzer.range_check import TRUST_ALPHA
    from shuffledp.analyzer.decoders import signed_row_histogram
    from shuffledp.client.mean_randomizer import randomize_mean
    from shuffledp.client.range_randomizer import bin_index, hadamard_response
    from shuffledp.protocol.mechanisms.hadamard import fwht
    from shuffledp.protocol.mechanisms.randomness import SeededSource
    from shuffledp.protocol.wire.messages import ProjectedMeanParams

    if not (isinstance(runs, int) and runs >= 1):
        raise InvalidParameter("runs", f"must be an integer >= 1, got {runs!r}")
    if spread not in (1, 3):
        raise InvalidParameter("spread", f"must be 1 or 3, got {spread!r}")
    level = TRUST_ALPHA if alpha is None else alpha
    protocol = config.protocol_config()
    ranges = protocol.range_params()
    bins, padded, tau = ranges.num_bins, ranges.padded_bins, ranges.tau
    epsilon, delta, n = protocol.round_epsilon, protocol.delta0, config.n
    mean = float(config.population.mu)
    home = int(bin_index(np.array([mean]), ranges)[0])
    offset = mean - ranges.bin_center(home)
    scores, held, null_weight = np.empty(runs), np.zeros(runs, dtype=bool), np.empty(runs)
    keep = 1.0 / (1.0 + math.exp(-epsilon))
    for r in range(runs):
        source = SeededSource(first_seed + r)
        users_bin = int(source.integers(bins, 1)[0])
        rows, bits = hadamard_response(np.full(n, users_bin, dtype=np.int64), padded, epsilon, source)
        signed = fwht(signed_row_histogram(rows, bits, padded))
        sums = signed[:bins]
        announced = int(np.argmax(sums))
        centre = ranges.bin_center(announced)
        params = ProjectedMeanParams(centre - 3 * tau, centre + 3 * tau, protocol.noise, protocol.grid_levels)
        reports = randomize_mean(np.full(n, ranges.bin_center(users_bin) + offset), params, epsilon, source, delta)
        values, counts = np.unique(reports, return_counts=True)
        log_noise = _log_noise(params, epsilon, delta)
        grid = params.grid_levels

        def position(a: int) -> float:
            return min(max((ranges.bin_center(a) + offset - params.lower) / params.step, 0.0), float(grid))

        near = [a for a in (announced - 1, announced, announced + 1) if 0 <= a < bins]
        # One-point likelihoods, up to -n log K': n log(1 - p) + eps (n + S_a) / 2.
        point = n * math.log1p(-keep) + epsilon * (n + sums) / 2.0
        top, bottom = _log_likelihood(values, counts, float(grid), log_noise), _log_likelihood(values, counts, 0.0, log_noise)
        numerator = np.logaddexp.reduce([point[a] + _log_likelihood(values, counts, position(a), log_noise) for a in near])
        parts = []
        if announced + 2 < bins:
            parts.append(np.logaddexp.reduce(point[announced + 2:]) + top)
        if announced - 2 >= 0:
            parts.append(np.logaddexp.reduce(point[:announced - 1]) + bottom)
        beyond = np.logaddexp.reduce(parts) if parts else -math.inf
        drawn = np.logaddexp(numerator, beyond) - math.log(bins)  # the density the runs are drawn from
        if spread == 1:
            null = beyond - math.log(bins)
        else:
            unsigned = fwht(np.bincount(rows, minlength=padded).astype(np.float64))
            window = _spread_log_likelihoods(signed, unsigned, n, bins, keep)
            parts = []  # windows wholly above a' + 1, or wholly below a' - 1
            if announced + 2 < bins - 2:
                parts.append(np.logaddexp.reduce(window[announced + 2:]) + top)
            if announced - 4 >= 0:
                parts.append(np.logaddexp.reduce(window[:announced - 3]) + bottom)
            null = (np.logaddexp.reduce(parts) if parts else -math.inf) - math.log(bins - 2)
        scores[r] = numerator - math.log(bins) - null
        null_weight[r] = math.exp(min(null - drawn, 700.0))
        held[r] = abs(users_bin - announced) <= 1
        if progress:
            progress("runs", 1)
    # mu_0's weight of a run is its density over the drawing one (sigmoid(-Lambda) for spread 1); the best
    # test trusts Lambda > k with mu_0 mass <= alpha.
    order = np.argsort(-scores)
    null_mass = np.cumsum(null_weight[order]) / runs
    trusted = int(np.searchsorted(null_mass, level, side="right"))  # the top `trusted` runs fit in alpha
    threshold = float(scores[order[trusted - 1]]) if trusted else math.inf
    is_trusted = np.zeros(runs, dtype=bool)
    is_trusted[order[:trusted]] = True
    return NeymanPearsonLimit(runs, int(held.sum()), int(np.sum(held & ~is_trusted)), level, threshold, spread,
                              float(null_weight.mean()))


__all__ = ["NeymanPearsonLimit", "neyman_pearson_limit"]
