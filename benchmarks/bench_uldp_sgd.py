"""User-level private SGD (Girgis, Data & Diggavi, Algorithm 6 / Theorem 5) in the shuffle model.

1. **Accuracy against session epsilon** (synthetic logistic task, 100,000 users x 10 samples,
   15 features + intercept): ULDP-SGD (vector mean protocol, shuffled, joint Poisson
   subsampling accounted over T steps), central user-level DP-SGD (Gaussian, dp-accounting)
   at the same (eps, delta = 1e-5), and non-private training; same cohort, steps, learning rate.
2. **Headline**: the eps <= 2 run timed end to end (calibrating eps0, training, accounting
   the run) and its gap to non-private training, over 3 seeds.
3. **Accuracy against m** (samples per user) at a fixed number of users n = 20,000, eps = 2.
4. **Real data**: the Wisconsin breast-cancer table shipped with scikit-learn (no download;
   skipped if scikit-learn is missing), one row per user, the 10 "mean" features.

Run: ``python benchmarks/bench_uldp_sgd.py [--quick] [--out DIR]``; writes uldp_sgd.json and
uldp_sgd.png into the output folder (default ``bench-out/``). ``--quick`` shrinks users, steps,
sweeps and seeds to a smoke run of the same code paths.
"""

from __future__ import annotations

import functools
import sys
import time

import numpy as np

from _common import arguments, parse, read_result, write_result

from shuffledp.learning.data import breast_cancer_users, real_dataset_available, synthetic_logistic
from shuffledp.progress import progress_bar, pyplot, save_figure
from shuffledp.learning.uldp_sgd import (
    TrainingConfig,
    calibrate_epsilon0,
    calibrate_noise_multiplier,
    step_has_range_round,
    train,
    uldp_privacy,
)

DELTA = 1e-5
#: Synthetic task: users, samples per user, features; optimizer shared by all methods.
SYNTHETIC = dict(users=100_000, samples_per_user=10, features=15)
SCHEDULE = dict(steps=1000, cohort=2000, learning_rate=1.0, clip=0.25, momentum=0.0, tail_average=0.5)
EPSILONS = (0.5, 1.0, 2.0, 4.0)
HEADLINE_EPSILON = 2.0
M_SWEEP_USERS = 20_000
M_VALUES = (1, 2, 5, 10, 20, 50)
M_SCHEDULE = dict(steps=400, cohort=1000, learning_rate=1.0, clip=0.25, momentum=0.0, tail_average=0.5)
REAL_EPSILONS = (1.0, 2.0, 4.0, 8.0)
REAL_SCHEDULE = dict(steps=30, cohort=455, learning_rate=2.0, clip=0.5, momentum=0.0, tail_average=0.5)
REAL_SEEDS = 10
FULL = {"synthetic": SYNTHETIC, "schedule": SCHEDULE, "epsilons": EPSILONS, "headline_seeds": 3,
        "m_users": M_SWEEP_USERS, "m_values": M_VALUES, "m_schedule": M_SCHEDULE,
        "real_epsilons": REAL_EPSILONS, "real_schedule": REAL_SCHEDULE, "real_seeds": REAL_SEEDS,
        "rtol": 0.01, "real_rtol": 0.02}  # rtol: the eps0 calibration's relative tolerance
#: --quick: every part at small sizes, eps0 calibrated to within a factor 1.5. The m sweep uses the
#: synthetic task's users and schedule, so its calibration asks the accountant the question the
#: headline's did (answered from the in-process caches), and its noise multiplier is the epsilon
#: sweep's (:func:`noise_multiplier`). The real-data part keeps its full schedule: 30 steps over 569
#: users train in milliseconds, and its eps0 calibration (the part's cost) takes about half as long
#: as at 5 steps, where eps0 lands higher.
QUICK = {"synthetic": dict(users=2000, samples_per_user=10, features=15),
         "schedule": dict(SCHEDULE, steps=20, cohort=200), "epsilons": (2.0,), "headline_seeds": 1,
         "m_users": 2000, "m_values": (1, 10), "m_schedule": dict(M_SCHEDULE, steps=20, cohort=200),
         "real_epsilons": (2.0,), "real_schedule": REAL_SCHEDULE, "real_seeds": 1,
         "rtol": 0.5, "real_rtol": 0.5}


@functools.lru_cache(maxsize=None)
def noise_multiplier(target_epsilon: float, sampling_rate: float, steps: int) -> float:
    """``calibrate_noise_multiplier`` at ``DELTA``, computed once per question in a run."""
    return calibrate_noise_multiplier(target_epsilon, sampling_rate, steps, DELTA)


def _range_round(dim: int, cfg: TrainingConfig) -> bool:
    """Whether each step runs the vector protocol's range round (the accountant must know)."""
    return step_has_range_round(dim, cfg.clip, cfg.cohort)


def _row(result) -> dict:
    d = result.as_dict()
    d.pop("theta")
    d.pop("accuracy_trace")
    return d


def epsilon_sweep(data, schedule: dict, epsilons, step, rtol: float = 0.01) -> dict:
    cfg = TrainingConfig(**schedule)
    nonprivate = train(data, cfg, "nonprivate", progress=step)
    rows = []
    for eps in epsilons:
        t0 = time.perf_counter()
        e0 = calibrate_epsilon0(eps, data.users, cfg.cohort, cfg.steps, DELTA, rtol=rtol, range_round=_range_round(data.dim, cfg))
        calib = time.perf_counter() - t0
        uldp = train(data, cfg, "uldp-shuffle", epsilon0=e0, progress=step)
        t0 = time.perf_counter()
        sigma = noise_multiplier(eps, cfg.cohort / data.users, cfg.steps)
        sigma_calib = time.perf_counter() - t0
        central = train(data, cfg, "central", noise_multiplier=sigma, progress=step)
        rows.append({
            "target_epsilon": eps,
            "uldp": {**_row(uldp), "calibration_seconds": calib},
            "central": {**_row(central), "calibration_seconds": sigma_calib},
        })
        print(f"  eps={eps:<4} eps0={e0:.3f} (session {uldp.privacy['epsilon']:.3f})  ULDP {uldp.accuracy:.4f}  "
              f"central(sigma={sigma:.3f}) {central.accuracy:.4f}  non-private {nonprivate.accuracy:.4f}", flush=True)
    return {"nonprivate": _row(nonprivate), "rows": rows}


def headline(data, schedule: dict, seeds: int, step, rtol: float = 0.01) -> dict:
    """The eps <= 2 run, end to end: calibrate eps0, train, account the run."""
    runs = []
    for seed in range(seeds):
        cfg = TrainingConfig(**schedule, seed=seed)
        started = time.perf_counter()
        e0 = calibrate_epsilon0(HEADLINE_EPSILON, data.users, cfg.cohort, cfg.steps, DELTA, rtol=rtol,
                                range_round=_range_round(data.dim, cfg))
        uldp = train(data, cfg, "uldp-shuffle", epsilon0=e0, progress=step)  # accounts the run too
        total = time.perf_counter() - started
        nonprivate = train(data, cfg, "nonprivate", account=False, progress=step)
        runs.append({
            "seed": seed, "epsilon0": e0, "session_epsilon": uldp.privacy["epsilon"], "delta": DELTA,
            "uldp_accuracy": uldp.accuracy, "nonprivate_accuracy": nonprivate.accuracy,
            "gap_points": 100 * (nonprivate.accuracy - uldp.accuracy),
            "seconds_total": total, "seconds_training": uldp.seconds,
        })
        print(f"  seed {seed}: eps0={e0:.3f} session eps={uldp.privacy['epsilon']:.3f}  ULDP {uldp.accuracy:.4f}  "
              f"non-private {nonprivate.accuracy:.4f}  gap {runs[-1]['gap_points']:.2f} pts  {total:.1f} s", flush=True)
    return {
        "runs": runs,
        "max_gap_points": max(r["gap_points"] for r in runs),
        "max_seconds_total": max(r["seconds_total"] for r in runs),
        "within_2_points": all(r["gap_points"] <= 2.0 for r in runs),
        "under_2_minutes": all(r["seconds_total"] <= 120.0 for r in runs),
        "session_epsilon_at_most_2": all(r["session_epsilon"] <= 2.0 for r in runs),
    }


def m_sweep(m_values, users: int, schedule: dict, eps: float, step, rtol: float = 0.01) -> dict:
    cfg = TrainingConfig(**schedule)
    dim = SYNTHETIC["features"] + 1  # with the intercept column
    rr = _range_round(dim, cfg)
    e0 = calibrate_epsilon0(eps, users, cfg.cohort, cfg.steps, DELTA, rtol=rtol, range_round=rr)  # the accounting does not depend on m
    sigma = noise_multiplier(eps, cfg.cohort / users, cfg.steps)
    rows = []
    for m in m_values:
        data = synthetic_logistic(users, m, SYNTHETIC["features"], seed=10 + m)
        r = {
            "m": m,
            "uldp": train(data, cfg, "uldp-shuffle", epsilon0=e0, account=False, progress=step).accuracy,
            "central": train(data, cfg, "central", noise_multiplier=sigma, account=False, progress=step).accuracy,
            "nonprivate": train(data, cfg, "nonprivate", account=False, progress=step).accuracy,
        }
        rows.append(r)
        print(f"  m={m:<3} ULDP {r['uldp']:.4f}  central {r['central']:.4f}  non-private {r['nonprivate']:.4f}", flush=True)
    return {"users": users, "epsilon": eps, "epsilon0": e0, "noise_multiplier": sigma,
            "privacy": uldp_privacy(e0, users, cfg.cohort, cfg.steps, DELTA, range_round=rr), "schedule": schedule, "rows": rows}


def real(epsilons, seeds: int, schedule: dict, step, rtol: float = 0.02) -> dict:
    data = breast_cancer_users(samples_per_user=1, columns="mean")
    rows = []
    nonprivate = [train(data, TrainingConfig(**schedule, seed=s), "nonprivate", account=False).accuracy for s in range(seeds)]
    for eps in epsilons:
        cfg = TrainingConfig(**schedule)
        e0 = calibrate_epsilon0(eps, data.users, cfg.cohort, cfg.steps, DELTA, rtol=rtol, range_round=_range_round(data.dim, cfg))
        sigma = calibrate_noise_multiplier(eps, min(1.0, cfg.cohort / data.users), cfg.steps, DELTA)
        uldp = [train(data, TrainingConfig(**schedule, seed=s), "uldp-shuffle", epsilon0=e0, account=False, progress=step).accuracy
                for s in range(seeds)]
        central = [train(data, TrainingConfig(**schedule, seed=s), "central", noise_multiplier=sigma, account=False).accuracy
                   for s in range(seeds)]
        privacy = uldp_privacy(e0, data.users, cfg.cohort, cfg.steps, DELTA, range_round=_range_round(data.dim, cfg))
        rows.append({"target_epsilon": eps, "session_epsilon": privacy["epsilon"], "epsilon0": e0, "noise_multiplier": sigma,
                     "uldp_mean": float(np.mean(uldp)), "uldp_sd": float(np.std(uldp)), "uldp": uldp,
                     "central_mean": float(np.mean(central)), "central_sd": float(np.std(central))})
        print(f"  eps={eps:<4} (session {privacy['epsilon']:.3f}, eps0 {e0:.3f})  ULDP {np.mean(uldp):.4f} ± {np.std(uldp):.4f}  "
              f"central {np.mean(central):.4f}  non-private {np.mean(nonprivate):.4f}", flush=True)
    return {"dataset": data.describe(), "schedule": schedule, "seeds": seeds,
            "nonprivate_mean": float(np.mean(nonprivate)), "rows": rows}


def _ticks(ax, values) -> None:
    ax.set_xticks(list(values))
    ax.set_xticklabels([f"{v:g}" for v in values])
    ax.minorticks_off()


def plot(out: dict, path) -> None:
    plt = pyplot()
    panels = 3 if out.get("real") else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.0 * panels, 4.0))
    sweep = out["epsilon_sweep"]
    eps = [r["target_epsilon"] for r in sweep["rows"]]
    ax = axes[0]
    ax.semilogx(eps, [r["uldp"]["accuracy"] for r in sweep["rows"]], "o-", label="ULDP-SGD (shuffle)")
    ax.semilogx(eps, [r["central"]["accuracy"] for r in sweep["rows"]], "s--", label="central user-level DP-SGD")
    ax.axhline(sweep["nonprivate"]["accuracy"], color="k", ls=":", label="non-private")
    _ticks(ax, eps)
    ax.set_xlabel("session ε (δ = 1e-5)")
    ax.set_ylabel("test accuracy")
    d = sweep["nonprivate"]["config"]["dataset"]
    ax.set_title(f"synthetic: n={d['users']:,}, m={d['samples_per_user']}, p={d['dim']}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    ms = out["m_sweep"]
    ax = axes[1]
    m = [r["m"] for r in ms["rows"]]
    ax.semilogx(m, [r["uldp"] for r in ms["rows"]], "o-", label="ULDP-SGD (shuffle)")
    ax.semilogx(m, [r["central"] for r in ms["rows"]], "s--", label="central DP-SGD")
    ax.semilogx(m, [r["nonprivate"] for r in ms["rows"]], "k:", label="non-private")
    _ticks(ax, m)
    ax.set_xlabel("samples per user m")
    ax.set_title(f"n = {ms['users']:,} users, ε = {ms['epsilon']}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    if out.get("real"):
        rl = out["real"]
        ax = axes[2]
        e = [r["session_epsilon"] for r in rl["rows"]]
        ax.errorbar(e, [r["uldp_mean"] for r in rl["rows"]], yerr=[r["uldp_sd"] for r in rl["rows"]], fmt="o-", label="ULDP-SGD (shuffle)")
        ax.errorbar(e, [r["central_mean"] for r in rl["rows"]], yerr=[r["central_sd"] for r in rl["rows"]], fmt="s--", label="central DP-SGD")
        ax.axhline(rl["nonprivate_mean"], color="k", ls=":", label="non-private")
        ax.set_xscale("log")
        _ticks(ax, [r["target_epsilon"] for r in rl["rows"]])
        ax.set_xlabel("session ε (δ = 1e-5)")
        ax.set_title(f"breast cancer: {rl['dataset']['users']} users, mean ± sd over {rl['seeds']} seeds")
        ax.grid(True, alpha=0.3)
        ax.legend()
    save_figure(fig, str(path))


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--plot-only", action="store_true", help="redraw the PNG from the JSON in the output folder")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parse(parser, argv)
    if args.plot_only:
        plot(read_result(args, "uldp_sgd"), args.out / "uldp_sgd.png")
        return 0
    sizes = QUICK if args.quick else FULL
    schedule, m_schedule, real_schedule = sizes["schedule"], sizes["m_schedule"], sizes["real_schedule"]
    epsilons, m_values, seeds = sizes["epsilons"], sizes["m_values"], sizes["headline_seeds"]
    real_eps, real_seeds, rtol = sizes["real_epsilons"], sizes["real_seeds"], sizes["rtol"]
    started = time.perf_counter()
    data = synthetic_logistic(**sizes["synthetic"], seed=0)
    total = schedule["steps"] * (1 + 2 * len(epsilons) + 2 * seeds) + m_schedule["steps"] * 3 * len(m_values)
    total += real_schedule["steps"] * real_seeds * len(real_eps) if real_dataset_available() else 0
    out: dict = {"synthetic": data.describe(), "schedule": schedule, "delta": DELTA}
    with progress_bar(total, quiet=args.quiet, unit="step") as step:
        print("headline (eps <= 2, timed end to end):", flush=True)
        out["headline"] = headline(data, schedule, seeds, step, rtol)
        print("accuracy against session epsilon:", flush=True)
        out["epsilon_sweep"] = epsilon_sweep(data, schedule, epsilons, step, rtol)
        print(f"accuracy against m at n = {sizes['m_users']:,}:", flush=True)
        out["m_sweep"] = m_sweep(m_values, sizes["m_users"], m_schedule, HEADLINE_EPSILON, step, rtol)
        if real_dataset_available():
            print("real data (breast cancer, scikit-learn):", flush=True)
            out["real"] = real(real_eps, real_seeds, real_schedule, step, sizes["real_rtol"])
        else:
            out["real"] = None
            print("real data skipped: scikit-learn is not installed (pip install -e '.[learning]')")
    out["seconds"] = time.perf_counter() - started
    path = write_result(args, "uldp_sgd", out, sizes=sizes)
    plot(out, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png')} in {out['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
