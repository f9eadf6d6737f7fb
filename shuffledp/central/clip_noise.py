"""Clip-and-noise for heavy-tailed data (bounded k-th moments), person/user level.

Agarwal, Kamath, Majid, Mouzakis, Silver & Ullman, "Private Mean Estimation with
Person-Level Differential Privacy" (paper 001 in /work/shared/papers):

* :func:`clip_and_noise` -- Algorithm 2 (ClipAndNoise), Lemma 4.10: project each user's
  mean onto the ball ``B(u, rho)``, average, add Gaussian noise;
* :func:`clipping_radius` -- the radius ``rho*`` of Algorithm 4 line 2, from n, m, d, k
  and the budget (Lemma 4.11 balances noise against clipping bias);
* :func:`coarse_estimate` -- the coarse estimate (Algorithm 1, RangeEstimator, run on
  every coordinate as in Theorem 4.13): the midpoint of the bucket with the largest
  noisy count of user means;
* :func:`heavy_tailed_mean` -- coarse estimate, then ClipAndNoise around it with rho*:
  Algorithm 4 without its middle stage (Threaded Clip-and-Noise, Alg. 3), whose radii are
  only given up to unspecified polylog factors. Lemma 4.11 needs the centre within
  ``rho*/(2 sqrt(d))`` of the mean; the coarse stage does not guarantee that, so the
  bias can exceed Lemma 4.11's when the coarse centre is poor (benchmarks show by how much).

The distribution assumption (Def. 2.4): ``sigma_k(D) = sup_{||v||=1} E|<X - mu, v>|^k^(1/k)
<= moment_bound``; the paper normalises it to 1, and every radius here scales with it.
A user's mean of m samples has ``sigma_k <= O(moment_bound / sqrt(m))`` (Lemma 2.7).

Corrections and notes (derived; checked in tests/central/test_central.py):

* Alg. 2's noise ``2 rho sqrt(2 ln(4/delta)) / (n eps)`` is the classical Gaussian
  mechanism (Lemma 2.4 prints ln(2/delta); both exceed the ln(1.25/delta) of Dwork & Roth
  Thm A.1), which holds only for eps < 1. The default ``calibration="exact"`` uses the
  analytic Gaussian mechanism (valid for every eps) or, under zCDP, ``(2 rho/n)/sqrt(2 rho_zcdp)``.
* Eq. (4.23) reads ``T1 = O(d sqrt(log 1/delta) / (sqrt(m) eps))``; with rho* = sqrt(d/m)
  the noise norm is ``O(d sqrt(log 1/delta) / (sqrt(m) n eps))`` -- the n is missing.
* Alg. 4 line 6 asks the coarse estimate for accuracy ``r = 16 sqrt(d/m)``, but the proof of
  Thm. 4.12 uses ``||u0 - mu|| <= sqrt(d)/(2 sqrt(m))``, which Thm. 4.13 (accuracy < r)
  does not give. We use Thm. 4.13's smallest admissible bucket, ``16^(1/k) moment_bound /
  sqrt(m)`` per coordinate, the accuracy Thm. 3.2's Markov step actually needs.
* Alg. 4 splits the users into thirds for its three stages and still composes the budgets
  (eps/2 + eps/4 + eps/4). The thirds are disjoint, so by parallel composition each stage
  could use the whole budget; here all users enter both stages and the budget is split
  (sequential composition), which is valid and keeps n users for the final average.
* rho* (line 2) is written with the total eps while line 8 runs at eps/4; the balance it
  encodes is between line 8's own noise and bias, so we evaluate it at the final stage's budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shuffledp.central._data import check_rng, clipped_average, positive, user_means
from shuffledp.central.privacy import ApproxDP, ZCDP, check_privacy, gaussian_sigma
from shuffledp.protocol.errors import InvalidParameter

__all__ = [
    "ClipNoiseResult",
    "CoarseResult",
    "HeavyTailedResult",
    "clip_and_noise",
    "clipping_radius",
    "coarse_bucket_width",
    "coarse_estimate",
    "heavy_tailed_mean",
]

CALIBRATIONS = ("exact", "paper")
MAX_BUCKETS = 1 << 24


@dataclass(frozen=True)
class ClipNoiseResult:
    """``estimate`` (d,), the Gaussian ``sigma`` per coordinate, the ``center`` and ``radius`` used."""

    estimate: np.ndarray
    sigma: float
    center: np.ndarray
    radius: float


@dataclass(frozen=True)
class CoarseResult:
    """``center`` (d,) private; ``width`` the bucket width; ``count_sigma`` the noise sd on each count."""

    center: np.ndarray
    width: float
    count_sigma: float


@dataclass(frozen=True)
class HeavyTailedResult:
    """``estimate`` (d,); the private coarse ``center``, the clipping ``radius`` and noise ``sigma``."""

    estimate: np.ndarray
    center: np.ndarray
    radius: float
    sigma: float


def clip_and_noise(
    data: object,
    privacy: ZCDP | ApproxDP,
    rng: np.random.Generator,
    *,
    center: object,
    radius: float,
    samples_per_user: int | None = None,
    calibration: str = "exact",
) -> ClipNoiseResult:
    """Algorithm 2 (ClipAndNoise): ``(1/n) sum_i clip_{radius, center}(Y_i) + W``.

    Y_i is user i's mean; ``clip`` projects onto the l2 ball of ``radius`` around the public
    (or previously privately computed) ``center``. Replacing one user moves the average
    by at most ``2 radius / n`` in l2, so with ``W ~ N(0, sigma^2 I)``:

    * ``calibration="exact"``: sigma = :func:`gaussian_sigma` of sensitivity 2 radius/n --
      ``privacy`` exactly (zCDP: Bun & Steinke Prop. 1.6; (eps, delta): Balle & Wang's
      analytic Gaussian);
    * ``calibration="paper"``: ``sigma = 2 radius sqrt(2 ln(4/delta)) / (n eps)`` as printed
      (needs ``ApproxDP`` with eps <= 1, where the classical bound holds).

    Guarantee: person-level (= user-level) privacy as given (Lemma 4.10).
    """
    privacy = check_privacy(privacy)
    rng = check_rng(rng)
    radius = positive("radius", radius)
    if calibration not in CALIBRATIONS:
        raise InvalidParameter("calibration", f"must be one of {CALIBRATIONS}, got {calibration!r}")
    means, _ = user_means(data, samples_per_user)
    n, d = means.shape
    c = np.asarray(center, dtype=np.float64)
    if c.shape != (d,) or not np.all(np.isfinite(c)):
        raise InvalidParameter("center", f"must be a finite vector of shape ({d},), got shape {c.shape}")
    sensitivity = 2.0 * radius / n
    if calibration == "exact":
        sigma = gaussian_sigma(sensitivity, privacy)
    else:
        if not isinstance(privacy, ApproxDP) or privacy.epsilon > 1.0:
            raise InvalidParameter("calibration", "'paper' is the classical Gaussian bound: needs ApproxDP with epsilon <= 1")
        sigma = sensitivity * math.sqrt(2.0 * math.log(4.0 / privacy.delta)) / privacy.epsilon
    average, _ = clipped_average(means, c, radius)
    return ClipNoiseResult(average + rng.normal(0.0, sigma, size=d), sigma, c, radius)


def _integer(name: str, value: object, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < low:
        raise InvalidParameter(name, f"must be an integer >= {low}, got {value!r}")
    return int(value)


def clipping_radius(n: int, m: int, d: int, k: float, privacy: ZCDP | ApproxDP, moment_bound: float = 1.0) -> float:
    """``rho*`` of Algorithm 4 line 2, times ``moment_bound``:

    ``rho* = max( sqrt(d/m), (n q)^(1/k) d^(1/2 - 1/k) / m^(1 - 1/k) )``, where
    ``q = eps / sqrt(log(1/delta))`` for (eps, delta) as printed. Derivation (Lemma 4.11): the
    noise norm ``~ rho sqrt(d log(1/delta)) / (n eps)`` balances the clipping bias
    ``(sqrt(d) / (m rho))^(k-1)`` (Thm. 4.2) at ``rho^k = d^(k/2 - 1) n q / m^(k-1)``; q is the
    inverse noise multiplier up to a constant (sigma/Delta ~ sqrt(2 log(1/delta))/eps, so
    q ~ sqrt(2) Delta/sigma). Under rho-zCDP, Delta/sigma = sqrt(2 rho), so the same
    balance uses ``q = 2 sqrt(rho)``.
    """
    n, m, d = _integer("n", n, 2), _integer("m", m), _integer("d", d)
    k = positive("k", k)
    if k <= 1.0:
        raise InvalidParameter("k", f"the moment order must exceed 1, got {k}")
    moment_bound = positive("moment_bound", moment_bound)
    privacy = check_privacy(privacy)
    if isinstance(privacy, ZCDP):
        q = 2.0 * math.sqrt(privacy.rho)
    else:
        q = privacy.epsilon / math.sqrt(math.log(1.0 / privacy.delta))
    balanced = (n * q) ** (1.0 / k) * d ** (0.5 - 1.0 / k) / m ** (1.0 - 1.0 / k)
    return moment_bound * max(math.sqrt(d / m), balanced)


def coarse_bucket_width(k: float, m: int, moment_bound: float = 1.0) -> float:
    """``16^(1/k) moment_bound / sqrt(m)``: Thm. 3.2's smallest admissible bucket (per coordinate).

    Markov on the k-th moment of a user mean: ``P(|Y - mu| > r) <= (sigma_k/(sqrt(m) r))^k``,
    at most 1/16 when ``r >= 16^(1/k) sigma_k / sqrt(m)``.
    """
    k = positive("k", k)
    return 16.0 ** (1.0 / k) * positive("moment_bound", moment_bound) / math.sqrt(_integer("m", m))


def coarse_estimate(
    data: object,
    privacy: ZCDP | ApproxDP,
    rng: np.random.Generator,
    *,
    width: float,
    bound: float,
    samples_per_user: int | None = None,
) -> CoarseResult:
    """Coarse estimate (Algorithm 1 per coordinate, Theorem 4.13): argmax-bucket midpoints.

    For each coordinate j, the user means' j-th entries are counted in buckets of ``width``
    covering ``[-bound - 2 width, bound + 2 width]`` (values beyond fall in the end
    buckets), shifted by a public uniform offset in [0, width) (our addition: it makes the
    midpoint's error uniform instead of fixed by where mu sits on the grid). The d
    histograms get Gaussian noise; the centre is the midpoint of each coordinate's largest
    noisy bucket. Replacing one user moves one unit between two buckets per coordinate:
    l2 sensitivity ``sqrt(2 d)`` of the stacked counts, so the noise sd is
    :func:`gaussian_sigma` of ``sqrt(2 d)`` (the paper's Lemma 2.5 uses Laplace or stability
    histograms per coordinate with advanced composition; this is a valid alternative).
    ``bound`` is the public bound ``|mu_j| <= bound``.
    """
    privacy = check_privacy(privacy)
    rng = check_rng(rng)
    width, bound = positive("width", width), positive("bound", bound)
    means, _ = user_means(data, samples_per_user)
    n, d = means.shape
    offset = rng.uniform(0.0, width)
    start = -bound - 2.0 * width - offset
    buckets = math.ceil((2.0 * bound + 4.0 * width + offset) / width) + 1
    if buckets * d > MAX_BUCKETS:
        raise InvalidParameter("width", f"{buckets} buckets per coordinate x {d} coordinates is too many")
    idx = np.clip(np.floor((means - start) / width).astype(np.int64), 0, buckets - 1)
    idx += np.arange(d, dtype=np.int64) * buckets
    counts = np.bincount(idx.ravel(), minlength=d * buckets).reshape(d, buckets).astype(np.float64)
    sigma = gaussian_sigma(math.sqrt(2.0 * d), privacy)
    noisy = counts + rng.normal(0.0, sigma, size=counts.shape)
    best = np.argmax(noisy, axis=1)
    return CoarseResult(start + (best + 0.5) * width, width, sigma)


def heavy_tailed_mean(
    data: object,
    privacy: ZCDP | ApproxDP,
    rng: np.random.Generator,
    *,
    k: float,
    bound: float,
    moment_bound: float = 1.0,
    coarse_fraction: float = 0.25,
    radius: float | None = None,
    samples_per_user: int | None = None,
) -> HeavyTailedResult:
    """Coarse estimate + ClipAndNoise (Agarwal et al., Alg. 4 with Alg. 1/Thm. 4.13 and Alg. 2).

    1. ``u = coarse_estimate`` with bucket :func:`coarse_bucket_width` at ``coarse_fraction``
       of the budget;
    2. ``clip_and_noise`` around u with radius :func:`clipping_radius` (rho*, evaluated at
       the remaining budget) unless ``radius`` is given.

    Privacy: user level, ``privacy`` by composition (zCDP: rho shares add; (eps, delta):
    both eps and delta are split, basic composition). Utility: Lemma 4.11's
    ``||mu_hat - mu|| <= alpha`` once n >= n0 requires the centre within rho*/(2 sqrt d) (see
    the module docstring). ``k`` is the moment order (the paper needs k > 2 for Thm. 4.12;
    any k > 1 is accepted), ``moment_bound`` >= sigma_k of one sample.
    """
    privacy = check_privacy(privacy)
    rng = check_rng(rng)
    frac = positive("coarse_fraction", coarse_fraction)
    if not frac < 1.0:
        raise InvalidParameter("coarse_fraction", f"must lie in (0, 1), got {coarse_fraction!r}")
    k = positive("k", k)
    if k <= 1.0:
        raise InvalidParameter("k", f"the moment order must exceed 1, got {k}")
    means, m = user_means(data, samples_per_user)
    n, d = means.shape
    coarse_privacy, final_privacy = privacy.scaled(frac), privacy.scaled(1.0 - frac)
    coarse = coarse_estimate(means, coarse_privacy, rng, width=coarse_bucket_width(k, m, moment_bound), bound=bound)
    r = clipping_radius(n, m, d, k, final_privacy, moment_bound) if radius is None else positive("radius", radius)
    final = clip_and_noise(means, final_privacy, rng, center=coarse.center, radius=r)
    return HeavyTailedResult(final.estimate, coarse.center, r, final.sigma)
