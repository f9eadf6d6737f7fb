"""Speed of the amplification accountant against naive evaluations of the same bounds.

Measured in one run, single core:

* FMT21 numerical bound (eps for delta = 1e-6) at n = 1e6 and 1e8, against
  - ``reference-style``: a scalar loop over blocks of ``step`` clone counts with
    ``scipy.stats.binom`` calls per block end (the structure of the public script,
    with its upper-bound typo fixed), bisection with ``T`` halvings from [0, eps0];
  - ``full-range``: the exact per-clone-count divergence summed over every
    ``c in [0, n-1]`` (vectorized, no window, no blocks), same bisection.
* Corrected variation-ratio bound at n = 1e6: binary RR parameters (1-D pair) and
  Hadamard response (2-D pair with the uninformative-part count), against the
  unblocked exact evaluation over the same windows.

When a naive evaluation would take minutes we time a few delta evaluations and
extrapolate to the ``T`` the search needs; such rows say ``extrapolated``.

Speed targets (each in a fresh process with the on-disk cache off, so no in-process cache
is warm): the default simulation's accounting, a session of 100 identical laplace-mean
rounds at n = 1e5, and one round of every mechanism at n = 1e6 and 1e8. Each is timed with
the current accountant and with the accountant's source at ``--old-commit`` (loaded from git
into a temporary directory and imported in its place), in the same run, and reported as a
ratio. The old accountant's ``laplace_mean_guarantee`` takes eps0 alone: where the current
code passes the grid size it is dropped for the old one (which has no grid-aware bound), so
its epsilon there may be larger. Imports (scipy, dp-accounting: seconds on a loaded machine)
are done before the clock starts, except in two rows: ``simulation: its accounting step``
runs the default simulation whole (``shuffledp simulate``: 20,000 users through the parties,
~25 s) and reports the wall time of its accounting step (the simulation loads the
accountant's imports on a thread while the protocol runs); ``accountant cold start`` is the
accountant alone in a fresh process, imports included.

Progress goes to stderr: one line as each target and each row starts, with its place in the
total. Results go to ``accounting_speed.json`` in the output folder (default ``bench-out/``).

Run: ``python benchmarks/bench_accounting.py [--quick] [--out DIR]`` (``--quick``: n = 1e3, budgets
of 0.05 s and two targets, one round at n = 1e6 and a session of 100 rounds at n = 1e4;
``--targets-only`` for the speed targets alone).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy import special, stats

from _common import arguments, log, parse, pin_one_core, read_result, write_result
from shuffledp.protocol.accounting import (
    fmt21_pair,
    hadamard_response_guarantee,
    strong_clone_pair,
    variation_ratio_pair,
    variation_ratio_parameters,
)

DELTA = 1e-6
T_BISECT = 20
#: The accountant before its speed work (the "old code path" of the targets).
OLD_COMMIT = "4a4e458"
REPO = Path(__file__).resolve().parent.parent
FULL = {"fmt21": ((10**6, (4.0, 1.0)), (10**8, (4.0,))), "vr_n": 10**6, "vr_eps0": (4.0, 1.0), "targets": None}
#: --quick: the same rows at n = 1e3 with small budgets (a naive run still extrapolates past its
#: budget), and two targets, a session and a round. A target runs in a fresh process per accountant,
#: most of a quick run's time: the simulation targets take seconds with the old accountant, and its
#: session of 100 rounds a third of a second at n = 1e4 against half a second at n = 1e5.
QUICK = {"fmt21": ((10**3, (1.0,)),), "vr_n": 10**3, "vr_eps0": (1.0,), "budget": 0.05, "repeats": 1, "timeout": 60.0,
         "targets": ("session 100 x laplace-mean n=1e4", "round laplace-mean eps0=1 n=1e6")}


# --------------------------------------------------------------- naive baselines
def _pair_delta_at_c(c: float, eps: float, b0: float) -> float:
    """Exact D_{e^eps}(Bin(c,1/2)+Bern(b0) || Bin(c,1/2)+Bern(1-b0)) with scalar scipy calls."""
    E = math.exp(eps)
    b1 = 1 - b0
    s = c + 1
    k1 = (2.0 / s) * (b0 - b1) * (1 + E)
    k0 = 2.0 * (b1 - E * b0)
    j = math.floor(-k0 / k1) + 1
    t1 = stats.binom.sf(j - 2, c, 0.5) if c > 0 else float(j - 1 <= 0)
    t2 = stats.binom.sf(j - 1, s, 0.5)
    return max(0.0, k1 * (s / 2) * t1 + k0 * t2)


def reference_style_delta(eps: float, n: int, eps0: float, step: int = 100) -> float:
    """Blocks of ``step`` clone counts, block mass times the block's worst (left) end."""
    m, rate = n - 1, math.exp(-eps0)
    b0 = math.exp(eps0) / (math.exp(eps0) + 1)
    total = 0.0
    for lo in range(0, m + 1, step):
        hi = min(m, lo + step - 1)
        mass = stats.binom.cdf(hi, m, rate) - stats.binom.cdf(lo - 1, m, rate)
        if mass <= 0:
            continue
        total += mass * _pair_delta_at_c(lo, eps, b0)
    return total


def full_range_delta(eps: float, n: int, eps0: float) -> float:
    """Exact per-c divergence for every c in [0, n-1], vectorized (no window)."""
    m, rate = n - 1, math.exp(-eps0)
    b0 = math.exp(eps0) / (math.exp(eps0) + 1)
    b1 = 1 - b0
    E = math.exp(eps)
    c = np.arange(0, m + 1, dtype=np.float64)
    w = stats.binom.pmf(c, m, rate)
    s = c + 1
    k1 = (2.0 / s) * (b0 - b1) * (1 + E)
    k0 = 2.0 * (b1 - E * b0)
    j = np.floor(-k0 / k1) + 1
    t1 = np.where(j - 1 <= 0, 1.0, np.where(j - 1 > c, 0.0, special.betainc(np.maximum(j - 1, 1), np.maximum(c - j + 2, 1), 0.5)))
    t2 = np.where(j <= 0, 1.0, np.where(j > s, 0.0, special.betainc(np.maximum(j, 1), np.maximum(s - j + 1, 1), 0.5)))
    return float(np.sum(w * np.maximum(0.0, k1 * (s / 2) * t1 + k0 * t2)))


def unblocked_pair_delta(pair, eps: float) -> float:
    """A ClonePair's divergence summed exactly over every (c, z) of its windows (no blocks)."""
    m, rt = pair.m, pair.clone_rate
    mu, sd = m * rt, math.sqrt(m * rt * (1 - rt))
    cs = np.arange(max(0, math.floor(mu - 13 * sd)), min(m, math.ceil(mu + 13 * sd)) + 1, dtype=np.float64)
    wc = stats.binom.pmf(cs, m, rt)
    E = math.exp(eps)
    if pair.a2 == 0.0:
        g, _ = pair._G(cs + 1.0, np.zeros_like(cs), E)
        return float(np.dot(wc, g))
    pi2, a2 = pair.r2 / rt, pair.a2
    total = 0.0
    for c, w in zip(cs, wc):
        zmu, zsd = (c + 1) * pi2, math.sqrt((c + 1) * pi2 * (1 - pi2))
        z = np.arange(max(0, math.floor(zmu - 9 * zsd)), min(c + 1, math.ceil(zmu + 9 * zsd)) + 1, dtype=np.float64)
        pz = a2 * stats.binom.pmf(z - 1, c, pi2) + (1 - a2) * stats.binom.pmf(z, c, pi2)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = (c - z + 1) * pi2 / (z * (1 - pi2))
            wz = np.where(z <= 0, 0.0, 1.0 / (1.0 + (1 - a2) / a2 * ratio))
        s = np.maximum(1.0, c + 1 - z)
        g, _ = pair._G(s, wz, E)
        total += w * float(np.dot(pz, g))
    return total


def bisection_time(delta_fn, hi: float, budget_s: float) -> tuple[float, float, bool, int]:
    """Run up to T_BISECT bisection steps; stop early past ``budget_s`` and extrapolate."""
    lo, top = 0.0, hi
    start = time.perf_counter()
    done = 0
    for _ in range(T_BISECT):
        mid = 0.5 * (lo + top)
        if delta_fn(mid) <= DELTA:
            top = mid
        else:
            lo = mid
        done += 1
        if time.perf_counter() - start > budget_s and done < T_BISECT:
            break
    elapsed = time.perf_counter() - start
    extrapolated = done < T_BISECT
    total = elapsed / done * T_BISECT
    return total, (None if extrapolated else top), extrapolated, done


def timed(fn, repeats: int = 3):
    best, value = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - t0)
    return best, value


# ------------------------------------------------------- speed targets
#: Code run in a fresh process: ``SETUP`` loads the accountant (optionally the old source),
#: then one target is timed. Prints one JSON line.
_CHILD = r"""
import importlib.util, json, os, sys, time
old = os.environ.get("BENCH_OLD_ACCOUNTING")
if old:  # the old accountant's source in place of the current one
    import shuffledp.protocol
    spec = importlib.util.spec_from_file_location("shuffledp.protocol.accounting", os.path.join(old, "__init__.py"),
                                                  submodule_search_locations=[old])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["shuffledp.protocol.accounting"] = mod
    spec.loader.exec_module(mod)
    import inspect
    if "grid_levels" not in inspect.signature(mod.laplace_mean_guarantee).parameters:  # no grid-aware bound there
        _laplace = mod.laplace_mean_guarantee
        mod.laplace_mean_guarantee = lambda epsilon0, grid_levels=None: _laplace(epsilon0)
target = json.loads(sys.argv[1])
kind = target["kind"]


def default_simulation(**options):  # the configuration of `shuffledp simulate` with no arguments
    from shuffledp.simulation import SimulationConfig
    from shuffledp.simulation.population import Population
    return SimulationConfig(Population("gaussian", 1.7, 1.0, 20.0, 50), 20000, 1.0, **options)


if kind == "simulation-e2e":  # `shuffledp simulate`, whole: the accounting step's wall time within it
    from shuffledp.simulation import run_simulation
    result = run_simulation(default_simulation(path="messages"))
    print(json.dumps({"seconds": result.extra["accounting_seconds"], "epsilon": result.central["epsilon"],
                      "simulation_seconds": result.seconds})); sys.exit(0)
if kind == "cold-start":  # the accountant alone in a fresh process, its imports included
    from shuffledp.simulation import central_guarantee
    cfg = default_simulation()
    t = time.perf_counter(); value = central_guarantee(cfg)["epsilon"]; dt = time.perf_counter() - t
    print(json.dumps({"seconds": dt, "epsilon": value})); sys.exit(0)
import dp_accounting.pld.privacy_loss_distribution, dp_accounting.rdp.rdp_privacy_accountant  # noqa: F401
from shuffledp.protocol import accounting as A
make = {
    "generic": A.generic_guarantee, "laplace-mean": A.laplace_mean_guarantee, "binary-rr": A.binary_rr_guarantee,
    "hadamard-response/64": lambda e: A.hadamard_response_guarantee(e, 64),
    "k-rr/8": lambda e: A.k_rr_guarantee(e, 8),
    "block-hadamard-response/1024": lambda e: A.block_hadamard_response_guarantee(e, 1024),
}
if kind == "simulation":  # the same, imports done before the clock starts (the accountant's too)
    from shuffledp.simulation import central_guarantee
    cfg = default_simulation()
    t = time.perf_counter()
    value = central_guarantee(cfg)["epsilon"]
elif kind == "session":
    t = time.perf_counter()
    s = A.SessionAccountant()
    s.add_round(make[target["mechanism"]](target["eps0"]), target["n"], count=target["count"])
    value = s.epsilon(target["delta"])
else:
    t = time.perf_counter()
    value = A.shuffled_round(make[target["mechanism"]](target["eps0"]), target["n"], target["delta"]).epsilon
print(json.dumps({"seconds": time.perf_counter() - t, "epsilon": value}))
"""


def speed_targets(quick: bool) -> list[dict]:
    """The speed targets: (name, target-seconds, question)."""
    out = [
        {"name": "simulation: its accounting step, cache off (imports included)", "goal": 0.5, "kind": "simulation-e2e"},
        {"name": "simulation: its accounting step, answer cached", "goal": 0.5, "kind": "simulation-e2e", "cache": "warm"},
        {"name": "accountant cold start (imports included)", "goal": 0.5, "kind": "cold-start"},
        {"name": "simulation", "goal": 0.5, "kind": "simulation"},
        {"name": "session 100 x laplace-mean", "goal": 1.0, "kind": "session", "mechanism": "laplace-mean",
         "eps0": 1.0, "n": 10**5, "count": 100, "delta": 1e-6},
        {"name": "session 2 x binary-rr n=1e6", "goal": 1.0, "kind": "session", "mechanism": "binary-rr",
         "eps0": 1.0, "n": 10**6, "count": 2, "delta": 1e-6},
    ]
    if quick:  # the session target at a smoke run's size
        out.append({"name": "session 100 x laplace-mean n=1e4", "goal": 1.0, "kind": "session",
                    "mechanism": "laplace-mean", "eps0": 1.0, "n": 10**4, "count": 100, "delta": 1e-6})
    mechanisms = ("laplace-mean", "hadamard-response/64", "binary-rr", "k-rr/8", "block-hadamard-response/1024")
    for n, goal in ((10**6, 0.1), (10**8, 1.0)):
        for mech in mechanisms:
            for eps0 in ((1.0,) if quick else (1.0, 4.0)):
                out.append({"name": f"round {mech} eps0={eps0:g} n=1e{round(math.log10(n))}", "goal": goal,
                            "kind": "round", "mechanism": mech, "eps0": eps0, "n": n, "delta": 1e-6})
    return out


def _old_source(commit: str, into: Path) -> Path:
    """The accountant's package at ``commit``, written to ``into`` (from git, no checkout)."""
    names = subprocess.run(["git", "ls-tree", "--name-only", commit, "protocol/accounting/"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    for name in names:
        if name.endswith(".py"):
            text = subprocess.run(["git", "show", f"{commit}:{name}"], cwd=REPO, capture_output=True,
                                  text=True, check=True).stdout
            (into / Path(name).name).write_text(text)
    return into


def _run_child(target: dict, old: Path | None, timeout: float) -> dict:
    env = dict(os.environ, SHUFFLEDP_ACCOUNTING_CACHE="off", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    env.pop("BENCH_OLD_ACCOUNTING", None)
    if old is not None:
        env["BENCH_OLD_ACCOUNTING"] = str(old)
    if target.get("cache") == "warm":  # a fresh cache, filled by a first run; the second run is timed
        with tempfile.TemporaryDirectory() as cache_dir:
            env["SHUFFLEDP_ACCOUNTING_CACHE"] = str(Path(cache_dir) / "accounting.sqlite")
            first = _run_in_child(target, env, timeout)
            return first if first.get("seconds") is None else _run_in_child(target, env, timeout)
    return _run_in_child(target, env, timeout)


def _run_in_child(target: dict, env: dict, timeout: float) -> dict:
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(target)], env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"seconds": None, "epsilon": None, "error": f"timeout after {timeout:.0f}s"}
    if proc.returncode != 0:
        return {"seconds": None, "epsilon": None, "error": proc.stderr.strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_targets(targets: list[dict], old_commit: str | None, repeats: int, timeout: float) -> list[dict]:
    """Time every target with the current and (if ``old_commit``) the old accountant; best of ``repeats``."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        old = None
        if old_commit:
            try:
                old = _old_source(old_commit, Path(tmp))
            except (OSError, subprocess.CalledProcessError) as exc:  # not a git checkout, or a shallow one
                log(f"  old accountant at {old_commit} not available ({exc}): timing the current one only")
        for i, target in enumerate(targets, 1):
            row = {"target": target["name"], "goal_seconds": target["goal"]}
            for label, src in (("new", None), ("old", old)):
                if label == "old" and src is None:
                    continue
                log(f"  [{i}/{len(targets)}] {target['name']}: {label} accountant, {repeats} fresh process(es)")
                runs = [_run_child(target, src, timeout) for _ in range(repeats)]
                ok = [r for r in runs if r.get("seconds") is not None]
                best = min(ok, key=lambda r: r["seconds"]) if ok else runs[0]
                row[f"{label}_seconds"] = best.get("seconds")
                row[f"{label}_epsilon"] = best.get("epsilon")
                if "error" in best:
                    row[f"{label}_error"] = best["error"]
            if row.get("old_seconds") and row.get("new_seconds"):
                row["speedup"] = row["old_seconds"] / row["new_seconds"]
            row["met"] = row.get("new_seconds") is not None and row["new_seconds"] < target["goal"]
            rows.append(row)
            sp = f"{row['speedup']:7.1f}x" if "speedup" in row else "       -"
            old_s = "-" if row.get("old_seconds") is None else f"{row['old_seconds']:.3f}"
            new_s = "-" if row.get("new_seconds") is None else f"{row['new_seconds']:.3f}"
            print(f"  {target['name']:<48} goal<{target['goal']:<4} new {new_s:>8}s  old {old_s:>8}s  {sp}  "
                  f"{'met' if row['met'] else 'NOT met'}  eps new {row.get('new_epsilon')} old {row.get('old_epsilon')}",
                  file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = arguments(__doc__, quick="n = 1e3, two small targets, budgets of 0.05 s (a smoke run)")
    ap.add_argument("--budget", type=float, default=30.0, help="seconds allowed per naive run before extrapolating")
    ap.add_argument("--targets-only", action="store_true",
                    help="only the speed targets (keeps the other rows from the JSON in the output folder)")
    ap.add_argument("--old-commit", default=OLD_COMMIT, help="accountant source to compare the targets with ('' = none)")
    ap.add_argument("--repeats", type=int, default=2, help="fresh-process runs per target and code path (best kept)")
    ap.add_argument("--only", default=None, help="the targets whose name contains this (with --targets-only the "
                                                 "others are kept from the JSON in the output folder)")
    args = parse(ap, argv)
    sizes = dict(QUICK) if args.quick else {**FULL, "budget": args.budget, "repeats": args.repeats, "timeout": 300.0}
    budget = sizes["budget"]
    chosen = [t for t in speed_targets(args.quick) if sizes["targets"] is None or t["name"] in sizes["targets"]]
    chosen = [t for t in chosen if not args.only or args.only in t["name"]]
    sizes["targets"] = [t["name"] for t in chosen]
    previous = read_result(args, "accounting_speed") if args.targets_only else None  # before minutes of work
    # The targets are wall-clock times of the accountant as a user runs it, on every core the
    # machine has (the round curves use two threads); each child sets one BLAS thread itself.
    log(f"speed targets ({len(chosen)}; fresh process each, cache off):")
    targets = run_targets(chosen, args.old_commit or None, sizes["repeats"], sizes["timeout"])
    pin_one_core()
    if previous is not None:
        if args.only:  # keep the saved rows of the targets not re-run, in the targets' order
            fresh = {row["target"]: row for row in targets}
            saved = {row["target"]: row for row in previous.get("targets", [])}
            targets = [fresh.get(t["name"]) or saved[t["name"]] for t in speed_targets(args.quick)
                       if t["name"] in fresh or t["name"] in saved]
        path = write_result(args, "accounting_speed", {**previous, "old_commit": args.old_commit, "targets": targets},
                            sizes=sizes)
        print(f"wrote {path}")
        return 0
    rows = []
    total = 3 * sum(len(eps0s) for _, eps0s in sizes["fmt21"]) + 4 * len(sizes["vr_eps0"])

    def start(what: str) -> None:
        log(f"  [{len(rows) + 1}/{total}] {what} ...")

    def add(bound, n, eps0, method, seconds, eps, extrapolated=False, evals=None, note=""):
        rows.append({"bound": bound, "n": n, "eps0": eps0, "method": method, "seconds": seconds,
                     "epsilon": eps, "extrapolated": extrapolated, "naive_evaluations_measured": evals,
                     "note": note})
        tag = " (extrapolated from %d evals)" % evals if extrapolated else ""
        shown = "n/a" if eps is None else f"{eps:.6g}"
        log(f"  {bound:<22} n={n:<10.0e} eps0={eps0:<4} {method:<18} {seconds:9.3f}s  eps={shown}{tag}")

    log(f"bounds against naive evaluations ({total} rows, one core):")
    # ------------------------------------------------------------- FMT21
    for n, eps0s in sizes["fmt21"]:
        for eps0 in eps0s:
            start(f"fmt21-numerical n={n:.0e} eps0={eps0}: ours")
            t, e = timed(lambda: fmt21_pair(eps0, n).epsilon(DELTA))
            add("fmt21-numerical", n, eps0, "ours", t, e)
            start(f"fmt21-numerical n={n:.0e} eps0={eps0}: reference-style (up to {budget:g} s, then extrapolated)")
            tt, e2, ex, k = bisection_time(lambda x: reference_style_delta(x, n, eps0), eps0, budget)
            add("fmt21-numerical", n, eps0, "reference-style", tt, e2, ex, k, "blocks of 100 clone counts, T=20")
            start(f"fmt21-numerical n={n:.0e} eps0={eps0}: full-range (up to {budget:g} s, then extrapolated)")
            tt, e3, ex, k = bisection_time(lambda x: full_range_delta(x, n, eps0), eps0, budget)
            add("fmt21-numerical", n, eps0, "full-range", tt, e3, ex, k, "all c in [0, n-1], T=20")

    # ----------------------------------------------------- variation-ratio
    n = sizes["vr_n"]
    for eps0 in sizes["vr_eps0"]:
        start(f"variation-ratio (RR) n={n:.0e} eps0={eps0}: ours")
        t, e = timed(lambda: strong_clone_pair(eps0, n).epsilon(DELTA))
        add("variation-ratio (RR)", n, eps0, "ours", t, e, note="binary-RR parameters: 1-D pair")
        pair = strong_clone_pair(eps0, n)
        start(f"variation-ratio (RR) n={n:.0e} eps0={eps0}: unblocked (up to {budget:g} s, then extrapolated)")
        tt, e2, ex, k = bisection_time(lambda x: unblocked_pair_delta(pair, x), eps0, budget)
        add("variation-ratio (RR)", n, eps0, "unblocked", tt, e2, ex, k, "every c of the window, T=20")
        vr = variation_ratio_parameters(hadamard_response_guarantee(eps0, 64))
        hr_pair = lambda: variation_ratio_pair(vr.p, vr.beta, vr.q, n, r2=vr.r2)  # noqa: E731
        start(f"variation-ratio (HR) n={n:.0e} eps0={eps0}: ours")
        t, e = timed(lambda: hr_pair().epsilon(DELTA), repeats=1)
        add("variation-ratio (HR)", n, eps0, "ours", t, e, note="Hadamard response: 2-D pair")
        p2 = hr_pair()
        start(f"variation-ratio (HR) n={n:.0e} eps0={eps0}: unblocked (up to {budget:g} s, then extrapolated)")
        tt, e2, ex, k = bisection_time(lambda x: unblocked_pair_delta(p2, x), eps0, budget)
        add("variation-ratio (HR)", n, eps0, "unblocked", tt, e2, ex, k, "every (c, z) of the windows, T=20")

    # ---------------------------------------------------------------- table
    print()
    print(f"{'bound':<22} {'n':>8} {'eps0':>5} {'ours [s]':>10} {'baseline':<16} {'base [s]':>10} {'ratio':>9}")
    summary = []
    for r in rows:
        if r["method"] == "ours":
            continue
        ours = next(o for o in rows if o["method"] == "ours" and o["bound"] == r["bound"]
                    and o["n"] == r["n"] and o["eps0"] == r["eps0"])
        ratio = r["seconds"] / ours["seconds"]
        flag = "*" if r["extrapolated"] else ""
        print(f"{r['bound']:<22} {r['n']:>8.0e} {r['eps0']:>5} {ours['seconds']:>10.3f} {r['method']:<16} "
              f"{r['seconds']:>9.2f}{flag} {ratio:>8.0f}x")
        summary.append({"bound": r["bound"], "n": r["n"], "eps0": r["eps0"], "baseline": r["method"],
                        "ours_seconds": ours["seconds"], "baseline_seconds": r["seconds"], "speedup": ratio,
                        "baseline_extrapolated": r["extrapolated"], "ours_epsilon": ours["epsilon"],
                        "baseline_epsilon": r["epsilon"]})
    print("* extrapolated to T=20 bisection steps from the evaluations measured")
    path = write_result(args, "accounting_speed", {"delta": DELTA, "bisection_steps": T_BISECT, "rows": rows,
                                                   "summary": summary, "old_commit": args.old_commit,
                                                   "targets": targets}, sizes=sizes)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
