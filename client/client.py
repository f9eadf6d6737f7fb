"""The device-side Client: verify a round, check the budget, randomize, seal, envelope.

A :class:`Client` holds one user's samples. Given a signed round spec it

1. verifies the analyzer's Ed25519 signature against the key it pinned,
2. refuses expired rounds and rounds its :class:`PrivacyLedger` cannot afford,
3. runs the round's randomizer on its local mean (the same vectorized function the
   simulation uses, with a batch of one),
4. pads each report to the round's fixed size (so its length says nothing about its
   value) and seals it to the analyzer with HPKE, bound to the session and round,
5. wraps each in an :class:`Envelope` with its admission token (fresh every round
   unless one was configured) and a fresh nonce,
6. and only then charges its ledger (an atomic check-and-spend): a round that fails
   anywhere above costs nothing, and nothing is returned for a round not charged.

Randomness comes from the OS CSPRNG (:class:`SystemSource`) unless a source is
given (simulations pass a seeded one, labelled as such).
"""

from __future__ import annotations

import os
import time

import numpy as np

from shuffledp.client.ledger import PrivacyLedger
from shuffledp.client.local_data import as_real_array
from shuffledp.client.mechanisms import check_report_values, randomize_reports, report_ranges
from shuffledp.protocol import codec
from shuffledp.protocol.errors import InvalidParameter, ShuffleDPError
from shuffledp.protocol.messages import NONCE_BYTES, TOKEN_BYTES, Envelope, Report, RoundSpec, SignedRoundSpec
from shuffledp.protocol.report_format import report_format
from shuffledp.protocol.randomness import RandomSource, SystemSource
from shuffledp.protocol.sealing import Sealer, verify


class RoundExpired(ShuffleDPError):
    reason = "expired"


def verified_spec(signed: SignedRoundSpec | bytes, analyzer_signing_key: bytes) -> RoundSpec:
    """Decode a signed spec, check its signature, and return the RoundSpec it carries."""
    if not isinstance(signed, SignedRoundSpec):
        signed = codec.decode(signed, SignedRoundSpec)  # bytes-like, or a typed MalformedMessage
    verify(analyzer_signing_key, signed.spec_bytes, signed.signature)
    return codec.decode(signed.spec_bytes, RoundSpec)


class Client:
    """One user's device: its samples, its pinned analyzer key, its budget and its token."""

    def __init__(
        self,
        samples: np.ndarray,
        analyzer_signing_key: bytes,
        ledger: PrivacyLedger,
        *,
        token: bytes | None = None,
        source: RandomSource | None = None,
        clock=time.time,
    ) -> None:
        samples = as_real_array(samples, "samples")
        if samples.size == 0:
            raise InvalidParameter("samples", "must not be empty")
        if not isinstance(ledger, PrivacyLedger):
            raise InvalidParameter("ledger", f"must be a PrivacyLedger, got {type(ledger).__name__}")
        with np.errstate(over="ignore"):
            self.local_mean = float(samples.mean())
        if not np.isfinite(self.local_mean):
            raise InvalidParameter("samples", "their mean overflows a double")
        self.analyzer_signing_key = analyzer_signing_key
        self.ledger = ledger
        if token is not None and (not isinstance(token, bytes) or len(token) != TOKEN_BYTES):
            raise InvalidParameter("token", f"must be {TOKEN_BYTES} bytes")
        #: A fixed admission token, or None: a fresh random token every round, so the
        #: shuffler and the broker cannot link one device's envelopes across rounds.
        self.token = token
        self.source = source if source is not None else SystemSource()
        self.clock = clock

    def answer(self, signed: SignedRoundSpec | bytes) -> list[bytes]:
        """Encoded envelopes answering the round, or a typed error (bad signature, expired, budget)."""
        spec = verified_spec(signed, self.analyzer_signing_key)
        return self.answer_verified(spec, Sealer(spec.analyzer_key))

    def answer_verified(self, spec: RoundSpec, sealer: Sealer, values: tuple[int, ...] | None = None) -> list[bytes]:
        """Answer an already verified spec; ``values`` lets a batch caller pass pre-drawn report values.

        The ledger is charged last, after every step that can fail, so a refused or
        failed round costs nothing; the charge is an atomic check-and-spend, so two
        threads (or two clients sharing a ledger) cannot both spend the last of it.
        """
        if self.clock() > spec.deadline:
            raise RoundExpired(f"round {spec.round_id} closed at {spec.deadline}")
        self.ledger.check(spec.session_id, spec.round_id, spec.epsilon0, spec.delta0)
        if values is None:
            values = randomize_reports(spec, np.array([self.local_mean]), self.source)[0]
        check_report_values(values, report_ranges(spec))  # never send what an honest randomizer cannot
        layout = report_format(spec.round_id, spec.mechanism)
        payload = layout.pad(codec.encode(Report(spec.round_id, spec.mechanism, values)))
        sealed = sealer.seal(payload, spec.session_id, spec.round_id)
        token = self.token if self.token is not None else os.urandom(TOKEN_BYTES)
        envelope = codec.encode(Envelope(spec.session_id, spec.round_id, token, os.urandom(NONCE_BYTES), sealed))
        self.ledger.spend(spec.session_id, spec.round_id, spec.epsilon0, spec.delta0)
        return [envelope]
