"""Exact wire sizes of a round's envelopes, for runs that skip serialization.

Reports are padded to one size per round (``protocol/wire/report_format.py``) and every
field of the outer layer has a fixed length (``protocol/wire/onion.py``), so every
envelope of a round has the same length, whatever its values: the fast path's
bytes on the wire are ``n`` times that length.
"""

from __future__ import annotations

from shuffledp.protocol.wire.onion import envelope_format


def envelope_bytes(mechanism: str, round_id: int) -> int:
    """Encoded size of every envelope of round ``round_id`` of ``mechanism``."""
    return envelope_format(round_id, mechanism).size


def total_envelope_bytes(mechanism: str, messages: int, round_id: int) -> int:
    """Total encoded size of ``messages`` envelopes of one round."""
    return envelope_bytes(mechanism, round_id) * messages
