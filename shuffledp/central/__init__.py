"""Central-model baselines: estimators a trusted curator would run on the users' raw data.

User-level differential privacy throughout: user i holds m samples and enters every
estimator only through their mean, so neighbouring datasets differ in one user's whole
data (replacement, n public).

* :func:`winsorized_mean` / :func:`winsorized_mean_1d` -- Levy et al. 2021, Algorithms 1-2
  (private range + winsorized mean, Laplace noise, random rotation);
* :func:`heavy_tailed_mean` / :func:`clip_and_noise` -- Agarwal et al., Algorithm 2
  (clip-and-noise) with Algorithm 4's radius and the coarse estimate, for bounded k-th moments;
* :func:`instance_optimal_mean` -- Huang, Liang & Yi 2021, the Shifted-Clipped-Mean estimator
  (rotation, private medians, private clipping threshold, clipped Gaussian mean), rho-zCDP;
* :class:`ZCDP` / :class:`ApproxDP` -- budgets and conversions (:mod:`.privacy`);
* :class:`HeavyTailedPopulation` -- Student-t / Pareto-mixture data with exact k-th moments.
"""

from shuffledp.central.clip_noise import (
    ClipNoiseResult,
    CoarseResult,
    HeavyTailedResult,
    clip_and_noise,
    clipping_radius,
    coarse_bucket_width,
    coarse_estimate,
    heavy_tailed_mean,
)
from shuffledp.central.evaluation import error_ratio
from shuffledp.central.heavy_tailed import HEAVY_TAILED_KINDS, HeavyTailedPopulation
from shuffledp.central.instance_optimal import (
    PAPER_SPLIT,
    RELEASED_CODE_SPLIT,
    BudgetSplit,
    InstanceOptimalResult,
    clipped_mean,
    clipping_rank,
    instance_optimal_mean,
    private_quantile,
    quantile_rank_error,
)
from shuffledp.central.privacy import (
    ApproxDP,
    Privacy,
    ZCDP,
    advanced_composition_epsilon,
    gaussian_sigma,
    per_coordinate_pure_epsilon,
    pure_dp_to_zcdp,
    rho_for_approx_dp,
    zcdp_epsilon,
)
from shuffledp.central.winsorized import (
    WinsorizedResult,
    gaussian_concentration_radius,
    private_range,
    winsorized_mean,
    winsorized_mean_1d,
)

__all__ = [
    "ApproxDP",
    "BudgetSplit",
    "ClipNoiseResult",
    "CoarseResult",
    "HEAVY_TAILED_KINDS",
    "HeavyTailedPopulation",
    "HeavyTailedResult",
    "InstanceOptimalResult",
    "PAPER_SPLIT",
    "Privacy",
    "RELEASED_CODE_SPLIT",
    "WinsorizedResult",
    "ZCDP",
    "advanced_composition_epsilon",
    "clip_and_noise",
    "clipped_mean",
    "clipping_radius",
    "clipping_rank",
    "coarse_bucket_width",
    "coarse_estimate",
    "error_ratio",
    "gaussian_concentration_radius",
    "gaussian_sigma",
    "heavy_tailed_mean",
    "instance_optimal_mean",
    "per_coordinate_pure_epsilon",
    "private_quantile",
    "private_range",
    "pure_dp_to_zcdp",
    "quantile_rank_error",
    "rho_for_approx_dp",
    "winsorized_mean",
    "winsorized_mean_1d",
    "zcdp_epsilon",
]
