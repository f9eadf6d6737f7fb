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
    return [
        ("mean", mean, scalar),
        ("sum", total, scalar),
        ("vector-sum", vector, vectors),
        ("vector-mean", vector_mean, vectors),
        ("vector-mean-paper", paper, vectors),
    ]


@pytest.mark.parametrize("name,protocol,data", _protocols(), ids=lambda v: v if isinstance(v, str) else "")
def test_fast_and_message_engines_see_the_same_reports(name, protocol, data):
    fast, messages = Recording(protocol), Recording(protocol)
    fast_run = run_fast(fast, data, seed=11)
    message_run = run_messages(messages, data, seed=11)
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
    run_fast(fast, data, seed=5)
    run_messages(messages, data, seed=5)
    np.testing.assert_array_equal(fast.seen[0], messages.seen[0])
