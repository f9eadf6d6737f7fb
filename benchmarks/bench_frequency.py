"""Frequency oracles: our block Hadamard response vs pure-ldp's Hadamard response, same data, same run.

For every k in {64, 1024, 16384}, n in {1e5, 1e6} and eps in {0.5, 1, 4}: n users with
symbols drawn once from Zipf(1.1) truncated to k symbols (``P(x) ~ (x+1)^-1.1``; the data
are then fixed, and ``f`` is their empirical histogram). Both mechanisms randomize those
same users; we report

* MSE: the squared error of the frequency estimates, averaged over the k symbols and over
  R repetitions of the randomization, next to the exact theoretical value (the symbol
  average of the exact per-symbol variances for these fixed data), their ratio, and the
  ratio's expected sampling sd ``sqrt(2 sum_x Var_x^2 / R) / sum_x Var_x`` (Gaussian
  errors, independent across symbols), and its 95 % interval from the measured squared
  errors (``_common.ratio_ci`` over the R k symbol estimates, taken as independent: the
  sampling unit is one symbol's estimate in one repetition). pure-ldp's theory uses the same exact formula
  with its own parameters (``B = 2^floor(log2 min(e^eps, 2k))`` blocks of ``b - 1``
  contiguous symbols after its random permutation, for eps > 1; high-privacy HR with
  ``K = 2^ceil(log2(k+1))``, i.e. ``n Var = c^2 - f``, for eps <= 1);
* client time: ours, :func:`randomize_hadamard_response` on all n users at once
  (vectorized, SeededSource); pure-ldp, its per-user ``HadamardResponseClient.privatise``
  loop over all n users (no subsampling or scaling);
* server time: ours, :func:`decode_hadamard_response` from the report array (bincount +
  FWHTs); pure-ldp, ``aggregate`` for every report plus ``estimate`` for every symbol
  (also given: its estimation step alone). The server speed-up is pure-ldp's time over ours.

Times are CPU times of this process (``time.process_time``: the machine is shared, and
CPU time leaves out waiting for a core; wall times are recorded too), the best over
repetitions: on the first repetition the server step is called at least 5 times and
then again while under half a second in total (at most 50 calls), once on each later
repetition, the same for both implementations; the client step once per repetition. numpy runs
these steps single-threaded. Speed-ups are ratios of CPU times. pure-ldp's MSE uses
fewer repetitions than ours at k = 64 (8 at n = 1e5, 2 at n = 1e6, against 64) because
its client costs 3-10 us of CPU per user; its ratio sd is reported.

pure-ldp 1.2.0 quirk: ``pure_ldp.frequency_oracles/__init__`` eagerly imports every
oracle, and RAPPOR's needs scikit-learn and statsmodels, which pure-ldp does not declare.
If that import fails we load the ``hadamard_response`` subpackage directly (it needs only
numpy and ``pure_ldp.core``), without running that ``__init__``.

Run: ``python benchmarks/bench_frequency.py [--quick] [--out DIR]`` (about 3 minutes of CPU;
needs pure-ldp: ``pip install -e ".[bench]"``); writes frequency.json and frequency.png into
the output folder (default ``bench-out/``; ``--plot-only`` redraws the figure from the JSON there).
``--quick`` (k = 64, n = 2,000, eps in {1, 4}) runs without pure-ldp if it is not installed: it
then says so and measures ours alone.
"""

from __future__ import annotations

import importlib
import math
import pathlib
import random
import sys
import time
import types
import warnings

import numpy as np

from _common import arguments, format_ratio, parse, ratio_ci, read_result, write_result

from shuffledp.analyzer.frequency import decode_hadamard_response, hadamard_response_variance
from shuffledp.client.hadamard_response import choose_hadamard_response, randomize_hadamard_response
from shuffledp.protocol.mechanisms.randomness import SeededSource

K_VALUES = [64, 1024, 16384]
N_VALUES = [100_000, 1_000_000]
EPSILONS = [0.5, 1.0, 4.0]
QUICK = {"k": [64], "n": [2_000], "epsilon": [1.0, 4.0]}
ZIPF_S = 1.1
SERVER_TIMINGS = 5  # least number of timed server calls on the first repetition (both implementations)


def import_pure_ldp_hr():
    """(client class, server class, how it was imported, version)."""
    from importlib.metadata import version

    try:
        from pure_ldp.frequency_oracles.hadamard_response import HadamardResponseClient, HadamardResponseServer

        how = "package import"
    except ImportError:
        for name in [m for m in sys.modules if m.startswith("pure_ldp.frequency_oracles")]:
            del sys.modules[name]
        import pure_ldp

        package = types.ModuleType("pure_ldp.frequency_oracles")
        package.__path__ = [str(pathlib.Path(pure_ldp.__file__).parent / "frequency_oracles")]
        sys.modules["pure_ldp.frequency_oracles"] = package
        module = importlib.import_module("pure_ldp.frequency_oracles.hadamard_response")
        HadamardResponseClient = module.HadamardResponseClient
        HadamardResponseServer = module.HadamardResponseServer
        how = (
            "direct import of pure_ldp.frequency_oracles.hadamard_response "
            "(the package __init__ needs sklearn and statsmodels)"
        )
    return HadamardResponseClient, HadamardResponseServer, how, version("pure-ldp")


class Best:
    """Best (smallest) wall time and CPU time of this process over the calls measured.

    CPU time (``time.process_time``) excludes the time spent waiting for a core, so it is
    the fair measure on a shared machine; wall time is reported too.
    """

    def __init__(self) -> None:
        self.wall = self.cpu = float("inf")

    def measure(self, fn):
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        self.cpu = min(self.cpu, time.process_time() - cpu)
        self.wall = min(self.wall, time.perf_counter() - wall)
        return result

    def measure_repeatedly(self, fn):
        """At least SERVER_TIMINGS calls, more (up to 50) while under half a second in total."""
        started = time.perf_counter()
        calls = 0
        while calls < SERVER_TIMINGS or (calls < 50 and time.perf_counter() - started < 0.5):
            result = self.measure(fn)
            calls += 1
        return result


def zipf_data(k: int, n: int, seed: int) -> np.ndarray:
    weights = 1.0 / np.arange(1, k + 1) ** ZIPF_S
    rng = np.random.default_rng([seed, k, n])
    return rng.choice(k, size=n, p=weights / weights.sum()).astype(np.int64)


def repetitions_ours(k: int) -> int:
    return int(min(64, max(1, math.ceil(4096 / k))))


def repetitions_pure_ldp(k: int, n: int) -> int:
    if k > 64:
        return 1
    return 8 if n <= 100_000 else 2


def self_ci(row: dict) -> dict:
    """A row's MSE / theory in the shape ``format_ratio`` prints."""
    return {"ratio": row["ratio"], "ci95": row["ratio_ci95"], "seeds": row["ratio_units"], "unit": "symbol estimates"}


def ratio_sd(variances: np.ndarray, reps: int) -> float:
    return float(math.sqrt(2.0 * np.sum(variances**2) / reps) / np.sum(variances))


def pure_ldp_theory(server, f: np.ndarray, n: int, epsilon: float) -> tuple[np.ndarray, dict]:
    """Exact per-symbol variance of pure-ldp's (unnormalised) HR estimate, and its parameters."""
    e = math.exp(epsilon)
    hr = server.hr
    if epsilon <= 1:  # Hadamard_Rand_high_priv: one block, n Var = c^2 - f
        c = (e + 1) / (e - 1)
        return (c * c - f) / n, {"mode": "high-privacy HR", "B": 1, "b": int(hr.outsz), "K": int(hr.outsz)}
    big_b, b = int(hr.part), int(hr.partsz)
    t = (e - 1) / (e - 1 + 2 * big_b)
    block = np.asarray(hr.permute, dtype=np.int64)[np.arange(len(f))] // (b - 1)
    mass = np.bincount(block, weights=f, minlength=big_b)
    var = ((1 - t) / (big_b * t * t) + mass[block] / t - f) / n
    used = int(np.unique(block).size)
    return var, {"mode": "general HR (original)", "B": big_b, "b": b, "K": int(hr.outsz), "blocks_used": used}


def run_ours(symbols: np.ndarray, f: np.ndarray, k: int, epsilon: float, seed: int) -> dict:
    n = symbols.size
    params = choose_hadamard_response(k, epsilon)
    reps = repetitions_ours(k)
    source = SeededSource(seed)
    sq_err, squares = 0.0, []
    client, server = Best(), Best()
    for rep in range(reps):
        outputs = client.measure(lambda: randomize_hadamard_response(symbols, params, source))
        decode = lambda: decode_hadamard_response(outputs, params)  # noqa: E731
        estimate = server.measure_repeatedly(decode) if rep == 0 else server.measure(decode)
        squares.append((estimate - f) ** 2)
        sq_err += float(np.sum(squares[-1]))
    variances = hadamard_response_variance(f, n, params)
    mse, theory = sq_err / (reps * k), float(variances.mean())
    ci = ratio_ci(np.concatenate(squares), theory, label="MSE / exact theory", unit="symbol estimates")
    return {
        "B": params.blocks,
        "b": params.block_size,
        "K": params.output_size,
        "message_bits": params.message_bits,
        "reps": reps,
        "mse": mse,
        "theory": theory,
        "ratio": mse / theory,
        "ratio_sd": ratio_sd(variances, reps),
        "ratio_ci95": ci["ci95"],
        "ratio_units": ci["seeds"],
        "client_cpu_s": client.cpu,
        "client_wall_s": client.wall,
        "client_us_per_user": 1e6 * client.cpu / n,
        "server_cpu_s": server.cpu,
        "server_wall_s": server.wall,
    }


def run_pure_ldp(classes, symbols: np.ndarray, f: np.ndarray, k: int, epsilon: float, seed: int) -> dict:
    client_cls, server_cls = classes
    n = symbols.size
    reps = repetitions_pure_ldp(k, n)
    np.random.seed(seed % 2**32)  # pure-ldp draws from the global numpy and random streams
    random.seed(seed)
    server = server_cls(epsilon, k)
    client = client_cls(epsilon, k, server.get_hash_funcs())
    variances, info = pure_ldp_theory(server, f, n, epsilon)
    data = (symbols + 1).tolist()  # pure-ldp's default index_mapper is x - 1
    domain = range(1, k + 1)
    sq_err, squares = 0.0, []
    t_client, t_server, t_estimate = Best(), Best(), Best()

    def aggregate_all():
        server.reset()
        for report in reports:
            server.aggregate(report)

    def estimate_all():
        return np.array([server.estimate(x, suppress_warnings=True) for x in domain], dtype=np.float64)

    def serve():
        aggregate_all()
        return t_estimate.measure(estimate_all)

    for rep in range(reps):
        reports = t_client.measure(lambda: [client.privatise(v) for v in data])
        counts = t_server.measure_repeatedly(serve) if rep == 0 else t_server.measure(serve)
        squares.append((counts / n - f) ** 2)
        sq_err += float(np.sum(squares[-1]))
    mse, theory = sq_err / (reps * k), float(variances.mean())
    ci = ratio_ci(np.concatenate(squares), theory, label="MSE / exact theory", unit="symbol estimates")
    return {
        **info,
        "reps": reps,
        "mse": mse,
        "theory": theory,
        "ratio": mse / theory,
        "ratio_sd": ratio_sd(variances, reps),
        "ratio_ci95": ci["ci95"],
        "ratio_units": ci["seeds"],
        "client_cpu_s": t_client.cpu,
        "client_wall_s": t_client.wall,
        "client_us_per_user": 1e6 * t_client.cpu / n,
        "server_cpu_s": t_server.cpu,
        "server_wall_s": t_server.wall,
        "estimate_only_cpu_s": t_estimate.cpu,
    }


def plot(rows: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k_values = sorted({r["k"] for r in rows})
    n_values = sorted({r["n"] for r in rows})
    epsilons = sorted({r["epsilon"] for r in rows})
    fig, axes = plt.subplots(2, len(k_values), figsize=(5.2 * max(2, len(k_values)), 8.4), squeeze=False)
    colors = dict(zip(n_values, ["tab:blue", "tab:red", "tab:green", "tab:purple"]))
    for col, k in enumerate(k_values):
        ax = axes[0, col]
        for n in n_values:
            sel = [r for r in rows if r["k"] == k and r["n"] == n]
            eps = [r["epsilon"] for r in sel]
            c = colors[n]
            tag = f"(n={n:.0e})"
            theirs = all(r["pure_ldp"] for r in sel)
            ax.plot(eps, [r["ours"]["theory"] for r in sel], "-", color=c, lw=1.5, label=f"theory, ours {tag}")
            if theirs:
                ax.plot(eps, [r["pure_ldp"]["theory"] for r in sel], ":", color=c, lw=1.5, label=f"theory, pure-ldp {tag}")
            ax.plot(eps, [r["ours"]["mse"] for r in sel], "o", color=c, ms=7, mfc="none", label=f"MSE, ours {tag}")
            if theirs:
                ax.plot(eps, [r["pure_ldp"]["mse"] for r in sel], "x", color=c, ms=8, label=f"MSE, pure-ldp {tag}")
        ax.set_yscale("log")
        ax.set_xlabel("epsilon")
        ax.set_ylabel("MSE per symbol")
        ax.set_title(f"k = {k}: Zipf({ZIPF_S}) data")
        ax.grid(True, which="both", alpha=0.3)
        if col == 0:
            ax.legend(fontsize=7)
        ax = axes[1, col]
        width = 0.35
        x = np.arange(len(epsilons))
        top = 1.0
        for i, n in enumerate(n_values):
            sel = [r for r in rows if r["k"] == k and r["n"] == n]
            speedups = [r["server_speedup"] or 0.0 for r in sel]
            top = max(top, *speedups)
            bars = ax.bar(x + (i - 0.5) * width, speedups, width, color=colors[n], label=f"n={n:.0e}")
            ax.bar_label(bars, fmt="%.0f", fontsize=8)
        ax.axhline(50, color="k", ls="--", lw=1, label="50x target")
        ax.set_xticks(x, [str(e) for e in epsilons])
        ax.set_ylim(0, 1.2 * top)
        ax.set_xlabel("epsilon")
        ax.set_ylabel("server CPU time: pure-ldp / ours")
        ax.set_title(f"k = {k}: server speed-up (aggregate + estimate)")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle("Block Hadamard response (shuffledp) vs pure-ldp Hadamard response")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__, quick=f"k in {QUICK['k']}, n in {QUICK['n']}, eps in {QUICK['epsilon']}; "
                                      "without pure-ldp if it is not installed")
    parser.add_argument("--plot-only", action="store_true", help="redraw the figure from the JSON in the output folder")
    args = parse(parser, argv)
    if args.plot_only:
        plot(read_result(args, "frequency")["rows"], args.out / "frequency.png")
        return 0
    sizes = QUICK if args.quick else {"k": K_VALUES, "n": N_VALUES, "epsilon": EPSILONS}
    warnings.simplefilter("ignore", RuntimeWarning)
    try:
        client_cls, server_cls, how, pl_version = import_pure_ldp_hr()
    except ImportError as exc:
        if not args.quick:
            sys.exit(f"pure-ldp is needed for the comparison ({exc}): pip install -e '.[bench]' "
                     "(--quick runs without it)")
        classes, how, pl_version = None, None, None
        print(f"pure-ldp cannot be imported ({exc}): skipping the comparison with pure-ldp, measuring ours alone "
              "(pip install -e '.[bench]' to compare)", flush=True)
    else:
        classes = (client_cls, server_cls)
        print(f"pure-ldp {pl_version}: {how}", flush=True)
    rows = []
    started = time.perf_counter()
    for k in sizes["k"]:
        for n in sizes["n"]:
            symbols = zipf_data(k, n, seed=20240)
            f = np.bincount(symbols, minlength=k) / n
            for epsilon in sizes["epsilon"]:
                seed = 1000 * sizes["k"].index(k) + 100 * sizes["n"].index(n) + sizes["epsilon"].index(epsilon)
                ours = run_ours(symbols, f, k, epsilon, seed)
                theirs = run_pure_ldp(classes, symbols, f, k, epsilon, seed) if classes else None
                row = {"k": k, "n": n, "epsilon": epsilon, "ours": ours, "pure_ldp": theirs}
                if theirs:
                    row.update({
                        "server_speedup": theirs["server_cpu_s"] / ours["server_cpu_s"],
                        "server_speedup_wall": theirs["server_wall_s"] / ours["server_wall_s"],
                        "client_speedup": theirs["client_cpu_s"] / ours["client_cpu_s"],
                        "mse_ratio_pure_ldp_over_ours": theirs["mse"] / ours["mse"],
                    })
                    versus = (
                        f" | pure-ldp B={theirs['B']:3d} b={theirs['b']:5d} "
                        f"MSE/theory={theirs['ratio']:.3f} [{theirs['ratio_ci95'][0]:.3f}, {theirs['ratio_ci95'][1]:.3f}] "
                        f"(R={theirs['reps']}) | "
                        f"MSE theirs/ours={row['mse_ratio_pure_ldp_over_ours']:.2f} | "
                        f"client {ours['client_us_per_user']:.3f} vs {theirs['client_us_per_user']:.2f} us/user | "
                        f"server CPU {1e3 * ours['server_cpu_s']:.2f} vs {1e3 * theirs['server_cpu_s']:.1f} ms "
                        f"(x{row['server_speedup']:.0f})"
                    )
                else:
                    row.update(server_speedup=None, server_speedup_wall=None, client_speedup=None,
                               mse_ratio_pure_ldp_over_ours=None)
                    versus = (f" | client {ours['client_us_per_user']:.3f} us/user | server CPU "
                              f"{1e3 * ours['server_cpu_s']:.2f} ms (pure-ldp not run)")
                rows.append(row)
                print(
                    f"[{time.perf_counter() - started:6.0f}s] k={k:5d} n={n:.0e} eps={epsilon:3}: "
                    f"ours B={ours['B']:3d} b={ours['b']:5d} MSE/theory {format_ratio(self_ci(ours))} "
                    f"(R={ours['reps']})" + versus,
                    flush=True,
                )
    total = time.perf_counter() - started
    ours_ratios = [r["ours"]["ratio"] for r in rows]
    pl_ratios = [r["pure_ldp"]["ratio"] for r in rows if r["pure_ldp"]]
    speedups = [r["server_speedup"] for r in rows if r["server_speedup"] is not None]
    payload = {
        "benchmark": "frequency oracles: block Hadamard response vs pure-ldp Hadamard response",
        "data": f"Zipf({ZIPF_S}) truncated to k symbols, fixed per (k, n); f = empirical histogram",
        "pure_ldp": {"version": pl_version, "import": how, "requirement": "pure-ldp==1.2.0",
                     "compared": classes is not None},
        "timing": (
            "CPU time of this process (process_time; wall times also given), best over repetitions; "
            "speed-ups from CPU time; pure-ldp client = its per-user privatise loop over all n users; "
            "pure-ldp server = aggregate every report + estimate every symbol"
        ),
        "rows": rows,
        "summary": {
            "ours_mse_over_theory_range": [min(ours_ratios), max(ours_ratios)],
            "ours_within_10_percent": all(abs(x - 1) <= 0.10 for x in ours_ratios),
            "pure_ldp_mse_over_theory_range": [min(pl_ratios), max(pl_ratios)] if pl_ratios else None,
            "server_speedup_range": [min(speedups), max(speedups)] if speedups else None,
            "server_speedup_at_least_50": all(x >= 50 for x in speedups) if speedups else None,
            "total_seconds": total,
        },
    }
    path = write_result(args, "frequency", payload, sizes=sizes)
    plot(rows, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png')} in {total:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
