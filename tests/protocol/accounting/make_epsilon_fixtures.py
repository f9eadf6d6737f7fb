"""Write ``epsilon_fixtures.json``: the accountant's reported epsilons on a grid, as reference values.

Generated with an earlier version of the accountant, before its speed-ups (loaded from git
in place of the working tree's; ``OLD_COMMIT`` names it), so that ``test_epsilon_fixtures.py`` can check that every
reported epsilon stays at or below its old value (``new <= old * (1 + 1e-9)``: faster must never
mean looser).

Run: ``SHUFFLEDP_ACCOUNTING_CACHE=off python tests/protocol/accounting/make_epsilon_fixtures.py --commit 4a4e458``
(``--commit ''`` uses the working tree's accountant).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).with_name("epsilon_fixtures.json")
REPO = Path(__file__).resolve().parents[3]
OLD_COMMIT = "4a4e458"


def load_accountant(commit: str | None):
    """The accountant package: the working tree's, or ``commit``'s source (from git) in its place."""
    if commit:
        tmp = Path(tempfile.mkdtemp(prefix="accountant-"))
        names = subprocess.run(["git", "ls-tree", "--name-only", commit, "protocol/accounting/"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.split()
        for name in names:
            if name.endswith(".py"):
                (tmp / Path(name).name).write_text(subprocess.run(
                    ["git", "show", f"{commit}:{name}"], cwd=REPO, capture_output=True, text=True, check=True).stdout)
        import shuffledp.protocol  # noqa: F401

        spec = importlib.util.spec_from_file_location("shuffledp.protocol.accounting", tmp / "__init__.py",
                                                      submodule_search_locations=[str(tmp)])
        module = importlib.util.module_from_spec(spec)
        sys.modules["shuffledp.protocol.accounting"] = module
        spec.loader.exec_module(module)
    import shuffledp.protocol.accounting as accountant

    return accountant


def _mechanism(name: str):
    def make(e0: float):
        from shuffledp.protocol import accounting as A

        family, _, size = name.partition("/")
        return {
            "generic": lambda: A.generic_guarantee(e0),
            "laplace-mean": lambda: A.laplace_mean_guarantee(e0),
            "binary-rr": lambda: A.binary_rr_guarantee(e0),
            "hadamard-response": lambda: A.hadamard_response_guarantee(e0, int(size or 0)),
            "k-rr": lambda: A.k_rr_guarantee(e0, int(size or 0)),
            "block-hadamard-response": lambda: A.block_hadamard_response_guarantee(e0, int(size or 0)),
        }[family]()
    return make

#: (label, factory) for every mechanism family with its own bounds.
MECHANISMS = {name: _mechanism(name) for name in (
    "generic", "laplace-mean", "binary-rr", "hadamard-response/64", "k-rr/8", "block-hadamard-response/64")}
MECHANISMS["hadamard-response/32"] = _mechanism("hadamard-response/32")
#: The default ``shuffledp simulate`` run: eps0 = 0.5 per round, 32 padded bins, n = 20,000 and
#: its delta (``SimulationConfig(...).delta``); each round at delta/2, and the session.
SIM_DELTA = 1.857235621468916e-05
EXTRA_ROUNDS = [("hadamard-response/32", 0.5, 20_000, SIM_DELTA / 2), ("laplace-mean", 0.5, 20_000, SIM_DELTA / 2)]
EPS0 = (0.5, 1.0, 4.0)
NS = (1000, 20_000, 1_000_000)
DELTAS = (1e-6, 5e-7)

#: Sessions: (label, [(mechanism, eps0, n, sampling_rate, sampling, count)], deltas).
SESSIONS = [
    ("simulation, 64 bins", [("hadamard-response/64", 0.5, 20_000, None, "poisson", 1),
                             ("laplace-mean", 0.5, 20_000, None, "poisson", 1)], (1e-6,)),
    ("simulation default", [("hadamard-response/32", 0.5, 20_000, None, "poisson", 1),
                            ("laplace-mean", 0.5, 20_000, None, "poisson", 1)], (SIM_DELTA,)),
    ("laplace-mean x100", [("laplace-mean", 1.0, 100_000, None, "poisson", 100)], (1e-6, 1e-8)),
    ("hadamard x10 + laplace x200 poisson", [("hadamard-response/64", 2.0, 50_000, None, "poisson", 10),
                                             ("laplace-mean", 1.0, 10_000, 0.01, "poisson", 200)], (1e-6,)),
    ("binary-rr x20 uniform", [("binary-rr", 1.0, 1000, 0.1, "uniform", 20)], (1e-6,)),
    ("k-rr x5", [("k-rr/8", 2.0, 20_000, None, "poisson", 5)], (1e-6,)),
]


def rounds() -> list[dict]:
    from shuffledp.protocol.accounting import shuffled_round

    out = []
    grid = [(label, e0, n, delta) for label in MECHANISMS if label != "hadamard-response/32"
            for e0 in EPS0 for n in NS for delta in DELTAS] + EXTRA_ROUNDS
    for label, e0, n, delta in grid:
        t0 = time.perf_counter()
        rb = shuffled_round(MECHANISMS[label](e0), n, delta)
        out.append({"mechanism": label, "eps0": e0, "n": n, "delta": delta, "epsilon": rb.epsilon,
                    "method": rb.method, "candidates": rb.candidates, "lower_bound": rb.lower_bound})
        print(f"{label:<28} eps0={e0:<4} n={n:<8} delta={delta:g}: {rb.epsilon:.6g} ({rb.method}) "
              f"{time.perf_counter() - t0:.2f}s", file=sys.stderr, flush=True)
    return out


def sessions() -> list[dict]:
    from shuffledp.protocol.accounting import SessionAccountant

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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commit", default=OLD_COMMIT, help="accountant source to use ('' = working tree)")
    args = ap.parse_args()
    load_accountant(args.commit or None)
    commit = args.commit or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                           cwd=REPO).stdout.strip() + " (working tree)"
    data = {"accountant_source": commit, "rounds": rounds(), "sessions": sessions()}
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
