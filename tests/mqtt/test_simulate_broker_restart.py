"""``shuffledp simulate --broker``: the message engine survives a broker restart in the middle of a round.

The broker keeps no messages across a restart (``persistence false``), so envelopes it
had acknowledged to the client pool but not yet delivered to the shuffler are gone, as
are receipts on their way back. The pool keeps every envelope until a signed receipt
names it and sends it again, byte for byte, as the service fleet does; the shuffler
admits an exact copy once. So the run completes with every user's report counted once
per round, in bounded time, instead of waiting out the round's deadline.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from shuffledp.analyzer.scalar_mean import ScalarMeanConfig, ScalarMeanProtocol
from shuffledp.simulation.engine import run_messages

pytestmark = pytest.mark.mqtt

USERS = 3100
#: Restarts, each when the pool has sealed another 1024 users of a round, and the broker
#: has been up again for SETTLE seconds (so every party has reconnected: this is a broker
#: that restarts, not one that flaps). A restart loses an envelope when the pool's next
#: publish beats the shuffler's re-subscription, or one was on its way to the shuffler:
#: about one restart in two. A pool that sends each envelope once then waits out the
#: round's deadline (an hour).
RESTARTS = 4
SETTLE = 1.5
#: The run takes under 10 s; only retransmission finishes it within this bound.
BOUND_SECONDS = 45.0


def test_simulate_over_a_broker_restarted_mid_round_counts_every_report_once(fresh_broker):
    protocol = ScalarMeanProtocol(ScalarMeanConfig(bound=10.0, tau=2.0, epsilon0=4.0))
    means = np.random.default_rng(5).normal(1.0, 0.5, USERS)
    restarters: list[threading.Thread] = []
    restarted: list[float] = [0.0]  # when the broker was last (re)started (long before, for the first)

    def restart_broker() -> None:
        fresh_broker.stop()
        time.sleep(0.5)
        fresh_broker.restart()
        restarted.append(time.monotonic())

    def progress(what: str, count: int) -> None:
        # the pool has sealed and published another 1024 users of a round: restart the broker
        settled = len(restarted) == len(restarters) + 1 and time.monotonic() - restarted[-1] >= SETTLE
        if what == "sealed users" and count == 1024 and len(restarters) < RESTARTS and settled:
            restarters.append(threading.Thread(target=restart_broker, daemon=True))
            restarters[-1].start()

    outcome: dict[str, object] = {}

    def simulate() -> None:
        try:
            outcome["run"] = run_messages(protocol, means, seed=3, broker=str(fresh_broker.directory), progress=progress)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            outcome["error"] = exc

    started = time.monotonic()
    worker = threading.Thread(target=simulate, daemon=True)  # a hung run must not hold up the test process
    worker.start()
    worker.join(BOUND_SECONDS)
    assert not worker.is_alive(), f"the simulation did not finish within {BOUND_SECONDS} s of broker restarts"
    elapsed = time.monotonic() - started
    for t in restarters:
        t.join(10)
    assert "error" not in outcome, outcome.get("error")
    assert len(restarted) > 1 and fresh_broker.starts == len(restarted), "the broker was not restarted during the run"
    run = outcome["run"]
    assert len(run.rounds) == 2
    for r in run.rounds:
        # every user's report reached the analyzer once: the round waits for exactly USERS
        # valid reports, and the shuffler forwarded no copy
        assert r.reports == USERS and r.messages == USERS and r.batch_sizes == (USERS,)
        assert r.rejected_at_analyzer == {} and r.rejected_at_shuffler == {}
    # copies were sent (the restarts lost envelopes or their receipts), none counted
    assert sum(r.retransmitted for r in run.rounds) > 0
    assert elapsed < BOUND_SECONDS
