"""The analyzer's party: its keys, signed round specs, and opening shuffled batches.

The analyzer signs every RoundSpec it announces (Ed25519) and is the only party
that can open reports (HPKE, bound to session and round). Opening is strict:
a payload that fails to open, does not decode, belongs to another round or
mechanism, or carries out-of-range values is rejected and counted by reason,
never trusted and never fatal.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from shuffledp.protocol import codec
from shuffledp.protocol.errors import MalformedMessage, ShuffleDPError
from shuffledp.protocol.messages import (
    HadamardRangeParams,
    Report,
    RoundSpec,
    ShuffledBatch,
    SignedRoundSpec,
)
from shuffledp.protocol.sealing import AnalyzerKeys, open_sealed, sign


@dataclass
class OpenedBatch:
    """Report values of one round as an ``(n, width)`` int64 array, and what was rejected."""

    values: np.ndarray
    rejected: Counter = field(default_factory=Counter)

    @property
    def size(self) -> int:
        return int(self.values.shape[0])


def _check_values(spec: RoundSpec, report: Report) -> None:
    if report.round_id != spec.round_id or report.mechanism != spec.mechanism:
        raise MalformedMessage("report for another round or mechanism")
    params = spec.params
    if isinstance(params, HadamardRangeParams):
        if len(report.values) != 2:
            raise MalformedMessage("a range report has two values (row, bit)")
        row, bit = report.values
        if not 0 <= row < params.padded_bins or bit not in (-1, 1):
            raise MalformedMessage("range report out of range")
    elif len(report.values) != 1:
        raise MalformedMessage("a mean report has one value")


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
        """Open and validate every payload of a batch for ``spec``'s round.

        ``on_progress(k)`` is called as payloads are opened (every 1024, and the rest at the end).
        """
        rejected: Counter = Counter()
        if batch.session_id != spec.session_id or batch.round_id != spec.round_id:
            rejected["unknown-round"] += batch.size
            return OpenedBatch(np.empty((0, 0), dtype=np.int64), rejected)
        private = self.keys.hpke_private
        rows: list[tuple[int, ...]] = []
        for index, sealed in enumerate(batch.payloads, 1):
            if on_progress is not None and index % 1024 == 0:
                on_progress(1024)
            try:
                report = codec.decode(open_sealed(private, sealed, spec.session_id, spec.round_id), Report)
                _check_values(spec, report)
            except ShuffleDPError as exc:
                rejected[exc.reason] += 1
                continue
            rows.append(report.values)
        if on_progress is not None:
            on_progress(batch.size % 1024)
        width = 2 if isinstance(spec.params, HadamardRangeParams) else 1
        values = np.array(rows, dtype=np.int64).reshape(len(rows), width)
        return OpenedBatch(values, rejected)
