"""Tightness of each amplification bound relative to exact shuffled randomized response.

For eps0 in {0.5, 1, 2, 4, 8}, n in {1e3, ..., 1e7} and delta = 1e-6, computes every
bound's central epsilon and divides it by the exact central epsilon of shuffled binary
randomized response (the floor: RR is an eps0-LDP randomizer, so no bound that uses
only eps0 can be below it). For n <= 1500 the floor is maximised over every dataset;
above, over the datasets with 0-3 ones among the other users (a lower bound).

Bounds: FMT21 closed form (Thm 3.1), FMT21 numerical (Thm 3.2), the stronger clone
(= variation-ratio with binary-RR parameters; valid for binary and k-ary RR, not for
arbitrary randomizers), Girgis et al.'s RDP bound converted to (eps, delta), and, for
reference, the corrected variation-ratio bound of Hadamard response (a different
mechanism: it may legitimately fall below the RR floor).

Writes ``tightness.json`` and ``tightness.png`` into the output folder (default ``bench-out/``).
Run: ``python benchmarks/tightness_table.py [--quick] [--out DIR]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from _common import arguments, parse, write_result

from shuffledp.protocol.accounting import (
    RR_EXACT_MAX_N,
    EXTENDED_ORDERS,
    fmt21_closed_form,
    fmt21_pair,
    girgis_rdp,
    hadamard_response_guarantee,
    rdp_epsilon,
    rr_exact_epsilon,
    rr_lower_epsilon,
    shuffled_round,
    strong_clone_pair,
)

EPS0 = (0.5, 1.0, 2.0, 4.0, 8.0)
NS = (10**3, 10**4, 10**5, 10**6, 10**7)
DELTA = 1e-6
QUICK = {"eps0": (1.0,), "ns": (10**3, 10**4, 10**5)}
BOUNDS = {
    "fmt21-closed": "FMT21 closed form (Thm 3.1)",
    "fmt21-numerical": "FMT21 numerical (Thm 3.2)",
    "strong-clone": "stronger clone = VR, binary-RR params",
    "rdp-girgis": "Girgis et al. RDP -> (eps, delta)",
    "vr-hadamard": "corrected VR, Hadamard response (K=64)",
}


def cell(e0: float, n: int) -> dict:
    if n <= RR_EXACT_MAX_N:
        floor, floor_kind = rr_exact_epsilon(DELTA, n, e0), "exact (all datasets)"
    else:
        floor, floor_kind = rr_lower_epsilon(DELTA, n, e0), "exact on 0-3 ones (lower bound)"
    vals = {
        "fmt21-closed": fmt21_closed_form(e0, n, DELTA),
        "fmt21-numerical": min(e0, fmt21_pair(e0, n).epsilon(DELTA)),
        "strong-clone": min(e0, strong_clone_pair(e0, n).epsilon(DELTA)),
        "rdp-girgis": min(e0, rdp_epsilon(EXTENDED_ORDERS, girgis_rdp(e0, n, EXTENDED_ORDERS), DELTA)),
        "vr-hadamard": shuffled_round(hadamard_response_guarantee(e0, 64), n, DELTA).candidates["variation-ratio"],
    }
    ratios = {k: (None if v is None else v / floor) for k, v in vals.items()}
    return {"eps0": e0, "n": n, "rr_floor": floor, "rr_floor_kind": floor_kind, "epsilon": vals, "ratio": ratios}


def plot(cells: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eps0s = sorted({c["eps0"] for c in cells})
    fig, axes = plt.subplots(1, len(eps0s), figsize=(17, 4.2), sharey=True, squeeze=False)
    axes = axes[0]
    styles = {"fmt21-closed": ("tab:red", "s"), "fmt21-numerical": ("tab:blue", "o"),
              "strong-clone": ("tab:green", "^"), "rdp-girgis": ("tab:purple", "v"),
              "vr-hadamard": ("tab:orange", "D")}
    for ax, e0 in zip(axes, eps0s):
        rows = [c for c in cells if c["eps0"] == e0]
        ns = [c["n"] for c in rows]
        for key, label in BOUNDS.items():
            ys = [np.nan if c["ratio"][key] is None else c["ratio"][key] for c in rows]
            color, marker = styles[key]
            ax.plot(ns, ys, marker=marker, color=color, label=label, lw=1.6, ms=5,
                    ls="--" if key == "vr-hadamard" else "-")
        ax.axhline(1.0, color="k", lw=1.2)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"eps0 = {e0:g}")
        ax.set_xlabel("n (reports per batch)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("epsilon / exact shuffled-RR epsilon")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(BOUNDS), fontsize=9, frameon=False)
    fig.suptitle(f"Tightness of shuffle amplification bounds at delta = {DELTA:g} (1 = exact shuffled binary RR)")
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse(arguments(__doc__), argv)
    sizes = QUICK if args.quick else {"eps0": EPS0, "ns": NS}
    cells = []
    grid = [(e0, n) for e0 in sizes["eps0"] for n in sizes["ns"]]
    for e0, n in tqdm(grid, desc="tightness", file=sys.stderr):
        cells.append(cell(e0, n))
    path = write_result(args, "tightness", {"delta": DELTA, "bounds": BOUNDS, "cells": cells}, sizes=sizes)
    plot(cells, args.out / "tightness.png")
    header = f"{'eps0':>5} {'n':>8} {'RR floor':>10} " + " ".join(f"{k:>16}" for k in BOUNDS)
    print(header)
    for c in cells:
        ratios = " ".join(f"{'n/a' if c['ratio'][k] is None else format(c['ratio'][k], '.3f'):>16}" for k in BOUNDS)
        print(f"{c['eps0']:>5g} {c['n']:>8.0e} {c['rr_floor']:>10.4g} {ratios}")
    print("ratios are epsilon / exact shuffled-RR epsilon (vr-hadamard is a different mechanism: may be < 1)")
    print(f"wrote {path} and {args.out / 'tightness.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
