"""Monte-Carlo summaries for comparing a private estimator with the non-private mean."""

from __future__ import annotations

import math

import numpy as np

from shuffledp.protocol.errors import InvalidParameter

__all__ = ["error_ratio"]


def error_ratio(private_errors: object, baseline_errors: object) -> tuple[float, float]:
    """``(R, se)``: ``R = mean(a) / mean(b)`` over paired trials and its standard error.

    a_t is the private estimator's l2 error in trial t, b_t the non-private mean's on the same
    data. Delta method for a ratio of paired means: ``R - R0 ~ mean(a - R0 b) / mean(b)``, so
    ``se = sd(a_t - R b_t) / (sqrt(S) mean(b))`` with the sample sd over S trials.
    """
    a = np.asarray(private_errors, dtype=np.float64)
    b = np.asarray(baseline_errors, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape or a.size < 2:
        raise InvalidParameter("errors", f"need two 1-D arrays of equal length >= 2, got {a.shape} and {b.shape}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b)) and b.mean() > 0):
        raise InvalidParameter("errors", "must be finite with a positive baseline mean")
    ratio = float(a.mean() / b.mean())
    resid = a - ratio * b
    se = float(resid.std(ddof=1) / (math.sqrt(a.size) * b.mean()))
    return ratio, se
