"""Local guarantees declared by randomizers, and what each one lets the accountant use.

A :class:`LocalGuarantee` names the randomizer and its local parameters. From it the
accountant derives:

* the variation-ratio parameters ``(p, beta, q)`` of Wang, Guo, Wang et al. 2024
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

MECHANISMS = ("generic", "binary-rr", "hadamard-response", "k-rr", "laplace-mean", "gaussian-mean")


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


@dataclass(frozen=True)
class LocalGuarantee:
    """What a randomizer declares about one report.

    ``num_bins`` is the Hadamard size K (``hadamard-response``), ``k`` the domain
    size of k-ary randomized response (``k-rr``); both are ignored otherwise.
    """

    mechanism: str
    epsilon0: float
    delta0: float = 0.0
    num_bins: int | None = None
    k: int | None = None

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise InvalidParameter("mechanism", f"must be one of {', '.join(MECHANISMS)}; got {self.mechanism!r}")
        eps = self.epsilon0
        if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating, np.integer)):
            raise InvalidParameter("epsilon0", f"must be a number, got {eps!r}")
        if not (math.isfinite(eps) and eps > 0):
            raise InvalidParameter("epsilon0", f"must be finite and > 0, got {eps}")
        if eps > 50:
            raise InvalidParameter("epsilon0", f"must be <= 50 (e^eps0 overflows the numerics), got {eps}")
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
            if isinstance(K, bool) or not isinstance(K, (int, np.integer)) or K < 2 or (K & (K - 1)) != 0:
                raise InvalidParameter("num_bins", f"must be a power of two >= 2, got {K!r}")
        if self.mechanism == "k-rr":
            k = self.k
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 2:
                raise InvalidParameter("k", f"must be an integer >= 2, got {k!r}")

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


def laplace_mean_guarantee(epsilon0: float) -> LocalGuarantee:
    """Projected discrete-Laplace mean report (pure ``epsilon0``-LDP)."""
    return LocalGuarantee("laplace-mean", epsilon0)


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
        k = int(local.k)
        return VariationRatio(E, (E - 1) / (E + k - 1), E, (k - 2) / (E + k - 1), False)
    return VariationRatio(E, (E - 1) / (E + 1), E, None, True)


def in_strong_clone_class(local: LocalGuarantee) -> bool:
    """Whether ``R(x) >= (R(x0) + R(x1))/(e^eps0+1)`` holds for all inputs (see module doc)."""
    return local.pure and local.mechanism in ("binary-rr", "k-rr")


# ------------------------------------------------------------ finite mechanisms
def sylvester_hadamard(K: int) -> np.ndarray:
    """The K x K Sylvester-Hadamard matrix, ``H[j, v] = (-1)^popcount(j & v)``."""
    if K < 1 or (K & (K - 1)) != 0:
        raise InvalidParameter("K", f"must be a power of two, got {K}")
    j = np.arange(K)[:, None]
    v = np.arange(K)[None, :]
    parity = np.vectorize(lambda x: bin(int(x)).count("1") & 1)(j & v)
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
        k = int(local.k)
        R = np.full((k, k), 1 / (E + k - 1))
        np.fill_diagonal(R, E / (E + k - 1))
        return R
    if local.mechanism == "hadamard-response":
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
    raise InvalidParameter("mechanism", f"{local.mechanism} has no finite output matrix")
