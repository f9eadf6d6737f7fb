"""A pool of worker processes that each hold one X25519 private key.

The analyzer opens reports' inner layers and the shuffler opens envelopes' outer
layers on several processes; both need the same thing: processes started once
(``forkserver``, so no event loop or thread state is forked), the party's private
key handed to each at start through the pool's initializer (the processes are the
party's own), and a list of items cut into one slice per worker, whose results come
back in the items' order. Worker functions read the key with :func:`worker_key`. The
process handling itself (:class:`WorkerProcesses`) also serves the simulation's sealing workers.

Not imported by ``shuffledp.client``: devices never start worker processes.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, Callable, Sequence

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

_worker_private: X25519PrivateKey | None = None


def _init(private_bytes: bytes) -> None:
    global _worker_private
    _worker_private = X25519PrivateKey.from_private_bytes(private_bytes)


def worker_key() -> X25519PrivateKey:
    """The private key this worker process was started with."""
    if _worker_private is None:  # pragma: no cover - only reachable outside a KeyWorkers process
        raise RuntimeError("worker_key() is only available inside a KeyWorkers process")
    return _worker_private


def _start_worker(initializer: Callable[..., None] | None, initargs: tuple) -> None:
    """A worker's first call: ignore SIGINT, then ``initializer(*initargs)``.

    Ctrl-C at a terminal reaches every process of its process group, the workers included. The
    process that started them handles it (stops, prints one line, closes the pool, which ends
    the workers); a worker that raised ``KeyboardInterrupt`` too would add a traceback each."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if initializer is not None:
        initializer(*initargs)


class WorkerProcesses:
    """``workers`` processes from the ``forkserver``, each running ``initializer(*initargs)`` first;
    started on first use or by :meth:`start`, stopped by :meth:`close`. The shared part of the
    parties' key workers (:class:`KeyWorkers`) and the simulation's sealing workers."""

    def __init__(self, workers: int, initializer: Callable[..., None] | None = None, initargs: tuple = ()) -> None:
        if workers < 2:
            raise ValueError(f"{type(self).__name__} needs at least 2 workers")
        self.workers = workers
        self._initializer = initializer
        self._initargs = initargs
        self._pool: ProcessPoolExecutor | None = None

    def executor(self) -> ProcessPoolExecutor:
        """The process pool (created on first use; it starts a process when a task finds none idle)."""
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("forkserver"),
                                             initializer=_start_worker, initargs=(self._initializer, self._initargs))
        return self._pool

    def start(self) -> None:
        """Start the worker processes now rather than on first use, from a background thread:
        starting a process waits for the forkserver (which may still be importing what the workers
        run), and the caller's event loop does not wait."""
        pool, workers = self.executor(), self.workers
        threading.Thread(target=lambda: [pool.submit(os.getpid) for _ in range(workers)], daemon=True,
                         name="start worker processes").start()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


class KeyWorkers(WorkerProcesses):
    """``workers`` processes holding ``private`` (:func:`worker_key`)."""

    def __init__(self, private: X25519PrivateKey, workers: int) -> None:
        super().__init__(workers, _init, (private.private_bytes_raw(),))

    def map_slices(self, fn: Callable[..., Any], items: Sequence, *args: Any) -> list[Any]:
        """``[fn(*args, slice) for each slice]``: ``items`` cut into at most ``workers``
        consecutive slices, run in parallel, results in slice order."""
        return [future.result() for future in self.submit_slices(fn, items, *args)]

    async def map_slices_async(self, fn: Callable[..., Any], items: Sequence, *args: Any) -> list[Any]:
        """:meth:`map_slices` awaited: the event loop serves other tasks while the workers run."""
        return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in self.submit_slices(fn, items, *args))))

    def submit_slices(self, fn: Callable[..., Any], items: Sequence, *args: Any) -> list[Future]:
        """The futures of :meth:`map_slices`'s calls, one per slice, in slice order."""
        pool = self.executor()
        step = max(1, -(-len(items) // self.workers))
        return [pool.submit(fn, *args, items[i : i + step]) for i in range(0, len(items), step)]
