"""Central-model baselines (shuffledp.central): what a trusted curator would get.

1. **Huang–Liang–Yi reproduction.** n = 4,000 users, one N(0, I_d) sample each, rho = 0.5
   (zCDP), d in {16, 128, 512, 1024, 2048}. For each estimator, the ratio
   ``R = mean_t ||est_t - mu|| / mean_t ||xbar_t - mu||`` over paired trials (same data),
   with its delta-method standard error (``shuffledp.central.error_ratio``) and 95 % interval
   over the paired trials (``_common.ratio_ci``: the delta method on the log). Targets: the
   published central figures 1.03, 1.10, 1.33, 1.58, 1.99 (PLAN, Aumüller, Lebeda, Nelson
   & Pagh, PETS 2024, public experiment results: their "IOME" runs of the HLY estimator);
   each row reports whether R is within ±10 % of its target.

   * ``hly-paper``: the estimator as the paper states it (PAPER_SPLIT: medians rho/4,
     threshold 3 rho/16, noise 9 rho/16; rank n - max(sqrt(2d/rho_noise), tau); T = 16
     halvings; search intervals from the public radius R = 25 sqrt(d)).
   * ``hly-released``: the configuration of the implementation that produced the published
     figures (stated reason: it is their setup, not a tuning): medians rho/4, then 1 % / 99 %
     of 3 rho/4 for threshold / noise, rank n - 2 sqrt(2d/rho_noise) - 2 sqrt(T/(2 rho_q)),
     T = 10, median search on [-25, 25] per rotated coordinate, threshold on [0, 25 sqrt(d)].
   * ``winsorized``: Levy et al. 2021 Alg. 2 at the same rho (per-coordinate
     eps0 = sqrt(2 rho / D)), per-coordinate bound B = 25, l2 concentration radius
     tau = sqrt(d) + sqrt(2 log(n / gamma)), gamma = 0.01.
   * ``clip-noise``: Agarwal et al. coarse estimate + Alg. 2 at rho (k = 4, sigma_4 of
     N(0, 1) = 3^(1/4), coarse range |mu_j| <= 25, a quarter of rho for the coarse step).

2. **Heavy tails.** d = 64, m = 10 samples per user, n in {1,000, 4,000, 16,000}, rho = 0.5,
   mean ``mu_j = sin(j + 1)``: multivariate Student-t (nu = 3, k = 2.5) and a Pareto scale
   mixture (alpha = 2.5, k = 4), both with exact sigma_k
   (``shuffledp.central.HeavyTailedPopulation``). Same estimators (HLY as in the paper);
   the winsorized mean gets the per-coordinate radius from the k-th moment by Markov and a
   union bound, ``tau' = (sigma_k / sqrt(m)) (n D / gamma)^(1/k)``.

Run: ``python benchmarks/bench_central.py [--quick] [--out DIR]``; writes central.json and
central.png into the output folder (default ``bench-out/``). Measured on one core: default
6 min 45 s; ``--quick`` (d in {16, 128, 512}, n = 1,000 for the heavy tails, a few trials) seconds.
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np

from _common import arguments, format_ratio, parse, pin_one_core, ratio_ci, write_result

from shuffledp.central import (
    RELEASED_CODE_SPLIT,
    ZCDP,
    HeavyTailedPopulation,
    error_ratio,
    gaussian_concentration_radius,
    heavy_tailed_mean,
    instance_optimal_mean,
    winsorized_mean,
)
from shuffledp.progress import progress_bar, pyplot, save_figure

N_HLY = 4000
RHO = 0.5
BOX = 25.0  # public per-coordinate bound; the l2 radius is BOX sqrt(d)
GAMMA = 0.01
PUBLISHED = {16: 1.03, 128: 1.10, 512: 1.33, 1024: 1.58, 2048: 1.99}
TRIALS = {16: 400, 128: 200, 512: 100, 1024: 60, 2048: 40}
HEAVY = [("student-t", 3.0, 2.5), ("pareto-mixture", 2.5, 4.0)]
HEAVY_NS = [1000, 4000, 16000]
HEAVY_D, HEAVY_M = 64, 10
FULL = {"trials": TRIALS, "heavy_ns": HEAVY_NS, "heavy_trials": 20}
QUICK = {"trials": {16: 8, 128: 4, 512: 2}, "heavy_ns": [1000], "heavy_trials": 3}


def gaussian_estimators(d: int, n: int) -> dict:
    radius = BOX * math.sqrt(d)
    tau = gaussian_concentration_radius(1.0, d, 1, n, GAMMA)
    return {
        "hly-paper": lambda x, rng: instance_optimal_mean(x, ZCDP(RHO), rng, radius=radius).estimate,
        "hly-released": lambda x, rng: instance_optimal_mean(
            x, ZCDP(RHO), rng, radius=radius, split=RELEASED_CODE_SPLIT, rank_rule="released", steps=10,
            median_range=BOX, threshold_range=radius).estimate,
        "winsorized": lambda x, rng: winsorized_mean(x, ZCDP(RHO), rng, bound=BOX, tau=tau, gamma=GAMMA).estimate,
        "clip-noise": lambda x, rng: heavy_tailed_mean(x, ZCDP(RHO), rng, k=4.0, bound=BOX, moment_bound=3.0**0.25).estimate,
    }


def run_trials(make_data, estimators: dict, trials: int, seed_tag: list[int], step) -> dict:
    """Paired trials: every estimator on the same data; errors against the true mean."""
    errors = {name: [] for name in estimators}
    seconds = {name: 0.0 for name in estimators}
    baseline = []
    for t in range(trials):
        rng = np.random.default_rng(seed_tag + [t])
        x, mu = make_data(rng)
        baseline.append(float(np.linalg.norm(x.reshape(x.shape[0], -1, x.shape[-1]).mean(axis=(0, 1)) - mu)))
        for name, estimate in estimators.items():
            start = time.perf_counter()
            est = estimate(x, rng)
            seconds[name] += time.perf_counter() - start
            errors[name].append(float(np.linalg.norm(est - mu)))
        if step:
            step("trials", 1)
    rows = {}
    for name in estimators:
        ratio, se = error_ratio(errors[name], baseline)
        ci = ratio_ci(errors[name], baseline, paired=True, label="mean l2 error / non-private mean's")
        rows[name] = {"ratio": ratio, "se": se, "ratio_ci95": ci["ci95"], "trials": ci["seeds"],
                      "mean_error": float(np.mean(errors[name])),
                      "seconds_per_call": seconds[name] / trials}
    return {"trials": trials, "nonprivate_mean_error": float(np.mean(baseline)), "estimators": rows}


def hly_panel(trials: dict, step) -> list[dict]:
    out = []
    for d in trials:
        def make(rng, d=d):
            return rng.standard_normal((N_HLY, d)), np.zeros(d)

        start = time.perf_counter()
        res = run_trials(make, gaussian_estimators(d, N_HLY), trials[d], [2024, d], step)
        res.update(d=d, n=N_HLY, published=PUBLISHED[d], seconds=time.perf_counter() - start)
        for name in ("hly-paper", "hly-released"):
            row = res["estimators"][name]
            row["relative_to_published"] = row["ratio"] / PUBLISHED[d] - 1.0
            row["within_10pct"] = abs(row["relative_to_published"]) <= 0.10
        out.append(res)
        cells = "  ".join(f"{k} {v['ratio']:.3f}±{v['se']:.3f}" for k, v in res["estimators"].items())
        print(f"  d={d:>5}  published {PUBLISHED[d]:.2f}  {cells}  [{res['seconds']:.0f} s]", flush=True)
    return out


def heavy_panel(ns: list[int], trials: int, step) -> list[dict]:
    out = []
    for kind, tail, k in HEAVY:
        pop = HeavyTailedPopulation(kind, HEAVY_D, HEAVY_M, tail, mu=1.0)
        sigma_k = pop.moment(k)
        for n in ns:
            D = HEAVY_D  # a power of two: no padding
            coord_radius = sigma_k / math.sqrt(HEAVY_M) * (n * D / GAMMA) ** (1.0 / k)
            radius = BOX * math.sqrt(HEAVY_D)
            estimators = {
                "hly-paper": lambda x, rng, radius=radius: instance_optimal_mean(x, ZCDP(RHO), rng, radius=radius).estimate,
                "winsorized": lambda x, rng, c=coord_radius: winsorized_mean(x, ZCDP(RHO), rng, bound=BOX, coordinate_radius=c).estimate,
                "clip-noise": lambda x, rng, k=k, s=sigma_k: heavy_tailed_mean(x, ZCDP(RHO), rng, k=k, bound=BOX, moment_bound=s).estimate,
            }

            def make(rng, pop=pop, n=n):
                return pop.samples(rng, n), pop.mean

            start = time.perf_counter()
            res = run_trials(make, estimators, trials, [7, int(tail * 10), n], step)
            res.update(kind=kind, tail=tail, k=k, sigma_k=sigma_k, n=n, d=HEAVY_D, m=HEAVY_M,
                       variance=pop.variance, seconds=time.perf_counter() - start)
            out.append(res)
            cells = "  ".join(f"{name} {v['ratio']:.2f}±{v['se']:.2f}" for name, v in res["estimators"].items())
            print(f"  {kind:<14} k={k}  n={n:>6}  non-private {res['nonprivate_mean_error']:.4f}  {cells}", flush=True)
    return out


def plot(hly: list[dict], heavy: list[dict], path) -> None:
    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.6))
    ds = [r["d"] for r in hly]
    ax.plot(ds, [r["published"] for r in hly], "k*", ms=11, label="published (PLAN, PETS 2024)")
    ax.fill_between(ds, [0.9 * r["published"] for r in hly], [1.1 * r["published"] for r in hly], color="0.85", label="±10 %")
    styles = {"hly-paper": "o-", "hly-released": "s--", "winsorized": "^:", "clip-noise": "v-."}
    for name, style in styles.items():
        ax.errorbar(ds, [r["estimators"][name]["ratio"] for r in hly], yerr=[2 * r["estimators"][name]["se"] for r in hly],
                    fmt=style, capsize=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("dimension d")
    ax.set_ylabel("l2 error / non-private mean's error")
    ax.set_title(f"N(0, I_d), n = {N_HLY}, rho = {RHO} (zCDP)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    colors = {"hly-paper": "tab:blue", "winsorized": "tab:green", "clip-noise": "tab:red"}
    for kind, style in (("student-t", "o-"), ("pareto-mixture", "s--")):
        rows = [r for r in heavy if r["kind"] == kind]
        for name, color in colors.items():
            bx.errorbar([r["n"] for r in rows], [r["estimators"][name]["ratio"] for r in rows],
                        yerr=[2 * r["estimators"][name]["se"] for r in rows], fmt=style, color=color, capsize=3,
                        label=f"{name}, {kind} (k = {rows[0]['k']})")
    bx.set_xscale("log")
    bx.set_yscale("log")
    bx.set_xlabel("users n")
    bx.set_ylabel("l2 error / non-private mean's error")
    bx.set_title(f"heavy tails: d = {HEAVY_D}, m = {HEAVY_M}, rho = {RHO}")
    bx.grid(True, which="both", alpha=0.3)
    bx.legend(fontsize=7)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    args = parse(arguments(__doc__), argv)
    pin_one_core()
    sizes = QUICK if args.quick else FULL
    trials, heavy_trials = sizes["trials"], sizes["heavy_trials"]
    total = sum(trials.values()) + heavy_trials * len(HEAVY) * len(sizes["heavy_ns"])
    started = time.perf_counter()
    with progress_bar(total, unit="trial") as step:
        print("1. Huang-Liang-Yi reproduction (ratio ± delta-method standard error)", flush=True)
        hly = hly_panel(trials, step)
        t_hly = time.perf_counter() - started
        print("2. heavy tails", flush=True)
        heavy = heavy_panel(sizes["heavy_ns"], heavy_trials, step)
    elapsed = time.perf_counter() - started
    path = write_result(args, "central", {
        "quick": args.quick, "rho": RHO, "box": BOX, "gamma": GAMMA,
        "ratio": "mean_t ||est - mu|| / mean_t ||xbar - mu|| over paired trials; se by the delta method; "
                 "ratio_ci95 by _common.ratio_ci (delta method on the log, paired)",
        "hly": hly, "heavy": heavy,
        "seconds": {"hly_panel": t_hly, "heavy_panel": elapsed - t_hly, "total": elapsed},
    }, sizes=sizes)
    plot(hly, heavy, path.with_suffix(".png"))
    print("HLY figures (ratio [95 % CI] over the trials; published; within ±10 %)"
          + (" (--quick: few trials, a smoke run):" if args.quick else ":"))
    for r in hly:
        for name in ("hly-paper", "hly-released"):
            row = r["estimators"][name]
            shown = {"ratio": row["ratio"], "ci95": row["ratio_ci95"], "seeds": row["trials"]}
            print(f"  d={r['d']:>5} {name:<13} {format_ratio(shown)}  vs {r['published']:.2f}"
                  f"  ({100 * row['relative_to_published']:+.1f} %)  {'yes' if row['within_10pct'] else 'NO'}")
    print(f"total {elapsed:.0f} s; wrote {path} and {path.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
