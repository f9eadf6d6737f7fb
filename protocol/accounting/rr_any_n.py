"""Certified central epsilon of shuffled binary randomized response at any batch size.

Setting. Binary randomized response (RR) with local budget ``eps0`` reports the bit
unchanged with probability ``rho = e^eps0 / (1 + e^eps0)`` and flipped with
``r = 1 - rho``. The shuffler reveals only the number ``S`` of ones. Replace-one
neighbouring datasets differ in user 1's bit; if ``k`` of the other ``m = n - 1``
users hold a one, the others' count is

    X_k = Bin(k, rho) + Bin(m - k, r)          (independent)

and the two views are ``P1 = X_k + Bern(rho)`` (user 1 holds 1) and
``P0 = X_k + Bern(r)`` (user 1 holds 0). The round's privacy curve is

    delta_n(eps) = max over k in [0, m] and both directions of D_{e^eps}(. || .),
    D_c(P || Q) = sum_s [P(s) - c Q(s)]_+ = sup_A P(A) - c Q(A)   (hockey-stick).

Step 1 -- one direction suffices. Flipping every bit (``s -> n - s``) maps the pair
``(P0, P1)`` at ``k`` to the pair ``(P1, P0)`` at ``m - k``, so
``delta_n(eps) = max_{k in [0, m]} D_{e^eps}(P1^k || P0^k)``.

Step 2 -- threshold sets (closed form for one dataset). ``X_k`` is a sum of
independent Bernoulli variables, hence log-concave (Hoeffding 1956; e.g. Saumard &
Wellner 2014, Stat. Surveys 8, Prop. 3.5: convolutions of log-concave pmfs are
log-concave), so ``L(s) = X(s-1)/X(s)`` is non-decreasing and the likelihood ratio
``P1(s)/P0(s) = (rho L(s) + r) / (r L(s) + rho)`` is non-decreasing in ``s``
(``rho > r``). By the Neyman--Pearson lemma the supremum over sets is attained on an
upper set ``{S >= t}``:

    D_{e^eps}(P1 || P0) = max_t  A_t - e^eps B_t,
    A_t = P1(S >= t) = rho X(t-1) + Xbar(t),   B_t = P0(S >= t) = r X(t-1) + Xbar(t),

with ``Xbar(t) = Pr[X >= t]``. Hence, for a target ``delta``, the smallest eps with
``D <= delta`` is in closed form (no search):

    eps_k(delta) = max(0, log max_t (A_t - delta) / B_t).

Step 3 -- the worst dataset, by blocks (no claim about which ``k`` is worst:
exhaustive search shows interior maximisers, e.g. ``k ~ 0.47 m`` at ``eps0 = 6``,
``n = 1000``, ``eps = 0.05``). Post-processing (Dwork & Roth 2014, Prop. 2.1): if a
dataset ``D'`` is obtained from ``D`` by *removing* users other than user 1, the
shuffled view of ``D`` is the view of ``D'`` plus the removed users' reports (drawn
from their own inputs, identically under both hypotheses), so
``D(P1^D || P0^D) <= D(P1^D' || P0^D')``. Every dataset with ``k in [k1, k2]`` ones
contains the *core* dataset with ``k1`` ones and ``m - k2`` zeros among the others
(``n - (k2 - k1)`` users), whence

    max_{k in [k1, k2]} eps_k(delta; n) <= eps_core(delta; n - (k2 - k1)).

*Keeping the block's blanket*. The ``b = k2 - k1`` extra users need not be
dropped whole: binary RR is ``RR(x) = 2r Bern(1/2) + (1 - 2r) delta_x``, so each extra
user independently reports a fair coin with probability ``2r`` (whatever its bit) and
its own bit otherwise. Tell the analyst which extra users did not toss a coin and
their bits (independent of user 1, so a post-processing argument again): what is left
is the core plus ``W ~ Bin(b, 2r)`` fair coins, ``W`` known. Given ``W`` the divergence
is non-increasing in ``W`` (one more coin is one more independent report), hence for
any ``w``

    D(block dataset) <= Pr[W < w] + D(core + w coins),

and :func:`block_coins` takes the largest ``w`` whose Chernoff tail is at most
``1e-6 delta`` (``1e-26`` for delta curves); the core's eps is then taken at
``delta - 1e-6 delta``. The coins restore ``q/(4 r rho)`` of the removed users'
variance (``q = 2r``: 68 % at eps0 = 1, 51 % at eps0 = 4), so a block of width ``b``
costs about ``(1 - q/(4 r rho)) b / (2n)`` instead of ``b / (2n)``.
``tests/protocol/test_rr_exact_any_n.py`` checks the inequality against every dataset of small
blocks in 40-digit arithmetic. A fair coin is a sum of independent Bernoullis too, so
Step 2's threshold sets still apply.

Blocks start as :data:`INITIAL_BLOCKS` equal ones above :data:`EXACT_ALL_N` and are
refined adaptively (the block with the largest bound is split) until the largest block
bound is within ``tol`` of the best certified *lower* bound (an actual dataset at
``n``), the evaluation budget (:func:`evaluation_budget`) is spent, or the block is a
single ``k`` (then the value is exact).

Step 4 -- certified numerics. For one dataset, ``X`` is evaluated on a window:

* each binomial pmf on a window whose outside mass is bounded by the Chernoff bound
  ``Pr[Bin(N, p) >= a N] <= exp(-N KL(a || p))`` (and the lower analogue) below
  ``tail_target``; inside, pmf values come from the exact ratios
  ``(N-s)/(s+1) * p/(1-p)`` accumulated from the mode by ``cumprod`` (relative error at
  most ``7 u`` per step, ``u = 2^-53``), normalised by their sum (the true window mass is
  within the cut mass of 1, which joins the relative error);
* the convolution of the windows (two, or three with a block's coins) is direct (all
  terms positive: relative error ``<= L u``) or by one FFT product, whose error is
  bounded in the 2-norm by ``(kappa + 2ku)(sum_i ||a_i||_2 + ||c||_2)`` for ``k``
  windows (:func:`_fft_convolve`), with ``kappa = log2(N) eta``,
  ``eta = 4 * (u + gamma_4 (sqrt 2 + 2u))`` (Higham 2002, *Accuracy and Stability of
  Numerical Algorithms*, Thm 24.2, for the forward and inverse transforms and the
  pointwise product; the factor 4 covers pocketfft's mixed radices). A sum over
  ``c`` points of FFT output is off by at most ``sqrt(c)`` times that;
* the mass cut by the windows (at most the sum of the two binomial tails) enters
  ``A_t`` upward and is dropped from ``B_t``; for ``t`` outside the window
  ``A_t - e^eps B_t <= T`` (the cut mass), which is below ``delta``.

``A_t`` is bounded above and ``B_t`` below (and vice versa for the lower estimate),
so ``eps_k^+ >= eps_k(delta) >= eps_k^-`` rigorously, up to the stated FFT bound. Where that
bound alone, summed over the top of the window, exceeds ``delta`` while the true tail there is
below it (huge n at a tiny delta), ``B_t``'s bound is not positive and no upper bound below
``eps0`` can be certified: that is decided from the windows before they are convolved
(:func:`_no_claim_before_convolving`).
Thresholds below the mode ``t0`` are not evaluated one by one: there ``A_t - B_t =
(rho - r) X(t-1)`` and ``B_t >= B_t0``, so their ratios are at most ``1 + (rho - r) max X
/ B_t0`` (used only where that is below the best ratio at ``t >= t0``).

Step 5 -- monotone in n. The true ``delta_n(eps)`` is non-increasing in ``n`` (Step 3
with the removed users all zeros), so a bound at any ``n' <= n`` is valid at ``n``.
:func:`rr_monotone_epsilon` reports ``min_{g in grid, g <= n} eps^+(g)`` over a fixed
grid (every integer up to :data:`EXACT_ALL_N`, then geometric with ratio
``1 + GRID_STEP``): a minimum over a set that only grows with ``n``, hence exactly
non-increasing in ``n`` whatever the numerical error. Grid points that cannot win are
skipped because ``eps^+(g) >= eps_true(g) >= eps_true(g') >= eps^-(g')`` for
``g <= g'``. The certificate at ``n``'s grid point is refined (a few more evaluations) until it
is below the all-equal lower bound at the grid point below, when it can be: then no grid point
below needs a certificate of its own.

References: Feldman, McMillan & Talwar, FOCS 2021 ("Hiding among the clones") for the
count reduction of shuffled RR; Koskela, Heikkila & Honkela, AISTATS 2022 / TMLR 2023
("Numerical accounting in the shuffle model") for FFT accounting with error bounds;
Balle, Bell, Gascon & Nissim, CRYPTO 2019 ("The privacy blanket") for shuffled RR.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import fft as sp_fft

from shuffledp.protocol.accounting._numerics import binom_window_shape

from shuffledp.protocol.errors import InvalidParameter

#: Unit roundoff of float64.
_U = 2.0**-53
#: Every batch size up to this is a grid point (and maximised dataset by dataset).
EXACT_ALL_N = 2000
#: Above EXACT_ALL_N the grid is geometric with this ratio minus one.
GRID_STEP = 1.0 / 128.0
#: Relative gap (upper vs lower, in eps) at which the block refinement stops above EXACT_ALL_N.
BLOCK_TOL = 1e-3
#: Above EXACT_ALL_N the refinement also stops after this many dataset evaluations (the
#: reported gap is then larger than BLOCK_TOL; see the certificate's ``lower``).
MAX_EVALUATIONS = 72
#: Extra evaluations a certificate may spend to reach a ``target`` (the lower bound at the grid
#: point below, :func:`rr_monotone_epsilon`): cheaper than certifying that grid point too.
TARGET_EXTRA_EVALUATIONS = 48
#: Above EXACT_ALL_N the datasets start in this many equal blocks (the profile over datasets is
#: flat to a fraction of a percent, so every block ends up at about the same width: starting
#: there spends no evaluations on parents that would all be split).
INITIAL_BLOCKS = 64
#: Largest batch size handled (the FFT windows grow like sqrt(n)).
MAX_N = 10**9
#: Direct convolution when the product of the window lengths is at most this.
_DIRECT_MAX = 200_000


def evaluation_budget(n: int) -> int:
    """Dataset evaluations a certificate may spend at ``n``: every one up to :data:`EXACT_ALL_N`
    (``4n + 64``), then :data:`MAX_EVALUATIONS` from ``n = 1e6`` on, and more below it, where a
    view is cheaper (its FFT length grows like ``sqrt(n)``): ``MAX_EVALUATIONS sqrt(1e6 / n)``,
    at most 256. Moderate n at large eps0 has a peaked profile over datasets that needs them."""
    if n <= EXACT_ALL_N:
        return 4 * n + 64
    return int(min(256.0, MAX_EVALUATIONS * math.sqrt(max(1e6 / n, 1.0))))


def _check(n: int, epsilon0: float) -> tuple[int, float]:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= MAX_N:
        raise InvalidParameter("n", f"must be an integer in [1, {MAX_N}], got {n!r}")
    epsilon0 = float(epsilon0)
    if not (math.isfinite(epsilon0) and 0.0 < epsilon0 <= 50.0):
        raise InvalidParameter("epsilon0", f"must be finite and in (0, 50], got {epsilon0}")
    return int(n), epsilon0


# ------------------------------------------------------------------ binomial windows
def _kl(a: float, p: float) -> float:
    """KL(Bern(a) || Bern(p)), computed without cancellation issues at the ends."""
    out = 0.0
    if a > 0.0:
        out += a * math.log(a / p)
    if a < 1.0:
        out += (1.0 - a) * math.log((1.0 - a) / (1.0 - p))
    return max(out, 0.0)


def _chernoff_upper(N: int, p: float, s: int) -> float:
    """Pr[Bin(N, p) >= s] <= exp(-N KL(s/N || p)) for s >= N p (Chernoff--Hoeffding)."""
    if s > N:
        return 0.0
    if s <= N * p:
        return 1.0
    return math.exp(-N * _kl(s / N, p))


def _chernoff_lower(N: int, p: float, s: int) -> float:
    """Pr[Bin(N, p) <= s] <= exp(-N KL(s/N || p)) for s <= N p."""
    if s < 0:
        return 0.0
    if s >= N * p:
        return 1.0
    return math.exp(-N * _kl(s / N, p))


def _window(N: int, p: float, tail: float) -> tuple[int, int, float]:
    """Integer window [lo, hi] of Bin(N, p) with Pr[outside] <= returned bound <= tail."""
    mu = N * p
    sd = math.sqrt(max(N * p * (1.0 - p), 1e-300))
    z = math.sqrt(2.0 * math.log(2.0 / tail))

    def search(f, start: int, stop: int) -> int:  # first s in direction where f(s) <= tail/2
        a, b = start, stop  # f(a) > tail/2 (or a is the mean), f(b) <= tail/2
        while abs(b - a) > 1:
            mid = (a + b) // 2
            if f(mid) <= tail / 2:
                b = mid
            else:
                a = mid
        return b

    hi_guess = min(N, int(math.ceil(mu + z * sd + 2)))
    while _chernoff_upper(N, p, hi_guess + 1) > tail / 2 and hi_guess < N:
        hi_guess = min(N, hi_guess + int(z * sd) + 2)
    hi = N if hi_guess >= N else search(lambda s: _chernoff_upper(N, p, s + 1), int(math.floor(mu)), hi_guess)
    lo_guess = max(0, int(math.floor(mu - z * sd - 2)))
    while _chernoff_lower(N, p, lo_guess - 1) > tail / 2 and lo_guess > 0:
        lo_guess = max(0, lo_guess - int(z * sd) - 2)
    lo = 0 if lo_guess <= 0 else search(lambda s: _chernoff_lower(N, p, s - 1), int(math.ceil(mu)), lo_guess)
    out = _chernoff_upper(N, p, hi + 1) + _chernoff_lower(N, p, lo - 1)
    return lo, hi, out * (1.0 + 1e-9)


@functools.lru_cache(maxsize=256)
def _binom_window(N: int, epsilon0: float, tail: float) -> tuple[int, np.ndarray, float, float]:
    """(lo, pmf of Bin(N, r) on [lo, hi], relative error bound, outside mass bound), r = 1/(1 + e^eps0).

    The normalised shape of :func:`_numerics.binom_window_shape` (exact ratios from the mode, no
    high-precision anchor); the true window mass ``S`` is in ``[1 - out, 1]``, which joins the
    relative error.
    """
    r = 1.0 / (1.0 + math.exp(epsilon0))
    if N == 0:
        return 0, np.ones(1), 0.0, 0.0
    lo, hi, out = _window(N, r, tail)
    pmf, rel = binom_window_shape(N, -float(epsilon0), lo, hi)  # log(r / rho) = -eps0
    return lo, pmf, (rel + out) * 1.01 + 1e-20, out


# --------------------------------------------------------------- one dataset's view
@dataclass(frozen=True)
class _View:
    """Others' count X = Bin(j, rho) + Bin(l, r) on [lo, lo + len(pmf)) with error bounds.

    True pmf x(s) satisfies ``x >= pmf (1 - rel) - e2`` and ``x <= pmf (1 + rel) + e2 + tau(s)``
    with ``tau >= 0``, ``sum tau <= out``; a sum of the FFT errors over ``c`` points is at most
    ``sqrt(c) e2`` (``e2`` is a 2-norm bound).
    """

    lo: int
    pmf: np.ndarray
    rel: float
    e2: float
    out: float


def _norm2(x: np.ndarray) -> float:
    return math.sqrt(float(np.sum(x * x)))


def _fft_length(parts) -> int:
    """Transform length of :func:`_fft_convolve` for these windows (5-smooth: often ~2x faster than
    the next power of 2)."""
    size = sum(len(p) for p in parts) - len(parts) + 1
    return sp_fft.next_fast_len(size, real=True)


def _fft_error_bound(nfft: int, count: int, norm: float) -> float:
    """The 2-norm error bound of :func:`_fft_convolve` for ``count`` windows of length-``nfft``
    transforms whose 2-norms (the inputs' and the output's) sum to ``norm``. Non-decreasing in
    ``norm`` as computed (every operation is a rounded product or sum of non-negative numbers)."""
    gamma4 = 4 * _U / (1 - 4 * _U)
    eta = 4.0 * (_U + gamma4 * (math.sqrt(2.0) + 2 * _U))
    kappa = math.log2(nfft) * eta
    return (kappa + 2 * count * _U) * norm * 1.05 + kappa * 1e-300


def _fft_convolve(*parts: np.ndarray) -> tuple[np.ndarray, float]:
    """Linear convolution of non-negative windows by one FFT product, and its 2-norm error bound.

    With ``F`` the unnormalised DFT (``||F x||_2 = sqrt(N) ||x||_2``), each computed transform is
    within ``kappa ||F x||_2`` (Higham 2002, Thm 24.2; ``kappa = log2(N) eta``, ``eta`` below, the
    factor 4 for pocketfft's mixed radices). Every ``|F x|`` is at most ``||x||_1 <= 1`` (pmf
    windows), so the product of ``k`` computed transforms is off by at most
    ``kappa sqrt(N) sum ||x||_2`` plus ``2 (k - 1) u`` relative for the complex products, and the
    inverse adds ``kappa ||c||_2``: ``||c_hat - c||_2 <= (kappa + 2 k u)(sum ||x||_2 + ||c||_2)``,
    padded by 5 % for the second-order terms (``kappa sqrt(N) ||x||_2 << 1`` here).
    """
    size = sum(len(p) for p in parts) - len(parts) + 1
    nfft = _fft_length(parts)
    spec = sp_fft.rfft(parts[0], nfft)
    for p in parts[1:]:
        spec = spec * sp_fft.rfft(p, nfft)
    c = np.maximum(sp_fft.irfft(spec, nfft)[:size], 0.0)  # clipping towards the true (non-negative) value only shrinks errors
    # 2-norms by pairwise summation (np.linalg.norm calls BLAS dot, which multi-threads and
    # crawls on a loaded machine)
    norm = float(sum(_norm2(p) for p in parts) + _norm2(c))
    return c, _fft_error_bound(nfft, len(parts), norm)


def _direct_convolve(parts: list[np.ndarray]) -> tuple[np.ndarray, float]:
    """Convolution of non-negative windows by direct sums (positive terms only) and the added
    relative error: each output of ``a * b`` sums at most ``min(len)`` products, ``(min + 2) u``."""
    c, rel = parts[0], 0.0
    for p in parts[1:]:  # (one-point windows never get here: _view scales by them instead)
        c, rel = np.convolve(c, p), rel + (min(len(c), len(p)) + 2) * _U * 1.01
    return c, rel


@dataclass(frozen=True)
class _ViewPlan:
    """What :func:`_view` convolves: ``parts`` (sorted by length, the short ones already merged
    directly), the view's start ``lo``, relative error ``rel`` and cut mass ``out`` so far, the
    product ``scale`` of the one-point windows (kept out of the convolution), and whether the
    last convolution is by FFT."""

    lo: int
    parts: tuple
    rel: float
    out: float
    scale: float
    fft: bool


@functools.lru_cache(maxsize=4)
def _view_plan(j: int, l: int, epsilon0: float, tail: float, coins: int, direct_max: int) -> _ViewPlan:
    """The windows of :func:`_view` and how they are convolved (``direct_max``: :data:`_DIRECT_MAX`)."""
    windows = [_binom_window(j, epsilon0, tail), _binom_window(l, epsilon0, tail)]  # Bin(., r)
    if coins > 0:
        windows.append(_binom_window(int(coins), 0.0, tail))  # Bin(coins, 1/2) = Bin(coins, r) at eps0 = 0
    la, a, rel_a, out_a = windows[0]
    # Bin(j, rho) = j - Bin(j, r): reversed window starting at j - (la + len(a) - 1)
    parts = [a[::-1]] + [w[1] for w in windows[1:]]
    lo = j - (la + len(a) - 1) + sum(w[0] for w in windows[1:])
    rel = 0.0
    for w in windows:  # product of (1 + rel_i), rounded up
        rel = rel + w[2] + rel * w[2]
    out = sum(w[3] for w in windows) * (1.0 + 1e-12)
    # one-point windows (an empty side of a block: N = 0) only scale the rest: kept out of the FFT,
    # whose error bound grows with every factor's 2-norm (a point mass has norm 1)
    scale = 1.0
    for p in parts:
        if len(p) == 1:
            scale *= float(p[0])
            rel += 2.0 * _U
    parts = sorted((p for p in parts if len(p) > 1), key=len) or [np.ones(1)]
    # The two shortest windows (a block's coins, usually) are convolved directly when that is cheap:
    # the FFT's error bound grows with every factor's 2-norm, and a short window's norm is the
    # largest (at delta = 1e-12 a three-factor FFT made B's lower bound negative in the tail).
    while len(parts) > 2 and len(parts[0]) * len(parts[1]) <= 10 * direct_max:
        merged, rel_m = _direct_convolve(parts[:2])
        rel += rel_m
        parts = sorted([merged] + parts[2:], key=len)
    fft = not (len(parts) == 1 or len(parts[-1]) * len(parts[-2]) <= direct_max)  # parts are sorted by length
    return _ViewPlan(lo=int(lo), parts=tuple(parts), rel=rel, out=out, scale=scale, fft=fft)


@functools.lru_cache(maxsize=512)
def _view(j: int, l: int, epsilon0: float, tail: float, coins: int = 0) -> _View:
    """The others' count for ``j`` users holding 1, ``l`` holding 0 and ``coins`` users whose report
    is a fair coin (the blanket part of a block's extra users, Step 3), with the bounds of Step 4."""
    plan = _view_plan(j, l, epsilon0, tail, int(coins), _DIRECT_MAX)
    rel = plan.rel
    if plan.fft:
        c, e2 = _fft_convolve(*plan.parts)
    else:
        c, rel_c = _direct_convolve(list(plan.parts))
        e2 = 0.0
        rel += rel_c
    if plan.scale != 1.0:
        c, e2 = c * plan.scale, e2 * plan.scale
    return _View(lo=plan.lo, pmf=c, rel=rel, e2=e2, out=plan.out)


def _sum_tail_bound(groups: Sequence[tuple[float, float]], s: float) -> float:
    """Chernoff bound on ``Pr[S >= s]`` for ``S`` a sum of independent ``Bin(N_i, p_i)`` (``groups``):
    ``exp(-lam s) prod (1 - p + p e^lam)^N`` at a ``lam >= 0`` found by bisection (any ``lam`` gives a
    bound), padded for the roundings of its evaluation and of the ``p_i`` (a few ulps each)."""
    groups = [(float(N), float(p)) for N, p in groups if N > 0 and p > 0.0]
    total = sum(N for N, _ in groups)
    if s > total:
        return 0.0
    if not groups or s <= sum(N * p for N, p in groups):
        return 1.0

    def slope(lam: float) -> float:  # d/dlam of log E[e^(lam S)]: the tilted mean
        return sum(N * p * math.exp(lam) / (1.0 - p + p * math.exp(lam)) for N, p in groups)

    lo, hi = 0.0, 1.0
    while slope(hi) < s and hi < 512.0:  # (e^lam stays finite)
        lo, hi = hi, 2.0 * hi
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if slope(mid) < s else (lo, mid)
    lam = hi
    terms = [N * math.log1p(p * math.expm1(lam)) for N, p in groups]
    log_bound = sum(terms) - lam * s
    pad = 8.0 * _U * (sum(abs(t) for t in terms) + lam * s + s) + 1e-12
    return min(1.0, math.exp(log_bound + pad) + 1e-300)  # (an underflow is not a bound)


def _top_count_over_delta(e2: float, out: float, delta: float, limit: int) -> int | None:
    """A count ``c <= limit`` of top window points whose FFT allowance in :func:`_tail_arrays`,
    ``e2 (sqrt(c) + 1)``, plus the cut mass exceeds ``delta`` as computed there (near the smallest
    such ``c``; the computed value is non-decreasing in ``c``), or None."""
    if e2 <= 0.0:
        return None
    ratio = (delta - out) / e2 - 1.0
    if ratio > math.sqrt(limit) + 1.0:
        return None
    c = max(1, int(math.floor(max(ratio, 0.0) ** 2)) - 2)
    while c <= limit and not e2 * (math.sqrt(c) + 1.0) + out > delta:
        c += 1
    return c if c <= limit else None


def _no_claim_before_convolving(plan: _ViewPlan, ones: int, zeros: int, coins: int, epsilon0: float,
                                delta: float) -> bool:
    """Whether the upper bound of :func:`_dataset_epsilon_side` on this view is certain to make no
    claim (``eps0``), decided before the (FFT) convolution is computed.

    That bound makes none where the cut mass reaches ``delta``, or where some threshold has a
    positive numerator ``A_t - delta`` over a non-positive ``B_t`` bound (:func:`_ratio_of`). Take
    the threshold ``t`` with ``c`` window points at or above it. There ``A^+ >= e2 (sqrt(c) + 1) +
    out``, with ``e2`` :func:`_fft_convolve`'s bound, at least its expression without the output's
    norm (:func:`_fft_error_bound` is non-decreasing in the norm); :func:`_top_count_over_delta`
    picks ``c`` so that this exceeds ``delta``. And ``B^- = (r x(t-1) + Xbar(t))(1 - rel) - e2
    (sqrt(c) + 1)``: the computed ``x`` is within ``e2`` (2-norm) of the exact convolution of the
    windows, so over these ``c + 1`` points ``r x(t-1) + Xbar(t)`` is at most the exact tail from
    ``t - 1`` plus ``sqrt(c + r^2) e2 <= (sqrt(c) + r) e2`` (Cauchy-Schwarz), up to ``(c + 4) u``
    relative for the sums. The exact convolution is at most the true law of the others' count
    divided by ``1 - rel`` (each window's entries are), whose tail :func:`_sum_tail_bound` bounds.
    Tail ``<= (1 - r - 2 (sqrt(c) + 1)(c + 6) u) e2`` then gives ``B^- <= 0``: the same ``eps0`` the
    view would give. This is where the FFT's error bound alone exceeds ``delta`` (huge n at a tiny
    delta): no upper bound below ``eps0`` can be certified there."""
    if plan.out >= delta:
        return True
    if not plan.fft or plan.rel >= 0.5:
        return False
    size = sum(len(p) for p in plan.parts) - len(plan.parts) + 1  # the view's length
    norm = float(sum(_norm2(p) for p in plan.parts))
    e2 = _fft_error_bound(_fft_length(plan.parts), len(plan.parts), norm) * plan.scale
    c = _top_count_over_delta(e2, plan.out, delta, size - 1)
    if c is None:
        return False
    r = 1.0 / (1.0 + math.exp(epsilon0))
    rho = 1.0 / (1.0 + math.exp(-epsilon0))
    threshold = plan.lo + (size - c) - 1  # the others' count at t - 1
    tail = _sum_tail_bound([(ones, rho), (zeros, r), (coins, 0.5)], float(threshold)) / (1.0 - plan.rel)
    slack = 2.0 * (math.sqrt(c) + 1.0) * (c + 6) * _U
    return tail * (1.0 + (c + 4) * _U) * (1.0 + 1e-9) <= e2 * (1.0 - r - slack) * (1.0 - 1e-9)


def _tail_arrays(v: _View, epsilon0: float, upper: bool, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Bounds on (A_t, B_t) for t in [lo + start, hi + 1]: (A^+, B^-) if ``upper`` else (A^-, B^+)."""
    rho = 1.0 / (1.0 + math.exp(-epsilon0))
    r = 1.0 / (1.0 + math.exp(epsilon0))
    x = v.pmf
    L = len(x)
    # Xbar over the window, summed from the top (small terms first): t = lo + start .. hi + 1
    xbar = np.concatenate([np.cumsum(x[start:][::-1])[::-1], [0.0]])
    xm1 = np.concatenate([[0.0], x]) if start == 0 else x[start - 1:]  # X(t - 1)
    count = np.arange(L - start, -1, -1, dtype=np.float64)  # window points >= t
    fft_sum = v.e2 * (np.sqrt(count) + 1.0)
    rel = v.rel + (L + 8) * _U * 1.01
    a = rho * xm1 + xbar
    b = r * xm1 + xbar
    if upper:
        return a * (1 + rel) + fft_sum + v.out, b * (1 - rel) - fft_sum
    return a * (1 - rel) - fft_sum, b * (1 + rel) + fft_sum + v.out


def _view_tail(n_others: int, epsilon0: float, delta: float | None) -> float:
    """Mass allowed outside the windows: 1e-10 of the target delta (1e-25 for delta curves)."""
    base = 1e-25 if delta is None else min(1e-14, delta * 1e-10)
    return max(base, 1e-280)


def dataset_epsilon(delta: float, ones: int, zeros: int, epsilon0: float) -> tuple[float, float]:
    """Certified (upper, lower) bounds on eps(delta) of ``D(P1 || P0)`` for one dataset.

    ``ones`` / ``zeros``: the other users' bits (user 1's direction 1 -> 0; the other direction
    is this one at ``(zeros, ones)``, Step 1). Closed form of Step 2 with the bounds of Step 4.
    """
    return (_dataset_epsilon_side(delta, ones, zeros, epsilon0, True),
            _dataset_epsilon_side(delta, ones, zeros, epsilon0, False))


def _dataset_epsilon_side(delta: float, ones: int, zeros: int, epsilon0: float, upper: bool,
                          coins: int = 0) -> float:
    """One side of :func:`dataset_epsilon`: the upper bound if ``upper``, else the lower bound
    (the certificate needs only one of them per dataset; each is the same number either way).
    ``coins``: other users whose reports are fair coins (a block's blanket, Step 3)."""
    tail = _view_tail(ones + zeros, epsilon0, delta)
    if upper and _no_claim_before_convolving(
            _view_plan(int(ones), int(zeros), float(epsilon0), tail, int(coins), _DIRECT_MAX),
            int(ones), int(zeros), int(coins), float(epsilon0), delta):
        return epsilon0
    v = _view(int(ones), int(zeros), float(epsilon0), tail, int(coins))
    # Thresholds below the mode t0 cannot win (Step 2): there A_t - B_t = (rho - r) X(t-1) and
    # B_t >= B_t0 (B is non-increasing in t), so every ratio (A_t - delta)/B_t is at most
    # 1 + (rho - r) max X / B_t0, about 1 + 0.8 (rho - r)/sd against 1 + z (rho - r)/sd at the
    # optimum (z ~ 4.5 at delta = 1e-6, the Mills ratio). Only t >= t0 is computed, and the cheap
    # bound is checked to be below the best ratio found (else every t is computed).
    start = int(np.argmax(v.pmf)) if len(v.pmf) > 64 else 0
    ratio, b0 = _best_ratio(v, epsilon0, upper, delta, start)
    if upper and start > 0:
        rho_minus_r = math.tanh(epsilon0 / 2.0)  # rho - r
        x_max = float(np.max(v.pmf)) * (1 + v.rel) + v.e2 + v.out
        if ratio is None or b0 <= 0.0 or 1.0 + rho_minus_r * x_max / b0 * (1 + 1e-9) > ratio:
            ratio, _ = _best_ratio(v, epsilon0, upper, delta, 0)
    if ratio is None:
        return epsilon0
    if upper:
        e = math.log(ratio * (1 + 4 * _U)) * (1 + 4 * _U) + 1e-300 if ratio > 1 else 0.0
    else:
        e = math.log(ratio * (1 - 4 * _U)) * (1 - 4 * _U) if ratio > 1 else 0.0
    return min(max(e, 0.0), epsilon0)


def _best_ratio(v: _View, epsilon0: float, upper: bool, delta: float, start: int) -> tuple[float | None, float]:
    """``max_t (A_t - delta) / B_t`` over ``t >= lo + start`` from the bounds of :func:`_tail_arrays`
    (0 where no term is positive; ``None``, i.e. no claim below eps0, where an upper bound cannot
    be certified: the cut mass reaches delta, or a positive numerator meets a non-positive B),
    and the bound on ``B`` at the first threshold."""
    if start == 0 and len(v.pmf) <= _SMALL_VIEW:
        return _best_ratio_small(v, epsilon0, upper, delta)
    a, b = _tail_arrays(v, epsilon0, upper, start)
    return _ratio_of(a, b, v, upper, delta), float(b[0])


#: Views of at most this many points take :func:`_best_ratio_small` (numpy's per-call cost dominates).
_SMALL_VIEW = 32


def _best_ratio_small(v: _View, epsilon0: float, upper: bool, delta: float) -> tuple[float | None, float]:
    """:func:`_best_ratio` from ``start = 0`` on a short view: :func:`_tail_arrays` and :func:`_ratio_of`
    point by point in Python floats, the same IEEE operations in the same order (the tail sums
    sequentially from the top, as ``np.cumsum`` does), hence the same numbers."""
    rho = 1.0 / (1.0 + math.exp(-epsilon0))
    r = 1.0 / (1.0 + math.exp(epsilon0))
    x = v.pmf.tolist()
    L = len(x)
    xbar = [0.0] * (L + 1)
    for i in range(L - 1, -1, -1):
        xbar[i] = x[i] if i == L - 1 else xbar[i + 1] + x[i]
    rel = v.rel + (L + 8) * _U * 1.01
    grow, shrink = 1 + rel, 1 - rel
    best, first_b, no_claim = None, 0.0, False
    for i in range(L + 1):
        xm1 = x[i - 1] if i > 0 else 0.0
        fft_sum = v.e2 * (math.sqrt(L - i) + 1.0)
        a = rho * xm1 + xbar[i]
        b = r * xm1 + xbar[i]
        if upper:
            a, b = a * grow + fft_sum + v.out, b * shrink - fft_sum
        else:
            a, b = a * shrink - fft_sum, b * grow + fft_sum + v.out
        if i == 0:
            first_b = b
        num = a - delta
        if num > 0:
            if b <= 0:
                no_claim = True  # a positive numerator over a non-positive B
            else:
                ratio = num / b
                best = ratio if best is None else max(best, ratio)
    if upper and (v.out >= delta or no_claim):
        return None, first_b
    return (0.0 if best is None else best), first_b


def _ratio_of(a: np.ndarray, b: np.ndarray, v: _View, upper: bool, delta: float) -> float | None:
    num = a - delta
    pos = num > 0
    if upper and (v.out >= delta or np.any(pos & (b <= 0))):
        return None
    if not np.any(pos & (b > 0)):
        return 0.0
    return float(np.max(num[pos & (b > 0)] / b[pos & (b > 0)]))


def dataset_delta(eps: float, ones: int, zeros: int, epsilon0: float) -> tuple[float, float]:
    """Certified (upper, lower) bounds on ``D_{e^eps}(P1 || P0)`` for one dataset."""
    return (_dataset_delta_side(eps, ones, zeros, epsilon0, True),
            _dataset_delta_side(eps, ones, zeros, epsilon0, False))


def _dataset_delta_side(eps: float, ones: int, zeros: int, epsilon0: float, upper: bool,
                        coins: int = 0) -> float:
    """One side of :func:`dataset_delta` (the upper bound if ``upper``; ``coins`` as in
    :func:`_dataset_epsilon_side`)."""
    if eps >= epsilon0:
        return 0.0
    eps = max(float(eps), 0.0)
    tail = _view_tail(ones + zeros, epsilon0, None)
    v = _view(int(ones), int(zeros), float(epsilon0), tail, int(coins))
    E = math.exp(eps)
    a, b = _tail_arrays(v, epsilon0, upper)
    if upper:
        return min(1.0, max(float(np.max(a - E * b)) * (1 + 4 * _U), v.out * (1 + 4 * _U), 0.0))
    return max(float(np.max(a - E * b)) * (1 - 4 * _U), 0.0)


# ------------------------------------------------------------- all datasets at n
#: A block's fair-coin count fails (too few of its extra users in the blanket) with probability at
#: most this fraction of the target delta (eps(delta) searches) ...
COIN_TAIL_OF_DELTA = 1e-6
#: ... or at most this absolute probability (delta curves, which go down to ~1e-15).
COIN_TAIL_CURVE = 1e-26
#: Below this target delta a block is also bounded by its plain core and the smaller bound kept.
COIN_PLAIN_BELOW_DELTA = 1e-9


def block_coins(extra: int, epsilon0: float, tail_mass: float) -> int:
    """Fair-coin reports certainly present among a block's ``extra`` users, but with probability at
    most ``tail_mass`` (Step 3): each extra user lands in binary RR's blanket with probability
    ``2 r = 2/(1 + e^eps0)``, so the count is ``Bin(extra, 2r)``; the largest ``w`` with the Chernoff
    bound ``Pr[Bin(extra, 2r) <= w - 1] <= exp(-extra KL((w-1)/extra || 2r)) <= tail_mass``."""
    if extra <= 0:
        return 0
    q = 2.0 / (1.0 + math.exp(epsilon0))
    lo, hi = 0, int(math.floor(extra * q))  # w = lo always qualifies (Pr[... <= -1] = 0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _chernoff_lower(extra, q, mid - 1) <= tail_mass:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _block_heap(m: int, blocks: int, core_bound) -> list[tuple[float, int, int]]:
    """The datasets ``k in [0, m]`` in about ``blocks`` equal blocks, as a max-heap on
    ``core_bound(k1, k2)`` (the bound of the block's core dataset; Step 3)."""
    blocks = min(m + 1, blocks)
    edges = np.unique(np.round(np.linspace(0, m + 1, blocks + 1)).astype(np.int64))
    heap: list[tuple[float, int, int]] = []
    for k1, k2 in zip(edges[:-1], edges[1:] - 1):
        heapq.heappush(heap, (-core_bound(int(k1), int(k2)), int(k1), int(k2)))
    return heap


def _split_top(heap: list[tuple[float, int, int]], core_bound) -> None:
    """Replace the block with the largest bound by its two halves (two core evaluations)."""
    _, k1, k2 = heapq.heappop(heap)
    mid = (k1 + k2) // 2
    for a, b in ((k1, mid), (mid + 1, k2)):
        heapq.heappush(heap, (-core_bound(a, b), a, b))


@dataclass(frozen=True)
class RRCertificate:
    """Certified central eps (upper, lower) of shuffled binary RR at one n and delta."""

    n: int
    epsilon0: float
    delta: float
    upper: float
    lower: float
    worst_ones: int
    evaluations: int
    exact: bool  # every block a single dataset: upper and lower differ by numerical error only

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def certify_epsilon(delta: float, n: int, epsilon0: float, tol: float | None = None,
                    max_evaluations: int | None = None, target: float | None = None) -> RRCertificate:
    """Certified bounds on the central eps(delta) of shuffled binary RR with n users (Step 3).

    Maximises over every dataset (``k`` ones among the others, ``k in [0, n-1]``, the
    other direction by symmetry). ``tol``: stop when the largest block bound is within
    ``tol`` (relative) of the best lower bound; default 0 up to :data:`EXACT_ALL_N`
    (every block refined to one dataset where it could matter), :data:`BLOCK_TOL` above.
    ``target`` (above :data:`EXACT_ALL_N` only): while the upper bound is above it, up to
    :data:`TARGET_EXTRA_EVALUATIONS` more evaluations than the budget are spent to get there
    (:func:`rr_monotone_epsilon` passes a lower bound at the grid point below).
    """
    n, epsilon0 = _check(n, epsilon0)
    if not 0.0 < delta < 1.0:
        raise InvalidParameter("delta", f"must be in (0, 1), got {delta}")
    if tol is None:
        tol = 0.0 if n <= EXACT_ALL_N else BLOCK_TOL
    if n <= EXACT_ALL_N:
        target = None
    if max_evaluations is None:
        max_evaluations = evaluation_budget(n)
    extended = max_evaluations + (TARGET_EXTRA_EVALUATIONS if target is not None else 0)
    m = n - 1
    evals = 0

    coin_tail = delta * COIN_TAIL_OF_DELTA

    def core_upper(k1: int, k2: int) -> float:
        nonlocal evals
        evals += 1
        coins = block_coins(k2 - k1, epsilon0, coin_tail)
        if coins == 0:
            return _dataset_epsilon_side(delta, k1, m - k2, epsilon0, True)
        bound = _dataset_epsilon_side(delta - coin_tail, k1, m - k2, epsilon0, True, coins)
        if bound >= epsilon0 or delta < COIN_PLAIN_BELOW_DELTA:
            # At tiny delta the tail probabilities that matter approach the FFT's absolute error, which
            # grows with the coins' window (delta = 1e-12, n = 1e6, eps0 = 1: 1.12x the lower bound
            # with coins alone, 1.03x with plain cores): both bounds are valid, keep the smaller.
            evals += 1
            bound = min(bound, _dataset_epsilon_side(delta, k1, m - k2, epsilon0, True))
        return bound

    best_lower, best_k = 0.0, 0
    lowered: set[int] = set()

    def lower_at(k: int) -> None:
        nonlocal best_lower, best_k, evals
        if k in lowered:
            return
        lowered.add(k)
        evals += 1
        lo = _dataset_epsilon_side(delta, k, m - k, epsilon0, False)
        if lo > best_lower:
            best_lower, best_k = lo, k

    heap = _block_heap(m, 16 if n <= EXACT_ALL_N else INITIAL_BLOCKS, core_upper)
    for k in (0, m):
        lower_at(k)
    while True:
        neg, k1, k2 = heap[0]
        top = -neg
        if k1 == k2:
            lower_at(k1)
            break
        if top <= best_lower * (1.0 + tol) or top <= 0.0:
            break
        over_budget = evals + 3 > max_evaluations
        if over_budget and target is not None and top > target:
            over_budget = evals + 3 > extended  # keep refining towards the target
        if over_budget:
            lower_at((k1 + k2) // 2)  # the best lower estimate inside the top block
            break
        _split_top(heap, core_upper)
    upper = -heap[0][0]
    exact = all(k1 == k2 for _, k1, k2 in heap[:1]) and tol == 0.0
    return RRCertificate(n=n, epsilon0=epsilon0, delta=float(delta), upper=max(upper, best_lower),
                         lower=min(best_lower, upper), worst_ones=best_k, evaluations=evals, exact=exact)


def certified_delta(eps: float, n: int, epsilon0: float) -> float:
    """Certified upper bound on the central delta_n(eps) of shuffled binary RR (every dataset).

    Every single dataset is evaluated (``O(n)`` views): meant for small ``n`` (tests, curves).
    """
    n, epsilon0 = _check(n, epsilon0)
    m = n - 1
    return max(dataset_delta(eps, k, m - k, epsilon0)[0] for k in range(m + 1))


def certified_delta_curve(eps_grid: np.ndarray, n: int, epsilon0: float, reference_eps: float,
                          max_evaluations: int | None = None) -> np.ndarray:
    """Certified upper bounds on the central ``delta_n(eps)`` of shuffled binary RR at every ``eps``
    of ``eps_grid`` (every dataset; for privacy-loss curves and composition).

    Step 3 with ``delta`` in place of ``eps``: the datasets ``k in [0, n-1]`` are split into blocks,
    refined where the block bound at ``reference_eps`` is largest (at most ``max_evaluations``
    cores above :data:`EXACT_ALL_N`), and each block is bounded by its core dataset at *every*
    ``eps`` (post-processing holds eps by eps). Each core's view is built once (windows cut at
    1e-25) and reused across the grid, so a curve costs about one certificate. Valid at ``n``;
    callers may pass a grid ``n' <= n`` (a larger batch is a post-processing of a smaller one).
    """
    n, epsilon0 = _check(n, epsilon0)
    eps_grid = np.asarray(eps_grid, dtype=np.float64)
    if max_evaluations is None:
        max_evaluations = evaluation_budget(n)
    m = n - 1

    def coins_of(k1: int, k2: int) -> int:
        return block_coins(k2 - k1, epsilon0, COIN_TAIL_CURVE)

    def core_at_reference(k1: int, k2: int) -> float:
        coins = coins_of(k1, k2)
        return _dataset_delta_side(reference_eps, k1, m - k2, epsilon0, True, coins) + (COIN_TAIL_CURVE if coins else 0.0)

    heap = _block_heap(m, 24, core_at_reference)
    evals = len(heap)
    best_lower = max(_dataset_delta_side(reference_eps, k, m - k, epsilon0, False) for k in (0, m))
    while evals + 2 <= max_evaluations:
        neg, k1, k2 = heap[0]
        if k1 == k2 or -neg <= best_lower * (1.0 + BLOCK_TOL):
            break
        _split_top(heap, core_at_reference)
        evals += 2
    E = np.exp(np.maximum(eps_grid, 0.0))
    out = np.zeros(len(eps_grid))
    tail = _view_tail(m, epsilon0, None)
    for _, k1, k2 in heap:  # the core's tail arrays once, every eps of the grid at once
        coins = coins_of(k1, k2)
        v = _view(int(k1), int(m - k2), float(epsilon0), tail, coins)
        a, b = _tail_arrays(v, epsilon0, True)
        best = np.full(len(E), -np.inf)
        step = max(1, 4_000_000 // max(len(E), 1))
        for i in range(0, len(a), step):
            best = np.maximum(best, np.max(a[None, i:i + step] - E[:, None] * b[None, i:i + step], axis=1))
        core_delta = np.maximum(np.maximum(best * (1 + 4 * _U), v.out * (1 + 4 * _U)), 0.0)
        if coins:  # the block's coin count fell short (Step 3)
            core_delta = core_delta + COIN_TAIL_CURVE
        out = np.maximum(out, core_delta)
    out[eps_grid >= epsilon0] = 0.0
    return np.minimum(out, 1.0)


# --------------------------------------------------------------- monotone in n
def grid_floor(n: int) -> int:
    """Largest grid point <= n (Step 5)."""
    if n <= EXACT_ALL_N:
        return n
    i = int(math.floor(math.log(n / EXACT_ALL_N) / math.log1p(GRID_STEP)))
    while _grid_point(i + 1) <= n:
        i += 1
    while _grid_point(i) > n:
        i -= 1
    return _grid_point(i)


def _grid_point(i: int) -> int:
    return EXACT_ALL_N if i <= 0 else int(math.floor(EXACT_ALL_N * (1.0 + GRID_STEP) ** i))


def _grid_prev(g: int) -> int | None:
    if g <= 1:
        return None
    if g <= EXACT_ALL_N:
        return g - 1
    i = int(round(math.log(g / EXACT_ALL_N) / math.log1p(GRID_STEP)))
    while _grid_point(i) >= g:
        i -= 1
    while _grid_point(i + 1) < g:
        i += 1
    return _grid_point(i)


@dataclass(frozen=True)
class RRMonotone:
    """Reported eps (non-increasing in n), the grid point it comes from, and the certificate at n's grid point."""

    epsilon: float
    from_n: int
    lower: float
    certificate: RRCertificate


def rr_monotone_epsilon(delta: float, n: int, epsilon0: float, certify=None) -> RRMonotone:
    """``min_{g in grid, g <= n}`` of the certified upper bound (Step 5): valid at n, non-increasing in n.

    ``certify(delta, g, epsilon0, target=None) -> RRCertificate`` may be a cached wrapper of
    :func:`certify_epsilon`. ``lower`` is a certified lower bound on the exact eps at ``n``
    itself (one or two datasets evaluated at ``n``: the grid point's worst one and all-ones).
    """
    n, epsilon0 = _check(n, epsilon0)
    certify = certify or certify_epsilon
    g = grid_floor(n)
    prev = _grid_prev(g)
    # A certified lower bound at the grid point below (its all-equal datasets, both directions):
    # once the certificate at g is below it, no grid point below g can give a smaller bound, so
    # the certificate is refined towards it (cheaper than certifying the point below as well).
    target = None
    if prev is not None and g > EXACT_ALL_N:
        target = max(_dataset_epsilon_side(delta, prev - 1, 0, epsilon0, False),
                     _dataset_epsilon_side(delta, 0, prev - 1, epsilon0, False))
    here = certify(delta, g, epsilon0, target=target)
    best, best_g = here.upper, g
    # Grid points below ``prev`` are skipped once a lower bound at ``prev`` reaches ``best``:
    # eps^+(g') >= eps(g') >= eps(prev) >= lower(prev) >= best for every g' <= prev.
    # (Once best >= eps0 nothing can be gained either way: eps0 is the cap of every bound.)
    while prev is not None and best < epsilon0:
        if _dataset_epsilon_side(delta, prev - 1, 0, epsilon0, False) >= best:  # cheap: one dataset at prev
            break
        # ... or the grid point's worst dataset, scaled to prev (one more dataset: a lower bound too)
        k_prev = int(round(here.worst_ones * (prev - 1) / max(g - 1, 1)))
        if _dataset_epsilon_side(delta, k_prev, prev - 1 - k_prev, epsilon0, False) >= best:
            break
        c = certify(delta, prev, epsilon0)
        if c.upper < best:
            best, best_g = c.upper, prev
        if c.lower >= best:
            break
        prev = _grid_prev(prev)
    m = n - 1
    k = here.worst_ones if g == n else int(round(here.worst_ones * m / max(g - 1, 1)))
    lower = max(_dataset_epsilon_side(delta, k, m - k, epsilon0, False),
                _dataset_epsilon_side(delta, m, 0, epsilon0, False))
    return RRMonotone(epsilon=best, from_n=best_g, lower=min(lower, best), certificate=here)


__all__ = [
    "EXACT_ALL_N",
    "GRID_STEP",
    "RRCertificate",
    "RRMonotone",
    "block_coins",
    "certified_delta",
    "certified_delta_curve",
    "certify_epsilon",
    "dataset_delta",
    "dataset_epsilon",
    "evaluation_budget",
    "grid_floor",
    "rr_monotone_epsilon",
]

