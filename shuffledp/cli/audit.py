"""``shuffledp audit``: check the privacy claims against the running code.

Parts (``--part``, default all):

* **local**: every shipped randomizer (``shuffledp/audit/local.py``) on worst-case
  input pairs, both random sources, Clopper-Pearson at 95 % (family-wise);
* **shuffled**: one shuffled round of binary randomized response and of Hadamard
  range reports at several n (``shuffledp/audit/shuffled.py``), against the
  accountant's central epsilon (and the exact one for RR where it is computed);
* **summation**: the central epsilon of multi-message summation, on the decoded sum
  of the real clients' shares (``shuffledp/audit/summation.py``);
* **mechanics**: a running shuffler (in-process, or over ``--broker``) checked for
  uniform output positions, constant lengths, a clean analyzer view, the minimum
  batch, quotas and replays (``shuffledp/audit/mechanics.py``).

The first three set an empirical *lower* bound against the claimed *upper* bound;
the audit passes when no lower bound exceeds its claim and every mechanics check
holds. ``--session FILE --keys DIR`` adds the claim of a deployment: each round of an
``analyzer run --output`` file, its signed spec verified, accounted at the batch
sizes delivered (``shuffledp/audit/claim.py``). ``--quick`` cuts the work about 10x
(under a minute); ``--json`` prints every row; ``--plot`` draws the claimed epsilon
and the lower bound against n. Exit code 0: passed; 1: a claim was violated or a
check failed; 2: bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from shuffledp.cli.common import EXIT_USAGE, add_json_option, default_delta, fail
from shuffledp.cli.run_info import with_run_info
from shuffledp.progress import progress_bar, pyplot, save_figure
from shuffledp.protocol.errors import InvalidParameter, ShuffleDPError

SHUFFLED_NS = (100, 1000, 10_000)
PARTS = ("all", "local", "shuffled", "summation", "mechanics", "claim")
#: The whole audit's false-alarm budget on correct code: every lower bound of every part, together.
AUDIT_ALPHA = 0.05
#: Mechanics audit size (released batches, reports per batch): default and --quick.
MECHANICS = {False: (100, 64), True: (20, 32)}
SHUFFLED_EPSILONS = (1.0, 4.0)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "audit", help="check the privacy claims against the running code (empirical lower bounds)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="about 10x fewer trials (about a minute)")
    p.add_argument("--part", choices=PARTS, default="all", help="which audit to run (default: all of them)")
    p.add_argument("--session", default=None, metavar="FILE",
                   help="a deployment's session file (analyzer run --output): audit its rounds' claims (needs --keys)")
    p.add_argument("--keys", default=None, metavar="DIR|HEX",
                   help="the analyzer signing key the auditor trusts: a keys directory (public.json) or 64 hex digits")
    p.add_argument("--broker", default=None, metavar="BROKER",
                   help="run the mechanics audit over this MQTT broker (HOST[:PORT] or a broker directory)")
    p.add_argument("--shuffler-service", action="store_true",
                   help="mechanics: audit the shuffler service already serving the session of --keys DIR over --broker "
                   "(an audit deployment: the auditor reads every party's key) instead of starting one")
    p.add_argument("--delta", type=float, default=None,
                   help=f"central delta of the shuffled audits (default: min(1e-6, n^-1.1) at the largest n audited, "
                   f"n = {max(SHUFFLED_NS):,}: {default_delta(max(SHUFFLED_NS)):g})")
    p.add_argument("--seed", type=int, default=0, help="audit seed (reported)")
    add_json_option(p, "every row")
    p.add_argument("--plot", metavar="PNG", default=None, help="plot claimed epsilon and lower bound against n")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run_audit(
    quick: bool,
    part: str,
    delta: float,
    seed: int,
    progress=None,
    *,
    local_options: dict | None = None,
    shuffled_rounds: int | None = None,
    ns: tuple[int, ...] = SHUFFLED_NS,
    broker: str | None = None,
    session: str | None = None,
    keys: str | None = None,
    service: bool = False,
) -> dict:
    """Run the audits; return ``{"local": [...], "shuffled": [...], "passed": bool, ...}``.

    ``local_options`` go to :func:`shuffledp.audit.local.audit_local` (default: its own,
    or 10x fewer trials with ``quick``); ``shuffled_rounds`` per sample (default 10^7, 10^6 quick)."""
    from shuffledp.audit.shuffled import audit_shuffled

    if part not in PARTS:
        raise InvalidParameter("part", f"must be one of {', '.join(PARTS)}, got {part!r}")
    if session is not None and keys is None:
        raise InvalidParameter("session", "--session needs --keys (the analyzer key to verify it with)")
    if keys is not None and session is None and not service:
        raise InvalidParameter("keys", "--keys goes with --session FILE (the claim) or --shuffler-service (the mechanics)")
    if service and (keys is None or broker is None or not Path(keys).is_dir()):
        raise InvalidParameter("shuffler-service", "needs --keys DIR (the deployment) and --broker (where it serves)")
    if part == "claim" and session is None:
        raise InvalidParameter("session", "--part claim needs --session FILE and --keys DIR")
    from shuffledp.audit.mechanics import STATISTICAL_ALPHA

    started = time.perf_counter()
    # One false-alarm budget for the whole audit (Bonferroni): AUDIT_ALPHA, split evenly over
    # the parts with lower bounds that run, then over each part's bounds.
    bounded = [p for p in ("local", "shuffled", "summation") if part in ("all", p)]
    share = AUDIT_ALPHA / max(1, len(bounded))
    out: dict = {"quick": quick, "seed": seed, "local": [], "shuffled": [], "summation": [], "mechanics": None, "claim": None,
                 "false_alarm_budget": {"total": AUDIT_ALPHA if bounded else 0.0, **{p: share for p in bounded},
                                        "mechanics": STATISTICAL_ALPHA if part in ("all", "mechanics") else 0.0}}
    if session is not None and part in ("all", "claim"):  # first: a bad file is refused before minutes of work
        from shuffledp.audit.claim import claim_report, load_session, trusted_analyzer_key
        from shuffledp.deploy.keys import load_public

        key = trusted_analyzer_key(keys)
        session_id = load_public(keys).session_id if Path(keys).is_dir() else None
        out["claim"] = claim_report(load_session(session, key), key, delta, lower_rounds=10**5 if quick else 10**6,
                                    seed=seed, progress=progress, session_id=session_id)
    if part in ("all", "local"):
        from shuffledp.audit.local import audit_local

        options = local_options if local_options is not None else ({"trials": 10**5, "system_trials": 2000} if quick else {})
        options = {"confidence": 1.0 - share, **options}
        out["local"] = [r.as_dict() for r in audit_local(seed=seed, progress=progress, **options)]
    if part in ("all", "shuffled"):
        rounds = shuffled_rounds if shuffled_rounds is not None else (10**6 if quick else 10**7)
        rows = [(m, b, e, n) for m, b in (("binary-rr", 2), ("hadamard-range", 16)) for e in SHUFFLED_EPSILONS for n in ns]
        confidence = 1.0 - share / len(rows)
        for mechanism, bins, epsilon0, n in rows:
            result = audit_shuffled(mechanism, n, epsilon0, delta, rounds=rounds, num_bins=bins, seed=seed,
                                    confidence=confidence)
            row = result.as_dict()
            row["num_bins"] = bins
            out["shuffled"].append(row)
            if progress:
                progress(f"shuffled {mechanism} n={n}", 1)
    if part in ("all", "summation"):
        from shuffledp.audit.summation import summation_rows

        out["summation"] = summation_rows(quick, seed, progress, delta=delta, family_alpha=share)
    if part in ("all", "mechanics"):
        from shuffledp.audit.mechanics import audit_mechanics

        batches, batch_size = MECHANICS[quick]
        out["mechanics"] = audit_mechanics(
            broker=broker, batches=batches, batch_size=batch_size, seed=seed, progress=progress,
            keys=keys if service else None,
        ).as_dict()
    mechanics_ok = out["mechanics"] is None or out["mechanics"]["passed"]
    claim_ok = out["claim"] is None or out["claim"]["passed"]
    out["passed"] = mechanics_ok and claim_ok and all(r["passed"] for r in out["local"] + out["shuffled"] + out["summation"])
    out["seconds"] = time.perf_counter() - started
    return out


def format_audit(result: dict) -> str:
    lines = [f"shuffledp audit{' --quick' if result['quick'] else ''}: "
             f"{'PASSED' if result['passed'] else 'FAILED'} (seed {result['seed']}, {result['seconds']:.0f} s)"]
    if result.get("claim"):
        from shuffledp.audit.claim import format_claim

        lines += ["", format_claim(result["claim"])]
    if result["local"]:
        lines += ["", "local randomizers: empirical lower bounds on eps0 (95 %, family-wise) vs the claim",
                  "  event: assumption-free (one event, Clopper-Pearson); gaussian: parametric, Gaussian reports only,",
                  "  assumes discrete-Gaussian noise of unknown scale (checked by a fit test; '-' where withheld)",
                  f"  {'mechanism':<24} {'source':<8} {'eps0':>6} {'delta0':>8} {'event':>8} {'gaussian':>8} "
                  f"{'ratio':>7} {'from':<10}  verdict"]
        for r in result["local"]:
            param = r.get("epsilon_param")
            param_text = "" if param is None and not r.get("detail") else ("-" if param is None else f"{param:.4f}")
            lines.append(f"  {r['mechanism']:<24} {r['source']:<8} {r['epsilon0']:>6g} {r['delta0']:>8.2g} "
                         f"{r['epsilon_lb']:>8.4f} {param_text:>8} {r['ratio']:>7.3f} {r.get('ratio_method', 'event'):<10}  "
                         f"{'ok' if r['passed'] else 'VIOLATED'}")
            if param is None and r.get("detail"):
                lines.append(f"      {r['detail']}")
    if result["shuffled"]:
        lines += ["", "shuffled rounds: empirical lower bound on the central eps vs the accountant's claim",
                  f"  {'mechanism':<15} {'n':>7} {'eps0':>5} {'claimed':>9} {'exact':>8} {'lower':>8} {'lower/claim':>11}  verdict"]
        for r in result["shuffled"]:
            exact = f"{r['exact_epsilon']:.4f}" if r["exact_epsilon"] is not None else "-"
            ratio = r["lower_over_claim"]
            lines.append(f"  {r['mechanism']:<15} {r['n']:>7,} {r['epsilon0']:>5g} {r['claimed_epsilon']:>9.4f} "
                         f"{exact:>8} {r['lower_bound']:>8.4f} {ratio:>11.3f}  {'ok' if r['passed'] else 'VIOLATED'}")
    if result.get("summation"):
        lines += ["", "multi-message summation: empirical lower bound on the central eps (decoded sum) vs the claim",
                  f"  {'mechanism':<15} {'n':>7} {'target':>6} {'claimed':>9} {'noise':>8} {'lower':>8} {'lower/claim':>11}  verdict"]
        for r in result["summation"]:
            noise = f"{r['exact_epsilon']:.4f}" if r.get("exact_epsilon") is not None else "-"
            lines.append(f"  {r['mechanism']:<15} {r['n']:>7,} {r['epsilon0']:>6g} {r['claimed_epsilon']:>9.4f} "
                         f"{noise:>8} {r['lower_bound']:>8.4f} {r['lower_over_claim']:>11.3f}  "
                         f"{'ok' if r['passed'] else 'VIOLATED'}")
    mechanics = result.get("mechanics")
    if mechanics:
        lines += ["", f"shuffler mechanics ({mechanics['transport']}; {mechanics['batches']} released batches of "
                      f"{mechanics['batch_size']}, {mechanics['seconds']:.0f} s)"]
        for c in mechanics["checks"]:
            status = "FAILED" if c["status"] == "failed" else c["status"]
            lines.append(f"  {c['name']:<20} {status:<8} {c['detail']}")
    failed = [r for r in result["local"] + result["shuffled"] + result.get("summation", []) if not r["passed"]]
    if failed:
        lines += ["", f"{len(failed)} claim(s) violated: the code leaks more than it claims (see the rows marked VIOLATED)"]
    if mechanics and mechanics["failed"]:
        lines += ["", f"shuffler mechanics failed: {', '.join(mechanics['failed'])}"]
    return "\n".join(lines)


def plot_audit(result: dict, path: str) -> None:
    """Claimed central epsilon and the empirical lower bound against n, one panel per mechanism
    (the shuffled rounds and multi-message summation)."""
    plt = pyplot()
    shuffled = result["shuffled"] + result.get("summation", [])
    mechanisms = sorted({r["mechanism"] for r in shuffled})
    fig, axes = plt.subplots(1, max(1, len(mechanisms)), figsize=(5.5 * max(1, len(mechanisms)), 4), squeeze=False)
    for ax, mechanism in zip(axes[0], mechanisms):
        for i, epsilon0 in enumerate(sorted({r["epsilon0"] for r in shuffled})):
            rows = sorted((r for r in shuffled if r["mechanism"] == mechanism and r["epsilon0"] == epsilon0),
                          key=lambda r: r["n"])
            ns = [r["n"] for r in rows]
            color = f"C{i}"
            ax.plot(ns, [r["claimed_epsilon"] for r in rows], "-o", color=color, label=f"claimed, ε0 (target) = {epsilon0:g}")
            ax.plot(ns, [r["lower_bound"] for r in rows], "--s", color=color, label=f"empirical lower bound, ε0 = {epsilon0:g}")
            exact = [(r["n"], r["exact_epsilon"]) for r in rows if r["exact_epsilon"] is not None]
            if exact:
                ax.plot(*zip(*exact), "x", color="black", ms=8, label="exact" if i == 0 else None)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("n (users in the shuffled round)")
        ax.set_ylabel("central ε at δ = %.0e" % shuffled[0]["delta"])
        ax.set_title(f"{mechanism}: claim vs audit")
        ax.legend(fontsize=7)
    fig.suptitle(f"shuffledp audit: {'PASSED' if result['passed'] else 'FAILED'}")
    save_figure(fig, path)


def run(args: argparse.Namespace) -> int:
    if args.delta is None:
        args.delta = default_delta(max(SHUFFLED_NS))  # recorded with the parameters
    try:
        with progress_bar(None, quiet=args.quiet, unit="audit") as step:
            result = run_audit(args.quick, args.part, args.delta, args.seed, progress=step, broker=args.broker,
                               session=args.session, keys=args.keys, service=args.shuffler_service)
    except ShuffleDPError as exc:  # bad parameters; a session file refused (altered, unsigned, unreadable), a key file unreadable
        return fail("audit", exc, EXIT_USAGE)
    try:
        print(json.dumps(with_run_info(result, args), indent=2, default=float) if args.json else format_audit(result))
    except BrokenPipeError:  # e.g. piped into `head`: the verdict is still the exit code
        sys.stderr.close()
    if args.plot and (result["shuffled"] or result.get("summation")):
        plot_audit(result, args.plot)
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0 if result["passed"] else 1
