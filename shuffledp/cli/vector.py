"""``shuffledp vector``: the vector mean protocol (Algorithm 5) on simulated users.

Runs the protocol on the chosen engine: ``--fast`` (the default) streams users block by
block through the rounds' collectors, in bounded memory; ``--messages`` runs real clients,
shuffler and analyzer. One seed gives one result on both. With
``--sweep N1,N2,...`` it runs once per n and, with ``--plot``, draws the error
against n beside the exact theoretical RMSE and Theorem 2's bound; without ``--sweep``,
``--plot`` draws each coordinate's estimate against the true mean. ``--json`` (and
``--output``) give one JSON object: the run's result, or a sweep's results under ``"results"``.

Every run reports its local guarantee (user-level eps0-LDP) and its central (eps, delta) after
shuffling, at ``--delta`` (default min(1e-6, n^-1.1)): see
``shuffledp/simulation/vector.py::central_guarantee_at`` for the accounting.
"""

from __future__ import annotations

import argparse
import json
import sys

from shuffledp.client.vector_randomizer import VECTOR_MODES
from shuffledp.cli.common import (
    EXIT_FAILED,
    EXIT_USAGE,
    HelpFormatter,
    add_json_option,
    default_delta,
    central_delta_arg,
    delta_help,
    deprecated_alias,
    fail,
)
from shuffledp.cli.run_info import with_run_info
from shuffledp.progress import progress_bar, pyplot, save_figure
from shuffledp.cli.simulate import add_engine_arguments, check_engine_arguments, engine_client
from shuffledp.protocol.errors import InvalidParameter, ShuffleDPError
from shuffledp.simulation.vector_population import VECTOR_KINDS, VectorPopulation
from shuffledp.simulation.vector import VectorSimulationConfig, run_vector_simulation


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "vector", help="run the vector mean protocol (random rotation) on simulated users",
        description=__doc__, formatter_class=HelpFormatter,
    )
    p.add_argument("--users", "-n", type=int, default=100_000, help="number of users n")
    p.add_argument("--sweep", default=None, metavar="N1,N2,...", help="run for each n (overrides --users)")
    p.add_argument("--dim", "-d", type=int, default=64, help="dimension d")
    p.add_argument("--samples", "-m", type=int, default=10, help="samples per user m")
    p.add_argument("--distribution", choices=VECTOR_KINDS, default="gaussian",
                   help="data distribution: gaussian vectors, or categorical (one-hot vectors of d symbols)")
    p.add_argument("--mu", type=float, default=0.5, help="gaussian: mean scale (mu_k = mu sin(k+1))")
    p.add_argument("--sigma", type=float, default=1.0, help="gaussian: per-coordinate sd")
    p.add_argument("--bound", "-B", type=float, default=4.0,
                   help="gaussian: samples lie in [-B, B]^d (default 4 = 4 sigma of this data model, not simulate's 20: "
                   "the range round's Hadamard size, and with it each block's memory, grows with B)")
    p.add_argument("--zipf", type=float, default=1.1, help="categorical: Zipf exponent (0 = uniform)")
    p.add_argument("--epsilon0", "-e", type=float, default=4.0,
                   help="local user-level budget eps0 (default 4, not simulate's 1: one eps0 covers a whole d-vector; "
                   "at -d 64 -n 20000 -e 1 the range check fails on most coordinates)")
    deprecated_alias(p, "--epsilon", "--epsilon0")
    deprecated_alias(p, "--kind", "--distribution")
    p.add_argument("--mode", choices=VECTOR_MODES, default="sampled", help="range-round budget mode")
    p.add_argument("--gamma", type=float, default=0.01, help="failure probability of the radius")
    p.add_argument("--delta", type=central_delta_arg, default=None, help=delta_help("central delta of the shuffled guarantee"))
    p.add_argument("--seed", type=int, default=0)
    add_engine_arguments(p, default="fast", why="not simulate's messages engine: it streams users block by block "
                         "in bounded memory, so the default n = 100,000 at d = 64 runs in seconds")
    add_json_option(p)
    p.add_argument("--output", metavar="JSON", default=None, help="also write the JSON result to this file")
    p.add_argument("--plot", metavar="PNG", default=None,
                   help="with --sweep: the error against n, beside the theory; one run: each coordinate's estimate "
                   "against the true mean, with the theoretical standard deviation")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _command(args: argparse.Namespace) -> str:
    """The command errors name: ``vector``, or ``simulate`` when it runs this one (``_command``)."""
    return getattr(args, "_command", None) or "vector"


def _sizes(args) -> list[int]:
    if args.sweep is None:
        return [args.users]
    try:
        return [int(float(x)) for x in args.sweep.split(",") if x.strip()]
    except ValueError:
        raise InvalidParameter("sweep", f"must be comma-separated numbers, got {args.sweep!r}") from None


def run(args: argparse.Namespace) -> int:
    try:
        population = VectorPopulation(args.distribution, args.dim, args.samples, args.mu, args.sigma, args.bound, args.zipf)
        configs = [
            VectorSimulationConfig(
                population, n, args.epsilon0, mode=args.mode, gamma=args.gamma, seed=args.seed, path=args.path,
                broker=args.broker, central_delta=args.delta if args.delta is not None else default_delta(n),
            )
            for n in _sizes(args)
        ]
        check_engine_arguments(args)
    except InvalidParameter as exc:
        return fail(_command(args), exc, EXIT_USAGE)
    if args.delta is None and len(configs) == 1:
        args.delta = configs[0].central_delta  # the JSON's parameters record the default as resolved
    results = []
    total = sum(2 * c.n for c in configs) if args.path == "fast" else None
    try:
        with engine_client(args) as client, progress_bar(total, quiet=args.quiet) as step:
            for config in configs:
                results.append(run_vector_simulation(config, progress=step, client=client))
    except ShuffleDPError as exc:
        return fail(_command(args), exc, EXIT_FAILED)
    documents = [r.as_dict() for r in results]
    for d in documents:
        for key in ("true_mean", "estimate", "variance_per_coordinate"):
            d.pop(key)
    # One JSON object, as every command prints: the run's result, or a sweep's under "results".
    document = with_run_info(documents[0] if args.sweep is None else {"results": documents}, args)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(document, f, indent=2)
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print(format_results(results, args))
    if args.plot:
        if args.sweep is None:
            plot_coordinates(results[0], args.plot)
        else:
            plot_sweep(results, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


def format_results(results, args: argparse.Namespace) -> str:
    """The text ``shuffledp vector`` (and ``simulate --protocol vector-mean|distribution``) prints:
    the error table, the range check, and the local and central guarantee of each run."""
    title = getattr(args, "_title", None) or "shuffledp vector: vector mean (Girgis et al. 2022, Algorithm 5)"
    data = f"{args.distribution} data" if args.distribution != "categorical" else f"categorical data (Zipf({args.zipf:g}) over d = {args.dim} symbols)"
    lines = [
        f"{title}, {args.mode} mode, d = {args.dim}, m = {args.samples}, {data}, {args.path} path",
        f"{'n':>10} {'l2 error':>10} {'RMSE theory':>12} {'Thm 2 bound':>12} {'ranges hit':>11} {'seconds':>8}  range check",
    ]
    for r in results:
        check = r.range_check
        verdict = "-" if not check else (f"trusted at level {check['alpha']:g}" if check["status"] == "ok" else
                                          f"not trusted: {len(check['warned_coordinates'])} of {check['coordinates']} coordinates")
        lines.append(f"{r.config['n']:>10,} {r.l2_error:>10.4g} {r.mse_theory ** 0.5:>12.4g} "
                     f"{r.theorem2_mse_bound ** 0.5:>12.4g} {100 * r.fraction_coordinates_ranges_hit:>10.2f}% {r.seconds:>8.2f}  {verdict}")
    warned = [r for r in results if r.range_check and r.range_check["status"] != "ok"]
    if warned:
        from shuffledp.analyzer.range_check import format_range_check

        lines.append(f"range check at n = {warned[0].config['n']:,}: {format_range_check(warned[0].range_check)}")
    local = results[0].local
    lines += ["", f"local privacy (user-level LDP)   eps0 = {local['epsilon0']:g}, delta0 = {local['delta0']:g}"]
    for r in results:
        lines += format_central(r.central, r.config["n"] if len(results) > 1 else None)
    return "\n".join(lines)


def format_central(central: dict, n: int | None = None) -> list[str]:
    """Lines stating a vector mean run's central guarantee after shuffling and how each round was accounted."""
    at = f" (n = {n:,})" if n is not None else ""
    if central.get("epsilon") is None:
        return [f"central privacy after shuffling{at}  central: {central.get('method')}"]
    lines = [f"central privacy after shuffling{at}  eps = {central['epsilon']:.4g}, delta = {central['delta']:.3g}"
             f"   ({central['method']})"]
    for r, bound in zip(central.get("rounds", []), central.get("per_round", [])):
        each = "" if r["composed"] == 1 else f" (one per coordinate: {r['composed']} composed rounds of n reports)"
        what = {"generic": "generic pure-LDP randomizer",
                "laplace-mean": f"projected Laplace report on {r.get('grid_levels')} levels (generic bounds and its blanket)"
                }.get(r["accounted_as"], f"{r['accounted_as']} over {r.get('num_bins')} rows")
        k = r["reports_per_user"]
        lines.append(f"  round {r['round']} ({r['mechanism']}): {k} report{'s' if k > 1 else ''} per user, each "
                     f"{r['report_epsilon0']:.4g}-LDP{each}, accounted as a {what}: eps {bound['epsilon']:.4g} "
                     f"at delta {bound['delta']:.2g} per round ({bound['method']})")
    return lines


def plot_coordinates(result, path: str) -> None:
    """One run's plot: each coordinate's estimate against the true mean, with error bars of one
    theoretical standard deviation (the exact per-coordinate variance of the estimator), and the
    coordinates the range check did not trust marked."""
    import numpy as np

    plt = pyplot()
    c = result.config
    d = len(result.true_mean)
    index = np.arange(d)
    fig, ax = plt.subplots(figsize=(max(6.5, min(16.0, d / 8)), 4.2))
    ax.plot(index, result.true_mean, "k_", ms=8, label="true mean")
    ax.errorbar(index, result.estimate, yerr=np.sqrt(result.variance_per_coordinate), fmt="o", ms=3, lw=0.8,
                color="tab:blue", label="estimate ± 1 theoretical sd")
    warned = list((result.range_check or {}).get("warned_coordinates", ()))
    if warned:
        ax.plot(index[warned], np.asarray(result.estimate)[warned], "x", color="tab:red", ms=7,
                label="range check: not trusted")
    ax.set_xlabel("coordinate")
    ax.set_ylabel("mean")
    ax.set_title(f"vector mean, n={c['n']:,}, d={c['population']['dim']}, m={c['population']['m']}, "
                 f"ε0={c['epsilon0']}: ℓ2 error {result.l2_error:.3g} (theory {result.mse_theory ** 0.5:.3g})")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def plot_sweep(results, path: str, label: str = "") -> None:
    plt = pyplot()
    ns = [r.config["n"] for r in results]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    ax.loglog(ns, [r.l2_error for r in results], "o-", label=f"{label}measured ℓ2 error")
    ax.loglog(ns, [r.mse_theory**0.5 for r in results], "--", label="exact theoretical RMSE")
    ax.loglog(ns, [r.theorem2_mse_bound**0.5 for r in results], ":", label="Theorem 2 (as in its proof)")
    ax.set_xlabel("users n")
    ax.set_ylabel("ℓ2 error of the mean")
    c = results[0].config
    ax.set_title(f"vector mean, d={c['population']['dim']}, m={c['population']['m']}, ε0={c['epsilon0']}, {c['mode']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    save_figure(fig, path)
