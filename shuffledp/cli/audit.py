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

``--client CMD`` audits another implementation of the device randomizers instead (e.g.
``--client "node js/dist/cli/randomize.js"``): the local part's rows of the round
mechanisms, with the same statistics, on reports CMD returns over the external client
protocol (``shuffledp/audit/external.py``, docs/cli.md), plus a test of each row's output
law against the built-in randomizer's. A command that cannot start, fails or breaks the
protocol: one line on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from shuffledp.cli.common import EXIT_INTERRUPTED, EXIT_USAGE, add_json_option, central_delta_arg, default_delta, fail
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
    p.add_argument("--delta", type=central_delta_arg, default=None,
                   help=f"central delta of the shuffled audits (default: min(1e-6, n^-1.1) at the largest n audited, "
                   f"n = {max(SHUFFLED_NS):,}: {default_delta(max(SHUFFLED_NS)):g})")
    p.add_argument("--seed", type=int, default=0, help="audit seed (reported)")
    add_json_option(p, "every row")
    p.add_argument("--plot", metavar="PNG", default=None, help="plot claimed epsilon and lower bound against n")
    p.add_argument("--client", default=None, metavar="CMD",
                   help="audit the randomizers of another implementation: CMD (a command line, e.g. "
                   "\"node js/dist/cli/randomize.js\") answers the external client protocol (docs/cli.md); runs the "
                   "local part's round-mechanism rows on its reports, and tests their law against the built-in ones")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="no progress bar (the bar, on stderr, shows the share of the estimated work done and an ETA; "
                   "it shows with --json too)")
    p.set_defaults(func=run)


#: Seconds of work per unit, for the progress bar's total and ETA (only their proportions matter):
#: a local run from a seeded stream / from the OS source; a shuffled row, and per user of its n
#: (its count histograms are drawn whole: the rounds cost nothing); a scalar summation user-round;
#: a vector summation share; a mechanics report; a claim round (its lower-bound audit). From the
#: CPU seconds of each part of a ``--quick`` audit, less the start-up (local 2.1 s seeded + 2.5 s
#: system, shuffled 0.75 s, summation 1.45 s), and the mechanics' wall time (2.7 s: it waits on the
#: shuffler). Under load the parts slow unevenly (the OS source most), so the ETA is an estimate.
COST = {"seeded_run": 2e-7, "system_run": 1.7e-5, "shuffled_row": 0.05, "shuffled_user": 1e-6,
        "summation_user_round": 1.8e-7, "vector_share": 3.7e-8, "mechanics_report": 2.3e-3, "claim_round": 0.06}


def _summation_settings():
    from shuffledp.audit.summation import SUMMATION_SETTINGS

    return SUMMATION_SETTINGS


def audit_work(quick: bool, part: str, *, local_options: dict | None = None,
               ns: tuple[int, ...] = SHUFFLED_NS, session: str | None = None) -> dict[str, list[tuple[str, float]]]:
    """The work :func:`run_audit` will do, as estimated seconds (:data:`COST`), per part and step.

    ``{part: [(step, seconds), ...]}`` for the parts that run: ``local`` one step per source
    (its runs, from :func:`shuffledp.audit.local.audit_local_runs`), ``shuffled`` and
    ``summation`` one per row, ``mechanics`` one per released batch plus its short and
    hostile rounds, ``claim`` one per round of the session file. The progress bar's total
    is the sum (shown as 100 %); :func:`run_audit` reports each step's share as it completes."""
    from shuffledp.audit.local import audit_local_runs
    from shuffledp.audit.summation import VECTOR_ROUNDS, summation_rounds

    work: dict[str, list[tuple[str, float]]] = {}
    if session is not None and part in ("all", "claim"):
        try:
            rounds = len(json.loads(Path(session).read_text()).get("rounds") or [None])
        except (OSError, ValueError, AttributeError):
            rounds = 1
        work["claim"] = [(f"claim round {i}", COST["claim_round"]) for i in range(rounds)]
    if part in ("all", "local"):
        options = local_options if local_options is not None else ({"trials": 10**5, "system_trials": 2000} if quick else {})
        runs = audit_local_runs(**options)
        work["local"] = [("seeded", runs["seeded"] * COST["seeded_run"]), ("system", runs["system"] * COST["system_run"])]
    if part in ("all", "shuffled"):
        work["shuffled"] = [(f"shuffled {m} n={n}", COST["shuffled_row"] + n * COST["shuffled_user"])
                            for m in ("binary-rr", "hadamard-range") for _ in SHUFFLED_EPSILONS for n in ns]
    if part in ("all", "summation"):
        steps = []
        for setting in _summation_settings():
            if len(setting) == 2:
                steps.append((f"summation n={setting[0]}", 4 * summation_rounds(setting[0], quick) * setting[0]
                              * COST["summation_user_round"]))
            else:
                steps.append((f"vector summation dim={setting[2]}", 4 * VECTOR_ROUNDS[quick][1] * COST["vector_share"]))
        work["summation"] = steps
    if part in ("all", "mechanics"):
        batches, batch_size = MECHANICS[quick]
        work["mechanics"] = [("batch", batch_size * COST["mechanics_report"])] * batches + [
            ("short round", batch_size * COST["mechanics_report"]), ("hostile round", batch_size * COST["mechanics_report"])]
    return work


def work_total(work: dict[str, list[tuple[str, float]]]) -> float:
    """Estimated seconds of all the steps of :func:`audit_work`."""
    return sum(seconds for steps in work.values() for _, seconds in steps)


class _PartProgress:
    """Turns one part's own progress calls into its share of the bar (``scale`` units per estimated second).

    ``local``: each call's runs at the seeded or system cost (its stage names the source);
    the other parts: each call with a count is the next step of the plan."""

    def __init__(self, step, part: str, steps: list[tuple[str, float]], scale: float, sent: list[float], total: float):
        self.step, self.part, self.scale = step, part, scale
        self.steps = [seconds for _, seconds in steps]
        self.next = 0
        self.sent, self.total = sent, total  # shared by the parts: the bar never passes its total

    def __call__(self, stage: str, count: int) -> None:
        if self.part == "local":
            cost = COST["system_run"] if stage.endswith(" system") else COST["seeded_run"]
            units = count * cost * self.scale
        elif count > 0 and self.next < len(self.steps):
            units = self.steps[self.next] * self.scale
            self.next += 1
        else:
            units = 0.0
        units = max(0.0, min(units, self.total - self.sent[0]))
        self.sent[0] += units
        self.step(stage, units)


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
    progress_total: float = 100.0,
) -> dict:
    """Run the audits; return ``{"local": [...], "shuffled": [...], "passed": bool, ...}``.

    ``local_options`` go to :func:`shuffledp.audit.local.audit_local` (default: its own,
    or 10x fewer trials with ``quick``); ``shuffled_rounds`` per sample (default 10^7, 10^6 quick).
    ``progress(stage, units)``, if given, receives the work as it completes, scaled so that the
    whole audit (:func:`audit_work`) sums to ``progress_total`` units (default 100: percent).
    Every row of the local, shuffled and summation parts carries the power fields of
    :func:`shuffledp.audit.power.power_fields` (``no_power``, ``runs_needed``, ...)."""
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
    parts: dict[str, _PartProgress] = {}
    if progress is not None:
        work = audit_work(quick, part, local_options=local_options, ns=ns,
                          session=session)
        scale = progress_total / max(work_total(work), 1e-12)
        sent = [0.0]
        parts = {name: _PartProgress(progress, name, steps, scale, sent, progress_total) for name, steps in work.items()}
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

        assert keys is not None  # checked above: --session needs --keys
        key = trusted_analyzer_key(keys)
        session_id = load_public(keys).session_id if Path(keys).is_dir() else None
        out["claim"] = claim_report(load_session(session, key), key, delta, lower_rounds=10**5 if quick else 10**6,
                                    seed=seed, progress=parts.get("claim"), session_id=session_id)
    if part in ("all", "local"):
        from shuffledp.audit.local import audit_local

        options = local_options if local_options is not None else ({"trials": 10**5, "system_trials": 2000} if quick else {})
        options = {"confidence": 1.0 - share, **options}
        out["local"] = [r.as_dict() for r in audit_local(seed=seed, progress=parts.get("local"), **options)]
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
            if parts.get("shuffled"):
                parts["shuffled"](f"shuffled {mechanism} eps0={epsilon0:g} n={n}", 1)
    if part in ("all", "summation"):
        from shuffledp.audit.summation import summation_rows

        out["summation"] = summation_rows(quick, seed, parts.get("summation"), delta=delta, family_alpha=share)
    if part in ("all", "mechanics"):
        from shuffledp.audit.mechanics import audit_mechanics

        batches, batch_size = MECHANICS[quick]
        out["mechanics"] = audit_mechanics(
            broker=broker, batches=batches, batch_size=batch_size, seed=seed, progress=parts.get("mechanics"),
            keys=keys if service else None,
        ).as_dict()
    for row in out["local"] + out["shuffled"] + out["summation"]:
        row["verdict"] = verdict(row)
    out["no_power_rows"] = sum(1 for row in out["local"] + out["shuffled"] + out["summation"] if row["verdict"] == "no power")
    mechanics_ok = out["mechanics"] is None or out["mechanics"]["passed"]
    claim_ok = out["claim"] is None or out["claim"]["passed"]
    out["passed"] = mechanics_ok and claim_ok and all(r["passed"] for r in out["local"] + out["shuffled"] + out["summation"])
    out["seconds"] = time.perf_counter() - started
    return out


def run_client_audit(command: str, quick: bool, seed: int, progress=None, *, trials: int | None = None,
                     **options) -> dict:
    """The external audit (:func:`shuffledp.audit.external.audit_external`) of ``command``, as a
    result of :func:`run_audit`'s shape: its rows under ``"local"`` (source ``external``, each
    with its law test under ``"law"``), ``"implementation"`` naming the command, nothing under
    the other parts. ``trials`` per input and row (default 2 x 10^5, 10^4 with ``quick``), with the
    whole audit's false-alarm budget :data:`AUDIT_ALPHA`; ``options`` go to ``audit_external``.
    ``progress(stage, runs)`` as the command's runs arrive (:func:`client_audit_runs` in all)."""
    from shuffledp.audit.external import audit_external

    started = time.perf_counter()
    trials = client_trials(quick) if trials is None else trials
    audit = audit_external(command, trials=trials, seed=seed, progress=progress, confidence=1.0 - AUDIT_ALPHA, **options)
    rows = audit.rows()
    for row in rows:
        row["verdict"] = verdict(row)
    law_level = audit.laws[0].level if audit.laws else 0.0
    return {"quick": quick, "seed": seed, "implementation": f"external client: {audit.implementation}",
            "local": rows, "shuffled": [], "summation": [], "mechanics": None, "claim": None,
            "false_alarm_budget": {"total": AUDIT_ALPHA, "local": AUDIT_ALPHA, "mechanics": 0.0},
            "law_alpha": law_level * len(rows), "law_differs": sum(1 for row in rows if row["law"]["differs"]),
            "no_power_rows": sum(1 for row in rows if row["verdict"] == "no power"),
            "passed": audit.passed, "seconds": time.perf_counter() - started}


def client_trials(quick: bool) -> int:
    """Runs per input of each row of the external audit: 2 x 10^5, or 10^4 with ``--quick``."""
    from shuffledp.audit.external import DEFAULT_EXTERNAL_TRIALS, QUICK_EXTERNAL_TRIALS

    return QUICK_EXTERNAL_TRIALS if quick else DEFAULT_EXTERNAL_TRIALS


def client_audit_runs(quick: bool, trials: int | None = None, **options) -> int:
    """The runs :func:`run_client_audit` asks the command for (the progress bar's total)."""
    from shuffledp.audit.external import external_cases, external_runs

    cases = external_cases(**{k: v for k, v in options.items() if k in ("epsilons", "mechanisms")})
    return external_runs(cases, client_trials(quick) if trials is None else trials)


def _run_client(args: argparse.Namespace) -> int:
    """``audit --client CMD``: only the external audit runs (the other parts audit the Python services)."""
    conflicts = [name for name, given in (("--part", args.part not in ("all", "local")), ("--session", args.session),
                                          ("--keys", args.keys), ("--broker", args.broker),
                                          ("--shuffler-service", args.shuffler_service)) if given]
    if conflicts:
        return fail("audit", f"--client audits the local randomizers only; it does not take {', '.join(conflicts)}",
                    EXIT_USAGE)
    try:
        with progress_bar(client_audit_runs(args.quick), quiet=args.quiet, unit="run") as step:
            result = run_client_audit(args.client, args.quick, args.seed, progress=step)
    except ShuffleDPError as exc:  # the command cannot start, fails, or breaks the protocol; bad parameters
        return fail("audit", exc, EXIT_USAGE)
    except KeyboardInterrupt:  # the client's process is ended on the way out (ExternalClient closes it)
        print("shuffledp audit: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    try:
        print(json.dumps(with_run_info(result, args), indent=2, default=float) if args.json else format_audit(result))
    except BrokenPipeError:
        sys.stderr.close()
    if args.plot and plot_audit(result, args.plot) and not args.json:
        print(f"plot written to {args.plot}")
    return 0 if result["passed"] else 1


def verdict(row: dict) -> str:
    """``"VIOLATED"`` (the lower bound exceeds the claim), ``"no power"`` (the lower bound is 0: the
    row neither confirms nor refutes its claim) or ``"ok"`` (a positive lower bound within the claim)."""
    if not row["passed"]:
        return "VIOLATED"
    return "no power" if row.get("no_power") else "ok"


def _power_note(row: dict, unit: str, claimed: float) -> str | None:
    """The indented line under a no-power row (:func:`shuffledp.audit.power.power_note`)."""
    from shuffledp.audit.power import power_note

    note = power_note(row, unit, claimed)
    return None if note is None else f"      {note}"


def format_audit(result: dict) -> str:
    lines = [f"shuffledp audit{' --quick' if result['quick'] else ''}: "
             f"{'PASSED' if result['passed'] else 'FAILED'} (seed {result['seed']}, {result['seconds']:.0f} s)"]
    if result.get("claim"):
        from shuffledp.audit.claim import format_claim

        lines += ["", format_claim(result["claim"])]
    if result["local"]:
        implementation = result.get("implementation") or "built-in (the Python randomizers of shuffledp)"
        laws = any("law" in r for r in result["local"])
        lines += ["", "local randomizers: empirical lower bounds on eps0 (95 %, family-wise) vs the claim",
                  f"  implementation audited: {implementation}",
                  "  event: assumption-free (one event, Clopper-Pearson); gaussian: parametric, Gaussian reports only,",
                  "  assumes discrete-Gaussian noise of unknown scale (checked by a fit test; '-' where withheld)"]
        if laws:
            lines.append(f"  law p: two-sample chi-square p-value, these reports vs the built-in randomizer's on the same "
                         f"inputs ('differs' below {result['local'][0]['law']['level']:.2g}: "
                         f"{result.get('law_alpha', 0.05):g} family-wise)")
        lines.append(f"  {'mechanism':<24} {'source':<8} {'eps0':>6} {'delta0':>8} {'event':>8} {'gaussian':>8} "
                     f"{'ratio':>7} {'from':<10}  {'verdict':<8}" + (f" {'law p':>8}" if laws else ""))
        for r in result["local"]:
            param = r.get("epsilon_param")
            param_text = "" if param is None and not r.get("detail") else ("-" if param is None else f"{param:.4f}")
            law = r.get("law")
            law_text = "" if law is None else f" {law['pvalue']:>8.3g}" + (" differs" if law["differs"] else "")
            lines.append((f"  {r['mechanism']:<24} {r['source']:<8} {r['epsilon0']:>6g} {r['delta0']:>8.2g} "
                          f"{r['epsilon_lb']:>8.4f} {param_text:>8} {r['ratio']:>7.3f} {r.get('ratio_method', 'event'):<10}  "
                          f"{verdict(r):<8}" + law_text).rstrip())
            if param is None and r.get("detail"):
                lines.append(f"      {r['detail']}")
            note = _power_note(r, "trials per input", r["epsilon0"])
            if note:
                lines.append(note)
    if result["shuffled"]:
        lines += ["", "shuffled rounds: empirical lower bound on the central eps vs the accountant's claim",
                  f"  {'mechanism':<15} {'n':>7} {'eps0':>5} {'claimed':>9} {'exact':>8} {'lower':>8} {'lower/claim':>11}  verdict"]
        for r in result["shuffled"]:
            exact = f"{r['exact_epsilon']:.4f}" if r["exact_epsilon"] is not None else "-"
            ratio = r["lower_over_claim"]
            lines.append(f"  {r['mechanism']:<15} {r['n']:>7,} {r['epsilon0']:>5g} {r['claimed_epsilon']:>9.4f} "
                         f"{exact:>8} {r['lower_bound']:>8.4f} {ratio:>11.3f}  {verdict(r)}")
            note = _power_note(r, "rounds per sample", r["claimed_epsilon"])
            if note:
                lines.append(note)
    if result.get("summation"):
        lines += ["", "multi-message summation: empirical lower bound on the central eps (decoded sum) vs the claim",
                  f"  {'mechanism':<15} {'n':>7} {'target':>6} {'claimed':>9} {'noise':>8} {'lower':>8} {'lower/claim':>11}  verdict"]
        for r in result["summation"]:
            noise = f"{r['exact_epsilon']:.4f}" if r.get("exact_epsilon") is not None else "-"
            lines.append(f"  {r['mechanism']:<15} {r['n']:>7,} {r['epsilon0']:>6g} {r['claimed_epsilon']:>9.4f} "
                         f"{noise:>8} {r['lower_bound']:>8.4f} {r['lower_over_claim']:>11.3f}  "
                         f"{verdict(r)}")
            note = _power_note(r, "rounds per sample", r["claimed_epsilon"])
            if note:
                lines.append(note)
    mechanics = result.get("mechanics")
    if mechanics:
        lines += ["", f"shuffler mechanics ({mechanics['transport']}; {mechanics['batches']} released batches of "
                      f"{mechanics['batch_size']}, {mechanics['seconds']:.0f} s)"]
        for c in mechanics["checks"]:
            status = "FAILED" if c["status"] == "failed" else c["status"]
            lines.append(f"  {c['name']:<20} {status:<8} {c['detail']}")
    failed = [r for r in result["local"] + result["shuffled"] + result.get("summation", []) if not r["passed"]]
    weak = [r for r in result["local"] + result["shuffled"] + result.get("summation", []) if r["passed"] and r.get("no_power")]
    if weak:
        lines += ["", f"{len(weak)} row(s) with no power: lower bound 0, so they neither confirm nor refute their claim; "
                      f"each says how many runs give a positive bound with {weak[0].get('power', 0.9) * 100:.0f} % probability"]
    if failed:
        lines += ["", f"{len(failed)} claim(s) violated: the code leaks more than it claims (see the rows marked VIOLATED)"]
    if result.get("law_differs"):
        lines += ["", f"{result['law_differs']} row(s) whose reports' law differs from the built-in randomizer's "
                      f"(marked 'differs'): the implementations disagree; the privacy verdict is the bounds'"]
    if mechanics and mechanics["failed"]:
        lines += ["", f"shuffler mechanics failed: {', '.join(mechanics['failed'])}"]
    return "\n".join(lines)


PLOT_PARTS = ("local", "shuffled", "summation")


def _floor(values: list[float]) -> float:
    """Where a panel draws lower bounds of 0: a third of its smallest positive value, on a log axis."""
    positive = [v for v in values if v is not None and v > 0]
    return (min(positive) if positive else 1.0) / 3.0


def _zero_marker(ax, xs: list[float], floor: float, label: str | None) -> None:
    if xs:
        ax.plot(xs, [floor] * len(xs), linestyle="none", marker="v", ms=8, mfc="white", mec="crimson", mew=1.5,
                label=label, zorder=5)


def _finish(ax, floor: float, ncol: int) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    for axis in (ax.yaxis, ax.xaxis):
        if axis.get_scale() == "log":
            axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(plain)
            axis.set_minor_formatter(NullFormatter())
    if any(line.get_marker() == "v" for line in ax.get_lines()):  # the floor, where bounds of 0 are drawn
        ax.axhline(floor, color="crimson", lw=0.6, ls=":", zorder=1)
    ax.set_ylim(bottom=floor / 1.6)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=ncol, frameon=False)


ZERO_LABEL = "lower bound 0 (no power), drawn at the floor"


def _local_panel(ax, rows: list[dict]) -> None:
    mechanisms = sorted({r["mechanism"] for r in rows})
    best = [max(r["epsilon_lb"], r.get("epsilon_param") or 0.0) for r in rows]
    floor = _floor(best + [r["epsilon0"] for r in rows])
    claims = sorted({r["epsilon0"] for r in rows})
    spread = 1.06 ** (len(mechanisms) / 2 + 1)
    for j, claim in enumerate(claims):
        ax.plot([claim / spread, claim * spread], [claim, claim], "-", color="black", lw=2,
                label="claimed eps0 (a bound above it: VIOLATED)" if j == 0 else None)
    zeros = []
    for i, mechanism in enumerate(mechanisms):
        for source, marker in (("seeded", "o"), ("system", "s"), ("external", "D")):
            pts = [(r["epsilon0"] * 1.06 ** (i - len(mechanisms) / 2), b) for r, b in zip(rows, best)
                   if r["mechanism"] == mechanism and r["source"] == source]
            pos = [(x, y) for x, y in pts if y > 0]
            zeros += [x for x, y in pts if y <= 0]
            if pos:
                ax.plot(*zip(*pos), linestyle="none", marker=marker, color=f"C{i % 10}", ms=5, alpha=0.85,
                        mfc=f"C{i % 10}" if source == "seeded" else "none",
                        label=f"{mechanism} ({source})")
    _zero_marker(ax, zeros, floor, ZERO_LABEL)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("claimed eps0 (local randomizer; points spread for legibility)")
    ax.set_ylabel("eps0: claim and empirical lower bound")
    ax.set_title(f"local randomizers: {len(rows)} rows")
    _finish(ax, floor, 2)


def _shuffled_panel(ax, rows: list[dict]) -> None:
    floor = _floor([r["lower_bound"] for r in rows] + [r["claimed_epsilon"] for r in rows])
    zeros: list[float] = []
    styles = {"binary-rr": ("o", "-"), "hadamard-range": ("s", "--")}
    for i, epsilon0 in enumerate(sorted({r["epsilon0"] for r in rows})):
        for mechanism in sorted({r["mechanism"] for r in rows}):
            sel = sorted((r for r in rows if r["mechanism"] == mechanism and r["epsilon0"] == epsilon0), key=lambda r: r["n"])
            if not sel:
                continue
            marker, line = styles.get(mechanism, ("^", "-."))
            color = f"C{i}"
            ns = [r["n"] for r in sel]
            ax.plot(ns, [r["claimed_epsilon"] for r in sel], line, color=color, lw=1.5,
                    label=f"claimed: {mechanism}, eps0 = {epsilon0:g}")
            pos = [(r["n"], r["lower_bound"]) for r in sel if r["lower_bound"] > 0]
            zeros += [r["n"] * 1.07 ** (len(zeros) % 5 - 2) for r in sel if not r["lower_bound"] > 0]
            if pos:
                ax.plot(*zip(*pos), linestyle="none", marker=marker, color=color, ms=6,
                        label=f"lower bound: {mechanism}, eps0 = {epsilon0:g}")
            exact = [(r["n"], r["exact_epsilon"]) for r in sel if r.get("exact_epsilon") is not None]
            if exact:
                ax.plot(*zip(*exact), "x", color="black", ms=7, label="exact (binary RR)" if i == 0 else None)
    _zero_marker(ax, zeros, floor, ZERO_LABEL)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("n (users in the shuffled round)")
    ax.set_ylabel(f"central eps at delta = {rows[0]['delta']:.0e}")
    ax.set_title("shuffled rounds: claim (lines) vs lower bound (markers)")
    _finish(ax, floor, 2)


def _summation_panel(ax, rows: list[dict]) -> None:
    floor = _floor([r["lower_bound"] for r in rows] + [r["claimed_epsilon"] for r in rows])
    labels = [("vector" if r.get("dim") else "scalar") + f"\nn={r['n']:,}" + (f"\ndim={r['dim']}" if r.get("dim") else "")
              + f"\neps={r['epsilon0']:g}" for r in rows]
    xs = list(range(len(rows)))
    ax.plot(xs, [r["claimed_epsilon"] for r in rows], linestyle="none", marker="_", ms=22, mew=2.5, color="black",
            label="claimed central eps (above it: VIOLATED)")
    exact = [(x, r["exact_epsilon"]) for x, r in zip(xs, rows) if r.get("exact_epsilon") is not None]
    if exact:
        ax.plot(*zip(*exact), linestyle="none", marker="x", ms=8, color="C2",
                label="exact eps of the statistic (the most a test can reach)")
    pos = [(x, r["lower_bound"]) for x, r in zip(xs, rows) if r["lower_bound"] > 0]
    if pos:
        ax.plot(*zip(*pos), linestyle="none", marker="o", ms=7, color="C0", label="empirical lower bound")
    _zero_marker(ax, [x for x, r in zip(xs, rows) if not r["lower_bound"] > 0], floor, ZERO_LABEL)
    ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_xlim(-0.6, len(rows) - 0.4)
    ax.set_ylabel(f"central eps at delta = {rows[0]['delta']:.0e}")
    ax.set_ylim(top=max(r["claimed_epsilon"] for r in rows) * 1.35)
    ax.set_title("multi-message summation: claim vs lower bound")
    _finish(ax, floor, 1)


def audit_figure(result: dict):
    """The audit's figure: one panel per part with lower bounds that ran (local, shuffled,
    summation), claims and empirical lower bounds on log axes, legends below each panel;
    a lower bound of 0 (no power) is drawn at the panel's floor (dotted line) as a hollow
    red triangle. Returns the matplotlib figure (None when no such part ran)."""
    plt = pyplot()
    parts = [p for p in PLOT_PARTS if result.get(p)]
    if not parts:
        return None
    fig, axes = plt.subplots(1, len(parts), figsize=(5.6 * len(parts), 6.2), squeeze=False)
    draw = {"local": _local_panel, "shuffled": _shuffled_panel, "summation": _summation_panel}
    for ax, part in zip(axes[0], parts):
        draw[part](ax, result[part])
    rows = [r for p in parts for r in result[p]]
    weak = sum(1 for r in rows if r.get("no_power") and r["passed"])
    fig.suptitle(f"shuffledp audit{' --quick' if result.get('quick') else ''}: "
                 f"{'PASSED' if result['passed'] else 'FAILED'}; {len(rows)} rows, {weak} with no power")
    return fig


def plot_audit(result: dict, path: str) -> bool:
    """Write :func:`audit_figure` to ``path`` (PNG); False (nothing written) when no part with lower bounds ran."""
    fig = audit_figure(result)
    if fig is None:
        return False
    save_figure(fig, path)
    return True


def run(args: argparse.Namespace) -> int:
    if args.delta is None:
        args.delta = default_delta(max(SHUFFLED_NS))  # recorded with the parameters
    if args.client is not None:
        return _run_client(args)
    try:
        # progress on stderr, as a share of the estimated work (audit_work): percent done, elapsed, ETA
        with progress_bar(100, quiet=args.quiet, unit="%") as step:
            result = run_audit(args.quick, args.part, args.delta, args.seed, progress=step, broker=args.broker,
                               session=args.session, keys=args.keys, service=args.shuffler_service)
    except ShuffleDPError as exc:  # bad parameters; a session file refused (altered, unsigned, unreadable), a key file unreadable
        return fail("audit", exc, EXIT_USAGE)
    try:
        print(json.dumps(with_run_info(result, args), indent=2, default=float) if args.json else format_audit(result))
    except BrokenPipeError:  # e.g. piped into `head`: the verdict is still the exit code
        sys.stderr.close()
    if args.plot and plot_audit(result, args.plot) and not args.json:
        print(f"plot written to {args.plot}")
    return 0 if result["passed"] else 1
