"""Shared helpers for benchmarks: single-core pinning, best-of timing, JSON output."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Callable

RESULTS = Path(__file__).parent / "results"


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


def write_result(name: str, payload: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    payload = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count()}, **payload}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
