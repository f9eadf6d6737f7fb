"""Checks on a device's own data, before anything is randomized or charged.

A randomizer given NaN would project it silently (``np.clip`` keeps NaN, and a
NaN cast to an integer bin is undefined), so a device could send a report
computed from garbage. Every randomizer and the :class:`~shuffledp.client.Client`
pass their inputs through :func:`as_real_array` first, which refuses with a typed
:class:`~shuffledp.protocol.errors.InvalidParameter` anything that is not an
array of finite real numbers of the expected rank.
"""

from __future__ import annotations

import numpy as np

from shuffledp.protocol.errors import InvalidParameter


def as_real_array(values: object, name: str, ndim: int = 1) -> np.ndarray:
    """``values`` as a float64 array of rank ``ndim`` whose entries are all finite reals.

    Integers and floats are accepted; booleans, complex numbers, strings, objects,
    NaN and infinities are refused.
    """
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError, OverflowError) as exc:  # ragged nesting and the like
        raise InvalidParameter(name, f"is not an array of numbers ({type(exc).__name__})") from None
    if arr.dtype.kind not in "iuf":
        raise InvalidParameter(name, f"must hold real numbers, got dtype {arr.dtype}")
    if arr.ndim != ndim:
        raise InvalidParameter(name, f"must have {ndim} dimension(s), got shape {arr.shape}")
    arr = arr.astype(np.float64, copy=False)
    if not np.all(np.isfinite(arr)):
        raise InvalidParameter(name, "must be finite (no NaN or infinity)")
    return arr
