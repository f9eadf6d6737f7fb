"""Write ``epsilon_fixtures.json``: the accountant's reported epsilons on a grid, as reference values.

Generated with the code *before* the speed work of issue 11 (commit 4a4e458), so that
``test_epsilon_fixtures.py`` can check that every reported epsilon stays at or below its old
value (``new <= old * (1 + 1e-9)``: faster must never mean looser). Re-running this script
overwrites the reference with the current code's values; only do that deliberately.

Run: ``SHUFFLEDP_ACCOUNTING_CACHE=off python tests/accounting/make_epsilon_fixtures.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from shuffledp.protocol.accounting import (
    SessionAccountant,
    binary_rr_guarantee,
    block_hadamard_response_guarantee,
    generic_guarantee,
    hadamard_response_guarantee,
    k_rr_guarantee,
    laplace_mean_guarantee,
    shuffled_round,
)

OUT = Path(__file__).with_name("epsilon_fixtures.json")

#: (label, factory) for every mechanism family with its own bounds.
MECHANISMS = {
    "generic": generic_guarantee,
    "laplace-mean": laplace_mean_guarantee,
    "binary-rr": binary_rr_guarantee,
    "hadamard-response/64": lambda e: hadamard_response_guarantee(e, 64),
    "k-rr/8": lambda e: k_rr_guarantee(e, 8),
    "block-hadamard-response/64": lambda e: block_hadamard_response_guarantee(e, 64),
}
EPS0 = (0.5, 1.0, 4.0)
NS = (1000, 20_000, 1_000_000)
DELTAS = (1e-6, 5e-7)

#: Sessions: (label, [(mechanism, eps0, n, sampling_rate, sampling, count)], deltas).
SESSIONS = [
    ("simulation default", [("hadamard-response/64", 0.5, 20_000, None, "poisson", 1),
                            ("laplace-mean", 0.5, 20_000, None, "poisson", 1)], (1e-6,)),
    ("laplace-mean x100", [("laplace-mean", 1.0, 100_000, None, "poisson", 100)], (1e-6, 1e-8)),
    ("hadamard x10 + laplace x200 poisson", [("hadamard-response/64", 2.0, 50_000, None, "poisson", 10),
                                             ("laplace-mean", 1.0, 10_000, 0.01, "poisson", 200)], (1e-6,)),
    ("binary-rr x20 uniform", [("binary-rr", 1.0, 1000, 0.1, "uniform", 20)], (1e-6,)),
    ("k-rr x5", [("k-rr/8", 2.0, 20_000, None, "poisson", 5)], (1e-6,)),
]


def rounds() -> list[dict]:
    out = []
    for label, make in MECHANISMS.items():
        for e0 in EPS0:
            for n in NS:
                for delta in DELTAS:
                    t0 = time.perf_counter()
                    rb = shuffled_round(make(e0), n, delta)
                    out.append({"mechanism": label, "eps0": e0, "n": n, "delta": delta, "epsilon": rb.epsilon,
                                "method": rb.method, "candidates": rb.candidates, "lower_bound": rb.lower_bound})
                    print(f"{label:<28} eps0={e0:<4} n={n:<8} delta={delta:g}: {rb.epsilon:.6g} ({rb.method}) "
                          f"{time.perf_counter() - t0:.2f}s", file=sys.stderr, flush=True)
    return out


def sessions() -> list[dict]:
    out = []
    for label, groups, deltas in SESSIONS:
        for delta in deltas:
            acc = SessionAccountant()
            for mech, e0, n, rate, sampling, count in groups:
                acc.add_round(MECHANISMS[mech](e0), n, sampling_rate=rate, sampling=sampling, count=count)
            t0 = time.perf_counter()
            b = acc.epsilon_breakdown(delta)
            out.append({"label": label, "groups": [list(g) for g in groups], "delta": delta, "pld": b["pld"],
                        "rdp": b["rdp"], "epsilon": min(b["pld"], b["rdp"])})
            print(f"{label:<40} delta={delta:g}: pld {b['pld']:.6g} rdp {b['rdp']:.6g} "
                  f"{time.perf_counter() - t0:.2f}s", file=sys.stderr, flush=True)
    return out


def main() -> int:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    data = {"generated_at_commit": commit, "rounds": rounds(), "sessions": sessions()}
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
