"""Preloaded by each worker process of the private Dask cluster (``distributed.worker.preload``):
the worker ignores SIGINT.

Ctrl-C at a terminal reaches every process of its process group, the cluster's worker processes
included. The command that started the cluster handles it (it stops, closes the cluster, which
ends the workers, and prints one line); a worker raising ``KeyboardInterrupt`` in the middle of a
task would print a traceback of its own.
"""

from __future__ import annotations

import signal
import threading

if threading.current_thread() is threading.main_thread():  # signal handlers are set from the main thread only
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def dask_setup(worker) -> None:
    """Dask's preload hook; the work is done on import, before the worker runs a task."""
