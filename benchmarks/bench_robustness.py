"""How each protocol degrades when a fraction f of the users is corrupted (well-formed attacks).

For f in {0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.49} and several seeds, each protocol runs on
the vectorized engine with ``round(f n)`` users replaced by the adversary of
``shuffledp/studies/robustness.py`` (extreme Hadamard bin claimed and the honest one denied, the
largest valid grid value, the worst in-range summand, or one arbitrary residue):

* scalar mean (Girgis, Data & Diggavi 2022, Alg. 1; n = 20,000, B = 20, eps0 = 1, the
  ``shuffledp simulate`` defaults), decoded three ways (``analyzer/robust.py``):
  ``plain``; ``median`` (plain range, median of the mean round); ``guarded`` (range
  guarded against f_max = 0.05, then the median);
* vector mean (Alg. 5, d = 8, eps0 = 4, sampled mode), attackers on the coordinates honest
  users would use (``spread``) or all on one rotated coordinate (``one``);
* scalar summation (central eps = 1, delta = n^-1.1 over [-B, B]): every attacker
  inputs ``B`` (``in-range``), or in addition one share carries ``q // 2`` (``residue``);
* the instance-optimal mean (Huang, Liang & Yi, Sec. 5; the vector population, session
  eps = 1), shuffle and local: attackers drag every tree descent to the top edge, claim
  the largest norm bin and send the worst summand (``+radius e_1`` about the centre) or
  ``+bound`` local values; the shuffle version also with the radius at the median of the
  shifted norms (``fixed_quantile = 0.5``), which fewer than half the users cannot move
  past the honest norms.

Error is |estimate - mean of all users' local means| (l2 for vectors), absolute and in
units of the honest run's standard error (the RMS error of the plain decoder at f = 0 over
the seeds), that ratio with its 95 % interval over the paired seeds (``_common.ratio_ci``).
Run: ``python benchmarks/bench_robustness.py [--quick] [--out DIR]`` (20 seeds, about
15 s on one core; ``--quick``: n = 5,000, 2 seeds, three fractions); writes robustness.json and
robustness.png into the output folder (default ``bench-out/``).
"""

from __future__ import annotations

import math
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from _common import arguments, format_ratio, parse, ratio_ci, write_result  # noqa: E402

FRACTIONS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.49)
N = 20_000
GUARD = 0.05
QUICK = {"n": 5_000, "seeds": 2, "fractions": (0.0, 0.05, 0.3)}


def _scalar_cases(seed: int, n: int):
    from shuffledp.analyzer.robust import RobustOptions
    from shuffledp.analyzer.scalar_mean import ScalarMeanProtocol
    from shuffledp.simulation.population import Population
    from shuffledp.simulation.scalar import SimulationConfig, _local_means

    config = SimulationConfig(Population("gaussian", 1.7, 1.0, 20.0, 50), n=n, epsilon0=1.0, seed=seed)
    means, _ = _local_means(config, None)
    protocol_config = config.protocol_config()
    variants = {"plain": None, "median": RobustOptions(), "guarded": RobustOptions(max_corrupted=GUARD)}
    return means, {f"scalar mean, {name}": (lambda o=o: ScalarMeanProtocol(protocol_config, o)) for name, o in variants.items()}


def _vector_cases(seed: int, n: int):
    from shuffledp.analyzer.vector_mean import VectorMeanProtocol
    from shuffledp.simulation.vector_population import VectorPopulation
    from shuffledp.simulation.vector import VectorSimulationConfig

    population = VectorPopulation("gaussian", 8, 50, 1.7, 1.0, 20.0)
    config = VectorSimulationConfig(population, n=n, epsilon0=4.0, seed=seed)
    data = population.block_local_means(population.blocks(n, seed))[0]
    return data, {"vector mean": lambda: VectorMeanProtocol(config.protocol_config())}


def _sum_cases(seed: int, n: int):
    from shuffledp.analyzer.summation import SummationProtocol
    from shuffledp.simulation.population import Population, block_samples, user_blocks
    from shuffledp.protocol.mechanisms.summation_params import choose_scalar_sum

    population = Population("gaussian", 1.7, 1.0, 20.0, 50)
    data = np.concatenate([block_samples(population, b).mean(axis=1) for b in user_blocks(population, n, seed)])
    delta = 1.0 / n**1.1
    params = choose_scalar_sum(n, 1.0, delta, -20.0, 20.0).params
    return data, {"summation": lambda: SummationProtocol(params, 1.0, delta)}


def _instance_optimal_cases(seed: int, n: int):
    from shuffledp.analyzer.instance_optimal import InstanceOptimalConfig, InstanceOptimalProtocol
    from shuffledp.analyzer.instance_optimal_budget import round_budgets
    from shuffledp.simulation.vector_population import VectorPopulation

    population = VectorPopulation("gaussian", 8, 50, 1.7, 1.0, 20.0)
    data = population.block_local_means(population.blocks(n, seed))[0]
    cases = {}
    for model, quantile in (("shuffle", None), ("shuffle", 0.5), ("local", None)):
        config = InstanceOptimalConfig(8, n, 20.0 * math.sqrt(8), 1.0, n**-1.1, model=model, fixed_quantile=quantile)
        budgets = round_budgets(config)
        name = f"instance-optimal {model}" + (", radius at q = 0.5" if quantile else "")
        cases[name] = lambda c=config, b=budgets: InstanceOptimalProtocol(c, b)
    return data, cases


def _estimate(result) -> np.ndarray:
    if hasattr(result, "threshold"):
        return np.asarray(result.estimate)
    if hasattr(result, "found_range"):
        return np.array([result.mean.estimate])
    if hasattr(result, "ranges"):
        return np.asarray(result.estimate)
    return np.atleast_1d(np.asarray(result.estimate.mean, dtype=np.float64))


def _adversaries(name: str, fraction: float):
    from shuffledp.studies.robustness import Adversary

    if name == "vector mean":
        return {"spread": Adversary(fraction), "one": Adversary(fraction, focus="one")}
    if name == "summation":
        return {"in-range": Adversary(fraction), "residue": Adversary(fraction, residue=True)}
    return {"": Adversary(fraction)}


def main(argv: list[str] | None = None) -> int:
    from shuffledp.progress import progress_bar, pyplot, save_figure
    from shuffledp.studies.robustness import run_attacked

    parser = arguments(__doc__, quick=f"n = {QUICK['n']:,}, {QUICK['seeds']} seeds, f in {QUICK['fractions']}")
    parser.add_argument("--seeds", type=int, default=20)
    args = parse(parser, argv)
    sizes = dict(QUICK) if args.quick else {"n": N, "seeds": args.seeds, "fractions": FRACTIONS}
    n, seeds, fractions = sizes["n"], sizes["seeds"], sizes["fractions"]
    started = time.perf_counter()
    errors: dict[str, dict[float, list[float]]] = {}
    extra: dict[str, dict[float, list[dict]]] = {}
    runs_per_seed = len(fractions) * (3 + 2 + 2 + 3)
    with progress_bar(seeds * runs_per_seed, unit="run") as step:
        for seed in range(seeds):
            for make in (_scalar_cases, _vector_cases, _sum_cases, _instance_optimal_cases):
                data, cases = make(seed, n)
                truth = np.atleast_1d(data.mean(axis=0))
                for name, protocol in cases.items():
                    for fraction in fractions:
                        for label, adversary in _adversaries(name, fraction).items():
                            key = f"{name}, {label}" if label else name
                            run = run_attacked(protocol(), data, adversary, seed=seed)
                            error = float(np.linalg.norm(_estimate(run.result) - truth))
                            errors.setdefault(key, {}).setdefault(fraction, []).append(error)
                            robust = getattr(run.result, "robust", None)
                            if hasattr(run.result, "found_range"):
                                found = run.result.found_range
                                extra.setdefault(key, {}).setdefault(fraction, []).append({
                                    "range": [found.lower, found.upper],
                                    "range_holds_true_mean": bool(found.lower <= truth[0] <= found.upper),
                                    "tolerance": None if robust is None else robust.tolerance,
                                })
                            if step:
                                step(key, 1)
    rows = []
    for key, by_fraction in errors.items():
        honest = math.sqrt(np.mean(np.square(by_fraction[0.0])))
        unit_key = key.replace("median", "plain").replace("guarded", "plain")
        unit = math.sqrt(np.mean(np.square(errors[unit_key][0.0])))
        for fraction, values in by_fraction.items():
            rms = math.sqrt(np.mean(np.square(values)))
            # the same seeds (data and randomness) as the honest run of the plain decoder: paired
            ratio = ratio_ci(np.square(values), np.square(errors[unit_key][0.0]), paired=True, root=2,
                             label="RMS error / honest RMS error of the plain decoder")
            row = {"protocol": key, "fraction": fraction, "seeds": len(values), "rms_error": rms,
                   "median_error": float(np.median(values)), "max_error": float(np.max(values)),
                   "honest_standard_error": unit, "rms_error_in_honest_se": rms / unit,
                   "rms_error_in_honest_se_ci95": ratio["ci95"],
                   "honest_rms_error_of_this_decoder": honest}
            if key in extra:
                runs = extra[key][fraction]
                row["range_holds_true_mean_rate"] = float(np.mean([r["range_holds_true_mean"] for r in runs]))
                row["mean_range_width"] = float(np.mean([r["range"][1] - r["range"][0] for r in runs]))
                tolerances = [r["tolerance"] for r in runs if r["tolerance"] is not None]
                if tolerances:
                    row["certified_tolerance_median"] = float(np.median(tolerances))
            rows.append(row)
            print(f"{key:32s} f={fraction:<5g} rms error {rms:10.4g} = honest SE x {format_ratio(ratio, 3)}"
                  + (" (--quick: few seeds)" if args.quick else ""), file=sys.stderr)
    seconds = time.perf_counter() - started
    path = write_result(args, "robustness", {
        "n": n, "seeds": seeds, "fractions": list(fractions), "guard_max_corrupted": GUARD, "seconds": seconds,
        "settings": {
            "scalar": "gaussian mu=1.7 sigma=1 m=50, B=20, eps0=1 (tau from the data model)",
            "vector": "gaussian d=8 m=50 mu=1.7 sigma=1, B=20, eps0=4, sampled mode",
            "summation": "scalar, [-20, 20], central eps=1, delta=n^-1.1",
            "instance-optimal": "the vector population, R = 20 sqrt(8), session eps=1, delta=n^-1.1, shuffle and local",
        },
        "rows": rows,
    }, sizes=sizes)

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for key in errors:
        xs = [r["fraction"] for r in rows if r["protocol"] == key and r["fraction"] > 0]
        for ax, field in zip(axes, ("rms_error_in_honest_se", "rms_error")):
            ys = [r[field] for r in rows if r["protocol"] == key and r["fraction"] > 0]
            ax.plot(xs, ys, "--" if "summation" in key else "-o", ms=3, label=key)
    for ax, label in zip(axes, ("RMS error / honest standard error", "RMS error (absolute)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("corrupted fraction f")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].axhline(1.0, color="grey", ls=":")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"well-formed attacks, n = {n:,}, {seeds} seeds per point")
    save_figure(fig, str(path.with_suffix(".png")))
    print(f"wrote {path} and {path.with_suffix('.png')} in {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
