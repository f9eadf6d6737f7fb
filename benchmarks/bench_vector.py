"""The vector mean protocol (Algorithm 5): budget modes, dimensions, and memory at scale.

1. **Modes.** ``paper`` (every user answers every coordinate's range round at
   eps0/(2D)) against ``sampled`` (one coordinate per user at eps0/2), error against n
   at d = 64, beside the exact theoretical RMSE and Theorem 2's bound, averaged over
   seeds; the ratio of the RMS error to the theoretical RMSE with its 95 % interval over
   the seeds (``_common.ratio_ci``; 3 seeds give a rough interval: this figure is to spot
   a range round that misses, an error many times the theory, not a 10 % gap). A run whose range round misses (a coordinate's announced range excludes
   users) shows up as error far above the theory.
2. **Dimensions.** d in {64, 256, 1024} at n = 1e5 (sampled mode): error, theory, time.
3. **Memory.** n = 1e6, d = 256, m = 10 in a fresh process: peak RSS against the
   2 GiB target, and the same run's wall time.

Run: ``python benchmarks/bench_vector.py [--quick] [--out DIR]``; writes vector.json and
vector_modes.png into the output folder (default ``bench-out/``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np

from _common import arguments, format_ratio, parse, ratio_ci, write_result

from shuffledp.progress import pyplot, save_figure

from shuffledp.simulation.vector_population import VectorPopulation
from shuffledp.simulation.vector import VectorSimulationConfig, run_vector_simulation

EPSILON = 4.0
FULL = {"mode_sizes": [1000, 3000, 10_000, 30_000, 100_000, 300_000], "mode_seeds": 3, "dims": [64, 256, 1024],
        "dims_n": 100_000, "memory_n": 1_000_000, "memory_d": 256}
#: --quick: small sizes (d = 256 needs n >= 2,000 for every coordinate to get range reports); the d = 64 rows
#: at n = 2,000 ask the accountant the same question, answered once.
QUICK = {"mode_sizes": [1000, 2000], "mode_seeds": 1, "dims": [64, 256], "dims_n": 2000, "memory_n": 2000,
         "memory_d": 64}


def modes(sizes: list[int], seeds: int) -> dict:
    population = VectorPopulation("gaussian", 64, 10)
    out = {}
    for mode in ("sampled", "paper"):
        rows = []
        for n in sizes:
            runs = [run_vector_simulation(VectorSimulationConfig(population, n, EPSILON, mode=mode, seed=s)) for s in range(seeds)]
            ratio = ratio_ci([r.l2_error**2 for r in runs], float(np.mean([r.mse_theory for r in runs])), root=2,
                             label="RMS error / exact theoretical RMSE")
            rows.append({
                "n": n,
                "ratio_to_theory": ratio["ratio"],
                "ratio_to_theory_ci95": ratio["ci95"],
                "seeds": ratio["seeds"],
                "l2_error_rms": float(np.sqrt(np.mean([r.l2_error**2 for r in runs]))),
                "rmse_theory": float(np.sqrt(np.mean([r.mse_theory for r in runs]))),
                "theorem2_rmse": float(np.sqrt(np.mean([r.theorem2_mse_bound for r in runs]))),
                "ranges_hit": float(np.mean([r.fraction_coordinates_ranges_hit for r in runs])),
            })
            print(f"  {mode:<8} n={n:>8,}  error {rows[-1]['l2_error_rms']:.4g}  theory {rows[-1]['rmse_theory']:.4g}"
                  f"  {format_ratio(ratio, 2)}"
                  f"  ranges hit {100 * rows[-1]['ranges_hit']:.2f}%", flush=True)
        out[mode] = rows
    return out


def dimensions(dims: list[int], n: int) -> list[dict]:
    rows = []
    for d in dims:
        start = time.perf_counter()
        r = run_vector_simulation(VectorSimulationConfig(VectorPopulation("gaussian", d, 10), n, EPSILON, seed=1))
        rows.append({"d": d, "n": n, "l2_error": r.l2_error, "rmse_theory": r.mse_theory**0.5,
                     "theorem2_rmse": r.theorem2_mse_bound**0.5, "seconds": time.perf_counter() - start,
                     "users_per_s": n / (time.perf_counter() - start)})
        print(f"  d={d:>5}  error {r.l2_error:.4g}  theory {r.mse_theory ** 0.5:.4g}  {rows[-1]['seconds']:.1f} s", flush=True)
    return rows


def memory(n: int, d: int) -> dict:
    code = (
        "import resource, time, json\n"
        "from shuffledp.simulation.vector_population import VectorPopulation\n"
        "from shuffledp.simulation.vector import VectorSimulationConfig, run_vector_simulation\n"
        f"t = time.perf_counter(); r = run_vector_simulation(VectorSimulationConfig(VectorPopulation('gaussian', {d}, 10), {n}, {EPSILON}))\n"
        "print(json.dumps({'peak_rss_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,"
        " 'seconds': time.perf_counter() - t, 'l2_error': r.l2_error, 'rmse_theory': r.mse_theory ** 0.5}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result.update({"n": n, "d": d, "m": 10, "target_mib": 2048})
    print(f"  n={n:,} d={d}: peak RSS {result['peak_rss_mib']:.0f} MiB (target <= 2048), {result['seconds']:.0f} s")
    return result


def plot(mode_rows: dict, path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = {"sampled": "tab:blue", "paper": "tab:red"}
    for mode, rows in mode_rows.items():
        ns = [r["n"] for r in rows]
        ax.loglog(ns, [r["l2_error_rms"] for r in rows], "o-", color=colors[mode], label=f"{mode}: measured")
        ax.loglog(ns, [r["rmse_theory"] for r in rows], "--", color=colors[mode], alpha=0.7, label=f"{mode}: exact theory (given ranges)")
    rows = mode_rows["sampled"]
    ax.loglog([r["n"] for r in rows], [r["theorem2_rmse"] for r in rows], ":", color="black", label="Theorem 2 (proof's expression)")
    ax.set_xlabel("users n")
    ax.set_ylabel("ℓ2 error of the mean (RMS over seeds)")
    ax.set_title(f"vector mean, d = 64, m = 10, ε0 = {EPSILON}: range-round budget modes")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    args = parse(arguments(__doc__), argv)
    sizes = QUICK if args.quick else FULL
    print("1. budget modes (d = 64)")
    mode_rows = modes(sizes["mode_sizes"], seeds=sizes["mode_seeds"])
    print("2. dimensions (sampled mode)")
    dim_rows = dimensions(sizes["dims"], sizes["dims_n"])
    print("3. memory at scale")
    mem = memory(sizes["memory_n"], sizes["memory_d"])
    plot(mode_rows, args.out / "vector_modes.png")
    path = write_result(args, "vector", {"epsilon0": EPSILON, "modes": mode_rows, "dimensions": dim_rows, "memory": mem},
                        sizes=sizes)
    print(f"wrote {path} and {args.out / 'vector_modes.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
