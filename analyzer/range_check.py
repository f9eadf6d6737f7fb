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

**Both rounds: the verdict.** The frequency test alone must pay for the arg-max's
selection among ``K`` bins, so in hard regimes it cannot tell a real bin holding half the
users from noise, and it warns on many runs that are fine. The mean round adds independent
evidence. If the announced range holds no user, and the users do not straddle it (their
local means span less than its width ``6 tau``, which the concentration radius guarantees
with probability ``1 - gamma``), every user is projected to the *same end*: its grid value
is exactly ``0`` or exactly ``G``, so every report is that end plus the round's noise, whose
law is public. Then the number of reports strictly above ``G`` is exactly
``Binomial(n, p1)`` with ``p1 = P(noise >= 1)`` (the clamp to the report range moves no
report across ``G``), and likewise below ``0``. A range holding the users sees far fewer
reports beyond its ends, so the *sign test* :func:`clipping_p_value`,
``p_m = max(P[Bin(n, p1) <= #above G], P[Bin(n, p1) <= #below 0])`` (the larger of the two
ends: the null is composite), is small. For Laplace-like noise much wider than the range,
the sign test is the locally most powerful test of a location shift, about twice as
efficient as a test on the mean.

The range round's own evidence is ``p_f = min(1, K exp(-n fhat^2 / (2 c^2)))`` for the
announced bin's estimate ``fhat`` (:func:`range_p_value`): by the Hoeffding and union bound
above, ``P(p_f <= x) <= x`` whenever the announced bin is empty. Given round 1, the mean
round's noise is fresh, so ``p_m`` is super-uniform under that null too, and the product
of two independent super-uniform variables satisfies ``P(p_f p_m <= k) <= k (1 + ln(1/k))``
(``E min(1, k / p_f)``). The range is **trusted** when ``p_f p_m <= k`` with
``k (1 + ln(1/k)) = alpha`` (:func:`combined_threshold`), and **untrusted** otherwise.

*Guarantee: what is proven.* Let ``E`` be the event that the users' local means span less
than the range's width ``6 tau`` (the concentration radius gives ``P(not E) <= gamma`` when
``tau`` comes from the data model; a ``tau`` the user chose carries no such probability). On
``E`` and "the range holds no user", both p-values are super-uniform, so

    P(the range holds no user AND it is reported trusted)
        <= P(no user, trusted, E) + P(not E) <= alpha + gamma    (alpha = TRUST_ALPHA = 0.001).

This is a *joint* probability over runs, not the conditional probability that a range reported
trusted is empty (that can be larger, e.g. where empty ranges are common), and not a statement
about this run's data: the verdict is a test result, "trusted at level alpha + gamma" or "not
trusted". With a user-given ``tau`` the bound is ``alpha`` for data in ``E`` and nothing is
claimed otherwise. On ``E`` a trusted range that holds a user has every user within ``2 tau``
of it, so projection moves each user by at most ``2 tau``: the catastrophic failure (an
estimate hundreds of standard errors off with a normal-looking standard error) and a trusted
verdict occur together with probability at most ``alpha + gamma``.

The verdict is reported with the estimate, in the human output and the JSON;
``tests/analyzer/test_range_check.py`` checks the rates and the sign test's exact null, and
``benchmarks/bench_range_check.py`` measures silent misses and false warnings over many
seeds (``shuffledp simulate --seeds K`` for one regime).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from shuffledp.analyzer.decoders import hadamard_scale
from shuffledp.protocol.errors import InvalidParameter

#: Probability that an empty announced bin passes the check (missed failures).
DEFAULT_ALPHA = 0.01
#: Failure probability of the a-priori requirement.
DEFAULT_BETA = 0.01
#: The two-round verdict's level: P(the range holds no user AND it is reported trusted) <= TRUST_ALPHA + gamma.
TRUST_ALPHA = 0.001


def _check(epsilon: float, bins: int, n: int, level: float | None = None, name: str = "alpha") -> None:
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise InvalidParameter("epsilon", f"must be finite and > 0, got {epsilon!r}")
    if not (isinstance(bins, (int, np.integer)) and bins >= 1):
        raise InvalidParameter("bins", f"must be an integer >= 1, got {bins!r}")
    if not (isinstance(n, (int, np.integer)) and n >= 1):
        raise InvalidParameter("n", f"must be an integer >= 1, got {n!r}")
    if level is not None and not 0 < level < 1:
        raise InvalidParameter(name, f"must be in (0, 1), got {level!r}")


def detection_threshold(epsilon: float, bins: int, n: int, alpha: float = DEFAULT_ALPHA) -> float:
    """``t_alpha = c sqrt(2 ln(K / alpha) / n)``: an empty bin's estimate reaches it with probability <= alpha."""
    _check(epsilon, bins, n, alpha, "alpha")
    return hadamard_scale(epsilon) * math.sqrt(2.0 * math.log(bins / alpha) / n)


def users_needed(epsilon: float, bins: int, beta: float = DEFAULT_BETA) -> int:
    """``8 c^2 ln((K + 1) / beta)``: users for which the arg-max finds a bin holding all of them w.p. >= 1 - beta."""
    _check(epsilon, bins, 1, beta, "beta")
    return math.ceil(8.0 * hadamard_scale(epsilon) ** 2 * math.log((bins + 1) / beta))


def range_p_value(frequency: float, epsilon: float, bins: int, n: int) -> float:
    """``p_f = min(1, K exp(-n fhat^2 / (2 c^2)))``: ``P(p_f <= x) <= x`` when the announced bin is
    empty, whichever of the ``K`` bins the arg-max chose (Hoeffding and a union bound; module docstring)."""
    _check(epsilon, bins, n)
    if not frequency > 0:
        return 1.0
    scale = hadamard_scale(epsilon)
    return min(1.0, bins * math.exp(-n * frequency * frequency / (2.0 * scale * scale)))


def _noise_above_zero(params: Any, epsilon: float, delta: float) -> float:
    """``P(noise >= 1)`` of one mean report's integer noise (it is symmetric, so also ``P(noise <= -1)``).

    Discrete Laplace ``P(k) ∝ q^|k|``, ``q = exp(-1/s)``: ``q / (1 + q)``. Discrete Gaussian
    ``P(k) ∝ exp(-k^2 / (2 sigma^2))``: ``(1 - 1/Z) / 2`` with ``Z = sum_k exp(-k^2 / (2 sigma^2))``,
    which by Poisson summation is exactly ``sqrt(2 pi sigma^2) (1 + 2 sum_m exp(-2 pi^2 sigma^2 m^2))``."""
    from shuffledp.client.mean_randomizer import gaussian_sigma2, laplace_scale

    if params.noise == "laplace":
        q = math.exp(-1.0 / float(laplace_scale(params, epsilon)))
        return q / (1.0 + q)
    sigma2 = float(gaussian_sigma2(params, epsilon, delta))
    if sigma2 >= 1.0:
        normalizer = math.sqrt(2.0 * math.pi * sigma2) * (1.0 + 2.0 * sum(math.exp(-2.0 * math.pi**2 * sigma2 * m * m) for m in (1, 2, 3)))
    else:
        normalizer = sum(math.exp(-k * k / (2.0 * sigma2)) for k in range(-60, 61))
    return (1.0 - 1.0 / normalizer) / 2.0


def binomial_lower_tail(count: int, n: int, p: float) -> float:
    """``P(Binomial(n, p) <= count)``, an upper bound within a rounding margin; 1.0 from the mean ``n p`` up
    (a p-value may be rounded up without losing its guarantee).

    Below the mode the terms increase with ``i``, so the sum runs, in log space, over the window of
    the ``W`` terms just below ``count`` (``W`` = 40 standard deviations and more), and the terms
    left out below it are bounded by their number times the window's first term: memory and time
    stay small whatever ``n`` is."""
    if not (0 < p < 1 and 0 <= count <= n):
        raise InvalidParameter("count, n, p", f"need 0 <= count <= n and 0 < p < 1, got {count}, {n}, {p}")
    if count >= n * p:
        return 1.0
    width = min(count, int(40.0 * math.sqrt(n * p * (1.0 - p))) + 64)
    low = count - width
    i = np.arange(low, count + 1, dtype=np.float64)
    parts = (math.lgamma(n + 1), -math.lgamma(low + 1), -math.lgamma(n - low + 1), low * math.log(p), (n - low) * math.log1p(-p))
    log_first = math.fsum(parts)
    # Rounding in log space: each part is correct to a few ulps of its size, each of the window's
    # steps to a few ulps of log(n); a margin of 64 ulps of both bounds the error of every term.
    slack = math.expm1(64 * 2.3e-16 * (sum(abs(x) for x in parts) + width * (math.log(n + 1.0) + 2.0))) + 1e-12
    steps = np.log(n - i[:-1]) - np.log(i[1:]) + math.log(p) - math.log1p(-p)
    log_terms = log_first + np.concatenate([[0.0], np.cumsum(steps)])
    top = float(log_terms.max())
    window = math.exp(top) * float(np.exp(log_terms - top).sum())
    below = low * math.exp(log_first)  # the `low` terms under the window, each at most its first term
    return min(1.0, (window + below) * (1.0 + slack))


def clipping_p_value(values: np.ndarray, counts: np.ndarray, params: Any, epsilon: float, delta: float = 0.0) -> float:
    """The mean round's sign test (module docstring): how likely reports this few beyond the range's
    ends would be if every user had been projected onto one end.

    ``values``/``counts``: the round's reported grid integers and how often each came (the mean
    round's collector); ``params``: its :class:`~shuffledp.protocol.wire.messages.ProjectedMeanParams`."""
    values = np.asarray(values, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    n = int(counts.sum())
    if n < 1:
        raise InvalidParameter("counts", "the mean round has no reports")
    p_beyond = _noise_above_zero(params, epsilon, delta)
    above = int(counts[values > params.grid_levels].sum())
    below = int(counts[values < 0].sum())
    return max(binomial_lower_tail(above, n, p_beyond), binomial_lower_tail(below, n, p_beyond))


def combined_threshold(alpha: float) -> float:
    """``k`` with ``k (1 + ln(1/k)) = alpha``: two independent super-uniform p-values have a product at
    most ``k`` with probability at most ``alpha`` (module docstring)."""
    if not 0 < alpha < 1:
        raise InvalidParameter("alpha", f"must be in (0, 1), got {alpha!r}")
    low, high = 0.0, alpha
    for _ in range(200):
        middle = (low + high) / 2.0
        if middle > 0 and middle * (1.0 - math.log(middle)) > alpha:
            high = middle
        else:
            low = middle
    return low


@dataclass(frozen=True)
class RangeCheck:
    """The analyzer's verdict on one range round (see the module docstring).

    After round 1 alone (:func:`check_range_round`) the verdict is the frequency test's; once the
    mean round has run (:meth:`with_mean_round`) it is the two-round verdict, the one reported."""

    #: ``ok``: the range is shown to hold users; ``untrusted``: it may hold none of them.
    status: str
    #: The announced bin's frequency estimate, and the threshold a frequency test alone needs.
    announced_frequency: float
    threshold: float
    #: Users in the round, and users the round needs (all in one bin, failure probability beta).
    users: int
    users_needed: int
    alpha: float
    beta: float
    reasons: tuple[str, ...] = field(default=())
    #: The range round's p-value under "the announced bin is empty" (:func:`range_p_value`).
    range_p_value: float = 1.0
    #: The mean round's sign-test p-value under "every user clipped to one end", once it has run.
    clipping_p_value: float | None = None
    #: The two-round verdict's level and the bound on the product of the two p-values it implies.
    trust_alpha: float = TRUST_ALPHA
    combined_threshold: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["reasons"] = list(self.reasons)
        return out

    def with_mean_round(self, values: np.ndarray, counts: np.ndarray, params: Any, epsilon: float,
                        delta: float = 0.0, alpha: float = TRUST_ALPHA) -> "RangeCheck":
        """The two-round verdict: trusted when ``p_f p_m <= k(alpha)`` (module docstring)."""
        p_mean = clipping_p_value(values, counts, params, epsilon, delta)
        bound = combined_threshold(alpha)
        trusted = self.range_p_value * p_mean <= bound
        reasons = [] if trusted else [
            "neither round rules out that every user was clipped to one end of the range: the estimate may be "
            "far off, by more than its standard error says"
        ]
        reasons += [r for r in self.reasons if r.startswith("n = ")]
        return replace(self, status="ok" if trusted else "untrusted", reasons=tuple(reasons),
                       clipping_p_value=p_mean, trust_alpha=alpha, combined_threshold=bound)


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
    their ``epsilon`` (the round's budget per report): the frequency test at ``alpha``. The scalar
    protocol then adds the mean round's evidence (:meth:`RangeCheck.with_mean_round`)."""
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
    status = "untrusted" if announced < threshold else "ok"
    return RangeCheck(status, announced, threshold, int(n), needed, alpha, beta, tuple(reasons),
                      range_p_value(announced, epsilon, bins, int(n)))


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
    return CoordinateRangeCheck("untrusted" if warned else "ok", dim, warned, checks)


def guarantee_text(check: dict[str, Any]) -> str:
    """What the two-round verdict proves, in words (module docstring, *Guarantee*): the joint probability
    and its terms. ``check`` may say where ``tau`` came from: ``gamma`` (the data model's failure
    probability) or ``tau_from == "user"`` (no gamma term); without either, the straddle event is named."""
    alpha = check["trust_alpha"]
    joint = "P(the range holds no user AND it is reported trusted)"
    if check.get("tau_from") == "user":
        return (f"{joint} <= {alpha:g}, for users whose local means span less than the range's width 6 tau "
                f"(tau given by the user, not derived from a data model: no gamma term, and nothing is claimed for "
                f"users spread wider); a joint probability over runs, not the chance that a range reported trusted is empty")
    gamma = check.get("gamma")
    if gamma is not None:
        return (f"{joint} <= {alpha:g} + gamma = {alpha + gamma:g} (gamma = {gamma:g}: the chance, under the data "
                f"model, that some user's local mean lies farther than tau from the mean); a joint probability over runs, not the "
                f"chance that a range reported trusted is empty")
    return (f"{joint} <= {alpha:g} + P(the users' local means span 6 tau or more); a joint probability over runs, "
            f"not the chance that a range reported trusted is empty")


def trust_level(check: dict[str, Any]) -> str:
    """``alpha + gamma`` as printed (``alpha`` alone for a user-given tau; ``alpha + P(spread)`` if unknown)."""
    alpha = check["trust_alpha"]
    if check.get("tau_from") == "user":
        return f"{alpha:g}"
    if check.get("gamma") is not None:
        return f"{alpha + check['gamma']:g}"
    return f"{alpha:g} + P(spread)"


def format_range_check(check: dict[str, Any]) -> str:
    """One line for a :meth:`RangeCheck.as_dict`, then one ``!`` line per reason (the CLIs' output).

    The verdict reads as a test result: ``trusted at level ...`` or ``not trusted: ...``, never as a
    fact about the data; the two-round verdict adds what it proves (:func:`guarantee_text`)."""
    trusted = check["status"] == "ok"
    if "coordinates" in check:
        warned = len(check["warned_coordinates"])
        head = (f"trusted at level {check['alpha']:g}" if trusted else
                f"not trusted: {warned} of {check['coordinates']} coordinates' announced bins not shown to hold users")
        line = (f"{head} (frequency test per coordinate; P(some coordinate's announced bin holds no user AND it "
                f"passes) <= {check['alpha']:g}); fewest reports per coordinate "
                f"{check['fewest_reports']:,}, {check['users_needed']:,} needed")
        return line if trusted else line + "\n      ! those coordinates' ranges may hold none of the users"
    if check.get("clipping_p_value") is None:
        head = f"trusted at level {check['alpha']:g}" if trusted else "not trusted"
        line = (f"{head}: announced bin's estimate {check['announced_frequency']:.3f} vs {check['threshold']:.3f} "
                f"needed; n = {check['users']:,}, {check['users_needed']:,} needed")
        return line + "".join(f"\n      ! {reason}" for reason in check["reasons"])
    product = check["range_p_value"] * check["clipping_p_value"]
    evidence = (f"range round p = {check['range_p_value']:.2g} x mean round's clipping p = "
                f"{check['clipping_p_value']:.2g} = {product:.2g}")
    if trusted:
        line = (f"trusted at level {trust_level(check)}: the test rejected \"the range holds no user\" "
                f"({evidence} <= {check['combined_threshold']:.2g})")
    else:
        line = (f"not trusted: the test could not reject \"the range holds no user\" "
                f"({evidence} > {check['combined_threshold']:.2g})")
    line += f"\n      guarantee: {guarantee_text(check)}"
    notes = [r for r in check["reasons"] if r.startswith("n = ")]
    reasons = [r for r in check["reasons"] if r not in notes]
    return line + "".join(f"\n      ! {r}" for r in reasons) + "".join(f"\n      note: {r}" for r in notes)


__all__ = [
    "DEFAULT_ALPHA", "DEFAULT_BETA", "TRUST_ALPHA", "CoordinateRangeCheck", "RangeCheck", "binomial_lower_tail",
    "check_coordinate_ranges", "check_range_round", "clipping_p_value", "combined_threshold", "detection_threshold",
    "format_range_check", "guarantee_text", "range_p_value", "trust_level", "users_needed",
]
