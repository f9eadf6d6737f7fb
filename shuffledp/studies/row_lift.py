"""A sound all-dataset bound for shuffled one-bit Hadamard response that is not a decomposition: the row lift.

**Mechanism.** One-bit Hadamard response over the ``K x K`` Sylvester matrix ``H`` (Girgis,
Data & Diggavi 2022, Alg. 4; ``client/range_randomizer.py``): a user with input column ``x``
draws a row ``j`` uniformly from ``[K]``, independently of ``x``, and reports ``(j, b)``, with
``b = H[j, x]`` kept with probability ``rho = e^eps0 / (1 + e^eps0)`` (the client keeps with a
double ``p <= rho``: binary randomized response at a budget at most ``eps0``, a post-processing
of RR at ``eps0``). The shuffler reveals the histogram of the ``n`` reports.

**The lift (proof).** Let ``A`` be the assignment of users to rows. It does not depend on the
data, and the histogram is a function of ``A`` together with, for each row ``j``, the number of
``+1`` bits among the users of row ``j``. So the mechanism that also reveals ``A`` is at least
as informative, and its privacy curve bounds the round's (post-processing; Dwork & Roth 2014,
Prop. 2.1). With ``A`` revealed, the hockey-stick divergence of the two neighbouring views is
the average over ``A`` of the divergences given ``A``, since ``A`` has one law under both:

    delta(eps) <= E_A[ delta_A(eps) ].

Given ``A``, rows other than user 1's row ``j1`` do not depend on user 1's input. In row ``j1``
the ``m`` users (user 1 and ``m - 1`` others, ``m - 1 ~ Bin(n - 1, 1/K)``) each report binary
RR of their bit ``H[j1, x_i]``, and only the count of ``+1`` is seen: shuffled binary RR with
``m`` users. User 1's bit differs between the neighbours ``x != x'`` only on rows where
``H[j, x] != H[j, x']``: exactly ``K/2`` of the ``K`` rows (two distinct columns of a Sylvester
matrix agree on half the rows). Elsewhere ``delta_A = 0``. Where it differs,
``delta_A(eps) <= delta_RR(eps; m)``, the all-dataset curve of shuffled binary RR that
:func:`shuffledp.protocol.accounting.rr_any_n.certified_delta` certifies (every count of ones
among the others, so every dataset of the others' columns). Hence

    delta(eps) <= (1/2) sum_m Bin(m - 1; n - 1, 1/K) delta_RR(eps; m).          (exact form)

``delta_RR(eps; m)`` is non-increasing in ``m``: the count of a batch of ``m`` users is the count
of ``m0 <= m`` of them plus the independent reports of the rest, whose law does not depend on
user 1, a randomized post-processing of the smaller batch's view. So for any ``m0``, with
``t = P(m < m0)`` and ``delta_RR <= 1``,

    delta(eps) <= (1/2) (t + delta_RR(eps; m0)),                                 (tail form)

which :func:`lift_epsilon` inverts with ``m0`` at the binomial quantile ``t = delta / 50``.

**Why it does not help.** The lift amplifies with the ``~n/K`` users of one row, while the
privacy blanket of the whole round amplifies with all ``n`` (user 1's row is hidden among
``K`` rows). ``benchmarks/bench_row_lift.py`` evaluates both on the tightness grid: the lift is
2.2 to 16 times the blanket there and never below it for ``K >= 4`` (``K = 2`` is binary RR
thinned by the constant row 0, which the accountant already treats exactly). It is sound
(``tests/studies/test_row_lift.py`` checks it against the exhaustive exact search of
:mod:`shuffledp.studies.worst_dataset`), so it is kept as evidence, not used by the accountant.
"""

from __future__ import annotations

import math

from scipy import stats

from shuffledp.protocol.accounting.rr_any_n import certified_delta, certify_epsilon
from shuffledp.protocol.errors import InvalidParameter

#: Share of ``delta`` the tail form spends on ``P(m < m0)`` (the rest goes to the row's batch).
TAIL_SHARE = 0.02


def _check(K: int, n: int, epsilon0: float) -> None:
    if not (isinstance(K, int) and K >= 2 and K & (K - 1) == 0):
        raise InvalidParameter("K", f"must be a power of two >= 2, got {K!r}")
    if not (isinstance(n, int) and n >= 1):
        raise InvalidParameter("n", f"must be a positive integer, got {n!r}")
    if not (math.isfinite(epsilon0) and epsilon0 > 0):
        raise InvalidParameter("epsilon0", f"must be finite and > 0, got {epsilon0!r}")


def _rr_delta(eps: float, m: int, epsilon0: float) -> float:
    """Certified all-dataset delta of shuffled binary RR with ``m`` users (one user: local RR)."""
    if m == 1:
        rho = 1.0 / (1.0 + math.exp(-epsilon0))
        return max(0.0, rho - math.exp(eps) * (1.0 - rho))
    return certified_delta(eps, m, epsilon0)


def lift_delta(eps: float, K: int, n: int, epsilon0: float) -> float:
    """The exact form: ``(1/2) sum_m Bin(m - 1; n - 1, 1/K) delta_RR(eps; m)`` (``O(n^2)``: small ``n``)."""
    _check(K, n, epsilon0)
    weights = stats.binom.pmf(range(n), n - 1, 1.0 / K)
    return 0.5 * sum(w * _rr_delta(eps, m + 1, epsilon0) for m, w in enumerate(weights) if w > 0)


def lift_epsilon_exact(delta: float, K: int, n: int, epsilon0: float, *, tol: float = 1e-9) -> float:
    """The smallest ``eps`` with :func:`lift_delta` ``<= delta``, by bisection (upper end returned)."""
    lo, hi = 0.0, float(epsilon0)
    if lift_delta(0.0, K, n, epsilon0) <= delta:
        return 0.0
    while hi - lo > tol * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        if lift_delta(mid, K, n, epsilon0) <= delta:
            hi = mid
        else:
            lo = mid
    return hi


def lift_epsilon(delta: float, K: int, n: int, epsilon0: float) -> tuple[float, int]:
    """The tail form at any ``n``: ``(eps, m0)``, ``eps`` certified by ``rr_any_n`` at ``m0`` users."""
    _check(K, n, epsilon0)
    if not 0.0 < delta < 1.0:
        raise InvalidParameter("delta", f"must be in (0, 1), got {delta}")
    tail = TAIL_SHARE * delta
    # m0 - 1 = the largest count with P(Bin(n - 1, 1/K) < m0 - 1) <= tail
    m0 = int(stats.binom.ppf(tail, n - 1, 1.0 / K)) + 1
    while m0 > 1 and stats.binom.cdf(m0 - 2, n - 1, 1.0 / K) > tail:
        m0 -= 1
    below = float(stats.binom.cdf(m0 - 2, n - 1, 1.0 / K)) if m0 > 1 else 0.0
    target = 2.0 * delta - below
    if m0 == 1:
        rho = 1.0 / (1.0 + math.exp(-epsilon0))
        eps = math.log(max(rho - target, 1e-300) / (1.0 - rho)) if rho > target else 0.0
        return min(max(eps, 0.0), epsilon0), m0
    return min(certify_epsilon(target, m0, epsilon0).upper, epsilon0), m0
