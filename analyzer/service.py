"""The analyzer's party: its keys, signed round specs, and opening shuffled batches.

The analyzer signs every RoundSpec it announces (Ed25519) and is the only party
that can open reports (HPKE, bound to session and round). Opening is strict:
a payload of the wrong size, that fails to open, repeats an encapsulated key,
does not follow the round's report layout, or carries a value no honest
randomizer produces is rejected and counted by reason, never trusted and never
fatal.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from shuffledp.client.mechanisms import report_ranges
from shuffledp.protocol import codec
from shuffledp.protocol.errors import DuplicateReport, ShuffleDPError, UnknownRound, ValueOutOfRange
from shuffledp.protocol.messages import RoundSpec, ShuffledBatch, SignedRoundSpec
from shuffledp.protocol.report_format import WrongSize, batch_payloads, report_format
from shuffledp.protocol.sealing import ENCAPSULATED_KEY_BYTES, AnalyzerKeys, ReportOpener, sign

_log = logging.getLogger(__name__)
#: Rejection reason counted when opening meets an exception that is not a typed ShuffleDPError.
INTERNAL_ERROR = "internal-error"


@dataclass
class OpenedBatch:
    """Report values of one round as an ``(n, width)`` int64 array, and what was rejected."""

    values: np.ndarray
    rejected: Counter = field(default_factory=Counter)

    @property
    def size(self) -> int:
        return int(self.values.shape[0])


class Analyzer:
    """Holds the analyzer keys; signs specs and opens batches."""

    def __init__(self, keys: AnalyzerKeys | None = None) -> None:
        self.keys = keys if keys is not None else AnalyzerKeys.generate()

    def sign_spec(self, spec: RoundSpec) -> bytes:
        """The encoded :class:`SignedRoundSpec` for ``spec``."""
        spec_bytes = codec.encode(spec)
        return codec.encode(SignedRoundSpec(spec_bytes, sign(self.keys.signing_private, spec_bytes)))

    def open_batch(
        self, batch: ShuffledBatch, spec: RoundSpec, on_progress: Callable[[int], None] | None = None
    ) -> OpenedBatch:
        """Open and validate every payload of a decoded batch for ``spec``'s round (see :meth:`open_payloads`)."""
        if batch.session_id != spec.session_id or batch.round_id != spec.round_id:
            return _empty(spec, Counter({UnknownRound.reason: batch.size}))
        return self.open_payloads(batch.payloads, spec, on_progress)

    def open_batch_bytes(
        self, data: bytes, spec: RoundSpec, on_progress: Callable[[int], None] | None = None
    ) -> OpenedBatch:
        """Read an encoded batch by the round's fixed layout (bounded by ``spec.max_batch``), then open it.

        Raises :class:`MalformedMessage` for bytes that are not a batch of this round
        (the caller keeps waiting for a valid one); never anything untyped.
        """
        layout = report_format(spec.round_id, spec.mechanism)
        payloads = batch_payloads(data, spec.session_id, spec.round_id, layout.sealed_size, spec.max_batch)
        return self.open_payloads(payloads, spec, on_progress)

    def open_payloads(
        self, payloads: Sequence[bytes], spec: RoundSpec, on_progress: Callable[[int], None] | None = None
    ) -> OpenedBatch:
        """Open, de-duplicate and validate sealed payloads of ``spec``'s round.

        Each payload must be the round's fixed sealed size, open under the round's
        HPKE context, carry an encapsulated key not seen before in this batch (an
        honest client draws a fresh one per seal, so a repeat is a copy: the
        shuffler de-duplicates too, but the analyzer does not trust it to, and a
        batch may come from several shufflers), follow the round's report layout,
        and hold only values an honest randomizer can produce
        (:func:`~shuffledp.client.mechanisms.report_ranges`). Anything else is
        counted by reason and dropped; one report can therefore move an estimate
        by at most its bounded share. ``on_progress(k)`` is called every 1024
        payloads and for the rest at the end.
        """
        if len(payloads) > spec.max_batch:
            return _empty(spec, Counter({"too-large": len(payloads)}))
        layout = report_format(spec.round_id, spec.mechanism)
        sealed_size = layout.sealed_size
        read_values = layout.values
        open_one = ReportOpener(self.keys.hpke_private, spec.session_id, spec.round_id).open
        rejected: Counter = Counter()
        seen_keys: set[bytes] = set()
        rows: list[tuple[int, ...]] = []
        for index, sealed in enumerate(payloads, 1):
            if on_progress is not None and index % 1024 == 0:
                on_progress(1024)
            if not isinstance(sealed, bytes) or len(sealed) != sealed_size:
                rejected[WrongSize.reason] += 1
                continue
            try:
                plaintext = open_one(sealed)
                encapsulated = sealed[:ENCAPSULATED_KEY_BYTES]
                if encapsulated in seen_keys:
                    raise DuplicateReport("encapsulated key already seen in this batch")
                seen_keys.add(encapsulated)
                rows.append(read_values(plaintext))
            except ShuffleDPError as exc:
                rejected[exc.reason] += 1
            except Exception:  # a bug, not an input class: count it loudly, keep going
                rejected[INTERNAL_ERROR] += 1
                _log.exception("analyzer: untyped exception opening a %d-byte payload", len(sealed))
        if on_progress is not None:
            on_progress(len(payloads) % 1024)
        ranges = report_ranges(spec)
        values = np.array(rows, dtype=np.int64).reshape(len(rows), len(ranges))
        valid = np.ones(len(rows), dtype=bool)
        for column, allowed in enumerate(ranges):
            v = values[:, column]
            valid &= (v >= allowed.low) & (v <= allowed.high) & ((v - allowed.low) % allowed.stride == 0)
        if not valid.all():
            rejected[ValueOutOfRange.reason] += int((~valid).sum())
            values = values[valid]
        return OpenedBatch(values, rejected)


def _empty(spec: RoundSpec, rejected: Counter) -> OpenedBatch:
    width = len(report_ranges(spec))
    return OpenedBatch(np.empty((0, width), dtype=np.int64), rejected)
