"""Throughput of the vectorized (--fast) scalar range -> mean protocol, on one core.

Measures users per second for the two rounds (Hadamard range randomizer + FWHT
decoder, projected-mean randomizer + average), given the users' local means, and
separately the cost of generating m = 10 samples per user. Baselines in the same
run, so the ratios survive a noisy machine:

* ``numpy_uniform``: drawing one uniform double per user (the floor any
  randomizer pays), so ``users_per_s / uniforms_per_s`` is machine-independent-ish;
* ``naive``: the same mechanisms written per user in Python with the dense
  n x K decoder (what a direct transcription of Algorithms 1-4 does), on a
  smaller n, scaled per user.

Run: ``python benchmarks/bench_fast_path.py [--quick] [--out DIR]``; writes fast_path.json into the
output folder (default ``bench-out/``).
"""

from __future__ import annotations

import math
import sys

import numpy as np

from _common import arguments, best_of, parse, pin_one_core, write_result

from shuffledp.analyzer.scalar_mean import ScalarMeanConfig, estimate_mean, estimate_range
from shuffledp.client.mean_randomizer import randomize_mean
from shuffledp.client.range_randomizer import keep_probability, randomize_range
from shuffledp.simulation.population import Population
from shuffledp.protocol.mechanisms.randomness import SeededSource

N = 1_000_000
N_NAIVE = 20_000
M = 10
QUICK = {"n": 20_000, "n_naive": 1_000, "repeats": 1}


def protocol_run(means: np.ndarray, config: ScalarMeanConfig, seed: int) -> float:
    source = SeededSource(seed)
    rows, bits = randomize_range(means, config.range_params(), config.round_epsilon, source)
    found = estimate_range(rows, bits, config)
    params = config.mean_params(found)
    values = randomize_mean(means, params, config.round_epsilon, source)
    return estimate_mean(values, params).estimate


def naive_run(means: np.ndarray, config: ScalarMeanConfig, rng: np.random.Generator) -> float:
    """Per-user Python loop with the dense n x K decoder of Algorithm 3 step 6."""
    from scipy.linalg import hadamard

    range_params = config.range_params()
    k = range_params.padded_bins
    h = hadamard(k)
    p = keep_probability(config.round_epsilon)
    c = 1.0 / math.tanh(config.round_epsilon / 2)
    z = np.zeros((len(means), k))
    for i, y in enumerate(means):
        nu = min(max(int((y - range_params.low) // (2 * range_params.tau)), 0), range_params.num_bins - 1)
        j = rng.integers(k)
        sign = h[j, nu] if rng.random() < p else -h[j, nu]
        z[i] = c * sign * h[j]
    best = int(np.argmax(z.mean(axis=0)[: range_params.num_bins]))
    lower = range_params.bin_center(best) - 3 * config.tau
    upper = lower + 6 * config.tau
    scale = (upper - lower) / config.round_epsilon
    total = 0.0
    for y in means:
        total += min(max(y, lower), upper) + rng.laplace(0.0, scale)
    return total / len(means)


def main(argv: list[str] | None = None) -> int:
    args = parse(arguments(__doc__), argv)
    sizes = QUICK if args.quick else {"n": N, "n_naive": N_NAIVE, "repeats": 5}
    n, n_naive, repeats = sizes["n"], sizes["n_naive"], sizes["repeats"]
    pin_one_core()
    population = Population("gaussian", 1.7, 1.0, 20.0, M)
    rng = np.random.default_rng(1)
    generate = lambda: population.samples(rng, n).mean(axis=1)  # noqa: E731
    t_generate = best_of(generate, repeats=min(3, repeats))
    means = generate()
    config = ScalarMeanConfig(bound=20.0, tau=0.8, epsilon0=1.0)
    t_protocol = best_of(lambda: protocol_run(means, config, 7), repeats=repeats)
    t_uniform = best_of(lambda: rng.random(n), repeats=repeats)
    small = means[:n_naive]
    t_naive = best_of(lambda: naive_run(small, config, rng), repeats=min(2, repeats)) * (n / n_naive)
    t_fast_small = best_of(lambda: protocol_run(small, config, 7), repeats=repeats) * (n / n_naive)
    result = {
        "n": n,
        "m": M,
        "num_bins": config.range_params().padded_bins,
        "protocol_users_per_s": n / t_protocol,
        "with_data_generation_users_per_s": n / (t_protocol + t_generate),
        "data_generation_users_per_s": n / t_generate,
        "numpy_uniforms_per_s": n / t_uniform,
        "ratio_protocol_to_uniform_draw": t_uniform / t_protocol,
        "naive_users_per_s": n / t_naive,
        "speedup_over_naive_same_n": t_naive / t_fast_small,
        "target_users_per_s": 1_000_000,
    }
    path = write_result(args, "fast_path", result, sizes=sizes)
    print(f"fast path, one core, n = {n:,}, m = {M}, K = {result['num_bins']}")
    print(f"  range + mean protocol        {result['protocol_users_per_s']:>14,.0f} users/s  (target 1,000,000)")
    print(f"  + generating m={M} samples    {result['with_data_generation_users_per_s']:>14,.0f} users/s")
    print(f"  baseline numpy uniform draw  {result['numpy_uniforms_per_s']:>14,.0f} per s; protocol costs "
          f"{1 / result['ratio_protocol_to_uniform_draw']:.1f} uniform draws per user")
    print(f"  baseline naive per-user loop {result['naive_users_per_s']:>14,.0f} users/s; "
          f"fast path is {result['speedup_over_naive_same_n']:.0f}x faster at n = {n_naive:,}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
