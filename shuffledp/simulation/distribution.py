"""Discrete distribution estimation under user-level privacy (Esfandiari, Mirrokni &
Narayanan 2022, Sec. 4: a distribution is the mean of one-hot vectors).

Each user holds m samples over k symbols. Two estimators, both user-level ``eps0``-LDP:

* ``oracle`` (item-level baseline): the user reports *one* of its samples with the
  generalised Hadamard response at ``eps0`` (:mod:`shuffledp.client.hadamard_response`).
  Its error does not improve with m.
* ``vector``: the vector mean protocol (Algorithm 5, sampled mode) on the user's
  empirical distribution (d = k). Rotated coordinates of one-hot vectors are
  ``±1/sqrt(D)``, so the concentration radius shrinks like ``1/sqrt(m)`` and so does the
  error. It runs as :class:`~shuffledp.analyzer.vector_mean.VectorMeanProtocol` on the
  configured engine (:func:`~shuffledp.simulation.vector.run_vector_simulation`): ``fast``
  streams the users block by block, ``messages`` runs real clients, shuffler and analyzer;
  with one seed both give the same estimate. The ``oracle`` baseline is computed directly
  (vectorized, not as shuffled rounds: the wire format has no Hadamard-response round).

Errors are measured against the population distribution ``p``; the theory adds the
sampling variance (``p(1-p)/n`` for one sample per user, ``p(1-p)/(nm)`` for all
samples) to each mechanism's exact variance. The expected total-variation error is
predicted with the normal approximation ``E|X| = sqrt(2 v / pi)`` per symbol (bias
from clipping, zero when every range holds its users, is reported separately).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from shuffledp.analyzer.frequency import decode_hadamard_response, hadamard_response_variance
from shuffledp.client.hadamard_response import choose_hadamard_response, randomize_hadamard_response
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.randomness import SeededSource
from shuffledp.simulation.engine import ENGINES
from shuffledp.simulation.vector_population import VectorPopulation
from shuffledp.simulation.vector import VectorSimulationConfig, run_vector_simulation

Progress = Callable[[str, int], None]


@dataclass(frozen=True)
class DistributionConfig:
    k: int
    n: int
    m: int
    epsilon0: float
    zipf: float = 1.1
    gamma: float = 0.01
    seed: int = 0
    #: Engine of the vector estimator: ``fast`` or ``messages`` (and the ``broker`` it may use).
    path: str = "fast"
    broker: str | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.n, int) and self.n >= 2):
            raise InvalidParameter("n", f"must be an integer >= 2, got {self.n}")
        if self.path not in ENGINES:
            raise InvalidParameter("path", f"must be one of {tuple(ENGINES)}, got {self.path!r}")
        if self.broker is not None and self.path != "messages":
            raise InvalidParameter("broker", "a broker carries messages: use the messages path")
        self.population()

    def vector_config(self) -> VectorSimulationConfig:
        """The vector estimator's run: Algorithm 5 on the users' empirical distributions."""
        return VectorSimulationConfig(
            self.population(), self.n, self.epsilon0, gamma=self.gamma, seed=self.seed, path=self.path, broker=self.broker
        )

    def population(self) -> VectorPopulation:
        return VectorPopulation("categorical", self.k, self.m, zipf=self.zipf)


@dataclass
class EstimatorError:
    estimator: str
    tv_error: float
    tv_theory: float
    l2_error: float
    l2_theory: float


def _expected_tv(variances: np.ndarray) -> float:
    return float(0.5 * np.sqrt(2.0 * np.asarray(variances) / math.pi).sum())


def oracle_estimate(config: DistributionConfig, progress: Progress | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One sample per user through the generalised Hadamard response; estimate and exact variance."""
    population = config.population()
    p = population.probabilities
    params = choose_hadamard_response(config.k, config.epsilon0)
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, 0x0AC1]))
    source = SeededSource(np.random.SeedSequence([config.seed, 0x0AC2]))
    symbols = rng.choice(config.k, size=config.n, p=p)  # each user's first sample
    estimate = decode_hadamard_response(randomize_hadamard_response(symbols, params, source), params)
    if progress:
        progress("frequency oracle", config.n)
    variance = hadamard_response_variance(p, config.n, params) + p * (1 - p) / config.n
    return estimate, variance


def run_distribution(config: DistributionConfig, progress: Progress | None = None) -> dict[str, Any]:
    """Both estimators on the same population; errors against p with their theory."""
    p = config.population().probabilities
    oracle, oracle_var = oracle_estimate(config, progress)
    vector = run_vector_simulation(config.vector_config(), progress=progress)
    vector_var = vector.variance_per_coordinate + p * (1 - p) / (config.n * config.m)
    rows = []
    for name, estimate, variance in (("oracle", oracle, oracle_var), ("vector", vector.estimate, vector_var)):
        error = estimate - p
        rows.append(
            EstimatorError(
                estimator=name,
                tv_error=float(0.5 * np.abs(error).sum()),
                tv_theory=_expected_tv(variance),
                l2_error=float(np.linalg.norm(error)),
                l2_theory=float(math.sqrt(variance.sum())),
            )
        )
    return {
        "config": asdict(config),
        "estimators": [asdict(r) for r in rows],
        "vector_ranges_hit": vector.fraction_coordinates_ranges_hit,
        "vector_rotated_tau": vector.config["rotated_tau"],
    }
