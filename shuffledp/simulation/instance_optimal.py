"""Simulated users through the instance-optimal clipped mean (``analyzer/instance_optimal.py``),
local or shuffle model, on either engine.

Users' local means come from the Gaussian vector population of the vector protocols
(:class:`~shuffledp.simulation.vector_population.VectorPopulation`: coordinate k has mean
``mu sin(k + 1)``, samples in ``[-B, B]``), so the public bound on a local mean's norm
is ``B sqrt(d)``. The result reports the estimate against the users' mean and the
population mean, the centre and clipping radius the analyzer found, the fraction of
users the radius clipped, each round's budget and the session's central guarantee.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from shuffledp.analyzer.instance_optimal import MODELS, InstanceOptimalConfig, InstanceOptimalProtocol
from shuffledp.simulation.dask_engine import check_engine, run_fast_on
from shuffledp.simulation.engine import ENGINES, describe_engine, run_messages
from shuffledp.protocol.accounting.composition import check_central_delta
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.simulation.vector_population import VectorPopulation

Progress = Callable[[str, int], None]


@dataclass(frozen=True)
class InstanceOptimalSimulation:
    """One simulation: ``n`` users of ``population``, the session's ``(epsilon, delta)``."""

    population: VectorPopulation
    n: int
    epsilon: float
    delta: float
    model: str = "shuffle"
    seed: int = 0
    path: str = "fast"
    broker: str | None = None

    def __post_init__(self) -> None:
        check_central_delta(self.delta, "delta")  # the central target: a number in (0, 1)
        if self.model not in MODELS:
            raise InvalidParameter("model", f"must be one of {MODELS}, got {self.model!r}")
        if self.path not in ENGINES:
            raise InvalidParameter("path", f"must be one of {tuple(ENGINES)}, got {self.path!r}")
        if self.broker is not None and self.path != "messages":
            raise InvalidParameter("broker", "a broker carries messages: use the messages path")
        if self.population.kind != "gaussian":
            raise InvalidParameter("population", "the instance-optimal mean takes the gaussian vector population")

    def protocol_config(self) -> InstanceOptimalConfig:
        radius = self.population.bound * math.sqrt(self.population.dim)
        return InstanceOptimalConfig(
            self.population.dim, self.n, radius, self.epsilon, self.delta, model=self.model, rotation_seed=self.seed
        )


def run_instance_optimal(config: InstanceOptimalSimulation, progress: Progress | None = None, client: Any = None) -> dict[str, Any]:
    """Run one simulation end to end; a JSON-ready dict. ``client``: a ``dask.distributed.Client``
    whose workers run the fast engine's blocks (the same result)."""
    check_engine(config.path, client)
    started = time.perf_counter()
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, 0x10E]))
    data, _ = config.population.local_means(rng, config.n)
    if progress:
        progress("local means", config.n)
    protocol = InstanceOptimalProtocol(config.protocol_config())
    if config.path == "fast":
        run = run_fast_on(protocol, data, config.seed, progress, client)
    else:
        run = run_messages(protocol, data, config.seed, config.broker, progress)
    outcome = run.result
    users_mean = data.mean(axis=0)
    distances = np.linalg.norm(data - outcome.center, axis=1)
    budgets = protocol.budgets
    return {
        "config": {**asdict(config), "population": asdict(config.population), "radius_bound": protocol.config.radius},
        "engine": run.engine,
        "transport": run.transport,
        "estimate": outcome.estimate.tolist(),
        "users_mean": users_mean.tolist(),
        "population_mean": config.population.means.tolist(),
        "error_vs_users_mean": float(np.linalg.norm(outcome.estimate - users_mean)),
        "error_vs_population_mean": float(np.linalg.norm(outcome.estimate - config.population.means)),
        "nonprivate_error_vs_population_mean": float(np.linalg.norm(users_mean - config.population.means)),
        "center": outcome.center.tolist(),
        "center_distance_to_users_mean": float(np.linalg.norm(outcome.center - users_mean)),
        "clip_radius": outcome.threshold.radius,
        "fraction_clipped": float(np.mean(distances > outcome.threshold.radius)),
        "rounds": [r.as_dict() for r in run.rounds],
        "privacy": {
            "session_epsilon": budgets.session_epsilon,
            "session_delta": budgets.session_delta,
            "method": budgets.method,
            "round_epsilon0": [budgets.tree_epsilon0, budgets.norm_epsilon0, budgets.mean_epsilon0],
            "per_round": list(budgets.per_round),
        },
        "seconds": time.perf_counter() - started,
    }


def format_instance_optimal(result: dict[str, Any]) -> str:
    """A human-readable summary of :func:`run_instance_optimal`'s result."""
    cfg, privacy = result["config"], result["privacy"]
    eps0 = ", ".join(f"{e:.3g}" for e in privacy["round_epsilon0"])
    lines = [
        f"instance-optimal clipped mean ({cfg['model']} model), n = {cfg['n']}, d = {cfg['population']['dim']}, "
        + describe_engine(result["engine"], result["transport"]),
        f"  session: ({privacy['session_epsilon']:.4g}, {privacy['session_delta']:.3g}) central, "
        f"{privacy['method']}; rounds' epsilon0: {eps0}",
        f"  centre: {result['center_distance_to_users_mean']:.4g} from the users' mean; "
        f"clipping radius {result['clip_radius']:.4g} clips {100 * result['fraction_clipped']:.2f} % of users",
        f"  l2 error: {result['error_vs_users_mean']:.4g} against the users' mean, "
        f"{result['error_vs_population_mean']:.4g} against the population mean "
        f"(non-private: {result['nonprivate_error_vs_population_mean']:.4g})",
        f"  {result['seconds']:.1f} s",
    ]
    return "\n".join(lines)


def plot_instance_optimal(result: dict[str, Any], path: str) -> None:
    """Estimate against the users' and the population mean, coordinate by coordinate."""
    from shuffledp.progress import pyplot, save_figure

    plt = pyplot()
    fig, (ax, err_ax) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, gridspec_kw={"height_ratios": (3, 2)})
    k = np.arange(len(result["estimate"]))
    users = np.asarray(result["users_mean"])
    err_ax.axhline(0.0, color="k", lw=0.8)
    err_ax.plot(k, np.asarray(result["estimate"]) - users, "rx", label="estimate - users' mean")
    err_ax.plot(k, np.asarray(result["population_mean"]) - users, "k.", ms=3, label="population - users' mean (sampling)")
    err_ax.set_ylabel("error")
    err_ax.legend(fontsize=8)
    ax.plot(k, result["population_mean"], "k-", lw=1, label="population mean")
    ax.plot(k, result["users_mean"], "g.", label="users' mean")
    ax.plot(k, result["estimate"], "rx", label=f"estimate ({result['config']['model']})")
    ax.plot(k, result["center"], "b+", alpha=0.6, label="centre (round 1)")
    err_ax.set_xlabel("coordinate")
    ax.set_title(
        f"l2 error {result['error_vs_users_mean']:.3g} vs users' mean; clip radius {result['clip_radius']:.3g}", fontsize=10
    )
    ax.legend(fontsize=8)
    save_figure(fig, path)
