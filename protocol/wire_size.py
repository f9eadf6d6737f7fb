"""Exact wire sizes of reports, for runs that skip serialization.

An envelope's size depends only on the encoded report's size (HPKE adds a fixed
32-byte encapsulated key and 16-byte tag) and CBOR's integer widths, so encoding
one envelope with the widest values a round can produce gives an upper bound per
message.
"""

from __future__ import annotations

import numpy as np

from shuffledp.protocol import codec
from shuffledp.protocol.messages import NONCE_BYTES, SESSION_ID_BYTES, TOKEN_BYTES, Envelope, Report

HPKE_OVERHEAD = 32 + 16  # X25519 encapsulated key + Poly1305 tag


def envelope_bytes(mechanism: str, values: tuple[int, ...], round_id: int = 2**32) -> int:
    """Encoded size of an envelope carrying a sealed report with these values."""
    report = codec.encode(Report(round_id, mechanism, values))
    sealed = bytes(len(report) + HPKE_OVERHEAD)
    zeros = bytes(SESSION_ID_BYTES)
    return len(codec.encode(Envelope(zeros, round_id, bytes(TOKEN_BYTES), bytes(NONCE_BYTES), sealed)))


def cbor_int_width(values) -> "np.ndarray":
    """Bytes CBOR needs for each integer (RFC 8949 section 3.1: 1, 2, 3, 5 or 9)."""
    v = np.asarray(values, dtype=np.int64)
    magnitude = np.where(v < 0, -1 - v, v).astype(np.uint64)
    limits = np.array([24, 256, 65536, 2**32], dtype=np.uint64)
    widths = np.array([1, 2, 3, 5, 9])
    return widths[np.searchsorted(limits, magnitude, side="right")]


def total_envelope_bytes(mechanism: str, values: "np.ndarray", round_id: int) -> int:
    """Exact total encoded size of envelopes carrying reports ``values`` (shape ``(n, width)``).

    Reports whose integers have the same CBOR widths encode to the same size, so
    one envelope is encoded per distinct width pattern and multiplied by its count.
    """
    widths = cbor_int_width(values)
    patterns, counts = np.unique(widths.reshape(len(widths), -1), axis=0, return_counts=True)
    representative = {1: 0, 2: 24, 3: 256, 5: 65536, 9: 2**32}
    return int(
        sum(
            envelope_bytes(mechanism, tuple(representative[int(w)] for w in pattern), round_id) * int(count)
            for pattern, count in zip(patterns, counts)
        )
    )
