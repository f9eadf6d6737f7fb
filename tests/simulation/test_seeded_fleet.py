"""What lets ``shuffledp up --seed`` reproduce ``shuffledp simulate --seed`` (the MQTT run itself:
``tests/mqtt/test_up_matches_simulate.py``), and what keeps unseeded devices on the OS CSPRNG.

* The scalar mean's decoder sums with correct rounding, so its estimate is a function of the
  multiset of reports: both engines give the same float, bit for bit.
* A seeded fleet draws exactly the reports of ``engine.draw_round`` (the engines' draws).
* Without ``--seed``, ``clients run`` and ``up`` seed nothing: every device draws its own
  report from its own source, the OS CSPRNG.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from shuffledp.analyzer.protocols import RoundPlan, drive
from shuffledp.analyzer.scalar_mean import ScalarMeanConfig, ScalarMeanProtocol
from shuffledp.cli import build_parser
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.deploy.deployment import Deployment
from shuffledp.analyzer.decoders import mean_from_reports
from shuffledp.simulation.engine import draw_round, seeded_draw
from shuffledp.deploy.fleet import Fleet
from shuffledp.simulation.population import Population, local_means
from shuffledp.protocol.transport.channel import InProcessChannel
from shuffledp.protocol.mechanisms.randomness import SeededSource, SystemSource
from shuffledp.simulation import SimulationConfig, run_simulation


def test_the_mean_decoder_ignores_the_order_of_its_values():
    """A plain float average moves in its last bits with the order of its terms; the decoder's
    correctly rounded sums do not (estimate and standard error alike)."""
    values = np.random.default_rng(1).normal(1.7, 40.0, 3001)
    orders = [np.random.default_rng(k).permutation(values) for k in range(60)]
    assert len({float(np.mean(v)) for v in orders}) > 1  # the order does reach a plain sum's last bits
    assert len({(e.estimate, e.standard_error) for e in map(mean_from_reports, orders)}) == 1


def test_the_scalar_mean_ignores_the_batch_order():
    """Whatever order the shuffler forwards the batch in, the protocol's estimate and standard
    error are the same floats."""
    config = ScalarMeanConfig(bound=20.0, tau=0.7, epsilon0=1.0)
    means, _ = local_means(Population("gaussian", 1.7, 1.0, 20.0, 50), 300, 3)

    def estimates(orders: int) -> set[tuple[float, float]]:
        out = set()
        for order in range(orders):
            rng = np.random.default_rng(order)
            plans: list[RoundPlan] = []

            def execute(plan: RoundPlan) -> np.ndarray:
                rows = draw_round(plan, means, 3, len(plans))
                plans.append(plan)
                rows = rows.reshape(-1, rows.shape[-1])
                return rows[rng.permutation(len(rows))]

            mean = drive(ScalarMeanProtocol(config), execute).mean
            out.add((mean.estimate, mean.standard_error))
        return out

    assert len(estimates(60)) == 1


@pytest.mark.parametrize("seed", [0, 4])
def test_simulate_gives_one_estimate_on_both_engines(seed):
    config = SimulationConfig(Population("gaussian", 1.7, 1.0, 20.0, 50), 300, 1.0, seed=seed)
    fast = run_simulation(config)
    messages = run_simulation(dataclasses.replace(config, path="messages"))
    assert (fast.estimate, fast.standard_error) == (messages.estimate, messages.standard_error)


def _clients(deployment: Deployment, means: np.ndarray):
    return [deployment.client(np.array([y]), PrivacyLedger(1.0)) for y in means]


def test_a_seeded_fleet_draws_what_the_engines_draw():
    deployment = Deployment()
    means = np.linspace(-1.0, 3.0, 40)
    fleet = Fleet(InProcessChannel(), deployment.session_id, _clients(deployment, means), draw=seeded_draw(9))
    plan = ScalarMeanProtocol(ScalarMeanConfig(bound=20.0, tau=0.7, epsilon0=1.0)).rounds().send(None)
    for round_id in (0, 1):
        spec = SimpleNamespace(params=plan.params, epsilon0=plan.epsilon0, delta0=plan.delta0, round_id=round_id)
        np.testing.assert_array_equal(fleet._values(spec), draw_round(plan, means, 9, round_id))
    other = Fleet(InProcessChannel(), deployment.session_id, _clients(deployment, means), draw=seeded_draw(10))
    assert not np.array_equal(other._values(spec), fleet._values(spec))
    with pytest.raises(ValueError, match="not both"):
        Fleet(InProcessChannel(), deployment.session_id, _clients(deployment, means), SeededSource(1), draw=seeded_draw(9))


def test_an_unseeded_fleet_leaves_every_device_its_os_csprng():
    deployment = Deployment()
    clients = _clients(deployment, np.zeros(5))
    fleet = Fleet(InProcessChannel(), deployment.session_id, clients)
    spec = SimpleNamespace(round_id=0)
    assert list(fleet._values(spec)) == [None] * 5  # each client draws its own report
    assert all(isinstance(c.source, SystemSource) and c.source.secure for c in clients)


def test_the_services_seed_only_when_told():
    parser = build_parser()
    keys = ["--keys", "k", "--broker", "127.0.0.1"]
    assert parser.parse_args(["clients", "run", *keys, "--users", "3"]).seed is None
    assert parser.parse_args(["clients", "run", *keys, "--users", "3", "--seed", "4"]).seed == 4
    assert parser.parse_args(["up"]).seed is None
    up = parser.parse_args(["up", "--seed", "4", "--distribution", "two-point"])
    assert (up.seed, up.distribution) == (4, "two-point")
    assert parser.parse_args(["simulate"]).seed == 0  # simulate never reaches a device: always seeded



def test_a_packing_fleet_gives_the_estimate_of_one_envelope_per_message():
    """A fleet that sends its envelopes five to a message (``Fleet(pack=5)``, as a gateway may) gives the
    same estimate as one that sends them one by one, every envelope admitted once, in a fifth of the messages."""
    import asyncio

    from shuffledp.protocol.transport.channel import reports_topic

    means, _ = local_means(Population("gaussian", 1.7, 1.0, 20.0, 50), 60, 5)
    protocol = ScalarMeanProtocol(ScalarMeanConfig(bound=20.0, tau=0.7, epsilon0=1.0))

    async def run(pack: int):
        deployment = Deployment()
        channel = InProcessChannel()
        shuffler = deployment.shuffler(channel)
        coordinator = deployment.coordinator(channel, round_timeout=30.0)
        fleet = Fleet(channel, deployment.session_id, _clients(deployment, means), draw=seeded_draw(7), pack=pack)
        tasks = [asyncio.create_task(shuffler.serve()), asyncio.create_task(fleet.serve(2))]
        try:
            result, records = await asyncio.wait_for(coordinator.run_protocol(protocol, len(means)), 30)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        messages = [channel.messages_by_topic[reports_topic(deployment.session_id, r.spec.round_id)] for r in records]
        return result, [r.opened.size for r in records], messages, [shuffler.rounds[r.spec.round_id] for r in records]

    one, opened_one, messages_one, _ = asyncio.run(run(1))
    packed, opened_packed, messages_packed, stats = asyncio.run(run(5))
    assert (packed.mean.estimate, packed.mean.standard_error) == (one.mean.estimate, one.mean.standard_error)
    assert opened_packed == opened_one == [60, 60]
    assert messages_one == [60, 60] and messages_packed == [12, 12]
    assert all(s.admitted == 60 and not s.rejected for s in stats)
    with pytest.raises(ValueError, match="pack"):
        Fleet(InProcessChannel(), Deployment().session_id, _clients(Deployment(), means[:2]), pack=65)
