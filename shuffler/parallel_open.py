"""Opening envelopes' outer layers on several processes.

The shuffler's admission work is dominated by one HPKE open per envelope (the outer
layer). :class:`OuterLayerPool` spreads a burst of envelopes over ``workers``
processes holding the shuffler's X25519 private key
(:class:`~shuffledp.protocol.wire.key_workers.KeyWorkers`). Only the opening runs there:
every admission decision (credential, quota, replay, copies, capacity) stays in the
shuffler's process, in arrival order, so the result is the same as opening one by
one. A burst smaller than ``threshold`` is opened in the calling process, where a
process hop would cost more than it saves.
"""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from shuffledp.protocol.errors import ShuffleDPError
from shuffledp.protocol.wire.key_workers import KeyWorkers, worker_key
from shuffledp.protocol.wire.messages import RoundSpec
from shuffledp.protocol.wire.onion import EnvelopeOpener, OpenedFields

_worker_openers: dict[tuple[bytes, int], EnvelopeOpener] = {}


def _open_slice(spec: RoundSpec, items: list[bytes]) -> tuple[list[OpenedFields | None], dict[int, tuple]]:
    """Open each item: the opened fields of each in order (None where its opening failed), and the
    failures by position, ``("error", reason, message)`` or ``("bug", message)``."""
    key = (spec.session_id, spec.round_id)
    opener = _worker_openers.get(key)
    if opener is None:
        opener = _worker_openers[key] = EnvelopeOpener(worker_key(), spec)
    opened: list[OpenedFields | None] = []
    failures: dict[int, tuple] = {}
    for position, data in enumerate(items):
        try:
            opened.append(opener.open_fields(data))
        except ShuffleDPError as exc:
            opened.append(None)
            failures[position] = ("error", exc.reason, str(exc))
        except Exception as exc:  # a bug, not an input class: reported to the parent, counted there
            opened.append(None)
            failures[position] = ("bug", f"{type(exc).__name__}: {exc}")
    return opened, failures


class OpenedElsewhere(ShuffleDPError):
    """A typed refusal raised in a worker process, carried back with its reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class OpenerBug(Exception):
    """An untyped exception in a worker: a bug to fix, counted as ``internal-error``."""


#: Fewest envelopes of a burst opened on the workers by default; a smaller burst opens in the calling process.
WORKER_BURST = 256


class OuterLayerPool:
    """Opens bursts of a round's envelopes on ``workers`` processes (see the module docstring)."""

    def __init__(self, private: X25519PrivateKey, workers: int, *, threshold: int = WORKER_BURST) -> None:
        self.threshold = threshold
        self._workers = KeyWorkers(private, workers)

    def open_many(self, spec: RoundSpec, items: list[bytes]) -> list[OpenedFields | Exception]:
        """Each item's admission as ``(credential, nonce, sealed)`` (:meth:`EnvelopeOpener.open_fields`),
        or the exception its opening raised, in the items' order."""
        return self._admissions(spec, self._workers.map_slices(_open_slice, items, spec))

    async def open_many_async(self, spec: RoundSpec, items: list[bytes]) -> list[OpenedFields | Exception]:
        """:meth:`open_many` awaited: the shuffler's event loop serves other tasks while the workers open."""
        return self._admissions(spec, await self._workers.map_slices_async(_open_slice, items, spec))

    @staticmethod
    def _admissions(spec: RoundSpec, slices: list[tuple[list, dict[int, tuple]]]) -> list[OpenedFields | Exception]:
        out: list[OpenedFields | Exception] = []
        for opened, failures in slices:
            for position, failure in failures.items():
                opened[position] = OpenedElsewhere(failure[1], failure[2]) if failure[0] == "error" else OpenerBug(failure[1])
            out.extend(opened)
        return out

    def start(self) -> None:
        """Start the worker processes now rather than at the first large burst."""
        self._workers.start()

    def close(self) -> None:
        self._workers.close()
