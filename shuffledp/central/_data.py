"""Input checks shared by the central estimators: per-user data to per-user means."""

from __future__ import annotations

import math
import numbers

import numpy as np

from shuffledp.protocol.errors import InvalidParameter


def user_means(data: object, samples_per_user: int | None = None) -> tuple[np.ndarray, int]:
    """``(means, m)``: the ``(n, d)`` per-user means and the samples per user.

    ``data`` is either ``(n, m, d)`` (user i's m samples; its mean is taken here) or
    ``(n, d)`` (already per-user means; ``samples_per_user`` says how many samples each
    averages, default 1). User-level privacy: everything downstream touches user i only
    through its mean, so replacing all of one user's samples changes one row.
    """
    if isinstance(data, np.ndarray) and data.dtype.kind not in "biuf":
        raise InvalidParameter("data", f"must be a real-valued array, got dtype {data.dtype}")
    try:
        arr = np.asarray(data, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidParameter("data", f"must be a real-valued array ({exc})") from None
    if arr.ndim == 3:
        if samples_per_user is not None and samples_per_user != arr.shape[1]:
            raise InvalidParameter("samples_per_user", f"{samples_per_user} disagrees with data.shape[1] = {arr.shape[1]}")
        if arr.shape[1] < 1:
            raise InvalidParameter("data", "every user needs at least one sample")
        m = arr.shape[1]
        means = arr.mean(axis=1)
    elif arr.ndim == 2:
        m = 1 if samples_per_user is None else samples_per_user
        if isinstance(m, bool) or not isinstance(m, numbers.Integral) or m < 1:
            raise InvalidParameter("samples_per_user", f"must be an integer >= 1, got {samples_per_user!r}")
        means = arr
    else:
        raise InvalidParameter("data", f"must have shape (n, d) or (n, m, d), got {arr.shape}")
    n, d = means.shape
    if n < 2:
        raise InvalidParameter("data", f"needs at least 2 users, got {n}")
    if d < 1:
        raise InvalidParameter("data", "dimension must be >= 1")
    if not np.all(np.isfinite(means)):
        raise InvalidParameter("data", "contains NaN or infinite values")
    return means, int(m)


def check_rng(rng: object) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise InvalidParameter("rng", f"must be a numpy Generator, got {type(rng).__name__}")
    return rng


def positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidParameter(name, f"must be a real number, got {value!r}")
    out = float(value)
    if not (math.isfinite(out) and out > 0.0):
        raise InvalidParameter(name, f"must be finite and > 0, got {value!r}")
    return out


def probability(name: str, value: object) -> float:
    out = positive(name, value)
    if not out < 1.0:
        raise InvalidParameter(name, f"must lie in (0, 1), got {value!r}")
    return out


def public_seed(rng: np.random.Generator) -> int:
    """A seed for a public random rotation, drawn from ``rng`` (independent of the data)."""
    return int(rng.integers(0, 2**63))


def _distances(x: np.ndarray, center: np.ndarray) -> np.ndarray:
    if not np.any(center):
        return np.sqrt(np.einsum("ij,ij->i", x, x))
    diff = x - center
    return np.sqrt(np.einsum("ij,ij->i", diff, diff))


def clip_to_ball(x: np.ndarray, center: np.ndarray, radius: float) -> tuple[np.ndarray, np.ndarray]:
    """Project each row of ``x`` onto the l2 ball ``B(center, radius)``; also return which rows moved.

    ``clip_{radius, center}(x) = center + (x - center) min(1, radius / ||x - center||)``.
    """
    norms = _distances(x, center)
    moved = norms > radius
    out = np.array(x, dtype=np.float64, copy=True)
    if moved.any():
        out[moved] = center + (x[moved] - center) * (radius / norms[moved])[:, None]
    return out, moved


def clipped_average(x: np.ndarray, center: np.ndarray, radius: float) -> tuple[np.ndarray, int]:
    """``mean_i clip_{radius, center}(x_i)`` and how many rows were clipped, without copying x.

    ``sum_i clip(x_i) = sum_i x_i - sum_{moved} (x_i - center)(1 - radius / ||x_i - center||)``.
    """
    norms = _distances(x, center)
    moved = norms > radius
    total = x.sum(axis=0)
    if moved.any():
        total -= ((x[moved] - center) * (1.0 - radius / norms[moved])[:, None]).sum(axis=0)
    return total / x.shape[0], int(moved.sum())
