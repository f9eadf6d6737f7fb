"""Heavy-tailed synthetic users with bounded k-th moments (n users, m samples, d dimensions).

Both laws are elliptical, ``X = mu + scale sqrt(W) Z`` with Z ~ N(0, I_d) and an
independent scalar mixing variable W >= 0 per sample, so every one-dimensional projection
``<X - mu, v>`` (||v|| = 1) has the same law ``scale sqrt(W) N(0, 1)``. Hence the moment
of Agarwal et al.'s Def. 2.4, ``sigma_k = sup_v E|<X - mu, v>|^k^(1/k)``, is the same in
every direction and known exactly:

* ``student-t`` (multivariate t, ``tail`` = nu degrees of freedom): ``W = nu / chi2_nu``;
  each projection is ``scale * t_nu``. ``E|t_nu|^k = nu^(k/2) Gamma((k+1)/2)
  Gamma((nu-k)/2) / (sqrt(pi) Gamma(nu/2))``, finite exactly for k < nu.
* ``pareto-mixture`` (``tail`` = alpha): W ~ Pareto(alpha) on [1, inf), ``P(W > w) = w^-alpha``;
  ``E[W^(k/2)] = alpha / (alpha - k/2)`` and ``E|N|^k = 2^(k/2) Gamma((k+1)/2) / sqrt(pi)``,
  so the k-th moment is finite exactly for k < 2 alpha; projections have tails ~ t^(-2 alpha).

The mean is ``mu_j = mu * sin(j + 1)`` (as in :mod:`shuffledp.simulation.vector_population`), so it is
not a multiple of the all-ones vector. Unlike :mod:`shuffledp.simulation.vector_population` these
laws are unbounded by design.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shuffledp.central._data import check_rng, positive
from shuffledp.protocol.errors import InvalidParameter

__all__ = ["HEAVY_TAILED_KINDS", "HeavyTailedPopulation"]

HEAVY_TAILED_KINDS = ("student-t", "pareto-mixture")


@dataclass(frozen=True)
class HeavyTailedPopulation:
    """Users with m i.i.d. samples each from an elliptical heavy-tailed law (module docstring)."""

    kind: str
    dim: int
    m: int
    tail: float
    scale: float = 1.0
    mu: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in HEAVY_TAILED_KINDS:
            raise InvalidParameter("kind", f"must be one of {HEAVY_TAILED_KINDS}, got {self.kind!r}")
        for name in ("dim", "m"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidParameter(name, f"must be an integer >= 1, got {v!r}")
        positive("tail", self.tail)
        positive("scale", self.scale)
        if not (isinstance(self.mu, (int, float)) and math.isfinite(self.mu)):
            raise InvalidParameter("mu", f"must be a finite number, got {self.mu!r}")

    @property
    def mean(self) -> np.ndarray:
        return self.mu * np.sin(np.arange(1, self.dim + 1))

    @property
    def max_moment(self) -> float:
        """Supremum of the finite moment orders: nu (student-t) or 2 alpha (pareto-mixture), exclusive."""
        return self.tail if self.kind == "student-t" else 2.0 * self.tail

    def moment(self, k: float) -> float:
        """``sigma_k`` of one sample: ``E|<X - mu, v>|^k^(1/k)``, the same for every unit v."""
        k = positive("k", k)
        if k >= self.max_moment:
            raise InvalidParameter("k", f"the {k}-th moment is infinite for {self.kind} with tail {self.tail}")
        if self.kind == "student-t":
            nu = self.tail
            log_m = (k / 2) * math.log(nu) + math.lgamma((k + 1) / 2) + math.lgamma((nu - k) / 2) - 0.5 * math.log(math.pi) - math.lgamma(nu / 2)
        else:
            alpha = self.tail
            log_m = math.log(alpha / (alpha - k / 2)) + (k / 2) * math.log(2.0) + math.lgamma((k + 1) / 2) - 0.5 * math.log(math.pi)
        return self.scale * math.exp(log_m / k)

    @property
    def variance(self) -> float:
        """Variance of every projection of one sample (the k = 2 moment squared)."""
        return self.moment(2.0) ** 2

    def _mixing(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        if self.kind == "student-t":
            return self.tail / rng.chisquare(self.tail, size=shape)
        return (1.0 - rng.random(size=shape)) ** (-1.0 / self.tail)  # inverse CDF of Pareto(alpha) on [1, inf)

    def samples(self, rng: np.random.Generator, users: int) -> np.ndarray:
        """``(users, m, d)`` samples."""
        rng = check_rng(rng)
        if isinstance(users, bool) or not isinstance(users, int) or users < 1:
            raise InvalidParameter("users", f"must be an integer >= 1, got {users!r}")
        z = rng.standard_normal((users, self.m, self.dim))
        z *= (self.scale * np.sqrt(self._mixing(rng, (users, self.m))))[:, :, None]
        z += self.mean
        return z

    def local_means(self, rng: np.random.Generator, users: int) -> np.ndarray:
        """``(users, d)`` per-user means of m samples."""
        return self.samples(rng, users).mean(axis=1)
