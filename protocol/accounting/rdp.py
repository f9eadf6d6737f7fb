"""Rényi DP of one shuffled round, subsampling, and conversion to (eps, delta).

Three RDP curves, all upper bounds on ``D_lambda`` of the round for every pair of
neighbouring datasets (replace-one), at integer orders ``lambda >= 2``:

* :func:`girgis_rdp` -- Girgis, Data, Diggavi, Suresh & Kairouz, "On the Rényi
  Differential Privacy of the Shuffle Model" (CCS 2021), Theorem 1 (general
  ``eps0``-LDP randomizers)::

      eps(lambda) <= 1/(lambda-1) log( 1 + C(lambda,2) (e^eps0 - 1)^2 / (nbar e^eps0)
                      + sum_{j=3}^{lambda} C(lambda,j) j Gamma(j/2) ((e^{2 eps0} - 1)^2 / (2 e^{2 eps0} nbar))^{j/2}
                      + e^{eps0 lambda - (n-1)/(8 e^eps0)} ),
      nbar = floor((n-1)/(2 e^eps0)) + 1.

  The last term is the Chernoff probability that fewer than half the expected
  ``(n-1) e^-eps0`` clones appear, times the worst moment ``e^{eps0 lambda}``. We also
  cap by the always-valid ``min(eps0, lambda eps0^2 / 2)`` (pure ``eps0``-DP implies
  ``eps0^2/2``-zCDP; Bun & Steinke 2016).
* :func:`clone_pair_rdp` -- the Rényi divergence of a clone dominating pair
  (:class:`~shuffledp.protocol.accounting.clones.ClonePair` with ``a2 = 0``: FMT21 or
  the stronger clone), computed numerically. The round is a post-processing of the
  pair, and Rényi divergence obeys data processing, so this is a valid RDP bound
  (FMT21 point out their reduction yields RDP bounds numerically). Given the clone
  count ``c`` (which the view reveals), the moment ``E_Q[(P/Q)^lambda]`` is a sum over
  ``a`` of ``Bin(c+1, 1/2)(a) l_P(a)^lambda l_Q(a)^(1-lambda)``; it is non-increasing in
  ``c``, so blocks of ``c`` are bounded by their left end.
* :func:`wor_subsampled_rdp` -- Wang, Balle & Kasiviswanathan (AISTATS 2019),
  Theorem 9: RDP of a mechanism run on a uniformly random subset of ``m`` of ``N``
  records (``gamma = m/N``), replace-one neighbours::

      eps'(lambda) <= 1/(lambda-1) log(1 + gamma^2 C(lambda,2) min{4 (e^{eps(2)} - 1),
                        e^{eps(2)} min{2, (e^{eps(inf)} - 1)^2}}
                      + sum_{j=3}^{lambda} gamma^j C(lambda,j) e^{(j-1) eps(j)} min{2, (e^{eps(inf)} - 1)^j}).

  dp-accounting implements the Gaussian special case (``eps(inf) = inf``,
  ``_compute_rdp_sample_wor_gaussian``, with the sharper Theorem 27 for j >= 3); the
  tests check that this generic form reproduces its order-2 value and dominates it
  elsewhere.

Conversion to ``(eps, delta)`` uses dp-accounting's
``rdp_privacy_accountant.compute_epsilon`` (Proposition 12 of Canonne, Kamath &
Steinke 2020).
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np
from scipy import special

from shuffledp.protocol.accounting._numerics import binom_cdf_le, binom_window_log_pmf
from shuffledp.protocol.accounting.clones import ClonePair
from shuffledp.protocol.errors import InvalidParameter

#: Contiguous integer orders (subsampling needs every integer up to the max).
DEFAULT_ORDERS = tuple(range(2, 65))
#: Plus sparse large orders: converting a single round (or few rounds) to
#: (eps, delta) costs ``log(1/delta)/(lambda-1)``, so small epsilons need large orders.
EXTENDED_ORDERS = DEFAULT_ORDERS + (80, 96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096, 8192, 16384)
#: Largest order at which :func:`clone_pair_rdp` is evaluated (above: ``inf``, i.e. no claim).
CLONE_RDP_MAX_ORDER = 256


def _orders(orders: Sequence[int] | np.ndarray | None) -> np.ndarray:
    o = np.asarray(DEFAULT_ORDERS if orders is None else orders)
    if o.size == 0 or np.any(o < 2) or np.any(o != np.round(o)):
        raise InvalidParameter("orders", "must be integers >= 2")
    return o.astype(int)


def pure_dp_rdp(epsilon0: float, orders: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
    """RDP valid for any pure ``eps0``-DP mechanism: ``min(eps0, lambda eps0^2/2)``."""
    o = _orders(orders)
    return np.minimum(epsilon0, o * epsilon0**2 / 2.0)


def girgis_rdp(epsilon0: float, n: int, orders: Sequence[int] | None = None) -> np.ndarray:
    """Girgis et al. (CCS 2021) Theorem 1 upper bound on the RDP of one shuffled round."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InvalidParameter("n", f"must be an integer >= 1, got {n!r}")
    o = _orders(orders)
    return _girgis_rdp(float(epsilon0), int(n), tuple(o.tolist())).copy()


@functools.lru_cache(maxsize=64)
def _girgis_rdp(e0: float, n: int, orders: tuple) -> np.ndarray:
    """:func:`girgis_rdp` on checked arguments, once per process.

    The sum over ``j`` is shared by every order: with ``g(j) = log j + log Gamma(j/2) + (j/2) log x
    - log j!``, the order-``lambda`` term is ``log lambda! - log (lambda-j)! + g(j)``, so one table of
    ``g`` and of ``log k!`` serves all orders (the same numbers as a loop over orders).
    """
    o = np.asarray(orders, dtype=int)
    nbar = math.floor((n - 1) / (2.0 * math.exp(e0))) + 1
    log_t2_base = 2.0 * math.log(math.expm1(e0)) - math.log(nbar) - e0
    log_x = 2.0 * math.log(math.expm1(2.0 * e0)) - math.log(2.0) - 2.0 * e0 - math.log(nbar)
    top = int(o.max())
    k = np.arange(0, top + 1, dtype=np.float64)
    log_fact = special.gammaln(k + 1)
    j_all = np.arange(3, top + 1, dtype=np.float64)
    g_all = np.log(j_all) + special.gammaln(j_all / 2.0) + (j_all / 2.0) * log_x - log_fact[3:]
    out = np.empty(o.shape, dtype=np.float64)
    for idx, lam in enumerate(o.tolist()):
        terms = [np.array([0.0, log_fact[lam] - log_fact[2] - log_fact[lam - 2] + log_t2_base])]
        if lam >= 3:
            terms.append(log_fact[lam] - log_fact[lam - 3::-1][: lam - 2] + g_all[: lam - 2])
        terms.append(np.array([e0 * lam - (n - 1) / (8.0 * math.exp(e0))]))
        t = np.concatenate(terms)
        # log sum exp(t), the largest term apart: at large n the first term (0) dominates and the
        # others are below double precision relative to it, so ``log(sum)`` would round them away
        # (the moment to 0: below the true value); ``log1p`` of the rest keeps them.
        top = int(np.argmax(t))
        m = float(t[top])
        rest = float(np.sum(np.exp(np.delete(t, top) - m)))
        out[idx] = (math.log1p(rest) * (1.0 + 4.0 * 2.0**-52) + m) / (lam - 1)
    return np.minimum(out, pure_dp_rdp(e0, o))


def clone_pair_rdp(pair: ClonePair, orders: Sequence[int] | None = None, c_blocks: int = 48) -> np.ndarray:
    """Numerical RDP (max over both directions) of a clone pair with ``a2 = 0``.

    Upper bound: ``c``-blocks use their left end (moments are non-increasing in ``c``),
    the ``a``-window outside ``+-w`` standard deviations is bounded by its probability
    times the largest ratio ``(a0/a1)^(lambda-1)``, and the ``c``-tails likewise.
    Orders above :data:`CLONE_RDP_MAX_ORDER` get ``inf`` (no claim).
    """
    if pair.a2 != 0.0 or pair.scale != 1.0:
        raise InvalidParameter("pair", "numerical RDP is implemented for pairs without a Q2 part (a2 = 0, scale 1)")
    o_all = _orders(orders)
    return _clone_pair_rdp_cached(pair.n, pair.a0, pair.a1, pair.r, tuple(o_all.tolist()), int(c_blocks)).copy()


@functools.lru_cache(maxsize=64)
def _clone_pair_rdp_cached(n: int, a0: float, a1: float, r: float, orders: tuple, c_blocks: int) -> np.ndarray:
    """:func:`clone_pair_rdp` keyed on the pair's exact parameters (computed once per process)."""
    pair = ClonePair(n, a0, a1, 0.0, r, 0.0)
    o_all = np.asarray(orders, dtype=int)
    keep = o_all <= CLONE_RDP_MAX_ORDER
    result = np.full(o_all.shape, np.inf)
    if not np.any(keep):
        return result
    result[keep] = _clone_pair_rdp(pair, o_all[keep], c_blocks)
    return result


def _clone_pair_rdp(pair: ClonePair, orders: np.ndarray, c_blocks: int) -> np.ndarray:
    o = orders.astype(np.float64)
    m, rt = pair.m, pair.clone_rate
    b0 = pair.a0 / (pair.a0 + pair.a1)
    b1 = 1.0 - b0
    log_ratio = math.log(b0 / b1)
    if m == 0 or rt <= 0:
        edges = np.array([0.0, 1.0])
        wts = np.array([1.0])
        tail_lo = tail_hi = 0.0
    else:
        mu, sd = m * rt, math.sqrt(m * rt * (1 - rt))
        lo = max(0.0, math.floor(mu - 13 * sd - 2))
        hi = min(float(m), math.ceil(mu + 13 * sd + 2))
        if hi - lo + 1 <= c_blocks:
            edges = np.arange(lo, hi + 2.0)
        else:
            edges = np.unique(np.round(np.linspace(lo, hi + 1, c_blocks + 1)))
        if lo > 0:  # lower tail: geometric blocks down to c = 0 (small c = large moments)
            below = np.unique(np.round(lo - np.geomspace(1.0, lo, 24)))
            edges = np.unique(np.concatenate([below[below >= 0], [0.0], edges]))
        cdf = binom_cdf_le(edges - 1.0, m, rt)
        wts = np.diff(cdf)
        tail_lo, tail_hi = 0.0, float(1 - cdf[-1])
    cs = np.array(list(edges[:-1]) + [edges[-1] - 1.0])  # block left ends, then the window's last c
    width = max(14.0, math.sqrt(2.0 * (o.max() - 1) * log_ratio + 80.0))
    ss = cs + 1.0
    a_los = np.maximum(0.0, np.floor(ss / 2 - width * np.sqrt(ss) / 2.0 - 1))
    a_his = np.minimum(ss, np.ceil(ss / 2 + width * np.sqrt(ss) / 2.0 + 1))
    # mass of P outside each a-window (one vectorized call), times the largest ratio^(lambda-1)
    out_masses = binom_cdf_le(a_los - 1.0, ss - 1.0, 0.5) + (1.0 - binom_cdf_le(a_his - 1.0, ss - 1.0, 0.5))
    log_moments = np.empty((len(cs), len(o)))
    order_list = o.astype(np.int64).tolist()
    for i, (s, a_lo, a_hi) in enumerate(zip(ss.tolist(), a_los.tolist(), a_his.tolist())):
        a = np.arange(a_lo, a_hi + 1.0)
        # Bin(s - 1, 1/2) shifted by user 1's draw ... the view's count a ~ Bin(s, 1/2) on [a_lo, a_hi],
        # normalised there (the true in-window mass is at most 1, so this is from above), each
        # log within `logy_err` (no gammaln: its ~1e-7 error at s ~ 1e8 exceeded the moment itself)
        logy, logy_err = binom_window_log_pmf(int(s), 0.0, int(a_lo), int(a_hi))
        num, den = b0 * a + b1 * (s - a), b1 * a + b0 * (s - a)
        lq = np.log(2.0 / s) + np.log(den)
        d = np.log(num / den)  # log(l_P / l_Q), formed as one ratio: within 6u (1 + |d|)
        base = logy + logy_err + lq  # each count's own error bound (central ones are the tightest)
        mom = _log_power_sums(base, d, order_list)
        # the logs' rounding: d enters lam times, base once (each log within a few ulps of its size)
        mom = (mom + 8.0 * 2.0**-53 * (1.0 + float(np.max(np.abs(base))))
               + o * 6.0 * 2.0**-53 * (1.0 + float(np.max(np.abs(d)))))
        out_mass = float(out_masses[i])
        if out_mass > 0:
            mom = np.logaddexp(mom, math.log(out_mass) + (o - 1) * log_ratio)
        log_moments[i] = mom
    terms = [np.log(np.maximum(wts, 1e-300))[:, None] + log_moments[:-1]]
    extra = []
    if tail_lo > 0:
        extra.append(math.log(tail_lo) + (o - 1) * log_ratio)
    if tail_hi > 0:
        extra.append(math.log(tail_hi) + log_moments[-1])
    total = special.logsumexp(terms[0], axis=0)
    for e in extra:
        total = np.logaddexp(total, e)
    rdp = total / (o - 1)
    return np.minimum(np.maximum(rdp, 0.0), pure_dp_rdp(pair.epsilon_max, orders))


def binary_rr_rdp_floor(epsilon0: float, n: int, orders: Sequence[int] | None = None) -> np.ndarray:
    """A *lower* bound, per order, on every RDP curve the session's RDP route can use for a round of
    ``n`` reports at local budget ``epsilon0``: the exact Rényi divergence of shuffled binary RR on
    one dataset (the other ``n - 1`` users all hold 0), the larger of the two directions.

    Why it is below them: the route takes the minimum of Girgis et al.'s bound and the numerical
    RDP of the FMT21 or stronger-clone pair (:func:`clone_pair_rdp`). Each of those is an upper
    bound on the RDP of *every* round it applies to, and each applies to shuffled binary RR at the
    same ``eps0`` (Girgis et al. and FMT21: every ``eps0``-LDP randomizer; the stronger clone:
    binary RR is in its class), whose RDP is at least that of any one dataset. The sum over counts
    is restricted to the views ``s`` whose two neighbours ``x(s-1), x(s)`` of the others' count lie
    within +-12 sd of its mean (positive terms dropped: still a lower bound). The others' count
    comes from :func:`_numerics.binom_window_log_pmf` (normalised on the window: times
    ``1 - out`` it is below the true pmf; each log within its stated error, which every term
    gives up: ``(2 lam - 1)`` times it, since ``P1`` enters with power ``lam`` and ``P0`` with
    ``1 - lam``), and the result is lowered by ``1e-9`` relative for the remaining rounding.
    """
    o = _orders(orders).astype(np.float64)
    m = int(n) - 1
    e0 = float(epsilon0)
    log_rho, log_r = -math.log1p(math.exp(-e0)), -math.log1p(math.exp(e0))
    if m == 0:
        log_p1, log_p0 = np.array([log_r, log_rho]), np.array([log_rho, log_r])
    else:
        r = math.exp(log_r)
        mu, sd = m * r, math.sqrt(m * r * (1 - r))
        lo, hi = max(0, int(mu - 12 * sd) - 2), min(m, int(mu + 12 * sd) + 2)
        log_x, log_err = binom_window_log_pmf(m, -e0, lo, hi)  # log odds of r: -eps0
        out_mass = float(binom_cdf_le(lo - 1.0, m, r) + (1.0 - binom_cdf_le(float(hi), m, r))) * (1 + 1e-9) + 1e-300
        log_x = log_x + math.log1p(-min(out_mass, 0.5)) - log_err  # below the true pmf
        err_x = 2.0 * log_err  # how far above the true pmf log_x + err_x may be
        # the view X + Bern at s where both x(s - 1) and x(s) are known: inside the window, and at
        # s = 0 or s = m + 1 when the window reaches the end of the support (x(-1) = x(m+1) = 0
        # exactly); at a cut edge one of them would be missing and P/Q would not be the true ratio
        if lo == 0:
            log_x, err_x = np.concatenate([[-np.inf], log_x]), np.concatenate([[0.0], err_x])
        if hi == m:
            log_x, err_x = np.concatenate([log_x, [-np.inf]]), np.concatenate([err_x, [0.0]])
        log_prev, log_here = log_x[:-1], log_x[1:]
        view_err = np.maximum(err_x[:-1], err_x[1:]) + 8 * 2.0**-53 * (1.0 + np.abs(np.nan_to_num(log_here, neginf=0.0)))
        log_p1 = np.logaddexp(log_rho + log_prev, log_r + log_here)  # user 1 holds 1 (a lower bound)
        log_p0 = np.logaddexp(log_r + log_prev, log_rho + log_here)  # user 1 holds 0 (a lower bound)
    out = np.empty(len(o))
    for i, lam in enumerate(o.tolist()):
        best = -np.inf
        for lp, lq in ((log_p1, log_p0), (log_p0, log_p1)):
            # lp is below the truth; lq + view_err above it, and it enters with power 1 - lam < 0
            t = lam * lp + (1.0 - lam) * (lq + view_err) if m else lam * lp + (1.0 - lam) * lq
            top = float(np.max(t))
            best = max(best, (math.log(float(np.sum(np.exp(t - top)))) + top) / (lam - 1.0))
        out[i] = max(0.0, best) * (1.0 - 1e-9)
    return out


def _log_power_sums(log_w: np.ndarray, d: np.ndarray, orders: list[int]) -> np.ndarray:
    """``log sum_a exp(log_w + lam d)`` for every integer order ``lam`` of ``orders`` (increasing).

    One ``exp`` per point, then powers of ``v = e^d`` by repeated multiplication (instead of an
    ``exp`` per point and order), rescaled to a maximum of 1 at every order; the largest term's log
    is checked at every order and the products restarted from the logs where they lost it, so
    only terms below ``1e-308`` of the largest can be missing (each counted as 1e-300). Each term carries at most
    ``(2 lam + 4) u`` relative rounding and the sum ``len(a) u`` more, and the running log scale
    one rounding of its size per order: every result is padded up by all of that (it feeds
    upper bounds).
    """
    shift = float(np.max(log_w))
    v = np.exp(d)
    pw = np.exp(log_w - shift) * v ** orders[0]
    scale = shift
    scale_err = 0.0  # rounding of the running log scale (additions of logs), added to every result
    out = np.empty(len(orders))
    prev = orders[0]
    for j, lam in enumerate(orders):
        if lam != prev:
            with np.errstate(over="ignore", under="ignore", invalid="ignore"):
                pw = pw * (v ** (lam - prev) if lam - prev > 1 else v)
            prev = lam
        top = float(np.max(pw))
        # The largest term at this order, in logs (cheap: no exp). If the running products lost it
        # (an entry that underflowed at a lower order, or an over/underflow now), start again from
        # the logs: then every term that underflows is below 1e-308 of the largest.
        x = log_w + lam * d
        true_top = float(np.max(x))
        lost = (top <= 0.0 or not math.isfinite(top)
                or scale + math.log(top) < true_top - 64 * 2.0**-52 * (1.0 + abs(true_top)) - 4.0 * scale_err
                or bool(np.any((pw == 0.0) & (x > scale + math.log(top) - 700.0))))
        if lost:
            scale = true_top
            pw = np.exp(x - scale)
            top = 1.0
            scale_err = 4.0 * 2.0**-52 * (float(np.max(np.abs(log_w))) + lam * float(np.max(np.abs(d))) + abs(scale))
        pw = pw / top
        log_top = math.log(top)
        scale += log_top
        scale_err += 2.0**-52 * (abs(scale) + abs(log_top))
        pad = (2.0 * lam + 8.0 + len(pw)) * 2.0**-52 + len(pw) * 1e-300  # the last: underflowed terms
        out[j] = math.log(float(np.sum(pw)) * (1.0 + pad) + len(pw) * 1e-300) + scale + 2.0 * scale_err
    return out


def wor_subsampled_rdp(
    inner_rdp: np.ndarray, orders: Sequence[int], gamma: float, eps_inf: float = math.inf
) -> np.ndarray:
    """Wang-Balle-Kasiviswanathan Theorem 9 (uniform subsampling without replacement).

    ``inner_rdp[i]`` is the inner mechanism's RDP at ``orders[i]``. The bound at order
    ``lambda`` needs the inner RDP at every integer ``2..lambda``; orders for which one
    is missing get ``inf`` (no claim). ``eps_inf`` is the inner mechanism's pure-DP
    epsilon (``inf`` if none).
    """
    o = _orders(orders)
    if not 0.0 <= gamma <= 1.0:
        raise InvalidParameter("gamma", f"must be in [0, 1], got {gamma}")
    inner = dict(zip(o.tolist(), np.asarray(inner_rdp, dtype=np.float64).tolist()))
    if 2 not in inner:
        raise InvalidParameter("orders", "need order 2")
    contiguous = 2
    while contiguous + 1 in inner:
        contiguous += 1
    if gamma == 0.0:
        return np.zeros(o.shape)
    if gamma == 1.0:
        return np.asarray([inner[int(x)] for x in o], dtype=np.float64)
    log_g = math.log(gamma)
    if math.isinf(eps_inf):
        log_cap = lambda j: math.log(2.0)  # noqa: E731
    else:
        lx = math.log(math.expm1(eps_inf)) if eps_inf > 0 else -math.inf
        log_cap = lambda j: min(math.log(2.0), j * lx)  # noqa: E731
    e2 = inner[2]
    log_j2 = min(math.log(4.0) + math.log(math.expm1(e2)) if e2 > 0 else -math.inf, e2 + log_cap(2))
    out = np.full(o.shape, np.inf)
    # per order j = 0..contiguous, once: the inner RDP, the cap and log(j!) (terms below, j = 3..lam)
    inner_at = np.array([inner.get(j, np.nan) for j in range(contiguous + 1)])
    cap_at = np.array([log_cap(j) for j in range(contiguous + 1)], dtype=np.float64)
    log_factorial = special.gammaln(np.arange(contiguous + 2))  # gammaln(k) = log((k-1)!)
    for idx, lam in enumerate(o.tolist()):
        if lam > contiguous:
            continue
        log_comb2 = special.gammaln(lam + 1) - special.gammaln(3) - special.gammaln(lam - 1)
        j = np.arange(3, lam + 1)  # every term j = 3..lam at once (the same operations, term by term)
        log_comb = log_factorial[lam + 1] - log_factorial[j + 1] - log_factorial[lam - j + 1]
        terms = np.concatenate([[0.0, 2 * log_g + log_comb2 + log_j2],
                                j * log_g + log_comb + (j - 1) * inner_at[3:lam + 1] + cap_at[3:lam + 1]])
        out[idx] = special.logsumexp(terms) / (lam - 1)
    return out


def rdp_epsilon(orders: Sequence[float] | np.ndarray, rdp: Sequence[float] | np.ndarray, delta: float) -> float:
    """(eps, delta) from an RDP curve via dp-accounting's conversion."""
    if not 0 < delta < 1:
        raise InvalidParameter("delta", f"must be in (0, 1), got {delta}")
    from dp_accounting.rdp import rdp_privacy_accountant  # imported lazily: ~1 s

    eps, _ = rdp_privacy_accountant.compute_epsilon(list(orders), list(rdp), delta)
    return float(eps)
