"""Privacy-blanket bound for a mechanism, worst input pair by convex order, tilted FFT.

**The bound** (Balle, Bell, Gascon & Nissim, CRYPTO 2019, "The privacy blanket of the
shuffle model", Thm 3.1; Su, Cheng & Wang 2025, arXiv 2504.07414, show this blanket
decomposition is the optimal one among all decomposition ("general clone") analyses).
Let ``R(x)`` be the randomizer's output distribution, ``w(y) = min_x R(x)(y)`` its
pointwise floor over *every* input, ``gamma = sum_y w(y)`` and ``omega = w / gamma``.
Each other user's report is, with probability ``gamma`` and independently of its input,
a draw from ``omega`` (the blanket), and otherwise a draw from its own remainder. Tell
the analyst which other users did not land in the blanket and what they sent (post-
processing can only lower the divergence, so this only weakens the claim). What is
left is the multiset of ``M ~ Bin(n-1, gamma)`` blanket draws plus user 1's report;
its likelihood ratio against ``omega^(M+1)`` is a uniform average, and with
``Bin(k-1; n-1, gamma) gamma / k = Bin(k; n, gamma) / n``:

    delta(eps) <= (1/n) E[(sum_{i=1}^{n} B_i l(V_i))_+],
    l(y) = (R(x1)(y) - e^eps R(x1')(y)) / w(y) = A1(y) - e^eps A2(y),

with ``B_i ~ Bern(gamma)`` and ``V_i ~ omega`` independent. The same argument with the two
inputs swapped gives the other direction; the laws below are symmetric, so one suffices.
This holds for every dataset of the other users and needs only ``w > 0`` where
``R(x1) > 0`` (true for any pure eps0-LDP randomizer). Inputs that are mixtures of
grid inputs (randomized rounding) are covered by joint convexity of the hockey-stick
divergence.

**The worst input pair** (our argument). ``E[A_x(V)] = 1/gamma`` for every ``x``. If
``A_x <=_cx X*`` (convex order) for every input ``x`` then, for every pair,
``l = A_x1 - e^eps A_x1' <=_cx`` the comonotone sum of ``X*`` and ``-e^eps X*``
(the comonotone coupling is the largest in convex order among couplings with given
marginals, and comonotone sums are monotone in the convex order of the marginals:
Dhaene, Denuit, Goovaerts, Kaas & Vyncke 2002, "The concept of comonotonicity in
actuarial science and finance: theory", Thms 6-7). Convex order is preserved by the
independent Bernoulli thinning and by sums of independent terms, and ``(.)_+`` is
convex, so the bound for that comonotone law holds for every pair.

* *Projected discrete-Laplace mean report* (``client/mean_randomizer.py``): grid inputs
  ``u in {0..G}``, report ``u + N``, ``P(N = k) ~ r^|k|``, ``r = e^(-eps0/G)``. With
  ``m(y) = max(|y|, |y - G|)``, ``w(y) ~ r^m(y)`` and ``A_u(y) = r^(|y-u| - m(y))``. For
  ``u <= G/2`` the exponent is ``a_u(y) = clip(a_0(y) + u, u, G - u)`` (check the regions
  ``y <= u``, ``u <= y <= G/2``, ``y >= G/2``), so ``A_u = h_u(A_0)`` with ``h_u`` non-
  decreasing, above the identity below one point and below it above: a contraction
  with the same mean, hence ``A_u <=_cx A_0`` (Shaked & Shanthikumar 2007, Thm 3.A.44
  via the single crossing of the distribution functions); ``u > G/2`` by the reflection
  ``y -> G - y``. ``A_0`` is non-increasing and ``A_G`` non-decreasing in ``y``, so the
  extreme pair ``(0, G)`` *is* the comonotone law: the bound below is the blanket bound
  of the pair ``(0, G)``, and it holds for every pair. Clamping reports to
  ``[-B, G + B]`` is post-processing of each report, and the clamped law is in fact
  the same (the clamped atoms have the same ``(A1, A2)`` as their neighbours). The
  vector protocol's report ``(j, u_j + N)`` with ``j`` uniform and the same ``G`` on
  every coordinate has the same law of ``A`` (a mixture over ``j`` of laws each
  ``<=_cx A_0``), so the bound covers it too.
  ``tests/protocol/accounting/test_blanket.py`` checks the lemma's consequence by brute force:
  every input pair's exact blanket divergence at small ``G`` and ``n`` is at most the
  extreme pair's, and the bound is above the exact shuffled divergence maximised over
  every dataset and pair.
* *Binary and k-ary RR* (:func:`k_rr_law`): every pair has the same law; the bound
  equals the stronger clone / corrected variation-ratio values (an independent
  implementation the tests compare against); it is kept for those cross-checks only.

**Numerics** (:func:`blanket_delta`: an upper bound, every approximation on the safe side):

1. *Lattice.* Each atom ``x`` is first raised by a margin covering its floating-point
   error, then rounded *randomly* to the two neighbouring multiples of ``h`` with the
   probabilities that keep its mean: a mean-preserving spread, hence larger in convex
   order (Strassen), so the bound can only grow. The inflation of the variance is
   ``h^2/4`` per term (``h = sd / resolution``), not a bias growing with ``n``.
2. *Tilting.* With ``p`` the lattice pmf of one term, ``M(theta) = sum_k p(k) e^(theta k)``
   and ``p_theta = p e^(theta k) / M``, ``E[T_+] = M^n sum_{t>0} t e^(-theta t) P_theta(T = t)``
   exactly; ``theta`` is the saddle point (tilted mean 0) so the FFT works on the bulk.
3. *FFT.* ``P_theta(T = .)`` on a circle of ``N`` points: aliasing only adds mass, so the
   computed values (before rounding) are upper bounds. Frequencies where
   ``|phi|^n`` matters are recomputed by direct summation with ``phi - 1`` formed without
   cancellation, so the ``n``-fold power keeps relative accuracy; the error of every
   step (input pmf, direct sums, the power, the dropped frequencies bounded by
   ``(|phi_fft| + e_fft)^n`` with Higham's FFT bound ``e_fft``, and the inverse
   transform) is bounded per point and added.
4. *Tail.* For ``t`` beyond the window, ``P(T = t) <= M^n e^(-theta t)`` (Chernoff), summed
   in closed form. Far above the crossing, ``E[T_+] <= M^n / (e theta)`` alone (from
   ``t e^(-theta t) <= 1/(e theta)``) already certifies a small delta without an FFT.
5. *Two stages* (``n >= 2^18``). The bound is computed for ``n' = a n1 <= n`` users with
   ``n1 ~ sqrt(n)`` (valid at ``n``: a larger batch is a post-processing of a smaller one).
   Step 3 gives each block's tilted pmf on a window, plus its error bound (an upper
   envelope); the event that some block leaves its window adds at most
   ``a P_theta(out) / (e theta)`` (Chernoff). Each block value is then rounded randomly and
   mean-preservingly (in the untilted measure: convex order again) to a coarser lattice
   and re-tilted, and step 3 runs on the ``a`` coarse blocks. The FFTs shrink from
   ``~sqrt(n)`` points per sd to ``~10``: about 1 ms per evaluation at ``n = 1e8`` instead of
   1 s, for a bound at most a few percent larger in delta (0.05-0.25 % in eps; the tests
   compare both ways). Heavy-tailed terms (large eps0) fall back to one stage.

References: Balle et al. 2019 (above); Su, Cheng & Wang 2025 (above); Koskela,
Heikkila & Honkela, TMLR 2023 ("Numerical accounting in the shuffle model") for FFT
accounting of shuffled mechanisms; Higham 2002, *Accuracy and Stability of Numerical
Algorithms*, Thm 24.2 for the FFT error bound.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import fft as sp_fft
from scipy import optimize

from shuffledp.protocol.errors import InvalidParameter

_U = 2.0**-53
#: Lattice step = sd of one term / this (variance inflation 1 / (4 RESOLUTION^2)).
RESOLUTION = 10
#: Frequencies whose |phi|^n is below e^-DROP_LOG are dropped (their mass is bounded and added).
DROP_LOG = 80.0
#: Largest FFT length used; beyond it the bound reports the trivial delta = 1.
MAX_FFT = 1 << 25
#: Half-width of the summed window around the tilted mean, in sd of the sum: beyond it on the
#: right a Chernoff bound is added (``_window_tail``), and the left side's mass (below e^-40 of
#: the total) only aliases onto the circle, which adds mass.
WINDOW_SD = 10.0
#: Above this many (frequency, atom) products the characteristic function comes from the FFT.
DIRECT_BUDGET = 1e6


@dataclass(frozen=True)
class BlanketLaw:
    """The law of ``(A1, A2) = (R(x1), R(x1')) / w`` under the blanket ``omega``, and ``gamma``."""

    a1: np.ndarray
    a2: np.ndarray
    weight: np.ndarray
    gamma: float
    name: str

    def __post_init__(self) -> None:
        if not (0.0 < self.gamma <= 1.0):
            raise InvalidParameter("gamma", f"must be in (0, 1], got {self.gamma}")
        if not (len(self.a1) == len(self.a2) == len(self.weight)):
            raise InvalidParameter("law", "a1, a2 and weight must have the same length")


@functools.lru_cache(maxsize=64)
def laplace_report_law(epsilon0: float, grid_levels: int) -> BlanketLaw:
    """Blanket law of the projected discrete-Laplace report, extreme pair ``(0, G)`` (worst: module doc)."""
    G = int(grid_levels)
    if G < 1:
        raise InvalidParameter("grid_levels", f"must be >= 1, got {grid_levels!r}")
    if not (math.isfinite(epsilon0) and epsilon0 > 0):
        raise InvalidParameter("epsilon0", f"must be finite and > 0, got {epsilon0!r}")
    s = G / float(epsilon0)
    log_r = -1.0 / s
    c = -math.expm1(log_r) / (1.0 + math.exp(log_r))  # (1 - r) / (1 + r)
    y = np.arange(0, G + 1, dtype=np.float64)
    m = np.maximum(y, G - y)
    w_mid = c * np.exp(m * log_r)
    # y < 0 (and, by symmetry, y > G): w(y) = c r^(G - y), summed; A = (e^eps0, 1) there.
    lump = c * math.exp((G + 1) * log_r) / -math.expm1(log_r)
    a1 = np.concatenate([np.exp((np.abs(y) - m) * log_r), [math.exp(epsilon0), 1.0]])
    a2 = np.concatenate([np.exp((np.abs(y - G) - m) * log_r), [1.0, math.exp(epsilon0)]])
    w = np.concatenate([w_mid, [lump, lump]])
    gamma = float(w.sum())
    return BlanketLaw(a1, a2, w / gamma, min(1.0, gamma), f"laplace-report(G={G})")


def k_rr_law(epsilon0: float, k: int) -> BlanketLaw:
    """Blanket law of k-ary randomized response (``k = 2``: binary), any pair (all alike)."""
    E = math.exp(epsilon0)
    q = 1.0 / (E + k - 1)
    if k == 2:
        a1, a2, w = np.array([E, 1.0]), np.array([1.0, E]), np.array([q, q])
    else:
        a1, a2, w = np.array([E, 1.0, 1.0]), np.array([1.0, E, 1.0]), np.array([q, q, (k - 2) * q])
    gamma = float(w.sum())
    return BlanketLaw(a1, a2, w / gamma, gamma, f"{k}-rr")


def hadamard_response_law(epsilon0: float, K: int) -> BlanketLaw:
    """Blanket law of one-bit Hadamard response over ``K >= 2`` columns, any pair (all alike).

    Outputs ``(j, b)`` with the row ``j`` uniform over all ``K`` rows (``client.range_randomizer``):
    every column puts ``rho/K`` on its own bit of row ``j`` and ``(1 - rho)/K`` on the other. Row 0
    of the Sylvester matrix is constant, so every input puts ``rho/K`` on ``(0, +1)``: the floor is
    ``w = rho/K`` there and ``(1 - rho)/K`` on the other ``2K - 1`` outputs, and
    ``gamma = 2 (1 - rho) + (2 rho - 1)/K`` (row 0 is pure blanket: ``1 + (e^eps0 - 1)/(2K)`` times
    the blanket that ignores it). ``A_x = e^eps0`` on ``x``'s own outputs off row 0, 1 elsewhere.
    Two distinct columns agree on ``K/2`` rows, row 0 among them: on the ``K/2 - 1`` others the
    pair's outputs are ``(e^eps0, e^eps0)`` and ``(1, 1)``; on the ``K/2`` rows where they differ,
    ``(e^eps0, 1)`` and ``(1, e^eps0)``; row 0 gives ``(1, 1)``. The weights depend only on ``K``,
    so every pair has this law (``tests/protocol/accounting/test_blanket_mechanisms.py`` rebuilds it from
    the randomizer matrix for every pair, K <= 16).
    """
    K = int(K)
    if K < 2 or K & (K - 1):
        raise InvalidParameter("K", f"must be a power of two >= 2, got {K!r}")
    E = math.exp(epsilon0)
    r = 1.0 / (E + 1.0)  # 1 - rho
    w_agree = (K / 2 - 1) * r / K  # per kind, agreeing rows other than row 0
    w_differ = (K / 2) * r / K
    w = np.array([w_agree, w_agree + 1.0 / K, w_differ, w_differ])
    a1 = np.array([E, 1.0, E, 1.0])
    a2 = np.array([E, 1.0, 1.0, E])
    gamma = float(w.sum())
    keep = w > 0
    return BlanketLaw(a1[keep], a2[keep], w[keep] / gamma, min(1.0, gamma), f"hadamard-response(K={K})")


def block_hadamard_laws(epsilon0: float, blocks: int, rows_per_block: int) -> tuple[BlanketLaw, ...]:
    """Blanket laws of block Hadamard response, one per type of input pair present.

    ``K = B b`` outputs; every symbol puts ``p_out = 2/(b D)`` on every output and ``e^eps0 p_out``
    on its set ``C_x`` of ``s = b/2`` outputs (``D = e^eps0 - 1 + 2B``, ideal ``t``; the client's
    rounded-down ``t`` is a post-processing of it, ``guarantees.block_hadamard_pair_types``). So
    ``w = p_out`` everywhere (a floor of every input's distribution; where the true floor is larger,
    as on the overlap of a block holding only two symbols, the bound is valid and a little loose),
    ``gamma = K p_out = 2B/D``, ``omega`` uniform and
    ``A_x = 1 + (e^eps0 - 1) 1[y in C_x]``. With ``s/K = 1/(2B)``:

    * ``different-blocks`` (``B >= 2``, disjoint sets): ``(e^eps0, 1)`` and ``(1, e^eps0)`` with
      ``1/(2B)`` each, ``(1, 1)`` on the rest;
    * ``same-block`` (two rows in a block, ``|C_x0 n C_x1| = s/2``): ``(e^eps0, e^eps0)``,
      ``(e^eps0, 1)`` and ``(1, e^eps0)`` with ``1/(4B)`` each, ``(1, 1)`` on the rest.

    Every input pair is of one of the two types, so the round's ``delta(eps)`` is at most the
    larger of the two laws' bounds (the tests rebuild both from the matrix for every pair).
    """
    E = math.exp(epsilon0)
    B, rows = int(blocks), int(rows_per_block)
    gamma = 2.0 * B / (E - 1.0 + 2.0 * B)
    laws = []
    if B >= 2:
        f = 1.0 / (2.0 * B)
        laws.append(BlanketLaw(np.array([E, 1.0, 1.0]), np.array([1.0, E, 1.0]),
                               np.array([f, f, 1.0 - 2.0 * f]), gamma, "block-hadamard/different-blocks"))
    if rows >= 2:
        f = 1.0 / (4.0 * B)
        laws.append(BlanketLaw(np.array([E, E, 1.0, 1.0]), np.array([E, 1.0, E, 1.0]),
                               np.array([f, f, f, 1.0 - 3.0 * f]), gamma, "block-hadamard/same-block"))
    return tuple(laws)


def law_from_matrix(R: np.ndarray, x1: int, x2: int) -> BlanketLaw:
    """Blanket law of the pair ``(x1, x2)`` of a finite randomizer matrix ``R[x, y]`` (tests, small cases)."""
    R = np.asarray(R, dtype=np.float64)
    w = R.min(axis=0)
    keep = w > 0
    gamma = float(w.sum())
    return BlanketLaw(R[x1, keep] / w[keep], R[x2, keep] / w[keep], w[keep] / gamma, gamma, "matrix")


# ----------------------------------------------------------------------------- numerics
def _lattice(law: BlanketLaw, eps: float, resolution: int) -> tuple[np.ndarray, np.ndarray, float, float] | None:
    """Lattice pmf of one term ``B l`` on its support: the masses ``p``, their lattice indices ``k``
    (increasing; value ``k h``), ``h``, and a bound on the relative error of each entry; ``None``
    when ``l <= 0`` everywhere (delta = 0). Only the occupied points are stored: with a huge
    negative atom (large eps0) the lattice spans many points of which a few carry mass."""
    E = math.exp(eps)
    x = law.a1 - E * law.a2
    top = float(np.max(np.abs(law.a1)) + E * np.max(np.abs(law.a2)))
    x = x + 16 * _U * top  # covers the error of a1 - E a2 (each <= few u relative)
    if float(x.max()) <= 0.0:
        return None
    g = law.gamma
    pw = g * law.weight
    mean = float(pw @ x)
    var = max(float(pw @ (x * x)) - mean * mean, 1e-300)
    # The step resolves both the spread of one term and its largest positive value: with a rare
    # positive atom far below the sd (a huge negative atom dominates it: large eps), a step of
    # sd / resolution would round that atom up to a whole step most of the mass.
    # (Not below sd / 64: the lattice of one term stays at most 64 times longer.)
    sd = math.sqrt(var)
    h = min(sd, max(float(x.max()), sd / 64.0)) / resolution
    z = x / h
    fl = np.floor(z)
    frac = z - fl
    # The margin above absorbs the rounding of z = x / h (relative u): E[rounded] >= x.
    idx = np.concatenate([fl, fl + 1.0, [0.0]])
    mass = np.concatenate([pw * (1.0 - frac), pw * frac, [1.0 - g]])
    k, where = np.unique(idx, return_inverse=True)
    p = np.zeros(len(k))
    np.add.at(p, where, mass)
    nz = p > 0
    return p[nz], k[nz], h, 8 * _U


def _tail_sum(theta: float, U: int) -> float:
    """``sum_{t > U} t e^(-theta t)`` in closed form."""
    q = math.exp(-theta)
    return math.exp(-theta * (U + 1)) * ((U + 1) * (1 - q) + q) / (1 - q) ** 2


def _window_tail(pt: np.ndarray, k: np.ndarray, count: int, theta: float, U: int, negligible: float = 0.0) -> float:
    """Bound on ``sum_{t > U} t e^(-theta t) P_theta(T = t)`` for the sum ``T`` of ``count`` draws of ``pt``.

    The smaller of ``sum_{t > U} t e^(-theta t)`` (every probability at most 1; small once
    ``theta U`` is large) and ``P_theta(T > U) / (e theta)`` (from ``t e^(-theta t) <= 1/(e theta)``,
    with the Chernoff bound on ``P_theta(T > U)``; small once ``U`` is many sd above the tilted
    mean 0). The second keeps the window at ``WINDOW_SD`` sd where ``theta`` is small (eps near 0), instead of
    stretching it to ``80/theta`` points. When the first is already at most ``negligible`` (a tiny
    fraction of what it is added to), it is returned without the Chernoff minimisation.
    """
    plain = _tail_sum(theta, U)
    if plain <= negligible:
        return plain
    log_out = _chernoff_log_tail(pt, k, count, U + 1.0)
    return min(plain, math.exp(log_out - 1.0) / theta)


def _even_fast_len(size: int) -> int:
    """Smallest even 5-smooth length >= ``size`` (at least 16): FFTs of such lengths are about as fast
    as powers of two, and up to twice shorter. Even, so that index ``N/2`` is the Nyquist term."""
    N = sp_fft.next_fast_len(max(16, size), real=True)
    while N % 2:
        N = sp_fft.next_fast_len(N + 1, real=True)
    return N


def _sum_window(pt: np.ndarray, k: np.ndarray, count: int, lo: int, hi: int, bulk_lo: int, bulk_hi: int,
                theta: float, rel_p: float) -> tuple[np.ndarray, float] | None:
    """``P(sum of count iid draws of pt = z)`` for ``z`` in ``[lo, hi]`` on a circle (aliasing only adds
    mass) and a bound on each value's floating-point error (module doc, step 3); ``None`` if too large.

    ``pt``: a pmf on the integers ``k`` with relative error at most ``rel_p`` per entry;
    ``[bulk_lo, bulk_hi]`` must hold the sum's bulk, so the circle is laid out around it.
    """
    span_lo, span_hi = min(lo, bulk_lo), max(hi, bulk_hi)
    N = _even_fast_len(int(span_hi - span_lo + 2 + (k.max() - k.min())))
    if N > MAX_FFT:
        return None
    m_support = len(pt)
    arr = np.zeros(N)
    np.add.at(arr, (k.astype(np.int64) % N), pt)
    phi_fft = sp_fft.rfft(arr)  # scipy's pocketfft: ~3x faster here than numpy's at these lengths
    kappa = math.log2(N) * 4 * (_U + 4 * _U / (1 - 4 * _U) * (math.sqrt(2) + 2 * _U))
    e_fft = (kappa + 3 * _U) * math.sqrt(N) * float(np.linalg.norm(pt)) + rel_p
    mag = np.abs(phi_fft) + e_fft
    with np.errstate(divide="ignore"):
        keep = count * np.log(np.minimum(mag, 1.0 + 1e-300)) > -DROP_LOG
    keep[0] = True
    ks = np.nonzero(keep)[0]
    # every dropped frequency has |phi|^count <= e^-DROP_LOG by the test above
    dropped = float(np.count_nonzero(~keep)) * math.exp(-DROP_LOG)
    omega = 2.0 * math.pi * ks.astype(np.float64) / N
    big = float(np.max(np.abs(k)))
    if len(ks) * m_support <= DIRECT_BUDGET:
        # Direct sums at the kept frequencies, phi - 1 without cancellation.
        ang = np.outer(omega, k)
        re_m1 = -2.0 * (np.sin(0.5 * ang) ** 2) @ pt
        im = -(np.sin(ang) @ pt)
        abs2_m1 = 2.0 * re_m1 + re_m1 * re_m1 + im * im  # |phi|^2 - 1
        log_abs = 0.5 * np.log1p(abs2_m1)
        arg = np.arctan2(im, 1.0 + re_m1)
        dphi = 4.0 * (m_support + 8) * _U * (1.0 + omega * big) + 2 * rel_p * (1 + theta * big)
    else:
        # Wide pmfs with many kept frequencies (heavy-tailed terms, large eps0): the FFT's own
        # values, each within e_fft of phi (Higham's 2-norm bound bounds every component).
        # Their relative accuracy near |phi| = 1 is e_fft, which the power's error term below
        # carries (count * dphi), instead of the direct sums' (m + 8) u (1 + omega |k|).
        phi_k = phi_fft[ks]
        log_abs = np.log(np.abs(phi_k))
        arg = np.angle(phi_k)
        dphi = np.full(len(ks), e_fft + 2 * rel_p * (1 + theta * big))
    Yk = np.exp(count * log_abs) * np.exp(1j * count * arg)
    absphi = np.exp(log_abs)
    with np.errstate(over="ignore"):
        err_k = count * dphi * np.exp((count - 1) * np.log1p(np.minimum(absphi + dphi - 1.0, 1e300)))
    err_k += np.abs(Yk) * (4.0 * count * _U * (np.abs(log_abs) + np.abs(arg)) + 16 * _U)
    Y = np.zeros(N // 2 + 1, dtype=np.complex128)
    Y[ks] = Yk
    c = sp_fft.irfft(Y, N)
    weights = np.where((ks == 0) | (ks == N // 2), 1.0, 2.0)  # Hermitian halves
    y_norm = math.sqrt(float(np.sum(weights * np.abs(Yk) ** 2)))
    err_c = (float(weights @ err_k) + 2.0 * dropped) / N + (kappa + 3 * _U) * y_norm / math.sqrt(N)
    return c[np.arange(lo, hi + 1) % N], err_c


def _tilt(p: np.ndarray, k: np.ndarray) -> tuple[float, float, np.ndarray] | None:
    """Saddle point ``theta`` (tilted mean 0), ``log M(theta)`` and the tilted pmf; None without a negative drift."""
    if float(p @ k) >= 0.0:
        return None
    kmax = float(k.max())

    def tilted_mean(th: float) -> float:
        return float((p * np.exp(th * (k - kmax))) @ k)

    hi = 1.0
    while tilted_mean(hi) < 0:
        hi *= 2.0
        if hi > 1e6:
            return None
    theta = optimize.brentq(tilted_mean, 0.0, hi, xtol=1e-12, rtol=1e-10)
    if theta <= 0:
        return None
    logw = np.log(p) + theta * k
    log_m = float(np.logaddexp.reduce(logw))
    return theta, log_m, np.exp(logw - log_m)


def _chernoff_log_tail(pt: np.ndarray, k: np.ndarray, count: int, edge: float) -> float:
    """``log`` of the Chernoff bound ``min_lambda M(lambda)^count e^(-lambda edge)`` on
    ``P(sum of count draws of pt >= edge)`` (``edge`` above the mean; ``-k`` for the left tail).
    Any ``lambda >= 0`` gives a valid bound; the convex exponent is minimised numerically."""
    with np.errstate(divide="ignore"):
        log_pt = np.log(pt)
    kmax = float(np.max(k))
    if edge > count * kmax:
        return -math.inf

    def exponent(lam: float) -> float:
        return count * float(np.logaddexp.reduce(log_pt + lam * k)) - lam * edge

    hi = 1.0 / max(kmax, 1.0)
    while exponent(2 * hi) < exponent(hi) and hi < 1e6:
        hi *= 2.0
    res = optimize.minimize_scalar(exponent, bounds=(0.0, 2 * hi), method="bounded", options={"xatol": 1e-10 * hi})
    return min(0.0, float(exponent(float(res.x))))


#: Above this many users the sum is computed in two stages (blocks of ~sqrt(n), then blocks).
TWO_STAGE_MIN_N = 1 << 18
#: Widest block window (in block sd) the two-stage sum accepts before falling back to one stage.
HEAVY_TAIL_SD = 48.0
#: Largest log of the re-tilting factor ``R0^a`` the coarse lattice of the two-stage sum may carry.
COARSE_INFLATION = 0.02
#: ... unless a finer lattice would make the second stage's circle longer than this.
STAGE2_MAX_LEN = 1 << 18


def blanket_delta(law: BlanketLaw, n: int, eps: float, resolution: int = RESOLUTION,
                  cheap_below: float | None = None) -> float:
    """Certified upper bound on ``(1/n) E[(sum_{i<=n} B_i l(V_i))_+]`` (module doc, steps 1-5).

    ``cheap_below``: if the Chernoff-type bound ``h M(theta)^n / (n e theta)`` (from
    ``t e^(-theta t) <= 1/(e theta)``) is already below it, that (valid, looser) value is returned
    without the FFT; searches use it far above the crossing.
    """
    if eps < 0:
        raise InvalidParameter("eps", f"must be >= 0, got {eps}")
    lat = _lattice(law, eps, resolution)
    if lat is None:
        return 0.0
    p, k, h, rel_p = lat
    tilted = _tilt(p, k)
    if tilted is None:  # no negative drift (eps ~ 0): no useful tilt
        return 1.0
    theta, log_m, pt = tilted
    log_quick = n * log_m + math.log(h) - math.log(n) - 1.0 - math.log(theta) + 4.0 * n * (len(pt) + 4) * _U
    if cheap_below is not None and log_quick <= math.log(cheap_below):
        return math.exp(log_quick)
    if n >= TWO_STAGE_MIN_N:
        two = _two_stage(pt, k, n, theta, log_m, h, rel_p, resolution)
        if two is not None:
            return two
    mu_t = float(pt @ k)
    var_t = float(pt @ (k - mu_t) ** 2)
    sd_T = math.sqrt(n * var_t)
    U = int(math.ceil(WINDOW_SD * sd_T + n * max(mu_t, 0.0))) + 1
    L = int(math.ceil(WINDOW_SD * sd_T + n * max(-mu_t, 0.0)))
    got = _sum_window(pt, k, n, 1, U, -L, U, theta, rel_p)
    if got is None:
        return 1.0
    vals, err_c = got
    t = np.arange(1, U + 1, dtype=np.float64)
    body = float(np.sum(t * np.exp(-theta * t) * (np.maximum(vals, 0.0) + err_c)))
    total = body + _window_tail(pt, k, n, theta, U, negligible=1e-13 * body)
    log_delta = n * log_m + math.log(h) - math.log(n) + math.log(total)
    log_delta += 4.0 * n * (len(pt) + 4) * _U  # error of log M, n times
    return math.exp(min(log_delta, 0.0))


def _coarsen(q: np.ndarray, z: np.ndarray, kc: int, theta: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Round each value ``z`` randomly and mean-preservingly to the multiples of ``kc`` (untilted measure),
    re-tilt by ``e^(theta kc J)``: the normalised coarse pmf, its support ``J`` and its total ``R0``."""
    J0 = np.floor(z / kc)
    w_hi = (z - kc * J0) / kc
    J = np.concatenate([J0, J0 + 1])
    weight = np.concatenate([q * (1.0 - w_hi) * np.exp(theta * (kc * J0 - z)),
                             q * w_hi * np.exp(theta * (kc * (J0 + 1) - z))])
    Jmin = int(J.min())
    r = np.zeros(int(J.max()) - Jmin + 1)
    np.add.at(r, (J - Jmin).astype(np.int64), weight)
    r *= 1.0 + 1e-12  # covers the rounding of the sums above (relative, a few u)
    kv = np.arange(Jmin, Jmin + len(r), dtype=np.float64)
    nz = r > 0
    r, kv = r[nz], kv[nz]
    R0 = float(r.sum())
    return r / R0, kv, R0


def _two_stage(pt: np.ndarray, k: np.ndarray, n: int, theta: float, log_m: float, h: float, rel_p: float,
               resolution: int) -> float | None:
    """Step 5 of the module doc: blocks of ``n1 ~ sqrt(n)`` terms, rounded to a coarser lattice.

    The bound is computed for ``n' = a n1 <= n`` users (valid at ``n``: a larger batch is a
    post-processing of a smaller one). Each block's tilted pmf is computed on a window
    ``[-L1, U1]`` (upper envelope: values plus their error bound); events where a block leaves
    its window contribute at most ``a P_theta(out) / (e theta)`` to ``E_theta[T_+ e^(-theta T)]``
    (``t e^(-theta t) <= 1/(e theta)``), with ``P_theta(out)`` bounded by Chernoff. Inside, each
    block value ``z`` is rounded *randomly* and mean-preservingly to the multiples of ``kc``
    (in the untilted measure: convex order again, per block), then re-tilted, which multiplies
    its weight by ``e^(theta (kc J - z))``; the ``a``-fold sum of the rounded blocks is the
    single-stage computation on the coarse lattice. ``None`` when the blocks are heavy-tailed
    (their window would exceed 48 sd: large eps0), where the single stage is cheaper.
    """
    n1 = max(2, math.isqrt(n))
    a = n // n1
    n_eff = a * n1
    mu_t = float(pt @ k)
    var_t = float(pt @ (k - mu_t) ** 2)
    s1 = math.sqrt(n1 * var_t)
    # block window: wide enough that a block leaves it with tilted probability below e^-60 / a
    half = int(math.ceil(16.0 * s1 + n1 * abs(mu_t))) + 1
    while True:
        log_out = float(np.logaddexp(_chernoff_log_tail(pt, k, n1, half + 1.0),
                                     _chernoff_log_tail(pt, -k, n1, half + 1.0)))
        if log_out < -60.0 - math.log(a):
            break
        half = int(half * 1.5)
        if half > HEAVY_TAIL_SD * s1 + n1 * abs(mu_t):  # heavy-tailed terms (large eps0): one stage is cheaper
            return None
    got = _sum_window(pt, k, n1, -half, half, -half, half, theta, rel_p)
    if got is None:
        return 1.0
    vals, err1 = got
    q1 = np.maximum(vals, 0.0) + err1  # upper envelope of the tilted block pmf on [-half, half]
    # coarse lattice: step kc fine units, ~resolution points per block sd; halved while the re-tilting
    # (Jensen) factor R0^a of the bound exceeds e^COARSE_INFLATION (the cost of the spread under the
    # tilt), but not below the step at which the second stage's circle would exceed STAGE2_MAX_LEN
    # points (heavy tails, large eps0: the halving went down to kc = 1 and a 2e6-point circle). Any
    # step is a spread, so a valid bound; R0^a is mostly given back by the shifted body (measured:
    # eps0 = 8, n = 1e8, eps moves by 4e-4 relative, 10x faster).
    kc = max(1, int(s1 // resolution))
    z = np.arange(-half, half + 1, dtype=np.float64)
    stage2_len = 2.0 * WINDOW_SD * math.sqrt(a) * s1 + 2.0 * half + a * abs(mu_t) * n1
    while True:
        rhat, kv, R0 = _coarsen(q1, z, kc, theta)
        if a * math.log(R0) <= COARSE_INFLATION or kc == 1 or stage2_len / (kc // 2) > STAGE2_MAX_LEN:
            break
        kc = max(1, kc // 2)
    th2 = theta * kc
    mu2 = float(rhat @ kv)
    sd2 = math.sqrt(a * max(float(rhat @ (kv - mu2) ** 2), 1e-300))
    U2 = int(math.ceil(WINDOW_SD * sd2 + a * max(mu2, 0.0))) + 1
    L2 = int(math.ceil(WINDOW_SD * sd2 + a * max(-mu2, 0.0)))
    got2 = _sum_window(rhat, kv, a, 1, U2, -L2, U2, th2, 8 * _U)
    if got2 is None:
        return 1.0
    vals2, err2 = got2
    t = np.arange(1, U2 + 1, dtype=np.float64)
    body = kc * float(np.sum(t * np.exp(-th2 * t) * (np.maximum(vals2, 0.0) + err2))) + kc * _window_tail(rhat, kv, a, th2, U2)
    # log of: h M^n' [R0^a body + a P(out) / (e theta)] / n'
    log_main = a * math.log(R0) + math.log(body)
    log_out_term = math.log(a) + float(log_out) - 1.0 - math.log(theta)
    log_delta = n_eff * log_m + math.log(h) - math.log(n_eff) + float(np.logaddexp(log_main, log_out_term))
    log_delta += 4.0 * n_eff * (len(pt) + 4) * _U  # error of log M, n' times
    return math.exp(min(log_delta, 0.0))


#: Single-stage answers at ``TWO_STAGE_MIN_N - 1``, per (law, delta, eps0, rtol).
_BELOW_SWITCH: dict[tuple, float] = {}


def blanket_epsilon(law: BlanketLaw, n: int, delta: float, epsilon0: float, rtol: float = 1e-4) -> float:
    """Smallest eps (to ``rtol``) at which :func:`blanket_delta` ``<= delta``, checked at the returned value.

    Brent's method on ``log delta(eps)`` (smooth; ~6-9 evaluations) finds the crossing; the
    returned value is the first point at or above it where the certified bound was checked.

    Just above :data:`TWO_STAGE_MIN_N` the two-stage sum costs more (0.05-0.25 % in eps) than the
    batch-size increase gains, so the answer there is also capped by the single-stage answer at
    ``TWO_STAGE_MIN_N - 1``, valid for every larger batch (post-processing): the reported eps
    does not jump up at the switch. From ``2 TWO_STAGE_MIN_N`` on, eps has fallen by ~29 %.
    """
    e = _blanket_epsilon_search(law, n, delta, epsilon0, rtol)
    if TWO_STAGE_MIN_N <= n < 2 * TWO_STAGE_MIN_N:
        key = (law.name, law.gamma, law.a1.tobytes(), law.a2.tobytes(), law.weight.tobytes(), float(delta),
               float(epsilon0), float(rtol), TWO_STAGE_MIN_N)
        if key not in _BELOW_SWITCH:
            _BELOW_SWITCH[key] = _blanket_epsilon_search(law, TWO_STAGE_MIN_N - 1, delta, epsilon0, rtol)
        e = min(e, _BELOW_SWITCH[key])
    return e


def _blanket_epsilon_search(law: BlanketLaw, n: int, delta: float, epsilon0: float, rtol: float) -> float:
    """:func:`blanket_epsilon` at exactly ``n`` (no cap at the two-stage switch)."""
    if not 0 < delta < 1:
        raise InvalidParameter("delta", f"must be in (0, 1), got {delta!r}")
    e0 = float(epsilon0)
    memo: dict[float, float] = {}

    def bound(e: float) -> float:
        if e not in memo:
            memo[e] = blanket_delta(law, n, e, cheap_below=1e-3 * delta)
        return memo[e]

    if bound(e0) > delta:
        return e0
    hi = e0
    lo = e0 / 2.0
    while bound(lo) <= delta:  # evaluations above the crossing are the cheap ones
        if lo < 1e-6 * e0:
            return lo
        hi, lo = lo, lo / 2.0
    log_target = math.log(delta)

    def f(e: float) -> float:
        d = bound(e)
        return (math.log(d) if d > 0 else -800.0) - log_target

    root = optimize.brentq(f, lo, hi, xtol=0.25 * rtol * lo, rtol=0.25 * rtol)
    e = min(hi, root * (1.0 + 0.5 * rtol))
    while bound(e) > delta:
        e = min(hi, e * (1.0 + rtol))
    return e
