"""The worst dataset of a shuffled round, by exhaustive exact search at small n.

The central ``(eps, delta)`` of a shuffled round is a maximum over neighbouring datasets
``D ~ D'`` (user 1's input changes from ``a`` to ``b``, the other ``n - 1`` inputs fixed;
``n`` public). For one dataset the analyst sees the histogram of the ``n`` reports; its law
is the convolution of the users' report laws (a sum of independent one-hot vectors), and

    eps_D(delta) = min { eps >= 0 : D_{e^eps}(P || Q) <= delta and D_{e^eps}(Q || P) <= delta },
    D_E(P || Q)  = sum_h (P(h) - E Q(h))_+,

``P``, ``Q`` the histogram laws with user 1 at ``a`` and at ``b``. The round's exact epsilon
is ``max_D eps_D(delta)``. :func:`search` computes ``eps_D`` for *every* dataset up to the
symmetries below and reports the worst; :func:`dataset_epsilon` evaluates one dataset.

**Report laws** (reproduced from ``client/``; ``tests/studies/test_worst_dataset.py``
samples the randomizers and checks them against these matrices):

* *One-bit Hadamard response* (:func:`hadamard_law`, ``client/range_randomizer.py``,
  Girgis, Data & Diggavi 2022, Alg. 4): input column ``x`` of the ``K x K`` Sylvester
  matrix; row ``j`` uniform on ``[K]``, bit ``H[j, x]`` kept with the client's
  ``p = keep_probability(eps0)`` (a double at most ``e^eps0/(e^eps0+1)``; the ideal value
  can be passed instead). Row 0 is constant, so ``(0, +1)`` and ``(0, -1)`` have
  probabilities ``p/K`` and ``(1-p)/K`` under every input: given "row 0" the bit does not
  depend on the input, so merging the two into one output (``1/K``) is a sufficient
  statistic and loses nothing (the merged histogram plus independent coin flips with a
  known law reproduces the full one). Outputs: row 0, then ``(j, +1), (j, -1)`` for
  ``j = 1..K-1``: ``2K - 1`` outputs. ``K`` a power of two; every entry is exact in
  binary floating point (``p/K``, ``(1-p)/K`` with ``1 - p`` exact by Sterbenz's lemma).
* *Projected discrete-Laplace mean report* (:func:`laplace_law`,
  ``client/mean_randomizer.py``, Girgis et al. 2022, Alg. 2 / Remark 3): grid input
  ``u in {0..G}``, report ``u + N`` with ``P(N = k) = c r^|k|``, ``r = exp(-eps0/G)``,
  ``c = (1-r)/(1+r)``, clamped to ``[-B, G + B]``. For ``y <= 0`` every input puts
  ``c r^(u - y)`` on ``y``: the same shape in ``y`` for every ``u``, so ``clip(y, 0, G)`` is
  sufficient (clamping at ``+-B`` is inside the merged classes and changes nothing).
  Outputs ``0..G`` with ``R(u)(0) = r^u/(1+r)``, ``R(u)(G) = r^(G-u)/(1+r)``,
  ``R(u)(y) = c r^|y-u|`` in between. An input between grid points is randomized-rounded:
  a mixture of two grid inputs with the same mixture for both neighbours' other users,
  so by joint convexity of the hockey-stick divergence grid datasets include the worst.
  Entries are computed in 60-digit arithmetic (mpmath) and rounded once.

A sufficient reduction of each report is also sufficient for the histogram: given the
reduced histogram, the full one is the reduced one refined by independent draws whose law
does not depend on the dataset. So the divergences are those of the full views, exactly.

**Symmetry reductions** (each proved or checked, never assumed):

* *Permutations of the other users*: the histogram law depends on the others' inputs only
  through their multiset (the convolution is commutative), so datasets are the count
  vectors ``S`` of the others (``C(n - 1 + k - 1, k - 1)`` of them for ``k`` inputs).
* *Both directions at once*: ``eps_D`` above is the maximum over the two directions, so
  the pair ``{a, b}`` is unordered.
* *Input relabelings*: a permutation ``sigma`` of the inputs is a symmetry if there is an
  output permutation ``pi`` with ``R(sigma x)(pi y) = R(x)(y)`` for all ``x, y``: then the
  dataset ``sigma D`` has the histogram law of ``D`` with outputs relabelled by ``pi``, and
  the same divergences. :func:`symmetry_group` *finds* every such ``sigma`` by checking
  all ``k!`` permutations against the law's exact value pattern (``ReportLaw.keys``: equal
  keys are equal exact values by construction, so every permutation found is a symmetry
  of the exact law). For Hadamard response this finds the affine group ``AGL(m, 2)`` of
  ``Z_2^m`` (``K = 2^m``; translations ``x -> x xor t`` flip the bit on the rows where
  ``H[j, t] = -1``, linear maps ``x -> A x`` move row ``j`` to ``A^-T j``): all 24
  permutations at ``K = 4``, 1344 of the 40320 at ``K = 8``. For the Laplace report it
  finds the reflection ``u -> G - u`` (``y -> G - y``), and for ``G = 1`` (binary RR) the swap.
* Pairs are taken one per orbit of the group on unordered pairs; for each, the count
  vectors ``S`` one per orbit of the pair's setwise stabilizer (the lexicographically
  largest image). The orbit sizes are kept; their weighted total is checked to equal the
  number of (pair, multiset) datasets.

**Arithmetic and its error** (float64, every error bounded): the histogram laws are built
by adding one user at a time (``new[h + e_y] += R(x)(y) old[h]``), sums of non-negative
terms, so each probability has relative error at most
``eta = ((1 + eps_R)(1 + u)^d)^n - 1`` (``u = 2^-53``, ``d`` outputs, ``eps_R`` the
entries' own relative error). Outcomes are sorted by ``P/Q`` and ``D_E`` is piecewise
linear in ``E`` between consecutive ratios, so ``eps_D`` is solved exactly on the right
segment from prefix sums (sequential, relative error ``gamma_S`` over ``S`` outcomes).
With ``kappa = eta + gamma_S + 4u`` the computed divergence is within ``kappa (1 + E)``
of the exact one at every ``E``, and ``E <= e^eps0`` (a shuffle of ``eps0``-LDP reports is
``eps0``-DP), so :class:`DatasetEpsilon` carries a certified interval
``[lower, upper]``: the solutions at ``delta +- kappa (1 + e^eps0)``.

References: Balle, Bell, Gascon & Nissim, CRYPTO 2019 (shuffle model, replace-one
neighbours, the hockey-stick divergence); Girgis, Data & Diggavi, "Distributed user-level
private mean estimation", ISIT 2022 (the two reports). ``docs/accounting.md`` ("The worst
dataset at small n") states the finding; ``benchmarks/bench_worst_dataset.py`` makes the table.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Sequence

import numpy as np

from shuffledp.protocol.errors import InvalidParameter

_U = 2.0**-53
Progress = Callable[[str], None]


# --------------------------------------------------------------------------
# Report laws
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportLaw:
    """A finite report law: ``probabilities[x, y] = R(x)(y)`` (rows sum to 1).

    ``keys[x, y]`` are integers with equal keys only where the exact values are equal (the
    symmetry search uses them); ``relative_error`` bounds each float entry's relative error
    against the exact value; ``epsilon0`` is the report's pure LDP level.
    """

    name: str
    probabilities: np.ndarray
    keys: np.ndarray
    relative_error: float
    epsilon0: float

    @property
    def inputs(self) -> int:
        return self.probabilities.shape[0]

    @property
    def outputs(self) -> int:
        return self.probabilities.shape[1]


def hadamard_law(epsilon0: float, K: int, keep: float | None = None) -> ReportLaw:
    """One-bit Hadamard response over ``K`` columns, row 0 merged (module docstring).

    ``keep`` defaults to the client's ``keep_probability(epsilon0)``; pass
    ``e^eps0/(e^eps0+1)`` for the ideal mechanism (the client's is a post-processing of it).
    """
    from shuffledp.client.range_randomizer import keep_probability

    K = int(K)
    if K < 2 or K & (K - 1):
        raise InvalidParameter("K", f"must be a power of two >= 2, got {K!r}")
    p = keep_probability(epsilon0) if keep is None else float(keep)
    if not 0.5 <= p < 1.0:
        raise InvalidParameter("keep", f"must be in [1/2, 1), got {p!r}")
    q = 1.0 - p  # exact (Sterbenz)
    R = np.empty((K, 2 * K - 1))
    keys = np.empty((K, 2 * K - 1), dtype=np.int64)
    R[:, 0], keys[:, 0] = 1.0 / K, 0
    for x in range(K):
        for j in range(1, K):
            sign = 1 - 2 * ((j & x).bit_count() & 1)  # H[j, x]
            plus, minus = (p, q) if sign == 1 else (q, p)
            R[x, 2 * j - 1], R[x, 2 * j] = plus / K, minus / K
            keys[x, 2 * j - 1], keys[x, 2 * j] = (1, 2) if sign == 1 else (2, 1)
    return ReportLaw(f"hadamard-response(K={K})", R, keys, 0.0, float(epsilon0))


def laplace_law(epsilon0: float, G: int) -> ReportLaw:
    """Projected discrete-Laplace report on grid ``0..G``, reports clipped to ``[0, G]`` (sufficient)."""
    import mpmath

    G = int(G)
    if G < 1:
        raise InvalidParameter("grid_levels", f"must be >= 1, got {G!r}")
    if not (math.isfinite(epsilon0) and epsilon0 > 0):
        raise InvalidParameter("epsilon0", f"must be finite and > 0, got {epsilon0!r}")
    with mpmath.workprec(200):
        e0 = mpmath.mpf(Fraction(epsilon0).numerator) / Fraction(epsilon0).denominator  # exact
        r = mpmath.exp(-e0 / G)
        c = (1 - r) / (1 + r)
        end = 1 / (1 + r)
        R = np.empty((G + 1, G + 1))
        keys = np.empty((G + 1, G + 1), dtype=np.int64)
        for u in range(G + 1):
            for y in range(G + 1):
                if y == 0 or y == G:
                    e = u if y == 0 else G - u
                    value, keys[u, y] = end * r**e, (G + 1) + e
                else:
                    e = abs(y - u)
                    value, keys[u, y] = c * r**e, e
                R[u, y] = float(value)
    # 200-bit values rounded once to double: relative error at most 2^-53 (+ 2^-190).
    return ReportLaw(f"laplace-report(G={G})", R, keys, 2.0**-52, float(epsilon0))


# --------------------------------------------------------------------------
# Symmetries and dataset orbits
# --------------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _permutations(k: int) -> np.ndarray:
    return np.array(list(itertools.permutations(range(k))), dtype=np.int64).reshape(-1, k)


def symmetry_group(law: ReportLaw) -> np.ndarray:
    """Every input permutation ``sigma`` (rows: ``sigma[x]``) with an output permutation ``pi``
    such that ``R(sigma x)(pi y) = R(x)(y)``, found on the exact value pattern ``keys``.

    ``sigma`` qualifies iff the multiset of columns of ``keys[sigma, :]`` equals that of
    ``keys``: then a matching ``pi`` pairs equal columns. Checks all ``k!`` permutations.
    """
    keys = law.keys
    k = keys.shape[0]
    base = int(keys.max()) + 1
    weights = base ** np.arange(k, dtype=np.int64)
    if base ** k >= 2**62:
        raise InvalidParameter("law", "too many distinct values to encode the columns")
    reference = np.sort(weights @ keys)
    perms = _permutations(k)
    found = []
    for chunk in np.array_split(perms, max(1, len(perms) // 4096)):
        codes = np.sort(np.einsum("x,pxy->py", weights, keys[chunk]), axis=1)
        found.append(chunk[(codes == reference).all(axis=1)])
    return np.concatenate(found)


def _codes(counts: np.ndarray, radix: int) -> np.ndarray:
    """Lexicographic integer code of count vectors (first input most significant)."""
    k = counts.shape[-1]
    return counts @ (radix ** np.arange(k - 1, -1, -1, dtype=np.int64))


def pair_orbits(group: np.ndarray, k: int) -> list[tuple[tuple[int, int], int, np.ndarray]]:
    """``[(pair, orbit size, setwise stabilizer)]``, one unordered pair ``a < b`` per orbit."""
    seen: set[tuple[int, int]] = set()
    out = []
    for a, b in itertools.combinations(range(k), 2):
        if (a, b) in seen:
            continue
        images = {(min(int(g[a]), int(g[b])), max(int(g[a]), int(g[b]))) for g in group}
        seen |= images
        stab = group[((group[:, a] == a) & (group[:, b] == b)) | ((group[:, a] == b) & (group[:, b] == a))]
        out.append(((a, b), len(images), stab))
    return out


def multisets(m: int, k: int) -> np.ndarray:
    """Every multiset of ``m`` inputs from ``k``, as sorted tuples in lexicographic order (rows)."""
    rows = list(itertools.combinations_with_replacement(range(k), m))
    return np.array(rows, dtype=np.int64).reshape(len(rows), m)


def canonical_multisets(m: int, k: int, stabilizer: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Multisets of ``m`` inputs one per orbit of ``stabilizer``: ``(sorted tuples, orbit sizes)``.

    A count vector ``S`` is kept iff its code is the largest among its images
    ``S'[g x] = S[x]``; its orbit size is the number of distinct images.
    """
    tuples = multisets(m, k)
    counts = np.zeros((len(tuples), k), dtype=np.int64)
    for col in range(m):
        np.add.at(counts, (np.arange(len(tuples)), tuples[:, col]), 1)
    inverse = np.argsort(stabilizer, axis=1)
    images = np.stack([_codes(counts[:, inv], m + 1) for inv in inverse], axis=1)
    own = _codes(counts, m + 1)
    keep = own == images.max(axis=1)
    srt = np.sort(images[keep], axis=1)
    sizes = 1 + (np.diff(srt, axis=1) != 0).sum(axis=1)
    return tuples[keep], sizes


# --------------------------------------------------------------------------
# Histogram laws
# --------------------------------------------------------------------------


class HistogramSpace:
    """Histograms of ``m <= n_max`` reports over ``d`` outputs, ranked, with the index maps
    ``step[m][y]``: the rank in level ``m + 1`` of each level-``m`` histogram plus one report ``y``."""

    def __init__(self, d: int, n_max: int) -> None:
        if (n_max + 1) ** d >= 2**63:
            raise InvalidParameter("n", f"histograms of {n_max} reports over {d} outputs are too many to rank")
        self.d, self.n_max = d, n_max
        self._weights = (n_max + 1) ** np.arange(d - 1, -1, -1, dtype=np.int64)
        self.levels = [self._level(m) for m in range(n_max + 1)]
        self.step = []
        for m in range(n_max):
            comps, codes_next = self.levels[m], self.levels[m + 1] @ self._weights
            own = comps @ self._weights
            self.step.append(np.stack([np.searchsorted(codes_next, own + self._weights[y]) for y in range(d)])
                             .astype(np.intp))

    def _level(self, m: int) -> np.ndarray:
        comps = _compositions(m, self.d)
        return comps[np.argsort(comps @ self._weights)]

    def size(self, m: int) -> int:
        return len(self.levels[m])


@functools.lru_cache(maxsize=256)
def _compositions(m: int, d: int) -> np.ndarray:
    if d == 1:
        return np.array([[m]], dtype=np.int64)
    parts = [np.column_stack([np.full(len(rest), v, dtype=np.int64), rest])
             for v in range(m + 1) for rest in (_compositions(m - v, d - 1),)]
    return np.concatenate(parts)


def add_users(space: HistogramSpace, law: np.ndarray, m: int, rows: np.ndarray) -> np.ndarray:
    """Laws (one per row of ``rows``) of the level-``m`` histogram ``law`` plus one report from that row."""
    out = np.zeros((rows.shape[0], space.size(m + 1)))
    for y in range(space.d):
        out[:, space.step[m][y]] += rows[:, y, None] * law
    return out


# --------------------------------------------------------------------------
# Epsilon of one pair of histogram laws
# --------------------------------------------------------------------------


def _one_direction(P: np.ndarray, Q: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """``E`` with ``sum (P - E Q)_+ = t`` for each target ``t`` (``E >= 1``; 1 where the divergence
    at ``E = 1`` is already <= t), solved on the linear segment between sorted ratios."""
    big = P > Q
    p, q = P[big], Q[big]
    if not len(p):
        return np.ones(len(targets))
    ratio = p / q
    order = np.argsort(ratio)[::-1]
    ratio, cp, cq = ratio[order], np.cumsum(p[order]), np.cumsum(q[order])
    prev_p, prev_q = np.concatenate([[0.0], cp[:-1]]), np.concatenate([[0.0], cq[:-1]])
    at_break = np.maximum.accumulate(prev_p - ratio * prev_q)  # divergence at E = ratio_j (ties add 0)
    j = np.searchsorted(at_break, targets, side="left")
    last = j == len(ratio)
    jj = np.minimum(j, len(ratio) - 1)
    sp = np.where(last, cp[-1], prev_p[jj])
    sq = np.where(last, cq[-1], prev_q[jj])
    with np.errstate(divide="ignore", invalid="ignore"):
        E = np.where(sq > 0, (sp - targets) / sq, ratio[0])
    return np.where(targets <= 0, ratio[0], np.maximum(E, 1.0))


def pair_epsilon(P: np.ndarray, Q: np.ndarray, deltas: Sequence[float], slack: float, epsilon0: float) -> np.ndarray:
    """``[central, lower, upper]`` epsilon per delta (rows), both directions: central from the
    computed laws, lower/upper at ``delta +- slack (1 + e^eps0)`` (module docstring: certified)."""
    d = np.asarray(deltas, dtype=np.float64)
    pad = slack * (1.0 + math.exp(epsilon0))
    targets = np.concatenate([d, d + pad, d - pad])
    E = np.maximum(_one_direction(P, Q, targets), _one_direction(Q, P, targets))
    eps = np.log(E).reshape(3, len(d)).T
    eps[:, 2] = np.where(d - pad <= 0, epsilon0, np.minimum(eps[:, 2], epsilon0))
    return eps


def error_slack(law: ReportLaw, n: int, outcomes: int) -> float:
    """``kappa = eta + gamma_S + 4u``: the computed divergence is within ``kappa (1 + E)`` of the exact one."""
    eta = ((1.0 + law.relative_error) * (1.0 + _U) ** law.outputs) ** n - 1.0
    gamma = outcomes * _U / (1.0 - outcomes * _U)
    return eta * (1.0 + 1e-6) + gamma + 4.0 * _U


# --------------------------------------------------------------------------
# One dataset, and the search
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetEpsilon:
    """One dataset: user 1 at ``pair[0]`` or ``pair[1]``, the others' input counts, and per delta the
    epsilon ``[central, lower, upper]`` (``lower <= exact <= upper``)."""

    pair: tuple[int, int]
    others: tuple[int, ...]
    epsilon: np.ndarray

    @property
    def homogeneous(self) -> int | None:
        """The input every other user holds, or None."""
        nonzero = [x for x, c in enumerate(self.others) if c]
        return nonzero[0] if len(nonzero) == 1 else None


def dataset_epsilon(law: ReportLaw, pair: tuple[int, int], others: Sequence[int], deltas: Sequence[float],
                    space: HistogramSpace | None = None) -> DatasetEpsilon:
    """Exact epsilon of one dataset (``others``: count of the other users at each input)."""
    others = tuple(int(c) for c in others)
    if len(others) != law.inputs or min(others) < 0:
        raise InvalidParameter("others", f"must be {law.inputs} non-negative counts, got {others!r}")
    m = sum(others)
    space = space or HistogramSpace(law.outputs, m + 1)
    base = np.ones(1)
    level = 0
    for x, c in enumerate(others):
        for _ in range(c):
            base = add_users(space, base, level, law.probabilities[[x]])[0]
            level += 1
    PQ = add_users(space, base, m, law.probabilities[list(pair)])
    slack = error_slack(law, m + 1, space.size(m + 1))
    return DatasetEpsilon((int(pair[0]), int(pair[1])), others, pair_epsilon(PQ[0], PQ[1], deltas, slack, law.epsilon0))


@dataclass
class SearchResult:
    """Every dataset orbit's epsilon for one law and n (module docstring)."""

    law: ReportLaw
    n: int
    deltas: tuple[float, ...]
    group_order: int
    pairs: np.ndarray  # (T, 2)
    others: np.ndarray  # (T, k) counts
    weights: np.ndarray  # (T,) orbit sizes (datasets represented)
    epsilon: np.ndarray  # (T, len(deltas), 3): central, lower, upper
    slack: float
    seconds: float = 0.0

    def datasets(self) -> int:
        return int(self.weights.sum())

    def entry(self, t: int) -> DatasetEpsilon:
        a, b = self.pairs[t]
        return DatasetEpsilon((int(a), int(b)), tuple(int(c) for c in self.others[t]), self.epsilon[t])

    def worst(self, i: int) -> DatasetEpsilon:
        """The dataset with the largest central epsilon at ``deltas[i]``."""
        return self.entry(int(np.argmax(self.epsilon[:, i, 0])))

    def worst_homogeneous(self, i: int) -> DatasetEpsilon:
        """Among datasets whose other users all hold one input, the largest central epsilon."""
        homog = (self.others > 0).sum(axis=1) <= 1
        idx = np.flatnonzero(homog)
        return self.entry(int(idx[np.argmax(self.epsilon[idx, i, 0])]))

    def exact_epsilon(self, i: int) -> tuple[float, float]:
        """Certified ``[lower, upper]`` on the round's exact epsilon at ``deltas[i]`` (max over datasets)."""
        return float(self.epsilon[:, i, 1].max()), float(self.epsilon[:, i, 2].max())


def search(law: ReportLaw, n: int, deltas: Sequence[float], progress: Progress | None = None) -> SearchResult:
    """Exact epsilon of every dataset of ``n`` users up to symmetry (module docstring)."""
    import time

    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise InvalidParameter("n", f"must be an integer >= 2, got {n!r}")
    if not deltas or not all(0 < d < 1 for d in deltas):
        raise InvalidParameter("deltas", f"must be in (0, 1), got {deltas!r}")
    start = time.perf_counter()
    k, m = law.inputs, n - 1
    group = symmetry_group(law)
    space = HistogramSpace(law.outputs, n)
    slack = error_slack(law, n, space.size(n))
    pairs, others, weights, eps = [], [], [], []
    for pair, pair_size, stab in pair_orbits(group, k):
        tuples, sizes = canonical_multisets(m, k, stab)
        if progress:
            progress(f"{law.name} n={n}: pair {pair}, {len(tuples)} datasets of the others")
        stack: list[np.ndarray] = [np.ones(1)]
        previous: tuple[int, ...] = ()
        rows = law.probabilities[list(pair)]
        for tup, size in zip(tuples, sizes):
            tup = tuple(int(v) for v in tup)
            common = 0
            while common < len(previous) and previous[common] == tup[common]:
                common += 1
            del stack[common + 1:]
            for level in range(common, m):
                stack.append(add_users(space, stack[level], level, law.probabilities[[tup[level]]])[0])
            previous = tup
            PQ = add_users(space, stack[m], m, rows)
            pairs.append(pair)
            others.append(np.bincount(np.array(tup, dtype=np.int64), minlength=k))
            weights.append(pair_size * int(size))
            eps.append(pair_epsilon(PQ[0], PQ[1], deltas, slack, law.epsilon0))
    total = math.comb(k, 2) * math.comb(m + k - 1, k - 1)
    result = SearchResult(law, n, tuple(float(d) for d in deltas), len(group), np.array(pairs, dtype=np.int64),
                          np.array(others, dtype=np.int64).reshape(len(others), k), np.array(weights),
                          np.array(eps), slack, time.perf_counter() - start)
    if result.datasets() != total:  # the orbits must cover every (pair, multiset) dataset once
        raise AssertionError(f"orbits cover {result.datasets()} datasets, expected {total}")
    return result
