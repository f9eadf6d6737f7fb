"""Exact central privacy of shuffled binary randomized response.

Binary randomized response (RR) keeps the bit with probability
``rho = e^eps0 / (e^eps0 + 1)``. After shuffling, the analyzer sees only the number of
ones. For neighbouring datasets that differ in user 1's bit and where ``k`` of the
other ``m = n - 1`` users hold a one, the two views are

    P = Y_k + Bern(1 - rho)   (user 1 holds 0),   Q = Y_k + Bern(rho)   (user 1 holds 1),
    Y_k = Bin(k, rho) + Bin(m - k, 1 - rho),

and the round's ``delta(eps)`` is ``max_k max(D_{e^eps}(P||Q), D_{e^eps}(Q||P))`` (flipping
every bit maps ``k`` to ``m - k`` and swaps the two directions).

* :func:`rr_delta` evaluates one ``k`` exactly, in log space (log-pmfs from
  ``gammaln``, ``logaddexp`` for the two-component mixture, each positive term
  ``P (1 - e^{eps + log Q - log P})`` summed without cancellation).
* :func:`rr_lower_delta` takes the maximum over ``k in {0, 1, 2, 3}``. Any fixed
  dataset pair gives a **lower bound** on the round's ``delta(eps)``; since binary RR
  is itself an ``eps0``-LDP randomizer, no upper bound that only uses ``eps0`` may go
  below it. (The worst ``k`` is near, but not always at, the extremes: exhaustive
  search for small ``n`` finds e.g. ``k = 3`` at ``n = 1000, eps0 = 3``.)
* :func:`rr_exact_delta` maximises over **every** ``k`` (direct convolutions, no FFT
  round-off), which is the exact central ``delta(eps)`` of shuffled binary RR. It is
  quadratic-cubic in ``n``, so it is offered up to :data:`RR_EXACT_MAX_N` users.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from shuffledp.protocol.accounting._numerics import log_binom_pmf
from shuffledp.protocol.errors import InvalidParameter

#: Largest ``n`` for which the all-datasets maximisation is run.
RR_EXACT_MAX_N = 1500
#: Datasets (number of ones among the other users) used for the lower bound.
LOWER_BOUND_ONES = (0, 1, 2, 3)
#: Half-width in standard deviations of the window over counts (terms outside are
#: below 1e-40 and dropped, which can only lower the sum: fine for a lower bound).
_WINDOW_SD = 14.0


def _check(n: int, epsilon0: float) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InvalidParameter("n", f"must be an integer >= 1, got {n!r}")
    if not (math.isfinite(epsilon0) and epsilon0 > 0):
        raise InvalidParameter("epsilon0", f"must be finite and > 0, got {epsilon0}")


@functools.lru_cache(maxsize=32)
def _log_views(n: int, epsilon0: float, ones: int) -> tuple[np.ndarray, np.ndarray]:
    """log P and log Q over the window of counts of ones (dataset with ``ones`` ones)."""
    m = n - 1
    if not 0 <= ones <= m:
        raise InvalidParameter("ones", f"must be in [0, {m}], got {ones}")
    log_rho = -math.log1p(math.exp(-epsilon0))
    log_rhobar = -math.log1p(math.exp(epsilon0))
    rhobar = math.exp(log_rhobar)
    mean = ones * (1 - rhobar) + (m - ones) * rhobar
    sd = math.sqrt(max(m * rhobar * (1 - rhobar), 1e-12))
    lo = max(0, int(math.floor(mean - _WINDOW_SD * sd - 2 - ones)))
    hi = min(m + 1, int(math.ceil(mean + _WINDOW_SD * sd + 2 + ones)))
    y = np.arange(lo - 1, hi + 1, dtype=np.float64)  # counts of ones among the others
    if ones == 0:
        log_f = log_binom_pmf(y, m, rhobar)
    else:
        i = np.arange(ones + 1, dtype=np.float64)
        log_g = log_binom_pmf(i, ones, 1 - rhobar)  # ones kept as ones
        log_h = log_binom_pmf(y[:, None] - i[None, :], m - ones, rhobar)
        x = log_g[None, :] + log_h  # (window, ones + 1): log-sum-exp over the few columns
        top = np.max(x, axis=1)
        with np.errstate(invalid="ignore"):
            log_f = np.log(np.sum(np.exp(x - top[:, None]), axis=1)) + top
        log_f = np.where(np.isfinite(top), log_f, -np.inf)
    # the count c of ones in the view, c in [lo, hi]: f(c) and f(c-1)
    log_f_c = log_f[1:]
    log_f_cm1 = log_f[:-1]
    log_p = np.logaddexp(log_rhobar + log_f_cm1, log_rho + log_f_c)  # user 1 holds 0
    log_q = np.logaddexp(log_rho + log_f_cm1, log_rhobar + log_f_c)  # user 1 holds 1
    return log_p, log_q


@functools.lru_cache(maxsize=8)
def _hockey_parts(n: int, epsilon0: float, ones: int) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """``(exp(log P), log P - log Q)`` and ``(exp(log Q), log Q - log P)`` of one dataset, once per process
    (a search evaluates the same views at many epsilons)."""
    log_p, log_q = _log_views(n, epsilon0, ones)
    return (np.exp(log_p), log_p - log_q), (np.exp(log_q), log_q - log_p)


def _hockey_from_parts(a: np.ndarray, diff: np.ndarray, eps: float) -> float:
    """:func:`_hockey` on precomputed ``exp(log_a)`` and ``log_a - log_b`` (the same numbers)."""
    sel = diff > eps
    if not np.any(sel):
        return 0.0
    return float(np.sum(a[sel] * -np.expm1(eps - diff[sel])))


def _hockey(log_a: np.ndarray, log_b: np.ndarray, eps: float) -> float:
    """sum_x [A(x) - e^eps B(x)]_+ computed term by term without cancellation."""
    diff = log_a - log_b
    sel = diff > eps
    if not np.any(sel):
        return 0.0
    terms = np.exp(log_a[sel]) * -np.expm1(eps - diff[sel])
    return float(np.sum(terms))


def rr_delta(eps: float, n: int, epsilon0: float, ones: int = 0) -> float:
    """Exact ``delta(eps)`` (max of both directions) for one dataset pair of shuffled RR."""
    _check(n, epsilon0)
    if eps >= epsilon0:
        return 0.0
    pq, qp = _hockey_parts(int(n), float(epsilon0), int(ones))
    eps = max(float(eps), 0.0)
    return max(_hockey_from_parts(*pq, eps), _hockey_from_parts(*qp, eps))


def rr_lower_delta(eps: float, n: int, epsilon0: float) -> float:
    """Lower bound on shuffled RR's ``delta(eps)``: max over the datasets in LOWER_BOUND_ONES."""
    _check(n, epsilon0)
    return max(rr_delta(eps, n, epsilon0, k) for k in LOWER_BOUND_ONES if k <= n - 1)


def rr_lower_epsilon(delta: float, n: int, epsilon0: float, rtol: float = 1e-6) -> float:
    """Lower bound on the central epsilon of shuffled binary RR at ``delta``: the datasets of
    :data:`LOWER_BOUND_ONES`, both directions, each in the closed form of
    :func:`.rr_any_n.dataset_epsilon` (Neyman--Pearson threshold sets, certified rounding; one view
    per dataset instead of a search over :func:`rr_lower_delta`, about 5x faster). ``rtol`` is not
    used (no search; the value is within its rounding of each dataset's exact epsilon)."""
    from shuffledp.protocol.accounting.rr_any_n import _dataset_epsilon_side

    _check(n, epsilon0)
    if not 0 < delta < 1:
        raise InvalidParameter("delta", f"must be in (0, 1), got {delta}")
    m = int(n) - 1
    return max(_dataset_epsilon_side(delta, ones, m - ones, float(epsilon0), False)
               for k in LOWER_BOUND_ONES if k <= m for ones in (k, m - k))


@functools.lru_cache(maxsize=8)
def _all_views(n: int, epsilon0: float) -> tuple[np.ndarray, np.ndarray]:
    """P and Q for every dataset (rows: number of ones among the others), exact sums."""
    m = n - 1
    rho = 1.0 / (1.0 + math.exp(-epsilon0))
    rhobar = 1.0 - rho
    pmf_keep = [np.exp(log_binom_pmf(np.arange(k + 1), k, rho)) for k in range(m + 1)]
    pmf_flip = [np.exp(log_binom_pmf(np.arange(k + 1), k, rhobar)) for k in range(m + 1)]
    F = np.empty((m + 1, m + 1))
    for k in range(m + 1):
        F[k] = np.convolve(pmf_keep[k], pmf_flip[m - k])  # all terms >= 0: no cancellation
    Fm1 = np.concatenate([np.zeros((m + 1, 1)), F], axis=1)
    F0 = np.concatenate([F, np.zeros((m + 1, 1))], axis=1)
    P = rhobar * Fm1 + rho * F0
    Q = rho * Fm1 + rhobar * F0
    return P, Q


def rr_exact_delta(eps: float, n: int, epsilon0: float) -> float:
    """Exact central ``delta(eps)`` of shuffled binary RR (maximum over every dataset).

    Raises :class:`InvalidParameter` above :data:`RR_EXACT_MAX_N` users. A relative
    padding of 1e-12 covers floating-point summation error, so the value is an upper
    bound as well as exact to 12 digits.
    """
    _check(n, epsilon0)
    if n > RR_EXACT_MAX_N:
        raise InvalidParameter("n", f"exact shuffled-RR maximisation is limited to n <= {RR_EXACT_MAX_N}")
    if eps >= epsilon0:
        return 0.0
    P, Q = _all_views(int(n), float(epsilon0))
    E = math.exp(max(float(eps), 0.0))
    d1 = np.maximum(P - E * Q, 0.0).sum(axis=1)
    d2 = np.maximum(Q - E * P, 0.0).sum(axis=1)
    d = float(max(d1.max(), d2.max()))
    return min(1.0, d * (1.0 + 1e-12) + 1e-300)


def rr_exact_epsilon(delta: float, n: int, epsilon0: float, rtol: float = 1e-6) -> float:
    """Exact central epsilon of shuffled binary RR at ``delta``, rounded up (n <= RR_EXACT_MAX_N).

    Computed by :func:`.rr_any_n.certify_epsilon` (closed form per dataset, every dataset
    evaluated where it could matter): an upper bound within ~1e-11 relative of the exact value,
    so well inside ``rtol`` (kept for compatibility). The previous bracketing search on
    :func:`rr_exact_delta` returned the upper end of a ``rtol`` bracket instead.
    """
    if not 0 < delta < 1:
        raise InvalidParameter("delta", f"must be in (0, 1), got {delta}")
    _check(n, epsilon0)
    if n > RR_EXACT_MAX_N:
        raise InvalidParameter("n", f"exact shuffled-RR maximisation is limited to n <= {RR_EXACT_MAX_N}")
    from shuffledp.protocol.accounting.rr_any_n import certify_epsilon

    return certify_epsilon(delta, int(n), float(epsilon0)).upper
