"""Shared helpers for benchmarks: arguments, output folder, run metadata, single-core pinning, timing.

Every benchmark takes ``--quick`` (the same code paths at tiny sizes, a few seconds) and
``--out DIR`` (where its JSON and plots go; default ``bench-out/`` under the current
directory). The committed ``benchmarks/results/`` changes only with ``--out benchmarks/results``.
Every JSON result starts with a ``metadata`` block: the shuffledp version, the git commit
(and whether the tree had changes), the cores, Python, whether the run was quick, and the
run's parameters (its command-line arguments and the sizes it chose).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

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
