"""Certified shuffled binary RR at any n (``protocol/accounting/rr_any_n.py``): values and timings.

For eps0 in {0.5, 1, 4}, n in {1e3, 1e5, 1e6, 1e8}, delta = 1e-6: the old reported epsilon
(exact up to n = 1,500, else the stronger-clone / variation-ratio bound), the new certified
upper bound (non-increasing in n), its certified lower bound, and the wall time of the
monotone value (every certificate it needs included) and of one certification at n's grid
point, each from cold in-process caches (on-disk cache off). Writes ``rr_any_n.json`` into
the output folder. Run: ``python benchmarks/bench_rr_any_n.py [--quick] [--out DIR]``.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ["SHUFFLEDP_ACCOUNTING_CACHE"] = "off"

from _common import arguments, parse, write_result  # noqa: E402

from shuffledp.protocol.accounting import strong_clone_pair  # noqa: E402
from shuffledp.protocol.accounting import rr_any_n  # noqa: E402
from shuffledp.protocol.accounting.rr_any_n import certify_epsilon, grid_floor, rr_monotone_epsilon  # noqa: E402
from shuffledp.protocol.accounting.rr_exact import rr_exact_epsilon  # noqa: E402

DELTA = 1e-6
EPS0 = (0.5, 1.0, 4.0)
NS = (10**3, 10**5, 10**6, 10**8)
QUICK = {"eps0": (1.0,), "ns": NS}


def _cold() -> None:
    """Empty the in-process caches of views and binomial windows (each timing starts cold)."""
    rr_any_n._view.cache_clear()
    rr_any_n._binom_window.cache_clear()


def main(argv: list[str] | None = None) -> int:
    args = parse(arguments(__doc__), argv)
    sizes = QUICK if args.quick else {"eps0": EPS0, "ns": NS}
    rows = []
    for e0 in sizes["eps0"]:
        for n in sizes["ns"]:
            old = rr_exact_epsilon(DELTA, n, e0) if n <= 1500 else min(e0, strong_clone_pair(e0, n).epsilon(DELTA))
            _cold()
            t = time.perf_counter()
            mono = rr_monotone_epsilon(DELTA, n, e0)
            t_mono = time.perf_counter() - t
            _cold()
            t = time.perf_counter()
            cert = certify_epsilon(DELTA, grid_floor(n), e0)
            t_cert = time.perf_counter() - t
            row = {"eps0": e0, "n": n, "old": old, "new": mono.epsilon, "from_n": mono.from_n, "lower": mono.lower,
                   "gap": mono.epsilon / mono.lower - 1, "old_over_new": old / mono.epsilon,
                   "evaluations": cert.evaluations, "seconds_certificate": t_cert, "seconds_monotone": t_mono}
            rows.append(row)
            print(json.dumps(row), flush=True)
    path = write_result(args, "rr_any_n", {"delta": DELTA, "rows": rows}, sizes=sizes)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
