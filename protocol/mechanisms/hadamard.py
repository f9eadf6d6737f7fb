"""Sylvester–Hadamard matrices without materialising them.

``H_K`` (K a power of two) has entries ``H[j, v] = (-1)^popcount(j & v)``. It is
symmetric and ``H_K @ H_K = K I``, so ``H_K^{-1} = H_K / K``. The fast
Walsh–Hadamard transform (FWHT) computes ``x @ H_K`` (equivalently ``H_K @ x``,
by symmetry) along the last axis in O(K log K) additions per vector.

Used by Hadamard-response range estimation (Girgis, Data & Diggavi 2022,
Algorithm 4; Acharya, Sun & Zhang 2019) and, later, the random rotation
``U = H D / sqrt(d)`` of Algorithm 5.
"""

from __future__ import annotations

import numpy as np

from shuffledp.protocol.errors import InvalidParameter

def is_power_of_two(k: int) -> bool:
    return k >= 1 and (k & (k - 1)) == 0


def next_power_of_two(k: int) -> int:
    """The smallest power of two ``>= k`` (``k >= 1``)."""
    if k < 1:
        raise InvalidParameter("k", f"must be >= 1, got {k}")
    return 1 << (int(k) - 1).bit_length()


def popcount_parity(x: np.ndarray) -> np.ndarray:
    """Parity (0 or 1) of the number of set bits of each non-negative integer in ``x``."""
    return (np.bitwise_count(np.asarray(x)) & 1).astype(np.int8)


def hadamard_entry(j: np.ndarray | int | np.integer, v: np.ndarray | int | np.integer) -> np.ndarray:
    """``H[j, v] = (-1)^popcount(j & v)`` as int8 ±1, elementwise with broadcasting."""
    j_arr = np.asarray(j)
    v_arr = np.asarray(v)
    if (j_arr < 0).any() or (v_arr < 0).any():
        raise InvalidParameter("j, v", "Hadamard indices must be non-negative")
    return (1 - 2 * popcount_parity(np.bitwise_and(j_arr, v_arr))).astype(np.int8)


#: Elements per block of the transposed transform (two float64 buffers of 512 KiB: in cache).
_FWHT_BLOCK = 1 << 16
#: Last-axis sizes transformed in transposed blocks; others in place, row-major.
_FWHT_TRANSPOSED = (4, 1024)


def fwht(x: np.ndarray) -> np.ndarray:
    """Unnormalised fast Walsh–Hadamard transform along the last axis.

    Returns ``x @ H_K`` for ``x`` of shape ``(..., K)`` with K a power of two, in
    O(K log K) per vector, as a new float64 (or complex/int, preserving kind) array.
    Each of the log2(K) stages is one vectorized butterfly (``a + b``, ``a - b``) over
    the whole batch. For ``4 <= K <= 1024`` the vectors go through in blocks of
    :data:`_FWHT_BLOCK` elements, transposed so that each butterfly runs over long
    contiguous rows (the same additions in the same order: the same result, bit for bit).
    """
    x = np.asarray(x)
    kind = x.dtype.kind
    dtype = np.int64 if kind in "biu" else (x.dtype if kind == "c" else np.float64)
    k = x.shape[-1]
    if not is_power_of_two(k):
        raise InvalidParameter("x", f"last axis must be a power of two, got {k}")
    if _FWHT_TRANSPOSED[0] <= k <= _FWHT_TRANSPOSED[1]:
        return _fwht_transposed(x.reshape(-1, k), dtype).reshape(x.shape)
    return _fwht_in_place(np.array(x, dtype=dtype, copy=True))


def _fwht_in_place(a: np.ndarray) -> np.ndarray:
    """The butterflies on ``a`` itself, along its last axis, row-major."""
    k = a.shape[-1]
    lead = a.shape[:-1]
    h = 1
    while h < k:
        view = a.reshape(*lead, k // (2 * h), 2, h)
        top = view[..., 0, :].copy()
        bottom = view[..., 1, :]
        view[..., 0, :] += bottom
        np.subtract(top, bottom, out=view[..., 1, :])
        h *= 2
    return a


def _fwht_transposed(rows: np.ndarray, dtype) -> np.ndarray:
    """The transform of each row of ``rows`` (``(m, K)``), block by block: a block of rows is
    copied transposed (``(K, w)``) and the butterflies alternate between two such buffers."""
    m, k = rows.shape
    out = np.empty((m, k), dtype=dtype)
    block = max(1, _FWHT_BLOCK // k)
    buffers = np.empty((2, k, min(block, m)), dtype=dtype)
    for start in range(0, m, block):
        stop = min(m, start + block)
        a, b = buffers[0, :, : stop - start], buffers[1, :, : stop - start]
        a[...] = rows[start:stop].T
        h = 1
        while h < k:
            pairs = a.reshape(k // (2 * h), 2, h, -1)
            sums = b.reshape(k // (2 * h), 2, h, -1)
            np.add(pairs[:, 0], pairs[:, 1], out=sums[:, 0])
            np.subtract(pairs[:, 0], pairs[:, 1], out=sums[:, 1])
            a, b = b, a
            h *= 2
        out[start:stop] = a.T
    return out
