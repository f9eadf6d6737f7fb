"""``shuffledp account``: what does a shuffled deployment really give?

For a local guarantee (``--epsilon0`` and ``--mechanism`` with its parameters) and the
batch size the shuffler delivers (``--users``, the n users of a round), prints every amplification bound the
accountant knows (``n/a`` where its theorem does not apply), the exact
shuffled-randomized-response floor where one exists, and the bound it uses. With
``--rounds`` and/or ``--sampling-rate`` it also composes the rounds into a session.
``--json`` prints one JSON document; ``--plot FILE.png`` draws epsilon against n.

With ``--plan FILE`` it accounts a whole session instead: a JSON session plan (a list of rounds,
each with its mechanism, epsilon0 and delta0 of one report, its parameters, the reports per
user, the batch of users it is shuffled among and their sampling, and the central delta; the
schema is in docs/accounting.md), composed by the rule ``simulate``, ``vector`` and
``distribution`` use. Their ``--json`` output carries the plan they accounted (``"plan"``), and
a file holding that output may be given as it is: the session epsilon printed is theirs, to the
last digit.

The central delta defaults to min(1e-6, n^-1.1).

Every input is answered in bounded time or refused with one line. ``--users`` up to 10^18: above
10^9 the numerical bounds are evaluated at n' = 10^9 (valid at n: a larger batch is a
post-processing of a smaller one) and the closed forms at n; the one-dataset lower bound is
computed up to n = 10^8. ``--epsilon0`` up to 50 (below 1e-6 only the closed forms).
``--rounds`` up to 10^18 (beyond what a PLD holds, the session is accounted by RDP alone).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from shuffledp.cli.common import (
    EXIT_USAGE,
    HelpFormatter,
    add_json_option,
    default_delta,
    delta_help,
    deprecated_alias,
    fail,
)
from shuffledp.cli.run_info import with_run_info

BOUND_LABELS = {
    "rr-exact": "exact shuffled binary RR (all datasets)",
    "rr-exact-smaller-n": "certified shuffled binary RR at a grid n' <= n (valid at n)",
    "variation-ratio": "variation-ratio, corrected (Wang et al. 2024)",
    "blanket": "privacy blanket, this mechanism (Balle et al. 2019)",
    "strong-clone": "stronger clone (Feldman et al. 2023)",
    "fmt21-numerical": "clones, numerical (Feldman et al. 2021, Thm 3.2)",
    "fmt21-closed": "clones, closed form (Feldman et al. 2021, Thm 3.1)",
    "rdp-girgis": "Renyi DP (Girgis et al. 2021) -> (eps, delta)",
    "local": "no amplification (local eps0)",
}


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


#: Most points a plot evaluates (one round each).
MAX_PLOT_POINTS = 200


def _plot_points(text: str) -> int:
    v = _positive_int(text)
    if v > MAX_PLOT_POINTS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_PLOT_POINTS} points, got {v}")
    return v


def _probability(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}") from None
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {v}")
    return v


def _rate(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {v}")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {v}")
    return v


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "account",
        help="central (eps, delta) of shuffled rounds: every bound, the floor, the one used",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    p.add_argument("--plan", metavar="FILE", default=None,
                   help="account the session plan in this JSON file (a plan, or a --json output of simulate, vector "
                   "or distribution holding one) instead of one mechanism; schema in docs/accounting.md")
    p.add_argument("--epsilon0", "-e", type=_positive_float, default=None,
                   help="local epsilon of one report (required without --plan)")
    p.add_argument(
        "--mechanism",
        choices=(
            "generic", "binary-rr", "hadamard-response", "block-hadamard-response", "k-rr", "laplace-mean",
            "gaussian-mean",
        ),
        default="generic",
        help="randomizer (generic: any pure eps0-LDP randomizer)",
    )
    p.add_argument("--num-bins", type=_positive_int, default=None, help="Hadamard size K (hadamard-response)")
    p.add_argument("--symbols", "-k", type=_positive_int, default=None, help="domain size k (k-rr, block-hadamard-response)")
    p.add_argument(
        "--blocks", type=_positive_int, default=None,
        help="block count B (block-hadamard-response; default: the client's variance-optimal B)",
    )
    p.add_argument(
        "--grid-levels", type=_positive_int, default=None,
        help="grid size G of the Laplace report (laplace-mean; enables its privacy-blanket bound)",
    )
    p.add_argument("--delta0", type=float, default=0.0, help="local delta (gaussian-mean)")
    p.add_argument("--users", "-n", type=_positive_int, default=None,
                   help="number of users n: reports in the shuffled batch (required without --plan)")
    p.add_argument("--delta", type=_probability, default=None, help=delta_help())
    p.add_argument("--rounds", "-T", type=_positive_int, default=1, help="number of identical rounds to compose")
    p.add_argument(
        "--sampling-rate", type=_rate, default=None,
        help="per-round sampling probability of each user (n is then the expected batch size)",
    )
    p.add_argument("--sampling", choices=("poisson", "uniform"), default="poisson", help="sampling scheme")
    add_json_option(p)
    p.add_argument("--plot", metavar="PNG", default=None, help="draw epsilon against n (log x) for all bounds")
    p.add_argument("--plot-n-min", type=_positive_int, default=100, help="smallest n in the plot")
    p.add_argument("--plot-n-max", type=_positive_int, default=10_000_000, help="largest n in the plot")
    p.add_argument("--plot-points", type=_plot_points, default=13,
                   help=f"number of n values in the plot (at most {MAX_PLOT_POINTS})")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.add_argument(
        "--no-lower-bound", action="store_true",
        help="skip the certified lower bound from one i.i.d. dataset (k-rr, hadamard-response, "
             "block-hadamard-response, laplace-mean with --grid-levels; a few seconds at n = 1e8, "
             "not computed above)",
    )
    deprecated_alias(p, "--n", "--users")
    deprecated_alias(p, "-d", "--delta")
    deprecated_alias(p, "--k", "--symbols")
    deprecated_alias(p, "-K", "--num-bins", hint=" (-k is the domain size k: --symbols)")
    p.set_defaults(func=run)


def _local(args):
    from shuffledp.protocol.accounting import LocalGuarantee, block_hadamard_response_guarantee
    from shuffledp.protocol.errors import InvalidParameter

    if args.mechanism == "block-hadamard-response":
        if args.symbols is None:
            raise InvalidParameter("symbols", "--symbols (the domain size k) is required for block-hadamard-response")
        return block_hadamard_response_guarantee(args.epsilon0, args.symbols, args.blocks)
    if args.blocks is not None:
        raise InvalidParameter("blocks", "--blocks only applies to block-hadamard-response")
    return LocalGuarantee(
        args.mechanism,
        args.epsilon0,
        delta0=args.delta0,
        num_bins=args.num_bins if args.mechanism == "hadamard-response" else None,
        k=args.symbols if args.mechanism == "k-rr" else None,
        grid_levels=args.grid_levels,
    )


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.6g}"


def not_applicable(local, rb) -> dict[str, str]:
    """Why each bound of :data:`BOUND_LABELS` the round ``rb`` has no value for has none (the ``n/a`` rows):
    the conditions of ``protocol/accounting/shuffle_round.py`` under which each is evaluated."""
    from shuffledp.protocol.accounting.clones import fmt21_closed_form_valid
    from shuffledp.protocol.accounting.guarantees import in_strong_clone_class
    from shuffledp.protocol.accounting.shuffle_round import (
        BLANKET_MAX_GRID_LEVELS,
        NUMERICAL_MAX_EPSILON0,
        NUMERICAL_MIN_EPSILON0,
        blanket_laws,
    )

    mech, e0, cand = local.mechanism, float(local.epsilon0), rb.candidates
    laws = blanket_laws(local)
    n = rb.evaluated_n or 0
    why: dict[str, str] = {}
    for name in BOUND_LABELS:
        if cand.get(name) is not None:
            continue
        dropped = cand.get(f"{name} (dropped: below the exact floor)")
        if dropped is not None:
            why[name] = f"dropped: its value {dropped:.6g} is below the exact floor, so numerically wrong"
        elif name in ("rr-exact", "rr-exact-smaller-n") and mech != "binary-rr":
            why[name] = "binary-rr only"
        elif name == "rr-exact":
            why[name] = "computed at a grid n' below n (next row)"
        elif name == "rr-exact-smaller-n":
            why[name] = "the exact value at n is given (row above)"
        elif name in ("variation-ratio", "strong-clone", "fmt21-numerical", "blanket") and e0 < NUMERICAL_MIN_EPSILON0:
            why[name] = f"numerical bounds not evaluated below eps0 = {NUMERICAL_MIN_EPSILON0:g}"
        elif name in ("variation-ratio", "strong-clone", "fmt21-numerical") and e0 > NUMERICAL_MAX_EPSILON0:
            why[name] = f"clone pairs not evaluated above eps0 = {NUMERICAL_MAX_EPSILON0:g}"
        elif name == "variation-ratio":
            why[name] = ("replaced by the privacy blanket, at most it (Su, Cheng & Wang 2025)"
                         if laws and mech != "laplace-mean" else f"no variation-ratio parameters for a {mech} randomizer")
        elif name == "strong-clone" and not in_strong_clone_class(local):
            why[name] = "binary-rr and k-rr only: the mechanisms of its class"
        elif name == "blanket":
            why[name] = {
                "binary-rr": "binary-rr: its exact bound is tighter",
                "laplace-mean": ("needs --grid-levels" if local.grid_levels is None
                                 else f"not built above {BLANKET_MAX_GRID_LEVELS} grid levels"),
            }.get(mech, f"no worst input pair known for a {mech} randomizer")
        elif name == "fmt21-closed" and not fmt21_closed_form_valid(e0, max(n, 1), rb.delta):
            why[name] = "outside Theorem 3.1's range: eps0 > log(n / (16 log(4/delta)))"
        elif name == "rdp-girgis":
            why[name] = "eps0 too small for its moments (the round is (0, delta)-DP only where eps0/2 <= delta)"
        else:
            why[name] = "not evaluated for this round"
    return why


def _dataset_lower_bound(local, n: int, delta: float) -> dict[str, Any] | None:
    """The largest certified lower bound on the round's eps from one i.i.d. dataset of the other users
    (``accounting.iid_dataset``), or None where none is offered (binary RR has its own) or computed
    (``n`` above ``LOWER_BOUND_MAX_N``, ``epsilon0`` below the numerical bounds' range, a view the
    numerics refuse: the bound is optional)."""
    from shuffledp.protocol.accounting.iid_dataset import LOWER_BOUND_MAX_N, best_lower_epsilon, lower_bound_candidates
    from shuffledp.protocol.accounting.shuffle_round import NUMERICAL_MIN_EPSILON0
    from shuffledp.protocol.errors import InvalidParameter

    if n > LOWER_BOUND_MAX_N or local.epsilon0 < NUMERICAL_MIN_EPSILON0:
        return None
    views = lower_bound_candidates(local.mechanism, local.epsilon0, k=local.k, num_bins=local.num_bins,
                                   grid_levels=local.grid_levels, num_blocks=local.num_blocks)
    if not views:
        return None
    try:
        eps, name = best_lower_epsilon(views, n, delta, local.epsilon0)
    except InvalidParameter:
        return None
    return {"epsilon": eps, "dataset": name}


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _report(args) -> dict[str, Any]:
    from shuffledp.protocol.accounting import SessionAccountant, shuffled_round

    local = _local(args)
    acc = None
    if args.rounds > 1 or args.sampling_rate is not None:  # checked before any round is computed
        acc = SessionAccountant(reference_delta=args.delta)
        acc.add_round(local, args.users, sampling_rate=args.sampling_rate, sampling=args.sampling, count=args.rounds)
    rb = shuffled_round(local, args.users, args.delta)
    out: dict[str, Any] = {
        "mechanism": local.mechanism,
        "epsilon0": local.epsilon0,
        "num_bins": local.num_bins,
        "k": local.k,
        "num_blocks": local.num_blocks,
        "n": args.users,
        "delta": args.delta,
        "round": rb.as_dict(),
        "not_applicable": not_applicable(local, rb),
        "dataset_lower_bound": None if args.no_lower_bound else _dataset_lower_bound(local, args.users, args.delta),
        "session": None,
    }
    if acc is not None:
        br = acc.epsilon_breakdown(args.delta)
        out["session"] = {
            "rounds": args.rounds,
            "sampling_rate": args.sampling_rate,
            "sampling": args.sampling if args.sampling_rate is not None else None,
            "epsilon": _finite_or_none(min(br.values())),
            "epsilon_pld": _finite_or_none(br["pld"]),  # None: the PLD route is not built or gives no bound
            "epsilon_rdp": _finite_or_none(br["rdp"]),
            "delta": args.delta,
        }
    return out


def _print_text(rep: dict[str, Any], out=None) -> None:
    out = sys.stdout if out is None else out
    r = rep["round"]
    extra = ""
    if rep["mechanism"] == "hadamard-response":
        extra = f", K={rep['num_bins']}"
    elif rep["mechanism"] == "k-rr":
        extra = f", k={rep['k']}"
    elif rep["mechanism"] == "block-hadamard-response":
        extra = f", k={rep['k']}, B={rep['num_blocks']}"
    print(f"one shuffled round: {rep['mechanism']}{extra}, eps0={rep['epsilon0']:g}, n={rep['n']}, "
          f"delta={rep['delta']:g}", file=out)
    width = max(len(v) for v in BOUND_LABELS.values())
    for name, label in BOUND_LABELS.items():
        val = r["candidates"].get(name)
        mark = "  <- used" if name == r["method"] else ""
        if val is None and name in rep.get("not_applicable", {}):
            mark = f"  ({rep['not_applicable'][name]})"
        print(f"  {label:<{width}}  {_fmt(val):>10}{mark}", file=out)
    if r["lower_bound"] is not None:
        print(f"  {'exact shuffled binary RR floor':<{width}}  {_fmt(r['lower_bound']):>10}", file=out)
    else:
        from shuffledp.protocol.accounting.shuffle_round import EVALUATION_MAX_N, NUMERICAL_MIN_EPSILON0

        if rep["n"] > EVALUATION_MAX_N:
            why = f"not computed above n = 10^{len(str(EVALUATION_MAX_N)) - 1}"
        elif rep["epsilon0"] < NUMERICAL_MIN_EPSILON0:
            why = f"not computed below eps0 = {NUMERICAL_MIN_EPSILON0:g}"
        else:
            why = "not a floor for this mechanism"
        print(f"  {'exact shuffled binary RR floor':<{width}}  {'n/a':>10}  ({why})", file=out)
    evaluated = r.get("evaluated_n")
    if evaluated is not None and evaluated < rep["n"]:
        print(f"  numerical bounds evaluated at n' = {evaluated} (valid at n = {rep['n']}: a larger batch is a "
              f"post-processing of a smaller one); closed forms at n", file=out)
    low = rep.get("dataset_lower_bound")
    from shuffledp.protocol.accounting.iid_dataset import LOWER_BOUND_MAX_N

    if low is None and rep["n"] > LOWER_BOUND_MAX_N and rep["mechanism"] in (
            "k-rr", "hadamard-response", "block-hadamard-response", "laplace-mean"):
        print(f"  {'certified lower bound (one dataset)':<{width}}  {'n/a':>10}  "
              f"(not computed above n = 10^{len(str(LOWER_BOUND_MAX_N)) - 1})", file=out)
    if low is not None and low["epsilon"] > 0:
        print(f"  {'certified lower bound (one dataset)':<{width}}  {_fmt(low['epsilon']):>10}  ({low['dataset']}; "
              f"reported / lower = {r['epsilon'] / low['epsilon']:.4f})", file=out)
    print(f"central guarantee: ({r['epsilon']:.6g}, {r['delta']:g})-DP via {r['method']}", file=out)
    s = rep["session"]
    if s is not None:
        samp = ""
        if s["sampling_rate"] is not None:
            samp = f", {s['sampling']} sampling at rate {s['sampling_rate']:g}"
        pld = "n/a" if s["epsilon_pld"] is None else f"{s['epsilon_pld']:.6g}"
        rdp = "n/a" if s["epsilon_rdp"] is None else f"{s['epsilon_rdp']:.6g}"
        eps = "inf" if s["epsilon"] is None else f"{s['epsilon']:.6g}"
        print(f"session of {s['rounds']} round(s){samp}: eps={eps} at delta={s['delta']:g} "
              f"(PLD {pld}, RDP {rdp})", file=out)


def _plot(args, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from tqdm import tqdm

    from shuffledp.protocol.accounting import shuffled_round

    local = _local(args)
    lo, hi = args.plot_n_min, max(args.plot_n_min, args.plot_n_max)
    ns = np.unique(np.round(np.geomspace(lo, hi, args.plot_points)).astype(int))
    series: dict[str, list] = {name: [] for name in BOUND_LABELS}
    floor = []
    for n in tqdm(ns, desc="bounds vs n", unit="n", file=sys.stderr, disable=args.quiet):
        rb = shuffled_round(local, int(n), args.delta)
        for name in BOUND_LABELS:
            series[name].append(rb.candidates.get(name))
        floor.append(rb.lower_bound)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for name, label in BOUND_LABELS.items():
        ys = [np.nan if v is None else v for v in series[name]]
        if all(np.isnan(ys)):
            continue
        ax.plot(ns, ys, marker="o", ms=3, label=label, ls=":" if name == "local" else "-")
    if any(v is not None for v in floor):
        ax.plot(ns, [np.nan if v is None else v for v in floor], "k--", lw=1.5, label="exact shuffled RR (floor)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("reports per shuffled batch n")
    ax.set_ylabel(f"central epsilon at delta={args.delta:g}")
    ax.set_title(f"{local.mechanism}, eps0={local.epsilon0:g}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


#: Largest plan file read.
MAX_PLAN_BYTES = 16 << 20


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def read_plan(path: str) -> dict[str, Any]:
    """The session plan in ``path``: a plan object, or a JSON document with a ``"plan"`` (a ``--json``
    output of simulate or vector); a document of several results (``distribution --json``, a vector
    sweep: ``"results"``) is refused with the hint to pick one plan. :class:`InvalidParameter` for anything else."""
    from shuffledp.protocol.errors import InvalidParameter

    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_PLAN_BYTES + 1)
    except OSError as exc:
        raise InvalidParameter("plan", f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(data) > MAX_PLAN_BYTES:
        raise InvalidParameter("plan", f"{path}: larger than {MAX_PLAN_BYTES} bytes")
    try:
        doc = json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InvalidParameter("plan", f"{path}: not JSON ({exc})") from None
    if isinstance(doc, dict) and isinstance(doc.get("plan"), dict):
        doc = doc["plan"]
    if isinstance(doc, dict) and isinstance(doc.get("results"), list):
        raise InvalidParameter("plan", f"{path}: a document of {len(doc['results'])} results, each with its own plan "
                                       "(results[i].plan; distribution: results[i].estimators[j].privacy.plan): "
                                       "write one of them to the file")
    if not isinstance(doc, dict):
        raise InvalidParameter("plan", f"{path}: not a session plan (a JSON object; from a list of results, "
                                       "write one result's \"plan\" to the file)")
    return doc


def _plan_report(args) -> dict[str, Any]:
    from shuffledp.protocol.accounting.composition import account_plan

    if args.delta is not None:
        from shuffledp.protocol.errors import InvalidParameter

        raise InvalidParameter("delta", "a plan names its own central delta (its \"delta\" field): drop --delta")
    plan = read_plan(args.plan)
    return {"plan": plan, "session": account_plan(plan)}


def _print_plan(rep: dict[str, Any], out=None) -> None:
    out = sys.stdout if out is None else out
    plan, s = rep["plan"], rep["session"]
    print(f"session plan: {len(plan['rounds'])} round(s), central delta {plan['delta']:g}", file=out)
    for i, r in enumerate(plan["rounds"]):
        params = ", ".join(f"{k}={v}" for k, v in sorted(r.get("params", {}).items()))
        k = r.get("reports_per_user", 1)
        sampling = r.get("sampling")
        sampled = "every user" if sampling is None else f"{sampling.get('scheme', 'poisson')} sampling at rate {sampling['rate']:g}"
        print(f"  round {i}: {r['mechanism']} ({params}), eps0 = {r['epsilon0']!r} per report, delta0 = {r.get('delta0', 0.0):g}, "
              f"{k} report{'s' if k > 1 else ''} per user, batch {r['batch']:,} ({sampled})", file=out)
    for i, b in enumerate(s.get("per_round", [])):
        if b.get("epsilon") is not None:
            print(f"    accounted group {i}: eps {b['epsilon']:.6g} at delta {b['delta']:.3g} per round x {b['count']} ({b['method']})",
                  file=out)
    if s["epsilon"] is None:
        print(f"session: {s['method']}", file=out)
    else:
        print(f"session: eps = {s['epsilon']!r} at delta = {s['delta']:g}  ({s['method']})", file=out)


def run(args: argparse.Namespace) -> int:
    from shuffledp.protocol.errors import ShuffleDPError

    if args.plan is not None:
        try:
            rep = _plan_report(args)
        except ShuffleDPError as exc:
            return fail("account", exc, EXIT_USAGE)
        if args.json:
            json.dump(with_run_info(rep, args), sys.stdout, indent=2, allow_nan=False)
            print()
        else:
            _print_plan(rep)
        return 0
    missing = [name for name, value in (("--epsilon0/-e", args.epsilon0), ("--users/-n", args.users)) if value is None]
    if missing:
        print(f"shuffledp account: the following arguments are required: {', '.join(missing)}", file=sys.stderr)
        sys.exit(EXIT_USAGE)  # as argparse's own usage errors (without --plan they are required)
    if args.delta is None:
        args.delta = default_delta(args.users)  # recorded with the parameters
    try:
        rep = _report(args)
        if args.plot:
            _plot(args, args.plot)
    except (ShuffleDPError, OSError) as exc:  # InvalidParameter, AmplificationNotClaimed: these inputs have no answer
        return fail("account", exc, EXIT_USAGE)
    if args.json:
        json.dump(with_run_info(rep, args), sys.stdout, indent=2, allow_nan=False)
        print()
    else:
        _print_text(rep)
        if args.plot:
            print(f"plot written to {args.plot}")
    return 0
