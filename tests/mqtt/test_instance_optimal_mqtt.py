"""The instance-optimal clipped mean (three rounds: coordinate tree, shifted norms, shifted
vector summation) over the authenticated TLS mosquitto, each party with its own role's
account: the same reports as the vectorized engine, so the same estimate, bit for bit
(every decoder sums integers). The size is the least that keeps every round meaningful: two
coordinates and 120 users give a clipping radius of several units (the estimate is the users'
clipped mean, not a collapse to zero) with 30 summation messages per user; that the protocol
gives one result on both engines at every protocol's size is checked in-process
(``tests/simulation/test_engine.py``), what only this test checks is its three rounds over the broker."""

from __future__ import annotations

import numpy as np

from shuffledp.analyzer.instance_optimal import InstanceOptimalConfig, InstanceOptimalProtocol
from shuffledp.simulation.engine import run_fast, run_messages


def test_instance_optimal_shuffle_over_mqtt_matches_the_fast_engine(broker):
    users = 120
    rng = np.random.default_rng(8)
    data = np.array([4.0, -2.0]) + rng.normal(size=(users, 2)) * np.array([0.5, 1.0])
    config = InstanceOptimalConfig(dim=2, users=users, radius=50.0, epsilon=4.0, delta=1e-6, model="shuffle", leaves=64)
    fast = InstanceOptimalProtocol(config)
    expected = run_fast(fast, data, seed=11).result
    run = run_messages(InstanceOptimalProtocol(config, fast.budgets), data, seed=11, broker=str(broker.directory))
    assert run.transport.startswith("mqtt")
    got = run.result
    np.testing.assert_array_equal(got.estimate, expected.estimate)
    np.testing.assert_array_equal(got.center, expected.center)
    assert got.threshold == expected.threshold
    assert got.threshold.radius > 1.0 and np.all(np.abs(got.estimate) > 1.0)  # the rounds carried the users' data
    mechanisms = [r.plan.params.MECHANISM for r in run.rounds]
    assert mechanisms == ["coordinate-tree", "shifted-norm", "shifted-vector-sum"]
    for record in run.rounds:
        assert record.rejected_at_analyzer == {} and record.rejected_at_shuffler == {}
        assert record.reports == users * record.plan.messages_per_user
