"""The analyzer's party: its keys, signed round specs, and opening shuffled batches.

The analyzer signs every RoundSpec it announces (Ed25519) and is the only party
that can open reports (HPKE, bound to session and round). Opening is strict:
a payload of the wrong size, that fails to open, repeats an encapsulated key,
does not follow the round's report layout, or carries a value no honest
randomizer produces is rejected and counted by reason, never trusted and never
fatal.

Batches arrive in signed chunks (:class:`~shuffledp.protocol.wire.messages.ShuffledBatch`);
a :class:`BatchOpening` opens them as they come, and with ``workers > 1`` spreads
the HPKE work over that many processes (the duplicate check stays in the parent,
so it spans the whole batch). With several shuffler instances a round has several
batches; the coordinator passes each completed batch the encapsulated keys the
round already counted, so the duplicate check spans the round
(:data:`CROSS_BATCH_DUPLICATE`).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Container, Sequence

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from shuffledp.client.mechanisms import report_ranges
from shuffledp.protocol.wire import codec
from shuffledp.protocol.errors import (
    INTERNAL_ERROR,
    DuplicateReport,
    MalformedMessage,
    ShuffleDPError,
    UnknownRound,
    ValueOutOfRange,
)
from shuffledp.protocol.wire.key_workers import KeyWorkers, worker_key
from shuffledp.protocol.wire.messages import (
    BatchAck,
    RoundSpec,
    ShuffledBatch,
    SignedRoundSpec,
)
from shuffledp.protocol.wire.onion import sign_spec_bytes, signed_encoding, verify_encoded, verify_signed
from shuffledp.protocol.wire.report_format import (
    BatchChunk,
    WrongSize,
    read_batch_chunk,
    report_format,
)
from shuffledp.protocol.wire.sealing import (
    ENCAPSULATED_KEY_BYTES,
    AnalyzerKeys,
    ReportOpener,
)

_log = logging.getLogger(__name__)


@dataclass
class OpenedBatch:
    """Report values of one round as an ``(n, width)`` int64 array, and what was rejected."""

    values: np.ndarray
    rejected: Counter = field(default_factory=Counter)

    @property
    def size(self) -> int:
        return int(self.values.shape[0])


#: Below this many payloads a chunk is opened in the calling process (a process hop costs more).
PARALLEL_THRESHOLD = 2048

#: The rejection reason of a report that opened in one batch of a round but whose HPKE
#: encapsulated key another batch of the same round already had counted: one sealing,
#: delivered by two shuffler instances (re-wrapped under a credential of each).
CROSS_BATCH_DUPLICATE = "duplicate-across-batches"


def _open_rows(
    private: X25519PrivateKey, session_id: bytes, round_id: int, spec_digest: bytes, mechanism: str, payloads: Sequence[bytes]
) -> tuple[list[tuple[bytes, tuple[int, ...]]], Counter]:
    """Open sealed payloads of one round (sizes already checked): ``(encapsulated key, values)`` of
    each that opened, in order, and the refusals by reason."""
    read_values = report_format(round_id, mechanism).values
    open_one = ReportOpener(private, session_id, round_id, spec_digest).open
    rows: list[tuple[bytes, tuple[int, ...]]] = []
    rejected: Counter = Counter()
    for sealed in payloads:
        try:
            rows.append((sealed[:ENCAPSULATED_KEY_BYTES], read_values(open_one(sealed))))
        except ShuffleDPError as exc:
            rejected[exc.reason] += 1
        except Exception:  # a bug, not an input class: count it loudly, keep going
            rejected[INTERNAL_ERROR] += 1
            _log.exception("analyzer: untyped exception opening a %d-byte payload", len(sealed))
    return rows, rejected


def _worker_open(session_id: bytes, round_id: int, spec_digest: bytes, mechanism: str, payloads: list[bytes]):
    return _open_rows(worker_key(), session_id, round_id, spec_digest, mechanism, payloads)


class BatchOpening:
    """Opens one round's batch incrementally: :meth:`add` each chunk's payloads, then :meth:`finish`.

    Each payload must be the round's fixed sealed size, open under the round's HPKE
    context, carry an HPKE encapsulated key not seen before among this batch's opened
    payloads (an honest client draws a fresh one per seal, so a repeat is a copy: the
    shuffler de-duplicates too, but the analyzer does not trust it to, and a batch may
    come from several shufflers; only payloads that open count, so junk with a copied
    key cannot knock out the real report), follow the round's report layout, and hold only values an honest
    randomizer can produce (:func:`~shuffledp.client.mechanisms.report_ranges`,
    checked in :meth:`finish`). Anything else is counted by reason and dropped, so one
    report can move an estimate by at most its bounded share.

    A round with several shuffler instances has one batch per instance, and a sealed
    report re-wrapped under a credential of each instance is admitted by both. So
    :meth:`finish` also takes the encapsulated keys that the round's batches completed
    before this one counted (``claimed``) and drops the rows that carry one of them
    (:data:`CROSS_BATCH_DUPLICATE`): the copy in the batch that completes first counts,
    every other is dropped. Only batches the round accepted claim keys, so a batch that
    is then refused cannot knock a report out of another. :attr:`counted` holds the
    keys of the rows :meth:`finish` returned.
    """

    def __init__(
        self,
        analyzer: "Analyzer",
        spec: RoundSpec,
        on_progress: Callable[[int], None] | None = None,
    ) -> None:
        self.analyzer = analyzer
        self.spec = spec
        self.sealed_size = report_format(spec.round_id, spec.mechanism).sealed_size
        self.on_progress = on_progress
        self.rejected: Counter = Counter()
        self.rows: list[tuple[int, ...]] = []
        #: The encapsulated key of each row, in the order of :attr:`rows`.
        self.keys: list[bytes] = []
        self._kept: np.ndarray | None = None
        self.received = 0
        self._seen_keys: set[bytes] = set()

    def add(self, payloads: Sequence[bytes]) -> None:
        spec = self.spec
        self.received += len(payloads)
        if self.received > spec.max_batch:
            raise MalformedMessage(f"batch holds more than the round's max_batch of {spec.max_batch}")
        sized: list[bytes] = []
        for sealed in payloads:
            if not isinstance(sealed, bytes) or len(sealed) != self.sealed_size:
                self.rejected[WrongSize.reason] += 1
                continue
            sized.append(sealed)
        # Duplicates are judged among payloads that *opened*: junk carrying a copy of a real
        # report's encapsulated key fails to open and so cannot knock the real one out.
        for rows, rejected in self.analyzer.open_rows(spec, sized):
            self.rejected.update(rejected)
            for encapsulated, values in rows:
                if encapsulated in self._seen_keys:
                    self.rejected[DuplicateReport.reason] += 1
                    continue
                self._seen_keys.add(encapsulated)
                self.rows.append(values)
                self.keys.append(encapsulated)
        if self.on_progress is not None:
            self.on_progress(len(payloads))

    def finish(self, claimed: Container[bytes] | None = None) -> OpenedBatch:
        """The batch's valid rows, less those whose encapsulated key is in ``claimed`` (the
        keys other batches of the round already counted), and the rejections by reason."""
        ranges = report_ranges(self.spec)
        values = np.array(self.rows, dtype=np.int64).reshape(len(self.rows), len(ranges))
        valid = np.ones(len(self.rows), dtype=bool)
        for column, allowed in enumerate(ranges):
            v = values[:, column]
            valid &= (v >= allowed.low) & (v <= allowed.high) & ((v - allowed.low) % allowed.stride == 0)
        rejected = Counter(self.rejected)
        if not valid.all():
            rejected[ValueOutOfRange.reason] += int((~valid).sum())
        if claimed is not None:
            copies = np.fromiter((key in claimed for key in self.keys), dtype=bool, count=len(self.keys))
            if copies.any():
                rejected[CROSS_BATCH_DUPLICATE] += int((copies & valid).sum())
                valid &= ~copies
        if not valid.all():
            values = values[valid]
        self._kept = valid
        return OpenedBatch(values, rejected)

    @property
    def counted(self) -> frozenset[bytes]:
        """The encapsulated keys of the rows :meth:`finish` returned."""
        if self._kept is None:
            raise RuntimeError("counted is known once the batch is finished")
        return frozenset(key for key, keep in zip(self.keys, self._kept.tolist()) if keep)


class Analyzer:
    """Holds the analyzer keys; signs specs and acknowledgements, and opens batches.

    ``workers`` processes open large chunks in parallel (``None``: one per CPU;
    ``1``: everything in this process). Call :meth:`close` to stop them.
    """

    def __init__(self, keys: AnalyzerKeys | None = None, *, workers: int | None = 1) -> None:
        self.keys = keys if keys is not None else AnalyzerKeys.generate()
        self.workers = max(1, workers if workers is not None else (os.cpu_count() or 1))
        self._pool: KeyWorkers | None = None

    def sign_spec(self, spec: RoundSpec) -> bytes:
        """The encoded :class:`SignedRoundSpec` for ``spec``."""
        spec_bytes = codec.canonical_encode(spec)  # what every party re-creates: see RoundSpec.digest
        return codec.encode(SignedRoundSpec(spec_bytes, sign_spec_bytes(self.keys.signing_private, spec_bytes)))

    def acknowledge(self, spec: RoundSpec, batch_id: bytes) -> bytes:
        """The encoded, signed :class:`BatchAck` of a batch this analyzer has opened."""
        return signed_encoding(self.keys.signing_private, BatchAck(spec.session_id, spec.round_id, spec.digest, batch_id, bytes(64)))

    def open_rows(self, spec: RoundSpec, payloads: list[bytes]):
        """Open de-duplicated, right-sized payloads; yields ``(rows, rejected)`` per slice (in parallel if large)."""
        if self.workers == 1 or len(payloads) < PARALLEL_THRESHOLD:
            yield _open_rows(self.keys.hpke_private, spec.session_id, spec.round_id, spec.digest, spec.mechanism, payloads)
            return
        yield from self._key_workers().map_slices(_worker_open, payloads, spec.session_id, spec.round_id, spec.digest, spec.mechanism)

    def start_workers(self) -> None:
        """Start the worker processes now (with ``workers`` > 1) rather than at the first large chunk."""
        if self.workers > 1:
            self._key_workers().start()

    def _key_workers(self) -> KeyWorkers:
        if self._pool is None:
            self._pool = KeyWorkers(self.keys.hpke_private, self.workers)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def open_batch(
        self, batch: ShuffledBatch, spec: RoundSpec, on_progress: Callable[[int], None] | None = None
    ) -> OpenedBatch:
        """Open a decoded single-chunk batch of ``spec``'s round, if the shuffler named in the spec signed it."""
        if batch.session_id != spec.session_id or batch.round_id != spec.round_id:
            return _empty(spec, Counter({UnknownRound.reason: batch.size}))
        verify_signed(spec.shuffler_signing_key, batch)
        if batch.chunks != 1:
            raise MalformedMessage("open_batch takes a whole batch in one chunk; use BatchOpening for chunks")
        return self.open_payloads(batch.payloads, spec, on_progress)

    def open_batch_bytes(
        self, data: bytes, spec: RoundSpec, on_progress: Callable[[int], None] | None = None
    ) -> OpenedBatch:
        """Read an encoded single-chunk batch by the round's fixed layout, check its signature, open it.

        Raises :class:`MalformedMessage` or :class:`BadSignature` for bytes that are not
        a signed whole batch of this round; never anything untyped.
        """
        chunk = read_signed_chunk(data, spec)
        if chunk.chunks != 1 or chunk.size != chunk.total:
            raise MalformedMessage("open_batch_bytes takes a whole batch in one chunk; use BatchOpening for chunks")
        return self.open_payloads(chunk.payloads, spec, on_progress)

    def open_payloads(
        self, payloads: Sequence[bytes], spec: RoundSpec, on_progress: Callable[[int], None] | None = None
    ) -> OpenedBatch:
        """Open, de-duplicate and validate sealed payloads of ``spec``'s round (see :class:`BatchOpening`)."""
        if len(payloads) > spec.max_batch:
            return _empty(spec, Counter({"too-large": len(payloads)}))
        opening = BatchOpening(self, spec, on_progress)
        opening.add(payloads)
        return opening.finish()


def read_signed_chunk(data: bytes, spec: RoundSpec) -> BatchChunk:
    """One batch chunk of ``spec``'s round, read by its fixed layout (bounded by ``max_batch``),
    if the shuffler the spec names signed it; :class:`MalformedMessage` or :class:`BadSignature`
    otherwise, at the cost of one hash before anything is opened."""
    layout = report_format(spec.round_id, spec.mechanism)
    chunk = read_batch_chunk(data, spec.session_id, spec.round_id, spec.digest, layout.sealed_size, spec.max_batch)
    verify_encoded(spec.shuffler_signing_key, ShuffledBatch, chunk.digest, chunk.signature)
    return chunk


def _empty(spec: RoundSpec, rejected: Counter) -> OpenedBatch:
    width = len(report_ranges(spec))
    return OpenedBatch(np.empty((0, width), dtype=np.int64), rejected)
