"""Streaming simulation of the vector mean protocol (Algorithm 5) in bounded memory.

Users are processed block by block (:meth:`VectorPopulation.blocks`) in two passes:
the range round (accumulate per-coordinate signed histograms), then, with the ranges
announced, the mean round (accumulate per-coordinate sums and the exact error model).
Each block's data is regenerated from its own seed in both passes, so memory is one
block of samples plus O(D K) accumulators, whatever n is. Randomizer draws come from a
per-(round, block) seed, so the result does not depend on ``chunk_blocks``, the number
of blocks processed per step.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from shuffledp.analyzer.vector_mean import (
    VectorMeanAccumulator,
    VectorMeanConfig,
    VectorRangeAccumulator,
    theorem2_mse_bound,
)
from shuffledp.client.vector_randomizer import randomize_vector_mean, randomize_vector_range
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.randomness import SeededSource
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
    chunk_blocks: int = 1
    path: str = "fast"
    broker: str | None = None

    def __post_init__(self) -> None:
        if self.path not in ("fast", "messages"):
            raise InvalidParameter("path", f"must be 'fast' or 'messages', got {self.path!r}")
        if self.broker is not None and self.path != "messages":
            raise InvalidParameter("broker", "a broker carries messages: use the messages path")
        if not (isinstance(self.n, int) and self.n >= 2):
            raise InvalidParameter("n", f"must be an integer >= 2, got {self.n}")
        if not (isinstance(self.chunk_blocks, int) and self.chunk_blocks >= 1):
            raise InvalidParameter("chunk_blocks", f"must be an integer >= 1, got {self.chunk_blocks}")
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


def _chunks(blocks, chunk_blocks: int):
    for start in range(0, len(blocks), chunk_blocks):
        group = blocks[start : start + chunk_blocks]
        yield group


def _block_data(population: VectorPopulation, group, rotation):
    means, total = population.block_local_means(group)
    return means, rotation.apply(means), total


def _sources(config: VectorSimulationConfig, round_index: int, group) -> list[SeededSource]:
    return [SeededSource(np.random.SeedSequence([config.seed, 0xB10C, round_index, start])) for start, _, _ in group]


def run_vector_simulation(config: VectorSimulationConfig, progress: Progress | None = None) -> VectorSimulationResult:
    """Algorithm 5 on synthetic users; error against the exact truth and theory.

    ``fast``: streamed block by block (memory: one block plus O(D K)), not through the
    generic engine, whose fast path holds every user's vector. ``messages``: the
    protocol (:class:`~shuffledp.analyzer.vector_mean.VectorMeanProtocol`) through the
    message engine, real clients, shuffler and analyzer (``shuffledp/simulation/engine.py``).
    """
    if config.path == "messages":
        return _run_on_messages(config, progress)
    started = time.perf_counter()
    protocol = config.protocol_config()
    population = config.population
    rotation = protocol.rotation
    blocks = population.blocks(config.n, config.seed)
    if protocol.range_round:
        range_acc = VectorRangeAccumulator(protocol)
        for group in _chunks(blocks, config.chunk_blocks):
            _, rotated, _ = _block_data(population, group, rotation)
            offset = 0
            for (_, count, _), source in zip(group, _sources(config, 0, group)):
                part = rotated[offset : offset + count]
                offset += count
                range_acc.add(randomize_vector_range(part, protocol.range_params(), protocol.epsilon0 / 2.0, protocol.mode, source))
            if progress:
                progress("range round", sum(c for _, c, _ in group))
        ranges = range_acc.ranges()
        check = range_acc.check()
    else:  # one bin: the range round is data-independent and skipped (VectorMeanConfig.range_round)
        ranges = np.tile([-protocol.rotated_bound, protocol.rotated_bound], (protocol.padded_dim, 1))
        check = None
    mean_round = 1 if protocol.range_round else 0
    mean_acc = VectorMeanAccumulator(protocol, ranges)
    total = np.zeros(population.dim)
    inside = 0
    sq_norm = 0.0
    for group in _chunks(blocks, config.chunk_blocks):
        _, rotated, block_total = _block_data(population, group, rotation)
        total += block_total
        inside += int(((rotated >= ranges[:, 0]) & (rotated <= ranges[:, 1])).sum())
        sq_norm += float((np.clip(rotated, ranges[:, 0], ranges[:, 1]) ** 2).sum())
        offset = 0
        for (_, count, _), source in zip(group, _sources(config, mean_round, group)):
            part = rotated[offset : offset + count]
            offset += count
            reports, grid = randomize_vector_mean(
                part, ranges, protocol.mean_epsilon, source,
                noise=protocol.noise, grid_levels=protocol.grid_levels, delta0=protocol.delta0,
            )
            mean_acc.add(reports, grid)
        mean_acc.add_truth(rotated)
        if progress:
            progress("mean round", sum(c for _, c, _ in group))
    return _result(config, protocol, mean_acc, total / (config.n * population.m), sq_norm, inside, started, check)


def _run_on_messages(config: VectorSimulationConfig, progress: Progress | None) -> VectorSimulationResult:
    """Every user a real client: the protocol through the message engine; theory from the announced ranges."""
    from shuffledp.analyzer.vector_mean import VectorMeanProtocol
    from shuffledp.simulation.engine import run_messages

    started = time.perf_counter()
    protocol = config.protocol_config()
    population = config.population
    means, total = population.block_local_means(population.blocks(config.n, config.seed))
    outcome = run_messages(VectorMeanProtocol(protocol), means, config.seed, config.broker, progress).result
    ranges = outcome.ranges
    mean_acc = VectorMeanAccumulator(protocol, ranges)
    rotated = protocol.rotation.apply(means)
    mean_acc.add_truth(rotated)
    mean_acc.sums = outcome.rotated_sums
    mean_acc.n = outcome.reports
    inside = int(((rotated >= ranges[:, 0]) & (rotated <= ranges[:, 1])).sum())
    sq_norm = float((np.clip(rotated, ranges[:, 0], ranges[:, 1]) ** 2).sum())
    return _result(config, protocol, mean_acc, total / (config.n * population.m), sq_norm, inside, started, outcome.range_check)


def _result(config, protocol, mean_acc: VectorMeanAccumulator, true_mean, sq_norm: float, inside: int, started: float, check=None):
    population = config.population
    estimate = mean_acc.estimate()
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
