"""Winsorized mean: private range, then a clipped (winsorized) mean with Laplace noise.

Levy, Sun, Amin, Kale, Kulesza, Mohri & Suresh, "Learning with User-Level Privacy",
NeurIPS 2021 (paper 002 in /work/shared/papers):

* :func:`private_range` -- Algorithm 6 (PrivateRange, Appendix D.1), the exponential
  mechanism over bin midpoints with the approximate-median cost;
* :func:`winsorized_mean_1d` -- Algorithm 1 (WinsorizedMean1D), Theorem 1;
* :func:`winsorized_mean` -- Algorithm 2 (WinsorizedMeanHighD), Theorem 2: a public random
  rotation, Algorithm 1 on every rotated coordinate, rotate back.

A trusted curator runs these on the users' raw data. User level: user i enters only
through the mean of its m samples (Corollary 1 / Appendix D.4), so replacing all of one
user's data changes one row; every count below moves by at most 1 and every clipped
mean by at most (range width)/n under such a replacement.

Corrections to the paper (derived, and checked in tests/central/test_central.py):

* Alg. 2 line 3 passes ``\\sqrt{dB}`` as the range of a rotated coordinate. The bound is
  ``sqrt(d) * B``: ``|(U x)_j| <= ||U x||_2 = ||x||_2 <= sqrt(d) B`` for ``x in [-B, B]^d``.
  With sqrt(d B) the range would cut off data whenever B > 1.
* The proof of Thm. 2 (App. D.3) writes ``tau' = 10 tau sqrt(log(nd/alpha)) / d``; Alg. 2
  line 3 and Lemma 2 give ``10 tau sqrt(log(dn/gamma) / d)``, i.e. a 1/sqrt(d), not 1/d.
  We use the sharper Hoeffding form of Lemma 2 from
  :func:`shuffledp.protocol.mechanisms.rotation.linf_radius`:
  ``tau' = tau sqrt(2 log(2 n D / gamma) / D)`` (it implies the paper's constant 10).
* Alg. 6 line 2 writes ``X'_i = min_{x in T} |X_i - x|`` (a distance); it means the
  argmin, the bin midpoint nearest to X_i. Footnote 9's last bin has length
  ``2B - (l - 1) 2 tau``, not ``2B - (t - 1) tau``.
* Alg. 2's per-coordinate epsilon ``epsilon / sqrt(8 d log(1/delta))`` is valid by
  advanced composition only when ``epsilon <= 2 log(1/delta)`` (not stated); see
  :func:`shuffledp.central.privacy.per_coordinate_pure_epsilon`, which also offers the
  (usually larger) zCDP route.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shuffledp.central._data import check_rng, positive, probability, public_seed, user_means
from shuffledp.central.privacy import ApproxDP, ZCDP, check_privacy, per_coordinate_pure_epsilon
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.rotation import RandomRotation, linf_radius

__all__ = [
    "WinsorizedResult",
    "private_range",
    "winsorized_mean_1d",
    "winsorized_mean",
    "gaussian_concentration_radius",
]

# Upper limit on bins per coordinate (memory guard: bins x coordinates floats).
MAX_BINS = 1 << 22


@dataclass(frozen=True)
class WinsorizedResult:
    """Output of :func:`winsorized_mean`.

    ``estimate`` is the private mean (d,). Diagnostics (all private outputs or public
    parameters): ``epsilon0`` per rotated coordinate, ``coordinate_radius`` (tau'),
    ``centers`` the private range midpoints in rotated coordinates (D,), ``laplace_scale``
    per rotated coordinate, and ``rotation_seed``.
    """

    estimate: np.ndarray
    epsilon0: float
    coordinate_radius: float
    centers: np.ndarray
    laplace_scale: float
    rotation_seed: int

    @property
    def noise_variance_per_coordinate(self) -> float:
        """Variance of the Laplace noise on each coordinate (rotated or, by orthogonality, original)."""
        return 2.0 * self.laplace_scale**2


def gaussian_concentration_radius(sigma: float, d: int, m: int, n: int, gamma: float) -> float:
    """l2 radius tau with ``max_i ||Y_i - mu|| <= tau`` w.p. >= 1 - gamma, Y_i the mean of m N(mu, sigma^2 I_d).

    ``||Y_i - mu|| = (sigma/sqrt(m)) ||Z||`` with Z ~ N(0, I_d); the norm is 1-Lipschitz, so
    ``P(||Z|| >= E||Z|| + t) <= exp(-t^2/2)`` and ``E||Z|| <= sqrt(d)``; a union bound over
    n users gives ``tau = (sigma/sqrt(m)) (sqrt(d) + sqrt(2 log(n/gamma)))``. (Levy et al.,
    Sec. 2.2, quote ``sigma sqrt(d log(2n/gamma))`` for sub-Gaussian vectors, which fails at d = 1.)
    """
    sigma = positive("sigma", sigma)
    gamma = probability("gamma", gamma)
    for name, v in (("d", d), ("m", m), ("n", n)):
        if not (isinstance(v, int) and v >= 1):
            raise InvalidParameter(name, f"must be an integer >= 1, got {v!r}")
    return sigma / math.sqrt(m) * (math.sqrt(d) + math.sqrt(2.0 * math.log(n / gamma)))


def _range_centers(values: np.ndarray, epsilon: float, tau: float, bound: float, rng: np.random.Generator) -> np.ndarray:
    """Algorithm 6 on every column of ``values`` (n, k) at once; returns the k chosen midpoints.

    Bins ``[-B + 2 tau j, -B + 2 tau (j+1))``, j = 0..l-1 with ``l = ceil(B / tau)``,
    midpoints ``T_j = -B + (2j + 1) tau``. Cost ``c(T_j) = max(#{X'_i < T_j}, #{X'_i > T_j})``
    with X'_i the midpoint of X_i's bin; one user moves each count by <= 1, so the cost has
    sensitivity 1 and sampling ``P(T_j) ∝ exp(-epsilon c(T_j) / 2)`` is epsilon-DP
    (McSherry & Talwar 2007). Sampled exactly by the Gumbel-max trick.
    """
    n, k = values.shape
    bins = math.ceil(bound / tau)
    if bins * k > MAX_BINS:
        raise InvalidParameter("bound", f"bound/tau = {bound / tau:.3g} bins per coordinate is too many; raise tau or lower bound")
    idx = np.clip(np.floor((values + bound) / (2.0 * tau)).astype(np.int64), 0, bins - 1)
    idx += np.arange(k, dtype=np.int64) * bins  # column j's bins at offset j * bins
    counts = np.bincount(idx.ravel(), minlength=k * bins).reshape(k, bins)
    below = np.cumsum(counts, axis=1) - counts  # #{X'_i < T_j}
    above = n - below - counts  # #{X'_i > T_j}
    cost = np.maximum(below, above)
    scores = -0.5 * epsilon * cost + rng.gumbel(size=cost.shape)
    choice = np.argmax(scores, axis=1)
    return -bound + (2.0 * choice + 1.0) * tau


def private_range(values: object, epsilon: float, tau: float, bound: float, rng: np.random.Generator) -> tuple[float, float]:
    """Algorithm 6 (PrivateRange): an epsilon-DP interval ``[mu_hat - 2 tau, mu_hat + 2 tau]``.

    ``values`` are n scalars in [-B, B] (clamped to it). If the data are (tau, gamma)-concentrated,
    the interval contains all of them w.p. >= 1 - gamma - (B/tau) exp(-n epsilon / 8) (Thm. 1's proof).
    """
    x = _scalars(values)
    epsilon, tau, bound = positive("epsilon", epsilon), positive("tau", tau), positive("bound", bound)
    center = float(_range_centers(np.clip(x, -bound, bound)[:, None], epsilon, tau, bound, check_rng(rng))[0])
    return center - 2.0 * tau, center + 2.0 * tau


def _scalars(values: object) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size < 2:
        raise InvalidParameter("values", f"must be a 1-D array of at least 2 values, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise InvalidParameter("values", "contains NaN or infinite values")
    return x


def _winsorized_columns(values: np.ndarray, epsilon: float, tau: float, bound: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, float]:
    """Algorithm 1 on every column: (estimates, range centers, Laplace scale)."""
    n = values.shape[0]
    x = np.clip(values, -bound, bound)
    centers = _range_centers(x, epsilon / 2.0, tau, bound, rng)  # line 1: PrivateRange at epsilon/2
    clipped = np.clip(x, centers - 2.0 * tau, centers + 2.0 * tau)
    # line 2: width 4 tau, so the clipped mean has sensitivity 4 tau / n; Laplace at epsilon/2
    # gives scale (4 tau / n) / (epsilon / 2) = 8 tau / (epsilon n), as printed.
    scale = 8.0 * tau / (epsilon * n)
    return clipped.mean(axis=0) + rng.laplace(0.0, scale, size=values.shape[1]), centers, scale


def winsorized_mean_1d(values: object, epsilon: float, tau: float, bound: float, rng: np.random.Generator) -> float:
    """Algorithm 1 (WinsorizedMean1D): epsilon-DP mean of n scalars in [-B, B].

    Mechanism: ``[a, b] = PrivateRange(X, epsilon/2, tau, B)`` (width 4 tau), then
    ``mean(clip_[a,b](X_i)) + Lap(8 tau / (epsilon n))``. Guarantee: epsilon-DP (basic
    composition of two epsilon/2-DP steps), at user level when X_i is user i's mean.
    Utility (Thm. 1): if the data are (tau, gamma)-concentrated, the output equals
    ``mean(X) + Lap(8 tau/(n epsilon))`` except with probability
    ``gamma + (B/tau) exp(-n epsilon/8)``.
    """
    x = _scalars(values)
    epsilon, tau, bound = positive("epsilon", epsilon), positive("tau", tau), positive("bound", bound)
    est, _, _ = _winsorized_columns(x[:, None], epsilon, tau, bound, check_rng(rng))
    return float(est[0])


def winsorized_mean(
    data: object,
    privacy: ZCDP | ApproxDP,
    rng: np.random.Generator,
    *,
    bound: float,
    tau: float | None = None,
    coordinate_radius: float | None = None,
    gamma: float = 0.01,
    samples_per_user: int | None = None,
) -> WinsorizedResult:
    """Algorithm 2 (WinsorizedMeanHighD): user-level private mean of d-dimensional data.

    Mechanism: user means Y_i (clamped to the public box [-B, B]^d), a public random
    rotation ``U = H diag(signs) / sqrt(D)`` (D = d padded to a power of two), then
    Algorithm 1 with ``epsilon0`` on each of the D rotated coordinates, with range bound
    ``sqrt(d) B`` and radius ``tau'``; the result is rotated back.

    Privacy (user level): each coordinate is epsilon0-DP, so the D coordinates compose to
    ``privacy`` with epsilon0 from :func:`per_coordinate_pure_epsilon` (zCDP:
    ``D epsilon0^2/2 = rho``; (epsilon, delta): the better of Levy et al.'s advanced
    composition and the zCDP route). The rotation is data-independent public randomness.

    ``tau`` is the l2 concentration radius of the user means (Levy et al. Def. 2), turned
    into the per-coordinate ``tau' = tau sqrt(2 log(2 n D / gamma) / D)`` (Lemma 2, sharp
    form). Alternatively pass ``coordinate_radius`` (tau') directly when a bound on every
    one-dimensional projection is known (e.g. from bounded k-th moments); it affects
    accuracy only, never privacy. Utility (Thm. 2): w.h.p. the output is the empirical mean
    plus independent ``Lap(8 tau' / (epsilon0 n))`` noise on every rotated coordinate.
    Reference: Levy et al. 2021, Algorithm 2, Theorem 2.
    """
    privacy = check_privacy(privacy)
    rng = check_rng(rng)
    bound = positive("bound", bound)
    gamma = probability("gamma", gamma)
    means, _ = user_means(data, samples_per_user)
    n, d = means.shape
    seed = public_seed(rng)
    rotation = RandomRotation(d, seed)
    D = rotation.padded_dim
    if (tau is None) == (coordinate_radius is None):
        raise InvalidParameter("tau, coordinate_radius", "give exactly one of them")
    if coordinate_radius is None:
        tau_prime = linf_radius(positive("tau", tau), n, D, gamma)
    else:
        tau_prime = positive("coordinate_radius", coordinate_radius)
    epsilon0 = per_coordinate_pure_epsilon(privacy, D)
    rotated = rotation.apply(np.clip(means, -bound, bound))
    rot_bound = math.sqrt(d) * bound  # corrected from the printed sqrt(dB); see the module docstring
    est_rot, centers, scale = _winsorized_columns(rotated, epsilon0, tau_prime, rot_bound, rng)
    return WinsorizedResult(rotation.inverse(est_rot), epsilon0, tau_prime, centers, scale, seed)
