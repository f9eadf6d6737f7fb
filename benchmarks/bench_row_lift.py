"""The row lift of shuffled binary RR to one-bit Hadamard response, against the accountant's bound.

The row lift (``shuffledp/studies/row_lift.py``) is the one all-dataset bound for Hadamard response
that is not a decomposition: it reveals the users' rows and certifies user 1's row, a shuffled
binary RR of about n/K users, with ``rr_any_n``. This script evaluates it on the tightness grid
(K in {4, 16, 64}, n in {1e4, 1e5, 1e6}, eps0 in {0.5, 1, 2, 4, 8}, delta = 1e-6) beside what
``shuffledp account`` reports for the round (its bound and the method), and prints the table with
the ratio lift / accountant. Writes
``row_lift.json`` into the output folder. Run:
``python benchmarks/bench_row_lift.py [--quick] [--out DIR]`` (about a minute on one core;
``--quick``: K = 4, n = 1e4, eps0 = 1).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("SHUFFLEDP_ACCOUNTING_CACHE", "off")

from _common import arguments, log, parse, write_result  # noqa: E402

from shuffledp.protocol.accounting import hadamard_response_guarantee, shuffled_round  # noqa: E402
from shuffledp.studies.row_lift import lift_epsilon  # noqa: E402

KS = (4, 16, 64)
NS = (10_000, 100_000, 1_000_000)
EPS0 = (0.5, 1.0, 2.0, 4.0, 8.0)
DELTA = 1e-6
QUICK = {"ks": (4,), "ns": (10_000,), "eps0": (1.0,)}


def cell(K: int, n: int, e0: float) -> dict:
    bound = shuffled_round(hadamard_response_guarantee(e0, K), n, DELTA)
    lift, m0 = lift_epsilon(DELTA, K, n, e0)
    return {"K": K, "n": n, "eps0": e0, "delta": DELTA, "accountant": bound.epsilon, "method": bound.method,
            "lift": lift, "lift_row_users": m0,
            "lift_over_accountant": lift / bound.epsilon if bound.epsilon > 0 else None}


def main(argv: list[str] | None = None) -> int:
    args = parse(arguments(__doc__, quick="K = 4, n = 1e4, eps0 = 1"), argv)
    ks, ns, eps0s = (QUICK["ks"], QUICK["ns"], QUICK["eps0"]) if args.quick else (KS, NS, EPS0)
    rows = []
    for K in ks:
        for n in ns:
            for e0 in eps0s:
                rows.append(cell(K, n, e0))
                r = rows[-1]
                log(f"K={K} n={n} eps0={e0}: accountant {r['accountant']:.5g} ({r['method']}), lift {r['lift']:.5g} "
                    f"(row of {r['lift_row_users']} users), ratio {r['lift_over_accountant']:.3g}")
    path = write_result(args, "row_lift", {"cells": rows}, sizes={"ks": ks, "ns": ns, "eps0": eps0s, "delta": DELTA})
    print("| K | n | eps0 | accountant (method) | row lift (users in the row) | lift / accountant |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['K']} | {r['n']:.0e} | {r['eps0']:g} | {r['accountant']:.4g} ({r['method']}) | "
              f"{r['lift']:.4g} ({r['lift_row_users']}) | {r['lift_over_accountant']:.2f} |")
    below = [r for r in rows if r["lift"] < r["accountant"]]
    print(f"cells where the lift is below the accountant: {len(below)} of {len(rows)}; written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
