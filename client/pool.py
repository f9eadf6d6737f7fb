"""Many simulated clients in one process, answering rounds over a channel.

A real deployment runs one :class:`Client` per device; a simulation of thousands
of users runs them in a :class:`ClientPool`, which subscribes once to the session's
spec topic and, for each new round, lets every client verify, budget-check,
randomize, seal and publish its envelopes. The report values of all clients are
drawn in one vectorized call of the same randomizer a device uses, then each
client seals its own (so the bytes on the wire are exactly a device's).

With ``confirm=True`` the pool behaves as careful devices do: it listens to the
shuffler's signed receipts and re-publishes, every ``retry_interval`` seconds until
the round's deadline, each envelope not yet named in a receipt, byte for byte. A
retransmission of an admitted envelope is acknowledged again and counted once by the
shuffler, and the client's ledger was charged once, when the envelope was made; so
envelopes lost on the way (a broker or shuffler restart) are delivered without any
report counting or being charged twice.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Callable, Sequence

import numpy as np

from shuffledp.client.client import Client, verified_spec
from shuffledp.client.mechanisms import randomize_reports
from shuffledp.protocol.channel import Channel, outcome_topic, receipts_topic, reports_topic, spec_topic
from shuffledp.protocol.errors import ShuffleDPError
from shuffledp.protocol.messages import AdmissionReceipts, RoundOutcome, RoundSpec
from shuffledp.protocol.onion import decode_verified
from shuffledp.protocol.randomness import RandomSource
from shuffledp.protocol.sealing import Sealer


class ClientPool:
    """Serves ``clients`` (who share one pinned analyzer key) on ``channel`` for one session."""

    def __init__(
        self,
        channel: Channel,
        session_id: bytes,
        clients: Sequence[Client],
        source: RandomSource,
        *,
        on_progress: Callable[[int], None] | None = None,
        confirm: bool = False,
        retry_interval: float = 1.0,
    ) -> None:
        self.channel = channel
        self.confirm = confirm
        self.retry_interval = retry_interval
        #: Envelopes published again because no receipt had named them yet.
        self.retransmitted = 0
        #: Envelopes the shuffler's receipts named: admitted, or refused by reason.
        self.admitted = 0
        #: Envelopes whose round closed (signed outcome) before any receipt named them.
        self.unconfirmed = 0
        self.refused_by_shuffler: Counter = Counter()
        self.session_id = session_id
        self.clients = list(clients)
        self.source = source
        self.on_progress = on_progress
        self.refused: Counter = Counter()
        self.answered_rounds: list[int] = []

    async def serve(self, rounds: int) -> None:
        """Answer ``rounds`` distinct rounds, then return."""
        specs = await self.channel.subscribe(spec_topic(self.session_id))
        try:
            while len(self.answered_rounds) < rounds:
                await self.answer_round(await specs.get())
        finally:
            await specs.close()

    async def answer_round(self, signed_spec: bytes) -> None:
        if not self.clients:
            return
        try:
            spec = verified_spec(signed_spec, self.clients[0].analyzer_signing_key)
        except ShuffleDPError as exc:
            self.refused[exc.reason] += 1
            return
        if spec.round_id in self.answered_rounds:
            return  # a re-delivered retained spec
        self.answered_rounds.append(spec.round_id)
        local_means = np.array([c.local_mean for c in self.clients])
        try:
            values = randomize_reports(spec, local_means, self.source)
            sealer = Sealer(spec.analyzer_key)
        except ShuffleDPError as exc:  # a spec no client can answer: refused by all, the pool goes on
            self.refused[exc.reason] += len(self.clients)
            return
        receipts = None
        if self.confirm:
            receipts = [
                (kind, await self.channel.subscribe(topic(spec.session_id, spec.round_id, instance)))
                for instance in range(spec.shuffler_instances)
                for kind, topic in (("receipts", receipts_topic), ("outcome", outcome_topic))
            ]
        pending: dict[bytes, tuple[str, bytes, int]] = {}
        for index, (client, value) in enumerate(zip(self.clients, values)):
            try:
                envelopes = client.answer_verified(spec, sealer, value)
            except ShuffleDPError as exc:
                self.refused[exc.reason] += 1
                continue
            topic = reports_topic(spec.session_id, spec.round_id, client.instance_for(spec))
            instance = client.instance_for(spec)
            for envelope, nonce in zip(envelopes, client.sent[(spec.session_id, spec.round_id)].nonces):
                pending[nonce] = (topic, envelope, instance)
                await self.channel.publish(topic, envelope)
            if self.on_progress is not None and index % 1024 == 1023:
                self.on_progress(1024)
        if receipts is not None:
            try:
                await self._confirm(spec, pending, receipts)
            finally:
                for _, sub in receipts:
                    await sub.close()
        if self.on_progress is not None:
            self.on_progress(len(self.clients) % 1024)

    async def _confirm(self, spec: RoundSpec, pending: dict[bytes, tuple[str, bytes, int]], receipts) -> None:
        """Re-publish envelopes no receipt has named, until all are named or the round closes.

        Retransmission waits for ``retry_interval`` seconds *without any receipt*: while
        the shuffler is working through a backlog, receipts keep coming and nothing is
        sent twice; only a stall (envelopes lost to a restart) triggers a retry. The
        round's signed outcome (retained, so it survives a reconnection) ends the wait
        for its instance's envelopes: those still unnamed are counted in
        :attr:`unconfirmed` (their receipts were lost; whether they were admitted the
        outcome's count and the analyzer's batch tell, not the pool).
        """
        while pending and time.time() < spec.deadline:
            wake = time.monotonic() + self.retry_interval
            while pending and time.monotonic() < wake:
                got = False
                for kind, sub in receipts:
                    for data in sub.get_nowait_all():
                        got = True
                        self._take_reply(kind, spec, data, pending)
                if got:
                    wake = time.monotonic() + self.retry_interval
                else:
                    await asyncio.sleep(0.01)
            for topic, envelope, _ in list(pending.values()):
                await self.channel.publish(topic, envelope)
                self.retransmitted += 1

    def _take_reply(self, kind: str, spec: RoundSpec, data: bytes, pending: dict) -> None:
        """Settle pending envelopes from a signed receipts message or round outcome; junk is counted."""
        try:
            if kind == "outcome":
                outcome = decode_verified(data, RoundOutcome, spec.shuffler_signing_key)
                if (outcome.session_id, outcome.round_id) == (spec.session_id, spec.round_id):
                    for nonce in [k for k, v in pending.items() if v[2] == outcome.instance]:
                        del pending[nonce]
                        self.unconfirmed += 1
                return
            message = decode_verified(data, AdmissionReceipts, spec.shuffler_signing_key)
        except ShuffleDPError as exc:  # forged or junk replies: ignored, counted
            self.refused_by_shuffler[f"bad-{kind}-{exc.reason}"] += 1
            return
        for nonce in message.admitted:
            if pending.pop(nonce, None) is not None:
                self.admitted += 1
        for nonce, reason in zip(message.refused, message.reasons):
            if pending.pop(nonce, None) is not None:
                self.refused_by_shuffler[reason] += 1
