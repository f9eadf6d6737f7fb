"""The mechanics audit against the shuffler service over a real mosquitto (TLS, passwords, ACL)."""

from __future__ import annotations

from shuffledp.audit.faults import planted_fault
from shuffledp.audit.mechanics import CHECKS, audit_mechanics


def test_a_correct_shuffler_passes_over_mqtt(broker):
    audit = audit_mechanics(broker=str(broker.directory), batches=8, batch_size=32, seed=3)
    assert audit.transport.startswith("mqtt")
    assert {c.name: c.status for c in audit.checks} == {name: "passed" for name in CHECKS}


def test_a_shuffler_keeping_arrival_order_is_caught_over_mqtt(broker):
    with planted_fault("shuffler-arrival-order"):
        audit = audit_mechanics(broker=str(broker.directory), batches=8, batch_size=32, seed=4)
    assert "arrival-order-kept" in audit.failed


def test_the_running_shuffler_service_is_audited_as_deployed(broker, tmp_path):
    """`shuffledp shuffler serve` as its own process, over TLS with the shuffler's account: the
    audit signs rounds with the deployment's analyzer key and enrols its own clients."""
    import subprocess
    import time

    from test_services import CLI, ENV, broker_options, start

    keys = tmp_path / "keys"
    subprocess.run([*CLI, "keys", "init", str(keys)], check=True, env=ENV, capture_output=True)
    log = tmp_path / "shuffler.log"
    shuffler = start(["shuffler", "serve", "--keys", str(keys), *broker_options(broker, tmp_path, "shuffler"),
                      "--spool", str(tmp_path / "spool.db")], log)
    try:
        deadline = time.monotonic() + 30
        while b"serving session" not in log.read_bytes():
            assert shuffler.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        audit = audit_mechanics(broker=str(broker.directory), keys=str(keys), batches=6, batch_size=16, seed=5)
        assert "running shuffler service" in audit.transport
        assert {c.name: c.status for c in audit.checks} == {name: "passed" for name in CHECKS}
        # the service counted the audit's hostile envelopes by reason (it logs the round just after
        # publishing it, so the line may trail the audit by a moment), and is still up
        deadline = time.monotonic() + 10
        while "released" not in log.read_text().rsplit("open", 1)[-1] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert shuffler.poll() is None
        text = log.read_text()
        assert "quota 1" in text and "duplicate 1" in text and "bad-credential 1" in text
    finally:
        shuffler.kill()
        shuffler.wait(10)
