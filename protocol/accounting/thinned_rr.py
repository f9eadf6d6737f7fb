"""Exact shuffled divergence of *thinned* binary randomized response on one dataset: a lower bound.

Several randomizers shuffledp sends reduce exactly to this on the datasets where every
user holds one of two inputs ``x0, x1``: each report is, with probability ``tau``, an
*informative* output whose two kinds are binary RR at ``eps0`` (``rho = e^eps0/(e^eps0+1)``
for ``x0``'s kind under ``x0``), and otherwise an *uninformative* output whose
distribution is the same under ``x0`` and ``x1`` (and the same for every user):

* k-ary RR, pair ``(a, b)``: informative = the output is ``a`` or ``b``
  (``tau = (e^eps0 + 1)/(e^eps0 + k - 1)``); the other ``k - 2`` values are uniform for
  every user holding ``a`` or ``b``.
* One-bit Hadamard response over ``K`` columns: informative = the row is one where the
  two columns differ (``tau = 1/2``), and then the bit is RR with ``rho``; on the other
  rows both columns give the same output distribution.
* The projected discrete-Laplace report on ``{0..G}``, pair ``(0, G)``, after the
  post-processing ``y -> (y <= 0, 0 < y < G, y >= G)``: ``P(y <= 0 | 0) = P(y >= G | G) =
  1/(1+r)``, ``P(y >= G | 0) = r^G/(1+r)`` with ``r = e^(-eps0/G)``, the middle level has
  the same probability under both, so ``tau = (1 + r^G)/(1 + r)`` and the informative bit
  is RR at exactly ``eps0`` (``(1/(1+r)) / (r^G/(1+r)) = e^eps0``).

The shuffled view is then ``(T, C)``: the number of informative reports and how many
of them are of ``x0``'s kind (the uninformative outputs' values carry no information).
With the other ``n - 1`` users all at ``x1`` (``ones_among_others = 0``), ``b = Bin(n-1, tau)``
and ``B_m = Bin(m, 1 - rho)``:

    P(t, c) = tau b(t-1) [rho B_{t-1}(c-1) + (1-rho) B_{t-1}(c)] + (1 - tau) b(t) B_t(c)    (user 1 at x0)
    Q(t, c) = tau b(t-1) [(1-rho) B_{t-1}(c-1) + rho B_{t-1}(c)] + (1 - tau) b(t) B_t(c)    (user 1 at x1)

and the divergence is ``sum_{t,c} [P - e^eps Q]_+`` (and the other direction). It is the
exact value for that dataset, so by data processing a *lower* bound on the mechanism's
round (the maximum over datasets can only be larger). Summing over a window of
``(t, c)`` drops only non-negative terms, so the windowed value stays a lower bound.
Tests compare it with brute-force enumeration of the actual mechanisms' histograms.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special, stats

from shuffledp.protocol.accounting._numerics import search_epsilon

from shuffledp.protocol.errors import InvalidParameter

#: Half-width of the summation windows in standard deviations (dropped mass below 1e-8 of
#: the total: only non-negative terms are dropped, so the value stays a lower bound).
WINDOW_SD = 6.0


def _binom_pmf(c: np.ndarray, t: np.ndarray, logp: float, logq: float) -> np.ndarray:
    """``Bin(t, p)`` pmf at ``c`` on a grid (0 outside ``0 <= c <= t``)."""
    ok = (c >= 0) & (c <= t)
    cc, tt = np.where(ok, c, 0.0), np.where(ok, t, 0.0)
    logpmf = special.gammaln(tt + 1) - special.gammaln(cc + 1) - special.gammaln(tt - cc + 1) + cc * logp + (tt - cc) * logq
    return np.where(ok, np.exp(logpmf), 0.0)


def _window(n: int, p: float) -> np.ndarray:
    mu, sd = n * p, math.sqrt(max(n * p * (1 - p), 0.0))
    return np.arange(max(0, math.floor(mu - WINDOW_SD * sd - 2)), min(n, math.ceil(mu + WINDOW_SD * sd + 2)) + 1)


def thinned_rr_delta(eps: float, n: int, epsilon0: float, tau: float, chunk: int = 512) -> float:
    """Exact hockey-stick divergence (max of both directions) at ``eps``, other users all at ``x1``."""
    if not (isinstance(n, (int, np.integer)) and n >= 1):
        raise InvalidParameter("n", f"must be an integer >= 1, got {n!r}")
    if not 0 < tau <= 1:
        raise InvalidParameter("tau", f"must be in (0, 1], got {tau!r}")
    rho = 1.0 / (1.0 + math.exp(-epsilon0))
    r = 1.0 - rho
    E = math.exp(eps)
    log_r, log_rho = math.log(r), math.log(rho)
    m = n - 1
    ts = _window(m + 1, tau)  # t = informative reports in the view, 0..n
    b = stats.binom(m, tau)
    fwd = bwd = 0.0
    for start in range(0, len(ts), chunk):
        t = ts[start: start + chunk].astype(np.float64)[:, None]
        hi_sd = math.sqrt(max(float(t.max()) * r * rho, 1.0))
        c_lo = max(0, math.floor(float(t.min()) * r - WINDOW_SD * hi_sd - 2))
        c_hi = math.ceil(float(t.max()) * r + WINDOW_SD * hi_sd + 3)
        c = np.arange(c_lo, c_hi + 1, dtype=np.float64)[None, :]
        b_prev = b.pmf(t - 1)  # b(t-1)
        b_here = b.pmf(t)
        prev = np.maximum(t - 1, 0)  # t = 0 has b(t-1) = 0: any finite pmf will do
        cx = np.arange(c_lo - 1, c_hi + 1, dtype=np.float64)[None, :]
        B_prev = _binom_pmf(cx, prev, log_r, log_rho)
        B_prev_c, B_prev_cm1 = B_prev[:, 1:], B_prev[:, :-1]
        B_here = _binom_pmf(c, t, log_r, log_rho)
        common = (1 - tau) * b_here * B_here
        P = tau * b_prev * (rho * B_prev_cm1 + r * B_prev_c) + common
        Q = tau * b_prev * (r * B_prev_cm1 + rho * B_prev_c) + common
        fwd += float(np.maximum(P - E * Q, 0.0).sum())
        bwd += float(np.maximum(Q - E * P, 0.0).sum())
    return max(fwd, bwd)


def thinned_rr_lower_epsilon(delta: float, n: int, epsilon0: float, tau: float, rtol: float = 1e-4) -> float:
    """A lower bound on the round's eps(delta): the lower end of the bracket of
    :func:`_numerics.search_epsilon`, where this dataset's divergence was checked to exceed ``delta``
    (0 if it never does)."""
    if not 0 < delta < 1:
        raise InvalidParameter("delta", f"must be in (0, 1), got {delta!r}")
    lower, _ = search_epsilon(lambda e: thinned_rr_delta(e, n, epsilon0, tau), delta, 0.0, float(epsilon0), rtol=rtol)
    return lower


def k_rr_tau(epsilon0: float, k: int) -> float:
    """Informative fraction of k-ary RR on a pair (module doc)."""
    return (math.exp(epsilon0) + 1.0) / (math.exp(epsilon0) + k - 1.0)


def laplace_report_tau(epsilon0: float, grid_levels: int) -> float:
    """Informative fraction of the three-level post-processing of the Laplace report (module doc)."""
    r = math.exp(-epsilon0 / grid_levels)
    return (1.0 + math.exp(-epsilon0)) / (1.0 + r)
