"""Did the range round find the users? The analyzer's own check, from what it sees.

The range round (Girgis, Data & Diggavi 2022, Algorithm 3/4) announces the arg-max
bin of ``K`` Hadamard-response frequency estimates. With few users, a wide domain
(many bins) and a small budget, the arg-max can be an *empty* bin that noise pushed
to the top; the mean round then projects every user onto a range that holds none of
them, and the estimate is off by hundreds of standard errors while its standard
error looks normal. Nothing downstream can see it, so the analyzer judges the range
round itself.

**The test.** One user's contribution to the estimate of bin ``a`` is
``c b_i H[j_i, a] / n`` with ``c = coth(eps/2)`` (:func:`~shuffledp.analyzer.decoders.hadamard_scale`):
independent, bounded in ``[-c/n, c/n]``, and of mean ``f[a] / n``. For a bin holding no
user (``f[a] = 0``), Hoeffding's inequality gives ``P(fhat[a] >= t) <= exp(-n t^2 / (2 c^2))``,
and a union bound over the ``K`` bins covers the arg-max's selection:

    P(some empty bin has fhat >= t) <= K exp(-n t^2 / (2 c^2)).

So with ``t_alpha = c sqrt(2 ln(K / alpha) / n)``, an announced bin with ``fhat < t_alpha``
is *not* shown to hold anyone, and the analyzer warns; an empty bin passes the test
with probability at most ``alpha`` (a rigorous bound on *missed* failures, whatever
the data). The price is false warnings when a real bin's estimate is small: the test
is one-sided on purpose.

**The a-priori requirement.** With every user in one bin (``f = 1``), the true bin's
estimate exceeds ``1 - t`` and every empty bin's stays below ``t``, except with
probability ``(K + 1) exp(-n t^2 / (2 c^2))``; the arg-max is right once ``t < 1/2``,
which needs ``n >= 8 c^2 ln((K + 1) / beta)`` users (:func:`users_needed`): the
``c^2 log K`` scaling of the paper's Theorem 1, with its constant made explicit. Users
split over two neighbouring bins (``f >= 1/2`` in one) need four times as many.

Both are reported with the estimate, in the human output and the JSON;
``tests/analyzer/test_range_check.py`` checks the missed-failure rate and the warnings on runs
that fail, and ``benchmarks/bench_range_check.py`` measures both rates over many seeds.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from shuffledp.analyzer.decoders import hadamard_scale
from shuffledp.protocol.errors import InvalidParameter

#: Probability that an empty announced bin passes the check (missed failures).
DEFAULT_ALPHA = 0.01
#: Failure probability of the a-priori requirement.
DEFAULT_BETA = 0.01


def _check(epsilon: float, bins: int, n: int, level: float, name: str) -> None:
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise InvalidParameter("epsilon", f"must be finite and > 0, got {epsilon!r}")
    if not (isinstance(bins, (int, np.integer)) and bins >= 1):
        raise InvalidParameter("bins", f"must be an integer >= 1, got {bins!r}")
    if not (isinstance(n, (int, np.integer)) and n >= 1):
        raise InvalidParameter("n", f"must be an integer >= 1, got {n!r}")
    if not 0 < level < 1:
        raise InvalidParameter(name, f"must be in (0, 1), got {level!r}")


def detection_threshold(epsilon: float, bins: int, n: int, alpha: float = DEFAULT_ALPHA) -> float:
    """``t_alpha = c sqrt(2 ln(K / alpha) / n)``: an empty bin's estimate reaches it with probability <= alpha."""
    _check(epsilon, bins, n, alpha, "alpha")
    return hadamard_scale(epsilon) * math.sqrt(2.0 * math.log(bins / alpha) / n)


def users_needed(epsilon: float, bins: int, beta: float = DEFAULT_BETA) -> int:
    """``8 c^2 ln((K + 1) / beta)``: users for which the arg-max finds a bin holding all of them w.p. >= 1 - beta."""
    _check(epsilon, bins, 1, beta, "beta")
    return math.ceil(8.0 * hadamard_scale(epsilon) ** 2 * math.log((bins + 1) / beta))


@dataclass(frozen=True)
class RangeCheck:
    """The analyzer's verdict on one range round (see the module docstring)."""

    #: ``ok``: the announced bin is shown to hold users; ``warning``: it is not.
    status: str
    #: The announced bin's frequency estimate, and the threshold it had to reach.
    announced_frequency: float
    threshold: float
    #: Users in the round, and users the round needs (all in one bin, failure probability beta).
    users: int
    users_needed: int
    alpha: float
    beta: float
    reasons: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["reasons"] = list(self.reasons)
        return out


def check_range_round(
    frequencies: np.ndarray,
    announced_bin: int,
    n: int,
    epsilon: float,
    *,
    alpha: float = DEFAULT_ALPHA,
    beta: float = DEFAULT_BETA,
) -> RangeCheck:
    """Judge one range round from its ``K`` frequency estimates, the bin it announced, its ``n`` reports and
    their ``epsilon`` (the round's budget per report)."""
    freqs = np.asarray(frequencies, dtype=np.float64)
    bins = int(freqs.size)
    _check(epsilon, max(bins, 1), n, alpha, "alpha")
    if bins == 0 or not 0 <= announced_bin < bins:
        raise InvalidParameter("announced_bin", f"must index the {bins} frequencies, got {announced_bin!r}")
    threshold = detection_threshold(epsilon, bins, int(n), alpha)
    needed = users_needed(epsilon, bins, beta)
    announced = float(freqs[announced_bin])
    reasons = []
    if announced < threshold:
        reasons.append(
            f"the announced bin is not shown to hold any user (its estimate {announced:.3f} is below what an empty "
            f"bin reaches with probability {alpha:g}); the range may hold none of them and the estimate be far off"
        )
    if n < needed:
        reasons.append(f"n = {n:,} is below the {needed:,} users a range round over {bins} bins needs at this epsilon")
    status = "warning" if announced < threshold else "ok"
    return RangeCheck(status, announced, threshold, int(n), needed, alpha, beta, tuple(reasons))


@dataclass(frozen=True)
class CoordinateRangeCheck:
    """The check of a vector range round: one :class:`RangeCheck` per rotated coordinate, each at
    ``alpha / D`` (Bonferroni), so an empty announced bin passes in *some* coordinate with
    probability at most ``alpha``."""

    status: str
    coordinates: int
    warned: tuple[int, ...]
    checks: tuple[RangeCheck, ...] = field(repr=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def as_dict(self) -> dict[str, Any]:
        lowest = min(self.checks, key=lambda c: c.announced_frequency - c.threshold)
        return {
            "status": self.status,
            "coordinates": self.coordinates,
            "warned_coordinates": list(self.warned),
            "alpha": lowest.alpha * self.coordinates,
            "fewest_reports": min(c.users for c in self.checks),
            "users_needed": lowest.users_needed,
            "smallest_margin": lowest.announced_frequency - lowest.threshold,
        }


def check_coordinate_ranges(
    frequencies: np.ndarray, announced_bins: np.ndarray, reports: np.ndarray, epsilon: float,
    *, alpha: float = DEFAULT_ALPHA, beta: float = DEFAULT_BETA,
) -> CoordinateRangeCheck:
    """:func:`check_range_round` for every coordinate of a ``(D, K)`` vector range round (``reports``
    per coordinate, each at ``epsilon``), at ``alpha / D`` and ``beta / D`` each."""
    freqs = np.asarray(frequencies, dtype=np.float64)
    dim = freqs.shape[0]
    checks = tuple(
        check_range_round(freqs[j], int(announced_bins[j]), int(reports[j]), epsilon, alpha=alpha / dim, beta=beta / dim)
        for j in range(dim)
    )
    warned = tuple(j for j, c in enumerate(checks) if not c.ok)
    return CoordinateRangeCheck("warning" if warned else "ok", dim, warned, checks)


def format_range_check(check: dict[str, Any]) -> str:
    """One line for a :meth:`RangeCheck.as_dict`, then one ``!`` line per reason (the CLIs' output)."""
    if "coordinates" in check:
        head = "OK" if check["status"] == "ok" else "WARNING"
        line = (f"{head}: {len(check['warned_coordinates'])} of {check['coordinates']} coordinates' announced bins not "
                f"shown to hold users (alpha {check['alpha']:g} overall); fewest reports per coordinate "
                f"{check['fewest_reports']:,}, {check['users_needed']:,} needed")
        return line if check["status"] == "ok" else line + "\n      ! those coordinates' ranges may hold none of the users"
    line = (f"{'OK' if check['status'] == 'ok' else 'WARNING'}: announced bin's estimate "
            f"{check['announced_frequency']:.3f} vs {check['threshold']:.3f} needed; "
            f"n = {check['users']:,}, {check['users_needed']:,} needed")
    return line + "".join(f"\n      ! {reason}" for reason in check["reasons"])


__all__ = ["DEFAULT_ALPHA", "DEFAULT_BETA", "CoordinateRangeCheck", "RangeCheck", "check_coordinate_ranges", "check_range_round", "detection_threshold", "format_range_check", "users_needed"]
