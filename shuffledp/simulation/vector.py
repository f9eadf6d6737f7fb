"""Simulated users through the vector mean protocol (Algorithm 5), on either engine.

The protocol is :class:`~shuffledp.analyzer.vector_mean.VectorMeanProtocol`, run by
:func:`~shuffledp.simulation.engine.run_fast` or :func:`~shuffledp.simulation.engine.run_messages`
like every other protocol: with one seed both give the same estimate. On the fast engine the
users come as :class:`~shuffledp.simulation.population.GeneratedUsers` (made block by block
from the population's seed) and both rounds stream into the analyzer's collectors, so memory
is one block of users plus O(D K) statistics, whatever n is. The exact error model is then
accumulated from the users' true rotated means, block by block, with the announced ranges.

Privacy: every result states the local guarantee (user-level ``(eps0, delta0)``-LDP) and the central
``(eps, delta)`` after shuffling from the amplification accountant (:func:`central_guarantee_at`), at
``central_delta`` or, when none is given, the default every command uses, ``min(1e-6, n^-1.1)``;
and the session plan it was accounted from (:func:`session_plan_of`, read by ``shuffledp account --plan``).
"""

from __future__ import annotations

import functools
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
from shuffledp.protocol.accounting.composition import check_central_delta, default_central_delta
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.simulation.dask_engine import check_engine, run_fast_on
from shuffledp.simulation.engine import ENGINES, run_messages
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
    #: Central delta of the shuffled guarantee (:func:`central_guarantee_at`); ``None``: the default
    #: every command uses, ``min(1e-6, n^-1.1)`` (:attr:`delta`).
    central_delta: float | None = None

    def __post_init__(self) -> None:
        if self.central_delta is not None:
            check_central_delta(self.central_delta, "central_delta")
        if self.path not in ENGINES:
            raise InvalidParameter("path", f"must be one of {tuple(ENGINES)}, got {self.path!r}")
        if self.broker is not None and self.path != "messages":
            raise InvalidParameter("broker", "a broker carries messages: use the messages path")
        if not (isinstance(self.n, int) and self.n >= 2):
            raise InvalidParameter("n", f"must be an integer >= 2, got {self.n}")
        self.protocol_config()

    @property
    def delta(self) -> float:
        """Central delta of the shuffled guarantee: given, or :func:`~shuffledp.protocol.accounting.composition.default_central_delta`."""
        return self.central_delta if self.central_delta is not None else default_central_delta(self.n)

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
    #: User-level local guarantee: ``{"epsilon0", "delta0"}`` (the whole session, both rounds).
    local: dict[str, Any] = field(default_factory=dict)
    #: Central guarantee after shuffling (:func:`central_guarantee_at`): ``epsilon`` and ``delta``
    #: (``epsilon`` None where no shuffled bound is claimed; ``method`` says why) and the rounds.
    central: dict[str, Any] = field(default_factory=dict)
    #: The session plan ``central`` was accounted from (``shuffledp account --plan`` reads it).
    plan: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["true_mean"] = self.true_mean.tolist()
        out["variance_per_coordinate"] = self.variance_per_coordinate.tolist()
        out["estimate"] = self.estimate.tolist()
        return out


def run_vector_simulation(
    config: VectorSimulationConfig, progress: Progress | None = None, client: Any = None
) -> VectorSimulationResult:
    """Algorithm 5 on synthetic users, on the configured engine; error against the exact truth and theory.

    ``client``: a ``dask.distributed.Client`` whose workers run the fast engine's blocks, each
    making its users from the population's seeds (:mod:`shuffledp.simulation.dask_engine`); the
    result is the local engine's to the last bit."""
    check_engine(config.path, client)
    started = time.perf_counter()
    protocol = config.protocol_config()
    population = config.population
    users = population.users(config.n, config.seed)
    if config.path == "fast":
        run = run_fast_on(VectorMeanProtocol(protocol), users, config.seed, progress, client)
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
    if progress:
        progress("privacy accounting", 0)
    central = central_guarantee_at(protocol, config.n, config.delta)
    result = _result(config, protocol, outcome.estimate, truth, true_mean, sq_norm, inside, started, outcome.range_check)
    result.local = {"epsilon0": config.epsilon0, "delta0": config.delta0}
    result.central = central
    result.plan = session_plan_of(protocol, config.n, config.delta)
    result.seconds = time.perf_counter() - started
    return result


def central_guarantee_at(protocol: VectorMeanConfig, n: int, delta: float) -> dict[str, Any]:
    """Central ``(eps, delta)`` of Algorithm 5's shuffled rounds, ``n`` users in each batch.

    The rounds and what each one's reports are (``client/vector_randomizer.py``,
    ``analyzer/vector_mean.py``), with ``D`` the padded dimension and ``K`` the range round's
    Hadamard size:

    * range round, ``sampled`` mode: one report per user, ``(l, row, bit)`` with the coordinate
      ``l`` drawn uniformly and independently of the data, then one-bit Hadamard response about
      coordinate ``l``'s bin at ``eps0/2``. Per report this is a pure ``eps0/2``-LDP randomizer
      (the ratio of two inputs' probabilities of ``(l, row, bit)`` is that of Hadamard response on
      coordinate ``l``), but a coordinate-tagged mixture, not the one-bit Hadamard response whose
      clone decomposition and blanket the accountant knows: it is accounted as a ``generic`` pure
      ``eps0/2``-LDP randomizer, ``n`` reports.
    * range round, ``paper`` mode: ``D`` reports per user, one per coordinate (the coordinate is
      the report's public tag, not random), each one-bit Hadamard response over ``K`` rows at
      ``eps0/(2D)``. The shuffled batch, split by tag, is ``D`` batches of ``n`` reports, batch
      ``l`` a shuffled Hadamard response round on the users' coordinate ``l``: ``D`` composed
      ``hadamard-response`` rounds at ``eps0/(2D)``, ``n`` reports each.
    * mean round: one report per user, ``(l, grid value)``, ``l`` uniform and independent of the
      data, then the projected discrete-Laplace report on coordinate ``l``'s grid at ``eps0/2``
      (``eps0`` when the range round is skipped), every coordinate with the same ``G`` grid levels:
      accounted as the ``laplace-mean`` report on ``G`` levels, whose bounds are the generic ones
      and its privacy blanket. The blanket covers the coordinate-tagged mixture: its floor is the
      scalar report's over ``D`` tags, so its law of ``A`` is a mixture over the coordinate of laws
      each below the scalar extreme pair's in convex order (the argument in
      :mod:`shuffledp.protocol.accounting.blanket`). The same rule as the audit's
      (:func:`shuffledp.audit.claim.plan_guarantee`), so both print one figure. Gaussian noise
      makes it only ``(eps0/2, delta0)``-LDP: the accountant claims no amplification for it, and
      only the local guarantee is reported.

    Each shuffled round's bound is the accountant's (``protocol/accounting/shuffle_round.py``):
    for a ``generic`` pure ``eps``-LDP randomizer the smallest of Feldman, McMillan & Talwar's
    bounds (FOCS 2021, Theorem 3.2 numerical and Theorem 3.1 closed form) and Girgis et al.'s RDP
    bound (CCS 2021), all valid for every pure ``eps``-LDP randomizer; for Hadamard response also
    its own clone decomposition and blanket bound. The rounds are composed two ways, both upper
    bounds, and the smaller is reported, as for the scalar mean
    (:func:`shuffledp.simulation.scalar.central_guarantee_at`): the session accountant
    (``protocol/accounting/session.py``: PLD composition of the rounds' ``delta(eps)`` curves,
    Doroshenko et al. 2022, and RDP composition, the smaller) at ``delta``, and basic composition
    of the per-round bounds, each round at an equal share of ``delta``. Should both exceed the
    local ``eps0`` (tiny ``n``), the local guarantee is reported: the shuffled output is a
    post-processing of the users' ``eps0``-LDP reports.
    """
    rounds: list[dict[str, Any]] = []
    index = 0
    if protocol.range_round:
        bins = max(2, protocol.range_params().padded_bins)
        if protocol.mode == "paper":
            rounds.append({"round": index, "mechanism": "vector-range", "reports_per_user": protocol.padded_dim,
                           "report_epsilon0": protocol.range_epsilon, "accounted_as": "hadamard-response",
                           "num_bins": bins, "composed": protocol.padded_dim})
        else:
            rounds.append({"round": index, "mechanism": "vector-range", "reports_per_user": 1,
                           "report_epsilon0": protocol.range_epsilon, "accounted_as": "generic", "composed": 1})
        index += 1
    mean = {"round": index, "mechanism": "vector-mean", "reports_per_user": 1, "report_epsilon0": protocol.mean_epsilon,
            "accounted_as": "laplace-mean", "grid_levels": protocol.grid_levels, "composed": 1}
    if protocol.noise != "laplace":
        mean["accounted_as"] = None
        return {
            "epsilon": None,
            "delta": None,
            "method": "no shuffled bound for gaussian-mean; local guarantee only "
                      "(Gaussian mean reports are (eps0/2, delta0)-LDP: the accountant claims no amplification)",
            "rounds": rounds + [mean],
        }
    rounds.append(mean)
    return {**account_plan(session_plan_of(protocol, n, delta)), "rounds": rounds}


def session_plan_of(protocol: VectorMeanConfig, n: int, delta: float) -> dict[str, Any]:
    """Algorithm 5's session plan (``docs/accounting.md``), the rounds :func:`central_guarantee_at` describes:
    the range round when it runs (``vector-range``: ``sampled``, one report at ``eps0/2``; ``paper``, ``D``
    reports over ``K`` padded bins at ``eps0/(2D)`` each) and the mean round (``vector-mean`` on its grid),
    ``n`` users in each batch, at the central ``delta``."""
    from shuffledp.protocol.accounting.composition import plan_round, session_plan

    rounds = []
    if protocol.range_round:
        params: dict[str, Any] = {"mode": protocol.mode}
        if protocol.mode == "paper":
            params["padded_bins"] = int(protocol.range_params().padded_bins)
        rounds.append(plan_round("vector-range", protocol.range_epsilon, params, n,
                                 reports_per_user=protocol.padded_dim if protocol.mode == "paper" else 1))
    rounds.append(plan_round("vector-mean", protocol.mean_epsilon, {"grid_levels": protocol.grid_levels, "noise": protocol.noise},
                             n, delta0=protocol.delta0))
    return session_plan(rounds, delta)


def account_plan(plan: dict[str, Any]) -> dict[str, Any]:
    """:func:`shuffledp.protocol.accounting.composition.account_plan` (memoized here, in-process)."""
    import json

    return dict(_account_plan(json.dumps(plan, sort_keys=True)))


@functools.lru_cache(maxsize=32)
def _account_plan(plan_json: str) -> dict[str, Any]:
    import json

    from shuffledp.protocol.accounting.composition import account_plan as account

    return account(json.loads(plan_json))


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
