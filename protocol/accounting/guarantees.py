"""Local guarantees declared by randomizers, and what each one lets the accountant use.

A :class:`LocalGuarantee` names the randomizer and its local parameters. From it the
accountant derives:

* the variation-ratio parameters ``(p, beta, q)`` of Wang et al. 2024
  (``p``: largest likelihood ratio between two inputs' output distributions;
  ``beta``: largest total-variation distance between them; ``q``: largest ratio
  between the output distribution of an input of the neighbouring pair and that of
  *any* input);
* the clone decomposition used by the corrected variation-ratio bound
  (:func:`variation_ratio_clone_pair`), with a mechanism-specific probability ``r2``
  that another user's report is a clone of user 1's uninformative part;
* whether the mechanism is in the class for which the stronger clone bound of
  Feldman, McMillan & Talwar (SODA 2023, after their errata) holds:
  ``R(x) >= (R(x0) + R(x1)) / (e^eps0 + 1)`` for all inputs ``x, x0, x1``.

Randomizers shuffledp ships (``p = e^eps0`` and ``q = e^eps0`` for all of them):

=====================  ===================================  ======================  =========
mechanism              beta (exact TV)                      Q2-clone prob ``r2``    strong
=====================  ===================================  ======================  =========
binary-rr              (e^e - 1)/(e^e + 1)                  (none: a2 = 0)          yes
hadamard-response      (e^e - 1)/(2 (e^e + 1))              a2 / q = 1/(2 e^e)       no
k-rr (k >= 3)          (e^e - 1)/(e^e + k - 1)              a2 = (k-2)/(e^e + k - 1) yes
block-hadamard-resp.   one pair per input-pair type, see :func:`block_hadamard_pair_types`   no
generic, laplace-mean  (e^e - 1)/(e^e + 1) (generic)        --                      no
=====================  ===================================  ======================  =========

Hadamard response (one bit): the output is ``(j, b)`` with ``j`` uniform over the K
rows of a Sylvester-Hadamard matrix and ``b = H[j, x]`` kept with probability
``rho = e^eps0/(e^eps0+1)``. Two distinct columns agree on exactly K/2 rows, where the
two inputs' output distributions coincide; on the other K/2 rows they differ by
``rho - (1 - rho)`` on each of the two bits, so
``TV = (1/2) (K/2) (2/K) (rho - (1-rho)) = (e^eps0 - 1)/(2 (e^eps0 + 1))``: half of
binary RR's. The decomposition has ``a2 = 1/2`` (user 1 lands on an agreeing row).
``r2``: on an agreeing row ``Q2`` puts ``2 rho / K`` on ``b = H[j, x0]``, and another
input may put only ``(1-rho)/K`` there, so ``r2 = (1-rho)/(2 rho) = 1/(2 e^eps0)``.
These numbers are checked by exact enumeration in the tests for K up to 16.

k-ary RR: ``Q0, Q1`` are the point masses on ``x0, x1`` and ``Q2`` is uniform on the
other ``k - 2`` values; every input puts at least ``1/(e^eps0+k-1)`` on every value,
so ``r = 1/(e^eps0+k-1)`` and ``r2 = (k-2)/(e^eps0+k-1)``.

Projected discrete-Laplace mean (``laplace-mean``): pure ``eps0``-LDP; its output
distributions are not in the stronger-clone class (for ``x`` far from ``x0`` and
``x1 = x0 + 1`` in grid units, ``R(x0) + R(x1)`` approaches ``2 e^eps0 R(x)`` in the tail),
and the corrected variation-ratio bound would need a supremum over all input pairs
(TV and ratio change with the pair), which we do not claim. It is therefore
accounted with the generic bounds (FMT21), valid for every pure eps0-LDP randomizer.

Gaussian mean reports (``gaussian-mean``) are only ``(eps0, delta0)``-LDP; see
:class:`AmplificationNotClaimed`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shuffledp.protocol.errors import InvalidParameter, ShuffleDPError

MECHANISMS = (
    "generic",
    "binary-rr",
    "hadamard-response",
    "block-hadamard-response",
    "k-rr",
    "laplace-mean",
    "gaussian-mean",
)


#: Largest domain size ``k`` and Hadamard size ``num_bins`` accepted: every integer up to it is
#: exact in floating point, which the bounds' arithmetic on ``k`` and ``K`` relies on.
MAX_DOMAIN_SIZE = 2**53


class AmplificationNotClaimed(ShuffleDPError, ValueError):
    """The accountant refuses to claim amplification by shuffling for this randomizer.

    Raised for approximate-DP randomizers (``delta0 > 0``, e.g. Gaussian mean reports).
    Every amplification bound implemented here (FMT21, stronger clone,
    variation-ratio, Girgis et al.'s RDP bound) is proved for *pure* ``eps0``-LDP
    randomizers. Extending them to ``(eps0, delta0)`` (FMT21 state such an extension)
    goes through replacing each report by a pure-DP surrogate that differs from it
    with probability up to ``delta0``, for *every* user, so the central delta picks up
    a term growing with ``n * delta0``; with ``delta0`` calibrated per report as
    shuffledp does, that term dominates, and we do not publish a number whose
    dominant term we have not implemented and tested. Account such rounds with their
    local guarantee (post-processing: the shuffled round is ``(eps0, delta0)``-DP) or
    switch to a pure-LDP randomizer (``laplace-mean``).
    """

    reason = "no-amplification"


def _check_epsilon0(eps: object) -> None:
    """``0 < epsilon0 <= 50`` (:class:`LocalGuarantee`'s range), else :class:`InvalidParameter`."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating, np.integer)):
        raise InvalidParameter("epsilon0", f"must be a number, got {eps!r}")
    if not (math.isfinite(eps) and eps > 0):
        raise InvalidParameter("epsilon0", f"must be finite and > 0, got {eps}")
    if eps > 50:
        raise InvalidParameter("epsilon0", f"must be <= 50 (e^eps0 overflows the numerics), got {eps}")


@dataclass(frozen=True)
class LocalGuarantee:
    """What a randomizer declares about one report.

    ``num_bins`` is the Hadamard size K (``hadamard-response``), ``k`` the domain
    size of k-ary randomized response (``k-rr``) or of block Hadamard response
    (``block-hadamard-response``, which also needs ``num_blocks`` = B); they are
    ignored otherwise. ``grid_levels`` (``laplace-mean`` only) is the report's grid size
    G; given, the round also gets the mechanism-specific privacy-blanket bound
    (:mod:`.blanket`), otherwise only the bounds that use ``epsilon0`` alone.

    Supported ranges (anything else raises :class:`InvalidParameter` here, before any work):
    ``0 < epsilon0 <= 50``; ``num_bins`` a power of two in ``[2, 2^53]``; ``k`` in
    ``[2, 2^53]`` (:data:`MAX_DOMAIN_SIZE`: integers that floating-point arithmetic holds
    exactly); ``grid_levels`` in ``[1, 2^24]``.
    """

    mechanism: str
    epsilon0: float
    delta0: float = 0.0
    num_bins: int | None = None
    k: int | None = None
    num_blocks: int | None = None
    grid_levels: int | None = None

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise InvalidParameter("mechanism", f"must be one of {', '.join(MECHANISMS)}; got {self.mechanism!r}")
        _check_epsilon0(self.epsilon0)
        d0 = self.delta0
        if not (isinstance(d0, (int, float, np.floating)) and 0 <= d0 < 1):
            raise InvalidParameter("delta0", f"must be in [0, 1), got {d0!r}")
        if self.mechanism == "gaussian-mean":
            if not d0 > 0:
                raise InvalidParameter("delta0", "a Gaussian report is only (eps0, delta0)-LDP with delta0 > 0")
        elif d0 != 0:
            raise InvalidParameter("delta0", f"{self.mechanism} is pure eps0-LDP; delta0 must be 0")
        if self.mechanism == "hadamard-response":
            K = self.num_bins
            if (isinstance(K, bool) or not isinstance(K, (int, np.integer)) or K < 2 or (K & (K - 1)) != 0
                    or K > MAX_DOMAIN_SIZE):
                raise InvalidParameter("num_bins", f"must be a power of two in [2, 2^53], got {K!r}")
        if self.mechanism in ("k-rr", "block-hadamard-response"):
            k = self.k
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 2 <= k <= MAX_DOMAIN_SIZE:
                raise InvalidParameter("k", f"must be an integer in [2, 2^53], got {k!r}")
        if self.mechanism == "block-hadamard-response":
            nb = self.num_blocks
            if isinstance(nb, bool) or not isinstance(nb, (int, np.integer)) or not 1 <= nb <= (self.k or 0):
                raise InvalidParameter("num_blocks", f"must be an integer in [1, k = {self.k}], got {nb!r}")
            _block_hr_params(self)  # the client's own checks (e.g. eps0 too small for B)
        G = self.grid_levels
        if G is not None:
            if self.mechanism != "laplace-mean":
                raise InvalidParameter("grid_levels", f"only applies to laplace-mean, not {self.mechanism}")
            if isinstance(G, bool) or not isinstance(G, (int, np.integer)) or not 1 <= G <= 2**24:
                raise InvalidParameter("grid_levels", f"must be an integer in [1, 2^24], got {G!r}")

    @property
    def pure(self) -> bool:
        return self.delta0 == 0.0


def generic_guarantee(epsilon0: float) -> LocalGuarantee:
    """Any pure ``epsilon0``-LDP randomizer (only ``epsilon0`` is used)."""
    return LocalGuarantee("generic", epsilon0)


def binary_rr_guarantee(epsilon0: float) -> LocalGuarantee:
    """Binary randomized response with keep probability ``e^eps0/(e^eps0+1)``."""
    return LocalGuarantee("binary-rr", epsilon0)


def hadamard_response_guarantee(epsilon0: float, num_bins: int) -> LocalGuarantee:
    """One-bit Hadamard response over a ``num_bins`` x ``num_bins`` Sylvester matrix."""
    return LocalGuarantee("hadamard-response", epsilon0, num_bins=num_bins)


def k_rr_guarantee(epsilon0: float, k: int) -> LocalGuarantee:
    """k-ary randomized response (``k == 2`` is binary RR)."""
    if isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k == 2:
        return binary_rr_guarantee(epsilon0)
    return LocalGuarantee("k-rr", epsilon0, k=k)


def block_hadamard_response_guarantee(epsilon0: float, k: int, num_blocks: int | None = None) -> LocalGuarantee:
    """Block (multi-bit) Hadamard response over ``k`` symbols (``client/hadamard_response.py``).

    ``num_blocks`` is the block count B; left ``None`` it is the client's default
    (:func:`shuffledp.client.hadamard_response.optimal_blocks`), resolved here and
    stored in the guarantee so the accountant and the devices use the same B.
    """
    from shuffledp.protocol.mechanisms.hadamard_response_params import HadamardResponseParams

    _check_epsilon0(epsilon0)  # before the client's parameters, whose arithmetic needs the range
    if isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k > MAX_DOMAIN_SIZE:
        raise InvalidParameter("k", f"must be an integer in [2, 2^53], got {k!r}")
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # tiny eps0: refused just below
        params = HadamardResponseParams(k, epsilon0, num_blocks)
    return LocalGuarantee("block-hadamard-response", epsilon0, k=params.k, num_blocks=params.blocks)


def laplace_mean_guarantee(epsilon0: float, grid_levels: int | None = None) -> LocalGuarantee:
    """Projected discrete-Laplace mean report (pure ``epsilon0``-LDP) on ``grid_levels`` levels.

    With ``grid_levels`` the accountant also applies the report's own privacy-blanket
    bound (:mod:`.blanket`); without it only bounds that use ``epsilon0`` alone.
    """
    return LocalGuarantee("laplace-mean", epsilon0, grid_levels=None if grid_levels is None else int(grid_levels))


def gaussian_mean_guarantee(epsilon0: float, delta0: float) -> LocalGuarantee:
    """Projected discrete-Gaussian mean report (``(epsilon0, delta0)``-LDP)."""
    return LocalGuarantee("gaussian-mean", epsilon0, delta0)


# ----------------------------------------------------------------- parameters
@dataclass(frozen=True)
class VariationRatio:
    """Variation-ratio parameters and the decomposition they induce."""

    p: float
    beta: float
    q: float
    #: probability that another user's report is a clone of user 1's uninformative part
    r2: float | None
    #: True when only the generic (eps0-only) parameters are known for the mechanism
    generic: bool

    @property
    def alpha(self) -> float:
        return self.beta / (self.p - 1.0)

    @property
    def a2(self) -> float:
        return max(0.0, 1.0 - (self.p + 1.0) * self.alpha)


def variation_ratio_parameters(local: LocalGuarantee) -> VariationRatio:
    """``(p, beta, q)`` (and ``r2``) for the mechanism, as derived in the module docstring."""
    if not local.pure:
        raise AmplificationNotClaimed(f"{local.mechanism} is only (eps0, delta0)-LDP; no variation-ratio parameters")
    E = math.exp(local.epsilon0)
    if local.mechanism == "binary-rr":
        return VariationRatio(E, (E - 1) / (E + 1), E, None, False)
    if local.mechanism == "hadamard-response":
        return VariationRatio(E, (E - 1) / (2 * (E + 1)), E, 1 / (2 * E), False)
    if local.mechanism == "k-rr":
        assert local.k is not None  # LocalGuarantee's checks: k-rr has k
        k = int(local.k)
        return VariationRatio(E, (E - 1) / (E + k - 1), E, (k - 2) / (E + k - 1), False)
    if local.mechanism == "block-hadamard-response":
        # (p, beta, q) of Wang et al. (beta: the largest TV over input pairs). The round's
        # bound does not use this single triple but one pair per input-pair type
        # (block_hadamard_pair_types); r2 is that of the largest-TV type.
        types = block_hadamard_pair_types(local)
        worst = max(types.values(), key=lambda t: t.tv)
        return VariationRatio(E, worst.tv, E, worst.r2, False)
    return VariationRatio(E, (E - 1) / (E + 1), E, None, True)


# ------------------------------------------------------ block Hadamard response
def _block_hr_params(local: LocalGuarantee):
    """The client's :class:`HadamardResponseParams` (B, b, s) of a block-HR guarantee."""
    from shuffledp.protocol.mechanisms.hadamard_response_params import HadamardResponseParams

    assert local.k is not None and local.num_blocks is not None  # LocalGuarantee's checks
    return HadamardResponseParams(int(local.k), float(local.epsilon0), int(local.num_blocks))


@dataclass(frozen=True)
class BlockPairType:
    """Clone decomposition of one type of input pair ``(x0, x1)`` of block Hadamard response.

    User 1 draws ``Q0``/``Q1``/``Q2`` with ``(a0, a1, a2)`` on ``x0`` and ``(a1, a0, a2)``
    on ``x1``; every other user, whatever its input, holds a ``Q0`` clone and a ``Q1``
    clone with probability ``r`` each and a ``Q2`` clone with probability ``r2``.
    ``tv`` is the pair's exact total-variation distance (``= a0 - a1``).
    """

    name: str
    a0: float
    a1: float
    a2: float
    r: float
    r2: float

    @property
    def tv(self) -> float:
        return self.a0 - self.a1


def block_hadamard_pair_types(local: LocalGuarantee) -> dict[str, BlockPairType]:
    r"""Clone decompositions of every type of input pair of block Hadamard response.

    Derivation (``p = e^eps0``; the client's ``t`` is at most the ideal
    ``(p - 1)/(p - 1 + 2B)`` and a smaller ``t' <= t`` is a post-processing of ``t``:
    ``R_t' = (t'/t) R_t + (1 - t'/t) U[K]`` report by report, which commutes with
    shuffling, so the round's divergence is at most that at the ideal ``t``; we use it).
    With ``D = p - 1 + 2B``: ``p_out = (1 - t)/K = 2/(b D)`` and ``p_in = p p_out``.

    Every input puts ``p_out`` on every output plus ``p_in - p_out`` on its set ``C_x``
    (``s = b/2`` outputs). Two inputs ``x0 != x1`` (sets ``A``, ``A'``) are of one of
    two types:

    * ``different-blocks`` (needs ``B >= 2``): ``A`` and ``A'`` are disjoint.
      ``Q0 = U(A)``, ``Q1 = U(A')``, ``Q2 = U(rest)``: ``a0 = s p_in = p/D``,
      ``a1 = s p_out = 1/D``, ``a2 = (K - 2s) p_out = (2B - 2)/D``;
      ``TV = s (p_in - p_out) = (p - 1)/D``. Every input puts at least ``p_out`` on
      every output, so every other user is a ``Q0``, ``Q1``, ``Q2`` clone with
      probability ``r = s p_out = 1/D``, ``r`` and ``r2 = (K - 2s) p_out = a2``
      (together its uniform ``(1 - t)`` component). These are exactly the
      parameters of ``2B``-ary RR.
    * ``same-block`` (needs a block with two symbols, ``ceil(k/B) >= 2``, so
      ``b >= 4``): distinct non-constant rows of ``H_b`` agree on half of their
      ``+1`` positions, ``|A n A'| = s/2``. ``Q0 = U(A \ A')``, ``Q1 = U(A' \ A)``,
      ``a0 = (s/2) p_in = p/(2D)``, ``a1 = (s/2) p_out = 1/(2D)``,
      ``TV = (p - 1)/(2D)``: half the other type's. ``Q2`` is the rest of ``R(x0)``
      (``p_in`` on ``A n A'``, ``p_out`` elsewhere), ``a2 = 1 - (p + 1)/(2D)``.
      Clones: ``r = (s/2) p_out = a1``; on ``A n A'`` some inputs put only ``p_out``
      while ``Q2`` has ``p_in/a2`` there, so ``r2 = a2 p_out/p_in = a2/p`` (the generic
      correction ``r2 = a2/q``); ``r Q0 + r Q1 + r2 Q2 <= p_out <= R(x)`` pointwise.

    Neither type dominates the other's *bound*: the different-blocks pair has twice
    the TV but the same-block pair's ``Q2`` clones are rarer (``a2/p``), and at
    ``eps0 = 4, k = 1024 (B = 27), n = 1000`` the same-block bound is the larger.
    The accountant therefore takes, for every ``eps``, the **maximum** over the types
    present of each type's divergence (each is a valid dominating pair for its pairs).

    The bound of each type is the corrected variation-ratio bound: the
    variation-ratio reduction of Wang et al. 2024 (arXiv 2304.05007,
    "Privacy Amplification via Shuffling: Unified, Simplified, and Tightened"),
    i.e. the clone reduction of Feldman, McMillan & Talwar (FOCS 2021, Lemma 3.3)
    with a decomposition ``(a0, a1, a2, r)``, corrected to keep the ``Q2`` count in
    the view (``clones.ClonePair``; see ``docs/accounting.md``). With ``B = 1`` the
    same-block parameters are exactly those of one-bit Hadamard response.
    """
    if local.mechanism != "block-hadamard-response":
        raise InvalidParameter("mechanism", f"not block-hadamard-response: {local.mechanism}")
    P = _block_hr_params(local)
    B = P.blocks
    E = math.exp(local.epsilon0)
    D = E - 1.0 + 2.0 * B
    out: dict[str, BlockPairType] = {}
    if B >= 2:
        a2 = (2.0 * B - 2.0) / D
        out["different-blocks"] = BlockPairType("different-blocks", E / D, 1.0 / D, a2, 1.0 / D, a2)
    if P.rows_per_block >= 2:
        a2 = 1.0 - (E + 1.0) / (2.0 * D)
        out["same-block"] = BlockPairType("same-block", E / (2.0 * D), 1.0 / (2.0 * D), a2, 1.0 / (2.0 * D), a2 / E)
    return out


def in_strong_clone_class(local: LocalGuarantee) -> bool:
    """Whether ``R(x) >= (R(x0) + R(x1))/(e^eps0+1)`` holds for all inputs (see module doc)."""
    return local.pure and local.mechanism in ("binary-rr", "k-rr")


# ------------------------------------------------------------ finite mechanisms
def sylvester_hadamard(K: int) -> np.ndarray:
    """The K x K Sylvester-Hadamard matrix, ``H[j, v] = (-1)^popcount(j & v)``."""
    if K < 1 or (K & (K - 1)) != 0:
        raise InvalidParameter("K", f"must be a power of two, got {K}")
    parity = np.arange(K, dtype=np.int64)[:, None] & np.arange(K, dtype=np.int64)[None, :]
    for shift in (32, 16, 8, 4, 2, 1):  # fold the bits onto bit 0 by xor: popcount(x) & 1
        parity ^= parity >> shift
    parity &= 1
    return (1 - 2 * parity).astype(np.int8)


def randomizer_matrix(local: LocalGuarantee) -> np.ndarray:
    """Output distributions ``R[x, y]`` of a finite mechanism (for exact enumeration).

    Binary RR: outputs {0, 1}. k-RR: outputs {0..k-1}. Hadamard response: output
    index ``2 j + (b == +1)`` for row ``j`` and bit ``b``.
    """
    E = math.exp(local.epsilon0)
    if local.mechanism == "binary-rr":
        rho = E / (E + 1)
        return np.array([[rho, 1 - rho], [1 - rho, rho]])
    if local.mechanism == "k-rr":
        assert local.k is not None  # LocalGuarantee's checks: k-rr has k
        k = int(local.k)
        R = np.full((k, k), 1 / (E + k - 1))
        np.fill_diagonal(R, E / (E + k - 1))
        return R
    if local.mechanism == "hadamard-response":
        assert local.num_bins is not None  # LocalGuarantee's checks: hadamard-response has num_bins
        K = int(local.num_bins)
        H = sylvester_hadamard(K)
        rho = E / (E + 1)
        R = np.zeros((K, 2 * K))
        for x in range(K):
            for j in range(K):
                plus = 2 * j + 1
                minus = 2 * j
                if H[j, x] == 1:
                    R[x, plus], R[x, minus] = rho / K, (1 - rho) / K
                else:
                    R[x, plus], R[x, minus] = (1 - rho) / K, rho / K
        return R
    if local.mechanism == "block-hadamard-response":
        # outputs [0, B b); symbol x has C_x = {j(x) b + v : H_b[r(x), v] = +1}; ideal t
        P = _block_hr_params(local)
        B, b, s, K = P.blocks, P.block_size, P.set_size, P.output_size
        t = (E - 1) / (E - 1 + 2 * B)
        p_out = (1 - t) / K
        p_in = t / s + p_out
        H = sylvester_hadamard(b)
        R = np.full((P.k, K), p_out)
        for x in range(P.k):
            j, row = x % B, x // B + 1
            R[x, j * b + np.nonzero(H[row] == 1)[0]] = p_in
        return R
    raise InvalidParameter("mechanism", f"{local.mechanism} has no finite output matrix")
