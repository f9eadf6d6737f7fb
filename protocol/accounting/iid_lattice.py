"""Exact shuffled divergence of a homogeneous dataset on the full report: a certified lower bound.

**The quantity.** Every other user holds ``x1`` and user 1 holds ``x0`` or ``x1``. With
``Z = R(x0)/R(x1)`` evaluated at a report drawn from ``R(x1)`` (``E[Z] = 1``), the shuffled view's
exact divergences are (``iid_dataset``'s formula with ``pi = R(x1)``)

    D(P0 || P1) = (1/n) E[(sum_i Z_i - n e^eps)_+],   D(P1 || P0) = (1/n) E[(n - e^eps sum_i Z_i)_+],

``Z_i`` i.i.d. Both are lower bounds on the round's ``delta(eps)`` (one dataset of the others).
``iid_dataset`` evaluates such a dataset after merging the reports into three classes; here the
whole law of ``Z`` is kept, up to a lattice contraction that loses about ``1/(12 R^2)`` of its
variance where the mass is spread like the sd, more where it sits far below it (``R`` =
:data:`RESOLUTION`).

**The lattice contraction.** ``W = E[Z | C]`` for a partition ``C`` of the report's mass (atoms may be
split between classes) is smaller than ``Z`` in convex order, and so is ``sum W_i`` than
``sum Z_i`` (independent terms); both functions above are convex in the sum, so replacing ``Z`` by
``W`` can only lower them (Shaked & Shanthikumar 2007, Thm 3.A.12). The partition is built so that
every class's mean is a point ``a + k h`` of a lattice: sweeping the atoms upwards from the
smallest value ``a``, a class targets the first lattice point at or above its first content and
takes mass until its mean reaches it, splitting the atom where it does. The step ``h`` (about
``sd(Z)/R``) puts both end atoms on the lattice and is chosen so that the sweep leaves nothing over
(:func:`contract`); were something left, it would be rounded down (forward direction) or up
(reverse) to the lattice, which moves the sum only in the direction that lowers the divergence.

**Numerics (every approximation on the lowering side).** The sum of ``n`` lattice terms is computed
on a circle by FFT after exponential tilting (``blanket._sum_window``, whose error bound per point is
subtracted), the aliased mass is subtracted (Chernoff bounds on the tilted sum leaving the circle's
span), the terms beyond the window are dropped (non-negative). Floating-point error in the class
means (``|mean - lattice point| <= eta``) shifts the threshold by ``n eta``; the relative error of the
class masses and of ``log M(theta)`` lowers the result by ``(1 + eps_q)^-n`` and ``e^(-n err)``.

Used for the Laplace report (pair ``(0, G)``, the others at ``G``: the dataset the Gaussian limit
puts worst, :mod:`.gaussian_limit`), where the three-class views lose up to 6 % of epsilon.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from shuffledp.protocol.accounting._numerics import search_epsilon
from shuffledp.protocol.accounting.blanket import (  # the summed window: the blanket sums' WINDOW_SD sd
    WINDOW_SD,
    _chernoff_log_tail,
    _sum_window,
    _tilt,
    blanket_epsilon,
    laplace_report_law,
)
from shuffledp.protocol.errors import InvalidParameter

_U = 2.0**-53
#: Lattice step = sd(Z) / RESOLUTION (lowered where the sum's circle would exceed MAX_CIRCLE). Where the
#: mass sits far below the sd (eps0 = 4: most reports have Z < 1, the sd is 6) a class must reach far up
#: to balance it, so the step matters more than ``1/(12 R^2)`` suggests: eps0 = 4, n = 1e6 gave
#: 1.474 / 1.435 / 1.431 / 1.430 times below the blanket at R = 10 / 20 / 40 / 80 (eps0 <= 2: within 0.2 %).
RESOLUTION = 32
#: Largest circle (points) of the n-fold sum; above it the lattice is coarsened, down to MIN_RESOLUTION.
MAX_CIRCLE = 1 << 22
MIN_RESOLUTION = 3


@dataclass(frozen=True)
class LatticeLaw:
    """``W`` on the lattice ``a + k h``: masses ``q_down`` / ``q_up`` on indices ``k`` (the remainder class
    rounded down / up), ``eta`` bounding every class mean's distance to its lattice point, ``rel_q``
    bounding the masses' relative error."""

    a: float
    h: float
    k: np.ndarray
    q_down: np.ndarray
    q_up: np.ndarray
    eta: float
    rel_q: float
    remainder: float
    name: str


def _sweep(v: np.ndarray, p: np.ndarray, a: float, h: float):
    """The greedy partition (module doc) for atoms ``v`` (ascending, ``v[0] = a``) with masses ``p``.

    Returns the closed classes as arrays ``(k, mass, sum)``, the remainder ``(mass, sum)`` and the largest
    number of pieces in one class. An atom within ``tol`` above its class's target is taken whole
    (its distance to the point joins ``eta``)."""
    ks, masses, sums = [], [], []
    S = M = 0.0
    pieces = biggest = 0
    k_t, t = 0, a
    tol = 1e-12 * h
    i, rem = 0, float(p[0])
    n_atoms = len(v)
    while i < n_atoms:
        vi = float(v[i])
        if M == 0.0:
            k_t = max(0, math.ceil((vi - a - tol) / h))
            t = a + k_t * h
            if t < vi - tol:  # the division's rounding: never target below the first content
                k_t += 1
                t = a + k_t * h
        # the whole atom keeps the mean at (or within tol of) the target; always so for a class's first atom
        if S + rem * vi <= t * (M + rem) or vi - t <= tol:
            S += rem * vi
            M += rem
            pieces += 1
            i += 1
            rem = float(p[i]) if i < n_atoms else 0.0
            continue
        f = min(rem, max(0.0, (t * M - S) / (vi - t)))
        ks.append(k_t)
        masses.append(M + f)
        sums.append(S + f * vi)
        biggest = max(biggest, pieces + 1)
        rem -= f
        S = M = 0.0
        pieces = 0
    if M > 0.0 and abs(S / M - t) <= tol:  # the last class ends on its target (an atom on the lattice)
        ks.append(k_t)
        masses.append(M)
        sums.append(S)
        S = M = 0.0
    return (np.array(ks, dtype=np.int64), np.array(masses), np.array(sums)), (M, S), max(biggest, pieces)


#: Lattice sizes tried around the one the resolution asks for (the first whose sweep leaves no remainder wins).
STEP_CANDIDATES = 64


def contract(v: np.ndarray, p: np.ndarray, resolution: float, name: str = "", *, value_rel: float = 4 * _U,
             mass_rel: float = 8 * _U) -> LatticeLaw:
    """The lattice contraction of the law ``(v, p)`` (module doc), step about ``sd / resolution``.

    Both end atoms sit on the lattice (``h = (v_max - v_min) / L``): the bottom one is a class of its
    own, and the top one balances the last class below it and closes the sweep with what is left,
    unless that last class opened within ``h`` of the top (it then cannot reach its target). ``L``
    is tried upwards from the resolution's until the sweep leaves no remainder; else the smallest
    remainder is rounded (module doc).

    ``value_rel`` / ``mass_rel`` bound the relative error of the given values and masses against the
    exact law. The partition is defined by the computed pieces; an atom is split at most once (the
    next class targets a point at or above it and takes the rest whole), so the pieces of an atom
    sum to its mass within ``2u`` relative, which joins ``mass_rel``; every class mass is a sum of
    non-negative pieces (relative error ``pieces u``)."""
    v = np.asarray(v, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    if v.shape != p.shape or v.ndim != 1 or not np.all(np.isfinite(v)) or np.any(p < 0) \
            or not math.isclose(float(p.sum()), 1.0, rel_tol=1e-9):
        raise InvalidParameter("law", "needs finite values and a probability vector of the same length")
    v, where = np.unique(v, return_inverse=True)  # sorted, equal values merged (one atom each)
    merged = np.zeros(len(v))
    np.add.at(merged, where, p)
    p = merged
    if len(v) < 2:
        raise InvalidParameter("law", "needs at least two distinct values")
    a, top = float(v[0]), float(v[-1])
    mean = float(p @ v)
    sd = math.sqrt(max(float(p @ (v - mean) ** 2), 1e-300))
    L0 = max(2, math.ceil((top - a) * resolution / sd))
    best = None
    for L in range(L0, L0 + STEP_CANDIDATES):
        h = (top - a) / L
        got = _sweep(v, p, a, h)
        if best is None or got[1][0] < best[1][1][0]:
            best = (h, got)
        if got[1][0] == 0.0:
            break
    assert best is not None  # the loop ran: STEP_CANDIDATES >= 1
    h, ((k, mass, sums), (m_rem, s_rem), pieces) = best
    # eta: the class means' distance to the lattice (as computed) plus the error of that computation
    means = sums / mass
    eta = float(np.max(np.abs(means - (a + k * h)))) if len(k) else 0.0
    eta += ((2 * pieces + 16) * _U + 2 * value_rel) * max(abs(top), abs(a))
    rel_q = (pieces + 4) * _U + mass_rel
    eta += 2 * rel_q * (top - a)  # the pieces' mass errors move a class mean within the values' range (review)
    if m_rem > 0:  # rounded down (forward direction) / up (reverse): only lowers either divergence
        mean_rem = s_rem / m_rem
        k_down = max(0, math.floor((mean_rem - a) / h) - 1)  # one more step: covers the division's rounding
        k_up = math.ceil((mean_rem - a) / h) + 1
        k_all = np.concatenate([k, [k_down, k_up]])
        q_down = np.concatenate([mass, [m_rem, 0.0]])
        q_up = np.concatenate([mass, [0.0, m_rem]])
    else:
        k_all, q_down, q_up = k, mass, mass
    uniq, where = np.unique(k_all, return_inverse=True)
    qd, qu = np.zeros(len(uniq)), np.zeros(len(uniq))
    np.add.at(qd, where, q_down)
    np.add.at(qu, where, q_up)
    return LatticeLaw(a, h, uniq, qd, qu, eta, rel_q, float(m_rem), name)


def _positive_part_lower(q: np.ndarray, k: np.ndarray, n: int, K0: float, rel_q: float) -> float:
    """A certified lower bound on ``E[(K - K0)_+]``, ``K`` the sum of ``n`` i.i.d. draws of ``(q, k)``."""
    keep = q > 0
    q, k = q[keep], k[keep].astype(np.float64)
    c = K0 / n
    if c >= float(k.max()):  # the sum never exceeds K0
        return 0.0
    tilted = _tilt(q, k - c)
    if tilted is None:  # no negative drift (eps ~ 0): the identity below holds at theta = 0 too
        theta, log_m, pt = 0.0, math.log(float(q.sum())), q / float(q.sum())
    else:
        theta, log_m, pt = tilted
    # relative error of the tilted pmf: exp of log q + theta (k - c) - log M, each carrying a few u of its size
    with np.errstate(divide="ignore"):
        rel_t = 2 * _U * (float(np.max(np.abs(np.log(q)))) + theta * float(np.max(np.abs(k - c))) + abs(log_m) + 4)
    mu = float(pt @ k)
    sd_T = math.sqrt(n * max(float(pt @ (k - mu) ** 2), 1e-300))
    centre = n * mu
    k_start = math.floor(K0) + 1
    k_end = max(k_start, int(math.ceil(centre + WINDOW_SD * sd_T)))
    bulk_lo = int(math.floor(centre - WINDOW_SD * sd_T))
    bulk_hi = int(math.ceil(centre + WINDOW_SD * sd_T))
    span_lo, span_hi = min(k_start, bulk_lo), max(k_end, bulk_hi)  # the circle's span (_sum_window's)
    if span_hi - span_lo > 2 * MAX_CIRCLE:  # too wide to sum: 0 is a lower bound
        return 0.0
    got = _sum_window(pt, k, n, k_start, k_end, bulk_lo, bulk_hi, theta, rel_q + rel_t)
    if got is None:
        return 0.0
    vals, err_c = got
    alias = math.exp(_chernoff_log_tail(pt, k, n, span_hi + 1.0)) + math.exp(_chernoff_log_tail(pt, -k, n, -(span_lo - 1.0)))
    K = np.arange(k_start, k_end + 1, dtype=np.float64)
    lower_p = np.maximum(vals - err_c - alias, 0.0)
    body = float(np.sum((K - K0) * np.exp(-theta * (K - K0)) * lower_p)) * (1.0 - 1e-12)
    if body <= 1e-290:  # subnormal territory (relative error unbounded there): 0 is a lower bound
        return 0.0
    log_total = n * log_m + math.log(body)
    # log M's error; the masses' and the tilted pmf's relative errors, n-fold (convolutions of non-negatives)
    log_total -= 4.0 * n * (len(pt) + 4) * _U + n * (math.log1p(rel_q) + math.log1p(rel_t))
    return math.exp(log_total) if log_total > -660.0 else 0.0  # below ~1e-287: 0, clear of subnormals


def lattice_delta(law: LatticeLaw, n: int, eps: float, directions: tuple[str, ...] = ("reverse",)) -> float:
    """A certified lower bound on the homogeneous dataset's ``delta(eps)``: the largest of the given
    directions. ``reverse`` (``D(P1 || P0)``) was the larger in every case measured (eps0 = 0.5-4,
    n = 1e3-1e5, by up to orders of magnitude in the tail), so it is the default; either is a lower bound."""
    E = math.exp(eps)
    a, h, eta = law.a, law.h, law.eta
    best = 0.0
    if "forward" in directions:  # (1/n) E[(sum W - n E)_+] = (h/n) E[(K - K0)_+], W lowered by eta
        best = h / n * _positive_part_lower(law.q_down, law.k, n, n * (E + eta - a) / h, law.rel_q)
    if "reverse" in directions:  # (1/n) E[(n - E sum W)_+] = (E h/n) E[(K1 - K)_+], W raised by eta
        K1 = n * (1.0 - E * (a + eta)) / (E * h)
        best = max(best, E * h / n * _positive_part_lower(law.q_up, -law.k, n, -K1, law.rel_q))
    return best


def lattice_lower_epsilon(law: LatticeLaw, n: int, delta: float, epsilon0: float, rtol: float = 1e-4,
                          upper: float | None = None) -> float:
    """A lower bound on the round's ``eps(delta)``: a point where :func:`lattice_delta` was checked to exceed
    ``delta``. ``upper``: any valid upper bound on the round's epsilon (there the lower bound on delta is
    at most ``delta``), which brackets the search in a few evaluations instead of halving from ``eps0``."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InvalidParameter("n", f"must be an integer >= 1, got {n!r}")
    if not 0 < delta < 1:
        raise InvalidParameter("delta", f"must be in (0, 1), got {delta!r}")
    memo: dict[float, float] = {}

    def delta_of(e: float) -> float:
        if e not in memo:
            memo[e] = lattice_delta(law, int(n), e)
        return memo[e]

    hi = float(epsilon0) if upper is None else min(float(epsilon0), float(upper))
    if delta_of(0.0) <= delta:  # nothing to certify above 0 (and 0 is always a lower bound)
        return 0.0
    lo = 0.0
    if upper is not None:
        lo = hi / 2.0
        smallest = 1e-6 * hi  # of the first bracket: the halving stops there, not at underflow
        while delta_of(lo) <= delta and lo > smallest:
            hi, lo = lo, lo / 2.0
    lower, _ = search_epsilon(delta_of, delta, lo, hi, rtol=rtol)
    return lower if delta_of(lower) > delta else 0.0


def _largest_resolution(n: int) -> float:
    """The resolution at which the n-fold sum's circle (about ``2 WINDOW_SD R sqrt(n)`` points, with a
    margin for the tilted spread) reaches :data:`MAX_CIRCLE`."""
    return MAX_CIRCLE / (2.5 * WINDOW_SD * math.sqrt(n))


def law_for(build, n: int) -> LatticeLaw | None:
    """``build(resolution)`` at :data:`RESOLUTION` (lowered to fit the circle at ``n``), refined four-fold
    while the sweep leaves a remainder or merges the law into fewer than ``R/2`` classes (heavy tails,
    eps0 = 8: most mass far below the sd, 3 classes at R = 32; 543 at R = 128, where the lower bound
    at n = 1e6 rises from 0.109 to 0.175) and the circle still fits; None if even
    :data:`MIN_RESOLUTION` does not fit, or if the law still has fewer than ``R/2`` classes."""
    top = _largest_resolution(n)
    if top < MIN_RESOLUTION:
        return None
    R = min(float(RESOLUTION), top)
    law = build(R)
    while (law.remainder > 0 or len(law.k) < R / 2) and 4 * R <= top:
        R *= 4
        law = build(R)
    if len(law.k) < R / 2:  # still merged into a few wide classes: not worth an FFT at this n
        return None
    return law


@dataclass(frozen=True)
class LaplaceEndpointLattice:
    """The Laplace report's homogeneous dataset (pair ``(0, G)``, the others at ``G``) on the full report,
    as a lower-bound view beside ``iid_dataset``'s three-class ones."""

    epsilon0: float
    grid_levels: int

    @property
    def name(self) -> str:
        return "laplace/others-at-G/full"

    def lower_epsilon(self, n: int, delta: float, epsilon0: float) -> float:
        law = law_for(lambda R: laplace_endpoint_law(self.epsilon0, self.grid_levels, R), int(n))
        if law is None:
            return 0.0
        upper = blanket_epsilon(laplace_report_law(self.epsilon0, self.grid_levels), int(n), delta, self.epsilon0)
        return lattice_lower_epsilon(law, n, delta, epsilon0, upper=upper)


@functools.lru_cache(maxsize=32)
def laplace_endpoint_law(epsilon0: float, grid_levels: int, resolution: float = RESOLUTION) -> LatticeLaw:
    """The Laplace report, pair ``(0, G)``, every other user at ``G``: ``Z = r^(|y| - |y - G|)`` under
    ``R(G)``, i.e. ``e^eps0`` with mass ``r^G/(1 + r)`` (reports ``<= 0``), ``e^(eps0 (G - 2y)/G)`` with
    mass ``c r^(G - y)`` for ``0 < y < G``, and ``e^-eps0`` with mass ``1/(1 + r)`` (reports ``>= G``)."""
    G = int(grid_levels)
    if G < 1 or not (math.isfinite(epsilon0) and epsilon0 > 0):
        raise InvalidParameter("laplace", f"needs G >= 1 and eps0 > 0, got G = {grid_levels!r}, eps0 = {epsilon0!r}")
    log_r = -epsilon0 / G
    r = math.exp(log_r)
    c = -math.expm1(log_r) / (1.0 + r)
    y = np.arange(1, G, dtype=np.float64)
    v = np.concatenate([[math.exp(-epsilon0)], np.exp(epsilon0 * (G - 2.0 * y[::-1]) / G), [math.exp(epsilon0)]])
    p = np.concatenate([[1.0 / (1.0 + r)], c * np.exp((G - y[::-1]) * log_r), [math.exp(G * log_r) / (1.0 + r)]])
    # values: exp of a product with error u |eps0| + u; masses: exp and a few products
    return contract(v, p, resolution, f"laplace/others-at-G/full(R={resolution:g})",
                    value_rel=(abs(epsilon0) + 4) * _U, mass_rel=(abs(epsilon0) + 16) * _U)
