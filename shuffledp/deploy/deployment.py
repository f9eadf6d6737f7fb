"""One session's parties and their keys, wired together: the analyzer, the shuffler, the enrolled clients.

A real deployment runs each party in its own process or device, with keys on disk
(``shuffledp keys``); a simulation, a test or a benchmark runs them in one process.
:class:`Deployment` holds what ties them together, so no caller re-implements the
wiring:

* the analyzer's keys (it signs specs and acknowledgements, and opens reports);
* the shuffler's keys (it opens envelopes' outer layers and signs batches,
  receipts and outcomes); the analyzer names their public halves in every spec;
* the credential issuer (the enrollment service's key, shared with the shuffler),
  which enrolls clients with credentials they cannot mint themselves.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shuffledp.analyzer.coordinator import Coordinator, ShufflerIdentity
from shuffledp.analyzer.service import Analyzer
from shuffledp.client.client import Client
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.protocol.transport.channel import Channel
from shuffledp.protocol.wire.credentials import CredentialIssuer
from shuffledp.protocol.wire.messages import SESSION_ID_BYTES
from shuffledp.protocol.wire.onion import ShufflerKeys
from shuffledp.protocol.wire.sealing import AnalyzerKeys
from shuffledp.shuffler.service import Shuffler


@dataclass
class Deployment:
    """Keys and identities of one session's parties (see the module docstring)."""

    analyzer_keys: AnalyzerKeys = field(default_factory=AnalyzerKeys.generate)
    shuffler_keys: ShufflerKeys = field(default_factory=ShufflerKeys.generate)
    issuer: CredentialIssuer = field(default_factory=CredentialIssuer.generate)
    session_id: bytes = field(default_factory=lambda: os.urandom(SESSION_ID_BYTES))

    @property
    def shuffler_identity(self) -> ShufflerIdentity:
        return ShufflerIdentity(self.shuffler_keys.hpke_public, self.shuffler_keys.signing_public)

    @property
    def analyzer_signing_key(self) -> bytes:
        """The key every client pins and the shuffler checks specs and acknowledgements with."""
        return self.analyzer_keys.signing_public

    def analyzer(self, *, workers: int | None = 1) -> Analyzer:
        return Analyzer(self.analyzer_keys, workers=workers)

    def coordinator(self, channel: Channel, *, analyzer: Analyzer | None = None, **options: Any) -> Coordinator:
        return Coordinator(
            channel, analyzer or self.analyzer(), self.shuffler_identity, session_id=self.session_id, **options
        )

    def shuffler(self, channel: Channel, **options: Any) -> Shuffler:
        return Shuffler(channel, self.session_id, self.analyzer_signing_key, self.shuffler_keys, self.issuer, **options)

    def enroll(self) -> bytes:
        """A fresh credential for one new device."""
        return self.issuer.issue()

    def client(self, samples: np.ndarray, ledger: PrivacyLedger, **options: Any) -> Client:
        """An enrolled client holding ``samples``."""
        return Client(samples, self.analyzer_signing_key, ledger, credential=self.enroll(), **options)

    def clients(self, values: np.ndarray, ledgers: list[PrivacyLedger], **options: Any) -> list[Client]:
        """Enrolled clients holding one row of ``values`` each (:meth:`Client.many`: ``client(values[i][None],
        ledgers[i], **options)`` for every row, set up in bulk)."""
        credentials = self.issuer.issue_many(len(ledgers))
        return Client.many(values, self.analyzer_signing_key, ledgers, credentials, **options)
