"""Privacy specifications and conversions for the central-model baselines.

Two ways to state a budget, both **user-level** (neighbouring datasets differ in the
whole data of one user, replaced by arbitrary other data; n is public):

* :class:`ZCDP` -- rho-zero-concentrated DP (Bun & Steinke, "Concentrated Differential
  Privacy: Simplifications, Extensions, and Lower Bounds", TCC 2016, Def. 1.1);
* :class:`ApproxDP` -- (epsilon, delta)-DP.

Facts used (Bun & Steinke 2016):

* Prop. 1.3: rho-zCDP implies ``(rho + 2 sqrt(rho log(1/delta)), delta)``-DP for every
  delta in (0, 1). Inverting it, (epsilon, delta) is met by every
  ``rho <= (sqrt(log(1/delta) + epsilon) - sqrt(log(1/delta)))^2``
  (:func:`rho_for_approx_dp`).
* Prop. 1.4: epsilon-DP implies ``epsilon^2 / 2``-zCDP.
* Prop. 1.6: the Gaussian mechanism with l2 sensitivity Delta and noise N(0, sigma^2 I)
  is ``Delta^2 / (2 sigma^2)``-zCDP, so ``sigma = Delta / sqrt(2 rho)``.
* Lemma 2.3: rho_i-zCDP mechanisms compose (adaptively) to (sum rho_i)-zCDP.

(epsilon, delta) Gaussian noise is calibrated with the exact analytic Gaussian mechanism
of :mod:`shuffledp.protocol.mechanisms.gaussian_calibration` (Balle & Wang 2018), not re-derived here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shuffledp.central._data import positive
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.gaussian_calibration import analytic_gaussian_sigma

__all__ = [
    "ZCDP",
    "ApproxDP",
    "Privacy",
    "zcdp_epsilon",
    "rho_for_approx_dp",
    "pure_dp_to_zcdp",
    "gaussian_sigma",
    "advanced_composition_epsilon",
    "per_coordinate_pure_epsilon",
]


@dataclass(frozen=True)
class ZCDP:
    """rho-zCDP (user-level)."""

    rho: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "rho", positive("rho", self.rho))

    def as_rho(self) -> float:
        return self.rho

    def scaled(self, fraction: float) -> "ZCDP":
        """The share ``fraction`` of this budget (zCDP composes additively)."""
        return ZCDP(self.rho * fraction)


@dataclass(frozen=True)
class ApproxDP:
    """(epsilon, delta)-DP (user-level)."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", positive("epsilon", self.epsilon))
        delta = positive("delta", self.delta)
        if not delta < 1.0:
            raise InvalidParameter("delta", f"must lie in (0, 1), got {self.delta!r}")
        object.__setattr__(self, "delta", delta)

    def as_rho(self) -> float:
        """The largest rho whose zCDP guarantee implies this (epsilon, delta) (Prop. 1.3)."""
        return rho_for_approx_dp(self.epsilon, self.delta)

    def scaled(self, fraction: float) -> "ApproxDP":
        """``(fraction eps, fraction delta)``: shares that compose (basic composition) to this budget."""
        return ApproxDP(self.epsilon * fraction, self.delta * fraction)


Privacy = ZCDP | ApproxDP


def check_privacy(privacy: object) -> ZCDP | ApproxDP:
    if not isinstance(privacy, (ZCDP, ApproxDP)):
        raise InvalidParameter("privacy", f"must be ZCDP(rho) or ApproxDP(epsilon, delta), got {privacy!r}")
    return privacy


def zcdp_epsilon(rho: float, delta: float) -> float:
    """``rho + 2 sqrt(rho log(1/delta))``: the epsilon that rho-zCDP gives at delta (Prop. 1.3)."""
    rho = positive("rho", rho)
    delta = ApproxDP(1.0, delta).delta
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def rho_for_approx_dp(epsilon: float, delta: float) -> float:
    """Largest rho with ``zcdp_epsilon(rho, delta) <= epsilon``.

    Solving ``rho + 2 sqrt(rho L) = epsilon`` (L = log 1/delta) for sqrt(rho):
    ``sqrt(rho) = sqrt(L + epsilon) - sqrt(L) = epsilon / (sqrt(L + epsilon) + sqrt(L))``
    (the second form has no cancellation).
    """
    spec = ApproxDP(epsilon, delta)
    log_inv = math.log(1.0 / spec.delta)
    root = spec.epsilon / (math.sqrt(log_inv + spec.epsilon) + math.sqrt(log_inv))
    return root * root


def pure_dp_to_zcdp(epsilon: float) -> float:
    """epsilon-DP implies ``epsilon^2 / 2``-zCDP (Bun & Steinke 2016, Prop. 1.4)."""
    epsilon = positive("epsilon", epsilon)
    return 0.5 * epsilon * epsilon


def gaussian_sigma(sensitivity: float, privacy: ZCDP | ApproxDP) -> float:
    """Noise sd of the Gaussian mechanism for an l2-sensitivity-``sensitivity`` query.

    zCDP: ``sensitivity / sqrt(2 rho)`` (Prop. 1.6, exact). (epsilon, delta): the analytic
    Gaussian mechanism (Balle & Wang 2018, Thm. 8), the smallest sigma that is
    (epsilon, delta)-DP, valid for every epsilon.
    """
    sensitivity = positive("sensitivity", sensitivity)
    privacy = check_privacy(privacy)
    if isinstance(privacy, ZCDP):
        return sensitivity / math.sqrt(2.0 * privacy.rho)
    return analytic_gaussian_sigma(privacy.epsilon, privacy.delta, sensitivity)


def advanced_composition_epsilon(epsilon0: float, k: int, delta_prime: float) -> float:
    """Epsilon of k adaptively composed epsilon0-DP mechanisms at extra delta ``delta_prime``.

    Dwork, Rothblum & Vadhan 2010 (Dwork & Roth 2014, Thm. 3.20), in its exact form:
    ``sqrt(2 k log(1/delta')) epsilon0 + k epsilon0 (e^epsilon0 - 1)``.
    """
    epsilon0 = positive("epsilon0", epsilon0)
    if not (isinstance(k, int) and k >= 1):
        raise InvalidParameter("k", f"must be an integer >= 1, got {k!r}")
    delta_prime = ApproxDP(1.0, delta_prime).delta
    return math.sqrt(2.0 * k * math.log(1.0 / delta_prime)) * epsilon0 + k * epsilon0 * math.expm1(epsilon0)


def per_coordinate_pure_epsilon(privacy: ZCDP | ApproxDP, coordinates: int) -> float:
    """Largest epsilon0 such that ``coordinates`` epsilon0-DP releases meet ``privacy``.

    * zCDP: each release is ``epsilon0^2/2``-zCDP, so ``coordinates * epsilon0^2 / 2 = rho``.
    * (epsilon, delta): the larger of two valid routes --
      (a) Levy et al. 2021, Alg. 2 line 3: ``epsilon0 = epsilon / sqrt(8 d log(1/delta))``,
      kept only when the exact advanced-composition bound
      (:func:`advanced_composition_epsilon`) confirms it is <= epsilon (it is whenever
      epsilon <= 2 log(1/delta); the paper states no condition);
      (b) through zCDP: ``epsilon0 = sqrt(2 rho / d)`` with rho from :func:`rho_for_approx_dp`.
      Route (b) is the larger one for all practical (epsilon, delta), e.g. 1.9x at
      epsilon = 1, delta = 1e-6.
    """
    privacy = check_privacy(privacy)
    if not (isinstance(coordinates, int) and coordinates >= 1):
        raise InvalidParameter("coordinates", f"must be an integer >= 1, got {coordinates!r}")
    via_zcdp = math.sqrt(2.0 * privacy.as_rho() / coordinates)
    if isinstance(privacy, ZCDP):
        return via_zcdp
    levy = privacy.epsilon / math.sqrt(8.0 * coordinates * math.log(1.0 / privacy.delta))
    if advanced_composition_epsilon(levy, coordinates, privacy.delta) <= privacy.epsilon:
        return max(levy, via_zcdp)
    return via_zcdp
