"""Clone reductions for one shuffled round: FMT21, the stronger clone and variation-ratio.

All three analyses reduce "shuffle n reports of a pure eps0-LDP randomizer" to a pair
of distributions over *counts* (a dominating pair) and then compute the exact
hockey-stick divergence of that pair. This module implements one engine for the
common generalisation, :class:`ClonePair`:

* User 1 (the one whose input changes from ``x0`` to ``x1``) outputs a draw from
  ``Q0``, ``Q1`` or ``Q2`` with probabilities ``(a0, a1, a2)`` on ``x0`` and
  ``(a1, a0, a2)`` on ``x1`` (``a0 > a1``; ``Q2`` is identical under both inputs).
* Every other user, whatever its input, outputs a "clone" of ``Q0`` with probability
  ``r``, of ``Q1`` with probability ``r`` and of ``Q2`` with probability ``r2``,
  independently, and something else otherwise.

The shuffled multiset is then a post-processing of the counts ``(a, b, z)`` of
``Q0``/``Q1``/``Q2`` draws (given the counts, the non-clone users are a uniformly
random subset of the others, whatever the hypothesis), so the divergence of the
count pair bounds the round's divergence for *every* dataset.

Special cases (``p = e^eps0``, ``rho = p/(p+1)``):

* Feldman, McMillan & Talwar 2021 ("Hiding Among the Clones"), Lemma 3.3/Theorem 3.2:
  ``a0 = rho, a1 = 1 - rho, a2 = 0, r = e^-eps0 / 2``. Valid for every eps0-LDP
  randomizer.
* Stronger clone (Feldman, McMillan & Talwar, SODA 2023, Theorem 3.2 after its
  errata): ``r = 1/(e^eps0+1)``. The errata restricts it to randomizers with
  ``R(x) >= (R(x0) + R(x1)) / (e^eps0 + 1)`` for all ``x, x0, x1`` (binary and k-ary
  randomized response qualify). With the generic variation-ratio parameters of Wang
  et al. 2024 the pair is the same one.
* Variation-ratio (Wang et al. 2024, arXiv 2304.05007) with parameters
  ``(p, beta, q)``: ``alpha = beta/(p-1)``, ``a0 = p alpha, a1 = alpha,
  a2 = 1 - (p+1) alpha, r = alpha p / q``. The paper's numerical bound compares only
  the ``(a, b)`` counts. That is **not** valid when ``a2 > 0``: exact enumeration
  finds 4-ary randomized response and Hadamard response datasets whose shuffled
  divergence exceeds it (see ``docs/accounting.md`` and the tests). Our corrected form
  keeps the ``Q2`` count ``z`` in the view: every other user also holds a ``Q2``
  clone with probability ``r2 >= a2 / q`` (proof: ``R(x) >= R(x0)/q`` pointwise and
  ``R(x0) = p alpha Q0 + a2 Q2`` on the support of ``Q0``, ``= a2 Q2`` off it), and the
  ``(a, b, z)`` pair is a genuine dominating pair.

Exact evaluation. Conditional on the number ``c`` of clones among the others
(revealed for free: the view shows ``a + b + z = c + 1``) and on ``z`` (whose law is
the same under both hypotheses), the pair is

    P = (1-w) X + w Y,   Q = (1-w) X' + w Y,
    Y = Bin(s, 1/2),  X = Bin(s-1, 1/2) + Bern(b0),  X' = Bin(s-1, 1/2) + Bern(b1),

with ``s = c + 1 - z``, ``b0 = a0/(a0+a1)`` and ``w`` the posterior probability that
user 1 drew ``Q2``. Its likelihood ratio is a ratio of affine functions of ``a`` so
the hockey-stick divergence ``G(s, w)`` has a closed form with two binomial tails.
``G`` is non-increasing in ``s`` and in ``w`` (both are post-processings), and the
per-``c`` divergence ``D_c`` is non-increasing in ``c`` (one more clone is a
post-processing). We therefore sum over blocks of ``c`` and of ``z`` using the
block's worst corner: every number returned by :meth:`ClonePair.delta` is an
upper bound (plus the exactly computed binomial tail mass outside the window),
and :meth:`ClonePair.delta_bounds` also returns the matching lower estimate so the
block resolution can be refined until both agree to ``rtol``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shuffledp.protocol.accounting._numerics import (
    TAIL_RTOL,
    binom_cdf_le,
    binom_log_pmf_half,
    binom_sf_ge,
    search_epsilon,
    standardized_grid,
)
from shuffledp.protocol.errors import InvalidParameter

#: Block-grid spacings (in standard deviations) for the clone count ``c`` and for
#: the Q2 count ``z``; the direction contributing most slack is refined first.
_C_STEPS = (0.25, 0.1, 0.04, 0.016, 0.0064, 0.0025)
_Z_STEPS = (0.5, 0.25, 0.12, 0.06, 0.03, 0.015)


def _validate_n(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InvalidParameter("n", f"must be an integer >= 1, got {n!r}")
    return int(n)


def _tail_and_pmf_half(k: np.ndarray, N: np.ndarray, memo: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``Pr[Bin(N, 1/2) >= k]`` and the pmf at ``k``, elementwise, each distinct ``(N, k)`` computed once.

    Blocks of a layout share few distinct ``(s, j)`` pairs (a fine two-dimensional layout: about
    one in five), successive evaluations of a search share many, and the incomplete beta
    function is the cost of a divergence evaluation. ``memo`` (one per layout corner) keeps the
    previous call's values as sorted keys. The values are the very same numbers as elementwise calls.
    """
    k, N = np.broadcast_arrays(np.asarray(k, dtype=np.float64), np.asarray(N, dtype=np.float64))
    shape = k.shape
    k, N = k.ravel(), N.ravel()
    if not (k.size >= 64 and np.all(np.abs(N) < 2.0**31) and np.all(np.abs(k) < 2.0**31)
            and np.array_equal(np.floor(k), k) and np.array_equal(np.floor(N), N)):  # integers: exact keys
        return binom_sf_ge(k, N, 0.5).reshape(shape), np.exp(binom_log_pmf_half(k, N)).reshape(shape)
    key = (N.astype(np.int64) << 32) + (k.astype(np.int64) + 2**31)
    uniq = None
    order = None if memo is None else memo.get("order")
    if order is not None and len(order) == key.size:
        # the caller's fixed order (s, then w) sorts the keys: distinct values by adjacent differences
        ks = key[order]
        step = np.diff(ks)
        if np.all(step >= 0):
            new = np.concatenate([[True], step > 0])
            first = order[new]
            uniq = ks[new]
            inverse = np.empty(key.size, dtype=np.int64)
            inverse[order] = np.cumsum(new) - 1
    if uniq is None:
        uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    tail = np.empty(len(uniq))
    pmf = np.empty(len(uniq))
    known = np.zeros(len(uniq), dtype=bool)
    if memo is not None and len(memo.get("keys", ())) > 0:
        mk = memo["keys"]
        pos = np.minimum(np.searchsorted(mk, uniq), len(mk) - 1)
        known = mk[pos] == uniq
        tail[known] = memo["tail"][pos[known]]
        pmf[known] = memo["pmf"][pos[known]]
    miss = ~known
    if np.any(miss):
        km, Nm = k[first[miss]], N[first[miss]]
        tail[miss] = binom_sf_ge(km, Nm, 0.5)
        pmf[miss] = np.exp(binom_log_pmf_half(km, Nm))
    if memo is not None:  # this call's values for the next one (same corner, nearby epsilon)
        memo["keys"], memo["tail"], memo["pmf"] = uniq, tail, pmf
    return tail[inverse].reshape(shape), pmf[inverse].reshape(shape)


def _binom_cdf_pair(t: np.ndarray, c: np.ndarray, p: float, memo: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(Pr[Bin(c, p) <= t - 1], Pr[Bin(c, p) <= t])`` elementwise (integer ``t``, ``c``), each
    distinct ``(c, t)`` evaluated once: where block edges are consecutive integers the two
    arrays share most of their points, and ``memo`` (one per clone-count grid of a pair) keeps
    every value computed so far, so a finer z-grid over the same rows (which contains most of
    the coarser one's edges) only evaluates its new points. The same numbers as two
    elementwise calls."""
    t = np.asarray(t, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    if not (t.size >= 64 and np.all(np.abs(t) < 2.0**30) and np.all(np.abs(c) < 2.0**31)
            and np.array_equal(np.floor(t), t) and np.array_equal(np.floor(c), c)):
        return binom_cdf_le(t - 1.0, c, p), binom_cdf_le(t, c, p)
    kk = np.concatenate([(t - 1.0).ravel(), t.ravel()])
    cc = np.concatenate([c.ravel(), c.ravel()])
    key = (cc.astype(np.int64) << 32) + (kk.astype(np.int64) + 2**31)
    uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    vals = np.empty(len(uniq))
    known = np.zeros(len(uniq), dtype=bool)
    if memo is not None and len(memo.get("keys", ())) > 0:
        mk = memo["keys"]
        pos = np.minimum(np.searchsorted(mk, uniq), len(mk) - 1)
        known = mk[pos] == uniq
        vals[known] = memo["vals"][pos[known]]
    miss = ~known
    if np.any(miss):
        vals[miss] = binom_cdf_le(kk[first[miss]], cc[first[miss]], p)
        if memo is not None:
            if len(memo.get("keys", ())) > 0:
                keys = np.concatenate([memo["keys"], uniq[miss]])
                order = np.argsort(keys, kind="stable")
                memo["keys"], memo["vals"] = keys[order], np.concatenate([memo["vals"], vals[miss]])[order]
            else:
                memo["keys"], memo["vals"] = uniq, vals.copy()
    vals = vals[inverse]
    return vals[: t.size].reshape(t.shape), vals[t.size:].reshape(t.shape)


def _edges(mu, sd, grid, lo, hi):
    """Integer block edges ``lo = e_0 <= ... <= e_K = hi + 1`` placed at ``mu + sd * grid``.

    ``mu``, ``sd``, ``lo``, ``hi`` may be arrays (one row of edges per entry).
    """
    mu = np.atleast_1d(np.asarray(mu, dtype=np.float64))
    sd = np.atleast_1d(np.asarray(sd, dtype=np.float64))
    lo = np.atleast_1d(np.asarray(lo, dtype=np.float64))
    hi = np.atleast_1d(np.asarray(hi, dtype=np.float64))
    inner = np.round(mu[:, None] + sd[:, None] * grid[None, :])
    inner = np.clip(inner, lo[:, None], hi[:, None] + 1.0)
    e = np.concatenate([lo[:, None], inner, hi[:, None] + 1.0], axis=1)
    return np.maximum.accumulate(e, axis=1)


@dataclass
class ClonePair:
    """Dominating count pair of one shuffled round (see the module docstring).

    ``scale`` multiplies the divergence (used when part of user 1's output is
    revealed to be uninformative); ``name`` labels the bound in reports.
    """

    n: int
    a0: float
    a1: float
    a2: float
    r: float
    r2: float
    scale: float = 1.0
    name: str = "clone-pair"
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.n = _validate_n(self.n)
        vals = {"a0": self.a0, "a1": self.a1, "a2": self.a2, "r": self.r, "r2": self.r2}
        for label, v in vals.items():
            if not math.isfinite(v) or not (0.0 <= v <= 1.0):
                raise InvalidParameter(label, f"must be a probability, got {v}")
            setattr(self, label, float(v))
        if abs(self.a0 + self.a1 + self.a2 - 1.0) > 1e-9:
            raise InvalidParameter("a0+a1+a2", f"must sum to 1, got {self.a0 + self.a1 + self.a2}")
        if not self.a0 > self.a1 > 0.0:
            raise InvalidParameter("a0, a1", "need a0 > a1 > 0")
        if 2 * self.r + self.r2 > 1.0 + 1e-12:
            raise InvalidParameter("r, r2", "clone probabilities exceed 1")
        if self.a2 > 0.0 and self.r2 <= 0.0:
            raise InvalidParameter("r2", "must be > 0 when a2 > 0 (else use scale to reveal Q2)")
        if self.a2 < 1e-15:
            total = self.a0 + self.a1
            self.a0, self.a1, self.a2, self.r2 = self.a0 / total, self.a1 / total, 0.0, 0.0

    # ----------------------------------------------------------------- basics
    @property
    def epsilon_max(self) -> float:
        """``log(a0/a1)``: the largest privacy loss, so ``delta(epsilon_max) = 0``."""
        return math.log(self.a0 / self.a1)

    @property
    def m(self) -> int:
        return self.n - 1

    @property
    def clone_rate(self) -> float:
        return 2.0 * self.r + self.r2

    # --------------------------------------------------------------- G(s, w)
    def _G(self, s: np.ndarray, w: np.ndarray, E: float, memo: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``D_E((1-w)X + wY || (1-w)X' + wY)`` for ``s >= 1``; returns (value, fp padding).

        ``Y = Bin(s, 1/2)``, ``X = Bin(s-1, 1/2) + Bern(b0)``, ``X' = ... + Bern(b1)``.
        ``P(a) - E Q(a) = Y(a) (k1 a + k0)`` so the divergence is
        ``k1 (s/2) Pr[Bin(s-1,1/2) >= j-1] + k0 Pr[Bin(s,1/2) >= j]`` with ``j`` the
        first ``a`` where ``k1 a + k0 > 0``; and
        ``Pr[Bin(s,1/2) >= j] = Pr[Bin(s-1,1/2) >= j-1] - pmf_{s-1}(j-1)/2``.
        """
        b0 = self.a0 / (self.a0 + self.a1)
        b1 = 1.0 - b0
        k1 = (1.0 - w) * (2.0 / s) * (b0 - b1) * (1.0 + E)
        k0 = (1.0 - w) * 2.0 * (b1 - E * b0) + w * (1.0 - E)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(k1 > 0, -k0 / k1, np.inf)
        j = np.floor(np.minimum(t, s + 1.0)) + 1.0
        t1, pmf = _tail_and_pmf_half(j - 1.0, s - 1.0, memo)
        t2 = np.maximum(t1 - 0.5 * pmf, 0.0)
        pos = k1 * (s / 2.0) * t1
        val = np.maximum(pos + k0 * t2, 0.0)
        return val, TAIL_RTOL * pos

    # ---------------------------------------------------- block construction
    def _layout(self, lc: int, lz: int) -> dict:
        key = (lc, lz)
        if key in self._cache:
            return self._cache[key]
        hc, hz = _C_STEPS[lc], _Z_STEPS[lz]
        m, rt = self.m, self.clone_rate
        if m == 0 or rt <= 0.0:
            c_edges = np.array([[0.0, 1.0]])
        else:
            mu = m * rt
            sd = math.sqrt(m * rt * (1.0 - rt))
            lo_c = max(0.0, math.floor(mu - 13.0 * sd - 2.0))
            hi_c = min(float(m), math.ceil(mu + 13.0 * sd + 2.0))
            if sd * hc < 1.0 and sd < 25.0:  # every c of the window is its own block
                inner = np.arange(lo_c, hi_c + 1.0)
                c_edges = np.concatenate([[0.0], inner[inner > 0], [hi_c + 1.0]])[None, :]
            else:
                c_edges = _edges(mu, sd, standardized_grid(hc), 0, m)
        c_edges = c_edges[0]
        cdf = binom_cdf_le(c_edges - 1.0, m, rt) if m > 0 and rt > 0 else np.array([0.0, 1.0])
        c_w = np.diff(cdf)
        keep = c_w > 0
        c_first = c_edges[:-1][keep]
        c_last = (c_edges[1:] - 1.0)[keep]
        c_w = c_w[keep]
        layout: dict[str, Any] = {"c_w": c_w, "tail_lo": float(cdf[0]), "tail_hi": float(1.0 - cdf[-1]),
                  "memo_up": {}, "memo_dn": {}, "memo_mid": {}}
        c_hi = np.array([c_edges[-1] - 1.0])
        if self.a2 == 0.0:
            for name, cs in (("up", c_first), ("mid", c_last), ("dn", c_last), ("hi", c_hi)):
                layout[name] = (cs + 1.0, np.zeros_like(cs), np.ones_like(cs), np.zeros_like(cs))
        else:
            memo = self._cache.setdefault(("z-cdf", lc), {"first": {}, "last": {}, "hi": {}})
            layout["up"], _ = self._z_blocks(c_first, hz, memo["first"])
            layout["mid"], layout["dn"] = self._z_blocks(c_last, hz, memo["last"])
            layout["hi"], _ = self._z_blocks(c_hi, hz, memo["hi"])
        self._cache[key] = layout
        return layout

    def _z_blocks(self, cs: np.ndarray, hz: float, memo: dict | None = None):
        """Upper and lower corners ``(s, w)``, weights and outside mass of the z-blocks, per c.

        Given ``c``, ``z = Bin(c, pi2) + Bern(a2)`` (same law under both inputs) and
        ``w(z) = Pr[user 1 drew Q2 | c, z]`` increases with ``z`` while ``s = c+1-z``
        decreases, so ``G(s, w)`` on a z-block is at most ``G(s(z_last), w(z_first))``.
        """
        pi2 = self.r2 / self.clone_rate
        a2 = self.a2
        cs = np.asarray(cs, dtype=np.float64)
        mu = (cs + 1.0) * pi2
        sd = np.sqrt(np.maximum((cs + 1.0) * pi2 * (1.0 - pi2), 1e-300))
        grid = standardized_grid(hz, core=6.0, outer=9.0)
        edges = _edges(mu, sd, grid, np.zeros_like(cs), cs + 1.0)
        # small c: exact per-z blocks
        small = sd * hz < 1.0
        if np.any(small):
            width = edges.shape[1]
            for i in np.nonzero(small)[0]:
                c = cs[i]
                row = np.arange(0.0, c + 3.0)  # edges 0, 1, ..., c + 2 (z ranges over 0..c+1)
                if len(row) > width:  # keep rectangular: fall back to the grid row
                    continue
                edges[i] = np.concatenate([row, np.full(width - len(row), c + 2.0)])
        c_col = cs[:, None]

        def cdf_z(t):  # Pr[z <= t | c]; the binomial cdf at t - 1 and t, each distinct (c, t) once
            f_lo, f_hi = _binom_cdf_pair(t, np.broadcast_to(c_col, t.shape), pi2, memo)
            return a2 * f_lo + (1.0 - a2) * f_hi

        cz = cdf_z(edges - 1.0)
        wt = np.maximum(np.diff(cz, axis=1), 0.0)
        tail = cz[:, 0] + (1.0 - cz[:, -1])
        z_first = edges[:, :-1]
        z_last = np.maximum(edges[:, 1:] - 1.0, z_first)

        def post_w(z):  # Pr[user 1 drew Q2 | c, z]
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                ratio = (c_col - z + 1.0) * pi2 / (z * (1.0 - pi2))
                wv = 1.0 / (1.0 + (1.0 - a2) / a2 * ratio)
            wv = np.where(z <= 0, 0.0, wv)
            return np.where(z >= c_col + 1.0, 1.0, wv)

        upper = (np.maximum(1.0, c_col + 1.0 - z_last), post_w(z_first), wt, tail)
        lower = (np.maximum(1.0, c_col + 1.0 - z_first), post_w(z_last), wt, tail)
        return upper, lower

    def _per_c(self, corner, eps: float, memo: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
        s, w, wt, tail = corner
        if memo is not None and "order" not in memo:
            # j is non-decreasing in w at fixed s (the threshold -k0/k1 increases with w), so this
            # order sorts the (s, j) keys of every evaluation
            s_b, w_b = np.broadcast_arrays(s, w)
            memo["order"] = np.lexsort((w_b.ravel(), s_b.ravel()))
        g, padding = self._G(s, w, math.exp(eps), memo)
        if g.ndim == 1:
            return g * wt, padding * wt + tail
        return (g * wt).sum(axis=1), (padding * wt).sum(axis=1) + tail

    # ------------------------------------------------------------ divergence
    def delta_bounds(self, eps: float, lc: int = 1, lz: int = 1) -> tuple[float, float]:
        """(lower estimate, rigorous upper bound) of ``delta(eps)`` at a block resolution."""
        return self._bounds(eps, lc, lz)

    def _bounds(self, eps: float, lc: int, lz: int) -> tuple[float, float]:
        """Lower estimate and rigorous upper bound at block resolution ``(lc, lz)``."""
        return self._lower(eps, lc, lz), self._upper(eps, lc, lz)

    def _upper(self, eps: float, lc: int, lz: int) -> float:
        """Rigorous upper bound at block resolution ``(lc, lz)`` (see :meth:`_bounds`)."""
        if eps >= self.epsilon_max:
            return 0.0
        eps = max(float(eps), 0.0)
        lay = self._layout(lc, lz)
        d_up, pad_up = self._per_c(lay["up"], eps, lay["memo_up"])
        d_hi, pad_hi = self._per_c(lay["hi"], eps)
        upper = (
            float(np.dot(lay["c_w"], d_up + pad_up))
            + lay["tail_lo"]
            + lay["tail_hi"] * float(d_hi[0] + pad_hi[0])
        )
        return min(1.0, self.scale * upper)

    def _lower(self, eps: float, lc: int, lz: int) -> float:
        """Lower estimate at block resolution ``(lc, lz)`` (see :meth:`_bounds`)."""
        if eps >= self.epsilon_max:
            return 0.0
        eps = max(float(eps), 0.0)
        lay = self._layout(lc, lz)
        d_dn, _ = self._per_c(lay["dn"], eps, lay["memo_dn"])
        return min(1.0, self.scale * float(np.dot(lay["c_w"], d_dn)))

    def _mid(self, eps: float, lc: int, lz: int) -> float:
        """Upper corner in z at the right end of each c-block: splits the slack into c and z parts."""
        lay = self._layout(lc, lz)
        d_mid, _ = self._per_c(lay["mid"], max(float(eps), 0.0), lay["memo_mid"])
        return min(1.0, self.scale * float(np.dot(lay["c_w"], d_mid)))

    def delta(
        self, eps: float, rtol: float = 5e-3, *, target: float | None = None, atol: float = 1e-17
    ) -> float:
        """Rigorous upper bound on the hockey-stick divergence at ``eps``.

        The block grid is refined (in whichever of ``c`` and ``z`` contributes more
        slack) until the lower estimate is within ``rtol`` of the upper bound (or
        within ``atol``), or, when a search ``target`` is given, until the bound
        settles on one side of it; the smallest upper bound seen is returned.
        """
        lc, lz = self._cache.get("start", (0, 0))  # resolution that sufficed last time
        best = 1.0
        while True:
            up = self._upper(eps, lc, lz)
            best = min(best, up)
            if up == 0.0 or (target is not None and up <= target):
                done = True  # decided by the upper bound alone: the lower estimate is not needed
            else:
                lo = self._lower(eps, lc, lz)
                done = up - lo <= rtol * up + atol or (target is not None and lo >= 2.0 * target)
            if done:
                if up > 0.0:  # remember the resolution that sufficed (next call starts there)
                    self._cache["start"] = (lc, lz)
                return best
            can_c, can_z = lc + 1 < len(_C_STEPS), lz + 1 < len(_Z_STEPS) and self.a2 > 0
            if not (can_c or can_z):
                return best
            if can_c and not can_z:
                lc += 1
            elif can_z and not can_c:
                lz += 1
            elif up - (mid := self._mid(eps, lc, lz)) >= mid - lo:
                lc += 1
            else:
                lz += 1

    def epsilon(self, delta: float, rtol: float = 1e-5) -> float:
        """Smallest ``eps`` (to ``rtol``) with ``delta(eps) <= delta``: an upper bound on eps."""
        if not 0.0 < delta < 1.0:
            raise InvalidParameter("delta", f"must be in (0, 1), got {delta}")
        key = ("epsilon", float(delta), float(rtol))
        if key in self._cache:  # the same search again: its answer and the state it left
            b, start = self._cache[key]
        else:
            self._cache.pop("start", None)  # deterministic: every search starts from the coarsest grid
            _, b = search_epsilon(lambda e: self.delta(e, target=delta), delta, 0.0, self.epsilon_max, rtol=rtol)
            start = self._cache.get("start")
            self._cache[key] = (b, start)
        if start is None:
            self._cache.pop("start", None)
        else:
            self._cache["start"] = start
        return b

    def reset_start(self) -> None:
        """Forget the block resolution remembered by :meth:`delta` (the next call starts coarsest,
        as on a new pair; layouts and finished searches stay cached)."""
        self._cache.pop("start", None)


# ------------------------------------------------------------------ factories
def fmt21_pair(epsilon0: float, n: int) -> ClonePair:
    """FMT21 Lemma 3.3 / Theorem 3.2: clones with probability ``e^-eps0`` (generic)."""
    p = math.exp(epsilon0)
    return ClonePair(n, p / (p + 1), 1 / (p + 1), 0.0, math.exp(-epsilon0) / 2, 0.0, name="fmt21-numerical")


def strong_clone_pair(epsilon0: float, n: int) -> ClonePair:
    """Stronger clone: clone probability ``2/(e^eps0+1)`` (restricted class, see module doc)."""
    p = math.exp(epsilon0)
    return ClonePair(n, p / (p + 1), 1 / (p + 1), 0.0, 1 / (p + 1), 0.0, name="strong-clone")


def variation_ratio_pair(p: float, beta: float, q: float, n: int, r2: float | None = None) -> ClonePair:
    """Corrected variation-ratio pair for a ``(p, beta, q)`` randomizer.

    ``r2`` is the probability that another user holds a ``Q2`` clone; ``a2/q`` is always
    valid, a mechanism may justify more (k-ary randomized response: ``r2 = a2``).
    """
    if not p > 1:
        raise InvalidParameter("p", f"must be > 1, got {p}")
    if not 0 < beta <= (p - 1) / (p + 1) + 1e-12:
        raise InvalidParameter("beta", f"must be in (0, (p-1)/(p+1)], got {beta}")
    if not q >= 1:
        raise InvalidParameter("q", f"must be >= 1, got {q}")
    alpha = beta / (p - 1)
    a2 = max(0.0, 1.0 - (p + 1) * alpha)
    rr = alpha * p / q
    if r2 is None:
        r2 = a2 / q
    return ClonePair(n, p * alpha, alpha, a2, rr, r2, name="variation-ratio")


# ------------------------------------------------- worst case over pair types
@dataclass
class WorstOfPairs:
    """Maximum over input-pair types of each type's dominating pair.

    A randomizer whose input pairs are not all alike (block Hadamard response: two
    symbols in the same block or in different blocks) gets one :class:`ClonePair` per
    type, each valid for the pairs of its type. The round's divergence is the
    maximum over all input pairs, so ``max`` over the types of their upper bounds is
    an upper bound; and ``max`` of the types' ``epsilon(delta)`` is one too (each
    type's ``delta(eps)`` is non-increasing, so at the largest of them every type is
    at most ``delta``). Same interface as :class:`ClonePair` for the accountant.
    """

    pairs: tuple[ClonePair, ...]
    name: str = "worst-of-pairs"

    def __post_init__(self) -> None:
        self.pairs = tuple(self.pairs)
        if not self.pairs or not all(isinstance(p, ClonePair) for p in self.pairs):
            raise InvalidParameter("pairs", "need at least one ClonePair")
        if len({p.n for p in self.pairs}) != 1:
            raise InvalidParameter("pairs", "all pairs must describe the same batch size n")

    @property
    def n(self) -> int:
        return self.pairs[0].n

    @property
    def epsilon_max(self) -> float:
        return max(p.epsilon_max for p in self.pairs)

    def delta(
        self, eps: float, rtol: float = 5e-3, *, target: float | None = None, atol: float = 1e-17
    ) -> float:
        """Rigorous upper bound on ``delta(eps)``: the largest of the types' upper bounds."""
        return max(p.delta(eps, rtol=rtol, target=target, atol=atol) for p in self.pairs)

    def epsilon(self, delta: float, rtol: float = 1e-5) -> float:
        """An upper bound on ``eps(delta)``: the largest of the types' upper bounds."""
        return max(p.epsilon(delta, rtol=rtol) for p in self.pairs)

    def reset_start(self) -> None:
        for p in self.pairs:
            p.reset_start()


# ------------------------------------------------------------ closed form
def fmt21_closed_form_valid(epsilon0: float, n: int, delta: float) -> bool:
    """Validity regime of FMT21 Theorem 3.1.

    The paper states ``eps0 <= log(n / (16 log(2/delta)))``; the reference script
    checks ``log(n / (16 log(4/delta)))``. We require the stricter (script) form.
    """
    inner = n / (16.0 * math.log(4.0 / delta))
    return inner > 1.0 and epsilon0 <= math.log(inner)


def fmt21_closed_form(epsilon0: float, n: int, delta: float) -> float | None:
    """FMT21 Theorem 3.1 closed form, or ``None`` outside its validity regime.

    With ``e^eps' = 1 + 8 sqrt(e^eps0 log(4/delta) / n) + 8 e^eps0 / n`` (the bound on
    the likelihood ratio of the clone counts that holds except with probability
    ``delta``), the round is ``(eps, delta)``-DP for

        eps = log(1 + (1 - e^-eps0) / (1 + e^-(eps0 + eps')) * (e^eps' - 1)).

    This is the form whose value the authors print for their example
    (n = 1e5, eps0 = 4, delta = 1e-6: 0.5378). The theorem as typeset uses the factor
    ``(e^eps0 - 1)/(e^eps0 + 1)`` instead (0.5347 on the example); mixing the two
    clone pairs exactly gives ``(e^eps0 - 1)/(e^eps0 + e^eps')``, smaller still. All
    three are valid in the regime; we report the largest, published value.
    """
    n = _validate_n(n)
    if not 0.0 < delta < 1.0:
        raise InvalidParameter("delta", f"must be in (0, 1), got {delta}")
    if not fmt21_closed_form_valid(epsilon0, n, delta):
        return None
    a = 8.0 * math.sqrt(math.exp(epsilon0) * math.log(4.0 / delta) / n)
    c = 8.0 * math.exp(epsilon0) / n
    eps_prime = math.log1p(a + c)
    coef = -math.expm1(-epsilon0) / (1.0 + math.exp(-epsilon0 - eps_prime))  # 1 - e^-eps0, exact at tiny eps0
    return min(epsilon0, math.log1p(coef * (a + c)))
