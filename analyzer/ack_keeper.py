"""Acknowledgements that outlive their round: a batch the shuffler publishes again is acknowledged again.

The shuffler deletes a released batch only on the analyzer's signed :class:`BatchAck`. Until then
it publishes the batch again every ``republish_interval`` seconds, and ``ack_timeout`` seconds
after the round's deadline it gives the batch up with a signed ``failed: not-acknowledged``
outcome (``shuffler/service.py``). An acknowledgement is one QoS 1 publish, and a broker can take
it and still lose it: a cluster node killed before it routed the acknowledgement to the node the
shuffler reads from (a QoS 0 subscription on a NATS cluster,
:data:`~shuffledp.deploy.nats_cluster.SUBSCRIBE_QOS`) drops it for good. The shuffler would then
give up a batch the analyzer already counted, and tell every device the round failed.

So the coordinator does not close a round's batch subscriptions when it acknowledges the round.
It hands them to an :class:`AcknowledgementKeeper`, which reads on. A chunk of an acknowledged
batch, signed by the round's shuffler, can only mean that the shuffler has not seen the
acknowledgement, so the keeper publishes the same signed acknowledgement again. The shuffler
counts a repeated acknowledgement once: it serves an unknown or already-served batch id not at
all (``SqliteSpool.acknowledge``). The exchange settles at the shuffler's next re-publication
after the broker is whole again. It holds as long as the keeper runs: ``analyzer run --linger``
keeps it running after the last round.

Hostile input. Anyone allowed to publish on a batch topic may replay a genuine old chunk. What
that buys is bounded: a chunk that does not verify under the round's shuffler key costs one
signature check and is dropped, and a genuine one makes the keeper publish at most one
acknowledgement per batch per :data:`MIN_REACK_INTERVAL` seconds, whatever the rate. The
acknowledgement says only that the analyzer holds the batch, which the shuffler already knows.
The keeper holds the subscriptions of the :data:`KEPT_ROUNDS` most recent rounds; an older
round's are closed, and its batch is then past the shuffler's ``ack_timeout`` in any deployment
whose rounds last longer than ``ack_timeout / KEPT_ROUNDS``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from shuffledp.analyzer.service import read_signed_chunk
from shuffledp.protocol.errors import ShuffleDPError
from shuffledp.protocol.wire.messages import RoundSpec

_log = logging.getLogger(__name__)

#: Least seconds between two re-sent acknowledgements of one batch (a re-published batch arrives
#: as all its chunks at once; a replayed chunk may arrive at any rate).
MIN_REACK_INTERVAL = 1.0
#: Rounds whose batch subscriptions are kept; the oldest is closed when one more is kept.
KEPT_ROUNDS = 8


@dataclass
class _KeptRound:
    spec: RoundSpec
    #: batch id -> the signed acknowledgement sent for it
    acks: dict[bytes, bytes]
    subscriptions: list[Any]
    readers: list[asyncio.Task] = field(default_factory=list)
    last_sent: dict[bytes, float] = field(default_factory=dict)


class AcknowledgementKeeper:
    """Keeps acknowledged rounds' batch subscriptions open and acknowledges again any batch published again.

    ``publish(spec, ack_bytes)`` sends one signed acknowledgement (the coordinator's publish to the
    session's acks topic). Close it with :meth:`close` (the coordinator's ``close``).
    """

    def __init__(self, publish: Callable[[RoundSpec, bytes], Any], *, clock: Callable[[], float] = time.monotonic) -> None:
        self._publish = publish
        self._clock = clock
        self._rounds: OrderedDict[tuple[bytes, int], _KeptRound] = OrderedDict()
        #: Acknowledgements sent again because the shuffler published an acknowledged batch again.
        self.resent: int = 0
        #: Messages on a kept batch topic that were not a chunk of the round's batches, by reason.
        self.ignored: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._rounds)

    async def keep(self, spec: RoundSpec, acks: dict[bytes, bytes], subscriptions: list[Any]) -> None:
        """Watch ``subscriptions`` (the round's batch topics) for the batches ``acks`` acknowledges."""
        key = (spec.session_id, spec.round_id)
        previous = self._rounds.pop(key, None)
        if previous is not None:
            await self._close_round(previous)
        kept = _KeptRound(spec, dict(acks), list(subscriptions))
        kept.readers = [asyncio.create_task(self._read(kept, s), name=f"ack-keeper-{spec.round_id}")
                        for s in kept.subscriptions]
        self._rounds[key] = kept
        while len(self._rounds) > KEPT_ROUNDS:
            _, oldest = self._rounds.popitem(last=False)
            await self._close_round(oldest)

    async def close(self) -> None:
        """Stop watching every kept round and close its subscriptions."""
        while self._rounds:
            _, kept = self._rounds.popitem(last=False)
            await self._close_round(kept)

    async def _close_round(self, kept: _KeptRound) -> None:
        for reader in kept.readers:
            reader.cancel()
        await asyncio.gather(*kept.readers, return_exceptions=True)
        for subscription in kept.subscriptions:
            try:
                await subscription.close()
            except ShuffleDPError:  # the channel is gone already: nothing left to close
                pass

    async def _read(self, kept: _KeptRound, subscription) -> None:
        """Answer each message of one kept topic until its subscription ends (its channel closed or
        failed it). A flood waits in the subscription's own bounded queue: one message is held here
        at a time."""
        try:
            while True:
                await self._answer(kept, await subscription.get())
        except ShuffleDPError:
            return

    async def _answer(self, kept: _KeptRound, data: bytes) -> None:
        try:
            chunk = read_signed_chunk(data, kept.spec)
        except ShuffleDPError as exc:
            self.ignored[exc.reason] = self.ignored.get(exc.reason, 0) + 1
            return
        ack = kept.acks.get(chunk.batch_id)
        if ack is None:  # a batch the round did not take (too small, a second copy): not acknowledged then either
            self.ignored["unacknowledged-batch"] = self.ignored.get("unacknowledged-batch", 0) + 1
            return
        now = self._clock()
        if now - kept.last_sent.get(chunk.batch_id, -float("inf")) < MIN_REACK_INTERVAL:
            return
        kept.last_sent[chunk.batch_id] = now
        try:
            await self._publish(kept.spec, ack)
        except ShuffleDPError as exc:  # the broker is away: the shuffler's next re-publication brings another try
            kept.last_sent.pop(chunk.batch_id, None)
            _log.warning("analyzer: round %d: acknowledgement not sent again: %s", kept.spec.round_id, exc)
            return
        self.resent += 1
        _log.info("analyzer: round %d: batch %s published again; acknowledged again",
                  kept.spec.round_id, chunk.batch_id.hex())
