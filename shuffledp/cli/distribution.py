"""``shuffledp distribution``: discrete distribution estimation under user-level LDP.

Compares the item-level baseline (a frequency oracle on one sample per user) with
the vector mean protocol on each user's empirical distribution, for each m given,
against the truth and the theory. ``--plot`` draws TV error against m.
"""

from __future__ import annotations

import argparse
import json
import sys

from shuffledp.simulation.distribution import DistributionConfig, run_distribution
from shuffledp.cli.common import EXIT_USAGE, HelpFormatter, add_json_option, deprecated_alias, fail
from shuffledp.cli.run_info import with_run_info
from shuffledp.progress import progress_bar, pyplot, save_figure
from shuffledp.protocol.errors import InvalidParameter


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "distribution", help="estimate a k-ary distribution from users with m samples each",
        description=__doc__, formatter_class=HelpFormatter,
    )
    p.add_argument("--symbols", "-k", type=int, default=64, help="alphabet size k")
    p.add_argument("--users", "-n", type=int, default=50_000, help="number of users n")
    p.add_argument("--samples", "-m", default="1,10,100,1000,10000", help="comma-separated samples per user")
    p.add_argument("--epsilon0", "-e", type=float, default=4.0, help="local user-level budget eps0")
    deprecated_alias(p, "--epsilon", "--epsilon0")
    p.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of the true distribution (0 = uniform)")
    p.add_argument("--seed", type=int, default=0)
    add_json_option(p)
    p.add_argument("--plot", metavar="PNG", default=None, help="plot TV error against m")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        ms = [int(x) for x in args.samples.split(",") if x.strip()]
        configs = [DistributionConfig(args.symbols, args.users, m, args.epsilon0, args.zipf, seed=args.seed) for m in ms]
    except (InvalidParameter, ValueError) as exc:
        return fail("distribution", exc, EXIT_USAGE)
    results = []
    with progress_bar(3 * args.users * len(configs), quiet=args.quiet) as step:
        for config in configs:
            results.append(run_distribution(config, progress=step))
    if args.json:
        print(json.dumps(with_run_info(results, args), indent=2))
    else:
        print(f"shuffledp distribution: k = {args.symbols}, n = {args.users:,}, eps0 = {args.epsilon0}, Zipf({args.zipf})")
        print(f"{'m':>7} | {'oracle TV':>10} {'theory':>8} | {'vector TV':>10} {'theory':>8} | better")
        for m, r in zip(ms, results):
            o, v = r["estimators"]
            best = "vector" if v["tv_error"] < o["tv_error"] else "oracle"
            print(f"{m:>7} | {o['tv_error']:>10.4f} {o['tv_theory']:>8.4f} | {v['tv_error']:>10.4f} {v['tv_theory']:>8.4f} | {best}")
    if args.plot:
        plot(ms, results, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


def plot(ms, results, path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for index, (name, color) in enumerate((("oracle", "tab:orange"), ("vector", "tab:blue"))):
        label = "frequency oracle, 1 sample/user" if name == "oracle" else "vector mean of empirical distributions"
        ax.loglog(ms, [r["estimators"][index]["tv_error"] for r in results], "o-", color=color, label=f"{label}")
        ax.loglog(ms, [r["estimators"][index]["tv_theory"] for r in results], "--", color=color, alpha=0.6,
                  label="theory (normal approx.)")
    c = results[0]["config"]
    ax.set_xlabel("samples per user m")
    ax.set_ylabel("total-variation error")
    ax.set_title(f"k = {c['k']}, n = {c['n']:,}, ε0 = {c['epsilon0']} (user-level)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)
