"""Simulated users through multi-message summation, scalar or vector, on either engine.

Users' local means come from the same synthetic populations as the mean protocols
(:class:`~shuffledp.simulation.population.Population`, :class:`~shuffledp.simulation.vector_population.VectorPopulation`).
The parameters come from the chooser at the requested central ``(epsilon, delta)``
(``protocol/mechanisms/summation_params.py``); the result reports the estimate of the mean of
the (clipped) local means, its error against the exact standard deviation, the
budget split, messages and bytes per user, and the modulus.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from shuffledp.analyzer.summation import (
    SummationProtocol,
    clipped_sum,
    scalar_clipped_sum,
    scalar_rounding_variance,
    vector_rounding_variance,
    vector_sum_variance,
)
from shuffledp.simulation.dask_engine import check_engine, run_fast_on
from shuffledp.simulation.engine import ENGINES, run_messages
from shuffledp.simulation.population import Population, block_samples, user_blocks
from shuffledp.protocol.accounting.composition import check_central_delta
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.summation_params import (
    SummationChoice,
    choose_scalar_sum,
    choose_vector_sum,
    scalar_sum_variance,
)
from shuffledp.simulation.vector_population import VectorPopulation

Progress = Callable[[str, int], None]
SUM_PROTOCOLS = ("sum", "vector-sum")


@dataclass(frozen=True)
class SummationConfig:
    """One summation simulation: ``protocol`` is ``sum`` (scalar) or ``vector-sum``."""

    protocol: str
    population: Population | VectorPopulation
    n: int
    epsilon: float
    delta: float
    radius: float | None = None
    seed: int = 0
    path: str = "fast"
    broker: str | None = None

    def __post_init__(self) -> None:
        check_central_delta(self.delta, "delta")  # the central target: a number in (0, 1)
        if self.protocol not in SUM_PROTOCOLS:
            raise InvalidParameter("protocol", f"must be one of {SUM_PROTOCOLS}, got {self.protocol!r}")
        if self.path not in ENGINES:
            raise InvalidParameter("path", f"must be one of {tuple(ENGINES)}, got {self.path!r}")
        if self.broker is not None and self.path != "messages":
            raise InvalidParameter("broker", "a broker carries messages: use the messages path")
        if self.radius is not None and not (math.isfinite(self.radius) and self.radius > 0):
            raise InvalidParameter("radius", f"must be a positive number, got {self.radius}")

    @property
    def clip_radius(self) -> float:
        """l2 clipping radius of vector summation: given, or the data bound."""
        return self.radius if self.radius is not None else self.population.bound


def _local_data(config: SummationConfig) -> np.ndarray:
    pop = config.population
    if isinstance(pop, VectorPopulation):
        return pop.block_local_means(pop.blocks(config.n, config.seed))[0]
    return np.concatenate([block_samples(pop, block).mean(axis=1) for block in user_blocks(pop, config.n, config.seed)])


def run_summation(config: SummationConfig, progress: Progress | None = None, client: Any = None) -> dict[str, Any]:
    """Choose parameters, run the protocol on the configured engine, and report. ``client``: a
    ``dask.distributed.Client`` whose workers run the fast engine's blocks (the same result)."""
    check_engine(config.path, client)
    started = time.perf_counter()
    data = _local_data(config)
    n = config.n
    choice: SummationChoice[Any]
    truth: float | np.ndarray
    if config.protocol == "sum":
        bound = config.population.bound
        scalar = choose_scalar_sum(n, config.epsilon, config.delta, -bound, bound)
        choice, protocol = scalar, SummationProtocol(scalar.params, config.epsilon, config.delta)
        truth = scalar_clipped_sum(data, scalar.params)
        variance = scalar_sum_variance(scalar.params, config.epsilon, scalar_rounding_variance(data, scalar.params))
    else:
        seed = int(np.random.SeedSequence([config.seed, 0x2077]).generate_state(1, np.uint64)[0] >> 1)
        vector = choose_vector_sum(n, config.epsilon, config.delta, data.shape[1], config.clip_radius, seed)
        choice, protocol = vector, SummationProtocol(vector.params, config.epsilon, config.delta)
        truth = clipped_sum(data, config.clip_radius)
        variance = vector_sum_variance(vector.params, vector_rounding_variance(data, vector.params))
    if config.path == "fast":
        run = run_fast_on(protocol, data, config.seed, progress, client)
    else:
        run = run_messages(protocol, data, config.seed, config.broker, progress)
    estimate = run.result.estimate
    error = np.asarray(estimate.mean) - np.asarray(truth) / n
    round_ = run.rounds[0]
    return {
        "protocol": config.protocol,
        "config": {**asdict(config), "population": asdict(config.population)},
        "path": config.path,
        "transport": run.transport,
        "parameters": asdict(choice.params),
        "true_mean": (np.asarray(truth) / n).tolist(),
        "estimate": np.asarray(estimate.mean).tolist(),
        "error": error.tolist(),
        "error_l2": float(np.linalg.norm(error)),
        "rmse_theory": math.sqrt(variance) / n,
        # The guarantee is (epsilon, delta_spent): the noise is calibrated to the target epsilon, and
        # the split-and-mix analysis and the noise spend split_delta + noise_delta <= the target delta.
        "central": {
            "epsilon": config.epsilon,
            "delta": choice.split_delta + choice.noise_delta,
            "epsilon_target": config.epsilon,
            "delta_target": config.delta,
            "delta_spent": choice.split_delta + choice.noise_delta,
            "split_delta": choice.split_delta,
            "noise_delta": choice.noise_delta,
            "method": "split and mix (BBGN 2020 bound) + "
            + ("discrete Laplace from Pólya shares (pure)" if config.protocol == "sum" else "Skellam RDP (Agarwal et al. 2021)"),
        },
        "wrap_probability": choice.wrap_probability,
        "messages_per_user": choice.messages_per_user,
        "bits_per_message": choice.bits_per_message,
        "bytes_per_user": round_.envelope_bytes / n,
        "messages": round_.messages,
        "rejected_at_shuffler": round_.rejected_at_shuffler,
        "rejected_at_analyzer": round_.rejected_at_analyzer,
        "randomness": "seeded numpy PCG64 (simulation; devices use the OS CSPRNG)",
        "seconds": time.perf_counter() - started,
    }


def format_summation(result: dict[str, Any]) -> str:
    """The human summary ``shuffledp simulate --protocol sum|vector-sum`` prints."""
    c = result["config"]
    p = result["parameters"]
    scalar = result["protocol"] == "sum"
    title = "scalar multi-message summation (Balle et al. 2020)" if scalar else "vector multi-message summation (Huang et al. 2021, Lemma 5)"
    lines = [f"shuffledp simulate --protocol {result['protocol']}: {title}, {result['path']} path"]
    if result["path"] == "messages":
        lines[0] += f" ({result['transport']})"
    lines.append(f"  users n = {c['n']:,}")
    if scalar:
        lines += [
            f"  true mean of clipped values   {result['true_mean']:.6f}",
            f"  estimate                      {result['estimate']:.6f}",
            f"  error                         {result['error']:+.6f}   ({result['error'] / result['rmse_theory']:+.2f} x exact RMSE)",
            f"  exact RMSE                    {result['rmse_theory']:.6f}   (discrete Laplace + randomized rounding)",
            f"  fixed point: p = {p['precision']}, modulus q = {p['modulus']} ({result['bits_per_message']} bits)",
        ]
    else:
        lines += [
            f"  dimension d = {p['dim']} (rotated in {1 << (p['dim'] - 1).bit_length()}), l2 clipping radius {p['radius']:g}",
            f"  l2 error of the mean          {result['error_l2']:.6f}   (exact RMSE {result['rmse_theory']:.6f}: Skellam + rounding)",
            f"  grid: {p['levels']} levels per radius, Skellam mu = {p['mu']:.4g}, modulus q = {p['modulus']} ({result['bits_per_message']} bits)",
        ]
    lines += [
        f"  messages per user {result['messages_per_user']}, {result['bytes_per_user']:.0f} B of envelopes per user, {result['messages']:,} messages in all",
        *format_summation_central(result["central"], scalar),
        f"  wrap-around probability <= {result['wrap_probability']:.2g};  no local guarantee: privacy needs the shuffler",
        f"  randomness: {result['randomness']};  {result['seconds']:.2f} s",
    ]
    return "\n".join(lines)


def format_summation_central(central: dict[str, Any], scalar: bool) -> list[str]:
    """The central guarantee of a summation round: (eps, the delta spent); eps is the target the noise
    is calibrated to; delta's target and what it is spent on, by the split-and-mix analysis and by the noise."""
    noise = "the noise (discrete Laplace from Pólya shares: pure)" if scalar else "the noise (Skellam, RDP: Agarwal et al. 2021)"
    return [
        f"  central privacy  eps = {central['epsilon']:g}, delta = {central['delta_spent']:.2g}"
        f"   (eps: the target, the noise is calibrated to it)",
        f"  delta            target {central['delta_target']:.3g}; spent {central['delta_spent']:.2g} = "
        f"{central['split_delta']:.2g} by the split-and-mix analysis (BBGN 2020 bound) + {central['noise_delta']:.2g} by {noise}",
    ]


def plot_summation(result: dict[str, Any], path: str) -> None:
    """Scalar: the estimate against the truth with bands of 1 and 2 exact RMSEs. Vector: per-coordinate
    estimate against the truth, with ±2 exact per-coordinate RMSE bars."""
    from shuffledp.progress import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    rmse = result["rmse_theory"]
    if result["protocol"] == "sum":
        t = result["true_mean"]
        ax.axvspan(t - 2 * rmse, t + 2 * rmse, color="tab:blue", alpha=0.12, label="±2 exact RMSE")
        ax.axvspan(t - rmse, t + rmse, color="tab:blue", alpha=0.25, label="±1 exact RMSE")
        ax.axvline(t, color="black", lw=2, label=f"true mean {t:.4f}")
        ax.plot([result["estimate"]], [0.5], "o", color="tab:red", ms=10, label=f"estimate {result['estimate']:.4f}")
        span = max(3 * rmse, abs(result["estimate"] - t) * 1.3)
        ax.set_xlim(t - span, t + span)
        ax.set_ylim(0, 1)
        ax.set_yticks([])
        ax.set_xlabel("mean")
    else:
        error = np.asarray(result["error"])
        k = np.arange(len(error))
        per_coordinate = rmse / math.sqrt(len(error))
        ax.axhspan(-2 * per_coordinate, 2 * per_coordinate, color="tab:blue", alpha=0.12, label="±2 exact RMSE per coordinate")
        ax.axhspan(-per_coordinate, per_coordinate, color="tab:blue", alpha=0.25, label="±1 exact RMSE per coordinate")
        ax.axhline(0.0, color="black", lw=1)
        ax.plot(k, error, "o", color="tab:red", ms=5, label="estimate − true mean (clipped)")
        ax.set_ylim(-max(3 * per_coordinate, 1.2 * np.abs(error).max()), max(3 * per_coordinate, 1.2 * np.abs(error).max()))
        ax.set_xlabel("coordinate")
        ax.set_ylabel("error of the mean")
    ax.legend(fontsize=7, loc="upper left")
    c = result["central"]
    ax.set_title(
        f"{result['protocol']}: n = {result['config']['n']:,}, central (ε, δ) = ({c['epsilon']:g}, {c['delta_spent']:.2g}) "
        f"(δ target {c['delta_target']:.2g}), "
        f"{result['messages_per_user']} messages/user, {result['path']} path",
        fontsize=9,
    )
    save_figure(fig, path)
