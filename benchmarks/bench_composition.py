"""Composition of T shuffled rounds: privacy curves (PLD) against per-round (eps, delta).

For each mechanism (binary RR at n = 1e5, Hadamard response with K = 32 at n = 2e4 as in the
default simulation's range round, the Laplace report on G = 4096 levels at n = 1e5, 16-ary RR
at n = 1e5; eps0 = 1) and T in {1, 2, 5, 10, 30, 100} identical rounds, the session epsilon at
delta = 1e-6 by

* ``pld``: each round's certified delta(eps) curve handed to dp-accounting as a pessimistic
  privacy-loss distribution and composed (``SessionAccountant``, PLD route);
* ``rdp``: the Renyi route of the same accountant;
* ``basic``: the per-round bound at delta/T, composed by basic composition (T eps);
* ``advanced``: the per-round bound at delta/(2T) under the advanced composition theorem
  (Dwork, Rothblum & Vadhan 2010) with delta' = delta/2:
  ``eps sqrt(2 T log(1/delta')) + T eps (e^eps - 1)``.

All four are upper bounds; the session reports the smaller of the first two. Writes
``composition.json`` and ``.png`` into the output folder (default ``bench-out/``). Run:
``python benchmarks/bench_composition.py [--quick] [--out DIR]`` (about a minute; ``--quick``:
T in {1, 2, 10}; the on-disk cache is off).
"""

from __future__ import annotations

import math
import os
import sys
import time

from tqdm import tqdm

os.environ["SHUFFLEDP_ACCOUNTING_CACHE"] = "off"

from _common import arguments, parse, write_result  # noqa: E402

from shuffledp.protocol.accounting import (  # noqa: E402
    SessionAccountant,
    binary_rr_guarantee,
    hadamard_response_guarantee,
    k_rr_guarantee,
    laplace_mean_guarantee,
    shuffled_round,
)

DELTA = 1e-6
EPS0 = 1.0
ROUNDS = (1, 2, 5, 10, 30, 100)
QUICK_ROUNDS = (1, 2, 10)
MECHANISMS = {
    "binary RR, n = 1e5": (binary_rr_guarantee(EPS0), 100_000),
    "Hadamard response K = 32, n = 2e4": (hadamard_response_guarantee(EPS0, 32), 20_000),
    "Laplace report G = 4096, n = 1e5": (laplace_mean_guarantee(EPS0, 4096), 100_000),
    "16-ary RR, n = 1e5": (k_rr_guarantee(EPS0, 16), 100_000),
}


def advanced(eps: float, T: int, delta_prime: float) -> float:
    return eps * math.sqrt(2 * T * math.log(1 / delta_prime)) + T * eps * math.expm1(eps)


def main(argv: list[str] | None = None) -> int:
    args = parse(arguments(__doc__, quick=f"T in {QUICK_ROUNDS} (a smoke run)"), argv)
    rounds = QUICK_ROUNDS if args.quick else ROUNDS
    rows = []
    grid = [(name, T) for name in MECHANISMS for T in rounds]
    for name, T in tqdm(grid, desc="composition", file=sys.stderr):
        local, n = MECHANISMS[name]
        t = time.perf_counter()
        acc = SessionAccountant()
        acc.add_round(local, n, count=T)
        routes = acc.epsilon_breakdown(DELTA)
        seconds = time.perf_counter() - t
        basic = T * shuffled_round(local, n, DELTA / T).epsilon
        adv = advanced(shuffled_round(local, n, DELTA / (2 * T)).epsilon, T, DELTA / 2)
        rows.append({"mechanism": name, "rounds": T, "pld": routes["pld"], "rdp": routes["rdp"], "basic": basic,
                     "advanced": adv, "session_seconds": seconds})
    sizes = {"rounds": rounds, "mechanisms": {name: n for name, (_, n) in MECHANISMS.items()}}
    path = write_result(args, "composition", {"delta": DELTA, "eps0": EPS0, "rows": rows}, sizes=sizes)
    plot(rows, path.with_suffix(".png"))
    print(f"{'mechanism':>36} {'T':>4} {'PLD':>9} {'RDP':>9} {'basic':>9} {'advanced':>9} {'basic/PLD':>9} {'s':>6}")
    for r in rows:
        print(f"{r['mechanism']:>36} {r['rounds']:>4} {r['pld']:>9.4g} {r['rdp']:>9.4g} {r['basic']:>9.4g} "
              f"{r['advanced']:>9.4g} {r['basic'] / r['pld']:>9.2f} {r['session_seconds']:>6.2f}")
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0


def plot(rows: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(MECHANISMS), figsize=(18, 4.5), sharey=False)
    for ax, name in zip(axes, MECHANISMS):
        rs = [r for r in rows if r["mechanism"] == name]
        T = [r["rounds"] for r in rs]
        for key, style in (("pld", "o-"), ("rdp", "s--"), ("basic", "^:"), ("advanced", "v-.")):
            ax.plot(T, [r[key] for r in rs], style, label=key)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("rounds T")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel(f"session epsilon at delta = {DELTA:g}")
    axes[0].legend()
    fig.suptitle(f"Composing T shuffled rounds (eps0 = {EPS0:g}): privacy curves (PLD) against per-round (eps, delta)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
