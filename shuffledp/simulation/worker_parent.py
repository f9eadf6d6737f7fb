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
import sys

from shuffledp.protocol.errors import InvalidParameter

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


def message_workers(users: int, workers: int | None = None) -> int:
    """Processes the message engine uses for ``users``: ``workers`` if given, else every CPU this
    process may run on when there are more than one and at least :data:`PARALLEL_USERS` users, else 1."""
    if workers is not None:
        if workers < 1:
            raise InvalidParameter("workers", f"must be >= 1, got {workers}")
        return workers
    # The workers start as multiprocessing's forkserver children, which import the main module
    # again as ``__mp_main__``; a main module read from stdin cannot be (the workers would fail to
    # start), so such a process stays in one process unless told otherwise.
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if getattr(main, "__spec__", None) is None and path is not None and not os.path.isfile(path):
        return 1
    available = cpus()
    return available if available > 1 and users >= PARALLEL_USERS else 1


def start_worker_parent_for(users: int, workers: int | None = None) -> None:
    """:func:`start_worker_parent` if the message engine will run ``users`` on worker processes
    (:func:`message_workers`): a caller that knows the run's size early starts the workers' parent
    while it still makes the users' data."""
    if message_workers(users, workers) > 1:
        start_worker_parent()
