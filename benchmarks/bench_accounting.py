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
Results go to ``benchmarks/results/accounting_speed.json``.

Run: ``python benchmarks/bench_accounting.py`` (add ``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np
from scipy import special, stats

from _common import pin_one_core, write_result
from shuffledp.protocol.accounting import (
    fmt21_pair,
    hadamard_response_guarantee,
    strong_clone_pair,
    variation_ratio_pair,
    variation_ratio_parameters,
)

DELTA = 1e-6
T_BISECT = 20  # halvings a plain bisection needs for ~1e-6 relative accuracy on [0, eps0]


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small budgets (smoke test)")
    ap.add_argument("--budget", type=float, default=30.0, help="seconds allowed per naive run before extrapolating")
    args = ap.parse_args(argv)
    budget = 3.0 if args.quick else args.budget
    pin_one_core()
    rows = []

    def add(bound, n, eps0, method, seconds, eps, extrapolated=False, evals=None, note=""):
        rows.append({"bound": bound, "n": n, "eps0": eps0, "method": method, "seconds": seconds,
                     "epsilon": eps, "extrapolated": extrapolated, "naive_evaluations_measured": evals,
                     "note": note})
        tag = " (extrapolated from %d evals)" % evals if extrapolated else ""
        shown = "n/a" if eps is None else f"{eps:.6g}"
        print(f"  {bound:<22} n={n:<10.0e} eps0={eps0:<4} {method:<18} {seconds:9.3f}s  eps={shown}{tag}",
              file=sys.stderr, flush=True)

    # ------------------------------------------------------------- FMT21
    for n, eps0s in ((10**6, (4.0, 1.0)), (10**8, (4.0,))):
        for eps0 in eps0s:
            t, e = timed(lambda: fmt21_pair(eps0, n).epsilon(DELTA))
            add("fmt21-numerical", n, eps0, "ours", t, e)
            tt, e2, ex, k = bisection_time(lambda x: reference_style_delta(x, n, eps0), eps0, budget)
            add("fmt21-numerical", n, eps0, "reference-style", tt, e2, ex, k, "blocks of 100 clone counts, T=20")
            tt, e3, ex, k = bisection_time(lambda x: full_range_delta(x, n, eps0), eps0, budget)
            add("fmt21-numerical", n, eps0, "full-range", tt, e3, ex, k, "all c in [0, n-1], T=20")

    # ----------------------------------------------------- variation-ratio
    n = 10**6
    for eps0 in (4.0, 1.0):
        t, e = timed(lambda: strong_clone_pair(eps0, n).epsilon(DELTA))
        add("variation-ratio (RR)", n, eps0, "ours", t, e, note="binary-RR parameters: 1-D pair")
        pair = strong_clone_pair(eps0, n)
        tt, e2, ex, k = bisection_time(lambda x: unblocked_pair_delta(pair, x), eps0, budget)
        add("variation-ratio (RR)", n, eps0, "unblocked", tt, e2, ex, k, "every c of the window, T=20")
        vr = variation_ratio_parameters(hadamard_response_guarantee(eps0, 64))
        hr_pair = lambda: variation_ratio_pair(vr.p, vr.beta, vr.q, n, r2=vr.r2)  # noqa: E731
        t, e = timed(lambda: hr_pair().epsilon(DELTA), repeats=1)
        add("variation-ratio (HR)", n, eps0, "ours", t, e, note="Hadamard response: 2-D pair")
        p2 = hr_pair()
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
    path = write_result("accounting_speed", {"delta": DELTA, "bisection_steps": T_BISECT, "rows": rows,
                                             "summary": summary})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
