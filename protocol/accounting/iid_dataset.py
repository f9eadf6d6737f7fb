"""Exact shuffled divergence of one i.i.d. dataset after a three-class post-processing: a lower bound.

**The quantity.** Let every other user's report be an independent draw from ``pi`` and user 1's
from ``R0`` or ``R1`` (two neighbouring inputs). The shuffled view is the multiset of the ``n``
reports; user 1 sits at a uniform position, so ``P0(y_1..y_n) = pi^n(y) (1/n) sum_i R0(y_i)/pi(y_i)``
and likewise ``P1``, hence the exact hockey-stick divergence is

    D_{e^eps}(P0 || P1) = (1/n) E_{Y ~ pi^n}[(sum_i l(Y_i))_+],   l = (R0 - e^eps R1) / pi.

Every report is first mapped to one of three classes, ``A``, ``B`` or ``U`` (a post-processing of
each report, so of the view): user 1 lands in them with ``(a0, a1, a2)`` under ``x0`` and
``(a1, a0, a2)`` under ``x1``, the others with ``(pi_A, pi_B, pi_U)``. With ``M = N_A + N_B ~
Bin(n, pi_A + pi_B)`` and ``N_A | M ~ Bin(M, s)``, ``s = pi_A / (pi_A + pi_B)``, the sum is
``alpha N_A + beta_M`` and

    E[(alpha N + beta)_+] = alpha M s Pr[Bin(M-1, s) >= j0 - 1] + beta Pr[Bin(M, s) >= j0],

``j0`` the first count with ``alpha j0 + beta > 0``: one pair of incomplete-beta tails per ``M``,
so an evaluation costs ``O(sqrt n)`` at any ``n``.

**Why it is a lower bound.** A fixed dataset (here: the others' inputs drawn i.i.d., a mixture of
fixed datasets, whose divergence is at most the largest of theirs by joint convexity) can only
be below the maximum over datasets, and the three-class map is a post-processing. Numerically:
the ``M`` window drops only non-negative terms; each tail carries at most ``TAIL_RTOL`` relative
error (``_numerics``: ``betainc`` is good to 5e-12 up to ``n = 1e8``), so each term is lowered by
``TAIL_RTOL (alpha M s T1 + |beta| T2)``; the binomial pmf of ``M`` (``gammaln``) is lowered by
``PMF_RTOL``, which covers its rounding up to ``n = 1e9``. The returned epsilon is one where the
lowered divergence was checked to exceed ``delta``.

**Datasets used** (:func:`lower_bound_candidates`): for k-RR, the others all holding a third value
``c`` (classes: the pair's two values and the rest) -- for ``k >= 3`` this differs from the
blanket law only in merging uninformative atoms whose privacy losses are within ``|1 - e^eps|``,
so it nearly meets the blanket upper bound; the others all holding ``x1`` (thinned binary RR,
:mod:`.thinned_rr`, which this module reproduces and extends to any ``n``). For Hadamard response:
the others at ``x1`` and at a third column. For block Hadamard response with ``B >= 3``: a pair in
different blocks, the others in a third block (its ``2B``-ary-RR-like type). For the Laplace report: ``(0, G)`` with the others at
``G`` on the whole report (:mod:`.iid_lattice`), and, in three classes, with the others at
``G`` or at ``G/2``, classes ``y <= 0``, ``0 < y < G``, ``y >= G``, and with the others at ``G``
classes ``y <= cut``, ``y >= G - cut`` and the middle for a few cuts up to ``3G/8``. For binary RR use
:mod:`.rr_any_n` (all datasets).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special
from shuffledp.protocol.accounting._numerics import TAIL_RTOL, binom_range, binom_sf_ge, log_binom_pmf, search_epsilon
from shuffledp.protocol.errors import InvalidParameter

#: Relative allowance for the gammaln-based log pmf of ``M`` (its absolute error in the log is
#: a few ulps of ``gammaln(n + 1) ~ n log n``: under 1e-5 up to n = 1e9).
PMF_RTOL = 1e-5
#: Half-width of the window of ``M`` in standard deviations (the dropped terms are non-negative,
#: and their mass is below 1e-18: dropping them keeps a lower bound and costs nothing visible).
WINDOW_SD = 9.0


#: Largest grid of ``(M, N_U1)`` a view with a split ``U`` class is summed over; above it the
#: view is evaluated with ``U`` merged (a post-processing of the split view: still a lower bound).
SPLIT_BUDGET = 100_000


@dataclass(frozen=True)
class ThreeClassView:
    """User 1's class probabilities ``(a0, a1, a2)`` under ``x0`` (swapped ``a0, a1`` under ``x1``)
    and every other user's ``(pi_a, pi_b, pi_u)``.

    Optionally the uninformative class ``U`` is kept as two classes ``U1``, ``U2``: user 1 lands
    in ``U1`` with ``u1_user`` under both inputs, the others with ``u1_others``. Merging them is a
    post-processing that loses what the split says about whether user 1 landed in ``U`` (for
    k-RR at eps0 = 8, n = 1e4 the merged view's epsilon is 2 % lower)."""

    a0: float
    a1: float
    a2: float
    pi_a: float
    pi_b: float
    pi_u: float
    name: str = ""
    u1_user: float | None = None
    u1_others: float | None = None

    def __post_init__(self) -> None:
        for field_name in ("a0", "a1", "a2", "pi_a", "pi_b", "pi_u"):
            v = getattr(self, field_name)
            if not (math.isfinite(v) and 0.0 <= v <= 1.0):
                raise InvalidParameter(field_name, f"must be a probability, got {v!r}")
        if abs(self.a0 + self.a1 + self.a2 - 1.0) > 1e-9 or abs(self.pi_a + self.pi_b + self.pi_u - 1.0) > 1e-9:
            raise InvalidParameter("view", "class probabilities must sum to 1")
        if self.pi_a <= 0 or self.pi_b <= 0 or (self.a2 > 0 and self.pi_u <= 0):
            raise InvalidParameter("view", "the others must reach every class user 1 reaches")
        if (self.u1_user is None) != (self.u1_others is None):
            raise InvalidParameter("view", "a split of U needs both u1_user and u1_others")
        if self.u1_user is not None and self.u1_others is not None:
            u1, o1 = self.u1_user, self.u1_others
            if not (0.0 <= u1 <= self.a2 and 0.0 < o1 < self.pi_u):
                raise InvalidParameter("view", "U1 must hold part of U, for user 1 and (strictly) for the others")
            if self.a2 - u1 > 0 and self.pi_u - o1 <= 0:
                raise InvalidParameter("view", "the others must reach every class user 1 reaches")

    @property
    def split(self) -> bool:
        return self.u1_user is not None

    def lower_epsilon(self, n: int, delta: float, epsilon0: float) -> float:
        """:func:`iid_lower_epsilon` of this view (the interface ``best_lower_epsilon`` uses)."""
        return iid_lower_epsilon(self, n, delta, epsilon0)


def _direction_delta(v: ThreeClassView, n: int, eps: float, forward: bool) -> float:
    """Lowered ``(1/n) E[(sum l)_+]`` for one direction (``forward``: ``D(P0 || P1)``)."""
    E = math.exp(eps)
    a0, a1 = (v.a0, v.a1) if forward else (v.a1, v.a0)
    l_a = (a0 - E * a1) / v.pi_a
    l_b = (a1 - E * a0) / v.pi_b
    p_inf = v.pi_a + v.pi_b
    lo, hi = binom_range(n, p_inf, WINDOW_SD)
    M = np.arange(lo, hi + 1, dtype=np.float64)
    log_w = log_binom_pmf(M, n, p_inf)
    split = _split_grid(v, n, M, log_w) if v.split else None
    if split is None:  # U as one class (or a split too large to sum: merged, a post-processing)
        l_u = v.a2 * (1.0 - E) / v.pi_u if v.pi_u > 0 else 0.0
        beta = M * l_b + (n - M) * l_u
        weight = np.exp(log_w) * (1.0 - PMF_RTOL)
    else:  # beta over the grid of (M, N_U1): U1 and U2 each carry their own loss
        M, n_u1, log_w = split
        assert v.u1_user is not None and v.u1_others is not None  # a split view
        l_u1 = v.u1_user * (1.0 - E) / v.u1_others
        l_u2 = (v.a2 - v.u1_user) * (1.0 - E) / (v.pi_u - v.u1_others) if v.pi_u > v.u1_others else 0.0
        beta = M * l_b + n_u1 * l_u1 + (n - M - n_u1) * l_u2
        weight = np.exp(log_w) * (1.0 - 2.0 * PMF_RTOL)  # two gammaln pmfs
    return _expected_positive_part(l_a - l_b, v.pi_a / p_inf, M, beta, weight) / n


def _split_grid(v: ThreeClassView, n: int, M: np.ndarray, log_w: np.ndarray):
    """The grid ``(M, N_U1, log P(M) + log P(N_U1 | M))`` of a split view, ``N_U1 | M ~
    Bin(n - M, u1_others / pi_u)`` on a window of WINDOW_SD sd (dropping only non-negative terms);
    ``None`` if it would exceed :data:`SPLIT_BUDGET` points."""
    assert v.u1_others is not None  # a split view
    t = v.u1_others / v.pi_u
    half = int(math.ceil(WINDOW_SD * math.sqrt(n * v.pi_u * t * (1.0 - t)))) + 2
    if len(M) * (2 * half + 1) > SPLIT_BUDGET:
        return None
    rest = (n - M)[:, None]
    n_u1 = np.round(rest * t) + np.arange(-half, half + 1, dtype=np.float64)[None, :]
    inside = (n_u1 >= 0) & (n_u1 <= rest)
    n_u1 = np.clip(n_u1, 0.0, rest)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_cond = (special.gammaln(rest + 1.0) - special.gammaln(n_u1 + 1.0) - special.gammaln(rest - n_u1 + 1.0)
                    + special.xlogy(n_u1, t) + special.xlog1py(rest - n_u1, -t))
    log_total = np.where(inside, log_w[:, None] + log_cond, -np.inf)
    M_grid = np.broadcast_to(M[:, None], n_u1.shape)
    return M_grid.ravel(), n_u1.ravel(), log_total.ravel()


def _expected_positive_part(alpha: float, s: float, M: np.ndarray, beta: np.ndarray, weight: np.ndarray) -> float:
    """Lowered ``sum_i weight_i E[(alpha N_i + beta_i)_+]`` with ``N_i ~ Bin(M_i, s)`` (module doc)."""
    if alpha < 0:  # count the B class instead: alpha N_A + beta = (-alpha) N_B + (beta + alpha M)
        alpha, beta, s = -alpha, beta + alpha * M, 1.0 - s
    elif alpha == 0:
        return float(np.sum(weight * np.maximum(beta, 0.0))) * (1.0 - 1e-12)
    j0 = np.maximum(np.floor(-beta / alpha) + 1.0, 0.0)
    j0 = np.where(alpha * j0 + beta <= 0.0, j0 + 1.0, j0)  # strictly positive terms only
    t1 = binom_sf_ge(j0 - 1.0, np.maximum(M - 1.0, 0.0), s)
    t2 = binom_sf_ge(j0, M, s)
    pos = alpha * M * s * t1
    err = (TAIL_RTOL + 8e-16) * (pos + np.abs(beta) * t2)  # each tail's error, and the sum's rounding
    per_m = np.maximum(pos + beta * t2 - err, 0.0)
    return float(np.sum(weight * per_m)) * (1.0 - 1e-12)


def iid_delta(view: ThreeClassView, n: int, eps: float) -> float:
    """A certified lower bound on the round's ``delta(eps)``: this view's exact divergence, lowered
    by its numerical error, the larger of the two directions."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InvalidParameter("n", f"must be an integer >= 1, got {n!r}")
    if not (math.isfinite(eps) and eps >= 0):
        raise InvalidParameter("eps", f"must be finite and >= 0, got {eps!r}")
    return max(_direction_delta(view, int(n), eps, True), _direction_delta(view, int(n), eps, False))


def iid_lower_epsilon(view: ThreeClassView, n: int, delta: float, epsilon0: float, rtol: float = 1e-4) -> float:
    """A lower bound on the round's ``eps(delta)``: the lower end of the bracket of
    :func:`_numerics.search_epsilon`, a point where :func:`iid_delta` was checked to exceed
    ``delta`` (0 if it never does, ``eps0`` if it still does there)."""
    if not 0 < delta < 1:
        raise InvalidParameter("delta", f"must be in (0, 1), got {delta!r}")
    lower, _ = search_epsilon(lambda e: iid_delta(view, n, e), delta, 0.0, float(epsilon0), rtol=rtol)
    return lower


# ------------------------------------------------------------------ the mechanisms' datasets
def thinned_rr_view(epsilon0: float, tau: float) -> ThreeClassView:
    """The others all at ``x1`` of a thinned-RR mechanism (:mod:`.thinned_rr`): informative with
    probability ``tau``, then RR at ``eps0``."""
    rho = 1.0 / (1.0 + math.exp(-epsilon0))
    tau = min(1.0, tau)  # 2-RR: (e^eps0 + 1)/(e^eps0 + 1) may round to 1 + u
    return ThreeClassView(tau * rho, tau * (1 - rho), 1 - tau, tau * (1 - rho), tau * rho, 1 - tau,
                          f"thinned-rr(tau={tau:.6g})")


def k_rr_third_value_view(epsilon0: float, k: int) -> ThreeClassView:
    """k-RR, pair ``(a, b)``, the others all at a third value ``c`` (``k >= 3``); classes ``a``, ``b``,
    and, uninformative, ``c`` and the ``k - 3`` other values (kept apart: U1 = ``c``)."""
    if k < 3:
        raise InvalidParameter("k", f"needs a third value, k >= 3, got {k}")
    E = math.exp(epsilon0)
    q = 1.0 / (E + k - 1)
    split = {"u1_user": q, "u1_others": E * q} if k > 3 else {}
    return ThreeClassView(E * q, q, (k - 2) * q, q, q, 1 - 2 * q, f"{k}-rr/others-at-third-value", **split)


def hadamard_third_column_view(epsilon0: float) -> ThreeClassView:
    """Hadamard response (``K >= 4``), the others at a third column; classes: a row where the pair
    differs with ``x0``'s bit, with ``x1``'s bit, and every agreeing row. The third column agrees
    with ``x0`` on half of the rows where ``x0`` and ``x1`` differ (Sylvester matrix)."""
    rho = 1.0 / (1.0 + math.exp(-epsilon0))
    return ThreeClassView(rho / 2, (1 - rho) / 2, 0.5, 0.25, 0.25, 0.5, "hadamard/others-at-third-column")


def block_hadamard_third_block_view(epsilon0: float, blocks: int) -> ThreeClassView:
    """Block Hadamard response with ``B >= 3`` blocks, a pair in different blocks and the others
    holding a symbol of a third block; classes ``C_x0``, ``C_x1``, and, uninformative, ``C_z`` and
    the other ``2B - 3`` sets (``guarantees.block_hadamard_pair_types``: ``s p_out = 1/D``,
    ``s p_in = e^eps0/D``)."""
    if blocks < 3:
        raise InvalidParameter("blocks", f"needs a third block, B >= 3, got {blocks}")
    E = math.exp(epsilon0)
    D = E - 1.0 + 2.0 * blocks
    # the rest holds C_z (the others' favoured set: U1) apart from the 2B - 3 other sets
    return ThreeClassView(E / D, 1 / D, 1 - (E + 1) / D, 1 / D, 1 / D, 1 - 2 / D, "block-hadamard/others-in-third-block",
                          u1_user=1 / D, u1_others=E / D)


def laplace_middle_view(epsilon0: float, grid_levels: int) -> ThreeClassView:
    """The Laplace report, pair ``(0, G)``, the others at ``floor(G/2)``; classes ``y <= 0``,
    ``y >= G`` and the middle. ``P(N <= -d) = r^d / (1 + r)`` for ``P(N = k) ~ r^|k|``."""
    G = int(grid_levels)
    r = math.exp(-epsilon0 / G)
    mid = G // 2
    lo_mid, hi_mid = r ** mid / (1 + r), r ** (G - mid) / (1 + r)
    a0 = 1.0 / (1.0 + r)
    a1 = r**G / (1.0 + r)
    return ThreeClassView(a0, a1, 1.0 - a0 - a1, lo_mid, hi_mid, 1.0 - lo_mid - hi_mid, "laplace/others-at-middle")


#: Cuts (fractions of G) of :func:`laplace_endpoint_view` tried as lower bounds: the best cut
#: grows as eps0 falls (about G/8 at eps0 = 4, G/4 at eps0 = 1; measured on G = 4096).
LAPLACE_CUT_FRACTIONS = (1 / 16, 1 / 8, 3 / 16, 1 / 4, 5 / 16, 3 / 8)


def laplace_endpoint_view(epsilon0: float, grid_levels: int, cut: int) -> ThreeClassView:
    """The Laplace report, pair ``(0, G)``, the others at ``G``; classes ``y <= cut``,
    ``y >= G - cut`` and the middle (``0 <= cut < G/2``; ``cut = 0`` is the thinned-RR view).

    Widening the outer classes past the pair's grid points keeps more of the report's privacy
    loss than ``cut = 0``, whose middle class merges losses across nearly ``(-eps0, eps0)``.
    With ``P(N = k) = c r^|k|``, ``c = (1 - r)/(1 + r)``: ``P(y >= G - cut | x = 0) =
    r^(G - cut) / (1 + r)`` and ``P(y <= cut | x = 0) = 1 - r^(cut + 1) / (1 + r)``; by the
    report's symmetry about ``G/2`` the others (at ``G``) land in the classes with the swapped
    probabilities."""
    G, cut = int(grid_levels), int(cut)
    if not 0 <= 2 * cut < G:
        raise InvalidParameter("cut", f"must be in [0, G/2), got {cut} for G = {G}")
    r = math.exp(-epsilon0 / G)
    a0 = 1.0 - r ** (cut + 1) / (1.0 + r)
    a1 = r ** (G - cut) / (1.0 + r)
    return ThreeClassView(a0, a1, 1.0 - a0 - a1, a1, a0, 1.0 - a0 - a1, f"laplace/others-at-G/cut={cut}")


def lower_bound_candidates(mechanism: str, epsilon0: float, *, k: int | None = None, num_bins: int | None = None,
                           grid_levels: int | None = None, num_blocks: int | None = None) -> list:
    """The datasets whose exact (post-processed) divergence this module offers as lower bounds
    (empty where it offers none: binary RR, generic reports, the Laplace report without a grid or on
    more than :data:`LOWER_BOUND_MAX_GRID_LEVELS` levels, block Hadamard response with fewer than
    three blocks; a view whose parameters do not fit in double precision, at large ``eps0``, is left out). Each has ``name`` and
    ``lower_epsilon(n, delta, epsilon0)``; for the Laplace report the first is the whole report's
    (``iid_lattice``), the three-class views follow."""
    views = _candidates(mechanism, epsilon0, k=k, num_bins=num_bins, grid_levels=grid_levels, num_blocks=num_blocks)
    out = []
    for build in views:
        try:  # a view whose class probabilities do not fit in double precision (eps0 >= ~37) is not offered
            out.append(build())
        except InvalidParameter:
            continue
    return out


def _candidates(mechanism: str, epsilon0: float, *, k: int | None, num_bins: int | None, grid_levels: int | None,
                num_blocks: int | None) -> list:
    """:func:`lower_bound_candidates` as constructors (each may refuse its parameters)."""
    from shuffledp.protocol.accounting.thinned_rr import k_rr_tau, laplace_report_tau

    if mechanism == "k-rr":
        if k is None:
            raise InvalidParameter("k", "k-rr needs its domain size k")
        size = int(k)
        views = [lambda: thinned_rr_view(epsilon0, k_rr_tau(epsilon0, size))]
        if size >= 3:  # a third value exists
            views.insert(0, lambda: k_rr_third_value_view(epsilon0, size))
        return views
    if mechanism == "hadamard-response":
        views = [lambda: thinned_rr_view(epsilon0, 0.5)]
        if num_bins is not None and num_bins >= 4:
            views.append(lambda: hadamard_third_column_view(epsilon0))
        return views
    if mechanism == "block-hadamard-response":  # none offered with fewer than three blocks
        blocks = int(num_blocks or 0)
        return [lambda: block_hadamard_third_block_view(epsilon0, blocks)] if blocks >= 3 else []
    if mechanism == "laplace-mean" and grid_levels is not None and int(grid_levels) <= LOWER_BOUND_MAX_GRID_LEVELS:
        from shuffledp.protocol.accounting.iid_lattice import LaplaceEndpointLattice

        G = int(grid_levels)
        cuts = sorted({int(f * G) for f in LAPLACE_CUT_FRACTIONS if 0 < int(f * G) and 2 * int(f * G) < G})
        return [lambda: LaplaceEndpointLattice(float(epsilon0), G),
                lambda: thinned_rr_view(epsilon0, laplace_report_tau(epsilon0, G)),
                lambda: laplace_middle_view(epsilon0, G),
                *((lambda cut=cut: laplace_endpoint_view(epsilon0, G, cut)) for cut in cuts)]
    return []  # binary RR has its own all-dataset certificate; generic reports have no dataset here


#: Largest batch size :func:`best_lower_epsilon` evaluates (an evaluation grows like ``sqrt(n)``
#: incomplete-beta pairs: seconds at ``n = 1e8``); above it it refuses (:class:`InvalidParameter`).
LOWER_BOUND_MAX_N = 10**8
#: Largest Laplace grid offered a dataset (the whole-report view has one atom per level).
LOWER_BOUND_MAX_GRID_LEVELS = 2**20

#: Above this batch size :func:`best_lower_epsilon` first ranks the views here (an evaluation at
#: ``n = 1e8`` costs ~1e5 incomplete-beta pairs; the ranking barely moves with ``n``).
SCREEN_N = 10_000
#: Views kept after the screening.
SCREEN_KEEP = 2


def best_lower_epsilon(views: list, n: int, delta: float, epsilon0: float) -> tuple[float, str]:
    """The largest of the views' lower bounds on ``eps(delta)``, and the view that gave it.

    With more than :data:`SCREEN_KEEP` three-class views and ``n > SCREEN_N`` only the best
    :data:`SCREEN_KEEP` of them at ``SCREEN_N`` are evaluated at ``n`` (every value returned is still
    that view's certified lower bound at ``n``; the screening only chooses which to compute). Other
    views (the whole-report one of ``iid_lattice``) are always evaluated: their rank moves with ``n``.

    Refuses ``n`` above :data:`LOWER_BOUND_MAX_N` (:class:`InvalidParameter`) before any work."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= LOWER_BOUND_MAX_N:
        raise InvalidParameter("n", f"the one-dataset lower bound is computed for n in [1, 10^8], got {n!r}")
    three_class = [v for v in views if isinstance(v, ThreeClassView)]
    if len(three_class) > SCREEN_KEEP and n > SCREEN_N:
        ranked = sorted(three_class, key=lambda v: v.lower_epsilon(SCREEN_N, delta, epsilon0), reverse=True)
        views = [v for v in views if not isinstance(v, ThreeClassView)] + ranked[:SCREEN_KEEP]
    best, name = 0.0, ""
    for v in views:
        e = v.lower_epsilon(n, delta, epsilon0)
        if e > best:
            best, name = e, v.name
    return best, name
