"""Gaussian-limit diagnostics: how far the optimal decomposition bound can be from the truth.

Nothing here is a privacy claim. These functions *predict*, for large ``n``, the ratio between
the blanket bound (the optimal decomposition bound, Su, Cheng & Wang 2025, arXiv 2504.07414) and
the exact shuffled epsilon of the worst dataset, so that a tightness table can say which part of
a gap is the method's and which part is numerical slack.

**The worst dataset in the Gaussian limit.** Fix the pair ``(x0, x1)`` of user 1 and the other
users' inputs, in proportions ``w_c`` over the inputs ``c``. The histogram of the ``n`` reports is
a sum of independent one-hot vectors, so for large ``n`` it is close to a Gaussian whose mean
moves by ``d = R(x0) - R(x1)`` between the two hypotheses and whose covariance is ``n S(w)``,
``S(w) = sum_c w_c (diag Q_c - Q_c Q_c^T)`` with ``Q_c = R(c)`` (the covariance of a *fixed*
composition, not of the mixture ``sum_c w_c Q_c``). The two hypotheses are then
``mu``-Gaussian-DP (Dong, Roth & Su 2019, "Gaussian differential privacy") with

    mu^2 = F(w) / n,     F(w) = d^T S(w)^+ d = sup_v (2 d.v - v^T S(w) v).

``F`` is a supremum of affine functions of ``w``, hence convex, so its maximum over compositions
is at a vertex: every other user at one input ``c``, where ``F = sum_y d(y)^2 / Q_c(y)`` (``d`` sums
to 0). So in this limit the worst dataset is homogeneous, with the largest chi-square distance
:func:`homogeneous_fisher` finds.

**The blanket in the same limit.** The blanket bound's sum ``(1/n) E[(sum_i B_i l(V_i))_+]``
(:mod:`.blanket`) is Gaussian-DP with ``F_blanket = sum_y d(y)^2 / w(y)``, ``w = min_x R(x)`` the
floor: the chi-square of ``d`` against the floor instead of against one input's distribution.
Since ``w <= Q_c`` everywhere, ``F_blanket >= F(w)``; the two are equal exactly when the worst
input's distribution coincides with the floor wherever ``d != 0`` (k-RR, block Hadamard response),
and differ by a factor ``2 rho`` for one-bit Hadamard response (its others keep their own bit with
``rho`` where the floor keeps ``1 - rho``) and by 1.24-1.95 for the Laplace report at eps0 = 0.5-4.

:func:`predicted_ratio` turns the two constants into the ratio of the two Gaussian-DP epsilons at
``(n, delta)``: a prediction (no error bound), which the measured tightness ratios follow to
about 1 % (``benchmarks/tightness_mechanisms.py``).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

from shuffledp.protocol.accounting.blanket import laplace_report_law
from shuffledp.protocol.errors import InvalidParameter


def fixed_composition_fisher(R: np.ndarray, weights: np.ndarray, x0: int, x1: int) -> float:
    """``F(w) = d^T S(w)^+ d`` for a finite randomizer matrix ``R[x, y]`` and a composition ``w``
    of the other users' inputs (module doc). Every output any ``Q_c`` with ``w_c > 0`` reaches
    must carry ``d`` in the span of ``S(w)``; outputs no other user reaches while ``d != 0`` there
    make the hypotheses perfectly distinguishable in the limit (``inf``)."""
    R = np.asarray(R, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (R.shape[0],) or np.any(w < 0) or not math.isclose(float(w.sum()), 1.0, rel_tol=1e-9):
        raise InvalidParameter("weights", "must be a probability vector over the inputs")
    d = R[x0] - R[x1]
    pbar = w @ R
    if np.any((pbar <= 0) & (d != 0)):
        return math.inf
    keep = pbar > 0
    # scaled by diag(pbar)^(-1/2): S' = I - sum_c w_c q_c q_c^T has its eigenvalues in [0, 1] (the
    # null vector is sqrt(pbar), orthogonal to the scaled d), whatever the outputs' probabilities
    root = np.sqrt(pbar[keep])
    q = R[:, keep] / root
    S = np.eye(len(root)) - (q.T * w) @ q
    ds = d[keep] / root
    return float(ds @ np.linalg.pinv(S, rcond=1e-12, hermitian=True) @ ds)


def homogeneous_fisher(R: np.ndarray, x0: int, x1: int) -> tuple[float, int]:
    """The largest ``sum_y d(y)^2 / R(c)(y)`` over inputs ``c`` (every other user at ``c``), and that ``c``."""
    R = np.asarray(R, dtype=np.float64)
    d2 = (R[x0] - R[x1]) ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        per_input = np.where(d2[None, :] > 0, d2[None, :] / R, 0.0).sum(axis=1)
    c = int(np.argmax(per_input))
    return float(per_input[c]), c


def blanket_fisher_from_matrix(R: np.ndarray, x0: int, x1: int) -> float:
    """``sum_y d(y)^2 / w(y)`` with ``w = min_x R(x)`` (module doc)."""
    R = np.asarray(R, dtype=np.float64)
    d2 = (R[x0] - R[x1]) ** 2
    w = R.min(axis=0)
    if np.any((w <= 0) & (d2 > 0)):
        return math.inf
    return float(np.sum(np.where(d2 > 0, d2 / np.where(w > 0, w, 1.0), 0.0)))


def blanket_fisher(law) -> float:
    """``F_blanket`` of a :class:`.blanket.BlanketLaw`: ``d = w (A1 - A2)``, so ``d^2 / w = w (A1 - A2)^2``."""
    return float(law.gamma * np.sum(law.weight * (law.a1 - law.a2) ** 2))


def hadamard_homogeneous_fisher(epsilon0: float) -> float:
    """One-bit Hadamard response, every other user at one column: ``(2 rho - 1)^2 / (2 rho (1 - rho))``
    for every column (the pair differs on half the rows; on each such row any column puts ``rho/K``
    on one bit and ``(1 - rho)/K`` on the other), ``K``-free."""
    rho = 1.0 / (1.0 + math.exp(-epsilon0))
    return (2 * rho - 1) ** 2 / (2 * rho * (1 - rho))


def laplace_fishers(epsilon0: float, grid_levels: int) -> tuple[float, float, int]:
    """The projected discrete-Laplace report, pair ``(0, G)``: ``(F_blanket, F_worst, c_worst)``,
    the worst over every grid input ``c`` of the others (module doc), tails summed in closed form.

    With ``P(N = k) = C r^|k|``: on ``y <= 0``, ``d^2 / R(c) = C (1 - r^G)^2 r^(-y - c)``, summing to
    ``C (1 - r^G)^2 r^-c / (1 - r)``; on ``y >= G`` the mirror image, ``C (1 - r^G)^2 r^(c - G) / (1 - r)``;
    the ``G - 1`` points between are summed directly. ``F_blanket`` is :func:`blanket_fisher` of the
    accountant's own law (``blanket.laplace_report_law``)."""
    G = int(grid_levels)
    if G < 1 or not (math.isfinite(epsilon0) and epsilon0 > 0):
        raise InvalidParameter("laplace", f"needs G >= 1 and eps0 > 0, got G = {grid_levels!r}, eps0 = {epsilon0!r}")
    log_r = -epsilon0 / G
    C = -math.expm1(log_r) / (1.0 + math.exp(log_r))
    gap2 = math.expm1(-epsilon0) ** 2  # (1 - r^G)^2
    tail = C * gap2 / -math.expm1(log_r)
    y = np.arange(1, G, dtype=np.float64)
    d2 = (C * (np.exp(y * log_r) - np.exp((G - y) * log_r))) ** 2
    f_blanket = blanket_fisher(laplace_report_law(epsilon0, G))

    best, best_c = -math.inf, 0
    cs = np.arange(0, G + 1, dtype=np.float64)
    for start in range(0, G + 1, 256):  # chunks: a (256, G - 1) array at a time
        c = cs[start:start + 256, None]
        mid = np.sum(d2[None, :] / (C * np.exp(np.abs(y[None, :] - c) * log_r)), axis=1)
        tails = tail * (np.exp(-c[:, 0] * log_r) + np.exp((c[:, 0] - G) * log_r))
        total = mid + tails
        i = int(np.argmax(total))
        if total[i] > best:
            best, best_c = float(total[i]), int(cs[start + i])
    return f_blanket, best, best_c


def gdp_epsilon(mu: float, delta: float) -> float:
    """Smallest ``eps`` with ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) <= delta``: the
    ``(eps, delta)`` of ``mu``-Gaussian DP (Dong, Roth & Su 2019, Cor. 2.13)."""
    if not (mu > 0 and 0 < delta < 1):
        raise InvalidParameter("gdp", f"needs mu > 0 and delta in (0, 1), got {mu!r}, {delta!r}")

    def excess(e: float) -> float:
        return (special.ndtr(-e / mu + mu / 2) - math.exp(e) * special.ndtr(-e / mu - mu / 2)) - delta

    if excess(0.0) <= 0:
        return 0.0
    hi = mu
    while excess(hi) > 0:
        hi *= 2.0
    return float(optimize.brentq(excess, 0.0, hi, xtol=1e-15, rtol=1e-12))


def predicted_ratio(f_blanket: float, f_worst: float, n: int, delta: float) -> float:
    """Predicted (blanket eps) / (worst dataset's eps) at ``(n, delta)`` (module doc)."""
    return gdp_epsilon(math.sqrt(f_blanket / n), delta) / gdp_epsilon(math.sqrt(f_worst / n), delta)
