"""Exact wire sizes of a round's envelopes, for runs that skip serialization.

Reports are padded to one size per round (``protocol/report_format.py``), so every
envelope of a round has the same length, whatever its values: the fast path's
bytes on the wire are ``n`` times that length.
"""

from __future__ import annotations

from shuffledp.protocol import codec
from shuffledp.protocol.messages import NONCE_BYTES, SESSION_ID_BYTES, TOKEN_BYTES, Envelope
from shuffledp.protocol.report_format import report_format


def envelope_bytes(mechanism: str, round_id: int) -> int:
    """Encoded size of every envelope of round ``round_id`` of ``mechanism``."""
    sealed = bytes(report_format(round_id, mechanism).sealed_size)
    zeros = bytes(SESSION_ID_BYTES)
    return len(codec.encode(Envelope(zeros, round_id, bytes(TOKEN_BYTES), bytes(NONCE_BYTES), sealed)))


def total_envelope_bytes(mechanism: str, messages: int, round_id: int) -> int:
    """Total encoded size of ``messages`` envelopes of one round."""
    return envelope_bytes(mechanism, round_id) * messages
