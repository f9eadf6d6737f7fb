"""The fast engine on a Dask cluster gives the local engine's result to the last bit.

Round ``r``'s reports for draw block ``b`` come from the seed ``(seed, 0x5EED, r, b)`` wherever
the block runs, and the analyzer's statistics are exact sums, so for every protocol the fast
engine runs, the result on a cluster of 1, 2 or 4 workers, under any assignment of blocks to
workers, and after a worker process is killed mid-round, equals the local engine's exactly
(no tolerance). Sizes are small but every case spans several draw blocks.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")

from shuffledp.analyzer.instance_optimal import InstanceOptimalConfig, InstanceOptimalProtocol  # noqa: E402
from shuffledp.analyzer.instance_optimal_budget import round_budgets  # noqa: E402
from shuffledp.analyzer.protocols import collected  # noqa: E402
from shuffledp.analyzer.robust import RobustOptions  # noqa: E402
from shuffledp.analyzer.scalar_mean import GridValueCollector, HadamardRangeCollector, ScalarMeanProtocol, estimate_mean  # noqa: E402
from shuffledp.analyzer.summation import SummationProtocol  # noqa: E402
from shuffledp.analyzer.vector_mean import VectorMeanProtocol  # noqa: E402
from shuffledp.protocol.errors import InvalidParameter  # noqa: E402
from shuffledp.protocol.mechanisms.summation_params import choose_scalar_sum, choose_vector_sum  # noqa: E402
from shuffledp.simulation import SimulationConfig  # noqa: E402
from shuffledp.simulation.dask_engine import dask_client, private_cluster, run_dask  # noqa: E402
from shuffledp.simulation.engine import draw_block_users, fast_round, run_fast  # noqa: E402
from shuffledp.simulation.population import GeneratedUsers, Population, user_blocks  # noqa: E402
from shuffledp.simulation.vector import VectorSimulationConfig  # noqa: E402
from shuffledp.simulation.vector_population import VectorPopulation  # noqa: E402

SEED = 17
POPULATION = Population("gaussian", 1.7, 1.0, 20.0, 4)


def scalar_users(n: int, make=None) -> GeneratedUsers:
    """The scalar simulation's users (``local_means``' blocks and values), made block by block."""
    return GeneratedUsers(user_blocks(POPULATION, n, SEED), (), make or _scalar_means)


def _scalar_means(count: int, seed: np.random.SeedSequence) -> np.ndarray:
    return POPULATION.samples(np.random.default_rng(seed), count).mean(axis=1)


def _cases():
    """Every protocol the fast engine runs, on data spanning at least two draw blocks."""
    scalar_n = draw_block_users(1) + 5_000
    scalar_mean = ScalarMeanProtocol(SimulationConfig(POPULATION, scalar_n, 1.0, seed=SEED).protocol_config())
    gaussian = VectorPopulation("gaussian", 256, 1)  # 4096 users per draw block
    vector = VectorSimulationConfig(gaussian, 9_000, 2.0, seed=SEED)
    categorical = VectorPopulation("categorical", 256, 20)
    distribution = VectorSimulationConfig(categorical, 9_000, 2.0, seed=SEED)
    small = VectorPopulation("gaussian", 8, 1)
    small_vectors = small.block_local_means(small.blocks(3_000, SEED))[0]
    many_vectors = small.block_local_means(small.blocks(scalar_n, SEED))[0]  # 65536 users per draw block
    cases = [
        ("mean", scalar_mean, scalar_users(scalar_n)),
        ("mean-robust", ScalarMeanProtocol(scalar_mean.config, robust=RobustOptions()), scalar_users(scalar_n)),
        ("sum", SummationProtocol(choose_scalar_sum(scalar_n, 1.0, 1e-6, -20.0, 20.0).params, 1.0, 1e-6), scalar_users(scalar_n)),
        ("vector-sum", SummationProtocol(choose_vector_sum(3_000, 2.0, 1e-6, 8, 4.0, rotation_seed=8).params, 2.0, 1e-6), small_vectors),
        ("vector-mean", VectorMeanProtocol(vector.protocol_config()), gaussian.users(9_000, SEED)),
        ("distribution", VectorMeanProtocol(distribution.protocol_config()), categorical.users(9_000, SEED)),
    ]
    for model, dim, users in (("shuffle", 8, small_vectors), ("local", 8, many_vectors)):
        config = InstanceOptimalConfig(dim=dim, users=len(users), radius=4.0 * dim**0.5, epsilon=4.0, delta=1e-6, model=model,
                                       leaves=64, rotation_seed=21)
        cases.append((f"instance-optimal-{model}", InstanceOptimalProtocol(config, round_budgets(config)), users))
    return cases


CASES = _cases()


def assert_identical(a, b, where: str = "result") -> None:
    """``a == b`` exactly: same types, same floats to the last bit, same arrays (dtype and values)."""
    assert type(a) is type(b), where
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_identical(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), where
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_identical(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, float) and a != a:
        assert b != b, where
    else:
        assert a == b, where


@pytest.fixture(scope="module")
def local_runs():
    return {name: run_fast(protocol, data, SEED) for name, protocol, data in CASES}


@pytest.fixture(scope="module")
def processes():
    """Two worker processes (one thread each): tasks cross a process boundary, and one can be killed.
    The cluster ``--dask-workers 2`` starts (mutual TLS, loopback: ``test_dask_security.py``)."""
    with dask_client(workers=2) as client:
        yield client


@pytest.fixture(scope="module", params=[1, 4], ids=lambda k: f"{k}-thread-workers")
def threads(request):
    with private_cluster(request.param, processes=False) as cluster, distributed.Client(cluster) as client:
        yield client


#: One draw block only: a vector sum's users send ``M`` shares per coordinate, so a run over two
#: draw blocks (``>= 2^20`` values) would send ``>= 2^20 M`` rows, too many for a quick test. The
#: merge of summation collectors spans two blocks in the scalar sum, the gather path of rounds
#: without a collector in ``instance-optimal-local``.
ONE_BLOCK = {"vector-sum", "instance-optimal-shuffle"}


def test_the_cases_span_several_draw_blocks():
    """Otherwise the merge of blocks' collectors (the point of the engine) would go untested."""
    for name, _, data in CASES:
        width = 1 if data.ndim == 1 else data.shape[1]
        assert (data.shape[0] > draw_block_users(width)) == (name not in ONE_BLOCK), name


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_two_worker_processes_give_the_local_result_bit_for_bit(processes, local_runs, name):
    _, protocol, data = next(c for c in CASES if c[0] == name)
    steps: list[tuple[str, int]] = []
    run = run_dask(protocol, data, processes, SEED, lambda stage, k: steps.append((stage, k)))
    local = local_runs[name]
    assert_identical(run.result, local.result)
    assert [(r.reports, r.messages, r.envelope_bytes) for r in run.rounds] == [
        (r.reports, r.messages, r.envelope_bytes) for r in local.rounds
    ]
    # Progress: every round named once with 0, then every user counted once per round.
    assert sum(k for _, k in steps) == data.shape[0] * len(run.rounds)
    assert [s for s, k in steps if k == 0] == [f"round {i} ({r.plan.params.MECHANISM})" for i, r in enumerate(run.rounds)]


@pytest.mark.parametrize("name", ["mean", "vector-mean", "instance-optimal-shuffle"])
def test_one_and_four_workers_and_a_shuffled_placement_give_the_local_result(threads, local_runs, name):
    """Blocks pinned to workers in a seeded random order: another assignment, another merge order."""
    _, protocol, data = next(c for c in CASES if c[0] == name)
    addresses = sorted(threads.scheduler_info()["workers"])
    rng = np.random.default_rng(5)
    chosen: list[str] = []

    def placement(round_index: int, block: int) -> list[str]:
        chosen.append(addresses[int(rng.integers(len(addresses)))])
        return [chosen[-1]]

    assert_identical(run_dask(protocol, data, threads, SEED, placement=placement).result, local_runs[name].result)
    if len(addresses) > 1:
        assert len(set(chosen)) > 1


@pytest.mark.parametrize("name", ["vector-mean", "sum", "instance-optimal-local"])
def test_tasks_of_several_draw_blocks_give_the_local_result(processes, local_runs, name):
    """Two draw blocks per task (a collector filled by two blocks; rows joined in block order)."""
    _, protocol, data = next(c for c in CASES if c[0] == name)
    assert_identical(run_dask(protocol, data, processes, SEED, blocks_per_task=2).result, local_runs[name].result)


def test_collectors_merge_in_any_order_and_grouping_to_the_same_bits():
    """The reduction: statistics folded block by block and merged in a random order and grouping
    equal one collector fed every report, and decode exactly as the arrays' decoder does."""
    _, protocol, data = CASES[0]
    rounds = protocol.rounds()
    plan = next(rounds)
    first = fast_round(plan, data, SEED, 0)
    whole = collected(plan, first)
    rng = np.random.default_rng(1)
    parts = np.array_split(first[rng.permutation(len(first))], 7)
    pieces = []
    for part in parts:
        piece = plan.collect()
        piece.add_rows(part)
        pieces.append(piece)
    order = rng.permutation(len(pieces))
    left = pieces[order[0]].merge(pieces[order[1]]).merge(pieces[order[2]])
    right = pieces[order[3]]
    for i in order[4:]:
        right = pieces[i].merge(right)
    merged = left.merge(right)
    assert isinstance(merged, HadamardRangeCollector) and len(merged) == len(first)
    assert_identical(merged.estimate(), whole.estimate())
    found = whole.estimate()
    mean_plan = rounds.send(first)
    second = fast_round(mean_plan, data, SEED, 1)[:, 0]
    grid = GridValueCollector(mean_plan.params)
    for part in np.array_split(second, 5)[::-1]:
        other = GridValueCollector(mean_plan.params)
        other.add_rows(part[:, None])
        grid.merge(other)
    assert_identical(grid.estimate(), estimate_mean(second, mean_plan.params))
    assert found.lower < found.upper
    with pytest.raises(InvalidParameter, match="merge"):
        grid.merge(merged)


def _killing_make(marker_dir: str, parent: int):
    """A maker of the scalar users that, in a worker process, kills that process the first time it
    makes population block 1 (a marker file records that it did)."""

    def make(count: int, seed: np.random.SeedSequence) -> np.ndarray:
        marker = Path(marker_dir) / f"killed-{'-'.join(map(str, seed.spawn_key))}"
        if os.getpid() != parent and seed.spawn_key == (1,) and not marker.exists():
            marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return _scalar_means(count, seed)

    return make


def test_a_worker_killed_mid_round_is_replaced_and_the_result_is_unchanged(processes, local_runs, tmp_path):
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        name, protocol, data = CASES[0]
        users = scalar_users(data.shape[0], _killing_make(str(tmp_path), os.getpid()))
        run = run_dask(protocol, users, processes, SEED)
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    killed = list(tmp_path.glob("killed-*"))
    assert len(killed) == 1 and int(killed[0].read_text()) != os.getpid()  # a worker process died
    assert_identical(run.result, local_runs[name].result)


def test_bad_input_is_refused_with_typed_errors(processes):
    _, protocol, data = CASES[0]
    with pytest.raises(InvalidParameter, match="client"):
        run_dask(protocol, data, object(), SEED)
    with pytest.raises(InvalidParameter, match="local_data"):
        run_dask(protocol, np.zeros((10, 2)), processes, SEED)
    with pytest.raises(InvalidParameter, match="blocks_per_task"):
        run_dask(protocol, data, processes, SEED, blocks_per_task=0)
    with pytest.raises(InvalidParameter, match="not both"):
        with dask_client("tcp://127.0.0.1:1", 2):
            pass
    with pytest.raises(InvalidParameter, match="dask-workers"):
        with dask_client(None, 0):
            pass
    with dask_client() as none:
        assert none is None


def test_the_runners_take_a_client_and_give_the_same_result(processes, local_runs):
    """``run_vector_simulation(config, client=...)``: the library path of ``shuffledp vector --dask-*``
    (the same users and seed as the ``vector-mean`` case, so the same estimate as its local run)."""
    from shuffledp.simulation.vector import run_vector_simulation

    config = VectorSimulationConfig(VectorPopulation("gaussian", 256, 1), 9_000, 2.0, seed=SEED)
    remote = run_vector_simulation(config, client=processes)
    assert_identical(remote.estimate, local_runs["vector-mean"].result.estimate)
    with pytest.raises(InvalidParameter, match="fast engine"):
        run_vector_simulation(dataclasses.replace(config, path="messages"), client=processes)


def test_the_cli_refuses_a_cluster_for_the_message_engine_and_names_the_missing_extra(monkeypatch, capsys):
    from shuffledp.cli import main

    assert main(["simulate", "--messages", "-n", "100", "-q", "--dask-workers", "2"]) == 2
    assert "use --fast" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if dask were not installed
    assert main(["vector", "--fast", "-n", "100", "-d", "4", "-q", "--dask-workers", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "'dask' extras" in err and "[analysis,dask]'" in err, err


def test_blocks_per_task_keeps_eight_tasks_per_thread_up_to_32_blocks():
    from shuffledp.simulation.dask_engine import MAX_BLOCKS_PER_TASK, blocks_per_task

    assert blocks_per_task(3, 2) == 1  # fewer blocks than 8 tasks per thread: one block each
    assert blocks_per_task(160, 2) == 10
    assert blocks_per_task(10**6, 4) == MAX_BLOCKS_PER_TASK == 32


@pytest.mark.parametrize("name", ["sum", "vector-sum"])
def test_summation_collectors_merged_in_pieces_decode_as_the_arrays_decoder(name):
    from shuffledp.analyzer.summation import decode_scalar_sum, decode_vector_sum

    _, protocol, data = next(c for c in CASES if c[0] == name)
    plan = next(protocol.rounds())
    rows = fast_round(plan, data, SEED, 0)
    pieces = []
    for part in np.array_split(rows, 5):
        piece = plan.collect()
        piece.add_rows(part)
        pieces.append(piece)
    merged = pieces[3].merge(pieces[0]).merge(pieces[4].merge(pieces[2]).merge(pieces[1]))
    decode = decode_scalar_sum if name == "sum" else decode_vector_sum
    assert_identical(merged.estimate(), decode(rows, protocol.params))
