"""A device's view of one round: verify the analyzer's spec, answer it, stay within budget.

Run: ``python examples/embed_client.py``. The analyzer and shuffler here only do
their part for this one envelope, to show every layer of the wire: the device
seals its padded report to the analyzer (inner layer), then wraps it with its
credential and a fresh nonce, sealed to the shuffler (outer layer).
"""

from __future__ import annotations

import time

import numpy as np

from shuffledp.client import PrivacyLedger
from shuffledp.deploy.deployment import Deployment
from shuffledp.protocol.errors import BudgetExceeded
from shuffledp.protocol.wire.messages import HadamardRangeParams, RoundSpec
from shuffledp.protocol.wire.onion import EnvelopeOpener

deployment = Deployment()  # in production: keys on disk, and a credential from enrollment
analyzer = deployment.analyzer()
spec = RoundSpec(
    session_id=deployment.session_id, round_id=0, params=HadamardRangeParams(-20.0, 20.0, 0.8), epsilon0=0.5,
    analyzer_key=analyzer.keys.hpke_public, shuffler_key=deployment.shuffler_keys.hpke_public,
    shuffler_signing_key=deployment.shuffler_keys.signing_public, min_batch=1, deadline=time.time() + 60,
)
signed_spec = analyzer.sign_spec(spec)  # what the device receives from the shuffler

# On the device: its samples, the analyzer key it pinned, its local budget and its credential.
client = deployment.client(np.array([1.2, 2.1, 1.9]), PrivacyLedger(epsilon_budget=0.5))
envelopes = client.answer(signed_spec)
print(f"device sent {len(envelopes)} envelope of {len(envelopes[0])} bytes (every envelope of this round has that length)")
print(f"ledger: spent eps {client.ledger.spent_epsilon} of {client.ledger.epsilon_budget}")

try:
    client.answer(signed_spec)
except BudgetExceeded as exc:
    print(f"answering again is refused: {exc}")

# At the shuffler: the outer layer opens to the credential, a nonce and a sealed report it cannot read.
admission = EnvelopeOpener(deployment.shuffler_keys.hpke_private, spec).open(envelopes[0])
client_id = deployment.issuer.verify(admission.credential)
print(f"shuffler admitted client {client_id.hex()[:8]}...: sealed report of {len(admission.sealed)} bytes")

# At the analyzer (after shuffling): open the report.
opened = analyzer.open_payloads([admission.sealed], spec)
row, bit = opened.values[0]
print(f"analyzer opened: Hadamard row {row}, bit {bit:+d}")
