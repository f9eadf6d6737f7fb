"""Simulate the scalar range -> mean protocol at several n and plot the error against theory.

The first user story: someone simulating a protocol with up to millions of users. Each run
uses the vectorized engine (the same reports the real parties would exchange, drawn in
bulk), and reports the estimate, the exact theoretical RMSE given the range the first
round announced, the analyzer's own check of that range round, and the central (eps,
delta) the shuffled rounds give::

    python examples/simulate_and_plot.py                 # n = 2,000 ... 1,000,000
    python examples/simulate_and_plot.py --quick --out /tmp/sim.png
"""

from __future__ import annotations

import argparse

from shuffledp.simulation.population import Population
from shuffledp.progress import pyplot, save_figure
from shuffledp.simulation import SimulationConfig, run_simulation
from shuffledp.cli.common import deprecated_alias
from shuffledp.size_cap import capped_list, note


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="two small n only")
    parser.add_argument("--epsilon0", "-e", type=float, default=1.0, help="local budget eps0 of each user")
    deprecated_alias(parser, "--epsilon", "--epsilon0")  # the shuffledp commands' spelling (docs/cli.md)
    parser.add_argument("--out", default="simulate_and_plot.png", help="where to write the plot")
    args = parser.parse_args(argv)

    population = Population("gaussian", mu=1.7, sigma=1.0, bound=20.0, m=50)
    documented = (2_000, 10_000) if args.quick else (2_000, 10_000, 100_000, 1_000_000)
    ns = capped_list(documented)  # SHUFFLEDP_SIZE_CAP (README, testing)
    note([f"n {', '.join(map(str, documented))} -> {', '.join(map(str, ns))}"] if list(documented) != ns else [],
         "simulate_and_plot.py")
    rows = []
    # The central delta is the default every command uses, min(1e-6, n^-1.1) (SimulationConfig.delta);
    # every epsilon is printed with its delta.
    print(f"{'n':>10} {'estimate':>10} {'|error|':>9} {'RMSE theory':>12} {'range check':>12} {'central eps':>12} {'delta':>8}")
    for n in ns:
        result = run_simulation(SimulationConfig(population, n=n, epsilon0=args.epsilon0, path="fast", seed=1))
        rows.append(result)
        verdict = "trusted" if result.range_check["status"] == "ok" else "not trusted"
        print(f"{n:>10,} {result.estimate:>10.4f} {abs(result.error):>9.4f} {result.rmse_theory:>12.4f} "
              f"{verdict:>12} {result.central['epsilon']:>12.4g} {result.central['delta']:>8.2g}")

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.loglog(ns, [abs(r.error) for r in rows], "o", label="|error| of one run")
    ax.loglog(ns, [r.rmse_theory for r in rows], "-", label="theoretical RMSE (given the range)")
    ax.set_xlabel("users n")
    ax.set_ylabel("error of the mean")
    ax.set_title(f"scalar range -> mean, eps0 = {args.epsilon0:g}, m = {population.m}")
    ax.legend()
    save_figure(fig, args.out)
    print(f"plot written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
