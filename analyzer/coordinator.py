"""The analyzer's coordinator: drives multi-round protocols over a channel.

For each round it builds a RoundSpec, signs it, subscribes to the round's batch
topic, announces the spec to the shuffler, waits for the shuffled batch (until the
round's deadline plus a grace period) and opens it. :meth:`Coordinator.scalar_mean`
runs Algorithm 1 (range round, then mean round) this way.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from shuffledp.analyzer.decoders import MeanEstimate, RangeEstimate
from shuffledp.analyzer.scalar_mean import ScalarMeanConfig, estimate_mean, estimate_range
from shuffledp.analyzer.service import Analyzer, OpenedBatch
from shuffledp.protocol import codec
from shuffledp.protocol.channel import Channel, announce_topic, batch_topic
from shuffledp.protocol.errors import BatchTooSmall, InvalidParameter, ShuffleDPError
from shuffledp.protocol.messages import SESSION_ID_BYTES, MechanismParams, RoundSpec
from shuffledp.protocol.report_format import report_format


@dataclass(frozen=True)
class RoundRecord:
    """One completed round: its spec, what was opened, and the bytes the batch took."""

    spec: RoundSpec
    opened: OpenedBatch
    batch_bytes: int


@dataclass(frozen=True)
class ScalarMeanOutcome:
    found_range: RangeEstimate
    mean: MeanEstimate
    rounds: tuple[RoundRecord, RoundRecord]


def check_servable(spec: RoundSpec) -> None:
    """Refuse a round whose largest batch could not be encoded as one shuffled-batch message."""
    sealed = report_format(spec.round_id, spec.mechanism).sealed_size
    largest = spec.max_batch * (sealed + 3) + 128  # each payload: a 2-3 byte header and its bytes
    limit = codec.MESSAGE_TYPES["shuffled-batch"][1]
    if largest > limit:
        raise InvalidParameter(
            "max_batch", f"{spec.max_batch} reports of {sealed} bytes make a {largest}-byte batch, over {limit}"
        )


class Coordinator:
    """Runs rounds of one session against a shuffler reachable over ``channel``."""

    def __init__(
        self,
        channel: Channel,
        analyzer: Analyzer,
        *,
        session_id: bytes | None = None,
        round_timeout: float = 60.0,
        grace: float = 5.0,
        on_progress: Callable[[int], None] | None = None,
    ) -> None:
        self.channel = channel
        self.analyzer = analyzer
        self.session_id = session_id if session_id is not None else os.urandom(SESSION_ID_BYTES)
        self.round_timeout = round_timeout
        self.grace = grace
        self._next_round = 0
        self.on_progress = on_progress
        #: Bytes on a batch topic that were not a batch of the round, by reason.
        self.rejected_batches: Counter = Counter()

    async def run_round(
        self,
        params: MechanismParams,
        epsilon0: float,
        min_batch: int,
        *,
        delta0: float = 0.0,
        max_batch: int | None = None,
    ) -> RoundRecord:
        """Announce one round and return the first batch that opens to at least ``min_batch`` valid reports.

        ``max_batch`` defaults to ``min_batch``: the shuffler forwards as soon as it holds
        ``min_batch`` reports, so a longer batch is not the shuffler's, and refusing it
        before opening bounds the work junk on the batch topic can cost.
        """
        max_batch = min_batch if max_batch is None else max_batch
        spec = RoundSpec(
            session_id=self.session_id,
            round_id=self._next_round,
            params=params,
            epsilon0=epsilon0,
            delta0=delta0,
            analyzer_key=self.analyzer.keys.hpke_public,
            min_batch=min_batch,
            max_batch=max_batch,
            deadline=time.time() + self.round_timeout,
        )
        self._next_round += 1
        check_servable(spec)
        batches = await self.channel.subscribe(batch_topic(self.session_id, spec.round_id))
        try:
            await self.channel.publish(announce_topic(self.session_id), self.analyzer.sign_spec(spec), retain=True)
            return await self._first_valid_batch(spec, batches)
        finally:
            await batches.close()

    async def _first_valid_batch(self, spec: RoundSpec, batches) -> RoundRecord:
        """Open the first batch on the topic that reads as a batch of this round.

        Anyone who can publish to the batch topic can send junk there; such bytes are
        counted in :attr:`rejected_batches` by reason and the coordinator keeps
        waiting, until the round's deadline plus the grace period.
        """
        deadline = asyncio.get_running_loop().time() + self.round_timeout + self.grace
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            try:
                if remaining <= 0:
                    raise asyncio.TimeoutError
                data = await asyncio.wait_for(batches.get(), timeout=remaining)
            except asyncio.TimeoutError:
                raise BatchTooSmall(
                    f"round {spec.round_id}: no batch of at least {spec.min_batch} reports by the deadline"
                ) from None
            try:
                opened = self.analyzer.open_batch_bytes(data, spec, self.on_progress)
            except ShuffleDPError as exc:
                self.rejected_batches[exc.reason] += 1
                continue
            if opened.size < spec.min_batch:
                # Not the round's result: the round was accounted for min_batch reports, and a
                # short batch (say, one victim's report replayed alone) would void that claim.
                self.rejected_batches[BatchTooSmall.reason] += 1
                continue
            return RoundRecord(spec, opened, len(data))

    async def scalar_mean(self, config: ScalarMeanConfig, min_batch: int) -> ScalarMeanOutcome:
        """Algorithm 1 over the channel: range at eps0/2, then the projected mean at eps0/2."""
        first = await self.run_round(config.range_params(), config.round_epsilon, min_batch)
        found = estimate_range(first.opened.values[:, 0], first.opened.values[:, 1], config)
        second = await self.run_round(
            config.mean_params(found), config.round_epsilon, min_batch, delta0=config.delta0
        )
        mean = estimate_mean(second.opened.values[:, 0], second.spec.params)
        return ScalarMeanOutcome(found, mean, (first, second))
