"""Simulated users through the vector mean protocol (Algorithm 5), on either engine.

The protocol is :class:`~shuffledp.analyzer.vector_mean.VectorMeanProtocol`, run by
:func:`~shuffledp.simulation.engine.run_fast` or :func:`~shuffledp.simulation.engine.run_messages`
like every other protocol: with one seed both give the same estimate. On the fast engine the
users come as :class:`~shuffledp.simulation.population.GeneratedUsers` (made block by block
from the population's seed) and both rounds stream into the analyzer's collectors, so memory
is one block of users plus O(D K) statistics, whatever n is. The exact error model is then
accumulated from the users' true rotated means, block by block, with the announced ranges.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from shuffledp.analyzer.vector_mean import (
    VectorMeanAccumulator,
    VectorMeanConfig,
    VectorMeanProtocol,
    theorem2_mse_bound,
)
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.simulation.engine import ENGINES, run_fast, run_messages
from shuffledp.simulation.vector_population import VectorPopulation

Progress = Callable[[str, int], None]


@dataclass(frozen=True)
class VectorSimulationConfig:
    population: VectorPopulation
    n: int
    epsilon0: float
    mode: str = "sampled"
    delta0: float = 0.0
    noise: str = "laplace"
    gamma: float = 0.01
    grid_levels: int = 4096
    seed: int = 0
    path: str = "fast"
    broker: str | None = None

    def __post_init__(self) -> None:
        if self.path not in ENGINES:
            raise InvalidParameter("path", f"must be one of {tuple(ENGINES)}, got {self.path!r}")
        if self.broker is not None and self.path != "messages":
            raise InvalidParameter("broker", "a broker carries messages: use the messages path")
        if not (isinstance(self.n, int) and self.n >= 2):
            raise InvalidParameter("n", f"must be an integer >= 2, got {self.n}")
        self.protocol_config()

    def protocol_config(self) -> VectorMeanConfig:
        pop = self.population
        seed = int(np.random.SeedSequence([self.seed, 0x2077]).generate_state(1, np.uint64)[0])
        padded = VectorMeanConfig(pop.dim, 1.0, 1.0, self.epsilon0, rotation_seed=seed).padded_dim
        return VectorMeanConfig(
            dim=pop.dim,
            rotated_bound=pop.rotated_bound(padded),
            rotated_tau=pop.rotated_radius(self.n, padded, self.gamma),
            epsilon0=self.epsilon0,
            delta0=self.delta0,
            noise=self.noise,
            grid_levels=self.grid_levels,
            mode=self.mode,
            rotation_seed=seed,
        )


@dataclass
class VectorSimulationResult:
    config: dict[str, Any]
    true_mean: np.ndarray = field(repr=False)
    estimate: np.ndarray = field(repr=False)
    l2_error: float
    mse_theory: float
    variance_per_coordinate: np.ndarray = field(repr=False)
    theorem2_mse_bound: float
    linf_error: float
    tv_error: float | None
    fraction_coordinates_ranges_hit: float
    seconds: float
    #: The analyzer's own check of the range round, per coordinate (``analyzer/range_check.py``).
    range_check: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["true_mean"] = self.true_mean.tolist()
        out["variance_per_coordinate"] = self.variance_per_coordinate.tolist()
        out["estimate"] = self.estimate.tolist()
        return out


def run_vector_simulation(config: VectorSimulationConfig, progress: Progress | None = None) -> VectorSimulationResult:
    """Algorithm 5 on synthetic users, on the configured engine; error against the exact truth and theory."""
    started = time.perf_counter()
    protocol = config.protocol_config()
    population = config.population
    users = population.users(config.n, config.seed)
    if config.path == "fast":
        run = run_fast(VectorMeanProtocol(protocol), users, config.seed, progress)
    else:
        run = run_messages(VectorMeanProtocol(protocol), np.asarray(users), config.seed, config.broker, progress)
    outcome = run.result
    ranges = outcome.ranges
    # The exact error model, from the users' true rotated means and the announced ranges (one block at a time).
    truth = VectorMeanAccumulator(protocol, ranges)
    total = np.zeros(population.dim)
    inside = 0
    sq_norm = 0.0
    for block in population.blocks(config.n, config.seed):
        means, block_total = population.block_local_means([block])
        rotated = protocol.rotation.apply(means)
        total += block_total
        inside += int(((rotated >= ranges[:, 0]) & (rotated <= ranges[:, 1])).sum())
        sq_norm += float((np.clip(rotated, ranges[:, 0], ranges[:, 1]) ** 2).sum())
        truth.add_truth(rotated)
    truth.n = outcome.reports
    true_mean = total / (config.n * population.m)
    return _result(config, protocol, outcome.estimate, truth, true_mean, sq_norm, inside, started, outcome.range_check)


def _result(config, protocol, estimate, mean_acc: VectorMeanAccumulator, true_mean, sq_norm: float, inside: int, started: float, check=None):
    population = config.population
    error = estimate - true_mean
    bias = mean_acc.projected_mean() - true_mean
    mse = float(mean_acc.variance().sum() + (bias**2).sum())
    cfg = asdict(config)
    cfg["rotated_tau"] = protocol.range_params().tau
    cfg["rotated_bound"] = protocol.rotated_bound
    cfg["padded_dim"] = protocol.padded_dim
    return VectorSimulationResult(
        config=cfg,
        true_mean=true_mean,
        estimate=estimate,
        l2_error=float(np.linalg.norm(error)),
        mse_theory=mse,
        variance_per_coordinate=mean_acc.variance(),
        theorem2_mse_bound=theorem2_mse_bound(protocol, config.n, sq_norm / config.n),
        linf_error=float(np.abs(error).max()),
        tv_error=float(0.5 * np.abs(error).sum()) if population.kind == "categorical" else None,
        fraction_coordinates_ranges_hit=inside / (config.n * protocol.padded_dim),
        seconds=time.perf_counter() - started,
        range_check=check.as_dict() if check is not None else {},
    )
