"""Synthetic users for simulations: n users, m samples each, bounded in [-B, B].

Documented distributions (``mu`` the mean, ``sigma`` the spread parameter):

* ``gaussian``: N(mu, sigma^2) truncated to [-B, B] (sampled by rejection). Its exact
  mean and variance follow from the truncated-normal formulas. A truncated normal
  is sub-Gaussian with variance proxy sigma^2 (it is strongly log-concave with
  parameter 1/sigma^2).
* ``uniform``: U[mu - w, mu + w] with ``w = sigma * sqrt(3)`` (so its sd is sigma);
  sub-Gaussian with proxy ``w^2`` (Hoeffding's lemma).
* ``two-point``: mu ± sigma with probability 1/2 each; proxy ``sigma^2``.

Users are generated in fixed blocks of :data:`BLOCK_USERS`, block ``b`` from the
``b``-th child of the seed's SeedSequence, so user ``i``'s data does not depend on
how a simulation chunks its work. :class:`GeneratedUsers` makes any range of users on
demand from those blocks, so the fast engine runs millions of users holding one block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np

from shuffledp.protocol.errors import InvalidParameter

DISTRIBUTIONS = ("gaussian", "uniform", "two-point")
BLOCK_USERS = 1 << 16


def _phi(x: float) -> float:
    return math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _Phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2))


@dataclass(frozen=True)
class Population:
    """The data-generating model of a simulation."""

    distribution: str
    mu: float
    sigma: float
    bound: float
    m: int

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise InvalidParameter("distribution", f"must be one of {DISTRIBUTIONS}, got {self.distribution!r}")
        if not (self.bound > 0 and math.isfinite(self.bound)):
            raise InvalidParameter("bound", f"must be finite and > 0, got {self.bound}")
        if not (self.sigma > 0 and math.isfinite(self.sigma)):
            raise InvalidParameter("sigma", f"must be finite and > 0, got {self.sigma}")
        if not (isinstance(self.m, int) and self.m >= 1):
            raise InvalidParameter("m", f"must be an integer >= 1, got {self.m}")
        half_width = {"gaussian": 0.0, "uniform": self.sigma * math.sqrt(3), "two-point": self.sigma}
        reach = half_width[self.distribution]
        if not (-self.bound <= self.mu - reach and self.mu + reach <= self.bound):
            raise InvalidParameter(
                "mu", f"the {self.distribution} data around {self.mu} must lie in [-{self.bound}, {self.bound}]"
            )

    @property
    def proxy_sigma(self) -> float:
        """Sub-Gaussian variance-proxy square root of one sample."""
        return self.sigma * math.sqrt(3) if self.distribution == "uniform" else self.sigma

    @property
    def mean(self) -> float:
        """Exact population mean."""
        if self.distribution != "gaussian":
            return self.mu
        a, b = (-self.bound - self.mu) / self.sigma, (self.bound - self.mu) / self.sigma
        z = _Phi(b) - _Phi(a)
        return self.mu + self.sigma * (_phi(a) - _phi(b)) / z

    @property
    def variance(self) -> float:
        """Exact variance of one sample."""
        if self.distribution != "gaussian":
            return self.sigma**2
        a, b = (-self.bound - self.mu) / self.sigma, (self.bound - self.mu) / self.sigma
        z = _Phi(b) - _Phi(a)
        ratio = (_phi(a) - _phi(b)) / z
        return self.sigma**2 * (1 + (a * _phi(a) - b * _phi(b)) / z - ratio**2)

    def samples(self, rng: np.random.Generator, users: int) -> np.ndarray:
        """A ``(users, m)`` array of samples."""
        shape = (users, self.m)
        if self.distribution == "uniform":
            w = self.sigma * math.sqrt(3)
            return rng.uniform(self.mu - w, self.mu + w, size=shape)
        if self.distribution == "two-point":
            return self.mu + self.sigma * (2.0 * rng.integers(0, 2, size=shape) - 1.0)
        out = rng.normal(self.mu, self.sigma, size=shape)
        bad = np.abs(out) > self.bound
        while bad.any():
            out[bad] = rng.normal(self.mu, self.sigma, size=int(bad.sum()))
            bad = np.abs(out) > self.bound
        return out


def fixed_blocks(n: int, size: int, seed: int, tag: int) -> "list[tuple[int, int, np.random.SeedSequence]]":
    """Users ``0..n-1`` in blocks ``(start, count, seed)`` of ``size``, block b seeded by the
    b-th child of ``SeedSequence([seed, tag])``: a user's data never depends on chunking."""
    if n < 1:
        raise InvalidParameter("n", f"must be >= 1, got {n}")
    count = math.ceil(n / size)
    children = np.random.SeedSequence([seed, tag]).spawn(count)
    return [(b * size, min(size, n - b * size), children[b]) for b in range(count)]


class GeneratedUsers:
    """``n`` users' local data, made on demand from fixed seeded blocks and never held whole.

    ``blocks``: ``(start, count, seed)`` as :func:`fixed_blocks` makes them; ``make(count, seed)``
    returns that block's ``(count, *tail)`` array. Slicing ``users[a:b]`` makes the blocks that
    cover users ``a..b-1`` (the last one is kept for the next slice); ``np.asarray(users)``
    makes all of them."""

    def __init__(self, blocks, tail: tuple[int, ...], make: "Callable[[int, np.random.SeedSequence], np.ndarray]") -> None:
        self.blocks = list(blocks)
        self.n = sum(count for _, count, _ in self.blocks)
        self.shape = (self.n, *tail)
        self.ndim = len(self.shape)
        self._make = make
        self._cached: "tuple[int, np.ndarray] | None" = None

    def __len__(self) -> int:
        return self.n

    def _block(self, index: int) -> np.ndarray:
        if self._cached is None or self._cached[0] != index:
            _, count, seed = self.blocks[index]
            self._cached = (index, np.asarray(self._make(count, seed), dtype=np.float64))
        return self._cached[1]

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("GeneratedUsers takes a contiguous slice of users")
        start, stop, _ = key.indices(self.n)
        parts = []
        for index, (first, count, _) in enumerate(self.blocks):
            if first + count <= start or first >= stop:
                continue
            block = self._block(index)
            parts.append(block[max(start, first) - first : min(stop, first + count) - first])
        if not parts:
            return np.empty((0, *self.shape[1:]))
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self[0 : self.n]
        return out if dtype is None else out.astype(dtype, copy=False)

    def covering(self, start: int, stop: int) -> "tuple[GeneratedUsers, int]":
        """Users ``start..stop-1`` made elsewhere: ``(part, offset)``, where ``part`` holds only the
        fixed blocks that cover them (same seeds, re-based to start at 0) and ``part[offset :
        offset + stop - start]`` is ``self[start:stop]``, to the last bit. A few seeds, not data:
        what the Dask engine ships to the worker that makes a draw block's users."""
        if not 0 <= start < stop <= self.n:
            raise InvalidParameter("users", f"need 0 <= start < stop <= {self.n}, got {start}..{stop}")
        covering = [(first, count, seed) for first, count, seed in self.blocks if first < stop and first + count > start]
        base = covering[0][0]
        part = GeneratedUsers([(first - base, count, seed) for first, count, seed in covering], self.shape[1:], self._make)
        return part, start - base


def user_blocks(population: Population, n: int, seed: int) -> "list[tuple[int, int, np.random.SeedSequence]]":
    """The fixed blocks ``(start, count, seed)`` that generate users ``0..n-1``."""
    return fixed_blocks(n, BLOCK_USERS, seed, 0x5EED)


def block_samples(population: Population, block: "tuple[int, int, np.random.SeedSequence]") -> np.ndarray:
    _, count, seed = block
    return population.samples(np.random.default_rng(seed), count)


def _block_means(population: Population, count: int, seed: np.random.SeedSequence) -> np.ndarray:
    return population.samples(np.random.default_rng(seed), count).mean(axis=1)


def generated_users(population: Population, n: int, seed: int) -> GeneratedUsers:
    """The local means of :func:`local_means` (the same values, to the last bit), made block by
    block on demand from the same seeds: what a worker of the Dask engine makes for its blocks."""
    return GeneratedUsers(user_blocks(population, n, seed), (), partial(_block_means, population))


def local_means(
    population: Population, n: int, seed: int, progress: "Callable[[str, int], None] | None" = None
) -> "tuple[np.ndarray, float]":
    """Local means of users ``0..n-1`` (one float each) and the exact mean of all their n*m samples.

    ``shuffledp simulate`` and the simulated fleet (``shuffledp clients run``, ``shuffledp up``)
    both draw their users here, so with the same seed they hold the same data."""
    means = np.empty(n)
    total = 0.0
    for block in user_blocks(population, n, seed):
        samples = block_samples(population, block)
        start, count, _ = block
        means[start : start + count] = samples.mean(axis=1)
        total += float(samples.sum())
        if progress:
            progress("generate users", count)
    return means, total / (n * population.m)
