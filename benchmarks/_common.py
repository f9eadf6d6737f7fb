"""Shared helpers for benchmarks: arguments, output folder, run metadata, single-core pinning, timing.

Every benchmark takes ``--quick`` (the same code paths at tiny sizes, a few seconds) and
``--out DIR`` (where its JSON and plots go; default ``bench-out/`` under the current
directory). The committed ``benchmarks/results/`` changes only with ``--out benchmarks/results``.
Every error ratio a benchmark reports (measured error against theory, or one estimator's
error against another's) comes with a 95 % confidence interval over its seeds from
:func:`ratio_ci` (the delta method on the log of a ratio of means), printed by
:func:`format_ratio` as ``ratio 0.99 [0.97, 1.01] over K seeds``.
Every JSON result starts with a ``metadata`` block: the shuffledp version, the git commit
(and whether the tree had changes), the cores, Python, whether the run was quick, and the
run's parameters (its command-line arguments and the sizes it chose).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = Path("bench-out")
#: Cores this process may run on when the benchmark starts (before any pinning).
USABLE_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def arguments(doc: str | None, quick: str = "tiny sizes: the same code paths in a few seconds") -> argparse.ArgumentParser:
    """An argument parser with the options every benchmark has: ``--quick`` and ``--out``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, metavar="DIR",
                        help="folder for the JSON results and plots (default: ./bench-out; "
                             "the committed results: --out benchmarks/results)")
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line and create the output folder."""
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    git_state()  # before this run writes anything
    return args


@functools.lru_cache(maxsize=1)
def git_state() -> dict | None:
    """The checkout's commit and whether its tree has changes (untracked files count), or None outside git."""
    def git(*cmd: str) -> str:
        return subprocess.run(["git", "--no-optional-locks", "-C", str(HERE), *cmd], capture_output=True,
                              text=True, check=True, timeout=30).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": dirty}


def metadata(args: argparse.Namespace, sizes: dict | None = None) -> dict:
    """What a result needs to be read later: version, commit, cores, Python, quick, parameters."""
    import shuffledp

    given = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    return {
        "shuffledp_version": shuffledp.__version__,
        "git": git_state(),
        "cores_usable": USABLE_CORES,
        # the cores this process was allowed when the result was written: 1 for a run pinned to one core
        "cores_used": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "quick": bool(getattr(args, "quick", False)),
        "parameters": {"arguments": given, "sizes": sizes or {}},
        "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def write_result(args: argparse.Namespace, name: str, payload: dict, sizes: dict | None = None) -> Path:
    """Write ``payload`` as ``<out>/<name>.json`` after a fresh metadata block; return the path."""
    payload = {k: v for k, v in payload.items() if k not in ("metadata", "machine")}  # a re-written result
    path = args.out / f"{name}.json"
    path.write_text(json.dumps({"metadata": metadata(args, sizes), **payload}, indent=2) + "\n")
    return path


def read_result(args: argparse.Namespace, name: str) -> dict:
    """A result written earlier into the output folder (for the scripts' redraw and partial-rerun options)."""
    path = args.out / f"{name}.json"
    if not path.exists():
        sys.exit(f"{path} does not exist: run the benchmark first (or pass --out with the folder holding it)")
    return json.loads(path.read_text())


def log(msg: str) -> None:
    """A progress line on stderr, shown at once."""
    print(msg, file=sys.stderr, flush=True)


def pin_one_core() -> None:
    """Run on one core: numpy here is single-threaded, and affinity keeps the OS from spreading us."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def best_of(fn: Callable[[], object], repeats: int = 5) -> float:
    """Best wall time of ``repeats`` calls (the least-disturbed run on a noisy machine)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


#: Normal quantile of a two-sided 95 % interval.
Z95 = 1.959963984540054


def ratio_ci(num, den, *, paired: bool = False, root: int = 1, label: str = "ratio", unit: str = "seeds") -> dict:
    """Ratio of two means over seeds, with a 95 % confidence interval by the delta method on the log.

    ``num`` holds one nonnegative value per seed (a squared error for an MSE ratio, an l2
    error for a mean-error ratio); ``den`` is either one value per seed (another estimator's,
    on the same seeds when ``paired``, else independent seeds) or a scalar known exactly (a
    theoretical MSE). With ``R = mean(num) / mean(den)``,
    ``Var(log R) ~ var(num) / (K mean(num)^2) + var(den) / (K' mean(den)^2)
    - 2 cov(num, den) / (K mean(num) mean(den))`` (the covariance term only when paired; the
    second term is 0 for a scalar ``den``), and the interval is ``R exp(+-1.96 se)``.
    ``root = 2`` reports ``sqrt(R)`` and the square roots of the bounds: the ratio of RMS errors
    when ``num`` and ``den`` are squared errors. Seeds are the sampling unit, so the interval
    is as good as the normal approximation to the mean over K seeds: fine from a few tens of
    seeds up, rough below that (the result records K; a single seed gives an infinite interval).

    ``unit`` names the sampling unit when it is not a seed (say, one symbol's estimate in one
    run, for a frequency oracle whose per-symbol errors are nearly independent).

    Returns ``{"ratio", "ci95": [lo, hi], "seeds", "unit", "method"}``.
    """
    a = np.asarray(num, dtype=np.float64).ravel()
    scalar = np.ndim(den) == 0
    b = np.asarray(den, dtype=np.float64).ravel()
    if paired and (scalar or b.size != a.size):
        raise ValueError(f"paired ratio needs one denominator per seed: {a.size} and {b.size}")
    ma, mb = float(a.mean()), float(b.mean())
    ratio = ma / mb
    if a.size < 2 or ma <= 0.0 or mb <= 0.0:
        lo, hi = (0.0, math.inf) if a.size < 2 else (ratio, ratio)
    else:
        var = float(a.var(ddof=1)) / (a.size * ma * ma)
        if not scalar and b.size > 1:
            var += float(b.var(ddof=1)) / (b.size * mb * mb)
            if paired:
                var -= 2.0 * float(np.cov(a, b, ddof=1)[0, 1]) / (a.size * ma * mb)
        se = math.sqrt(max(var, 0.0))
        lo, hi = ratio * math.exp(-Z95 * se), ratio * math.exp(Z95 * se)
    if root != 1:
        ratio, lo, hi = ratio ** (1.0 / root), lo ** (1.0 / root), hi ** (1.0 / root)
    kind = "paired" if paired else ("against a known value" if scalar else "independent seeds")
    return {"ratio": ratio, "ci95": [lo, hi], "seeds": int(a.size), "unit": unit,
            "method": f"{label}: delta method on the log of a ratio of means ({kind}), 95 %"}


def format_ratio(r: dict, digits: int = 3, quick: bool = False) -> str:
    """``ratio 0.991 [0.975, 1.008] over 15000 seeds`` (``(--quick: few seeds)`` appended when quick)."""
    lo, hi = r["ci95"]
    text = f"ratio {r['ratio']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}] over {r['seeds']} {r.get('unit', 'seeds')}"
    return text + (" (--quick: few seeds, a smoke run)" if quick else "")
