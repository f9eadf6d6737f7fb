"""``shuffledp simulate``: the scalar range -> mean protocol on synthetic users.

Prints the true mean, the estimate, its error beside the theoretical RMSE and
Theorem 1's bound, the range found, messages and bytes per round, and the local
and central privacy spent. ``--json`` prints the same as one JSON document;
``--plot`` draws where the estimate fell against the truth and the theory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

from shuffledp.simulation.population import DISTRIBUTIONS, Population
from shuffledp.cli.common import (
    EXIT_FAILED,
    EXIT_USAGE,
    HelpFormatter,
    UsageError,
    add_json_option,
    default_delta,
    central_delta_arg,
    delta_help,
    RenamedChoices,
    deprecated_alias,
    fail,
    used_deprecated,
)
from shuffledp.cli.run_info import with_run_info
from shuffledp.progress import progress_bar, pyplot, save_figure
from shuffledp.protocol.errors import InvalidParameter, ShuffleDPError
from shuffledp.simulation import SimulationConfig, SimulationResult, run_simulation
from shuffledp.simulation.summation import SUM_PROTOCOLS, SummationConfig, format_summation, plot_summation, run_summation

#: Protocols run by ``shuffledp vector`` (Algorithm 5), reachable here too: the vector mean on
#: Gaussian data, and distribution estimation as the mean of one-hot vectors (categorical data).
VECTOR_PROTOCOLS = ("vector-mean", "distribution")
PROTOCOLS = ("scalar-mean",) + SUM_PROTOCOLS + VECTOR_PROTOCOLS + ("instance-optimal",)
#: Protocol names renamed (the old one still works, with a warning): ``scalar-mean``, as ``analyzer run`` names it.
RENAMED_PROTOCOLS = {"mean": "scalar-mean"}
#: Protocols calibrated to a central (eps, delta) (``--central-epsilon``); the others take a local eps0 (``-e``).
CENTRAL_PROTOCOLS = SUM_PROTOCOLS + ("instance-optimal",)
#: Protocols that report a central delta (``--delta``): all of them.
DELTA_PROTOCOLS = ("scalar-mean",) + CENTRAL_PROTOCOLS + VECTOR_PROTOCOLS
#: Default budgets (local eps0, or the central target).
DEFAULT_EPSILON0 = DEFAULT_CENTRAL_EPSILON = 1.0
#: The vector protocols' default local eps0: ``shuffledp vector``'s and ``shuffledp distribution``'s
#: (one user-level eps0 covers a whole d-vector: ``shuffledp vector -d 64 -n 20000 -e 1`` fails its range
#: check on most coordinates, with an l2 error more than ten times the norm of the mean).
DEFAULT_VECTOR_EPSILON0 = 4.0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="run a protocol (scalar mean, summation, vector summation) on simulated users",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--protocol", choices=PROTOCOLS, default="scalar-mean", action=RenamedChoices, renamed=RENAMED_PROTOCOLS,
        help="scalar-mean: range -> mean, local eps0 (Girgis et al. Alg. 1; as `shuffledp analyzer run`); sum: scalar multi-message summation; "
        "vector-sum: vector summation (rotation, l2 clipping, Skellam); summations take the central "
        "(--central-epsilon, --delta); "
        "vector-mean, distribution: Algorithm 5 (as `shuffledp vector`), local eps0; "
        "instance-optimal: Huang-Liang-Yi shifted clipped mean (3 rounds) at the session's central (eps, delta)",
    )
    p.add_argument("--users", "-n", type=int, default=20_000, help="number of users n")
    p.add_argument("--samples", "-m", type=int, default=50, help="samples per user m")
    p.add_argument("--distribution", choices=DISTRIBUTIONS, default="gaussian", help="data distribution")
    p.add_argument("--mu", type=float, default=1.7, help="distribution mean parameter")
    p.add_argument("--sigma", type=float, default=1.0, help="distribution spread parameter")
    p.add_argument("--bound", "-B", type=float, default=20.0, help="data bound B: samples lie in [-B, B]")
    p.add_argument(
        "--epsilon0", "-e", type=float, default=None,
        help=f"scalar-mean, vector-mean, distribution: local user-level budget eps0 (default {DEFAULT_EPSILON0:g}; "
        f"vector-mean, distribution: {DEFAULT_VECTOR_EPSILON0:g}, as `shuffledp vector`)",
    )
    p.add_argument(
        "--central-epsilon", type=float, default=None,
        help=f"sum, vector-sum, instance-optimal: the central epsilon they are calibrated to (default {DEFAULT_CENTRAL_EPSILON:g})",
    )
    p.add_argument("--dim", "-d", type=int, default=16, help="vector protocols: dimension (distribution: symbols)")
    p.add_argument("--model", choices=("shuffle", "local"), default="shuffle", help="instance-optimal: trust model")
    p.add_argument("--radius", type=float, default=None, help="vector-sum: l2 clipping radius (default: the data bound B)")
    p.add_argument("--noise", choices=("laplace", "gaussian"), default="laplace", help="mean-round noise")
    p.add_argument("--delta0", type=float, default=0.0, help="local delta (Gaussian noise only)")
    p.add_argument("--tau", type=float, default=None, help="concentration radius (default: from the data model)")
    p.add_argument("--gamma", type=float, default=0.01, help="failure probability for the default radius")
    p.add_argument("--delta", type=central_delta_arg, default=None, help=delta_help("central delta: sum, vector-sum, instance-optimal: the target; scalar-mean, vector-mean, "
                                                   "distribution: where the central eps after shuffling is accounted"))
    p.add_argument("--seed", type=int, default=0, help="simulation seed")
    p.add_argument("--seeds", type=int, default=None, metavar="K",
                   help="scalar-mean: run K seeds (from --seed) on the fast engine and report how often the range round "
                   "failed and how often the analyzer's check warned or missed it")
    add_engine_arguments(p, default="messages", why="so that a default run goes through every party, as a deployment does")
    add_json_option(p)
    p.add_argument("--plot", metavar="PNG", default=None, help="write a plot of the estimate against the truth")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    deprecated_alias(p, "--epsilon", "--epsilon0", hint=" (a local eps0), or --central-epsilon with --protocol "
                     + ", ".join(CENTRAL_PROTOCOLS))
    p.set_defaults(func=run)


def add_engine_arguments(p: argparse.ArgumentParser, default: str, why: str = "") -> None:
    """``--fast`` / ``--messages`` (which engine, ``shuffledp/simulation/engine.py``) and ``--broker``;
    ``default`` is the command's engine, ``why`` the reason its help gives for it."""
    reason = f" (the default here, {why})" if why else " (the default here)"
    path = p.add_mutually_exclusive_group()
    path.add_argument("--fast", dest="path", action="store_const", const="fast",
                      help="vectorized engine, no messages" + (reason if default == "fast" else ""))
    path.add_argument(
        "--messages", dest="path", action="store_const", const="messages",
        help="message engine: real clients, sealing, shuffler and analyzer (in-process, or over --broker)"
        + (reason if default == "messages" else ""),
    )
    p.set_defaults(path=default)
    p.add_argument(
        "--broker", metavar="HOST[:PORT]|DIR", default=None,
        help="carry the messages over this MQTT broker (each party its own connection) instead of in-process: "
        "HOST[:PORT] for an anonymous plaintext broker, or the directory of a broker made by "
        "'python -m shuffledp.deploy.broker DIR --run' (TLS, one password per role, ACLs)",
    )
    dask = p.add_mutually_exclusive_group()
    dask.add_argument(
        "--dask-scheduler", metavar="ADDRESS", default=None,
        help="run the fast engine's blocks on the Dask cluster of this scheduler (tls://HOST:8786, with this client's "
        "certificate in Dask's configuration: docs/scale.md); the same result, bit for bit (needs shuffledp[dask])",
    )
    dask.add_argument(
        "--dask-workers", metavar="N", type=int, default=None,
        help="run the fast engine's blocks on a local Dask cluster of N worker processes, private to this run "
        "(mutual TLS with a key made for it, on 127.0.0.1, no dashboard; needs shuffledp[dask])",
    )
    p.add_argument(
        "--dask-insecure-plaintext", action="store_true",
        help="accept a --dask-scheduler address without TLS (tcp://): anyone who can reach that scheduler runs code "
        "as its workers' user, and the scheduler, or whoever is on the path, runs code in this process",
    )


def check_engine_arguments(args: argparse.Namespace) -> None:
    """:class:`InvalidParameter` if ``--dask-scheduler`` / ``--dask-workers`` ask for a cluster the run cannot use;
    :class:`~shuffledp.cli.extras.MissingExtraError` (one line, exit status 2) if Dask is not installed."""
    from shuffledp.cli.extras import require_extras

    if getattr(args, "dask_scheduler", None) is None and getattr(args, "dask_workers", None) is None:
        return
    require_extras(getattr(args, "_command", None) or args.command, ("dask",))
    if args.path != "fast":
        raise InvalidParameter("dask-scheduler/dask-workers", "a Dask cluster runs the fast engine's blocks: use --fast")
    if args.dask_workers is not None and args.dask_workers < 1:
        raise InvalidParameter("dask-workers", f"must be >= 1, got {args.dask_workers}")
    if args.dask_scheduler is not None:
        from shuffledp.simulation.dask_engine import scheduler_security

        scheduler_security(args.dask_scheduler, allow_plaintext=getattr(args, "dask_insecure_plaintext", False))


def engine_client(args: argparse.Namespace) -> "contextlib.AbstractContextManager[Any]":
    """The run's Dask client (``--dask-scheduler`` / ``--dask-workers``, closed afterwards), or
    ``None``: the fast engine in this process (:func:`shuffledp.simulation.dask_engine.dask_client`)."""
    from shuffledp.simulation.dask_engine import dask_client

    return dask_client(getattr(args, "dask_scheduler", None), getattr(args, "dask_workers", None),
                       allow_plaintext=getattr(args, "dask_insecure_plaintext", False))


def resolve_budgets(args: argparse.Namespace) -> None:
    """Each protocol's budget and delta, defaults filled in (so a JSON result records them).

    A central protocol takes ``--central-epsilon``; ``-e/--epsilon0`` (a local eps0) is refused for it,
    except through the deprecated ``--epsilon``, which meant the central epsilon there."""
    if args.protocol in CENTRAL_PROTOCOLS:
        if args.epsilon0 is not None:
            if not used_deprecated(args, "--epsilon"):
                raise UsageError(f"--protocol {args.protocol} is calibrated to a central epsilon: give --central-epsilon, "
                                 "not -e/--epsilon0 (a local eps0)")
            if args.central_epsilon is None:
                args.central_epsilon = args.epsilon0
            args.epsilon0 = None
        if args.central_epsilon is None:
            args.central_epsilon = DEFAULT_CENTRAL_EPSILON
    else:
        if args.central_epsilon is not None:
            raise UsageError(f"--central-epsilon applies to --protocol {', '.join(CENTRAL_PROTOCOLS)}; --protocol "
                             f"{args.protocol} takes -e/--epsilon0 (a local eps0)")
        if args.epsilon0 is None:
            args.epsilon0 = DEFAULT_VECTOR_EPSILON0 if args.protocol in VECTOR_PROTOCOLS else DEFAULT_EPSILON0
    if args.protocol in DELTA_PROTOCOLS and args.delta is None:
        args.delta = default_delta(args.users)


def run(args: argparse.Namespace) -> int:
    resolve_budgets(args)
    if args.protocol in SUM_PROTOCOLS:
        return _run_summation(args)
    if args.protocol in VECTOR_PROTOCOLS:
        return _run_vector(args)
    if args.protocol == "instance-optimal":
        return _run_instance_optimal(args)
    try:
        population = Population(args.distribution, args.mu, args.sigma, args.bound, args.samples)
        config = SimulationConfig(
            population=population,
            n=args.users,
            epsilon0=args.epsilon0,
            delta0=args.delta0,
            noise=args.noise,
            tau=args.tau,
            gamma=args.gamma,
            central_delta=args.delta,
            seed=args.seed,
            path=args.path,
            broker=args.broker,
        )
        check_engine_arguments(args)
        if args.seeds is not None and (args.dask_scheduler or args.dask_workers):
            raise InvalidParameter("seeds", "the range study runs in this process: drop --dask-scheduler/--dask-workers")
    except InvalidParameter as exc:
        return fail("simulate", exc, EXIT_USAGE)
    if args.seeds is not None:
        return _run_range_study(args, config)
    units = (5 if config.path == "messages" else 3) * config.n  # generate, then per round: seal+open or randomize
    try:
        with engine_client(args) as client, progress_bar(units, quiet=args.quiet, unit="user-step") as step:
            result = run_simulation(config, progress=step, client=client)
    except ShuffleDPError as exc:  # e.g. the broker is unreachable, or a round missed its batch
        return fail("simulate", exc, EXIT_FAILED)
    try:
        _print_and_plot(args, result)
    except BrokenPipeError:  # e.g. piped into `head`
        sys.stderr.close()
    return 0


def _run_range_study(args: argparse.Namespace, config: SimulationConfig) -> int:
    """``--seeds K``: the range round's failures against the analyzer's warnings (``shuffledp/studies/range_check.py``)."""
    import json

    from shuffledp.studies.range_check import format_study, range_study

    try:
        with progress_bar(3 * args.seeds, quiet=args.quiet, unit="run") as step:
            study = range_study(config, args.seeds, args.seed, progress=step, with_limit=True)
    except InvalidParameter as exc:
        return fail("simulate", exc, EXIT_USAGE)
    print(json.dumps(with_run_info(study.as_dict(), args), indent=2, default=float) if args.json else format_study(study))
    return 0


def _run_vector(args: argparse.Namespace) -> int:
    """``--protocol vector-mean|distribution``: ``shuffledp vector`` with this command's options
    (``--dim`` symbols for distribution; categorical data are Zipf(1.1) over them)."""
    from shuffledp.cli import vector as vector_cli

    title = {
        "vector-mean": "shuffledp simulate --protocol vector-mean: vector mean (Girgis et al. 2022, Algorithm 5)",
        "distribution": "shuffledp simulate --protocol distribution: distribution estimation as the mean of one-hot "
                        "vectors (Algorithm 5)",
    }[args.protocol]
    vector_args = argparse.Namespace(
        command="simulate", protocol=args.protocol,
        users=args.users, sweep=None, dim=args.dim, samples=args.samples,
        distribution="gaussian" if args.protocol == "vector-mean" else "categorical",
        mu=args.mu if abs(args.mu) < args.bound else 0.5, sigma=args.sigma, bound=args.bound, zipf=1.1,
        epsilon0=args.epsilon0, mode="sampled", gamma=args.gamma, delta=args.delta, seed=args.seed, path=args.path,
        broker=args.broker, json=args.json, output=None, plot=args.plot, quiet=args.quiet,
        dask_scheduler=args.dask_scheduler, dask_workers=args.dask_workers,
        dask_insecure_plaintext=args.dask_insecure_plaintext, _title=title, _command="simulate",
    )
    return vector_cli.run(vector_args)


def _run_instance_optimal(args: argparse.Namespace) -> int:
    """``--protocol instance-optimal``: three rounds at the session's central (eps, delta), local or shuffle."""
    from shuffledp.simulation.instance_optimal import (
        InstanceOptimalSimulation,
        format_instance_optimal,
        plot_instance_optimal,
        run_instance_optimal,
    )
    from shuffledp.simulation.vector_population import VectorPopulation

    try:
        population = VectorPopulation("gaussian", args.dim, args.samples, args.mu, args.sigma, args.bound)
        config = InstanceOptimalSimulation(
            population, args.users, args.central_epsilon, args.delta, args.model, args.seed, args.path, args.broker
        )
    except InvalidParameter as exc:
        return fail("simulate", exc, EXIT_USAGE)
    return _run_and_report(args, lambda step, client: run_instance_optimal(config, progress=step, client=client),
                           format_instance_optimal, plot_instance_optimal)


def _run_and_report(args: argparse.Namespace, run_with, format_result_dict, plot_result_dict) -> int:
    """Run (``run_with(progress_step, dask_client_or_None)`` returns a JSON-ready dict), print it and
    plot it; typed errors become exit codes (2: invalid parameter, 1: a protocol or transport failure)."""
    try:
        check_engine_arguments(args)
        # totals depend on chosen parameters
        with engine_client(args) as client, progress_bar(None, quiet=args.quiet, unit="step") as step:
            result = run_with(step, client)
    except InvalidParameter as exc:
        return fail("simulate", exc, EXIT_USAGE)
    except ShuffleDPError as exc:
        return fail("simulate", exc, EXIT_FAILED)
    print(json.dumps(with_run_info(result, args), indent=2, default=float) if args.json else format_result_dict(result))
    if args.plot:
        plot_result_dict(result, args.plot)
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0


def _run_summation(args: argparse.Namespace) -> int:
    """``--protocol sum|vector-sum``: the chooser's parameters at the central (eps, delta), on either engine."""
    from shuffledp.simulation.vector_population import VectorPopulation

    population: Population | VectorPopulation
    try:
        if args.protocol == "sum":
            population = Population(args.distribution, args.mu, args.sigma, args.bound, args.samples)
        else:
            population = VectorPopulation("gaussian", args.dim, args.samples, args.mu, args.sigma, args.bound)
        config = SummationConfig(
            args.protocol, population, args.users, args.central_epsilon, args.delta, radius=args.radius,
            seed=args.seed, path=args.path, broker=args.broker,
        )
    except InvalidParameter as exc:
        return fail("simulate", exc, EXIT_USAGE)
    return _run_and_report(args, lambda step, client: run_summation(config, progress=step, client=client),
                           format_summation, plot_summation)


def _print_and_plot(args: argparse.Namespace, result: SimulationResult) -> None:
    if args.json:
        print(json.dumps(with_run_info(result.as_dict(), args), indent=2, default=float))
    else:
        print(format_result(result))
    if args.plot:
        plot_result(result, args.plot)
        if not args.json:
            print(f"plot written to {args.plot}")


def _fmt_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return str(count)


def format_result(result: SimulationResult) -> str:
    from shuffledp.analyzer.range_check import format_range_check

    c = result.config
    pop = c["population"]
    lines = [
        f"shuffledp simulate: scalar range -> mean (Girgis et al. 2022, Algorithm 1), {c['path']} path",
        f"  users n = {c['n']:,}, samples per user m = {pop['m']}, {pop['distribution']} data "
        f"(mu={pop['mu']}, sigma={pop['sigma']}) in [-{pop['bound']}, {pop['bound']}], tau = {c['tau']:.4g}",
        "",
        f"  true mean (all n*m samples)  {result.true_mean:.6f}",
        f"  estimate                     {result.estimate:.6f}"
        + ("" if result.range_check.get("status", "ok") == "ok" else
           "   (not trusted: the range check could not reject that the range holds no user)"),
        f"  error                        {result.error:+.6f}   ({result.error / result.rmse_theory:+.2f} x theoretical RMSE)",
        f"  theoretical RMSE             {result.rmse_theory:.6f}   (exact: noise + rounding + clipping, given the range)",
        f"  Theorem 1 bound (RMSE)       {result.theorem1_rmse_bound:.6f}   "
        + ("(the paper's noise term; Lap(12 tau/eps0) is exactly our noise, so it matches)"
           if c["noise"] == "laplace" else "(the paper's noise term, classical Gaussian calibration)"),
        f"  empirical standard error     {result.standard_error:.6f}",
        f"  vs population mean {result.population_mean:.6f}: error {result.estimate - result.population_mean:+.6f}, "
        f"RMSE with sampling {result.rmse_theory_population:.6f}",
        "",
        f"  range found                  [{result.range_found[0]:.4f}, {result.range_found[1]:.4f}]"
        f"   contains true mean: {'yes' if result.range_contains_true_mean else 'NO'};"
        f" users inside: {100 * result.fraction_users_in_range:.2f}%",
        f"  range check (analyzer's own)  {format_range_check(result.range_check)}",
    ]
    for i, r in enumerate(result.rounds):  # numbered as on the wire: round ids from 0
        lines.append(
            f"  round {r.get('round_id', i)}: {r['mechanism']:<15} eps0 = {r['epsilon0']:.4g}   {r['messages']:,} messages, "
            f"{_fmt_bytes(r['envelope_bytes'])} of envelopes"
            + (f", batch {_fmt_bytes(r['batch_bytes'])}" if "batch_bytes" in r else " (computed; fast path sends none)")
        )
    lines.append("")
    lines.append(f"  local privacy (user-level LDP)   eps0 = {result.local_epsilon:g}, delta0 = {result.local_delta:g}")
    central = result.central
    if central.get("epsilon") is None:
        lines.append(f"  central privacy after shuffling  {central.get('method')}")
    else:
        lines.append(
            f"  central privacy after shuffling  eps = {central['epsilon']:.4f}, delta = {central['delta']:.3g}"
            f"   ({central['method']})"
        )
    lines.append(f"  randomness: {result.randomness};  {result.seconds:.2f} s")
    return "\n".join(lines)


def plot_result(result: SimulationResult, path: str) -> None:
    """Two panels: round 0's Hadamard frequency estimates against the true bin fractions,
    with the range it announced; and round 1's estimate against the truth, with bands of
    1 and 2 theoretical RMSEs and the Theorem 1 bound."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [1.2, 1]})
    hist = result.extra["round0_histogram"]
    centers = hist["bin_centers"]
    width = (centers[1] - centers[0]) * 0.8 if len(centers) > 1 else 1.0
    left.bar(centers, hist["true_fractions"], width=width, color="lightgray", label="true fraction of users")
    left.plot(centers, hist["estimated_fractions"], "o-", color="tab:purple", ms=3, label="Hadamard estimate")
    lo, hi = result.range_found
    left.axvspan(lo, hi, color="tab:green", alpha=0.15, label="range announced")
    left.set_xlabel("bin centre")
    left.set_ylabel("fraction of users")
    left.set_title("round 0: private range (ε0/2)")
    left.legend(fontsize=7)

    t, rmse = result.true_mean, result.rmse_theory
    right.axvspan(t - 2 * rmse, t + 2 * rmse, color="tab:blue", alpha=0.12, label="±2 theoretical RMSE")
    right.axvspan(t - rmse, t + rmse, color="tab:blue", alpha=0.25, label="±1 theoretical RMSE")
    bound = result.theorem1_rmse_bound
    right.axvline(t - bound, color="tab:gray", ls=":", label="±Theorem 1 bound")
    right.axvline(t + bound, color="tab:gray", ls=":")
    right.axvline(t, color="black", lw=2, label=f"true mean {t:.4f}")
    right.plot([result.estimate], [0.5], "o", color="tab:red", ms=10, label=f"estimate {result.estimate:.4f}")
    span = max(3 * rmse, abs(result.estimate - t) * 1.3, bound * 1.3)
    right.set_xlim(t - span, t + span)
    right.set_ylim(0, 1)
    right.set_yticks([])
    eps = result.central.get("epsilon")
    priv = f"central ε = {eps:.3g} at δ = {result.central['delta']:.2g}" if eps is not None else "no central claim"
    right.set_title(f"round 1: mean (ε0/2); {priv}")
    right.set_xlabel("mean")
    right.legend(loc="upper left", fontsize=7)
    c = result.config
    fig.suptitle(f"shuffledp simulate: n = {c['n']:,}, m = {c['population']['m']}, ε0 = {result.local_epsilon:g}, {c['path']} path")
    save_figure(fig, path)
