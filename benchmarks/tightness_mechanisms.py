"""Tightness and time of the epsilon shuffledp reports, for every mechanism it sends.

For each mechanism (binary RR; the projected discrete-Laplace mean report on G = 4096
levels; 16-ary RR; one-bit Hadamard response with K = 64), eps0 in {0.5, 1, 2, 4, 8},
n in {1e3, ..., 1e8} and delta = 1e-6: the epsilon of ``shuffled_round`` (the reported
one: the smallest valid bound), the bound that gave it, the time of the call with the
on-disk cache off (each mechanism's first call at a size also builds shared per-process
tables: that is included), and a *certified lower bound* on the true epsilon:

* binary RR: the certificate's lower bound on the exact value, maximised over datasets
  (``rr_any_n``); equal to the reported value where that is exact;
* the other three: the exact divergence of the dataset where every other user holds
  the pair's second input, which reduces exactly to *thinned* binary RR
  (``thinned_rr``: k-RR and Hadamard response as they are, the Laplace report after the
  three-level post-processing ``y <= 0 / 0 < y < G / y >= G``), searched to 1e-4; a lower
  bound by data processing (the worst dataset can only be worse). Computed up to
  n = 1e6 (its cost grows like n); above, only the reported value and its time.

Writes ``benchmarks/results/tightness_mechanisms.json`` and ``.png``; prints a table.
Run: ``python benchmarks/tightness_mechanisms.py [--quick] [--replot]`` (``--quick``:
n <= 1e5, under a minute; the full grid takes ~15 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from tqdm import tqdm

os.environ["SHUFFLEDP_ACCOUNTING_CACHE"] = "off"  # time the computation, not the cache

from shuffledp.protocol.accounting import (  # noqa: E402
    binary_rr_guarantee,
    hadamard_response_guarantee,
    k_rr_guarantee,
    laplace_mean_guarantee,
    shuffled_round,
)
from shuffledp.protocol.accounting.thinned_rr import k_rr_tau, laplace_report_tau, thinned_rr_lower_epsilon  # noqa: E402

EPS0 = (0.5, 1.0, 2.0, 4.0, 8.0)
NS = (10**3, 10**4, 10**5, 10**6, 10**7, 10**8)
DELTA = 1e-6
G, K_RR, K_HR = 4096, 16, 64
RESULTS = Path(__file__).parent / "results"
MECHANISMS = {
    "binary-rr": ("binary RR", lambda e0: binary_rr_guarantee(e0)),
    "laplace-mean": (f"Laplace report, G = {G}", lambda e0: laplace_mean_guarantee(e0, G)),
    "k-rr": (f"{K_RR}-ary RR", lambda e0: k_rr_guarantee(e0, K_RR)),
    "hadamard-response": (f"Hadamard response, K = {K_HR}", lambda e0: hadamard_response_guarantee(e0, K_HR)),
}


#: Largest n at which the thinned-RR lower bound is computed (each evaluation costs ~n).
LOWER_MAX_N = 10**6


def informative_fraction(mechanism: str, e0: float) -> float:
    """``tau`` of the mechanism's thinned-RR reduction (``thinned_rr`` module docstring)."""
    if mechanism == "laplace-mean":
        return laplace_report_tau(e0, G)
    if mechanism == "k-rr":
        return k_rr_tau(e0, K_RR)
    if mechanism == "hadamard-response":
        return 0.5
    raise ValueError(mechanism)


def cell(mechanism: str, e0: float, n: int) -> dict:
    local = MECHANISMS[mechanism][1](e0)
    t = time.perf_counter()
    rb = shuffled_round(local, n, DELTA)
    seconds = time.perf_counter() - t
    tau = None
    if mechanism == "binary-rr":
        lower, kind = rb.lower_bound, ("exact" if rb.lower_bound == rb.epsilon else "certified lower bound on the exact value")
    elif n <= LOWER_MAX_N:
        tau = informative_fraction(mechanism, e0)
        lower = thinned_rr_lower_epsilon(DELTA, n, e0, tau)
        kind = "exact value of one dataset (thinned binary RR): a lower bound"
    else:
        lower, kind = None, "not computed (n above LOWER_MAX_N)"
    return {"mechanism": mechanism, "eps0": e0, "n": n, "epsilon": rb.epsilon, "method": rb.method,
            "seconds": seconds, "lower": lower, "lower_kind": kind, "tau": tau,
            "ratio": None if not lower else rb.epsilon / lower}


def plot(cells: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(MECHANISMS), figsize=(18, 7.5), sharex=True)
    for col, (mech, (label, _)) in enumerate(MECHANISMS.items()):
        for e0 in EPS0:
            rows = [c for c in cells if c["mechanism"] == mech and c["eps0"] == e0]
            if not rows:
                continue
            ns = [c["n"] for c in rows]
            axes[0, col].plot(ns, [c["ratio"] if c["ratio"] else float("nan") for c in rows], marker="o", label=f"eps0 = {e0:g}")
            axes[1, col].plot(ns, [c["seconds"] for c in rows], marker="o", label=f"eps0 = {e0:g}")
        axes[0, col].axhline(1.0, color="k", lw=1)
        axes[0, col].axhline(1.02 if mech == "binary-rr" else 1.10, color="tab:red", lw=1, ls="--", label="target")
        axes[0, col].set_title(label)
        axes[1, col].axhline(1.0, color="tab:red", lw=1, ls="--")
        axes[1, col].axhline(0.1, color="tab:red", lw=1, ls=":")
        for ax in axes[:, col]:
            ax.set_xscale("log")
            ax.grid(True, which="both", alpha=0.3)
        axes[1, col].set_yscale("log")
        axes[1, col].set_xlabel("n (reports in the batch)")
    axes[0, 0].set_ylabel("reported eps / certified lower bound")
    axes[1, 0].set_ylabel("seconds per round bound (cache off)")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"Reported epsilon against a certified lower bound, and its cost (delta = {DELTA:g}; targets dashed)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="n <= 1e5 only")
    ap.add_argument("--replot", action="store_true", help="redraw from the saved JSON")
    args = ap.parse_args(argv)
    out = RESULTS / ("tightness_mechanisms_quick.json" if args.quick else "tightness_mechanisms.json")
    if args.replot:
        cells = json.loads(out.read_text())["cells"]
    else:
        ns = [n for n in NS if n <= 10**5] if args.quick else list(NS)
        grid = [(m, e0, n) for m in MECHANISMS for e0 in EPS0 for n in ns]
        cells = [cell(m, e0, n) for m, e0, n in tqdm(grid, desc="tightness", file=sys.stderr)]
        RESULTS.mkdir(exist_ok=True)
        out.write_text(json.dumps({"delta": DELTA, "G": G, "k_rr": K_RR, "K_hr": K_HR, "cells": cells}, indent=1) + "\n")
    plot(cells, out.with_suffix(".png"))
    print(f"{'mechanism':>18} {'eps0':>5} {'n':>7} {'reported':>10} {'method':>16} {'lower':>10} {'ratio':>7} {'time s':>7}")
    for c in cells:
        ratio = "n/a" if c["ratio"] is None else f"{c['ratio']:.3f}"
        print(f"{c['mechanism']:>18} {c['eps0']:>5g} {c['n']:>7.0e} {c['epsilon']:>10.5g} {c['method']:>16} "
              f"{c['lower'] or 0:>10.5g} {ratio:>7} {c['seconds']:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
