"""The device-side Client: verify a round, check the budget, randomize, seal, envelope.

A :class:`Client` holds one user's samples. Given a signed round spec it

1. verifies the analyzer's Ed25519 signature against the key it pinned,
2. refuses expired rounds and rounds its :class:`PrivacyLedger` cannot afford,
3. runs the round's randomizer on its local mean (the same vectorized function the
   simulation uses, with a batch of one),
4. seals each report to the analyzer with HPKE, bound to the session and round,
5. wraps each in an :class:`Envelope` with its admission token and a fresh nonce.

Randomness comes from the OS CSPRNG (:class:`SystemSource`) unless a source is
given (simulations pass a seeded one, labelled as such).
"""

from __future__ import annotations

import os
import time

import numpy as np

from shuffledp.client.ledger import PrivacyLedger
from shuffledp.client.mean_randomizer import randomize_mean
from shuffledp.client.range_randomizer import randomize_range
from shuffledp.protocol import codec
from shuffledp.protocol.errors import InvalidParameter, ShuffleDPError
from shuffledp.protocol.messages import (
    NONCE_BYTES,
    TOKEN_BYTES,
    Envelope,
    HadamardRangeParams,
    ProjectedMeanParams,
    Report,
    RoundSpec,
    SignedRoundSpec,
)
from shuffledp.protocol.randomness import RandomSource, SystemSource
from shuffledp.protocol.sealing import Sealer, verify


class RoundExpired(ShuffleDPError):
    reason = "expired"


def verified_spec(signed: SignedRoundSpec | bytes, analyzer_signing_key: bytes) -> RoundSpec:
    """Decode a signed spec, check its signature, and return the RoundSpec it carries."""
    if isinstance(signed, bytes):
        signed = codec.decode(signed, SignedRoundSpec)
    verify(analyzer_signing_key, signed.spec_bytes, signed.signature)
    return codec.decode(signed.spec_bytes, RoundSpec)


def randomize_reports(spec: RoundSpec, local_means: np.ndarray, source: RandomSource) -> list[tuple[int, ...]]:
    """The report values of a batch of users for one round (one tuple per user)."""
    params = spec.params
    if isinstance(params, HadamardRangeParams):
        rows, bits = randomize_range(local_means, params, spec.epsilon0, source)
        return [(int(r), int(b)) for r, b in zip(rows, bits)]
    if isinstance(params, ProjectedMeanParams):
        values = randomize_mean(local_means, params, spec.epsilon0, source, delta=spec.delta0)
        return [(int(v),) for v in values]
    raise InvalidParameter("spec.params", f"unsupported mechanism {spec.mechanism}")


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
        samples = np.asarray(samples, dtype=np.float64)
        if samples.ndim != 1 or samples.size == 0:
            raise InvalidParameter("samples", f"must be a non-empty 1-d array, got shape {samples.shape}")
        if not np.all(np.isfinite(samples)):
            raise InvalidParameter("samples", "must be finite")
        self.local_mean = float(samples.mean())
        self.analyzer_signing_key = analyzer_signing_key
        self.ledger = ledger
        self.token = token if token is not None else os.urandom(TOKEN_BYTES)
        if len(self.token) != TOKEN_BYTES:
            raise InvalidParameter("token", f"must be {TOKEN_BYTES} bytes")
        self.source = source if source is not None else SystemSource()
        self.clock = clock

    def answer(self, signed: SignedRoundSpec | bytes) -> list[bytes]:
        """Encoded envelopes answering the round, or a typed error (bad signature, expired, budget)."""
        spec = verified_spec(signed, self.analyzer_signing_key)
        return self.answer_verified(spec, Sealer(spec.analyzer_key))

    def answer_verified(self, spec: RoundSpec, sealer: Sealer, values: tuple[int, ...] | None = None) -> list[bytes]:
        """Answer an already verified spec; ``values`` lets a batch caller pass pre-drawn report values."""
        if self.clock() > spec.deadline:
            raise RoundExpired(f"round {spec.round_id} closed at {spec.deadline}")
        self.ledger.spend(spec.session_id, spec.round_id, spec.epsilon0, spec.delta0)
        if values is None:
            values = randomize_reports(spec, np.array([self.local_mean]), self.source)[0]
        payload = codec.encode(Report(spec.round_id, spec.mechanism, values))
        sealed = sealer.seal(payload, spec.session_id, spec.round_id)
        envelope = Envelope(spec.session_id, spec.round_id, self.token, os.urandom(NONCE_BYTES), sealed)
        return [codec.encode(envelope)]
