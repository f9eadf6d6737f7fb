"""Small numerical helpers shared by the bounds: binomial tails and monotone search.

Everything here is vectorized numpy/scipy. The searches keep a *bracket* whose ends
have been evaluated, so a caller that needs an upper bound on epsilon takes the
upper end (where ``delta(eps) <= target`` was checked) and a caller that needs a
lower bound takes the lower end: rounding in the search never flips the direction
of a bound.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
from scipy import special

#: Relative accuracy we allow the incomplete-beta binomial tails. ``betainc`` is
#: accurate to ~5e-12 relative even at n = 1e8 (checked against 30-digit sums);
#: ``scipy.special.bdtrc`` is *not* (errors of 3e-9 at n = 2e6), so we never use it.
#: The hockey-stick sums subtract two tails, so every difference is padded by
#: this fraction of its positive part.
TAIL_RTOL = 1e-10


def binom_sf_ge(j, n, p):
    """``Pr[Bin(n, p) >= j]`` elementwise (``j`` may be <= 0 or > ``n``)."""
    j, n = np.broadcast_arrays(np.asarray(j, dtype=np.float64), np.asarray(n, dtype=np.float64))
    out = np.where(j <= 0, 1.0, 0.0)
    mid = (j > 0) & (j <= n)
    if np.any(mid):
        out = out.astype(np.float64)
        out[mid] = special.betainc(j[mid], n[mid] - j[mid] + 1.0, p)
    return out


def binom_cdf_le(k, n, p):
    """``Pr[Bin(n, p) <= k]`` elementwise (``k`` may be < 0 or >= ``n``)."""
    k, n = np.broadcast_arrays(np.asarray(k, dtype=np.float64), np.asarray(n, dtype=np.float64))
    out = np.where(k >= n, 1.0, 0.0)
    mid = (k >= 0) & (k < n)
    if np.any(mid):
        out = out.astype(np.float64)
        out[mid] = special.betainc(n[mid] - k[mid], k[mid] + 1.0, 1.0 - p)
    return out


def binom_range(n: int, p: float, z: float) -> tuple[int, int]:
    """An integer window ``[lo, hi]`` around the mean of ``Bin(n, p)``, ``z`` sd wide each side."""
    if n <= 0:
        return 0, 0
    mu = n * p
    sd = math.sqrt(max(n * p * (1.0 - p), 0.0))
    lo = max(0, int(math.floor(mu - z * sd - 2)))
    hi = min(n, int(math.ceil(mu + z * sd + 2)))
    return lo, hi


def block_edges(lo: int, hi: int, blocks: int) -> np.ndarray:
    """Integer edges ``e_0 = lo < e_1 < ... < e_B = hi + 1`` splitting ``[lo, hi]`` into blocks."""
    edges = np.unique(np.round(np.linspace(lo, hi + 1, blocks + 1)).astype(np.int64))
    edges[0] = lo
    edges[-1] = hi + 1
    return edges


def bracket_epsilon(
    delta_of: Callable[[float], float],
    target: float,
    hi: float,
    *,
    lo: float = 0.0,
    rtol: float = 1e-6,
    atol: float = 1e-9,
    max_iter: int = 200,
) -> tuple[float, float]:
    """Bracket ``inf{eps : delta_of(eps) <= target}`` for a non-increasing ``delta_of``.

    Returns ``(a, b)`` with ``delta_of(a) > target`` (or ``a == lo``) and
    ``delta_of(b) <= target`` (or ``b == hi`` when even ``hi`` fails, in which case
    ``b = hi`` is returned unchanged and the caller decides). Bisection is done on
    a geometric/arithmetic mix so both tiny and large epsilons converge quickly.
    """
    if target <= 0:
        raise ValueError("target delta must be > 0")
    a, b = lo, hi
    if delta_of(b) > target:
        return b, b
    if delta_of(a) <= target:
        return a, a
    for _ in range(max_iter):
        if b - a <= max(atol, rtol * b):
            break
        if a > 0 and b / a > 4.0:
            mid = math.sqrt(a * b)
        else:
            mid = 0.5 * (a + b)
        if delta_of(mid) <= target:
            b = mid
        else:
            a = mid
    return a, b


def log_binom_pmf(k, n, p):
    """log of the binomial pmf, exact via gammaln, ``-inf`` outside the support."""
    k = np.asarray(k, dtype=np.float64)
    n = float(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (
            special.gammaln(n + 1.0)
            - special.gammaln(k + 1.0)
            - special.gammaln(n - k + 1.0)
            + special.xlogy(k, p)
            + special.xlog1py(n - k, -p)
        )
    return np.where((k < 0) | (k > n), -np.inf, out)


_U = 2.0**-53


def _steps_from_mode(N: int, log_odds: float, lo: int, hi: int) -> tuple[int, int, np.ndarray, np.ndarray]:
    """``Bin(N, p)``'s mode clipped to ``[lo, hi]`` and the counts ``s`` stepped from, upwards
    (``s -> s + 1`` up to ``hi``) and downwards (``s -> s - 1`` down to ``lo``), for the ratio
    recurrences of the windows below (``log_odds = log(p/(1-p))``)."""
    N, lo, hi = int(N), int(lo), int(hi)
    if not 0 <= lo <= hi <= N:
        raise ValueError(f"window [{lo}, {hi}] outside [0, {N}]")
    p = 1.0 / (1.0 + math.exp(-log_odds))
    mode = min(max(int(math.floor((N + 1) * p)), lo), hi)
    return N, mode, np.arange(mode, hi, dtype=np.float64), np.arange(mode, lo, -1, dtype=np.float64)


def binom_window_shape(N: int, log_odds: float, lo: int, hi: int) -> tuple[np.ndarray, float]:
    """``Bin(N, p)`` on ``[lo, hi]``, normalised to sum 1 there, and a bound on each entry's relative
    error against the true pmf divided by the true mass of ``[lo, hi]`` (``log_odds = log(p/(1-p))``).

    No ``gammaln``: at ``N ~ 1e8`` its log-pmfs are off by ~1e-7, far more than the quantities built
    on them (a Rényi moment of 1e-8, a hockey-stick difference). The shape comes from the exact
    ratios ``(N-s)/(s+1) * p/(1-p)`` accumulated from the mode by ``cumprod`` (the entry ``|s - mode|``
    steps away is within ``7 u |s - mode|`` of the true shape) and is normalised by its sum, taken in
    extended precision (``u' = eps(longdouble)``, ``2^-52`` where that is plain double): the sum is
    within ``7 u E|s - mode| + L u'`` of the true shape's, so every entry is within
    ``7 u (|s - mode| + E|s - mode|) + L u' + 4u`` (padded by 1 %).
    """
    N, mode, up, dn = _steps_from_mode(N, log_odds, lo, hi)
    lo, hi = int(lo), int(hi)
    w = math.exp(log_odds)  # p / (1 - p), relative error <= 2u
    if hi - lo <= 1:
        return _short_window_shape(N, mode, w, lo, hi)
    right = np.cumprod((N - up) / (up + 1.0) * w) if len(up) else np.empty(0)
    left = np.cumprod(dn / (N - dn + 1.0) / w) if len(dn) else np.empty(0)
    shape = np.concatenate([left[::-1], [1.0], right])
    total = np.sum(shape, dtype=np.longdouble)
    pmf = (shape / total).astype(np.float64)
    steps = np.abs(np.arange(lo, hi + 1, dtype=np.float64) - mode)
    mean_steps = float(np.sum(shape * steps) / float(total)) * 1.01 + 1.0
    u_sum = float(np.finfo(np.longdouble).eps)
    rel = (7.0 * _U * (float(steps.max()) + 1.0) + 7.0 * _U * mean_steps + len(shape) * u_sum + 4.0 * _U) * 1.01
    return pmf, rel + 1e-20


def _short_window_shape(N: int, mode: int, w: float, lo: int, hi: int) -> tuple[np.ndarray, float]:
    """:func:`binom_window_shape` on a window of one or two points (``w = p / (1 - p)``) in scalars: the
    same operations (one ratio step from the mode; the extended-precision sum is one addition),
    without numpy's per-call cost (a certificate at a large ``eps0`` takes ~10^5 such windows)."""
    if hi == lo:
        shape = [1.0]
    elif mode == lo:
        shape = [1.0, (N - float(mode)) / (float(mode) + 1.0) * w]
    else:
        shape = [float(mode) / (N - float(mode) + 1.0) / w, 1.0]
    total = np.longdouble(shape[0]) + np.longdouble(shape[1]) if len(shape) == 2 else np.longdouble(1.0)
    pmf = np.array([float(np.longdouble(x) / total) for x in shape])
    steps = [abs(float(k) - mode) for k in range(lo, hi + 1)]
    weighted = shape[0] * steps[0] if len(shape) == 1 else shape[0] * steps[0] + shape[1] * steps[1]
    mean_steps = float(weighted / float(total)) * 1.01 + 1.0
    u_sum = float(np.finfo(np.longdouble).eps)
    rel = (7.0 * _U * (max(steps) + 1.0) + 7.0 * _U * mean_steps + len(shape) * u_sum + 4.0 * _U) * 1.01
    return pmf, rel + 1e-20


def binom_window_log_pmf(N: int, log_odds: float, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """``log`` of ``Bin(N, p)`` on ``[lo, hi]`` normalised to sum 1 there, and a bound on each entry's
    absolute error (in the log) against ``log(true pmf / true mass of [lo, hi])``.

    For Rényi moments, where far entries weighted by a large power of a likelihood ratio may
    dominate: unlike :func:`binom_window_shape` nothing underflows. The logs of the exact ratios
    ``(N-s)/(s+1) * p/(1-p)`` are summed from the mode (``cumsum``): each step adds at most
    ``4u (1 + |log ratio| + |partial sum|)`` of error; the log-sum-exp normalisation adds the
    pmf-weighted mean of those (central entries, the accurate ones, carry the weight) and its
    own roundings. ``gammaln`` is not used: at ``N ~ 1e8``
    its log-pmfs are off by ~1e-7, more than a Rényi moment of 1e-8 (which then came out
    negative, and a session reported epsilon = 0).
    """
    N, mode, up, dn = _steps_from_mode(N, log_odds, lo, hi)
    lr_up = np.log((N - up) / (up + 1.0)) + log_odds
    lr_dn = np.log(dn / (N - dn + 1.0)) - log_odds
    right = np.cumsum(lr_up)
    left = np.cumsum(lr_dn)
    log_shape = np.concatenate([left[::-1], [0.0], right])

    def step_err(lr: np.ndarray, part: np.ndarray) -> np.ndarray:
        return np.cumsum(4.0 * _U * (1.0 + np.abs(lr) + np.abs(part)))

    err = np.concatenate([step_err(lr_dn, left)[::-1], [0.0], step_err(lr_up, right)])
    top = float(np.max(log_shape))
    w = np.exp(log_shape - top)
    total = float(np.sum(w))
    log_total = math.log(total) + top
    # The normaliser's error is the weighted mean of the entries' (e^x - 1 <= 1.01 x for these tiny
    # x), plus the rounding of each exp (argument rounded to u |x - top|) and of the sum (L u).
    wn = w / total
    norm_err = (1.01 * float(wn @ err) + float(wn @ (2.0 * _U * (1.0 + np.abs(log_shape - top))))
                + (len(log_shape) + 4) * _U + 2.0 * _U * (1.0 + abs(log_total)))
    return log_shape - log_total, (err + norm_err) * 1.01 + 1e-300


def binom_log_pmf_half(k, n):
    """log pmf of ``Bin(n, 1/2)`` at ``k`` (vectorized), ``-inf`` off the support."""
    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        out = special.gammaln(n + 1.0) - special.gammaln(k + 1.0) - special.gammaln(n - k + 1.0) - n * math.log(2.0)
    return np.where((k < 0) | (k > n), -np.inf, out)


def standardized_grid(step: float, core: float = 6.0, outer: float = 13.0) -> np.ndarray:
    """Points ``x`` (in standard deviations): spacing ``step`` on ``[-core, core]``,
    then geometrically coarser out to ``+-outer``. Used to place block edges where
    the probability mass is."""
    inner = np.arange(-core, core + step / 2, step)
    tail = []
    x, h = core, step
    while x < outer:
        h *= 1.5
        x = min(outer, x + h)
        tail.append(x)
    outer_points = np.array(tail)
    return np.concatenate([-outer_points[::-1], inner, outer_points])


def search_epsilon(
    delta_of: Callable[[float], float],
    target: float,
    lo: float,
    hi: float,
    *,
    rtol: float = 1e-5,
    atol: float = 1e-10,
    max_iter: int = 100,
) -> tuple[float, float]:
    """Bracket ``inf{eps : delta_of(eps) <= target}`` for non-increasing ``delta_of``.

    Illinois (modified regula falsi) on ``log delta`` with a guaranteed bracket;
    returns ``(a, b)`` with ``delta_of(a) > target`` and ``delta_of(b) <= target``
    (``b`` is therefore a valid epsilon whenever ``delta_of`` is an upper bound;
    ``a`` is a valid lower bound on epsilon when ``delta_of`` is a lower bound).
    Degenerate cases: returns ``(lo, lo)`` if ``delta_of(lo) <= target`` and
    ``(hi, hi)`` if even ``delta_of(hi) > target``.
    """
    if not target > 0:
        raise ValueError("target delta must be > 0")
    lt = math.log(target)

    def f(e: float) -> float:
        d = delta_of(e)
        return (math.log(d) if d > 0 else -1e300) - lt

    fa, fb = f(lo), f(hi)
    if fa <= 0:
        return lo, lo
    if fb > 0:
        return hi, hi
    a, b = lo, hi
    side = 0
    for _ in range(max_iter):
        if b - a <= max(atol, rtol * b):
            break
        if fb < -700:  # log-delta not usable yet (delta underflow): bisect
            x = 0.5 * (a + b)
        else:
            x = b - fb * (b - a) / (fb - fa)
            # keep the step inside the bracket and away from the ends
            lo_x, hi_x = a + 0.02 * (b - a), b - 0.02 * (b - a)
            x = min(max(x, lo_x), hi_x)
        fx = f(x)
        if fx <= 0:
            b, fb = x, fx
            if side == -1:
                fa /= 2
            side = -1
        else:
            a, fa = x, fx
            if side == 1:
                fb /= 2
            side = 1
    return a, b
