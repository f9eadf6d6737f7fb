"""The fast engine's rounds on a Dask cluster (``dask.distributed``): the optional extra ``shuffledp[dask]``.

:func:`run_dask` runs a protocol (``analyzer/protocols.py``) exactly as
:func:`~shuffledp.simulation.engine.run_fast` does, with each round's draw blocks computed on
the cluster's workers instead of in this process:

* **Map.** Round ``r`` is a set of tasks, each over a run of consecutive draw blocks ``b``
  (users ``[b B, (b+1) B)``, ``B`` = :func:`~shuffledp.simulation.engine.draw_block_users`;
  :func:`blocks_per_task` of them). For each block the task makes its users'
  data on the worker (for :class:`~shuffledp.simulation.population.GeneratedUsers`, from the
  same per-block population seeds: only those seeds are shipped, never the data), randomizes
  it with :func:`~shuffledp.simulation.engine.round_source` ``(seed, r, b)``, the source the
  local engine uses for that block, and folds the reports into a fresh collector of the
  round's plan (the analyzer's sufficient statistics), one per task.
* **Reduce.** The client merges the tasks' collectors (:meth:`Collector.merge`) as their
  futures complete (``dask.distributed.as_completed``), advancing the progress callback by
  each task's users. Collectors keep exact sums, so the merged statistics, hence the
  protocol's result, are the local engine's to the last bit, whatever worker ran which block
  and whatever order they finished in (``tests/simulation/test_dask_engine.py``).

Only statistics travel back (a histogram, per-coordinate sums: kilobytes to a few MiB per
task), never a user's data or report. A round whose plan names no collector (the
instance-optimal mean's rounds; the scalar mean, vector mean and summation name one for every
round) is the exception: its blocks' reports are gathered and permuted as the local engine's held path
does (the reports a shuffler would forward), which holds them all in this process.

Faults. A task is a pure function of its arguments, so when a worker dies mid-round the
scheduler runs its blocks again elsewhere (up to ``distributed.scheduler.allowed-failures``
times per task) and they return the same statistics: a lost worker costs time, never a
different result.

Privacy of the cluster. A Dask scheduler or worker runs whatever function a connected client
sends it, and a client unpickles whatever results come back, so whoever can connect to a
cluster runs code as its user, and a cluster (or whoever sits between) runs code in the
client. The cluster :func:`private_cluster` starts (``--dask-workers N``) is therefore reachable
only with credentials made for the run: mutual TLS under a certificate and key generated in
memory (``distributed.Security.temporary()``) that only this process and its workers hold; a
connection without that certificate is dropped in the TLS handshake, before any message is
read. Every socket it listens on is on 127.0.0.1, and its HTTP servers (which Dask always
starts) serve no page: no dashboard, no metrics, no worker list
(``tests/simulation/test_dask_security.py``). An external scheduler (``--dask-scheduler``) must
be addressed over TLS (``tls://``, ``wss://``), with this client's certificate in Dask's
configuration; a plaintext address is refused unless the caller accepts it by name
(:func:`scheduler_security`).

Dask is imported only inside this module's functions: importing it costs nothing without
the extra, and the local engine never loads it.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np

from shuffledp.analyzer.protocols import Collector, Protocol, RoundPlan, drive
from shuffledp.client.mechanisms import randomize_round
from shuffledp.protocol.errors import InvalidParameter, ShuffleDPError, TransportError
from shuffledp.simulation.engine import (
    EngineRun,
    Progress,
    RoundRun,
    _check_data,
    _envelope_bytes,
    _width,
    draw_block_users,
    round_label,
    round_source,
    run_fast,
)
from shuffledp.simulation.population import GeneratedUsers

if TYPE_CHECKING:  # pragma: no cover
    from distributed import Client, LocalCluster

#: Where a round's task should run: ``placement(round_index, first block of the task)`` names worker
#: addresses (a preference: Dask runs the task elsewhere if those workers are gone), or ``None``: anywhere.
Placement = Callable[[int, int], "Sequence[str] | None"]


class DaskUnavailable(ShuffleDPError, ImportError):
    """The Dask engine was asked for, and ``dask.distributed`` is not installed."""

    reason = "missing-extra"

    def __init__(self) -> None:
        from shuffledp.install import install_command

        super().__init__("the Dask engine needs the 'dask' extra (dask.distributed is not installed): "
                         + install_command(("dask",)))


def _distributed():
    """The ``distributed`` module, or :class:`DaskUnavailable`."""
    try:
        import distributed
    except ImportError as exc:
        raise DaskUnavailable() from exc
    return distributed


def _block_users(data: Any, start: int, stop: int) -> tuple[Any, int, int]:
    """What a task needs to make users ``start..stop-1``: ``(source, lo, hi)`` with ``source[lo:hi]``
    their data. For :class:`GeneratedUsers` the covering population blocks (seeds, not data);
    for an array the slice itself (the caller's data: pass ``GeneratedUsers`` to keep it off the wire)."""
    if isinstance(data, GeneratedUsers):
        part, offset = data.covering(start, stop)
        return part, offset, offset + stop - start
    return np.ascontiguousarray(data[start:stop], dtype=np.float64), 0, stop - start


def draw_blocks_task(
    plan: RoundPlan, source: Any, spans: Sequence[tuple[int, int, int]], seed: int, round_index: int
) -> tuple[Any, int]:
    """One task: for each draw block ``(block, lo, hi)`` of ``spans``, the block's users' data
    (``source[lo:hi]``) randomized with ``round_source(seed, round_index, block)``, every block
    folded into one fresh ``plan.collect()``.

    Returns ``(collector, reports)``, or ``(rows, reports)`` (the blocks' rows in block order) for
    a plan without a collector. A pure function of its arguments (the seeds fix every draw), so a
    retried task returns the same statistics. Runs on a worker; module-level so workers import it
    by name."""
    collector = plan.collect() if plan.collect is not None else None
    held: list[np.ndarray] = []
    reports = 0
    for block, lo, hi in spans:
        chunk = np.asarray(source[lo:hi], dtype=np.float64)
        values = randomize_round(plan.params, plan.epsilon0, plan.delta0, chunk, round_source(seed, round_index, block))
        rows = values.reshape(-1, values.shape[-1])
        reports += len(rows)
        if collector is None:
            held.append(rows)
        else:
            collector.add_rows(rows)
    if collector is None:
        return (held[0] if len(held) == 1 else np.concatenate(held)), reports
    return collector, reports


#: Most draw blocks one task runs (when the engine chooses): bounds a task's time (about 2 s of
#: scalar users, 6 s of d = 1,024 users on the benchmark's machine) and what a lost worker redoes.
MAX_BLOCKS_PER_TASK = 32


def blocks_per_task(blocks: int, threads: int) -> int:
    """Consecutive draw blocks per task: enough tasks for 8 per worker thread (so a slow or lost
    worker's share is small), otherwise as few as possible (each task costs the client a
    submission, a result and a merge), at most :data:`MAX_BLOCKS_PER_TASK`."""
    return max(1, min(MAX_BLOCKS_PER_TASK, blocks // (8 * max(1, threads))))


def dask_round(
    client: "Client",
    plan: RoundPlan,
    data: Any,
    seed: int,
    round_index: int,
    progress: Progress | None = None,
    placement: Placement | None = None,
    group: int | None = None,
) -> tuple["Collector | np.ndarray", int]:
    """One round on the cluster: ``(merged collector, reports)``, or, for a plan without a
    collector, ``(rows, reports)`` permuted as :func:`~shuffledp.simulation.engine.fast_round` does.

    Submits one :func:`draw_blocks_task` per ``group`` consecutive draw blocks (``None``:
    :func:`blocks_per_task`) and reduces the results as they complete (``as_completed``), calling
    ``progress(round label, users of the task)`` for each."""
    distributed = _distributed()
    n = data.shape[0]
    size = draw_block_users(_width(data))
    blocks = -(-n // size)
    if group is None:
        group = blocks_per_task(blocks, sum(client.nthreads().values()))
    if not (isinstance(group, int) and group >= 1):
        raise InvalidParameter("blocks_per_task", f"must be an integer >= 1, got {group!r}")
    label = round_label(round_index, plan)
    if progress:
        progress(label, 0)
    run_id = uuid.uuid4().hex[:12]
    pending: dict[Any, tuple[int, int]] = {}
    for task, first in enumerate(range(0, blocks, group)):
        last = min(blocks, first + group)
        start, stop = first * size, min(n, last * size)
        source, lo, _ = _block_users(data, start, stop)
        spans = [(b, lo + b * size - start, lo + min(n, (b + 1) * size) - start) for b in range(first, last)]
        workers = placement(round_index, first) if placement else None
        future = client.submit(
            draw_blocks_task, plan, source, spans, seed, round_index,
            key=f"shuffledp-draw-{run_id}-r{round_index}-b{first}-{last - 1}", workers=workers,
            allow_other_workers=workers is not None, pure=False,
        )
        pending[future] = (task, stop - start)
    merged: Collector | None = None
    held: dict[int, np.ndarray] = {}
    reports = 0
    try:
        for future in distributed.as_completed(list(pending)):
            task, users = pending.pop(future)
            result, count = future.result()
            future.release()
            reports += count
            if plan.collect is None:
                held[task] = result
            elif merged is None:
                merged = result
            else:
                merged.merge(result)
            if progress:
                progress(label, users)
    finally:
        client.cancel(list(pending))  # an error (or interrupt) leaves no task running for nothing
    if plan.collect is not None:
        assert merged is not None  # n >= 2 users: at least one block
        return merged, reports
    rows = np.concatenate([held[t] for t in sorted(held)])
    permutation = np.random.default_rng(np.random.SeedSequence([seed, 0x5F, round_index])).permutation(len(rows))
    return rows[permutation], reports


def run_dask(
    protocol: Protocol,
    local_data: Any,
    client: "Client",
    seed: int = 0,
    progress: Progress | None = None,
    *,
    placement: Placement | None = None,
    blocks_per_task: int | None = None,
) -> EngineRun:
    """Run ``protocol`` on the fast engine with every round's draw blocks on ``client``'s cluster.

    ``local_data``: :class:`GeneratedUsers` (each worker makes its blocks' users from their
    seeds) or an ``(n,)`` / ``(n, d)`` array (each block's slice is shipped). ``placement``:
    which workers should run the task that starts at ``(round, block)`` (default: wherever Dask
    schedules it). ``blocks_per_task``: consecutive draw blocks per task (default: the
    module's :func:`blocks_per_task` rule); it changes the number of tasks, never a draw.

    Guarantee: the result is :func:`~shuffledp.simulation.engine.run_fast`'s with the same
    ``seed`` and data, to the last bit, on any number of workers and whatever the assignment
    of blocks to workers, their completion order, or a worker lost mid-round."""
    if not hasattr(client, "submit"):
        raise InvalidParameter("client", f"must be a dask.distributed Client, got {type(client).__name__}")
    data = _check_data(protocol, local_data, materialize=False)
    runs: list[RoundRun] = []

    def execute(plan: RoundPlan) -> Any:
        index = len(runs)
        answer, count = dask_round(client, plan, data, seed, index, progress, placement, blocks_per_task)
        runs.append(RoundRun(plan, count, count, count * _envelope_bytes(plan, index)))
        return answer

    return EngineRun(drive(protocol, execute), runs, "fast", f"dask {_scheduler_address(client)}")


def run_fast_on(
    protocol: Protocol, local_data: Any, seed: int = 0, progress: Progress | None = None, client: "Client | None" = None
) -> EngineRun:
    """The fast engine on ``client``'s cluster (:func:`run_dask`), or in this process (:func:`run_fast`) if None."""
    if client is None:
        return run_fast(protocol, local_data, seed, progress)
    return run_dask(protocol, local_data, client, seed, progress)


def check_engine(path: str, client: "Client | None") -> None:
    """:class:`InvalidParameter` if a Dask ``client`` is given for an engine other than the fast one."""
    if client is not None and path != "fast":
        raise InvalidParameter("client", f"a Dask cluster runs the fast engine's blocks, not the {path} engine")


def _scheduler_address(client: Any) -> str:
    try:
        return str(client.scheduler.address)
    except AttributeError:  # pragma: no cover - a client without a scheduler connection
        return "cluster"


#: The only address the cluster :func:`private_cluster` starts listens on.
LOOPBACK = "127.0.0.1"

#: Dask's communication protocols that encrypt and authenticate (with credentials configured).
ENCRYPTED_SCHEMES = frozenset({"tls", "wss"})

#: Dask configuration the cluster :func:`private_cluster` starts under: the HTTP servers that the
#: scheduler and every worker start whatever their dashboard setting route nothing (Dask's
#: default routes serve the worker list, task names, logs and metrics to anyone who connects).
PRIVATE_CONFIG: dict[str, list[str]] = {"distributed.scheduler.http.routes": [], "distributed.worker.http.routes": []}


#: Module each worker process of :func:`private_cluster` imports first.
WORKER_PRELOAD = "shuffledp.simulation.dask_worker_signals"


def private_cluster(workers: int, *, processes: bool = True) -> "LocalCluster":
    """A new ``LocalCluster`` of ``workers`` workers (one thread each; worker processes unless
    ``processes=False``), private to this process: close it (or use it as a context manager).

    Mechanism: one certificate and key made in memory for this cluster alone
    (``distributed.Security.temporary()``: a self-signed certificate that is also the only
    trusted CA) secure every connection with mutual TLS (``tls://``, ``require_encryption``): the
    scheduler, the workers and their nannies require the client's certificate, and the client
    requires theirs. The scheduler, nannies, workers and their HTTP servers listen on
    :data:`LOOPBACK` only; no dashboard is started and the HTTP servers route nothing
    (:data:`PRIVATE_CONFIG`). The key never touches a directory others can read (Dask writes it
    for OpenSSL into a fresh 0700 temporary directory and deletes it) and reaches the worker
    processes over their pipes.

    Guarantee: a local user who cannot read this process's memory (another Unix user than
    this one or root) cannot complete a connection to any of the cluster's listeners, so
    can neither run code on it nor read its tasks; a TLS certificate of any other cluster is
    refused as well. What remains: a process of the same user can read the key from memory."""
    distributed = _distributed()
    import dask

    security = distributed.Security.temporary()
    # Each worker process ignores Ctrl-C (shuffledp/simulation/dask_worker_signals.py): this process stops, closes the cluster and prints the one line.
    with dask.config.set({**PRIVATE_CONFIG, "distributed.worker.preload": [WORKER_PRELOAD]}):  # read when the scheduler and each worker start
        return distributed.LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=processes,
            host=LOOPBACK, protocol="tls://", security=security,
            dashboard_address=None, worker_dashboard_address=None,
            # Dask starts the scheduler's HTTP server even without a dashboard (port 8787 by default).
            scheduler_kwargs={"dashboard": False, "dashboard_address": f"{LOOPBACK}:0"},
        )


def scheduler_scheme(address: str) -> str:
    """The communication protocol of a scheduler address (``tcp`` if it names none, as Dask reads it)."""
    from distributed.comm.addressing import parse_address

    try:
        return parse_address(address)[0].lower()
    except ValueError as exc:
        raise InvalidParameter("dask-scheduler", f"not a Dask address: {address!r}") from exc


def scheduler_security(address: str, *, allow_plaintext: bool = False) -> Any:
    """The ``distributed.Security`` to reach the external scheduler at ``address`` with, or
    :class:`InvalidParameter` (one line) if the policy refuses it; connects to nothing.

    Policy: ``address`` must name an encrypted protocol (:data:`ENCRYPTED_SCHEMES`: ``tls://``,
    ``wss://``), and Dask's configuration must give this client a certificate and the
    cluster's CA (``distributed.comm.tls.ca-file``, ``distributed.comm.tls.client.cert``, and
    ``distributed.comm.tls.client.key`` unless the key is in the certificate file); the client
    then requires encryption on every connection it makes (to the scheduler and to any worker).
    A plaintext address (``tcp://``, ``ws://``, or none named), to this host's loopback as well
    as to another host, is refused unless ``allow_plaintext`` (the CLI's
    ``--dask-insecure-plaintext``): whoever can reach a plaintext scheduler runs code as its
    workers' user, and a scheduler, or whoever sits on the path, runs code in this process
    through the results it returns."""
    distributed = _distributed()
    scheme = scheduler_scheme(address)
    if scheme in ENCRYPTED_SCHEMES:
        security = distributed.Security(require_encryption=True)
        if not (security.tls_ca_file and security.tls_client_cert):
            raise InvalidParameter(
                "dask-scheduler", f"a {scheme}:// scheduler needs this client's certificate and the cluster's CA in Dask's "
                "configuration: distributed.comm.tls.ca-file, distributed.comm.tls.client.cert and "
                "distributed.comm.tls.client.key (docs/scale.md)")
        return security
    if allow_plaintext:
        return distributed.Security(require_encryption=False)
    raise InvalidParameter(
        "dask-scheduler", f"{address!r} is not encrypted ({scheme}://): anyone who reaches the scheduler runs code as its "
        "user, and the scheduler runs code here; give a tls:// address with the certificates in Dask's configuration "
        "(docs/scale.md), or add --dask-insecure-plaintext to accept that")


def connect_scheduler(address: str, *, allow_plaintext: bool = False, timeout: str = "20s") -> "Client":
    """A client of the external scheduler at ``address``, under :func:`scheduler_security`'s policy
    (:class:`InvalidParameter` before any connection if it refuses the address).
    :class:`TransportError` if no scheduler answers or the connection fails in any way (one
    line: a peer's error is not passed through as a traceback)."""
    distributed = _distributed()
    security = scheduler_security(address, allow_plaintext=allow_plaintext)
    try:
        return distributed.Client(address, timeout=timeout, security=security)
    except Exception as exc:  # OSError, TimeoutError, or whatever a peer's bytes made the decoder raise
        problem = " ".join(str(exc).split()) or type(exc).__name__
        raise TransportError(f"no Dask scheduler answered at {address!r}: {problem[:200]}") from None


@contextlib.contextmanager
def dask_client(
    scheduler: str | None = None, workers: int | None = None, *, allow_plaintext: bool = False
) -> Iterator["Client | None"]:
    """A ``dask.distributed`` client for the run, closed afterwards: connected to the scheduler at
    ``scheduler`` (an existing cluster: ``tls://HOST:8786``, under :func:`scheduler_security`'s
    policy; ``allow_plaintext`` accepts a plaintext address), or to a new
    :func:`private_cluster` of ``workers`` worker processes (one thread each) that closes with
    it; ``None`` if neither is given (the local engine). :class:`DaskUnavailable` (one line
    naming the extra) without Dask, :class:`~shuffledp.protocol.errors.TransportError` if no
    scheduler answers at ``scheduler``."""
    if scheduler is not None and workers is not None:
        raise InvalidParameter("dask", "give a scheduler address or a number of local workers, not both")
    if scheduler is None and workers is None:
        yield None
        return
    if workers is not None and not (isinstance(workers, int) and workers >= 1):
        raise InvalidParameter("dask-workers", f"must be an integer >= 1, got {workers!r}")
    distributed = _distributed()
    if scheduler is not None:
        with connect_scheduler(scheduler, allow_plaintext=allow_plaintext) as client:
            yield client
        return
    assert workers is not None  # no scheduler, so workers were given (both None returned above)
    with private_cluster(workers) as cluster, distributed.Client(cluster) as client:
        yield client


__all__ = [
    "DaskUnavailable", "Placement", "blocks_per_task", "check_engine", "connect_scheduler", "dask_client", "dask_round",
    "draw_blocks_task", "private_cluster", "run_dask", "run_fast_on", "scheduler_security",
]
