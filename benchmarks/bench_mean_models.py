"""Mean estimation in the local, shuffle and central models, on the same data.

Data (Huang, Liang & Yi 2021, Fig. 3 setting: mean far from the origin, anisotropic
covariance): d = 64, one vector per user, ``x_i ~ N(mu, diag(sigma^2))`` with
``mu_j = 5`` (``||mu|| = 40``) and ``sigma_j^2`` uniform on ``[0, 10]`` (drawn once, fixed
seed); every estimator is told the public bound ``||x|| <= R = 100``. One privacy
budget for all: user-level ``(eps, delta) = (1, 1e-6)`` for the session.

Estimators (each on the vectorized engine for the local and shuffle models; the same
data for all):

* central (a trusted curator, ``shuffledp.central``): the non-private mean; the winsorized
  mean (Levy et al. 2021, Alg. 2) given the *true* per-coordinate radius
  ``tau' = s sqrt(2 log(2 n D / gamma))``, ``s^2 = trace(Sigma) / D`` (after the rotation
  every coordinate has that variance exactly; oracle knowledge that favours it); the
  Huang–Liang–Yi shifted clipped mean (``instance_optimal_mean``, the paper's split, rank
  rule and PrivQuant), its ``(eps, delta)`` spent as the largest rho for which its
  composition of Gaussian mechanisms is ``(eps, delta)``-DP (``central-hly``: exact, by the
  Gaussian privacy curve) or as Bun & Steinke's Prop. 1.3 gives it for any rho-zCDP
  mechanism (``central-hly-zcdp``: 1.6 times less rho at (1, 1e-6)).
* shuffle: the instance-optimal protocol (``analyzer/instance_optimal.py``, shuffle
  version: amplified tree and norm rounds, multi-message summation); the same with the
  threshold at the fixed median of the shifted norms (``fixed_quantile = 0.5``); the
  vector protocol of Girgis et al. (Alg. 5, sampled mode, Laplace) with each of its two
  rounds amplified to ``(eps/2, delta/2)`` and the true concentration radius (oracle).
* local: the instance-optimal protocol, local version; the vector protocol at local
  ``eps0 = eps``.

Error: ``||estimate - xbar||`` (the privacy cost alone: the error against the users'
own mean) and ``||estimate - mu||``; the figure shows the median over seeds. Every run of a
shifted clipped mean (central HLY and the instance-optimal protocols) also records where
its error comes from (``decomposition``: the centre's distance to ``xbar``, the clipping
radius and fraction clipped, the clipping bias and the noise, computed from the data), and
the summary gives their RMS over seeds per n.

The headline, at every n: the shuffle-model instance-optimal mean against the central
Huang–Liang–Yi estimator (``central-hly``, the paper's own central estimator, which clips
into the known domain), as the ratio of their RMS errors against ``xbar`` over paired
seeds (the same data per seed): ``sqrt(mean_s e_shuffle(s)^2 / mean_s e_central(s)^2)``,
with its 95 % interval by the delta method on the log of the ratio of mean squared errors,
the covariance of the pairs included (``_common.ratio_ci``). Secondary rows: the same
ratio against ``central-hly-zcdp`` (the baseline with the looser conversion) and against
the central winsorized mean, which does not project into the known domain (at n = 1,000
its estimates have norms in the thousands while every user's vector has norm about 51 or
less; ``estimate_norm`` and ``max_data_norm`` are recorded), so a ratio to it flatters any
estimator that does. The headline's seeds per n are ``HEADLINE_SEEDS`` (the headline
estimators only); the other estimators run on the first ``SEEDS`` of them at the sizes
``PANEL_NS``.

Run: ``python benchmarks/bench_mean_models.py [--quick] [--out DIR] [--headline-only]``
(30 minutes on a 2-core machine shared with other work, four fifths of it the shuffle
protocol's simulated summation at n >= 10^5; ``--headline-only`` skips the other
estimators); writes mean_models.json and mean_models.png (error panels and the headline
ratio with its intervals) into the output folder (default ``bench-out/``). ``--replot``
redraws the figure from the JSON.
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np

from _common import arguments, format_ratio, parse, ratio_ci, read_result, write_result

from shuffledp.analyzer.instance_optimal import InstanceOptimalConfig, InstanceOptimalProtocol
from shuffledp.analyzer.instance_optimal_budget import amplified_epsilon0
from shuffledp.analyzer.vector_mean import VectorMeanConfig, VectorMeanProtocol
from shuffledp.central import ApproxDP, instance_optimal_mean, winsorized_mean
from shuffledp.simulation.engine import run_fast
from shuffledp.protocol.errors import ShuffleDPError
from shuffledp.protocol.mechanisms.rotation import RandomRotation
from tqdm import tqdm

from shuffledp.progress import pyplot, save_figure

DIM = 64
RADIUS = 100.0
MEAN = 5.0
EPSILON, DELTA = 1.0, 1e-6
GAMMA = 0.01
NS = (1_000, 3_000, 10_000, 30_000, 100_000, 300_000)
#: Sizes at which every estimator runs (the figure's panels); the headline runs at every n.
PANEL_NS = (1_000, 3_000, 10_000, 30_000, 100_000)
#: Seeds per n for every estimator (the figure's medians).
SEEDS = 3
#: Seeds per n for the headline's estimators: enough for a 95 % interval on the RMS-error ratio
#: shuffle-vs-central of about +-15 % or better where the ratio is steady.
HEADLINE_SEEDS = {n: 30 for n in NS}
HEADLINE = ("central-hly", "central-hly-zcdp", "shuffle-instance-optimal", "central-winsorized")
#: --quick: two small sizes (the shuffle protocols' accounting at each n is most of a quick run's time),
#: one seed for the panel and three for the headline (a smoke run drawing every row and every panel of
#: the figure).
QUICK = {"ns": (500, 1_000), "panel_ns": (500, 1_000), "seeds": 1, "headline_seeds": {500: 3, 1_000: 3}}

MODEL_OF = {
    "nonprivate": "central",
    "central-winsorized": "central",
    "central-hly": "central",
    "central-hly-zcdp": "central",
    "shuffle-instance-optimal": "shuffle",
    "shuffle-fixed-median": "shuffle",
    "shuffle-girgis-vector": "shuffle",
    "local-instance-optimal": "local",
    "local-girgis-vector": "local",
}


def population(dim: int, seed: int = 2021) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return np.full(dim, MEAN), np.sqrt(rng.uniform(0.0, 10.0, dim))


def draw(n: int, mu: np.ndarray, sigma: np.ndarray, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, n])
    return mu + rng.normal(size=(n, mu.size)) * sigma


def coordinate_radius(sigma: np.ndarray, n: int) -> float:
    """Every rotated coordinate of ``x - mu`` is ``N(0, trace(Sigma) / D)`` (``U_jk^2 = 1/D``); a union
    bound over ``n D`` of them at ``gamma`` gives the per-coordinate concentration radius."""
    padded = 1 << (sigma.size - 1).bit_length()
    s = math.sqrt(float((sigma**2).sum()) / padded)
    return s * math.sqrt(2.0 * math.log(2.0 * n * padded / GAMMA))


def girgis(x: np.ndarray, sigma: np.ndarray, model: str, seed: int) -> np.ndarray:
    n = x.shape[0]
    if model == "shuffle":
        round_eps0, _ = amplified_epsilon0("generic", 2, n, EPSILON / 2.0, DELTA / 2.0)
        eps0 = 2.0 * round_eps0
    else:
        eps0 = EPSILON
    config = VectorMeanConfig(DIM, RADIUS, coordinate_radius(sigma, n), eps0, rotation_seed=seed)
    return run_fast(VectorMeanProtocol(config), x, seed=seed).result.estimate


def decomposition(x: np.ndarray, center: np.ndarray, radius: float, estimate: np.ndarray) -> dict:
    """Where a shifted clipped mean's error comes from (computed here from the data, not private):
    ``centre_error = ||centre - xbar||``; ``clipping_bias = ||m - xbar||`` with ``m`` the exact
    clipped mean ``centre + mean_i clip(x_i - centre, radius)``; ``noise = ||estimate - m||``
    (the privacy noise and rounding of the last round). The error against ``xbar`` is the sum
    of the last two vectors."""
    xbar = x.mean(axis=0)
    shifted = x - center
    norms = np.linalg.norm(shifted, axis=1)
    scale = np.minimum(1.0, radius / np.maximum(norms, np.finfo(float).tiny))
    clipped = center + (shifted * scale[:, None]).mean(axis=0)
    return {"centre_error": float(np.linalg.norm(center - xbar)), "clip_radius": float(radius),
            "fraction_clipped": float(np.mean(norms > radius)),
            "clipping_bias": float(np.linalg.norm(clipped - xbar)), "noise": float(np.linalg.norm(estimate - clipped))}


def instance_optimal(x: np.ndarray, model: str, seed: int, fixed_quantile: float | None = None) -> tuple[np.ndarray, dict]:
    config = InstanceOptimalConfig(
        DIM, x.shape[0], RADIUS, EPSILON, DELTA, model=model, rotation_seed=seed, fixed_quantile=fixed_quantile
    )
    outcome = run_fast(InstanceOptimalProtocol(config), x, seed=seed).result
    return outcome.estimate, decomposition(x, outcome.center, outcome.threshold.radius, outcome.estimate)


def central_hly(x: np.ndarray, seed: int, conversion: str = "gaussian") -> tuple[np.ndarray, dict]:
    """The central estimator; its centre is the rotated medians rotated back (clipping commutes
    with the rotation; the data lie in the public ball, so its projection onto it changes nothing).
    ``conversion``: how ``(eps, delta)`` becomes its rho (``instance_optimal_mean``)."""
    result = instance_optimal_mean(x, ApproxDP(EPSILON, DELTA), np.random.default_rng(seed), radius=RADIUS,
                                   conversion=conversion)
    center = RandomRotation(x.shape[1], result.rotation_seed).inverse(result.shift)
    return result.estimate, decomposition(x, center, result.threshold, result.estimate)


def estimators(sigma: np.ndarray):
    privacy = ApproxDP(EPSILON, DELTA)
    return {
        "nonprivate": lambda x, s: x.mean(axis=0),
        "central-winsorized": lambda x, s: winsorized_mean(
            x, privacy, np.random.default_rng(s), bound=RADIUS, coordinate_radius=coordinate_radius(sigma, x.shape[0])
        ).estimate,
        "central-hly": central_hly,
        "central-hly-zcdp": lambda x, s: central_hly(x, s, conversion="zcdp"),
        "shuffle-instance-optimal": lambda x, s: instance_optimal(x, "shuffle", s),
        "shuffle-fixed-median": lambda x, s: instance_optimal(x, "shuffle", s, fixed_quantile=0.5),
        "shuffle-girgis-vector": lambda x, s: girgis(x, sigma, "shuffle", s),
        "local-instance-optimal": lambda x, s: instance_optimal(x, "local", s),
        "local-girgis-vector": lambda x, s: girgis(x, sigma, "local", s),
    }


def sweep(ns, seeds: int, headline_seeds: dict[int, int], headline_only: bool = False, panel_ns=PANEL_NS) -> dict:
    mu, sigma = population(DIM)
    methods = estimators(sigma)

    def panel(n: int) -> int:
        return 0 if headline_only or n not in panel_ns else seeds

    plan = [(n, seed, name) for n in ns for seed in range(max(panel(n), headline_seeds.get(n, 0)))
            for name in methods if seed < panel(n) or (name in HEADLINE and seed < headline_seeds.get(n, 0))]
    rows, max_norm = [], {}
    bar = tqdm(total=len(plan), desc="estimates", unit="run")
    x = key = None
    for n, seed, name in plan:
        if key != (n, seed):
            key, x = (n, seed), draw(n, mu, sigma, seed)
            xbar = x.mean(axis=0)
            max_norm[str(n)] = max(max_norm.get(str(n), 0.0), float(np.linalg.norm(x, axis=1).max()))
        started = time.perf_counter()
        row = {"estimator": name, "model": MODEL_OF[name], "n": n, "seed": seed}
        try:
            answer = methods[name](x, seed)
        except ShuffleDPError as exc:  # e.g. summation refuses noise a device cannot draw at this n
            row["refused"] = str(exc)
        else:
            if isinstance(answer, tuple):  # a shifted clipped mean: (estimate, error decomposition)
                answer, row["decomposition"] = answer
            estimate = np.asarray(answer)
            row["error_vs_sample_mean"] = float(np.linalg.norm(estimate - xbar))
            row["error_vs_mean"] = float(np.linalg.norm(estimate - mu))
            row["estimate_norm"] = float(np.linalg.norm(estimate))
        row["seconds"] = time.perf_counter() - started
        rows.append(row)
        bar.set_postfix_str(f"n={n} {name}")
        bar.update(1)
    bar.close()
    return {"rows": rows, "sigma": sigma.tolist(), "max_data_norm": max_norm}


def summarize(rows: list[dict]) -> dict:
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name in MODEL_OF:
        per_n = {}
        for n in sorted({r["n"] for r in rows}):
            mine = [r for r in rows if r["estimator"] == name and r["n"] == n and "refused" not in r]
            if mine:
                per_n[str(n)] = {
                    "seeds": len(mine),
                    "median_error_vs_sample_mean": float(np.median([r["error_vs_sample_mean"] for r in mine])),
                    "median_error_vs_mean": float(np.median([r["error_vs_mean"] for r in mine])),
                    "median_seconds": float(np.median([r["seconds"] for r in mine])),
                    "estimate_norm_range": [float(min(r["estimate_norm"] for r in mine)),
                                            float(max(r["estimate_norm"] for r in mine))],
                }
                parts = [r["decomposition"] for r in mine if "decomposition" in r]
                if parts:  # RMS over seeds of each part, and the mean radius and clipped fraction
                    per_n[str(n)]["decomposition"] = {
                        "seeds": len(parts),
                        **{f"rms_{k}": float(np.sqrt(np.mean([p[k] ** 2 for p in parts])))
                           for k in ("centre_error", "clipping_bias", "noise")},
                        "mean_clip_radius": float(np.mean([p["clip_radius"] for p in parts])),
                        "mean_fraction_clipped": float(np.mean([p["fraction_clipped"] for p in parts])),
                    }
        out[name] = per_n
    return out


def paired_ratio(rows: list[dict], n: int, name: str, baseline: str) -> dict | None:
    """RMS error (against ``xbar``) of ``name`` over ``baseline``'s on the seeds both answered, with its 95 % CI."""
    def errors(est):
        return {r["seed"]: r["error_vs_sample_mean"] for r in rows
                if r["estimator"] == est and r["n"] == n and "refused" not in r}

    a, b = errors(name), errors(baseline)
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    num = np.array([a[s] for s in seeds]) ** 2
    den = np.array([b[s] for s in seeds]) ** 2
    out = ratio_ci(num, den, paired=True, root=2, label=f"RMS error {name} / {baseline}")
    out["median_ratio"] = float(np.median(np.sqrt(num)) / np.median(np.sqrt(den)))
    out["refused"] = sum(1 for r in rows if r["n"] == n and r["estimator"] in (name, baseline) and "refused" in r)
    return out


def headline(rows: list[dict], ns) -> dict:
    """Per n: shuffle instance-optimal against central HLY (the headline), against central HLY with
    the looser zCDP conversion and against the central winsorized mean."""
    out = {"statistic": "RMS over paired seeds of ||estimate - xbar||, ratio shuffle / central, 95 % CI (delta method on the log)",
           "baseline": "central-hly (rho from the exact Gaussian privacy curve)",
           "secondary_baselines": ["central-hly-zcdp (rho from Bun & Steinke Prop. 1.3)",
                                   "central-winsorized (does not project into the known domain)"],
           "per_n": []}
    for n in ns:
        row = {"n": n,
               "vs_central_hly": paired_ratio(rows, n, "shuffle-instance-optimal", "central-hly"),
               "vs_central_hly_zcdp": paired_ratio(rows, n, "shuffle-instance-optimal", "central-hly-zcdp"),
               "vs_central_winsorized": paired_ratio(rows, n, "shuffle-instance-optimal", "central-winsorized")}
        out["per_n"].append(row)
    return out


def plot(result: dict, path) -> None:
    """Two error panels (median over seeds per estimator) and the headline ratio with its intervals."""
    summary = result["summary"]
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8), sharey=False)
    styles = {"central": "-", "shuffle": "--", "local": ":"}
    colors = dict(zip(MODEL_OF, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for ax, metric, title in (
        (axes[0], "median_error_vs_sample_mean", "privacy cost: ||estimate - sample mean||"),
        (axes[1], "median_error_vs_mean", "total error: ||estimate - mu||"),
    ):
        for name, per_n in summary.items():
            if name == "nonprivate" and metric == "median_error_vs_sample_mean":
                continue
            ns = [int(k) for k in per_n]
            ax.loglog(ns, [per_n[str(k)][metric] for k in ns], styles[MODEL_OF[name]], marker="o", color=colors[name], label=name)
        ax.set_xlabel("users n")
        ax.set_ylabel("l2 error (median over seeds)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=7)
    ratio_ax = axes[2]
    for key, label, marker in (("vs_central_hly", "/ central HLY (exact Gaussian accounting)", "o"),
                               ("vs_central_hly_zcdp", "/ central HLY (zCDP Prop. 1.3 accounting)", "s")):
        rows = [r for r in result["headline"]["per_n"] if r.get(key)]
        if not rows:
            continue
        ns = np.array([r["n"] for r in rows], dtype=float)
        mid = np.array([r[key]["ratio"] for r in rows])
        lo = np.array([r[key]["ci95"][0] for r in rows])
        hi = np.array([np.minimum(r[key]["ci95"][1], 1e3) for r in rows])
        ratio_ax.errorbar(ns, mid, yerr=[mid - lo, hi - mid], marker=marker, capsize=3, label=f"shuffle instance-optimal {label}")
    ratio_ax.axhline(1.0, color="k", lw=0.8)
    ratio_ax.axhline(1.5, color="grey", lw=0.8, ls="--")
    ratio_ax.set_xscale("log")
    ratio_ax.set_xlabel("users n")
    ratio_ax.set_ylabel("RMS-error ratio, 95 % CI (paired seeds)")
    ratio_ax.set_title("headline: shuffle / central HLY", fontsize=10)
    ratio_ax.grid(True, which="both", alpha=0.3)
    ratio_ax.legend(fontsize=7)
    fig.suptitle(f"d = {DIM}, mu_j = {MEAN}, sigma_j^2 ~ U[0, 10], (eps, delta) = ({EPSILON}, {DELTA:g}): central -, shuffle --, local :", fontsize=10)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__, quick=f"n in {list(QUICK['ns'])}, one seed for the panel and three for the headline "
                                      "(a smoke run)")
    parser.add_argument("--replot", action="store_true", help="redraw the plot from the JSON in the output folder")
    parser.add_argument("--headline-only", action="store_true",
                        help="run only the headline's estimators (central HLY, shuffle instance-optimal, winsorized)")
    args = parse(parser, argv)
    if args.replot:
        plot(read_result(args, "mean_models"), args.out / "mean_models.png")
        return 0
    started = time.perf_counter()
    sizes = QUICK if args.quick else {"ns": NS, "panel_ns": PANEL_NS, "seeds": SEEDS, "headline_seeds": HEADLINE_SEEDS}
    ns, seeds, headline_seeds = sizes["ns"], sizes["seeds"], sizes["headline_seeds"]
    data = sweep(ns, seeds, headline_seeds, headline_only=args.headline_only, panel_ns=sizes["panel_ns"])
    summary = summarize(data["rows"])
    result = {
        "setup": {"dim": DIM, "radius": RADIUS, "mean": MEAN, "epsilon": EPSILON, "delta": DELTA, "seeds": seeds,
                  "headline_seeds": {str(k): v for k, v in headline_seeds.items()}, "ns": list(ns),
                  "panel_ns": list(sizes["panel_ns"]),
                  "headline_only": args.headline_only},
        "summary": summary,
        "headline": headline(data["rows"], ns),
        "max_data_norm": data["max_data_norm"],
        "rows": data["rows"],
        "seconds": time.perf_counter() - started,
    }
    path = write_result(args, "mean_models", result, sizes={k: (list(v) if isinstance(v, tuple) else
                                                                 {str(a): b for a, b in v.items()} if isinstance(v, dict) else v)
                                                             for k, v in sizes.items()})
    plot(result, path.with_suffix(".png"))
    for est, per_n in summary.items():
        print(f"{est:26s} " + "  ".join(f"n={k}: {v['median_error_vs_sample_mean']:.4g}" for k, v in per_n.items()))
    print("headline: shuffle instance-optimal / central Huang-Liang-Yi, RMS error against the users' mean:")
    for row in result["headline"]["per_n"]:
        hly, zcdp, win = row["vs_central_hly"], row["vs_central_hly_zcdp"], row["vs_central_winsorized"]
        line = f"  n={row['n']:>7}: " + (format_ratio(hly, 2, quick=args.quick) if hly else "no paired seeds")
        if zcdp:
            line += f"   (vs central HLY, zCDP accounting: {format_ratio(zcdp, 2, quick=args.quick)})"
        if win:
            line += f"   (vs central winsorized: {format_ratio(win, 3)})"
        print(line)
    print("error decomposition (RMS over seeds: centre error, clipping bias, noise; mean radius, clipped fraction):")
    for est in ("central-hly", "central-hly-zcdp", "shuffle-instance-optimal"):
        for n, entry in summary[est].items():
            dec = entry.get("decomposition")
            if dec:
                print(f"  {est:26s} n={n:>7}: centre {dec['rms_centre_error']:.3g}, bias {dec['rms_clipping_bias']:.3g}, "
                      f"noise {dec['rms_noise']:.3g}; radius {dec['mean_clip_radius']:.3g}, "
                      f"clipped {100 * dec['mean_fraction_clipped']:.2f} % over {dec['seeds']} seeds")
    print("max data norm per n:", {k: round(v, 1) for k, v in data["max_data_norm"].items()})
    print(f"wrote {path} and {path.with_suffix('.png')} in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
