"""The range round's failures against the analyzer's own warnings, over many seeds and a sweep of n.

The regime the range round struggles in: few users, a wide domain (B = 200, so about 300
bins of width 2 tau) and a small budget (eps0 = 0.5, eps0 / 2 per round). For each n, the
scalar range -> mean protocol runs on the vectorized engine with ``--seeds`` seeds
(:func:`shuffledp.studies.range_check.range_study`), and each run is classified by the
truth (did the announced range hold the true mean?) and by the analyzer's check
(``analyzer/range_check.py``: its two-round verdict, trusted or untrusted). Reported per n,
with Clopper–Pearson 95 % intervals: the failure rate, the untrusted rate, misses (failed
but trusted; the verdict bounds them by alpha = 0.001 per run whose range holds no user)
and false warnings (held, but untrusted), and the a-priori requirement ``users_needed``.
Two more rows: the headline regime (B = 1000, n = 2,000, m = 10, eps0 = 0.5, ``--headline-seeds``
seeds, 3,000 by default), where the frequency test alone distrusted a quarter of the good
ranges and let one empty range through; and the default regime (B = 20, n = 20,000), where
nothing fails and nothing is distrusted.

``--regimes``: instead of the sweep, the table of :data:`REGIMES` (the two hard regimes with Laplace
and Gaussian noise, and two where ``n`` reaches ``users_needed``, with Gaussian noise), ``--seeds``
seeds each (3,000 for the committed table): silent misses (the range held no user and was trusted),
false warnings, both with Clopper–Pearson 95 % intervals, and the Neyman–Pearson limit
(:mod:`shuffledp.studies.range_limit`, as many Monte Carlo runs each for a null with the users at
one point and one with them spread over three neighbouring bins; the larger is the table's limit):
a false-warning rate no verdict with the same guarantee can go below, averaged over where the users are.
Writes range_check_regimes.json; ``python benchmarks/bench_range_check.py --regimes --seeds 3000
--out benchmarks/results`` takes about ten minutes on one core.

Run: ``python benchmarks/bench_range_check.py [--quick] [--out DIR]`` (about a minute and a half;
``--seeds 50`` for a closer look in less time; ``--quick``: 3 seeds at two sizes); writes
range_check.json and range_check.png into the output folder (default ``bench-out/``).
"""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _common import arguments, parse, write_result  # noqa: E402

NS = (500, 1000, 1500, 2000, 3000, 5000, 10_000)
BOUND, EPSILON0 = 200.0, 0.5
QUICK = {"seeds": 3, "ns": (500, 2000)}
#: (n, B, m, eps0, noise, delta0) of the regimes table.
REGIMES = ((2_000, 1000.0, 10, 0.5, "laplace", 0.0), (2_000, 1000.0, 10, 0.5, "gaussian", 1e-6),
           (1_000, 200.0, 50, 0.5, "laplace", 0.0), (1_000, 200.0, 50, 0.5, "gaussian", 1e-6),
           (6_000, 200.0, 50, 0.5, "gaussian", 1e-6), (20_000, 20.0, 50, 1.0, "gaussian", 1e-6))


def regimes_table(args) -> int:
    """``--regimes``: the verdict against the Neyman–Pearson limit in every regime of :data:`REGIMES`."""
    from shuffledp.analyzer.range_check import users_needed
    from shuffledp.progress import progress_bar
    from shuffledp.simulation import SimulationConfig
    from shuffledp.simulation.population import Population
    from shuffledp.studies.range_check import format_study, range_study
    from shuffledp.studies.range_limit import neyman_pearson_limit

    seeds = QUICK["seeds"] if args.quick else args.seeds
    rows = []
    with progress_bar(3 * seeds * len(REGIMES), unit="run") as step:
        for n, bound, m, epsilon0, noise, delta0 in REGIMES:
            config = SimulationConfig(Population("gaussian", 1.7, 1.0, bound, m), n=n, epsilon0=epsilon0,
                                      noise=noise, delta0=delta0)
            study = range_study(config, seeds, progress=step)
            limits = [neyman_pearson_limit(config, seeds, first_seed=10**6, progress=step, spread=spread)
                      for spread in (1, 3)]
            limit = max(limits, key=lambda one: one.must_warn)
            bins = config.protocol_config().range_params().num_bins
            rows.append(study.as_dict() | {"neyman_pearson": limit.as_dict(),
                                            "neyman_pearson_by_spread": [one.as_dict() for one in limits], "bins": bins,
                                            "users_needed": users_needed(epsilon0 / 2, bins)})
            rate, low, high = limit.rate()
            print(format_study(study) + f"\n  Neyman-Pearson limit (false warnings)  {limit.must_warn:>6} / {limit.runs}"
                  f"  ({100 * rate:5.1f} %, 95 % CI {100 * low:.1f}-{100 * high:.1f} %; null users spread over {limit.spread} bin(s))",
                  file=sys.stderr)
    path = write_result(args, "range_check_regimes", {"seeds": seeds, "rows": rows}, sizes={"seeds": seeds})
    print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from shuffledp.analyzer.range_check import users_needed
    from shuffledp.simulation.population import Population
    from shuffledp.progress import progress_bar, pyplot, save_figure
    from shuffledp.studies.range_check import format_study, range_study
    from shuffledp.simulation import SimulationConfig

    parser = arguments(__doc__, quick=f"{QUICK['seeds']} seeds, n in {QUICK['ns']} and the default regime")
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--headline-seeds", type=int, default=3000)
    parser.add_argument("--regimes", action="store_true", help="the regimes table instead of the sweep")
    args = parse(parser, argv)
    if args.regimes:
        return regimes_table(args)
    sizes = QUICK if args.quick else {"seeds": args.seeds, "ns": NS, "headline_seeds": args.headline_seeds}
    seeds = sizes["seeds"]
    headline_seeds = sizes.get("headline_seeds", seeds)
    # (n, B, eps0, m, seeds)
    settings = ([(n, BOUND, EPSILON0, 50, seeds) for n in sizes["ns"]] + [(2_000, 1000.0, 0.5, 10, headline_seeds)]
                + [(20_000, 20.0, 1.0, 50, seeds)])
    rows = []
    with progress_bar(sum(s[-1] for s in settings), unit="run") as step:
        for n, bound, epsilon0, m, runs in settings:
            config = SimulationConfig(Population("gaussian", 1.7, 1.0, bound, m), n=n, epsilon0=epsilon0)
            study = range_study(config, runs, progress=step)
            row = study.as_dict()
            bins = config.protocol_config().range_params().num_bins
            row["users_needed"] = users_needed(epsilon0 / 2, bins)
            row["bins"] = bins
            rows.append(row)
            print(format_study(study), file=sys.stderr)
    path = write_result(args, "range_check", {"seeds": seeds, "rows": rows}, sizes=sizes)

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    sweep = [r for r in rows if r["config"]["bound"] == BOUND]
    ns = [r["config"]["n"] for r in sweep]
    for name, label, style in (("failed", "range missed the true mean", "-o"), ("warned", "reported untrusted", "-s"),
                               ("missed", "missed (failed, trusted)", "-x"),
                               ("false_warnings", "false warnings (held, untrusted)", "--^")):
        rates = [r[f"{name}_rate"]["rate"] for r in sweep]
        lows = [r[f"{name}_rate"]["rate"] - r[f"{name}_rate"]["ci95"][0] for r in sweep]
        highs = [r[f"{name}_rate"]["ci95"][1] - r[f"{name}_rate"]["rate"] for r in sweep]
        ax.errorbar(ns, rates, yerr=[lows, highs], fmt=style, capsize=3, label=label)
    ax.axvline(sweep[0]["users_needed"], color="grey", ls=":", label=f"users needed ({sweep[0]['users_needed']:,})")
    ax.set_xscale("log")
    ax.set_xlabel("n (users)")
    ax.set_ylabel(f"fraction of {seeds} seeds")
    ax.set_title(f"range round, B = {BOUND:g}, eps0 = {EPSILON0:g}: failures and the analyzer's verdict")
    ax.legend(fontsize=8)
    save_figure(fig, str(path.with_suffix(".png")))
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
