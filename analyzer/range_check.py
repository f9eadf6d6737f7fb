"""Did the range round find the users? The analyzer's own check, from what it sees.

The range round (Girgis, Data & Diggavi 2022, Algorithm 3/4) announces the arg-max
bin of ``K`` Hadamard-response frequency estimates. With few users, a wide domain
(many bins) and a small budget, the arg-max can be an *empty* bin that noise pushed
to the top; the mean round then projects every user onto a range that holds none of
them, and the estimate is off by hundreds of standard errors while its standard
error looks normal. Nothing downstream can see it, so the analyzer judges the range
round itself.

**The test.** User ``i`` sends ``(j_i, b_i)``: a row ``j_i`` drawn uniformly from the ``K'`` rows of
the Sylvester–Hadamard matrix (``K'`` = the ``K`` real bins padded to a power of two; the row is drawn
over all ``K'``, padding included) and ``b_i = s_i H[j_i, nu_i]`` with a sign ``s_i`` drawn independently
of ``j_i`` (``+1`` with probability ``e^eps / (e^eps + 1)``)
(:func:`~shuffledp.client.range_randomizer.hadamard_response`). For a bin ``a`` the user does not hold,
``b_i H[j_i, a] = s_i H[j_i, nu_i xor a]`` (Sylvester: ``H[j, x] H[j, y] = H[j, x xor y]``), and a
column ``z != 0`` of ``H`` is ``+1`` on exactly half the rows, so with ``j_i`` uniform this term is a
fair ``±1`` whatever ``s_i`` is, independently across users. Hence, for an empty bin, the number of
reports agreeing with its column, ``A_a = (n + S_a) / 2`` with ``S_a = sum_i b_i H[j_i, a]``, is
**exactly** ``Binomial(n, 1/2)``; the bin's estimate is ``fhat[a] = c S_a / n`` with ``c = coth(eps/2)``
(:func:`~shuffledp.analyzer.decoders.hadamard_scale`), so ``A_a`` is read back from the estimate
(:func:`agreement_count`). A union bound over the ``K`` real bins covers the arg-max's selection:

    P(some empty bin has A_a >= A) <= K P[Binomial(n, 1/2) >= A].

The range round's p-value is ``p_f = min(1, K P[Binomial(n, 1/2) >= A])`` for the announced bin's count
(:func:`range_p_value`; the tail from :func:`binomial_lower_tail`, an upper bound within rounding), so
``P(p_f <= x) <= x`` whenever the announced bin is empty, whatever the data. The frequency test alone
(:func:`check_range_round`) warns when ``p_f > alpha``, i.e. below :func:`count_threshold`; Hoeffding's
``P(fhat >= t) <= exp(-n t^2 / (2 c^2))`` (:func:`detection_threshold`, kept for the a-priori
requirement below and for other modules' bounds) is the same test's looser form. The price is false
warnings when a real bin's estimate is small: the test is one-sided on purpose.

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

The sign test's null law is exact for any public noise law: ``p1`` is computed from the round's own
noise (discrete Laplace ``q / (1 + q)``; discrete Gaussian from its normaliser), so the test is
calibrated to the noise actually used. For discrete Gaussian noise a linear (score) statistic
would be about ``pi / 2`` times as efficient, but at the budgets where the verdict matters the
Gaussian noise's sigma is about ``15 G`` (eps = 0.25, delta = 1e-6), and the mean round's evidence
is weak either way (z about 1 at n = 2,000). The weighting below then moves the verdict onto the
range round, and the Neyman–Pearson limit in :mod:`shuffledp.studies.range_limit` measures what
any valid test could still gain.

**Combining them.** Given round 1, the mean round's noise is fresh, so ``p_m`` is super-uniform given
round 1 under the null, and ``p_f`` is super-uniform. The verdict weighs them with a weight ``w`` that
depends on public parameters only (:func:`range_weight`: ``n``, ``K``, both rounds' ``epsilon``, the
noise law, ``G``; chosen to maximise the predicted power for users at the range's centre), and
reports the combined p-value (:func:`combined_p_value`)

    p_c = P(w E1 + (1 - w) E2 >= w ln(1/p_f) + (1 - w) ln(1/p_m)),   E1, E2 i.i.d. Exp(1).

*Proof that* ``P(p_c <= x) <= x`` *under the null.* ``X1 = ln(1/p_f)`` has ``P(X1 >= t) = P(p_f <= e^-t)
<= e^-t``: it is stochastically below ``E1``; likewise ``X2 = ln(1/p_m)`` given round 1 is below
``E2``. With ``h(x) = P((1 - w) E2 >= u - w x)``, increasing in ``x``:
``P(w X1 + (1 - w) X2 >= u) = E[P((1 - w) X2 >= u - w X1 | round 1)] <= E h(X1) <= E h(E1)
= P(w E1 + (1 - w) E2 >= u)``. ``p_c`` is that survival function (continuous, decreasing) at the
observed ``u``, so ``P(p_c <= x) <= x``. The survival function is the hypoexponential law's,
``(hi e^(-u/hi) - lo e^(-u/lo)) / (hi - lo)`` for weights ``hi > lo`` (:func:`combined_survival`);
``w = 1/2`` is Fisher's product. The range is **trusted** when ``p_c <= alpha``, i.e. when
``p_f^w p_m^(1-w) <= k(w, alpha)`` (:func:`weighted_threshold`; the JSON's ``combined_threshold``),
and **untrusted** otherwise.

*Guarantee: what is proven.* Let ``E`` be the event that the users' local means span less
than the range's width ``6 tau`` (the concentration radius gives ``P(not E) <= gamma`` when
``tau`` comes from the data model; a ``tau`` the user chose carries no such probability). On
``E``, with ``N`` the event "the range holds no user": ``P(N, p_f <= x) <= x`` (the union bound
bounds exactly this joint event), and given round 1 on ``N`` every report is an end plus fresh noise,
so ``p_m`` is super-uniform; the proof above, run with ``ln(1/p_f)`` set to 0 off ``N`` (still below
``E1``), gives ``P(N, p_c <= alpha) <= alpha``, so

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
``tests/analyzer/test_range_check.py`` checks the empty bin's exact binomial law, the sign test's exact
null, the combination's super-uniformity and the rates; ``benchmarks/bench_range_check.py --regimes``
measures silent misses and false warnings over 3,000 seeds per regime against the Neyman–Pearson
limit (``shuffledp simulate --seeds K`` for one regime).
"""

from __future__ import annotations

import functools
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


def agreement_count(frequency: float, epsilon: float, n: int) -> int:
    """The number ``A`` of the ``n`` reports whose sign agrees with the bin's Hadamard column, from the
    bin's estimate ``fhat = c (2 A - n) / n``, rounded *down* (a smaller count can only raise the
    p-value): exact for an estimate the decoder made (an integer count scaled by ``c / n``)."""
    signed = math.floor(frequency * n / hadamard_scale(epsilon) + 1e-6)
    return max(0, min(n, (n + signed) // 2))


def range_p_value(frequency: float, epsilon: float, bins: int, n: int) -> float:
    """``p_f = min(1, K P[Binomial(n, 1/2) >= A])`` for the announced bin's agreement count ``A``
    (:func:`agreement_count`): ``P(p_f <= x) <= x`` when the announced bin is empty, whichever of the
    ``K`` bins the arg-max chose (the exact fair-coin law of an empty bin's count and a union bound;
    module docstring)."""
    _check(epsilon, bins, n)
    if not frequency > 0:
        return 1.0
    agree = agreement_count(frequency, epsilon, n)
    # P(Bin(n, 1/2) >= A) = P(Bin(n, 1/2) <= n - A) by symmetry; an upper bound within rounding.
    return min(1.0, bins * binomial_lower_tail(n - agree, n, 0.5))


def count_threshold(epsilon: float, bins: int, n: int, alpha: float = DEFAULT_ALPHA) -> float:
    """The smallest estimate ``fhat`` with :func:`range_p_value` ``<= alpha``: an empty bin reaches it with
    probability at most ``alpha / K`` (exact binomial tail), so some empty bin does with probability at
    most ``alpha``. The largest possible estimate ``c`` if even a unanimous count does not suffice."""
    _check(epsilon, bins, n, alpha, "alpha")
    scale = hadamard_scale(epsilon)
    low, high = n // 2, n  # p(low) > alpha (an agreement count at most n/2 gives p = 1); search (low, high]
    if bins * binomial_lower_tail(0, n, 0.5) > alpha:
        return scale
    while high - low > 1:
        middle = (low + high) // 2
        if bins * binomial_lower_tail(n - middle, n, 0.5) <= alpha:
            high = middle
        else:
            low = middle
    return scale * (2 * high - n) / n


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


def _noise_at_least(params: Any, epsilon: float, delta: float, k: int) -> float:
    """``P(noise >= k)`` for ``k >= 1``, for :func:`range_weight`'s design only: exact for discrete Laplace
    (``q^k / (1 + q)``), the continuous normal's ``P(N(0, sigma^2) >= k - 1/2)`` for the discrete Gaussian."""
    from shuffledp.client.mean_randomizer import gaussian_sigma2, laplace_scale

    if params.noise == "laplace":
        q = math.exp(-1.0 / float(laplace_scale(params, epsilon)))
        return q**k / (1.0 + q)
    sigma = math.sqrt(float(gaussian_sigma2(params, epsilon, delta)))
    return 0.5 * math.erfc((k - 0.5) / (sigma * math.sqrt(2.0)))


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


#: The weights the two-round verdict chooses from (:func:`range_weight`): the range round's share ``w``.
WEIGHTS = tuple(i / 20 for i in range(21))


def combined_survival(weight: float, statistic: float) -> float:
    """``P(w E1 + (1 - w) E2 >= statistic)`` for independent standard exponentials ``E1, E2``.

    With ``hi >= lo`` the two weights: ``(hi e^(-t/hi) - lo e^(-t/lo)) / (hi - lo)`` (the
    hypoexponential law), ``e^(-t/w) (1 + t/w)`` when they are equal (Gamma(2)), ``e^(-t/w)`` when one
    is 0."""
    if not 0 <= weight <= 1:
        raise InvalidParameter("weight", f"must be in [0, 1], got {weight!r}")
    t = statistic
    if not t > 0:
        return 1.0
    if math.isinf(t):
        return 0.0
    hi, lo = max(weight, 1.0 - weight), min(weight, 1.0 - weight)
    if lo == 0.0:
        return math.exp(-t / hi)
    if hi == lo:
        return math.exp(-t / hi) * (1.0 + t / hi)
    return min(1.0, math.exp(-t / hi) * (hi - lo * math.exp(-t / lo + t / hi)) / (hi - lo))


def combined_p_value(range_p: float, clipping_p: float, weight: float) -> float:
    """The two rounds' evidence in one p-value: ``P(w E1 + (1 - w) E2 >= -w ln p_f - (1 - w) ln p_m)``
    (:func:`combined_survival`). Super-uniform when ``p_f`` is and ``p_m`` is given round 1 (module
    docstring); ``w = 1/2`` is Fisher's product, ``p_f p_m (1 + ln(1/(p_f p_m)))``."""
    statistic = -weight * math.log(max(range_p, 1e-300)) - (1.0 - weight) * math.log(max(clipping_p, 1e-300))
    return combined_survival(weight, statistic)


def weighted_threshold(alpha: float, weight: float) -> float:
    """``k`` with ``P(p_f^w p_m^(1-w) <= k) = alpha`` for independent uniforms: the verdict trusts when the
    weighted product is at most ``k`` (``w = 1/2``: :func:`combined_threshold` squared-rooted)."""
    if not 0 < alpha < 1:
        raise InvalidParameter("alpha", f"must be in (0, 1), got {alpha!r}")
    low, high = 0.0, 1.0
    while combined_survival(weight, high) > alpha:
        low, high = high, 2.0 * high
    for _ in range(100):
        middle = (low + high) / 2.0
        low, high = (middle, high) if combined_survival(weight, middle) > alpha else (low, middle)
    return math.exp(-high)


def _normal_upper_tail(z: np.ndarray) -> np.ndarray:
    return 0.5 * np.array([math.erfc(x / math.sqrt(2.0)) for x in np.ravel(z)]).reshape(np.shape(z))


@functools.lru_cache(maxsize=256)
def _best_weight(range_mean: float, range_sd: float, bins: int, clip_mean: float, clip_sd: float, alpha: float) -> float:
    nodes = np.linspace(-8.0, 8.0, 161)
    density = np.exp(-nodes**2 / 2.0)
    density /= density.sum()
    range_evidence = -np.log(np.clip(bins * _normal_upper_tail(range_mean + range_sd * nodes), 1e-300, 1.0))
    clip_evidence = -np.log(np.clip(_normal_upper_tail(clip_mean + clip_sd * nodes), 1e-300, 1.0))
    # p_m is the larger of the two ends' p-values: the smaller of two standardised counts, taken as
    # independent, has density 2 phi(x) P(Z > x).
    smaller = density * 2.0 * _normal_upper_tail(nodes)
    joint = density[:, None] * (smaller / smaller.sum())[None, :]
    best, best_power = 0.5, -1.0
    for weight in sorted(WEIGHTS, key=lambda w: abs(w - 0.5)):  # ties go to the weight nearest 1/2
        needed = -math.log(weighted_threshold(alpha, weight))
        power = float(joint[weight * range_evidence[:, None] + (1.0 - weight) * clip_evidence[None, :] >= needed].sum())
        if power > best_power + 1e-9:
            best, best_power = weight, power
    return best


def range_weight(users: int, bins: int, range_epsilon: float, reports: int, params: Any, epsilon: float,
                 delta: float = 0.0, alpha: float = TRUST_ALPHA) -> float:
    """The range round's share ``w`` in :func:`combined_p_value`, from public parameters only (so the
    verdict's level holds whatever ``w`` is): the weight in :data:`WEIGHTS` under which the verdict
    would most often trust a *design* run, every user in the announced bin and at the range's centre.

    There the announced bin's standardised count ``(2A - n) / sqrt(n)`` is about ``N(sqrt(n) / c, 1 - 1/c^2)``
    and the sign test's ``(p1 n - #beyond) / sqrt(n p1 (1 - p1))`` about ``N((p1 - q) sqrt(n) / sqrt(p1 (1 - p1)),
    q (1 - q) / (p1 (1 - p1)))`` with ``q = P(noise >= G/2 + 1)`` at each end, ``p_m`` being the larger of the two
    ends' (the smaller of two such scores, taken as independent); the power of each weight is integrated on a
    161 x 161 grid. Normal approximations choose the weight; they play no part in the level."""
    scale = hadamard_scale(range_epsilon)
    p1 = _noise_above_zero(params, epsilon, delta)
    q = _noise_at_least(params, epsilon, delta, params.grid_levels - params.grid_levels // 2 + 1)
    spread = math.sqrt(p1 * (1.0 - p1))
    return _best_weight(round(math.sqrt(users) / scale, 6), round(math.sqrt(max(1.0 - 1.0 / scale**2, 1e-12)), 6),
                        int(bins), round((p1 - q) * math.sqrt(reports) / spread, 6),
                        round(math.sqrt(q * (1.0 - q)) / spread, 6), float(alpha))


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
    #: The two-round verdict's level, and the bound ``k`` on the weighted product ``p_f^w p_m^(1-w)`` it implies.
    trust_alpha: float = TRUST_ALPHA
    combined_threshold: float | None = None
    #: Bins of the range round and its budget per report (what :func:`range_weight` needs).
    bins: int = 0
    range_epsilon: float = 0.0
    #: The range round's weight ``w`` (:func:`range_weight`) and the two rounds' combined p-value.
    range_weight: float | None = None
    combined_p_value: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["reasons"] = list(self.reasons)
        return out

    def with_mean_round(self, values: np.ndarray, counts: np.ndarray, params: Any, epsilon: float,
                        delta: float = 0.0, alpha: float = TRUST_ALPHA) -> "RangeCheck":
        """The two-round verdict: trusted when the combined p-value of ``p_f`` and ``p_m``, with the range
        round's weight ``w`` (:func:`range_weight`), is at most ``alpha`` (module docstring)."""
        p_mean = clipping_p_value(values, counts, params, epsilon, delta)
        reports = int(np.asarray(counts, dtype=np.int64).sum())
        weight = range_weight(self.users, self.bins, self.range_epsilon, reports, params, epsilon, delta, alpha)
        p_both = combined_p_value(self.range_p_value, p_mean, weight)
        trusted = p_both <= alpha
        reasons = [] if trusted else [
            "neither round rules out that every user was clipped to one end of the range: the estimate may be "
            "far off, by more than its standard error says"
        ]
        reasons += [r for r in self.reasons if r.startswith("n = ")]
        return replace(self, status="ok" if trusted else "untrusted", reasons=tuple(reasons),
                       clipping_p_value=p_mean, trust_alpha=alpha, combined_threshold=weighted_threshold(alpha, weight),
                       range_weight=weight, combined_p_value=p_both)


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
    threshold = count_threshold(epsilon, bins, int(n), alpha)
    needed = users_needed(epsilon, bins, beta)
    announced = float(freqs[announced_bin])
    p_range = range_p_value(announced, epsilon, bins, int(n))
    reasons = []
    if p_range > alpha:
        reasons.append(
            f"the announced bin is not shown to hold any user (its estimate {announced:.3f} is below what an empty "
            f"bin reaches with probability {alpha:g}); the range may hold none of them and the estimate be far off"
        )
    if n < needed:
        reasons.append(f"n = {n:,} is below the {needed:,} users a range round over {bins} bins needs at this epsilon")
    status = "untrusted" if p_range > alpha else "ok"
    return RangeCheck(status, announced, threshold, int(n), needed, alpha, beta, tuple(reasons), p_range,
                      bins=bins, range_epsilon=float(epsilon))


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
    if check.get("combined_p_value") is None:  # a verdict from before the weighted combination: Fisher's product
        combined, weight = combined_p_value(check["range_p_value"], check["clipping_p_value"], 0.5), 0.5
    else:
        combined, weight = check["combined_p_value"], check["range_weight"]
    evidence = (f"range round p = {check['range_p_value']:.2g}, mean round's clipping p = "
                f"{check['clipping_p_value']:.2g}, weighted {weight:g} : {1 - weight:g}: combined p = {combined:.2g}")
    if trusted:
        line = (f"trusted at level {trust_level(check)}: the test rejected \"the range holds no user\" "
                f"({evidence} <= {check['trust_alpha']:g})")
    else:
        line = (f"not trusted: the test could not reject \"the range holds no user\" "
                f"({evidence} > {check['trust_alpha']:g})")
    line += f"\n      guarantee: {guarantee_text(check)}"
    notes = [r for r in check["reasons"] if r.startswith("n = ")]
    reasons = [r for r in check["reasons"] if r not in notes]
    return line + "".join(f"\n      ! {r}" for r in reasons) + "".join(f"\n      note: {r}" for r in notes)


__all__ = [
    "DEFAULT_ALPHA", "DEFAULT_BETA", "TRUST_ALPHA", "WEIGHTS", "CoordinateRangeCheck", "RangeCheck", "agreement_count",
    "binomial_lower_tail", "check_coordinate_ranges", "check_range_round", "clipping_p_value", "combined_p_value",
    "combined_survival", "combined_threshold", "count_threshold", "detection_threshold", "range_weight",
    "weighted_threshold",
    "format_range_check", "guarantee_text", "range_p_value", "trust_level", "users_needed",
]
