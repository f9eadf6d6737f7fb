"""Which dataset is worst for a shuffled round? Exhaustive exact search at small n.

For one-bit Hadamard response (K = 4 and 8 columns) and the projected discrete-Laplace report
(grid G = 2..5), every neighbouring dataset up to symmetry (``shuffledp/studies/worst_dataset.py``:
permutations of the other users, both directions, the input relabelings the law is invariant
under), eps0 in {0.5, 1, 2, 4, 8}, the deltas below, and n as far as the enumeration goes in
a few CPU-minutes: the exact epsilon of every dataset (certified interval), the worst dataset,
the worst *homogeneous* dataset (the other n - 1 users at one input), and the epsilon the
accountant reports (``shuffled_round``), with its ratio to the exact worst case. An accountant
value below the certified lower bound would be a soundness bug: the run says so and exits 1.

Writes ``worst_dataset.json`` into the output folder (``cells`` and ``fine_scan``: a list of
columns and one ``" | "``-separated line per record); prints every cell where a mixed dataset
is certified worse than every homogeneous one, and a summary per mechanism. Run:
``python benchmarks/bench_worst_dataset.py [--quick] [--out DIR]`` (about 7 minutes on one core, 4 of
them the searches and the rest the accountant; ``--quick``: n = 3 and eps0 = 1, a few seconds).
The same searches also scan 60 deltas from 1e-6 to 0.3 (no accountant call there) and record,
per (mechanism, n, eps0), the deltas where a mixed dataset is certified worse than every
homogeneous one and the largest ratio of the two epsilons (``fine_scan`` in the JSON).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

os.environ.setdefault("SHUFFLEDP_ACCOUNTING_CACHE", "off")

from _common import arguments, log, parse, write_result  # noqa: E402

from shuffledp.protocol.accounting import (  # noqa: E402
    hadamard_response_guarantee,
    laplace_mean_guarantee,
    shuffled_round,
)
from shuffledp.studies.worst_dataset import hadamard_law, laplace_law, search  # noqa: E402

EPS0 = (0.5, 1.0, 2.0, 4.0, 8.0)
DELTAS = (1e-1, 3e-2, 1e-2, 3e-3, 1e-3, 1e-4, 1e-6)
#: A finer delta scan from the same searches (no accountant call): how often, and by how much, a mixed
#: dataset beats every homogeneous one.
FINE_DELTAS = tuple(float(d) for d in np.geomspace(1e-6, 0.3, 60))
#: The scan's ratios are taken where the homogeneous epsilon is at least this (near 0 a ratio means little).
RATIO_FLOOR = 1e-3
#: (mechanism, size parameter, n values): the largest n of each keeps its search within ~10 s per eps0.
MECHANISMS = (
    ("hadamard-response", 4, (2, 3, 4, 5, 6, 8, 10, 12, 16)),
    ("hadamard-response", 8, (2, 3, 4, 5, 6, 7)),
    ("laplace-mean", 2, (2, 3, 4, 5, 6, 8, 10, 20, 30)),
    ("laplace-mean", 3, (2, 3, 4, 5, 6, 8, 10, 16)),
    ("laplace-mean", 4, (2, 3, 4, 5, 6, 8, 10)),
    ("laplace-mean", 5, (2, 3, 4, 5, 6, 8)),
)
QUICK = {"eps0": (1.0,), "ns": (3,)}


def _compact(records: list[dict]) -> dict:
    """``{"columns": [...], "rows": ["v1 | v2 | ...", ...]}``: one line per record in the JSON (the
    indented form of 1575 records would be megabytes). Strings as they are, floats by ``repr``, the
rest (integers, booleans, None, nested records) as JSON."""
    columns = list(records[0]) if records else []
    def text(v):
        return repr(v) if isinstance(v, float) else (v if isinstance(v, str) else json.dumps(v))
    return {"columns": columns, "separator": " | ", "rows": [" | ".join(text(r[c]) for c in columns) for r in records]}


def _law(mechanism: str, size: int, e0: float):
    return hadamard_law(e0, size) if mechanism == "hadamard-response" else laplace_law(e0, size)


def _guarantee(mechanism: str, size: int, e0: float):
    return hadamard_response_guarantee(e0, size) if mechanism == "hadamard-response" else laplace_mean_guarantee(e0, size)


def _describe(entry) -> str:
    """``"(a, b); others c0 c1 ..."``: user 1's two inputs and the others' count at each input."""
    return f"({entry.pair[0]}, {entry.pair[1]}); others {' '.join(map(str, entry.others))}"


def fine_scan(result, offset: int) -> dict:
    """Over the fine deltas: where a mixed dataset is certified worse, and the largest gain."""
    hits, best = [], None
    for i, delta in enumerate(FINE_DELTAS, start=offset):
        worst, homog = result.worst(i), result.worst_homogeneous(i)
        if not worst.epsilon[i, 1] > homog.epsilon[i, 2]:
            continue
        hits.append(delta)
        h = float(homog.epsilon[i, 0])
        if h >= RATIO_FLOOR and (best is None or worst.epsilon[i, 0] / h > best["ratio"]):
            best = {"delta": delta, "ratio": float(worst.epsilon[i, 0]) / h, "exact": float(worst.epsilon[i, 0]),
                    "homogeneous_epsilon": h, "worst": _describe(worst), "best_homogeneous": _describe(homog)}
    return {"mixed_worse_deltas": len(hits), "mixed_worse_delta_range": [min(hits), max(hits)] if hits else None,
            "largest_gain": best}


def cells_for(mechanism: str, size: int, n: int, e0: float) -> tuple[list[dict], dict]:
    result = search(_law(mechanism, size, e0), n, DELTAS + FINE_DELTAS)
    scan = {"mechanism": mechanism, "size": size, "n": n, "eps0": e0, "orbits": len(result.weights),
            "datasets": result.datasets(), "group_order": result.group_order, "search_seconds": result.seconds,
            "slack": result.slack, **fine_scan(result, len(DELTAS))}
    rows = []
    for i, delta in enumerate(DELTAS):
        worst, homog = result.worst(i), result.worst_homogeneous(i)
        lower, upper = result.exact_epsilon(i)
        rb = shuffled_round(_guarantee(mechanism, size, e0), n, delta)
        rows.append({
            "mechanism": mechanism, "size": size, "n": n, "eps0": e0, "delta": delta,
            "exact": float(worst.epsilon[i, 0]), "exact_lower": lower, "exact_upper": upper,
            "worst": _describe(worst), "worst_homogeneous_at": worst.homogeneous,
            "best_homogeneous": _describe(homog),
            "homogeneous_epsilon": float(homog.epsilon[i, 0]),
            "homogeneous_upper": float(homog.epsilon[i, 2]),
            # a mixed dataset certified worse than every homogeneous one
            "mixed_is_worse": bool(worst.epsilon[i, 1] > homog.epsilon[i, 2]),
            "accountant": rb.epsilon, "accountant_method": rb.method,
            "ratio": rb.epsilon / upper if upper > 0 else None,
            "unsound": bool(rb.epsilon < lower),
        })
    return rows, scan


def main(argv: list[str] | None = None) -> int:
    args = parse(arguments(__doc__, quick="n = 3, eps0 = 1: the same code paths in a few seconds"), argv)
    eps0s = QUICK["eps0"] if args.quick else EPS0
    rows: list[dict] = []
    scans: list[dict] = []
    for mechanism, size, ns in MECHANISMS:
        for n in (QUICK["ns"] if args.quick else ns):
            for e0 in eps0s:
                new, scan = cells_for(mechanism, size, n, e0)
                rows += new
                scans.append(scan)
                log(f"{mechanism}({size}) n={n} eps0={e0}: {scan['orbits']} orbits of {scan['datasets']} "
                    f"datasets in {scan['search_seconds']:.2f} s; mixed worse at "
                    f"{[r['delta'] for r in new if r['mixed_is_worse']]}; fine scan: {scan['mixed_worse_deltas']} of "
                    f"{len(FINE_DELTAS)} deltas")
    sizes = {"eps0": eps0s, "deltas": DELTAS, "fine_deltas": FINE_DELTAS, "ratio_floor": RATIO_FLOOR, "mechanisms": [list(m[:2]) + [list(m[2])] for m in MECHANISMS]}
    path = write_result(args, "worst_dataset", {"cells": _compact(rows), "fine_scan": _compact(scans)}, sizes=sizes)
    print("cells where a mixed dataset is certified worse than every homogeneous one:")
    for r in rows:
        if r["mixed_is_worse"]:
            print(f"  {r['mechanism']}({r['size']}) n={r['n']} eps0={r['eps0']} delta={r['delta']:g}: "
                  f"{r['worst']}: eps {r['exact']:.6f} > best homogeneous {r['best_homogeneous']}: "
                  f"eps {r['homogeneous_epsilon']:.6f}")
    print("fine delta scan: the largest gain of a mixed dataset over every homogeneous one, per mechanism")
    for mechanism, size, _ in MECHANISMS:
        gains = [s for s in scans if s["mechanism"] == mechanism and s["size"] == size and s["largest_gain"]]
        hit = sum(s["mixed_worse_deltas"] > 0 for s in scans if s["mechanism"] == mechanism and s["size"] == size)
        if gains:
            top = max(gains, key=lambda s: s["largest_gain"]["ratio"])
            g = top["largest_gain"]
            print(f"  {mechanism}({size}): {hit} (n, eps0) cells with a mixed worst; largest {g['ratio']:.4f}x at "
                  f"n={top['n']} eps0={top['eps0']} delta={g['delta']:.3g}: {g['worst']}: eps {g['exact']:.6f} vs "
                  f"{g['best_homogeneous']}: eps {g['homogeneous_epsilon']:.6f}")
    print("per mechanism: largest n, cells, mixed-worse cells, accountant / exact (cells with exact > 0)")
    for mechanism, size, _ in MECHANISMS:
        mine = [r for r in rows if r["mechanism"] == mechanism and r["size"] == size]
        if not mine:
            continue
        ratios = [r["ratio"] for r in mine if r["ratio"]]
        print(f"  {mechanism}({size}): n <= {max(r['n'] for r in mine)}, {len(mine)} cells, "
              f"{sum(r['mixed_is_worse'] for r in mine)} mixed-worse, ratio {min(ratios):.4f} - {max(ratios):.4f}")
    unsound = [r for r in rows if r["unsound"]]
    for r in unsound:
        print(f"SOUNDNESS: accountant {r['accountant']} < exact lower bound {r['exact_lower']} at {r}")
    print(f"wrote {path}")
    return 1 if unsound else 0


if __name__ == "__main__":
    sys.exit(main())
