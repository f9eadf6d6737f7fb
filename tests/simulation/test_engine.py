"""The two engines run any protocol and give the same output distribution.

Under one seed, a round's reports are drawn by the same function from the same seed
on both engines, so the analyzer sees the *same multiset* of reports (in another
order): the strongest form of "same distribution" there is. These tests check it
for every protocol the engine runs, through real clients, sealing, the shuffler and
the analyzer.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from parties import Recording

from shuffledp.analyzer.protocols import Protocol, RoundPlan, drive
from shuffledp.analyzer.scalar_mean import ScalarMeanConfig, ScalarMeanProtocol
from shuffledp.analyzer.summation import SummationProtocol
from shuffledp.analyzer.vector_mean import VectorMeanConfig, VectorMeanProtocol
from shuffledp.simulation.engine import run_fast, run_messages, run_messages_on
from shuffledp.protocol.transport.channel import InProcessChannel
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.wire.messages import HadamardRangeParams
from shuffledp.protocol.mechanisms.summation_params import choose_scalar_sum, choose_vector_sum




def _protocols():
    n = 150
    rng = np.random.default_rng(3)
    scalar = rng.normal(1.0, 1.0, n)
    vectors = rng.normal(0.1, 0.3, (n, 3))
    mean = ScalarMeanProtocol(ScalarMeanConfig(bound=8.0, tau=2.0, epsilon0=2.0, grid_levels=256))
    total = SummationProtocol(choose_scalar_sum(n, 1.0, 1e-6, -2.0, 4.0).params, 1.0, 1e-6)
    vector = SummationProtocol(choose_vector_sum(n, 1.0, 1e-6, 3, 1.0, rotation_seed=8).params, 1.0, 1e-6)
    vector_mean = VectorMeanProtocol(VectorMeanConfig(3, rotated_bound=2.0, rotated_tau=0.4, epsilon0=4.0, rotation_seed=2**64 - 5))
    paper = VectorMeanProtocol(VectorMeanConfig(3, rotated_bound=2.0, rotated_tau=0.4, epsilon0=8.0, mode="paper", rotation_seed=3))
    # tau' >= bound: one bin, so the range round is skipped and the mean round runs alone.
    one_bin = VectorMeanProtocol(VectorMeanConfig(3, rotated_bound=2.0, rotated_tau=5.0, epsilon0=4.0, rotation_seed=4))
    return [
        ("mean", mean, scalar),
        ("sum", total, scalar),
        ("vector-sum", vector, vectors),
        ("vector-mean", vector_mean, vectors),
        ("vector-mean-paper", paper, vectors),
        ("vector-mean-one-bin", one_bin, vectors),
    ]


def _every_protocol():
    """Every protocol the engines run (``analyzer/*``: ``Protocol`` subclasses), at a small size:
    the scalar mean (plain and robust), summation (scalar, vector), the vector mean (sampled,
    paper, one bin, and on categorical users: distribution estimation), the instance-optimal
    mean (shuffle and local model)."""
    from shuffledp.analyzer.instance_optimal import InstanceOptimalConfig, InstanceOptimalProtocol
    from shuffledp.analyzer.instance_optimal_budget import round_budgets
    from shuffledp.analyzer.robust import RobustOptions
    from shuffledp.simulation.vector_population import VectorPopulation
    from shuffledp.simulation.vector import VectorSimulationConfig

    cases = _protocols()
    name, mean, scalar = cases[0]
    cases.append(("mean-robust", ScalarMeanProtocol(mean.config, robust=RobustOptions()), scalar))
    population = VectorPopulation("categorical", 5, 40)
    distribution = VectorSimulationConfig(population, 150, 4.0, seed=6)
    cases.append(("distribution", VectorMeanProtocol(distribution.protocol_config()), np.asarray(population.users(150, 6))))
    vectors = cases[2][2] * 3.0
    for model in ("shuffle", "local"):
        config = InstanceOptimalConfig(dim=3, users=150, radius=10.0, epsilon=4.0, delta=1e-6, model=model, leaves=64, rotation_seed=21)
        cases.append((f"instance-optimal-{model}", InstanceOptimalProtocol(config, round_budgets(config)), vectors))
    return cases


@pytest.fixture(scope="module")
def message_runs():
    """One message-engine run per protocol, shared by the tests that check different things of it:
    ``runs(name, protocol, data)`` is ``(run, recording)`` of ``run_messages`` at seed 13 with draw
    blocks of 64 users (150 users: three blocks), ``recording`` holding each round's opened reports."""
    import shuffledp.simulation.engine as engine

    done: dict[str, tuple] = {}

    def runs(name, protocol, data):
        if name not in done:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(engine, "FAST_BLOCK", 64)
                recording = Recording(protocol)
                done[name] = (run_messages(recording, data, seed=13), recording)
        return done[name]

    return runs


@pytest.mark.parametrize("name,protocol,data", _protocols(), ids=lambda v: v if isinstance(v, str) else "")
def test_fast_and_message_engines_see_the_same_reports(name, protocol, data, message_runs, monkeypatch):
    import shuffledp.simulation.engine as engine

    message_run, messages = message_runs(name, protocol, data)
    monkeypatch.setattr(engine, "FAST_BLOCK", 64)  # as the shared message run draws
    fast = Recording(protocol)
    fast_run = run_fast(fast, data, seed=13, stream=False)
    assert len(fast.seen) == len(messages.seen) >= 1
    for a, b in zip(fast.seen, messages.seen):
        np.testing.assert_array_equal(a, b)
    _assert_same_result(fast_run.result, message_run.result)
    for f, m in zip(fast_run.rounds, message_run.rounds):
        assert (f.reports, f.messages, f.envelope_bytes) == (m.reports, m.messages, m.envelope_bytes)
        assert m.rejected_at_shuffler == {} and m.rejected_at_analyzer == {}


def _assert_same_result(a, b) -> None:
    """Equal results; floats to 1e-12 relative (the analyzer sums the same reports in another order)."""
    import dataclasses

    assert type(a) is type(b)
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            _assert_same_result(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, (float, np.ndarray)) and np.asarray(a).dtype.kind == "f":
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=0)
    else:
        assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b


def test_fast_engine_output_is_permuted():
    """The fast engine stands in for the shuffler: the rows do not come in user order."""
    data = np.arange(200, dtype=float) / 200.0
    plan = RoundPlan(HadamardRangeParams(0.0, 1.0, 0.001), 30.0)  # nearly deterministic rows
    from shuffledp.simulation.engine import fast_round

    rows = fast_round(plan, data, seed=1, round_index=0)
    kept = fast_round(plan, data, seed=1, round_index=0)
    np.testing.assert_array_equal(rows, kept)  # seeded
    assert not np.array_equal(rows[:, 0], np.sort(rows[:, 0]))


def test_a_shuffler_failure_surfaces_instead_of_waiting_for_the_deadline(monkeypatch):
    """If the shuffler's service stops (a bug in admission), the engine raises it at once, not after the round's hour."""
    import shuffledp.shuffler.service as shuffler_service

    def broken(self, opened_items):
        raise RuntimeError("admission bug")

    monkeypatch.setattr(shuffler_service.RoundAdmission, "_admit_opened", broken)
    channel = InProcessChannel()
    protocol = _protocols()[1][1]
    with pytest.raises(RuntimeError, match="admission bug"):
        asyncio.run(asyncio.wait_for(run_messages_on(protocol, np.zeros(150), (channel,) * 3, round_timeout=3600), 60))


def test_engines_refuse_data_of_the_wrong_shape():
    name, vector, _ = _protocols()[2]
    with pytest.raises(InvalidParameter, match="local_data"):
        run_fast(vector, np.zeros(10))
    with pytest.raises(InvalidParameter, match="local_data"):
        run_fast(_protocols()[0][1], np.zeros((10, 2)))


def test_a_client_failure_surfaces_instead_of_waiting_for_the_deadline(monkeypatch):
    """If the clients cannot answer (a bug in the pool), the engine raises it at once, not after the round's hour."""
    import shuffledp.simulation.engine as engine

    def broken(*args, **kwargs):
        raise RuntimeError("randomizer bug")

    monkeypatch.setattr(engine, "randomize_round", broken)  # what the clients' draw calls
    channel = InProcessChannel()
    protocol = _protocols()[1][1]
    with pytest.raises(RuntimeError, match="randomizer bug"):
        asyncio.run(asyncio.wait_for(run_messages_on(protocol, np.zeros(150), (channel,) * 3, round_timeout=3600), 60))


def test_drive_sends_each_round_its_reports():
    seen = []

    class TwoRounds(Protocol):
        name = "two"

        @property
        def budget(self):
            return 1.0, 0.0

        def rounds(self):
            first = yield RoundPlan(HadamardRangeParams(0.0, 1.0, 0.1), 0.5)
            second = yield RoundPlan(HadamardRangeParams(0.0, 1.0, 0.2), 0.5)
            return first.sum() + second.sum()

    def execute(plan):
        seen.append(plan.params.tau)
        return np.full((2, 2), len(seen))

    assert drive(TwoRounds(), execute) == 4 * 1 + 4 * 2
    assert seen == [0.1, 0.2]


def test_engines_agree_when_users_span_several_blocks(monkeypatch):
    """Both engines draw block by block from the same seeds, so the reports agree at any n."""
    import shuffledp.simulation.engine as engine

    monkeypatch.setattr(engine, "FAST_BLOCK", 64)  # 150 users: three blocks
    name, protocol, data = _protocols()[1]
    fast, messages = Recording(protocol), Recording(protocol)
    run_fast(fast, data, seed=5, stream=False)  # held: the protocol sees the rows, which are compared
    run_messages(messages, data, seed=5)
    np.testing.assert_array_equal(fast.seen[0], messages.seen[0])


def _assert_identical(a, b) -> None:
    """Bit-for-bit equal results (every decoder sums exactly: integers, or correctly rounded)."""
    import dataclasses

    assert type(a) is type(b)
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            _assert_identical(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_identical(x, y)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _assert_identical(a[key], b[key])
    else:
        assert a == b


@pytest.fixture(scope="module")
def every_protocol():
    return _every_protocol()


@pytest.mark.parametrize("index", range(10), ids=[
    "mean", "sum", "vector-sum", "vector-mean", "vector-mean-paper", "vector-mean-one-bin",
    "mean-robust", "distribution", "instance-optimal-shuffle", "instance-optimal-local",
])
def test_every_protocol_gives_one_result_on_both_engines_streamed_or_held(index, every_protocol, message_runs, monkeypatch):
    """One seed, one result: the message engine (real clients, sealing, shuffler, analyzer), the
    fast engine holding each round's reports, and the fast engine streaming them block by block
    into the analyzer's collectors (150 users in three draw blocks) give the same result, bit for bit."""
    import shuffledp.simulation.engine as engine

    name, protocol, data = every_protocol[index]
    monkeypatch.setattr(engine, "FAST_BLOCK", 64)
    streamed = run_fast(protocol, data, seed=13, stream=True)
    held = run_fast(protocol, data, seed=13, stream=False)
    messages, _ = message_runs(name, protocol, data)
    _assert_identical(streamed.result, held.result)
    _assert_identical(streamed.result, messages.result)
    for s, h, m in zip(streamed.rounds, held.rounds, messages.rounds):
        assert (s.reports, s.messages, s.envelope_bytes) == (h.reports, h.messages, h.envelope_bytes) == (m.reports, m.messages, m.envelope_bytes)
    assert len(streamed.rounds) == len(messages.rounds)


def test_every_protocol_of_the_engines_is_in_the_list(every_protocol):
    """The list above covers every ``Protocol`` the analyzer defines."""
    import inspect
    import pkgutil
    import importlib

    import shuffledp.analyzer as analyzer

    defined = set()
    for module in pkgutil.iter_modules(analyzer.__path__):
        for _, cls in inspect.getmembers(importlib.import_module(f"shuffledp.analyzer.{module.name}"), inspect.isclass):
            if issubclass(cls, Protocol) and cls is not Protocol and cls.__module__.startswith("shuffledp.analyzer"):
                defined.add(cls)
    assert defined == {type(protocol) for _, protocol, _ in every_protocol}
    assert len(every_protocol) == 10


def test_the_vector_mean_streams_in_bounded_memory(monkeypatch):
    """Streaming, the engine never holds a round's reports: the collector sees one draw block at a time."""
    import shuffledp.simulation.engine as engine
    from shuffledp.analyzer.vector_mean import VectorMeanAccumulator, VectorRangeAccumulator
    from shuffledp.simulation.vector_population import VectorPopulation

    monkeypatch.setattr(engine, "FAST_BLOCK", 64)
    largest = []
    for cls in (VectorRangeAccumulator, VectorMeanAccumulator):
        original = cls.add_rows

        def spy(self, rows, original=original):
            largest.append(len(rows))
            original(self, rows)

        monkeypatch.setattr(cls, "add_rows", spy)
    name, protocol, _ = _protocols()[3]
    users = VectorPopulation("gaussian", 3, 5).users(1000, 2)  # made block by block, never held
    run = run_fast(protocol, users, seed=1)
    assert [r.reports for r in run.rounds] == [1000, 1000]
    assert max(largest) == 64 and len(largest) == 2 * 16


@pytest.mark.parametrize("index", [0, 2], ids=["mean", "vector-sum"])
def test_the_multi_process_message_engine_gives_the_single_process_result(index, monkeypatch):
    """One seed, one result whatever the processes: devices sealing in worker processes (blocks of
    16 users), the shuffler's outer opens and the analyzer's inner opens on their key workers
    (thresholds lowered so the 150 users' bursts and batches do go there) give the same reports,
    bit-identical results and the same per-round counts as the single-process run; every envelope is
    still admitted by the shuffler (none refused) and opened by the analyzer."""
    import shuffledp.analyzer.service as analyzer_service
    import shuffledp.shuffler.service as shuffler_service
    import shuffledp.simulation.client_pool as client_pool
    from shuffledp.shuffler.parallel_open import OuterLayerPool

    class EveryBurst(OuterLayerPool):
        def __init__(self, private, workers, *, threshold=1):
            super().__init__(private, workers, threshold=1)

    name, protocol, data = _protocols()[index]
    one, many = Recording(protocol), Recording(protocol)
    single = run_messages(one, data, seed=17, workers=1)
    monkeypatch.setattr(client_pool, "SEAL_BLOCK", 16)
    monkeypatch.setattr(shuffler_service, "OuterLayerPool", EveryBurst)
    monkeypatch.setattr(analyzer_service, "PARALLEL_THRESHOLD", 1)
    opened_elsewhere = []
    real_open_many = EveryBurst.open_many_async

    async def counted_open_many(self, spec, items):
        opened_elsewhere.append(len(items))
        return await real_open_many(self, spec, items)

    monkeypatch.setattr(EveryBurst, "open_many_async", counted_open_many)
    sealed_elsewhere = []
    real_submit = client_pool.SealingWorkers.submit
    monkeypatch.setattr(client_pool.SealingWorkers, "submit",
                        lambda self, spec, credentials, messages: sealed_elsewhere.append(len(credentials)) or real_submit(self, spec, credentials, messages))
    multi = run_messages(many, data, seed=17, workers=2)
    assert sum(sealed_elsewhere) == len(data) * len(multi.rounds) and max(sealed_elsewhere) == 16
    assert sum(opened_elsewhere) == sum(r.messages for r in multi.rounds)
    assert len(one.seen) == len(many.seen) >= 1
    for a, b in zip(one.seen, many.seen):
        np.testing.assert_array_equal(a, b)
    _assert_identical(single.result, multi.result)
    for s, m in zip(single.rounds, multi.rounds):
        assert (s.reports, s.messages, s.envelope_bytes) == (m.reports, m.messages, m.envelope_bytes)
        assert m.rejected_at_shuffler == {} and m.rejected_at_analyzer == {} and m.retransmitted == 0


def test_the_message_engine_restores_the_garbage_collector(monkeypatch):
    """The collector is set for many long-lived parties while a run lasts (engine.py::_collecting_rarely),
    and put back as it was afterwards: the same thresholds, nothing left frozen."""
    import gc

    import shuffledp.simulation.engine as engine_module

    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    seen = []
    real = engine_module._run_parties

    async def spy(*args, **kwargs):
        seen.append((gc.get_threshold(), gc.get_freeze_count()))
        return await real(*args, **kwargs)

    monkeypatch.setattr(engine_module, "_run_parties", spy)
    run_messages(ScalarMeanProtocol(ScalarMeanConfig(bound=8.0, tau=2.0, epsilon0=2.0)), np.linspace(-1, 1, 40), seed=3, workers=1)
    assert seen and seen[0][0][0] == 100_000 and seen[0][1] > frozen  # set for the run
    assert gc.get_threshold() == before and gc.get_freeze_count() == frozen  # and restored


def test_sealing_blocks_taper_to_the_round_end():
    """Full blocks while much of the round remains, then smaller ones, never below the shuffler's
    smallest burst opened on its workers: the last block (one worker seals it while the others
    wait) is small, and its envelopes still open on the shuffler's workers."""
    from shuffledp.shuffler.parallel_open import WORKER_BURST
    from shuffledp.simulation.client_pool import SEAL_BLOCK, seal_block_users

    assert WORKER_BURST == SEAL_BLOCK // 4 == 256

    for workers in (2, 3, 8):
        remaining, sizes = 20_000, []
        while remaining > 0:
            size = seal_block_users(remaining, workers)
            assert WORKER_BURST <= size <= SEAL_BLOCK
            sizes.append(min(size, remaining))
            remaining -= sizes[-1]
        assert sizes[0] == SEAL_BLOCK and sizes == sorted(sizes, reverse=True)
        assert sizes[-1] <= WORKER_BURST
