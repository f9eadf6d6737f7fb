"""k-ary randomized response (k-RR), and input helpers shared by the k-ary randomizers.

Mechanism (Warner 1965; in this k-ary form e.g. Kairouz, Bonawitz & Ramage 2016 and
Wang, Blocki, Li & Jha 2017, "Locally Differentially Private Protocols for Frequency
Estimation", USENIX Security, where it is called direct encoding): a user holding
``x in {0, ..., k-1}`` reports ``x`` with probability ``p`` and each of the other
``k - 1`` symbols with probability ``q = (1 - p)/(k - 1)``, where ideally
``p = e^eps / (e^eps + k - 1)``.

Guarantee: pure ``eps``-LDP. Every output ``y`` has probability ``p`` under one input
and ``q`` under every other, so the worst likelihood ratio is ``p/q = (k-1) p/(1-p)``,
which increases with ``p`` and equals ``e^eps`` at the ideal value.

The probability actually used is :func:`krr_keep_probability`: the ideal ``p``
computed in floating point, lowered by a relative ``2^-48`` (far more than the few
ulps of rounding error in the float computation) and then rounded *down* to a
multiple of ``2^-53``. It is therefore never above the ideal value, so the realised
ratio is at most ``e^eps``; and, being a multiple of ``2^-53``, it is realised
*exactly* by both random sources (:class:`~shuffledp.protocol.mechanisms.randomness.SystemSource`
keeps ``floor(p 2^53)/2^53 = p``; :class:`~shuffledp.protocol.mechanisms.randomness.SeededSource`
uses ``ceil(p 2^53)/2^53 = p``). The decoder (:func:`shuffledp.analyzer.frequency.decode_krr`)
uses the same ``p``, so it is exactly unbiased for the mechanism as run.

Written once, vectorized over a batch of users against a RandomSource; a device calls
it with a batch of one. Imports only numpy and device-safe ``shuffledp.protocol``
modules.
"""

from __future__ import annotations

import math

import numpy as np

from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.local_params import check_domain_size, check_epsilon, dyadic_floor
from shuffledp.protocol.mechanisms.randomness import RandomSource

__all__ = [
    "as_symbol_array",
    "check_domain_size",
    "check_epsilon",
    "dyadic_floor",
    "krr_keep_probability",
    "randomize_krr",
]



def as_symbol_array(symbols: object, k: int) -> np.ndarray:
    """A one-dimensional int64 array of symbols, each in ``[0, k)``, else :class:`InvalidParameter`."""
    arr = np.asarray(symbols)
    if arr.ndim != 1:
        raise InvalidParameter("symbols", f"must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        raise InvalidParameter("symbols", f"must be integers, got dtype {arr.dtype}")
    if arr.min() < 0 or arr.max() >= k:
        raise InvalidParameter("symbols", f"every symbol must lie in [0, {k})")
    return arr.astype(np.int64, copy=False)


def krr_keep_probability(k: int, epsilon: float) -> float:
    """The probability ``p <= e^eps/(e^eps + k - 1)`` with which k-RR reports the true symbol.

    A multiple of ``2^-53`` at most the exact value (see the module docstring). Raises
    :class:`InvalidParameter` when ``epsilon`` is so small that the rounded ``p`` would
    not exceed ``1/k`` (the report would carry no information, and the estimator would
    divide by zero).
    """
    k = check_domain_size(k)
    eps = check_epsilon(epsilon)
    p = dyadic_floor(1.0 / (1.0 + (k - 1) * math.exp(-eps)))
    if not p * k > 1.0:
        raise InvalidParameter("epsilon", f"too small for k-RR over k = {k}: {epsilon!r}")
    return p


def randomize_krr(symbols: np.ndarray, k: int, epsilon: float, source: RandomSource) -> np.ndarray:
    """k-RR for a batch of users: int64 reports in ``[0, k)``.

    Each user keeps its symbol with probability :func:`krr_keep_probability` and
    otherwise reports a uniform draw among the ``k - 1`` other symbols (a uniform
    ``z`` in ``[0, k-1)`` shifted up by one when ``z >= x``). Draws: one
    ``integers(k - 1)`` then one ``bernoulli(p)`` per user.
    """
    k = check_domain_size(k)
    p = krr_keep_probability(k, epsilon)
    x = as_symbol_array(symbols, k)
    n = x.shape[0]
    other = source.integers(k - 1, n)
    keep = source.bernoulli(p, n)
    other = other + (other >= x)
    return np.where(keep, x, other).astype(np.int64)
