"""Why ``shuffledp distribution``'s vector TV error is not monotone in m: the range round.

For each m, over seeds 0..S-1 at the command's defaults (k = 64, n = 50,000, eps0 = 4,
Zipf 1.1), the TV error of the vector estimator as run (the range round on once tau' < B),
of the same users and seeds through the one-round protocol (mean round at eps0 over [-B, B],
:func:`shuffledp.simulation.distribution.vector_one_round`), and of the oracle: mean ± standard
error, with the exact-model theory. docs/vector-mean.md quotes its output. About 20 s per
seed on one core::

    python scripts/distribution_spike.py --seeds 8
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from shuffledp.simulation.distribution import DistributionConfig, run_distribution, vector_one_round


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--samples", "-m", default="1,10,100,1000")
    args = parser.parse_args()
    print("m | rounds | vector TV (theory) | one-round TV (theory) | oracle TV   [mean ± s.e. over seeds "
          f"0..{args.seeds - 1}]")
    for m in (int(x) for x in args.samples.split(",")):
        rows: dict[str, list[float]] = {k: [] for k in ("vector", "vector_th", "one", "one_th", "oracle")}
        for seed in range(args.seeds):
            config = DistributionConfig(64, 50_000, m, 4.0, 1.1, seed=seed)
            result = run_distribution(config)
            oracle, vector = result["estimators"]
            one = vector_one_round(config)
            for key, value in (("vector", vector["tv_error"]), ("vector_th", vector["tv_theory"]), ("one", one["tv_error"]),
                               ("one_th", one["tv_theory"]), ("oracle", oracle["tv_error"])):
                rows[key].append(value)
        rounds = result["vector_rounds"]

        def ms(key: str) -> str:
            x = np.asarray(rows[key])
            return f"{x.mean():.4f} ± {x.std(ddof=1) / math.sqrt(len(x)):.4f}"

        print(f"{m} | {'range + mean' if rounds['range_round'] else 'mean only'} "
              f"(noise x{rounds['noise_ratio_to_one_round']:.2f}) | {ms('vector')} ({np.mean(rows['vector_th']):.4f}) | "
              f"{ms('one')} ({np.mean(rows['one_th']):.4f}) | {ms('oracle')}", flush=True)


if __name__ == "__main__":
    main()
