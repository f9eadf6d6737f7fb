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
from clipping, zero when every range holds its users, is reported separately). Both the
total-variation error ``(1/2)||p_hat - p||_1`` (what the estimators are compared by) and the
l2 error are reported, each with its theory. The estimates are not projected onto the simplex.

Why the vector estimator's error is not monotone in m (:func:`vector_rounds`). Its rotated
coordinates lie in ``[-B, B]``, ``B = 1/sqrt(D)``, and concentrate within ``tau'`` of their mean,
``tau'`` shrinking like ``1/sqrt(m)``. While ``tau' >= B`` the range round would have one bin, so it
is skipped and the mean round gets the whole ``eps0`` over ``[-B, B]``. Once ``tau' < B`` (m = 50
to 1000 at the defaults k = 64, n = 50,000) the range round runs: it takes half the budget, and the
mean round's window is ``+-3 tau'`` (width ``6 tau'``, up to 3 times ``2B``) at ``eps0/2``. The
per-report Laplace noise grows by the product of the two factors (3.8x at m = 100), and the TV
error with it; the range round only pays once ``6 tau' / (eps0/2)`` falls below ``2B / eps0``,
i.e. ``tau' < B/6``. :func:`vector_one_round` runs the same users through the one-round
protocol, to measure what the range round costs.

Privacy (:func:`estimator_privacy`): both are user-level ``eps0``-LDP. The oracle is one block
Hadamard response round at ``eps0``; the vector estimator's rounds are accounted as ``shuffledp
vector`` accounts them (:func:`shuffledp.simulation.vector.central_guarantee_at`). The central
``(eps, delta)`` after shuffling the ``n`` reports of each round comes from the accountant; where
it has no bound for a round, the result says "local guarantee only".
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from shuffledp.analyzer.frequency import decode_hadamard_response, hadamard_response_variance
from shuffledp.analyzer.vector_mean import VectorMeanAccumulator, VectorMeanProtocol
from shuffledp.client.hadamard_response import choose_hadamard_response, randomize_hadamard_response
from shuffledp.client.mean_randomizer import PerUserGrid, noise_variance
from shuffledp.protocol.accounting.composition import check_central_delta, default_central_delta
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.randomness import SeededSource
from shuffledp.simulation.engine import ENGINES, run_fast
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
    #: Central delta of the shuffled guarantees (:func:`estimator_privacy`); None: the default every
    #: command uses, ``min(1e-6, n^-1.1)`` (:attr:`central_delta`).
    delta: float | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.n, int) and self.n >= 2):
            raise InvalidParameter("n", f"must be an integer >= 2, got {self.n}")
        if self.delta is not None:
            check_central_delta(self.delta, "delta")
        if self.path not in ENGINES:
            raise InvalidParameter("path", f"must be one of {tuple(ENGINES)}, got {self.path!r}")
        if self.broker is not None and self.path != "messages":
            raise InvalidParameter("broker", "a broker carries messages: use the messages path")
        self.population()

    @property
    def central_delta(self) -> float:
        """The central delta: given, or :func:`~shuffledp.protocol.accounting.composition.default_central_delta`."""
        return self.delta if self.delta is not None else default_central_delta(self.n)

    def vector_config(self) -> VectorSimulationConfig:
        """The vector estimator's run: Algorithm 5 on the users' empirical distributions."""
        return VectorSimulationConfig(
            self.population(), self.n, self.epsilon0, gamma=self.gamma, seed=self.seed, path=self.path, broker=self.broker,
            central_delta=self.central_delta,
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
    # One sample per user, drawn from p on its own stream: distributed as a user's first sample
    # (the vector estimator's users are drawn from the population's own seeded blocks).
    symbols = rng.choice(config.k, size=config.n, p=p)
    estimate = decode_hadamard_response(randomize_hadamard_response(symbols, params, source), params)
    if progress:
        progress("frequency oracle", config.n)
    variance = hadamard_response_variance(p, config.n, params) + p * (1 - p) / config.n
    return estimate, variance


def vector_rounds(config: DistributionConfig) -> dict[str, Any]:
    """The vector estimator's rounds at this m, from public parameters only, and the one-round
    alternative (no range round, the mean round at ``eps0`` over ``[-B, B]``).

    ``noise_sd``: exact standard deviation of one mean report's noise (discrete Laplace on
    ``grid_levels`` levels over the window, in data units); the noise term of the estimate's
    variance is ``D noise_sd^2 / n`` per symbol, so while it dominates the TV error scales with
    ``noise_sd``. ``range_round_from_m``: the smallest m at which the range round runs
    (``tau' < B``); ``range_round_pays_from_m``: the smallest m at which its mean round's noise is
    no larger than the one-round protocol's (about ``tau' < B/6``)."""
    pc = config.vector_config().protocol_config()
    bound, tau = pc.rotated_bound, pc.range_params().tau

    def sd(width: float, epsilon: float) -> float:
        grid = PerUserGrid(np.array([0.0]), np.array([width]), pc.noise, pc.grid_levels)
        return float(math.sqrt(np.asarray(noise_variance(grid, epsilon, pc.delta0))[0]))

    window = 6.0 * tau if pc.range_round else 2.0 * bound
    noise_sd, one_round_sd = sd(window, pc.mean_epsilon), sd(2.0 * bound, pc.epsilon0)
    # tau'(m) = c / sqrt(m) (VectorPopulation.rotated_radius), uncapped
    c = config.population().rotated_radius(config.n, pc.padded_dim, config.gamma) * math.sqrt(config.m)
    first = math.floor((c / bound) ** 2) + 1
    while c / math.sqrt(first) >= bound:  # floating-point edge
        first += 1
    pays = first
    while sd(6.0 * c / math.sqrt(pays), pc.epsilon0 / 2.0) > one_round_sd:
        pays *= 2
    low = max(first, pays // 2)
    while low < pays:  # smallest m whose two-round noise is no larger (monotone in m)
        mid = (low + pays) // 2
        if sd(6.0 * c / math.sqrt(mid), pc.epsilon0 / 2.0) > one_round_sd:
            low = mid + 1
        else:
            pays = mid
    return {
        "padded_dim": pc.padded_dim,
        "rotated_bound": bound,
        "rotated_tau": tau,
        "range_bins": pc.range_params().num_bins,
        "range_round": pc.range_round,
        "mean_epsilon": pc.mean_epsilon,
        "mean_window_width": window,
        "noise_sd": noise_sd,
        "one_round_noise_sd": one_round_sd,
        "noise_ratio_to_one_round": noise_sd / one_round_sd,
        "range_round_from_m": first,
        "range_round_pays_from_m": pays,
    }


def oracle_plan(config: DistributionConfig, delta: float | None = None) -> dict[str, Any]:
    """The oracle's session plan (``docs/accounting.md``): one ``block-hadamard-response`` round over the
    ``k`` symbols in the client's block count, one report per user at ``eps0``, ``n`` users in the batch."""
    from shuffledp.protocol.accounting.composition import plan_round, session_plan

    hr = choose_hadamard_response(config.k, config.epsilon0)
    round_ = plan_round("block-hadamard-response", config.epsilon0, {"k": int(config.k), "blocks": int(hr.blocks)}, config.n)
    return session_plan([round_], config.central_delta if delta is None else delta)


def estimator_privacy(config: DistributionConfig, delta: float | None = None) -> dict[str, dict[str, Any]]:
    """Each estimator's user-level guarantee: local ``(eps0, 0)`` per user and the central ``(eps, delta)``
    after shuffling each round's ``n`` reports, at ``delta`` (default ``config.central_delta``), with the
    session ``plan`` each was accounted from (``shuffledp account --plan`` reads it).

    * oracle: one ``block-hadamard-response`` round at ``eps0`` (``client/hadamard_response.py``
      with the client's block count), accounted by the one rule every protocol's session is
      (:func:`shuffledp.protocol.accounting.composition.account_plan`).
    * vector: Algorithm 5's rounds as ``shuffledp vector`` accounts them
      (:func:`shuffledp.simulation.vector.central_guarantee_at`: each round accounted for the reports
      it sends, composed; Gaussian noise: local guarantee only)."""
    from shuffledp.simulation.vector import account_plan, central_guarantee_at, session_plan_of

    delta = config.central_delta if delta is None else check_central_delta(delta)
    hr = choose_hadamard_response(config.k, config.epsilon0)
    pc = config.vector_config().protocol_config()
    plan = oracle_plan(config, delta)
    oracle: dict[str, Any] = {
        "local_epsilon0": float(config.epsilon0),
        "local_delta0": 0.0,
        "rounds": [{"mechanism": "block-hadamard-response", "reports_per_user": 1, "report_epsilon0": config.epsilon0,
                    "accounted_as": "block-hadamard-response", "num_blocks": hr.blocks}],
        "central": account_plan(plan),
        "plan": plan,
    }
    central = central_guarantee_at(pc, config.n, delta)
    rounds = central.pop("rounds")
    vector: dict[str, Any] = {
        "local_epsilon0": float(sum(r["report_epsilon0"] * r["reports_per_user"] for r in rounds)),
        "local_delta0": float(pc.delta0),
        "rounds": rounds,
        "central": central,
        "plan": session_plan_of(pc, config.n, delta),
    }
    for entry in (oracle, vector):
        if entry["central"].get("epsilon") is None and "local guarantee only" not in entry["central"]["method"]:
            entry["central"]["method"] = f"local guarantee only ({entry['central']['method']})"
    return {"oracle": oracle, "vector": vector}


def _tv(estimate: np.ndarray, p: np.ndarray) -> float:
    return float(0.5 * np.abs(estimate - p).sum())


def vector_one_round(config: DistributionConfig, progress: Progress | None = None) -> dict[str, Any]:
    """The same users and seed through the vector protocol *without* its range round (the mean
    round at ``eps0`` over the public ``[-B, B]``, as the protocol runs when ``tau' >= B``): the
    counterfactual that measures what the range round costs at this m. Fast engine only.

    Returns the TV and l2 errors against ``p`` and their theory (the exact error model of the
    announced ranges plus the sampling variance, as :func:`run_distribution`)."""
    pc = config.vector_config().protocol_config()
    one = dataclasses.replace(pc, rotated_tau=pc.rotated_bound)  # one bin: the range round is skipped
    population = config.population()
    p = population.probabilities
    run = run_fast(VectorMeanProtocol(one), population.users(config.n, config.seed), config.seed, progress)
    ranges = run.result.ranges
    truth = VectorMeanAccumulator(one, ranges)
    for block in population.blocks(config.n, config.seed):
        means, _ = population.block_local_means([block])
        truth.add_truth(one.rotation.apply(means))
    truth.n = run.result.reports
    variance = truth.variance() + p * (1 - p) / (config.n * config.m)
    estimate = run.result.estimate
    return {
        "range_round": one.range_round,
        "mean_epsilon": one.mean_epsilon,
        "tv_error": _tv(estimate, p),
        "tv_theory": _expected_tv(variance),
        "l2_error": float(np.linalg.norm(estimate - p)),
        "l2_theory": float(math.sqrt(variance.sum())),
    }


def run_distribution(config: DistributionConfig, progress: Progress | None = None, client: Any = None) -> dict[str, Any]:
    """Both estimators on the same population; errors (TV and l2) against p with their theory,
    the vector estimator's rounds, and each estimator's privacy (:func:`estimator_privacy`).
    ``client``: a ``dask.distributed.Client`` that runs the vector estimator's blocks
    (:func:`~shuffledp.simulation.vector.run_vector_simulation`; the oracle runs here)."""
    p = config.population().probabilities
    oracle, oracle_var = oracle_estimate(config, progress)
    vector = run_vector_simulation(config.vector_config(), progress=progress, client=client)
    vector_var = vector.variance_per_coordinate + p * (1 - p) / (config.n * config.m)
    rows = []
    for name, estimate, variance in (("oracle", oracle, oracle_var), ("vector", vector.estimate, vector_var)):
        error = estimate - p
        rows.append(
            EstimatorError(
                estimator=name,
                tv_error=_tv(estimate, p),
                tv_theory=_expected_tv(variance),
                l2_error=float(np.linalg.norm(error)),
                l2_theory=float(math.sqrt(variance.sum())),
            )
        )
    privacy = estimator_privacy(config)
    return {
        "config": asdict(config),
        "estimators": [{**asdict(r), "privacy": privacy[r.estimator]} for r in rows],
        "vector_ranges_hit": vector.fraction_coordinates_ranges_hit,
        "vector_rotated_tau": vector.config["rotated_tau"],
        "vector_rounds": vector_rounds(config),
    }
