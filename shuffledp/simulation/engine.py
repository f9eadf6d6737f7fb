"""The two engines that run any protocol described as rounds (``analyzer/protocols.py``).

* :func:`run_fast`, the vectorized engine: each round's randomizer
  (:func:`shuffledp.client.mechanisms.randomize_round`) runs on blocks of users'
  arrays, and the shuffle is a uniformly random permutation of the rows. No
  serialization, no sealing: millions of users in seconds.
* :func:`run_messages`, the message engine: the coordinator announces each round as
  a signed spec; every user is a real :class:`~shuffledp.client.Client` that checks
  it, charges its ledger, randomizes, pads, seals every message on its own and wraps
  it for the shuffler; the real :class:`~shuffledp.shuffler.Shuffler` admits (with a
  quota of the round's messages per user), permutes and signs; the analyzer opens.
  Over the in-process channel by default, or an MQTT broker. The simulated users
  (:class:`~shuffledp.simulation.client_pool.ClientPool`, a :class:`~shuffledp.deploy.fleet.Fleet`) keep
  each envelope until the shuffler's signed receipt names it and send it again, byte
  for byte, if it seems lost, so a run over a broker survives a broker restart
  (the in-process channel loses nothing, and nothing is sent twice there). The shuffler
  keeps its spool in memory (:class:`~shuffledp.shuffler.memory_spool.MemorySpool`: nothing to
  resume in one process, so no SQLite write per envelope), under the same admission rules.

Randomness: round ``r``'s draws for the users of block ``b`` (users ``[b B, (b+1) B)``,
``B`` = :func:`draw_block_users`: :data:`FAST_BLOCK`, or fewer for wide vectors so a block
holds about :data:`DRAW_VALUES` values) come from the seed ``(seed, 0x5EED, r, b)`` on both
engines (:func:`draw_round`), so at any n the two engines' rounds are the *same multiset* of
reports, and a protocol's result is the same up to the permutation
(``tests/simulation/test_engine.py``). The block size is part of what a seed means: another
``B`` draws other reports. The fast engine's permutation uses its own seed; the shuffler's
comes from the OS CSPRNG. The decoders sum with correct rounding or in integers, so a
protocol's result is the same to the last bit whatever the order. A seeded fleet of separate
processes (``shuffledp up --seed``) draws through the same function (:func:`seeded_draw`).

Millions of users in bounded memory. The fast engine runs every protocol block by block:
a block's users' data (an array, or :class:`~shuffledp.simulation.population.GeneratedUsers`
made block by block from the population's seed), then its reports. For a round whose plan
names a collector (``analyzer/protocols.py``: the analyzer's sufficient statistics, exact
integer sums), each block's reports are folded into it and dropped (``stream``): memory is
one block plus the statistics, whatever n is. A round without one is held whole and
permuted. Streaming or holding, the protocol receives the same statistics, so its result is
the same to the last bit (``stream`` changes memory, never a result); the message engine
sends the opened rows, which the protocol folds into the same collector.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from shuffledp.analyzer.protocols import Collector, Protocol, RoundPlan, drive
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.client.mechanisms import randomize_round
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.wire.messages import RoundSpec
from shuffledp.protocol.mechanisms.randomness import SeededSource
from shuffledp.simulation.population import GeneratedUsers

Progress = Callable[[str, int], None]
#: Most users per seeded draw block (one randomizer call; bounds memory with millions of users).
FAST_BLOCK = 1 << 16
#: Values of local data a draw block holds at most, once its users' vectors are wide (2^20: 8 MiB).
DRAW_VALUES = 1 << 20


def draw_block_users(width: int) -> int:
    """Users per draw block for data of ``width`` values per user: :data:`FAST_BLOCK`, or the
    largest power of two with ``users * width <= DRAW_VALUES`` if smaller (at least one)."""
    fit = max(1, DRAW_VALUES // max(1, width))
    return max(1, min(FAST_BLOCK, 1 << (fit.bit_length() - 1)))


def round_source(seed: int, round_index: int, block: int = 0) -> SeededSource:
    """The seeded source of one round's block of users, the same on both engines."""
    return SeededSource(np.random.SeedSequence([seed, 0x5EED, round_index, block]))


@dataclass
class RoundRun:
    """One executed round: its plan, what the analyzer opened, and what it cost on the wire.

    ``messages`` counts envelopes (fast engine: those the users would have sent;
    message engine: those the shuffler forwarded); ``envelope_bytes`` (the users'
    envelopes, each once) is exact on both, since every envelope of a round has one
    size. ``retransmitted`` counts the copies the message engine's users sent again for
    want of a receipt (over a broker that lost messages), not in ``envelope_bytes``.
    ``batch_bytes`` exists only where a batch was really sent."""

    plan: RoundPlan
    reports: int
    messages: int
    envelope_bytes: int
    batch_bytes: int | None = None
    batch_sizes: tuple[int, ...] = ()
    rejected_at_shuffler: dict[str, int] = field(default_factory=dict)
    rejected_at_analyzer: dict[str, int] = field(default_factory=dict)
    retransmitted: int = 0

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mechanism": self.plan.params.MECHANISM,
            "epsilon0": self.plan.epsilon0,
            "delta0": self.plan.delta0,
            "messages_per_user": self.plan.messages_per_user,
            "messages": self.messages,
            "reports_opened": self.reports,
            "envelope_bytes": self.envelope_bytes,
            "rejected_at_shuffler": dict(self.rejected_at_shuffler),
            "rejected_at_analyzer": dict(self.rejected_at_analyzer),
        }
        if self.batch_bytes is not None:
            out["batch_bytes"] = self.batch_bytes
        if self.retransmitted:
            out["retransmitted_envelopes"] = self.retransmitted
        return out


@dataclass
class EngineRun:
    """A protocol's result and its rounds, from one engine."""

    result: Any
    rounds: list[RoundRun]
    engine: str
    transport: str = ""


def _check_data(protocol: Protocol, local_data: Any, materialize: bool = True) -> Any:
    data = local_data
    if materialize or not isinstance(local_data, GeneratedUsers):
        data = np.asarray(local_data, dtype=np.float64)
    if data.ndim != protocol.data_rank or data.shape[0] < 2:
        shape = "(n,)" if protocol.data_rank == 1 else "(n, d)"
        raise InvalidParameter("local_data", f"protocol {protocol.name!r} takes {shape} data for n >= 2 users, got {data.shape}")
    return data


def _width(local_data: Any) -> int:
    return 1 if local_data.ndim == 1 else int(np.prod(local_data.shape[1:]))


def draw_blocks(plan: RoundPlan, local_data: Any, seed: int, round_index: int, progress: Progress | None = None):
    """Every user's reports for one round, block by block: int64 ``(users, messages per user, width)``
    per block of :func:`draw_block_users` users, block ``b`` from ``round_source(seed, round_index, b)``.
    ``local_data``: an array, or any object sliced into a block's array (``GeneratedUsers``)."""
    n = local_data.shape[0]
    size = draw_block_users(_width(local_data))
    # The stage is named before any of its work (a count of 0 shows at once), so the bar names the
    # round being drawn; each block then counts once it is folded in.
    label = round_label(round_index, plan)
    if progress:
        progress(label, 0)
    for block, start in enumerate(range(0, n, size)):
        chunk = np.asarray(local_data[start : start + size], dtype=np.float64)
        yield randomize_round(plan.params, plan.epsilon0, plan.delta0, chunk, round_source(seed, round_index, block))
        if progress:
            progress(label, len(chunk))


def round_label(round_index: int, plan: RoundPlan) -> str:
    """A progress stage naming a round as the CLI does (numbered from 0, as its ``round_id`` on the
    wire) and its mechanism: ``round 0 (hadamard-range)``."""
    return f"round {round_index} ({plan.params.MECHANISM})"


def draw_round(plan: RoundPlan, local_data: np.ndarray, seed: int, round_index: int, progress: Progress | None = None) -> np.ndarray:
    """Every user's reports for one round, user by user: int64 ``(n, messages per user, width)``.

    The blocks of :func:`draw_blocks`, joined; both engines draw this way, so they draw the
    same reports at any n."""
    return np.concatenate(list(draw_blocks(plan, local_data, seed, round_index, progress)))


def seeded_draw(seed: int) -> Callable[[RoundSpec, np.ndarray], np.ndarray]:
    """How simulated devices draw a signed round's reports with ``seed``: :func:`draw_round` at the
    spec's round id. The message engine's client pool and a seeded :class:`~shuffledp.deploy.fleet.Fleet`
    (``shuffledp clients run --seed``, ``shuffledp up --seed``) both use it, so with the same seed
    and data they draw the same reports as each other and as the fast engine."""

    def draw(spec: RoundSpec, local_data: np.ndarray) -> np.ndarray:
        return draw_round(RoundPlan(spec.params, spec.epsilon0, spec.delta0), local_data, seed, spec.round_id)

    return draw


def fast_round(plan: RoundPlan, local_data: np.ndarray, seed: int, round_index: int, progress: Progress | None = None) -> np.ndarray:
    """Every user's reports for one round, as the shuffler would forward them (rows permuted)."""
    values = draw_round(plan, local_data, seed, round_index, progress)
    rows = values.reshape(-1, values.shape[-1])
    permutation = np.random.default_rng(np.random.SeedSequence([seed, 0x5F, round_index])).permutation(len(rows))
    return rows[permutation]


def streamed_round(plan: RoundPlan, local_data: Any, seed: int, round_index: int, progress: Progress | None = None) -> tuple[Collector, int]:
    """One round folded block by block into the plan's collector: ``(collector, reports)``.
    The reports of :func:`draw_round`, never all held at once (no permutation: a collector's
    statistics do not depend on the order)."""
    if plan.collect is None:
        raise InvalidParameter("plan", "a streamed round needs the plan's collector")
    collector = plan.collect()
    count = 0
    for values in draw_blocks(plan, local_data, seed, round_index, progress):
        rows = values.reshape(-1, values.shape[-1])
        collector.add_rows(rows)
        count += len(rows)
    return collector, count


def run_fast(
    protocol: Protocol, local_data: Any, seed: int = 0, progress: Progress | None = None, *, stream: bool | None = None
) -> EngineRun:
    """Run ``protocol`` on the vectorized engine.

    ``local_data``: an ``(n,)`` or ``(n, d)`` array, or :class:`GeneratedUsers` (made block by
    block, never held whole). ``stream``: fold the rounds whose plan names a collector block by
    block instead of holding their reports (``None``: when the users span more than one draw
    block, or come as ``GeneratedUsers``). The result is the same either way."""
    data = _check_data(protocol, local_data, materialize=False)
    if stream is None:
        stream = isinstance(data, GeneratedUsers) or data.shape[0] > draw_block_users(_width(data))
    runs: list[RoundRun] = []

    def execute(plan: RoundPlan) -> Any:
        index = len(runs)
        answer: Collector | np.ndarray
        if stream and plan.collect is not None:
            answer, count = streamed_round(plan, data, seed, index, progress)
        else:
            answer = fast_round(plan, data, seed, index, progress)
            count = len(answer)
        runs.append(RoundRun(plan, count, count, count * _envelope_bytes(plan, index)))
        return answer

    return EngineRun(drive(protocol, execute), runs, "fast", "none (vectorized)")


def _envelope_bytes(plan: RoundPlan, round_id: int) -> int:
    """Size of every envelope of the round (``protocol/wire/wire_size.py``)."""
    from shuffledp.protocol.wire.wire_size import envelope_bytes

    return envelope_bytes(plan.params.MECHANISM, round_id)


async def run_messages_on(
    protocol: Protocol,
    local_data: np.ndarray,
    channels: tuple,
    seed: int = 0,
    progress: Progress | None = None,
    round_timeout: float = 3600.0,
    workers: int | None = None,
) -> EngineRun:
    """Run ``protocol`` on the message engine over ``(coordinator, shuffler, clients)`` channels.

    ``workers`` (:func:`~shuffledp.simulation.worker_parent.message_workers`; ``None``: all CPUs for a large run, else 1): with more
    than one, the simulated devices seal blocks of users on that many worker processes
    (:class:`~shuffledp.simulation.client_pool.SealingWorkers`), and the shuffler's outer opens and
    the analyzer's inner opens of large bursts run on as many (their key workers). What each party
    decides stays in its own object in this process; the result is the same as with one process
    for a seed (the users' reports are drawn here, before any sealing). The workers import the
    main module again, as any multiprocessing child does: a script keeps its top level under
    ``if __name__ == "__main__":`` or passes ``workers=1``."""
    from shuffledp.simulation.worker_parent import message_workers, start_worker_parent

    data = _check_data(protocol, local_data)
    workers = message_workers(len(data), workers)
    if workers > 1:
        start_worker_parent()  # the worker processes' parent starts now, while the parties are set up
    with _collecting_rarely():  # while the parties are set up and run
        return await _run_parties(protocol, data, channels, seed, progress, round_timeout, workers)


async def _run_parties(protocol: Protocol, data: np.ndarray, channels: tuple, seed: int, progress: Progress | None,
                       round_timeout: float, workers: int) -> EngineRun:
    """:func:`run_messages_on`'s parties, set up and run (``data`` checked, ``workers`` decided)."""
    from shuffledp.simulation.client_pool import IN_PROCESS_WINDOW, ClientPool, SealingWorkers
    from shuffledp.analyzer.coordinator import NO_LIVENESS_MARGIN
    from shuffledp.deploy.deployment import Deployment
    from shuffledp.protocol.transport.channel import InProcessChannel, reports_topic
    from shuffledp.shuffler.memory_spool import MemorySpool

    coordinator_channel, shuffler_channel, pool_channel = channels
    deployment = Deployment()
    on_open = (lambda k: progress("opened reports", k)) if progress else None
    analyzer = deployment.analyzer(workers=workers)
    # Every credential here is an honest simulated client: no liveness margin (NO_LIVENESS_MARGIN), so every
    # round waits for, and is accounted at, every user's messages, as the fast engine's rounds are.
    coordinator = deployment.coordinator(coordinator_channel, analyzer=analyzer, round_timeout=round_timeout,
                                         on_progress=on_open, batch_margin=NO_LIVENESS_MARGIN)
    epsilon, delta = protocol.budget
    central = {"accept_central_only": True, "shuffler_signing_key": deployment.shuffler_keys.signing_public,
               "shuffler_key": deployment.shuffler_keys.hpke_public}
    clients = deployment.clients(data, PrivacyLedger.many(epsilon, delta, len(data)), **central)
    on_sealed = (lambda k: progress("sealed users", k)) if progress else None
    # Over a broker, an envelope without a receipt is sent again (a restarted broker drops
    # what it had not delivered); the in-process channel loses nothing, so nothing is.
    retry_interval = math.inf if isinstance(pool_channel, InProcessChannel) else 2.0
    sealing = SealingWorkers(workers) if workers > 1 else None
    # In process, a larger publishing window lets the shuffler take the sealed blocks in bursts of
    # thousands (its key workers then open each burst in a few large slices).
    window = IN_PROCESS_WINDOW if sealing is not None and isinstance(pool_channel, InProcessChannel) else 256
    pool = ClientPool(pool_channel, coordinator.session_id, clients, None, draw=seeded_draw(seed),
                      on_progress=on_sealed, retry_interval=retry_interval, sealing=sealing, window=window)
    # An in-process simulation has nothing to resume, so it skips the durable spool; the admission rules are the shuffler's and unchanged.
    shuffler = deployment.shuffler(shuffler_channel, workers=workers, spool=MemorySpool())
    if sealing is not None and shuffler.opener_pool is not None:  # workers > 1: every party's worker
        # processes start now, while the first round is announced
        for start in (sealing.start, analyzer.start_workers, shuffler.opener_pool.start):
            start()
    shuffler_task = asyncio.create_task(shuffler.serve())
    pool_task = asyncio.create_task(pool.serve(rounds=1 << 30))
    protocol_task = asyncio.create_task(coordinator.run_protocol(protocol, len(clients)))
    try:
        # The pool and the shuffler serve until cancelled: if either ends first, it failed; say why
        # at once rather than let the coordinator wait out the round's deadline.
        await asyncio.wait({protocol_task, pool_task, shuffler_task}, return_when=asyncio.FIRST_COMPLETED)
        for party, task in (("client pool", pool_task), ("shuffler", shuffler_task)):
            if task.done() and not protocol_task.done():
                protocol_task.cancel()
                task.result()
                raise RuntimeError(f"the {party} stopped serving rounds")  # pragma: no cover - it serves until cancelled
        result, records = protocol_task.result()
    finally:
        protocol_task.cancel()
        shuffler_task.cancel()
        pool_task.cancel()
        await asyncio.gather(shuffler_task, pool_task, protocol_task, return_exceptions=True)
        await coordinator.close()
        shuffler.close()
        analyzer.close()
        if sealing is not None:
            sealing.close()
    runs = []
    for record in records:
        spec = record.spec
        stats = shuffler.rounds[spec.round_id]
        sent = pool.rounds[spec.round_id]
        topic = reports_topic(spec.session_id, spec.round_id)
        # Every envelope of a round has one size: the bytes of the users' envelopes, each
        # once, are the first transmissions at the size measured on the wire (a message may
        # carry several envelopes; each copy sent again for want of a receipt went alone).
        copies_on_wire = sent.sent + sent.retransmitted
        wire_bytes = pool_channel.bytes_by_topic.get(topic, 0)
        envelope_bytes = wire_bytes // copies_on_wire * sent.sent if copies_on_wire else 0
        runs.append(
            RoundRun(
                RoundPlan(spec.params, spec.epsilon0, spec.delta0),
                record.opened.size,
                stats.forwarded,
                envelope_bytes,
                record.batch_bytes,
                record.batch_sizes,
                dict(stats.rejected),
                dict(record.opened.rejected),
                sent.retransmitted,
            )
        )
    return EngineRun(result, runs, "messages")


@contextlib.contextmanager
def _collecting_rarely() -> Iterator[None]:
    """CPython's cyclic garbage collector, set for a run of many simulated parties while the block runs.

    The parties of a message-engine run hold hundreds of thousands of long-lived objects (clients,
    ledgers, what was sent, envelopes awaiting receipts) and make few reference cycles, yet each
    full collection scans them all: the default run made several full collections while setting
    its parties up and running the protocol, none of which found garbage, at about a quarter of a
    second in all. So the objects that exist when the block starts are frozen (:func:`gc.freeze`:
    never scanned), the youngest generation is collected every 100,000 allocations instead of
    700 and the older ones rarely; cycles are still collected, so memory stays bounded. On exit the
    thresholds are restored and the objects unfrozen, to be collected as usual."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def run_messages(
    protocol: Protocol, local_data: np.ndarray, seed: int = 0, broker: str | None = None, progress: Progress | None = None,
    workers: int | None = None,
) -> EngineRun:
    """Run ``protocol`` on the message engine, in-process or over the MQTT ``broker``; ``workers``:
    processes to seal and open on (:func:`~shuffledp.simulation.worker_parent.message_workers`; the result is the
    same for a seed)."""
    from shuffledp.simulation import party_channels

    async def main() -> EngineRun:
        async with party_channels(broker) as channels:
            run = await run_messages_on(protocol, local_data, channels, seed, progress, workers=workers)
        run.transport = f"mqtt {broker}" if broker else "in-process"
        return run

    return asyncio.run(main())


ENGINES = {"fast": run_fast, "messages": run_messages}


def describe_engine(engine: str, transport: str = "") -> str:
    """How a result names the engine that made it: ``fast engine (vectorized, no messages)``, or
    ``messages engine (in-process)`` / ``messages engine (mqtt HOST)`` (``transport``: :attr:`EngineRun.transport`)."""
    if engine == "fast":
        return "fast engine (vectorized, no messages)"
    return f"{engine} engine ({transport})" if transport else f"{engine} engine"
