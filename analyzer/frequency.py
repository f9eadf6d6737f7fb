"""Frequency oracles for k-ary data: decoders and exact variances.

Arrays in, length-``k`` unbiased estimates of the *fraction* of users holding each
symbol out. All variances are exact for fixed data (``n`` users with fixed symbols,
``f[x]`` the fraction holding ``x``); the only randomness is the mechanism's.

Block Hadamard response (client/hadamard_response.py; Acharya, Sun & Zhang 2019).
For a target symbol ``x`` (block ``j``, row ``r``) put ``W_i = [Y_i in block j]
H_b[r, Y_i mod b]`` in ``{-1, 0, +1}``. A user with ``x_i = x`` has ``E W_i = t``
(with probability ``t`` it lands in ``C_x``, where ``W = +1``; a uniform report on
``[K]`` has ``E W = 0``), and every other user has ``E W_i = 0`` (two different
rows of ``H_b`` agree on exactly half the positions, other blocks give 0). So

    fhat[x] = (1/(n t)) sum_i W_i

is unbiased, and ``sum_i W_i`` for all ``x`` of block ``j`` is one Hadamard
transform of block ``j``'s output histogram: all ``k`` estimates cost one
``bincount`` and ``B`` FWHTs of size ``b``, ``O(n + B b log b)``. In the paper's
terms ``sum_i W_i / n = 2 F_x - G_j`` with ``F_x`` the fraction of reports in
``C_x`` and ``G_j`` the fraction in block ``j``: the estimator is the solution of
the 2 x 2 linear relation ``E F_x = s/Z (1 + a (f_x + P_j)/2)``,
``E G_j = b/Z (1 + a P_j/2)`` (``P_j`` the block's mass, ``a = e^eps - 1``) for
``f_x`` with the block mass eliminated.

Exact variance: ``W_i^2 = [Y_i in block j]``, whose mean over users is
``(1 - t)/B + t P_j``, hence

    n Var(fhat[x]) = (1 - t)/(B t^2) + P_j/t - f[x].

With ``B = 1`` (``P_j = 1``) this is ``1/t^2 - f = c^2 - f``, ``c = (e^eps+1)/(e^eps-1)``,
the same as single-bit Hadamard response (:mod:`shuffledp.analyzer.decoders`).

k-RR: ``fhat = (F - q)/(p - q)`` with ``F`` the fraction of reports equal to ``x``;
``n Var = (q(1-q) + f (p(1-p) - q(1-q)))/(p - q)^2``, which for the ideal
``p = e^eps/(e^eps+k-1)`` is ``(e^eps + k - 2)/(e^eps - 1)^2 + f (k - 2)/(e^eps - 1)``.

OUE (Wang, Blocki, Li & Jha 2017, "Locally Differentially Private Protocols for
Frequency Estimation", USENIX Security): a ``k``-bit report, the true bit 1 with
probability 1/2, every other bit 1 with probability ``q ~ 1/(e^eps+1)``;
``fhat = (F - q)/(1/2 - q)``, ``n Var = (q(1-q) + f (1/4 - q(1-q)))/(1/2 - q)^2``, i.e.
``4 e^eps/(e^eps-1)^2 + f`` for the ideal ``q``. The randomizer here is a reference
for tests and benchmarks only: it costs ``O(n k)``.
"""

from __future__ import annotations

import math

import numpy as np

from shuffledp.client.hadamard_response import HadamardResponseParams
from shuffledp.client.krr import (
    as_symbol_array,
    check_domain_size,
    check_epsilon,
    dyadic_floor,
    krr_keep_probability,
)
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.hadamard import fwht
from shuffledp.protocol.mechanisms.randomness import RandomSource

__all__ = [
    "decode_hadamard_response",
    "decode_krr",
    "decode_krr_counts",
    "decode_oue",
    "hadamard_response_decode_counts",
    "hadamard_response_variance",
    "krr_variance",
    "oue_other_bit_probability",
    "oue_variance",
    "randomize_oue",
]


def _report_histogram(outputs: object, size: int, name: str = "outputs") -> np.ndarray:
    """``bincount`` of integer reports, each of which must lie in ``[0, size)`` (one pass over the data)."""
    arr = np.asarray(outputs)
    if arr.ndim != 1:
        raise InvalidParameter(name, f"must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        raise InvalidParameter(name, "no reports to decode")
    if arr.dtype.kind not in "iu":
        raise InvalidParameter(name, f"must be integers, got dtype {arr.dtype}")
    if arr.dtype == np.uint64:
        if arr.max() >= size:
            raise InvalidParameter(name, f"every report must lie in [0, {size})")
        arr = arr.astype(np.int64)
    try:
        counts = np.bincount(arr, minlength=size)  # raises on a negative report
    except ValueError:
        raise InvalidParameter(name, f"every report must lie in [0, {size})") from None
    if counts.size != size:
        raise InvalidParameter(name, f"every report must lie in [0, {size})")
    return counts


def _check_counts(counts: object, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``counts`` of shape ``(..., size)``, non-negative; returns it and the per-row totals."""
    arr = np.asarray(counts)
    if arr.ndim < 1 or arr.shape[-1] != size:
        raise InvalidParameter("counts", f"last axis must have length {size}, got shape {arr.shape}")
    if arr.dtype.kind not in "iuf":
        raise InvalidParameter("counts", f"must be numeric, got dtype {arr.dtype}")
    if not np.all(arr >= 0):  # also rejects NaN
        raise InvalidParameter("counts", "must be non-negative")
    totals = arr.sum(axis=-1)
    if not np.all(totals > 0):
        raise InvalidParameter("counts", "no reports to decode")
    return arr, totals


def _frequencies(true_freqs: object, k: int) -> np.ndarray:
    f = np.asarray(true_freqs, dtype=np.float64)
    if f.shape != (k,):
        raise InvalidParameter("true_freqs", f"must have shape ({k},), got {f.shape}")
    if not np.all(f >= 0):
        raise InvalidParameter("true_freqs", "must be non-negative")
    return f


def _check_n(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InvalidParameter("n", f"must be an integer >= 1, got {n!r}")
    return int(n)


# --------------------------------------------------------------------------
# Block Hadamard response
# --------------------------------------------------------------------------


def hadamard_response_decode_counts(counts: np.ndarray, params: HadamardResponseParams) -> np.ndarray:
    """Unbiased frequency estimates from a histogram of reports (``counts[y]`` = #reports ``y``).

    ``counts`` has shape ``(K,)`` or ``(..., K)`` (one estimate per leading index); the
    number of reports is its sum along the last axis. Histograms of disjoint chunks
    add, so a streaming caller can accumulate ``bincount``s and decode once. Integer
    counts are transformed exactly (int64 FWHT); only the final scaling rounds.
    """
    big_b, b = params.blocks, params.block_size
    arr, totals = _check_counts(counts, params.output_size)
    lead = arr.shape[:-1]
    transformed = fwht(arr.reshape(*lead, big_b, b))  # [..., j, r] = sum_v H_b[r, v] counts[j b + v]
    rows = params.rows_per_block
    # symbol x = (r - 1) B + j sits at [j, r]; rows 1..rows of every block, in x order
    sums = np.swapaxes(transformed[..., 1 : rows + 1], -1, -2).reshape(*lead, rows * big_b)[..., : params.k]
    scale = 1.0 / (np.asarray(totals, dtype=np.float64) * params.informative_probability)
    return sums * scale[..., None]


def decode_hadamard_response(outputs: np.ndarray, params: HadamardResponseParams) -> np.ndarray:
    """Unbiased length-``k`` frequency estimates from the reports, in ``O(n + B b log b)``."""
    return hadamard_response_decode_counts(_report_histogram(outputs, params.output_size), params)


def hadamard_response_variance(true_freqs: np.ndarray, n: int, params: HadamardResponseParams) -> np.ndarray:
    """Exact per-symbol variance ``((1-t)/(B t^2) + P_j(x)/t - f[x]) / n`` for fixed data.

    ``P_j`` is the total fraction of users whose symbol is in block ``j = x mod B``.
    """
    f = _frequencies(true_freqs, params.k)
    n = _check_n(n)
    big_b = params.blocks
    t = params.informative_probability
    block_mass = np.bincount(np.arange(params.k) % big_b, weights=f, minlength=big_b)
    return ((1.0 - t) / (big_b * t * t) + block_mass[np.arange(params.k) % big_b] / t - f) / n


# --------------------------------------------------------------------------
# k-ary randomized response
# --------------------------------------------------------------------------


def decode_krr_counts(counts: np.ndarray, k: int, epsilon: float) -> np.ndarray:
    """Unbiased estimates ``(F - q)/(p - q)`` from a histogram of k-RR reports (shape ``(..., k)``)."""
    k = check_domain_size(k)
    p = krr_keep_probability(k, epsilon)
    q = (1.0 - p) / (k - 1)
    arr, totals = _check_counts(counts, k)
    fractions = arr / np.asarray(totals, dtype=np.float64)[..., None]
    return (fractions - q) / (p - q)


def decode_krr(outputs: np.ndarray, k: int, epsilon: float) -> np.ndarray:
    """Unbiased length-``k`` frequency estimates from k-RR reports, in ``O(n + k)``."""
    k = check_domain_size(k)
    return decode_krr_counts(_report_histogram(outputs, k), k, epsilon)


def krr_variance(true_freqs: np.ndarray, n: int, k: int, epsilon: float) -> np.ndarray:
    """Exact per-symbol variance ``(q(1-q) + f (p(1-p) - q(1-q))) / (n (p-q)^2)`` of :func:`decode_krr`."""
    k = check_domain_size(k)
    f = _frequencies(true_freqs, k)
    n = _check_n(n)
    p = krr_keep_probability(k, epsilon)
    q = (1.0 - p) / (k - 1)
    return (q * (1 - q) + f * (p * (1 - p) - q * (1 - q))) / (n * (p - q) ** 2)


# --------------------------------------------------------------------------
# Optimal unary encoding (reference implementation, O(n k))
# --------------------------------------------------------------------------


def oue_other_bit_probability(epsilon: float) -> float:
    """``q >= 1/(e^eps + 1)``, the probability that a non-true OUE bit is 1.

    ``1 - q`` is a multiple of ``2^-53`` at most ``e^eps/(e^eps+1)``; the randomizer
    draws the *zero* event with that probability, so every random source realises
    ``q`` exactly and the ratio ``(1 - q)/q`` stays at most ``e^eps``.
    """
    eps = check_epsilon(epsilon)
    zero = dyadic_floor(1.0 / (1.0 + math.exp(-eps)))
    if not zero > 0.5:
        raise InvalidParameter("epsilon", f"too small for OUE: {epsilon!r}")
    return 1.0 - zero


def randomize_oue(symbols: np.ndarray, k: int, epsilon: float, source: RandomSource) -> np.ndarray:
    """Optimal unary encoding for a batch of users: a bool array of shape ``(n, k)``.

    Reference only (``O(n k)`` draws and memory). Bit ``x_i`` of user ``i`` is 1 with
    probability 1/2, every other bit with probability :func:`oue_other_bit_probability`.
    Guarantee: ``eps``-LDP; two inputs change two bits' laws, with worst ratio
    ``(1/2)/q * (1-q)/(1/2) = (1-q)/q <= e^eps``.
    """
    k = check_domain_size(k)
    q = oue_other_bit_probability(epsilon)
    x = as_symbol_array(symbols, k)
    n = x.shape[0]
    true_bit = np.zeros((n, k), dtype=bool)
    true_bit[np.arange(n), x] = True
    zero_probability = np.where(true_bit, 0.5, 1.0 - q).ravel()
    zero = source.bernoulli(zero_probability, n * k)
    return ~zero.reshape(n, k)


def decode_oue(reports: np.ndarray, epsilon: float) -> np.ndarray:
    """Unbiased estimates ``(F - q)/(1/2 - q)`` from OUE reports of shape ``(n, k)``."""
    arr = np.asarray(reports)
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise InvalidParameter("reports", f"must have shape (n >= 1, k), got {arr.shape}")
    q = oue_other_bit_probability(epsilon)
    return (arr.mean(axis=0, dtype=np.float64) - q) / (0.5 - q)


def oue_variance(true_freqs: np.ndarray, n: int, epsilon: float) -> np.ndarray:
    """Exact per-symbol variance ``(q(1-q) + f (1/4 - q(1-q))) / (n (1/2 - q)^2)`` of :func:`decode_oue`."""
    f = np.asarray(true_freqs, dtype=np.float64)
    if f.ndim != 1 or not np.all(f >= 0):
        raise InvalidParameter("true_freqs", "must be a one-dimensional array of non-negative fractions")
    n = _check_n(n)
    q = oue_other_bit_probability(epsilon)
    return (q * (1 - q) + f * (0.25 - q * (1 - q))) / (n * (0.5 - q) ** 2)
