"""A device trusts round outcomes only forward: a failed outcome is final, and a replayed older one changes nothing.

The shuffler signs ``released`` when it forwards a batch, and may later sign ``failed``
(``not-acknowledged``) for the same round when the analyzer never acknowledged the batch.
Both are genuine, and outcomes carry no timestamp, so whoever relays them (the broker, or
anyone who kept a copy) can deliver the older ``released`` again after the ``failed``. The
order a device accepts is ``released -> failed`` only; ``failed`` is final, and the same
word again is a no-op. ``Client.settle_outcome`` and ``PrivacyLedger.record_outcome`` both
keep it, so a ledger shared by several clients, or written to directly, keeps it too.
"""

from __future__ import annotations

import numpy as np
import pytest

from shuffledp.client.ledger import PrivacyLedger
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.wire import codec
from shuffledp.protocol.wire.messages import RoundOutcome
from shuffledp.protocol.wire.onion import signed

from parties import DEPLOYMENT, make_spec

SESSION = DEPLOYMENT.session_id
BATCH = bytes(range(16))


def _answered(round_id: int = 5):
    client = DEPLOYMENT.client(np.array([0.5]), PrivacyLedger(2.0))
    spec = make_spec(round_id=round_id)
    client.answer(DEPLOYMENT.analyzer().sign_spec(spec))
    return client, spec


def _outcome(spec, outcome: str, reason: str = "") -> bytes:
    message = RoundOutcome(spec.session_id, spec.round_id, spec.digest, outcome, reason, 3, BATCH, 0)
    return codec.encode(signed(DEPLOYMENT.shuffler_keys.signing_private, message))


def test_a_replayed_released_after_a_failed_outcome_changes_nothing():
    client, spec = _answered()
    released, failed = _outcome(spec, "released"), _outcome(spec, "failed", "not-acknowledged")
    assert client.settle_outcome(released).outcome == "released"
    assert client.settle_outcome(failed).outcome == "failed:not-acknowledged"  # released -> failed: taken
    sent = client.settle_outcome(released)  # the older, genuine message again
    assert sent.outcome == "failed:not-acknowledged"
    assert client.ledger.outcomes[(SESSION, spec.round_id)] == "failed:not-acknowledged"
    assert client.ledger.lost_rounds() == [(SESSION, spec.round_id)]
    assert client.ledger.spent_epsilon == spec.epsilon0  # still charged once


def test_a_failed_outcome_is_final_against_another_failed_reason_too():
    client, spec = _answered()
    client.settle_outcome(_outcome(spec, "failed", "batch-too-small"))
    sent = client.settle_outcome(_outcome(spec, "failed", "not-acknowledged"))
    assert sent.outcome == "failed:batch-too-small"
    assert client.ledger.outcomes[(SESSION, spec.round_id)] == "failed:batch-too-small"


def test_the_ledger_itself_records_outcomes_only_forward():
    ledger = PrivacyLedger(1.0)
    ledger.spend(SESSION, 1, 0.5, 0.0)
    ledger.record_outcome(SESSION, 1, "released")
    ledger.record_outcome(SESSION, 1, "released")  # the same word again: a no-op
    ledger.record_outcome(SESSION, 1, "failed:not-acknowledged")
    ledger.record_outcome(SESSION, 1, "released")  # after failed: refused silently, nothing changes
    ledger.record_outcome(SESSION, 1, "failed:other")
    assert ledger.outcomes == {(SESSION, 1): "failed:not-acknowledged"}
    assert ledger.lost_rounds() == [(SESSION, 1)]


@pytest.mark.parametrize("word", ["served", "failed", "", "released:x", None])
def test_the_ledger_refuses_a_word_that_is_not_an_outcome(word):
    ledger = PrivacyLedger(1.0)
    ledger.spend(SESSION, 1, 0.5, 0.0)
    with pytest.raises(InvalidParameter):
        ledger.record_outcome(SESSION, 1, word)
    assert ledger.outcomes == {}
