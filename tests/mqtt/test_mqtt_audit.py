"""The mechanics audit against the shuffler service over a real mosquitto (TLS, passwords, ACL)."""

from __future__ import annotations

from shuffledp.audit_faults import planted_fault
from shuffledp.audit_mechanics import CHECKS, audit_mechanics


def test_a_correct_shuffler_passes_over_mqtt(broker):
    audit = audit_mechanics(broker=str(broker.directory), batches=8, batch_size=32, seed=3)
    assert audit.transport.startswith("mqtt")
    assert {c.name: c.status for c in audit.checks} == {name: "passed" for name in CHECKS}


def test_a_shuffler_keeping_arrival_order_is_caught_over_mqtt(broker):
    with planted_fault("shuffler-arrival-order"):
        audit = audit_mechanics(broker=str(broker.directory), batches=8, batch_size=32, seed=4)
    assert "arrival-order-kept" in audit.failed
