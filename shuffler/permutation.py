"""Uniform random permutations from the OS CSPRNG, vectorized.

Each item gets a 128-bit key from ``os.urandom`` and the items are sorted by key.
When all keys are distinct the induced order is exactly uniform over the n!
permutations (keys are i.i.d. uniform, so every ordering of distinct keys is equally
likely); a tie (probability below n^2 / 2^129) is detected and the keys redrawn, so
the output is exactly uniform. This sorts a million items in well under a second,
where a Python Fisher–Yates with ``secrets.randbelow`` would take several.
"""

from __future__ import annotations

import os

import numpy as np


def secure_permutation(n: int) -> np.ndarray:
    """A uniformly random permutation of ``range(n)`` drawn from the OS CSPRNG."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    while True:
        keys = np.frombuffer(os.urandom(16 * n), dtype=np.uint64).reshape(n, 2)
        order = np.lexsort((keys[:, 1], keys[:, 0]))
        sorted_keys = keys[order]
        if n < 2 or not np.any(np.all(sorted_keys[1:] == sorted_keys[:-1], axis=1)):
            return order
