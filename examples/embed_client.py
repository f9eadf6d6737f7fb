"""A device's view of one round: verify the analyzer's spec, answer it, stay within budget.

Run: ``python examples/embed_client.py``. The "analyzer" here only produces a
signed spec and opens the answer, to show both ends of the wire.
"""

from __future__ import annotations

import os
import time

import numpy as np

from shuffledp.analyzer.service import Analyzer
from shuffledp.client import Client, PrivacyLedger
from shuffledp.protocol import codec
from shuffledp.protocol.errors import BudgetExceeded
from shuffledp.protocol.messages import Envelope, HadamardRangeParams, RoundSpec, ShuffledBatch

analyzer = Analyzer()
spec = RoundSpec(
    session_id=os.urandom(16), round_id=0, params=HadamardRangeParams(-20.0, 20.0, 0.8),
    epsilon0=0.5, analyzer_key=analyzer.keys.hpke_public, min_batch=1, deadline=time.time() + 60,
)
signed_spec = analyzer.sign_spec(spec)  # what the device receives from the shuffler

# On the device: its samples, the analyzer key it pinned, and its local budget.
client = Client(np.array([1.2, 2.1, 1.9]), analyzer.keys.signing_public, PrivacyLedger(epsilon_budget=0.5))
envelopes = client.answer(signed_spec)
envelope = codec.decode(envelopes[0], Envelope)
print(f"device sent {len(envelopes)} envelope of {len(envelopes[0])} bytes; sealed payload {len(envelope.sealed)} bytes")
print(f"ledger: spent eps {client.ledger.spent_epsilon} of {client.ledger.epsilon_budget}")

try:
    client.answer(signed_spec)
except BudgetExceeded as exc:
    print(f"answering again is refused: {exc}")

# At the analyzer (after the shuffler): open the report.
opened = analyzer.open_batch(ShuffledBatch(spec.session_id, spec.round_id, (envelope.sealed,)), spec)
row, bit = opened.values[0]
print(f"analyzer opened: Hadamard row {row}, bit {bit:+d}")
