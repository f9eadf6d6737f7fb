"""``shuffledp audit``: check the privacy claims against the running code.

Two parts, each an empirical *lower* bound set against the claimed *upper* bound:

* **local**: every shipped randomizer (``shuffledp/audit_local.py``) on worst-case
  input pairs, both random sources, Clopper-Pearson at 95 % (family-wise);
* **shuffled**: one shuffled round of binary randomized response and of Hadamard
  range reports at several n (``shuffledp/audit_shuffled.py``), against the
  accountant's central epsilon (and the exact one for RR where it is computed).

The audit passes when no lower bound exceeds its claim; the table gives both and
their ratio. ``--quick`` cuts the trials about 10x (about a minute); ``--json``
prints every row; ``--plot`` draws the claimed epsilon and the lower bound against
n for the shuffled rounds. Exit code 0: passed; 1: a claim was violated; 2: bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from shuffledp.progress import progress_bar, pyplot, save_figure
from shuffledp.protocol.errors import InvalidParameter

SHUFFLED_NS = (100, 1000, 10_000)
SHUFFLED_EPSILONS = (1.0, 4.0)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "audit", help="check the privacy claims against the running code (empirical lower bounds)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="about 10x fewer trials (about a minute)")
    p.add_argument("--part", choices=("all", "local", "shuffled"), default="all", help="which audits to run")
    p.add_argument("--delta", type=float, default=1e-6, help="central delta of the shuffled audits")
    p.add_argument("--seed", type=int, default=0, help="audit seed (reported)")
    p.add_argument("--json", action="store_true", help="print every row as JSON")
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
) -> dict:
    """Run the audits; return ``{"local": [...], "shuffled": [...], "passed": bool, ...}``.

    ``local_options`` go to :func:`shuffledp.audit_local.audit_local` (default: its own,
    or 10x fewer trials with ``quick``); ``shuffled_rounds`` per sample (default 10^7, 10^6 quick)."""
    from shuffledp.audit_shuffled import audit_shuffled

    if part not in ("all", "local", "shuffled"):
        raise InvalidParameter("part", f"must be all, local or shuffled, got {part!r}")
    started = time.perf_counter()
    out: dict = {"quick": quick, "seed": seed, "local": [], "shuffled": []}
    if part in ("all", "local"):
        from shuffledp.audit_local import audit_local

        options = local_options if local_options is not None else ({"trials": 10**5, "system_trials": 2000} if quick else {})
        out["local"] = [r.as_dict() for r in audit_local(seed=seed, progress=progress, **options)]
    if part in ("all", "shuffled"):
        rounds = shuffled_rounds if shuffled_rounds is not None else (10**6 if quick else 10**7)
        for mechanism, bins in (("binary-rr", 2), ("hadamard-range", 16)):
            for epsilon0 in SHUFFLED_EPSILONS:
                for n in ns:
                    result = audit_shuffled(mechanism, n, epsilon0, delta, rounds=rounds, num_bins=bins, seed=seed)
                    row = result.as_dict()
                    row["num_bins"] = bins
                    out["shuffled"].append(row)
                    if progress:
                        progress(f"shuffled {mechanism} n={n}", 1)
    out["passed"] = all(r["passed"] for r in out["local"] + out["shuffled"])
    out["seconds"] = time.perf_counter() - started
    return out


def format_audit(result: dict) -> str:
    lines = [f"shuffledp audit{' --quick' if result['quick'] else ''}: "
             f"{'PASSED' if result['passed'] else 'FAILED'} (seed {result['seed']}, {result['seconds']:.0f} s)"]
    if result["local"]:
        lines += ["", "local randomizers: empirical lower bound on eps0 (95 %, family-wise) vs the claim",
                  f"  {'mechanism':<24} {'source':<8} {'eps0':>6} {'delta0':>8} {'lower bound':>12} {'ratio':>7}  verdict"]
        for r in result["local"]:
            lines.append(f"  {r['mechanism']:<24} {r['source']:<8} {r['epsilon0']:>6g} {r['delta0']:>8.2g} "
                         f"{r['epsilon_lb']:>12.4f} {r['ratio']:>7.3f}  {'ok' if r['passed'] else 'VIOLATED'}")
    if result["shuffled"]:
        lines += ["", "shuffled rounds: empirical lower bound on the central eps vs the accountant's claim",
                  f"  {'mechanism':<15} {'n':>7} {'eps0':>5} {'claimed':>9} {'exact':>8} {'lower':>8} {'lower/claim':>11}  verdict"]
        for r in result["shuffled"]:
            exact = f"{r['exact_epsilon']:.4f}" if r["exact_epsilon"] is not None else "-"
            ratio = r["lower_over_claim"]
            lines.append(f"  {r['mechanism']:<15} {r['n']:>7,} {r['epsilon0']:>5g} {r['claimed_epsilon']:>9.4f} "
                         f"{exact:>8} {r['lower_bound']:>8.4f} {ratio:>11.3f}  {'ok' if r['passed'] else 'VIOLATED'}")
    failed = [r for r in result["local"] + result["shuffled"] if not r["passed"]]
    if failed:
        lines += ["", f"{len(failed)} claim(s) violated: the code leaks more than it claims (see the rows marked VIOLATED)"]
    return "\n".join(lines)


def plot_audit(result: dict, path: str) -> None:
    """Claimed central epsilon and the empirical lower bound against n, one panel per mechanism."""
    plt = pyplot()
    mechanisms = sorted({r["mechanism"] for r in result["shuffled"]})
    fig, axes = plt.subplots(1, max(1, len(mechanisms)), figsize=(5.5 * max(1, len(mechanisms)), 4), squeeze=False)
    for ax, mechanism in zip(axes[0], mechanisms):
        for i, epsilon0 in enumerate(sorted({r["epsilon0"] for r in result["shuffled"]})):
            rows = sorted((r for r in result["shuffled"] if r["mechanism"] == mechanism and r["epsilon0"] == epsilon0),
                          key=lambda r: r["n"])
            ns = [r["n"] for r in rows]
            color = f"C{i}"
            ax.plot(ns, [r["claimed_epsilon"] for r in rows], "-o", color=color, label=f"claimed, ε0 = {epsilon0:g}")
            ax.plot(ns, [r["lower_bound"] for r in rows], "--s", color=color, label=f"empirical lower bound, ε0 = {epsilon0:g}")
            exact = [(r["n"], r["exact_epsilon"]) for r in rows if r["exact_epsilon"] is not None]
            if exact:
                ax.plot(*zip(*exact), "x", color="black", ms=8, label="exact" if i == 0 else None)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("n (users in the shuffled round)")
        ax.set_ylabel("central ε at δ = %.0e" % result["shuffled"][0]["delta"])
        ax.set_title(f"{mechanism}: claim vs audit")
        ax.legend(fontsize=7)
    fig.suptitle(f"shuffledp audit: {'PASSED' if result['passed'] else 'FAILED'}")
    save_figure(fig, path)


def run(args: argparse.Namespace) -> int:
    try:
        with progress_bar(None, quiet=args.quiet, unit="audit") as step:
            result = run_audit(args.quick, args.part, args.delta, args.seed, progress=step)
    except InvalidParameter as exc:
        print(f"shuffledp audit: invalid parameter {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2, default=float) if args.json else format_audit(result))
    if args.plot and result["shuffled"]:
        plot_audit(result, args.plot)
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0 if result["passed"] else 1
