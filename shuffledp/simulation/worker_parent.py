"""The parent of the message engine's worker processes (multiprocessing's ``forkserver``), started early.

The message engine's workers (:class:`~shuffledp.simulation.client_pool.SealingWorkers`, the
shuffler's and the analyzer's key workers) are forks of one server process, which imports
what they run once, so each worker starts without importing it again. Starting that server
is cheap and returns at once; its imports then take a fifth of a second or so on their
own core. :func:`start_worker_parent` starts it as soon as a caller knows it will be wanted
(the message engine does before setting up its parties), so the two overlap.

This module imports nothing of the engine: it only names the modules the workers run.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os

#: Fewest users for which the message engine starts worker processes by default (on more than one CPU).
PARALLEL_USERS = 4096
#: What the worker processes run, imported once by their parent (``__main__`` first, as by default).
WORKER_MODULES = ("__main__", "shuffledp.simulation.client_pool", "shuffledp.shuffler.parallel_open", "shuffledp.analyzer.service")


def start_worker_parent() -> None:
    """Have the forkserver import :data:`WORKER_MODULES` and start it now; returns at once (the server
    imports in its own process). Takes effect only if the forkserver has not started yet in this
    process; later calls do nothing."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(list(WORKER_MODULES))
    multiprocessing.forkserver.ensure_running()


def cpus() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
