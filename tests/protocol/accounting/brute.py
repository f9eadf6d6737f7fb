"""Brute-force references for the accounting tests (small n only, no shortcuts).

The shuffled view of n reports from a finite-output randomizer ``R[x, y]`` is the
histogram of outputs; its distribution is built by convolving users one at a time
on a dense array of counts, and hockey-stick divergences are summed directly.
"""

from __future__ import annotations

import itertools
import math

import numpy as np


def histogram_distribution(R: np.ndarray, inputs) -> np.ndarray:
    """Distribution of the output histogram (first ``d-1`` counts) of users with ``inputs``."""
    d = R.shape[1]
    N = len(inputs) + 1  # room for one more user
    D = np.zeros((N + 1,) * (d - 1))
    D[(0,) * (d - 1)] = 1.0
    for x in inputs:
        D = add_user(D, R[x])
    return D


def add_user(D: np.ndarray, row: np.ndarray) -> np.ndarray:
    d = len(row)
    new = row[d - 1] * D
    size = D.shape[0]
    for o in range(d - 1):
        src = [slice(None)] * (d - 1)
        dst = [slice(None)] * (d - 1)
        src[o] = slice(0, size - 1)
        dst[o] = slice(1, size)
        new[tuple(dst)] += row[o] * D[tuple(src)]
    return new


def hockey(P: np.ndarray, Q: np.ndarray, eps: float) -> float:
    E = math.exp(eps)
    return float(max(np.maximum(P - E * Q, 0).sum(), np.maximum(Q - E * P, 0).sum()))


def exact_round_delta(R: np.ndarray, x0: int, x1: int, others, eps: float) -> float:
    base = histogram_distribution(R, others)
    return hockey(add_user(base, R[x0]), add_user(base, R[x1]), eps)


def worst_dataset_delta(R: np.ndarray, n: int, eps_list, pairs=((0, 1),)):
    """max over every multiset of the other n-1 inputs (and the given input pairs)."""
    k = R.shape[0]
    best = {e: (0.0, None) for e in eps_list}
    for (x0, x1) in pairs:
        for others in itertools.combinations_with_replacement(range(k), n - 1):
            base = histogram_distribution(R, others)
            P, Q = add_user(base, R[x0]), add_user(base, R[x1])
            for e in eps_list:
                v = hockey(P, Q, e)
                if v > best[e][0]:
                    best[e] = (v, others)
    return best


def paper_variation_ratio_delta(eps: float, m: int, p: float, beta: float, q: float) -> float:
    """Wang et al.'s numerical bound as published: only the (a, b) counts of Q0/Q1 draws.

    Other users are Q0/Q1 clones with probability r = alpha p / q each; user 1 is
    Q0/Q1/uninformative with (p alpha, alpha, 1 - (p+1) alpha). Summed over all (a, b).
    """
    alpha = beta / (p - 1)
    r = alpha * p / q
    g = 1 - alpha - p * alpha
    T = np.zeros((m + 2, m + 2))
    for a in range(m + 1):
        for b in range(m + 1 - a):
            T[a, b] = math.exp(
                math.lgamma(m + 1) - math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(m - a - b + 1)
                + (a + b) * math.log(r) + (m - a - b) * math.log1p(-2 * r)
            )
    P = g * T.copy()
    Q = g * T.copy()
    P[1:, :] += p * alpha * T[:-1, :]
    P[:, 1:] += alpha * T[:, :-1]
    Q[1:, :] += alpha * T[:-1, :]
    Q[:, 1:] += p * alpha * T[:, :-1]
    return hockey(P, Q, eps)


def clone_pair_delta(eps: float, m: int, a0: float, a1: float, a2: float, r: float, r2: float) -> float:
    """Hockey-stick divergence of the (a, b, z) clone-count pair, by full enumeration."""
    rest = 1.0 - 2 * r - r2
    T = np.zeros((m + 2, m + 2, m + 2))
    for a in range(m + 1):
        for b in range(m + 1 - a):
            for z in range(m + 1 - a - b):
                if z and r2 == 0.0:
                    continue
                u = m - a - b - z
                logp = math.lgamma(m + 1) - math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(z + 1) - math.lgamma(u + 1)
                logp += (a + b) * math.log(r) + (z * math.log(r2) if z else 0.0) + (u * math.log(rest) if u else 0.0)
                T[a, b, z] = math.exp(logp)
    P = np.zeros_like(T)
    Q = np.zeros_like(T)
    P[1:, :, :] += a0 * T[:-1]
    P[:, 1:, :] += a1 * T[:, :-1]
    P[:, :, 1:] += a2 * T[:, :, :-1]
    Q[1:, :, :] += a1 * T[:-1]
    Q[:, 1:, :] += a0 * T[:, :-1]
    Q[:, :, 1:] += a2 * T[:, :, :-1]
    return hockey(P, Q, eps)
