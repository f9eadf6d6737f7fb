"""The simulation runner: synthetic users through the scalar range -> mean protocol.

The protocol is :class:`~shuffledp.analyzer.scalar_mean.ScalarMeanProtocol`, run by
either engine of :mod:`shuffledp.simulation.engine`:

* ``fast``: vectorized over blocks of users, no serialization or sealing. Users'
  data are generated block by block (see :mod:`shuffledp.simulation.population`); the engine
  keeps one float per user.
* ``messages``: every user is a real :class:`~shuffledp.client.Client`; reports are
  encoded, HPKE-sealed, enveloped, admitted and permuted by the real
  :class:`~shuffledp.shuffler.Shuffler`, and opened by the
  :class:`~shuffledp.analyzer.Analyzer`, over the in-process channel or MQTT.

This module adds what a user of the scalar mean wants beside the estimate: the
exact error model, Theorem 1's bound, the range round's histogram and the central
guarantee.

Randomness here is a seeded ``numpy`` generator, for reproducibility; it is
labelled as simulation randomness in the result. Devices use the OS CSPRNG.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from shuffledp.analyzer.scalar_mean import (
    ScalarMeanConfig,
    ScalarMeanProtocol,
    concentration_radius,
    theorem1_mse_bound,
)
from shuffledp.simulation.dask_engine import check_engine, run_fast_on
from shuffledp.simulation.engine import run_messages
from shuffledp.client.mean_randomizer import noise_variance, rounding_variance
from shuffledp.client.range_randomizer import bin_index
from shuffledp.simulation.population import Population, generated_users, local_means
from shuffledp.simulation.worker_parent import start_worker_parent_for
from shuffledp.protocol.transport.channel import InProcessChannel
from shuffledp.protocol.accounting.composition import check_central_delta, default_central_delta
from shuffledp.protocol.errors import InvalidParameter

PATHS = ("fast", "messages")
Progress = Callable[[str, int], None]


@dataclass(frozen=True)
class SimulationConfig:
    """One simulated run. ``tau=None`` derives the radius from the population (corrected Theorem 1 form)."""

    population: Population
    n: int
    epsilon0: float
    delta0: float = 0.0
    noise: str = "laplace"
    tau: float | None = None
    gamma: float = 0.01
    grid_levels: int = 4096
    central_delta: float | None = None
    seed: int = 0
    path: str = "fast"
    broker: str | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.n, int) and self.n >= 2):
            raise InvalidParameter("n", f"must be an integer >= 2, got {self.n}")
        if self.path not in PATHS:
            raise InvalidParameter("path", f"must be one of {PATHS}, got {self.path!r}")
        if self.broker is not None:
            if self.path != "messages":
                raise InvalidParameter("broker", "a broker carries messages: use the messages path")
            parse_broker(self.broker)
        if self.central_delta is not None:
            check_central_delta(self.central_delta, "central_delta")
        self.protocol_config()  # validates epsilon0, delta0, noise, tau

    @property
    def radius(self) -> float:
        if self.tau is not None:
            return self.tau
        p = self.population
        return min(p.bound, concentration_radius(p.proxy_sigma, self.n, p.m, self.gamma))

    @property
    def delta(self) -> float:
        """Central delta for the shuffled accounting: given, or the default every command uses,
        ``min(1e-6, n^-1.1)`` (:func:`~shuffledp.protocol.accounting.composition.default_central_delta`)."""
        return self.central_delta if self.central_delta is not None else default_central_delta(self.n)

    def protocol_config(self) -> ScalarMeanConfig:
        return ScalarMeanConfig(
            bound=self.population.bound,
            tau=self.radius,
            epsilon0=self.epsilon0,
            delta0=self.delta0,
            noise=self.noise,
            grid_levels=self.grid_levels,
        )


@dataclass
class SimulationResult:
    """Everything a run reports; :meth:`as_dict` is the ``--json`` output."""

    config: dict[str, Any]
    true_mean: float
    population_mean: float
    estimate: float
    error: float
    standard_error: float
    rmse_theory: float
    rmse_theory_population: float
    theorem1_rmse_bound: float
    range_found: tuple[float, float]
    range_contains_true_mean: bool
    fraction_users_in_range: float
    #: The analyzer's own check of the range round (``analyzer/range_check.py``): what it
    #: can tell without the truth. ``range_contains_true_mean`` is what only a simulation knows.
    range_check: dict[str, Any]
    rounds: list[dict[str, Any]]
    local_epsilon: float
    local_delta: float
    central: dict[str, Any]
    seconds: float
    #: The session plan ``central`` was accounted from (``shuffledp account --plan`` reads it).
    plan: dict[str, Any] = field(default_factory=dict)
    randomness: str = "seeded numpy PCG64 (simulation; devices use the OS CSPRNG)"
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _local_means(config: SimulationConfig, progress: Progress | None) -> tuple[np.ndarray, float]:
    """Local means of all users (one float each) and the exact mean of all n*m samples."""
    return local_means(config.population, config.n, config.seed, progress)


def parse_broker(address: str) -> tuple[str, int]:
    """``host:port`` (port defaults to 1883)."""
    host, _, port = address.rpartition(":") if ":" in address else (address, "", "1883")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidParameter("broker", f"must be HOST or HOST:PORT, got {address!r}")
    return host, int(port)


@contextlib.asynccontextmanager
async def party_channels(broker: str | None):
    """Channels for (coordinator, shuffler, client pool): one shared in-process channel,
    or three separate connections to an MQTT broker."""
    if broker is None:
        channel = InProcessChannel()
        yield channel, channel, channel
        return
    from shuffledp.protocol.transport.mqtt_channel import MqttChannel

    host, port, options = broker_connection(broker)
    async with contextlib.AsyncExitStack() as stack:
        channels = [
            await stack.enter_async_context(MqttChannel(host, port, **options.get(role, {})))
            for role in ("analyzer", "shuffler", "client")
        ]
        yield tuple(channels)


def broker_connection(broker: str) -> tuple[str, int, dict[str, dict[str, Any]]]:
    """Where and how each role connects: ``HOST[:PORT]`` (anonymous, plaintext), or the directory
    of a broker made by :mod:`shuffledp.deploy.broker` (its ``credentials.json``: host, port, CA file and
    one account per role; TLS and passwords)."""
    import json
    import os

    if os.path.isdir(broker):
        path = os.path.join(broker, "credentials.json")
        try:
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)
            options: dict[str, dict[str, Any]] = {}
            for user in doc["users"]:
                options.setdefault(
                    user["role"], {"username": user["username"], "password": user["password"], "tls_ca_file": doc["ca_file"]}
                )
            return doc["host"], int(doc["port"]), options
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InvalidParameter("broker", f"{path} is not a broker credentials file ({exc})") from None
    host, port = parse_broker(broker)
    return host, port, {}


def central_guarantee(config: SimulationConfig) -> dict[str, Any]:
    """Central (eps, delta) of the two shuffled rounds, from the amplification accountant.

    Each round is pure eps0/2-LDP (Hadamard response with K bins, then the discrete-Laplace
    mean report); both are upper bounds: the session composition (dp-accounting PLD/RDP of
    the rounds' curves) and the basic composition of per-round bounds at delta/2 each, and
    the smaller is reported. Gaussian reports are (eps0, delta0)-LDP: no amplification is
    claimed. The rounds are the session plan :func:`session_plan_of` gives, accounted by
    :func:`shuffledp.protocol.accounting.composition.account_plan` (what ``shuffledp account --plan`` runs);
    answers are kept in the accountant's cache (one call costs seconds; repeated simulations
    of one configuration pay it once).
    """
    return central_guarantee_at(config.protocol_config(), config.n, config.delta)


def session_plan_of(protocol, n: int, delta: float) -> dict[str, Any]:
    """The scalar protocol's session plan (``docs/accounting.md``): the range round (``hadamard-range`` over
    its padded bins) and the mean round (``projected-mean`` on its grid), each at ``eps0/2`` per report,
    ``n`` users in each batch, accounted at the central ``delta``."""
    from shuffledp.protocol.accounting.composition import plan_round, session_plan

    rounds = [
        plan_round("hadamard-range", protocol.round_epsilon, {"padded_bins": int(protocol.range_params().padded_bins)}, n),
        plan_round("projected-mean", protocol.round_epsilon, {"grid_levels": protocol.grid_levels, "noise": protocol.noise}, n,
                   delta0=protocol.delta0),
    ]
    return session_plan(rounds, delta)


def central_guarantee_at(protocol, n: int, delta: float) -> dict[str, Any]:
    """Central (eps, delta) of the scalar protocol's two shuffled rounds with ``n`` reports per batch.

    Deployed runs pass the smallest batch any round had (``RoundRecord.smallest_batch``):
    a report hides only among its own batch. See :func:`central_guarantee`."""
    if protocol.noise == "gaussian":
        return {
            "epsilon": None,
            "delta": None,
            "method": "none: Gaussian reports are (eps0, delta0)-LDP; no amplification is claimed",
        }
    return dict(_central_for(protocol.round_epsilon, protocol.range_params().padded_bins, n, delta, protocol.grid_levels))


@functools.lru_cache(maxsize=32)
def _central_for(round_epsilon: float, padded_bins: int, n: int, delta: float, grid_levels: int | None = None) -> dict[str, Any]:
    """The scalar protocol's two rounds by the accountant's one rule
    (:func:`shuffledp.protocol.accounting.composition.account_plan` of :func:`session_plan_of`'s plan)."""
    from shuffledp.protocol.accounting.composition import account_plan, plan_round, session_plan

    plan = session_plan([
        plan_round("hadamard-range", round_epsilon, {"padded_bins": int(padded_bins)}, n),
        plan_round("projected-mean", round_epsilon, {"grid_levels": grid_levels, "noise": "laplace"}, n),
    ], delta)
    return account_plan(plan)


def run_simulation(config: SimulationConfig, progress: Progress | None = None, client: Any = None) -> SimulationResult:
    """Run one simulation end to end and report estimate, error, theory and privacy.

    ``client``: a ``dask.distributed.Client`` whose workers run the fast engine's blocks, making
    the users' data from the population's seeds (:mod:`shuffledp.simulation.dask_engine`); the
    result is the local engine's to the last bit."""
    check_engine(config.path, client)
    started = time.perf_counter()
    if config.path == "messages":
        start_worker_parent_for(config.n)  # the workers' parent imports while the users' data is made
    protocol = config.protocol_config()
    means, true_mean = _local_means(config, progress)
    scalar_mean = ScalarMeanProtocol(protocol)
    if config.path == "fast":
        data = means if client is None else generated_users(config.population, config.n, config.seed)
        run = run_fast_on(scalar_mean, data, config.seed, progress, client)
        extra: dict[str, Any] = {}
    else:
        run = run_messages(scalar_mean, means, config.seed, config.broker, progress)
        extra = {"transport": run.transport}
    found, mean, mean_params = run.result.found_range, run.result.mean, run.result.mean_params
    rounds = [r.as_dict() for r in run.rounds]
    n, pop = config.n, config.population
    # Exact error model of round 2 given the range announced in round 1: clipping bias
    # plus (noise + randomized-rounding) variance over n.
    bias = float(np.clip(means, mean_params.lower, mean_params.upper).mean() - true_mean)
    variance = (
        noise_variance(mean_params, protocol.round_epsilon, protocol.delta0)
        + float(rounding_variance(means, mean_params).mean())
    ) / n
    rmse = math.sqrt(bias**2 + variance)
    rmse_population = math.sqrt(bias**2 + variance + pop.variance / (n * pop.m))
    if progress:
        progress("privacy accounting", 0)
    accounting_started = time.perf_counter()
    central = central_guarantee(config)  # the accountant's libraries load here, and only for an answer not in its cache
    extra["accounting_seconds"] = time.perf_counter() - accounting_started
    in_range = float(np.mean((means >= found.lower) & (means <= found.upper)))
    range_params = protocol.range_params()
    true_bins = np.bincount(bin_index(means, range_params), minlength=range_params.num_bins) / n
    extra["round0_histogram"] = {
        "bin_centers": [range_params.bin_center(i) for i in range(range_params.num_bins)],
        "estimated_fractions": found.frequencies.tolist(),
        "true_fractions": true_bins.tolist(),
    }
    config_dict = asdict(config)
    config_dict["tau"] = config.radius
    return SimulationResult(
        config=config_dict,
        true_mean=true_mean,
        population_mean=pop.mean,
        estimate=mean.estimate,
        error=mean.estimate - true_mean,
        standard_error=mean.standard_error,
        rmse_theory=rmse,
        rmse_theory_population=rmse_population,
        theorem1_rmse_bound=math.sqrt(theorem1_mse_bound(protocol, n)),
        range_found=(found.lower, found.upper),
        range_contains_true_mean=bool(found.lower <= true_mean <= found.upper),
        fraction_users_in_range=in_range,
        # where tau came from, for the verdict's guarantee (alpha + gamma, or alpha for a user-given tau)
        range_check={**run.result.range_check.as_dict(), "tau_from": "user" if config.tau is not None else "data model",
                     "gamma": None if config.tau is not None else config.gamma},
        rounds=rounds,
        local_epsilon=config.epsilon0,
        local_delta=config.delta0,
        central=central,
        seconds=time.perf_counter() - started,
        plan=session_plan_of(protocol, n, config.delta),
        extra=extra,
    )
