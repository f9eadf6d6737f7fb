"""Parameter checks and exact dyadic probabilities shared by the local randomizers.

Device-safe (numpy and :mod:`shuffledp.protocol.errors` only), so that server-side code
(the accountant, the analyzer) can derive a randomizer's parameters exactly as a device
does without importing the client package. The randomizers' modules re-export these.
"""

from __future__ import annotations

import math

import numpy as np

from shuffledp.protocol.errors import InvalidParameter

__all__ = ["check_domain_size", "check_epsilon", "check_integer", "dyadic_floor"]

_TWO_53 = float(1 << 53)
# Relative margin taken off a float probability before rounding it down to the 2^-53
# grid: 2^-48 is 16 ulps, several times the rounding error of the few correctly- or
# faithfully-rounded operations (exp/expm1, +, *, /) used to compute it.
_MARGIN = 2.0**-48


def check_epsilon(epsilon: object) -> float:
    """``epsilon`` as a finite float ``> 0``, else :class:`InvalidParameter`."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.integer, np.floating)):
        raise InvalidParameter("epsilon", f"must be a real number, got {epsilon!r}")
    eps = float(epsilon)
    if not (eps > 0 and math.isfinite(eps)):
        raise InvalidParameter("epsilon", f"must be finite and > 0, got {epsilon!r}")
    return eps


def check_integer(name: str, value: object, minimum: int) -> int:
    """``value`` as an int ``>= minimum`` (bools refused), else :class:`InvalidParameter` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidParameter(name, f"must be an integer, got {value!r}")
    if value < minimum:
        raise InvalidParameter(name, f"must be >= {minimum}, got {value}")
    return int(value)


def check_domain_size(k: object) -> int:
    """``k`` as an int ``>= 2``, else :class:`InvalidParameter`."""
    return check_integer("k", k, 2)


def dyadic_floor(p: float) -> float:
    """``p (1 - 2^-48)`` rounded down to a multiple of ``2^-53`` (exact float arithmetic).

    For a probability ``p`` computed in floating point with a relative error well under
    ``2^-48``, the result is at most the exact value it approximates, and both random
    sources realise it exactly.
    """
    return math.floor(p * (1.0 - _MARGIN) * _TWO_53) / _TWO_53
