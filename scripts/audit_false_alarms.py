"""False alarms of ``shuffledp audit`` on correct code, measured over repeated audits.

Runs the audit (``--quick`` by default: that is what an operator runs often) with
``--repeats`` different seeds on the shipped, correct code, and reports:

* how many audits failed (a false alarm: the code is correct) and the Clopper–Pearson
  95 % upper bound on the false-alarm rate;
* per part, the largest ratio lower bound / claim over all runs (a false alarm needs a
  ratio above 1) and, for the mechanics, the smallest p-value of its statistical checks
  (a false alarm needs one below its Bonferroni level).

Writes ``bench-out/audit_false_alarms.json`` (``--out`` another file; ``--out
benchmarks/results/audit_false_alarms.json`` refreshes the committed copy) and a plot of each run's largest ratio per part.
Takes about 40 s per quick audit on one core (``benchmarks/results/audit_false_alarms.json``:
1,602 s for 40), more while other jobs run; it prints its estimate first, then its progress::

    python scripts/audit_false_alarms.py --repeats 40          # about half an hour
    python scripts/audit_false_alarms.py --repeats 5 --part shuffled
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RATIO_PARTS = ("local", "shuffled", "summation")


def _ratio(row: dict) -> float | None:
    if "ratio" in row:  # local rows: lower bound / eps0
        return row["ratio"]
    return row.get("lower_over_claim")


def summarize(runs: list[dict]) -> dict:
    """False-alarm count, its upper confidence bound, and the margins per part."""
    from shuffledp.audit.local import clopper_pearson

    alarms = sum(1 for r in runs if not r["passed"])
    parts = {}
    for part in RATIO_PARTS:
        ratios = [max((x for x in (_ratio(row) for row in r[part]) if x is not None), default=None) for r in runs]
        ratios = [x for x in ratios if x is not None]
        if ratios:
            parts[part] = {"largest_ratio": max(ratios), "median_of_largest": sorted(ratios)[len(ratios) // 2],
                           "per_run_largest": ratios}
    mechanics = [r["mechanics"] for r in runs if r.get("mechanics")]
    if mechanics:
        p_values = [min((c["p_value"] for c in m["checks"] if c["p_value"] is not None), default=1.0) for m in mechanics]
        parts["mechanics"] = {"failed_runs": sum(1 for m in mechanics if not m["passed"]),
                              "smallest_p_value": min(p_values), "per_run_smallest_p": p_values}
    return {
        "repeats": len(runs),
        "false_alarms": alarms,
        "rate": alarms / len(runs),
        "rate_upper_95": clopper_pearson(alarms, len(runs), 0.95)[1],
        "parts": parts,
        "failed_seeds": [r["seed"] for r in runs if not r["passed"]],
    }


def plot(summary: dict, path: Path) -> None:
    from shuffledp.progress import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    names = [p for p in RATIO_PARTS if p in summary["parts"]]
    if names:
        ax.boxplot([summary["parts"][p]["per_run_largest"] for p in names])
        ax.set_xticks(range(1, len(names) + 1), names)
        ax.axhline(1.0, color="red", ls="--", label="lower bound = claim (a false alarm above)")
        ax.set_ylabel("largest lower bound / claim in one audit")
    else:
        from shuffledp.audit.mechanics import STATISTICAL_ALPHA, STATISTICAL_CHECKS

        ax.hist(summary["parts"]["mechanics"]["per_run_smallest_p"], bins=20, range=(0, 1))
        ax.axvline(STATISTICAL_ALPHA / len(STATISTICAL_CHECKS), color="red", ls="--", label="Bonferroni level")
        ax.set_xlabel("smallest p-value of the mechanics' statistical checks in one audit")
    ax.set_title(f"{summary['repeats']} audits of correct code: {summary['false_alarms']} false alarm(s), "
                 f"rate <= {summary['rate_upper_95']:.3f} (95 %)")
    ax.legend(fontsize=8)
    save_figure(fig, str(path))


#: The committed measurement the up-front estimate scales: quick audits of every part.
MEASURED = ROOT / "benchmarks" / "results" / "audit_false_alarms.json"


def duration_estimate(repeats: int, full: bool, part: str) -> str:
    """What the run will take, said before it starts: :data:`MEASURED`'s seconds per quick audit of
    every part, times ``repeats``; a full audit is about ten times a quick one (``shuffledp audit
    --quick``: "about 10x fewer trials"), and one part takes at most what all of them take."""
    try:
        measured = json.loads(MEASURED.read_text())
        per_audit = measured["seconds"] / measured["repeats"]
    except (OSError, ValueError, KeyError, ZeroDivisionError):
        return f"{repeats} audits: about a minute each on one core"
    from shuffledp.progress import duration_text

    total = per_audit * repeats * (10 if full else 1)
    bound = "at most about" if part != "all" else "about"
    return (f"{repeats} {'full' if full else 'quick'} audit(s) of part {part}: {bound} {duration_text(total)} "
            f"({per_audit:.0f} s per quick audit of every part in {MEASURED.relative_to(ROOT)}"
            f"{', x10 for a full one' if full else ''}); progress below")


def main(argv: list[str] | None = None) -> int:
    from shuffledp.cli.audit import PARTS, run_audit
    from shuffledp.progress import progress_bar

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--part", choices=PARTS, default="all")
    parser.add_argument("--full", action="store_true", help="the default audit instead of --quick")
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=Path("bench-out") / "audit_false_alarms.json",
                        help="the JSON file to write (its plot goes beside it); default: %(default)s")
    args = parser.parse_args(argv)
    print(duration_estimate(args.repeats, args.full, args.part), file=sys.stderr, flush=True)
    runs = []
    started = time.time()
    with progress_bar(args.repeats, unit="audit") as step:
        for i in range(args.repeats):
            result = run_audit(not args.full, args.part, 1e-6, args.first_seed + i)
            runs.append(result)
            if not result["passed"]:  # say what failed at once: a false alarm is worth reading
                from shuffledp.cli.audit import format_audit

                print(f"\nseed {result['seed']}: FAILED\n{format_audit(result)}", file=sys.stderr)
            if step:
                step(f"audits ({sum(not r['passed'] for r in runs)} false alarm(s))", 1)
    summary = summarize(runs)
    summary.update({"quick": not args.full, "part": args.part, "seconds": time.time() - started})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2, default=float) + "\n")
    plot(summary, args.out.with_suffix(".png"))
    print(f"{summary['repeats']} audits ({'quick' if not args.full else 'default'}, part {args.part}): "
          f"{summary['false_alarms']} false alarm(s); rate <= {summary['rate_upper_95']:.3f} at 95 %")
    for part, info in summary["parts"].items():
        if "largest_ratio" in info:
            print(f"  {part:<10} largest lower/claim {info['largest_ratio']:.3f} (median of per-audit largest "
                  f"{info['median_of_largest']:.3f})")
        else:
            print(f"  {part:<10} {info['failed_runs']} failed run(s); smallest p-value {info['smallest_p_value']:.3g}")
    print(f"wrote {args.out} and {args.out.with_suffix('.png')} ({summary['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
