"""Huang, Liang & Yi's instance-optimal mean estimator (central model, rho-zCDP).

Huang, Liang & Yi, "Instance-optimal Mean Estimation Under Differential Privacy",
NeurIPS 2021 (paper 003 in /work/shared/papers), Section 3:

* :func:`private_quantile` -- PrivQuant (Sec. 3.2, Thm. 1): binary search whose every
  comparison is a count ``|{x_i <= mid}| + N(0, T / (2 rho))``;
* :func:`clipped_mean` -- the clipped-mean estimator M_C (eq. (2), Lemma 3);
* :func:`instance_optimal_mean` -- the Shifted-Clipped-Mean estimator (Sec. 3.3, Thm. 3):
  random rotation, coordinate-wise private medians c (budget rho/4, rho/(4d) each), shift,
  then Theorem 2's estimator with budget 3 rho/4: a private clipping threshold C as a
  private quantile of the shifted norms (a quarter of it, 3 rho/16) and the clipped mean
  with Gaussian noise (the rest, 9 rho/16). Output ``U^T (y + c)``.

A trusted curator runs this on the users' data; it is user level when x_i is user i's
mean of its m samples (replacing one user changes one x_i). Neighbours: replace one
x_i, n public (the paper's d_ham = 1).

Real-valued data (the paper's Remark 1 quantises to an integer grid [u]): every user mean
is first projected onto the public l2 ball of radius R (the statistical setting's
``x_i <- x_i min(R'/||x_i||, 1)``); PrivQuant then searches a real interval with T
halvings, which is the paper's binary search over a universe of size u = 2^T (its
``log u`` noisy counts of variance ``log u / (2 rho)``).

Correction to the paper (derived; checked in tests/central/test_central.py): Sec. 3.2 sets the
threshold's rank to ``n - sqrt(2d/rho)`` with rho the budget of Theorem 2's whole
estimator, but Lemma 3's error ``E(C) = (1/n) sum (||x_i|| - C)_+ + C sqrt(2d/rho_noise)/n``
is minimised where ``|{i : ||x_i|| > C}| = sqrt(2d / rho_noise)``, rho_noise the budget of
the Gaussian noise (3/4 of Theorem 2's budget, 9 rho/16 of the total). The rank used here
is ``max(n - max(sqrt(2d / rho_noise), tau), 1)``, tau the quantile's rank-error bound.

(epsilon, delta) budgets (:func:`gaussian_composition_rho`): every noisy quantity the
estimator releases is a Gaussian mechanism, so the whole run is exactly
``sqrt(2 rho)``-GDP, and an ``(epsilon, delta)`` budget is spent as the largest rho whose
Gaussian privacy curve meets it (rho = 0.0280 at (1, 1e-6)) rather than through Bun &
Steinke's Prop. 1.3 (rho = 0.0175, 1.6 times less; ``conversion="zcdp"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shuffledp.central._data import check_rng, clip_to_ball, clipped_average, positive, probability, public_seed, user_means
from shuffledp.central.privacy import ApproxDP, ZCDP, check_privacy, rho_for_approx_dp
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.gaussian_calibration import analytic_gaussian_sigma
from shuffledp.protocol.mechanisms.rotation import RandomRotation

__all__ = [
    "BudgetSplit",
    "PAPER_SPLIT",
    "RELEASED_CODE_SPLIT",
    "InstanceOptimalResult",
    "private_quantile",
    "quantile_rank_error",
    "clipping_rank",
    "clipped_mean",
    "gaussian_composition_rho",
    "instance_optimal_mean",
]


@dataclass(frozen=True)
class BudgetSplit:
    """Fractions of rho for the coordinate medians, the clipping threshold and the noise."""

    median: float
    quantile: float
    noise: float

    def __post_init__(self) -> None:
        for name in ("median", "quantile", "noise"):
            positive(f"split.{name}", getattr(self, name))
        total = self.median + self.quantile + self.noise
        if total > 1.0 + 1e-12:
            raise InvalidParameter("split", f"fractions must sum to at most 1, got {total}")


#: Sec. 3.3 + Thm. 2: medians rho/4; Theorem 2 at 3rho/4 gives PrivQuant (3rho/4)/4 and
#: the clipped mean (3rho/4)(3/4).
PAPER_SPLIT = BudgetSplit(0.25, 3.0 / 16.0, 9.0 / 16.0)
#: The split of the implementation the PLAN experiments (Aumüller et al., PETS 2024) ran:
#: medians rho/4, then 1 % / 99 % of the remaining 3rho/4 for the threshold / the noise.
RELEASED_CODE_SPLIT = BudgetSplit(0.25, 0.75 * 0.01, 0.75 * 0.99)

RANK_RULES = ("paper", "released")
CONVERSIONS = ("gaussian", "zcdp")


def gaussian_composition_rho(epsilon: float, delta: float) -> float:
    """Largest rho such that any adaptive composition of Gaussian mechanisms whose zCDP costs
    ``rho_i = Delta_i^2 / (2 sigma_i^2)`` sum to rho is ``(epsilon, delta)``-DP.

    A Gaussian mechanism with l2 sensitivity Delta and noise N(0, sigma^2 I) is
    ``Delta / sigma``-GDP (Dong, Roth & Su, "Gaussian Differential Privacy", JRSS-B 2022,
    Thm. 2.7), i.e. ``sqrt(2 rho_i)``-GDP; an adaptive composition of mu_i-GDP mechanisms is
    ``sqrt(sum mu_i^2)``-GDP (their Cor. 3.3), here ``sqrt(2 rho)``-GDP; and mu-GDP holds
    exactly the (epsilon, delta) pairs of the Gaussian mechanism with ``Delta / sigma = mu``
    (their Cor. 2.13; Balle & Wang 2018, Thm. 8: :func:`analytic_gaussian_sigma`). So the
    composition meets (epsilon, delta) iff ``sqrt(2 rho) <= 1 / sigma*``, sigma* the analytic
    Gaussian sigma for sensitivity 1: ``rho = 1 / (2 sigma*^2)``. This is never below
    :func:`~shuffledp.central.privacy.rho_for_approx_dp` (Bun & Steinke's Prop. 1.3 holds for
    every rho-zCDP mechanism, Gaussian compositions included).
    """
    sigma = analytic_gaussian_sigma(epsilon, delta, 1.0)
    return 0.5 / (sigma * sigma)


@dataclass(frozen=True)
class InstanceOptimalResult:
    """Output of :func:`instance_optimal_mean`.

    ``estimate`` (d,) is the private mean. Diagnostics, all private outputs or public
    parameters: ``shift`` (D,) the private coordinate medians in rotated space,
    ``threshold`` C, ``rank`` the target rank of C, ``noise_sigma`` the Gaussian sd per
    coordinate, ``rho`` the total budget, ``radius`` R and ``rotation_seed``.
    """

    estimate: np.ndarray
    shift: np.ndarray
    threshold: float
    rank: float
    noise_sigma: float
    rho: float
    radius: float
    rotation_seed: int


def private_quantile(
    values: object,
    rank: float,
    lower: float,
    upper: float,
    rho: float,
    steps: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """PrivQuant: rho-zCDP approximate rank-``rank`` element of each column of ``values``.

    ``values`` is (n,) or (n, k); each column is searched independently at budget ``rho``.
    T = ``steps`` halvings of [lower, upper]; at each, ``count = |{x_i <= mid}| +
    N(0, T / (2 rho))`` and the search keeps the half that holds rank ``rank``
    (``count >= rank``: left). One user changes a count by <= 1, so each step is
    ``rho / T``-zCDP (Gaussian mechanism) and the T adaptive steps compose to rho-zCDP
    (Huang et al. Thm. 1, with log u = T). Returns the midpoint of the final interval.
    """
    x = np.asarray(values, dtype=np.float64)
    single = x.ndim == 1
    if single:
        x = x[:, None]
    if x.ndim != 2 or x.shape[0] < 1:
        raise InvalidParameter("values", f"must have shape (n,) or (n, k), got {np.asarray(values).shape}")
    if not (isinstance(steps, int) and 1 <= steps <= 64):
        raise InvalidParameter("steps", f"must be an integer in [1, 64], got {steps!r}")
    rho = positive("rho", rho)
    if not (math.isfinite(lower) and math.isfinite(upper) and lower < upper):
        raise InvalidParameter("lower, upper", f"need finite lower < upper, got [{lower}, {upper}]")
    rng = check_rng(rng)
    sd = math.sqrt(steps / (2.0 * rho))
    k = x.shape[1]
    lo = np.full(k, float(lower))
    hi = np.full(k, float(upper))
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        count = np.count_nonzero(x <= mid, axis=0) + rng.normal(0.0, sd, size=k)
        left = count >= rank
        hi = np.where(left, mid, hi)
        lo = np.where(left, lo, mid)
    out = 0.5 * (lo + hi)
    return out[0:1] if single else out


def quantile_rank_error(rho: float, steps: int, beta: float) -> float:
    """Rank error tau of :func:`private_quantile`, w.p. >= 1 - beta.

    Each of the T noisy counts is off by more than ``s sqrt(2 log(2T/beta))`` (s the noise sd
    ``sqrt(T/(2 rho))``) with probability <= beta / T; when none is, every comparison is
    right up to that many ranks. So ``tau = sqrt(T log(2T/beta) / rho)``, the form of
    Huang et al. Thm. 1 (``sqrt(log u log(log u / beta) / rho)`` up to constants).
    """
    rho, beta = positive("rho", rho), probability("beta", beta)
    return math.sqrt(steps * math.log(2.0 * steps / beta) / rho)


def clipping_rank(n: int, d: int, rho_noise: float, rho_quantile: float, steps: int, *, rule: str = "paper", beta: float = 0.1) -> float:
    """Target rank of the clipping threshold C among the n shifted norms.

    ``"paper"``: ``max(n - max(sqrt(2d / rho_noise), tau), 1)`` -- Sec. 3.2 with the corrected
    rho (module docstring) and tau = :func:`quantile_rank_error`.
    ``"released"``: ``n - 2 sqrt(2d / rho_noise) - 2 sqrt(T / (2 rho_quantile))`` (at least 1),
    the rule of the implementation behind the PLAN (PETS 2024) figures: twice the optimal
    count above C plus two noise sds of PrivQuant.
    """
    if rule not in RANK_RULES:
        raise InvalidParameter("rank_rule", f"must be one of {RANK_RULES}, got {rule!r}")
    optimal_above = math.sqrt(2.0 * d / rho_noise)
    if rule == "paper":
        return max(n - max(optimal_above, quantile_rank_error(rho_quantile, steps, beta)), 1.0)
    return max(n - 2.0 * optimal_above - 2.0 * math.sqrt(steps / (2.0 * rho_quantile)), 1.0)


def clipped_mean(x: np.ndarray, threshold: float, rho: float, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """The clipped-mean estimator M_C (Huang et al. eq. (2), Lemma 3): rho-zCDP.

    ``(1/n) sum_i min(C / ||x_i||, 1) x_i + N(0, 2 C^2 / (rho n^2) I)``. Each clipped vector
    has norm <= C, so replacing one moves the mean by <= 2C/n in l2, and the Gaussian
    mechanism with ``sigma = (2C/n) / sqrt(2 rho)`` is rho-zCDP (Lemma 1). Returns the
    estimate and sigma.
    """
    n = x.shape[0]
    average, _ = clipped_average(x, np.zeros(x.shape[1]), threshold)
    sigma = 2.0 * threshold / (n * math.sqrt(2.0 * rho))
    return average + rng.normal(0.0, sigma, size=x.shape[1]), sigma


def instance_optimal_mean(
    data: object,
    privacy: ZCDP | ApproxDP,
    rng: np.random.Generator,
    *,
    radius: float,
    steps: int = 16,
    split: BudgetSplit = PAPER_SPLIT,
    rank_rule: str = "paper",
    beta: float = 0.1,
    median_range: float | None = None,
    threshold_range: float | None = None,
    samples_per_user: int | None = None,
    conversion: str = "gaussian",
) -> InstanceOptimalResult:
    """Shifted-Clipped-Mean estimator (Huang, Liang & Yi 2021, Sec. 3.3, Theorem 3).

    Mechanism, on the user means x_i projected onto the public ball ``||x|| <= radius``:

    1. rotate: ``x_hat_i = U x_i``, ``U = H diag(signs) / sqrt(D)`` public;
    2. for each of the D rotated coordinates, c_j = PrivQuant(rank n/2) over
       [-radius, radius] at ``split.median * rho / D`` (``|x_hat_ij| <= ||x_i|| <= radius``);
       c is projected onto the same ball (post-processing), so ``||x_hat_i - c|| <= 2 radius``;
    3. C = PrivQuant over [0, 2 radius] of the norms ``||x_hat_i - c||`` at rank
       :func:`clipping_rank` (budget ``split.quantile * rho``);
    4. y = clipped mean of ``x_hat_i - c`` at C with budget ``split.noise * rho``;
    5. return ``U^T (y + c)`` (first d coordinates).

    Privacy: rho-zCDP at user level by composition (Lemma 2) of the D median searches, the
    quantile and the Gaussian noise. With ``ApproxDP``, rho is the largest that implies it:
    ``conversion="gaussian"`` (default) by the exact privacy curve of a composition of
    Gaussian mechanisms (:func:`gaussian_composition_rho`: every release here is one),
    ``"zcdp"`` by Bun & Steinke's Prop. 1.3 for any rho-zCDP mechanism (looser: 1.6 times
    less rho at (1, 1e-6)).
    Utility (Thm. 3): l2 error ``O((sqrt(d/rho) + tau) w(D) / n)`` w.h.p., w(D) the
    instance's width. Defaults follow the paper (``PAPER_SPLIT``, ``rank_rule="paper"``);
    ``steps`` is log2 of the search universe.

    ``median_range`` (default ``radius``) and ``threshold_range`` (default ``2 radius``) set
    the search intervals ``[-median_range, median_range]`` and ``[0, threshold_range]``. They
    change accuracy only, never privacy (every count is over all users; an interval that
    misses the target quantile just returns its end). The defaults are the only ones
    guaranteed to contain every rotated coordinate and every shifted norm; narrower ones
    buy resolution at the same number of steps.
    """
    privacy = check_privacy(privacy)
    rng = check_rng(rng)
    radius = positive("radius", radius)
    beta = probability("beta", beta)
    if not isinstance(split, BudgetSplit):
        raise InvalidParameter("split", f"must be a BudgetSplit, got {split!r}")
    if not (isinstance(steps, int) and 1 <= steps <= 64):
        raise InvalidParameter("steps", f"must be an integer in [1, 64], got {steps!r}")
    if rank_rule not in RANK_RULES:
        raise InvalidParameter("rank_rule", f"must be one of {RANK_RULES}, got {rank_rule!r}")
    if conversion not in CONVERSIONS:
        raise InvalidParameter("conversion", f"must be one of {CONVERSIONS}, got {conversion!r}")
    means, _ = user_means(data, samples_per_user)
    n, d = means.shape
    if isinstance(privacy, ApproxDP):
        convert = gaussian_composition_rho if conversion == "gaussian" else rho_for_approx_dp
        rho = convert(privacy.epsilon, privacy.delta)
    else:
        rho = privacy.as_rho()
    rho_median, rho_quantile, rho_noise = rho * split.median, rho * split.quantile, rho * split.noise

    x, _ = clip_to_ball(means, np.zeros(d), radius)
    seed = public_seed(rng)
    rotation = RandomRotation(d, seed)
    D = rotation.padded_dim
    x_hat = rotation.apply(x)

    half = radius if median_range is None else positive("median_range", median_range)
    top = 2.0 * radius if threshold_range is None else positive("threshold_range", threshold_range)
    shift = private_quantile(x_hat, n / 2.0, -half, half, rho_median / D, steps, rng)
    shift_norm = float(np.linalg.norm(shift))
    if shift_norm > radius:
        shift = shift * (radius / shift_norm)
    centred = x_hat - shift

    norms = np.sqrt(np.einsum("ij,ij->i", centred, centred))
    rank = clipping_rank(n, d, rho_noise, rho_quantile, steps, rule=rank_rule, beta=beta)
    threshold = float(private_quantile(norms, rank, 0.0, top, rho_quantile, steps, rng)[0])

    y, sigma = clipped_mean(centred, threshold, rho_noise, rng)
    return InstanceOptimalResult(rotation.inverse(y + shift), shift, threshold, rank, sigma, rho, radius, seed)
