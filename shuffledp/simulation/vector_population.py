"""Synthetic vector users: n users, m samples each, in d dimensions.

* ``gaussian``: each coordinate k i.i.d. N(mu_k, sigma^2) truncated to [-B, B], with
  ``mu_k = mu * sin(k + 1)`` (a fixed, documented, non-trivial mean). Coordinates are
  independent and each is sigma^2-sub-Gaussian, so every unit direction is too.
* ``categorical``: each sample is one of d symbols drawn from ``p`` (Zipf with
  exponent ``zipf`` if > 0, else uniform); a user's vector is its empirical
  distribution (the mean of one-hot vectors, Esfandiari et al. 2022, Sec. 4).

Users come in fixed blocks whose size depends only on (m, d), each block from its own
child of the seed's SeedSequence, so a user's data never depends on how a run chunks
its work, and memory per block stays about 16 MiB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from shuffledp.simulation.population import GeneratedUsers, Population, fixed_blocks
from shuffledp.protocol.errors import InvalidParameter

VECTOR_KINDS = ("gaussian", "categorical")
BLOCK_FLOATS = 1 << 21


@dataclass(frozen=True)
class VectorPopulation:
    kind: str
    dim: int
    m: int
    mu: float = 0.5
    sigma: float = 1.0
    bound: float = 4.0
    zipf: float = 1.1

    def __post_init__(self) -> None:
        if self.kind not in VECTOR_KINDS:
            raise InvalidParameter("kind", f"must be one of {VECTOR_KINDS}, got {self.kind!r}")
        if not (isinstance(self.dim, int) and self.dim >= 1):
            raise InvalidParameter("dim", f"must be an integer >= 1, got {self.dim}")
        if not (isinstance(self.m, int) and self.m >= 1):
            raise InvalidParameter("m", f"must be an integer >= 1, got {self.m}")
        if self.kind == "gaussian":
            Population("gaussian", self.mu, self.sigma, self.bound, self.m)  # validates the scalar parameters
            if abs(self.mu) >= self.bound:
                raise InvalidParameter("mu", f"must be inside (-bound, bound) = (-{self.bound}, {self.bound})")
        elif self.dim < 2:
            raise InvalidParameter("dim", "a categorical population needs at least 2 symbols")

    @cached_property
    def means(self) -> np.ndarray:
        """Exact population mean vector."""
        if self.kind == "categorical":
            return self.probabilities
        return np.array([self._coordinate(k).mean for k in range(self.dim)])

    @cached_property
    def coordinate_variances(self) -> np.ndarray:
        """Exact variance of one sample's coordinates."""
        if self.kind == "categorical":
            p = self.probabilities
            return p * (1 - p)
        return np.array([self._coordinate(k).variance for k in range(self.dim)])

    @cached_property
    def probabilities(self) -> np.ndarray:
        if self.zipf > 0:
            weights = 1.0 / np.arange(1, self.dim + 1) ** self.zipf
        else:
            weights = np.ones(self.dim)
        return weights / weights.sum()

    def _coordinate(self, k: int) -> Population:
        return Population("gaussian", self.mu * math.sin(k + 1), self.sigma, self.bound, self.m)

    @property
    def block_users(self) -> int:
        per_user = self.m * self.dim
        return int(min(1 << 16, max(1, 1 << int(math.log2(max(1, BLOCK_FLOATS // per_user))))))

    def local_means(self, rng: np.random.Generator, users: int) -> tuple[np.ndarray, np.ndarray]:
        """``(users, d)`` local means and the ``d``-vector sum of all samples (for the true mean)."""
        if self.kind == "categorical":
            symbols = rng.choice(self.dim, size=(users, self.m), p=self.probabilities)
            offsets = (np.arange(users) * self.dim)[:, None]
            counts = np.bincount((symbols + offsets).ravel(), minlength=users * self.dim).reshape(users, self.dim)
            return counts / self.m, counts.sum(axis=0).astype(np.float64)
        mu = self.mu * np.sin(np.arange(1, self.dim + 1))
        samples = rng.standard_normal((users, self.m, self.dim))
        samples *= self.sigma
        samples += mu
        bad = np.abs(samples) > self.bound
        while bad.any():
            samples[bad] = rng.normal(np.broadcast_to(mu, samples.shape)[bad], self.sigma)
            bad = np.abs(samples) > self.bound
        return samples.mean(axis=1), samples.sum(axis=(0, 1))

    def block_local_means(self, group) -> tuple[np.ndarray, np.ndarray]:
        """Local means of the users of ``group`` (blocks from :meth:`blocks`) and their samples' sum."""
        parts = [self.local_means(np.random.default_rng(seed), count) for _, count, seed in group]
        return np.concatenate([p[0] for p in parts]), np.asarray(sum(p[1] for p in parts))

    def blocks(self, n: int, seed: int) -> list[tuple[int, int, np.random.SeedSequence]]:
        return fixed_blocks(n, self.block_users, seed, 0x7EC7)

    def users(self, n: int, seed: int) -> GeneratedUsers:
        """Users ``0..n-1``'s ``(n, d)`` local means, made block by block on demand (the same
        values as :meth:`block_local_means` of :meth:`blocks`)."""
        return GeneratedUsers(self.blocks(n, seed), (self.dim,), lambda count, s: self.local_means(np.random.default_rng(s), count)[0])

    def rotated_bound(self, padded_dim: int) -> float:
        """Bound on ``|(U y)_l|`` for every admissible local mean y (``|U_lk| = 1/sqrt(D)``)."""
        l1 = 1.0 if self.kind == "categorical" else self.bound * self.dim
        return l1 / math.sqrt(padded_dim)

    def rotated_radius(self, n: int, padded_dim: int, gamma: float) -> float:
        """Per-coordinate concentration radius of rotated local means, w.p. >= 1 - gamma.

        A rotated coordinate of one sample is ``u^T x`` with ``u`` a row of U. Gaussian
        data: sigma^2-sub-Gaussian in every direction. Categorical: ``u^T e_x = ±1/sqrt(D)``,
        so by Hoeffding's lemma the proxy is ``1/D``. A mean of m has proxy ``proxy/m``;
        the union bound over n users and D coordinates gives
        ``sqrt(2 proxy log(2 n D / gamma) / m)``.
        """
        proxy = 1.0 / padded_dim if self.kind == "categorical" else self.sigma**2
        return math.sqrt(2.0 * proxy * math.log(2.0 * n * padded_dim / gamma) / self.m)
