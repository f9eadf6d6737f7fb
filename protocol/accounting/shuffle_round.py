"""One shuffled round: every applicable bound, the tightest one, and the privacy curve.

:func:`shuffled_round` answers "what central (eps, delta) does this round give?" for a
local guarantee and the batch size the shuffler actually delivered. Each bound is
reported in :attr:`RoundBound.candidates` (``None`` where its theorem does not apply),
and :attr:`RoundBound.epsilon` is the smallest valid one. All numbers are *upper*
bounds on the round's epsilon, except :attr:`RoundBound.lower_bound`, which is the
exact epsilon of shuffled binary randomized response on a fixed neighbouring pair:
a floor no bound that only uses ``eps0`` may go under (for ``binary-rr`` it is a certified
lower bound on the exact value, maximised over all datasets, and the exact value itself
where that is certified to 1e-9: :mod:`.rr_any_n`).

:func:`round_delta_curve` gives the round's ``delta(eps)`` on a grid (pointwise minimum
of the valid numerical curves), which :mod:`.session` turns into a privacy loss
distribution for composition.

Supported inputs, each answered in bounded time (checked before any work starts):

* ``1 <= n <=`` :data:`MAX_N` (``10^18``). Above :data:`EVALUATION_MAX_N` (``10^9``, the
  certified binary-RR bound's own limit and the range the numerical bounds are used over;
  their incomplete-beta tails were checked up to ``n = 1e8``) every numerical bound is evaluated at
  ``n' = EVALUATION_MAX_N``: the round's exact ``delta(eps)`` is non-increasing in ``n``
  for every randomizer (a batch of ``n`` reports is a post-processing of any sub-batch that
  holds user 1: the other reports are independent of user 1's input and can be added and
  re-shuffled), so an upper bound at ``n'`` is one at ``n``. The closed forms (FMT21
  Theorem 3.1 and Girgis et al.'s RDP bound) are evaluated at ``n`` itself and no lower
  bound is reported (one at ``n'`` is not one at ``n``). :attr:`RoundBound.evaluated_n`
  says where the numerical bounds were evaluated.
* ``epsilon0`` below :data:`NUMERICAL_MIN_EPSILON0` (``1e-6``): the numerical bounds are not
  evaluated (their parameters ``e^eps0 - 1`` lose relative precision as ``1e-16 / eps0``);
  the round reports the closed forms and ``local`` (``eps0`` itself, valid by
  post-processing), no lower bound.
* ``epsilon0`` above :data:`NUMERICAL_MAX_EPSILON0` (``20``): the clone pairs (FMT21's numerical
  bound, the stronger clone, variation-ratio) are not evaluated. Their parameters hold
  ``1 - rho = 1/(e^eps0 + 1)`` as ``1 - fl(rho)``, off by up to ``e^eps0 2^-53`` relative (``3e-9``
  of ``eps0`` at 20; 37.38 came out at ``eps0 = 50``), and with about ``n e^-eps0 <= 2`` clones
  expected at ``n <= 1e9`` they could not amplify much anyway. The certified binary-RR bound, the
  blanket bound and the closed forms remain.
* ``epsilon0 <= 50`` and the sizes :class:`.LocalGuarantee` checks; a Laplace report on more
  than :data:`BLANKET_MAX_GRID_LEVELS` levels is accounted without its blanket bound (the
  bounds that use ``eps0`` alone remain).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from shuffledp.protocol.accounting.blanket import (
    BlanketLaw,
    blanket_delta,
    blanket_epsilon,
    block_hadamard_laws,
    hadamard_response_law,
    k_rr_law,
    laplace_report_law,
)
from shuffledp.protocol.accounting.cache import cached

from shuffledp.protocol.accounting.clones import (
    ClonePair,
    WorstOfPairs,
    fmt21_closed_form,
    fmt21_pair,
    strong_clone_pair,
    variation_ratio_pair,
)
from shuffledp.protocol.accounting.guarantees import (
    AmplificationNotClaimed,
    LocalGuarantee,
    _block_hr_params,
    block_hadamard_pair_types,
    in_strong_clone_class,
    variation_ratio_parameters,
)
from shuffledp.protocol.accounting.rdp import EXTENDED_ORDERS, girgis_rdp, rdp_epsilon
from shuffledp.protocol.accounting.rr_any_n import (
    RRCertificate,
    certified_delta_curve,
    certify_epsilon,
    grid_floor,
    rr_monotone_epsilon,
)
from shuffledp.protocol.accounting.rr_exact import RR_EXACT_MAX_N, rr_exact_delta, rr_lower_epsilon
from shuffledp.protocol.errors import InvalidParameter

#: Largest batch size accepted (:class:`InvalidParameter` above).
MAX_N = 10**18
#: Largest batch size the numerical bounds are evaluated at; above it they are evaluated here and
#: hold at the larger batch by post-processing (module doc). The certified binary-RR bound's own
#: limit (``rr_any_n.MAX_N``).
EVALUATION_MAX_N = 10**9
#: Below this ``epsilon0`` only the closed-form bounds are evaluated (module doc).
NUMERICAL_MIN_EPSILON0 = 1e-6
#: Above this ``epsilon0`` the clone pairs are not evaluated (module doc).
NUMERICAL_MAX_EPSILON0 = 20.0
#: Largest Laplace grid whose privacy-blanket law is built (one atom per level; 1-2 s at 2^20).
BLANKET_MAX_GRID_LEVELS = 2**20
#: Bounds that depend on ``epsilon0`` alone and hold for binary RR: the exact shuffled binary-RR
#: floor is a lower bound on each of them for every mechanism, so a value below it is a numerical
#: failure (seen at eps0 >= 30, where the clone probability e^-eps0 is below double precision).
EPSILON0_ONLY_BOUNDS = ("strong-clone", "fmt21-numerical", "fmt21-closed", "rdp-girgis")

#: Order in which bounds are listed (and tie-broken).
BOUND_NAMES = (
    "rr-exact",
    "rr-exact-smaller-n",
    "variation-ratio",
    "blanket",
    "strong-clone",
    "fmt21-numerical",
    "fmt21-closed",
    "rdp-girgis",
    "local",
)


@dataclass(frozen=True)
class RoundBound:
    """Central guarantee of one shuffled round."""

    epsilon: float
    delta: float
    method: str
    candidates: dict[str, float | None]
    lower_bound: float | None
    #: Batch size the numerical bounds were evaluated at: ``n`` itself, or
    #: :data:`EVALUATION_MAX_N` for a larger ``n`` (valid there by post-processing; module doc).
    evaluated_n: int | None = None

    def as_dict(self) -> dict:
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "method": self.method,
            "candidates": dict(self.candidates),
            "lower_bound": self.lower_bound,
            "evaluated_n": self.evaluated_n,
        }


def _check_round(local: LocalGuarantee, n: int) -> int:
    if not isinstance(local, LocalGuarantee):
        raise InvalidParameter("local", f"must be a LocalGuarantee, got {type(local).__name__}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= MAX_N:
        raise InvalidParameter("n", f"must be an integer in [1, 10^18] (reports in the shuffled batch), got {n!r}")
    if not local.pure:
        raise AmplificationNotClaimed(
            f"{local.mechanism} reports are only (eps0={local.epsilon0}, delta0={local.delta0})-LDP; "
            "the amplification bounds implemented here need pure eps0-LDP randomizers, so no "
            "amplification is claimed (the round is still (eps0, delta0)-DP by post-processing)"
        )
    return int(n)


def dominating_pairs(local: LocalGuarantee, n: int) -> dict[str, ClonePair | WorstOfPairs]:
    """Every clone dominating pair whose theorem applies to this mechanism.

    Block Hadamard response gets one pair per type of input pair (same block,
    different blocks; ``guarantees.block_hadamard_pair_types``) combined by
    :class:`WorstOfPairs` (the maximum over the types).

    The pair objects are shared within the process (keyed on the exact parameters; the last
    two questions only: a fine two-dimensional pair at n = 1e6 holds ~45 MB of layouts), so
    their block layouts and finished epsilon searches are computed once for the single-round
    bound, the session's grid and curve; the dictionary itself is a fresh copy.
    """
    n = _check_round(local, n)
    return dict(_shared_pairs(local, n))


@functools.lru_cache(maxsize=2)
def _shared_pairs(local: LocalGuarantee, n: int) -> dict[str, ClonePair | WorstOfPairs]:
    """:func:`dominating_pairs`, built once per (local, n)."""
    e0 = local.epsilon0
    pairs: dict[str, ClonePair | WorstOfPairs] = {"fmt21-numerical": fmt21_pair(e0, n)}
    if in_strong_clone_class(local):
        pairs["strong-clone"] = strong_clone_pair(e0, n)
    if local.mechanism == "block-hadamard-response":
        types = block_hadamard_pair_types(local)
        pairs["variation-ratio"] = WorstOfPairs(
            tuple(ClonePair(n, t.a0, t.a1, t.a2, t.r, t.r2, name=f"variation-ratio/{t.name}") for t in types.values()),
            name="variation-ratio",
        )
        return pairs
    vr = variation_ratio_parameters(local)
    if not vr.generic:
        if vr.a2 <= 1e-15:  # binary RR: same pair as the stronger clone
            pairs["variation-ratio"] = pairs.get("strong-clone") or strong_clone_pair(e0, n)
        else:
            pairs["variation-ratio"] = variation_ratio_pair(vr.p, vr.beta, vr.q, n, r2=vr.r2)
    return pairs


def round_pairs(local: LocalGuarantee, n: int) -> dict[str, ClonePair | WorstOfPairs]:
    """The clone pairs a round and a session evaluate: :func:`dominating_pairs` less the corrected
    variation-ratio pair where the mechanism has blanket laws (:func:`blanket_laws`).

    There the blanket bound is the optimal decomposition among all clone-type analyses (Su, Cheng
    & Wang 2025), so it is at most the variation-ratio bound in exact arithmetic, and its certified
    value is within 0.13 % of the certified variation-ratio value on every grid point measured
    (``docs/accounting.md``), at a few hundredths of a second instead of up to seconds: the two-
    dimensional variation-ratio pair stays available through :func:`dominating_pairs` as an
    independent cross-check.

    Empty outside ``[NUMERICAL_MIN_EPSILON0, NUMERICAL_MAX_EPSILON0]`` (module doc).
    """
    if not clone_pairs_apply(local.epsilon0):
        return {}
    pairs = dominating_pairs(local, n)
    if blanket_laws(local) and local.mechanism != "laplace-mean":
        pairs.pop("variation-ratio", None)
    return pairs


def clone_pairs_apply(epsilon0: float) -> bool:
    """Whether the clone pairs are evaluated at this ``epsilon0`` (module doc)."""
    return NUMERICAL_MIN_EPSILON0 <= epsilon0 <= NUMERICAL_MAX_EPSILON0


def local_delta_curve(eps_grid: np.ndarray, epsilon0: float) -> np.ndarray:
    """Binary RR's ``delta(eps)`` at ``epsilon0`` for one report, ``(e^eps0 - e^eps)_+ / (e^eps0 + 1)``:
    an upper bound for every pure ``epsilon0``-LDP randomizer (binary RR dominates them: Kairouz, Oh &
    Viswanath 2015), hence for the shuffled round (a post-processing of user 1's report); padded by
    1e-12 relative for rounding."""
    e = np.maximum(np.asarray(eps_grid, dtype=np.float64), 0.0)
    out = np.maximum(math.expm1(epsilon0) - np.expm1(e), 0.0) / (math.expm1(epsilon0) + 2.0) * (1.0 + 1e-12)
    out[e >= epsilon0] = 0.0
    return np.minimum(out, 1.0)


def blanket_laws(local: LocalGuarantee) -> tuple[BlanketLaw, ...]:
    """The mechanism's privacy-blanket laws, one per type of input pair (:mod:`.blanket`).

    Empty where no worst pair is known (generic, laplace-mean without ``grid_levels``) and for
    binary RR, whose exact bound (``rr_any_n``) is tighter than its blanket (= stronger clone).
    The round's ``delta(eps)`` is at most the largest of the laws' bounds.
    """
    e0 = float(local.epsilon0)
    if local.mechanism == "laplace-mean" and local.grid_levels is not None:
        if int(local.grid_levels) > BLANKET_MAX_GRID_LEVELS:  # one atom per level: not built (module doc)
            return ()
        return (laplace_report_law(e0, int(local.grid_levels)),)
    if local.mechanism == "k-rr":
        assert local.k is not None  # LocalGuarantee's checks: k-rr has k
        return (k_rr_law(e0, int(local.k)),)
    if local.mechanism == "hadamard-response":
        assert local.num_bins is not None  # LocalGuarantee's checks: hadamard-response has num_bins
        return (hadamard_response_law(e0, int(local.num_bins)),)
    if local.mechanism == "block-hadamard-response":
        P = _block_hr_params(local)
        return block_hadamard_laws(e0, P.blocks, P.rows_per_block)
    return ()


def blanket_round_delta(laws: tuple[BlanketLaw, ...], n: int, eps: float) -> float:
    """Upper bound on the round's ``delta(eps)`` from its blanket laws (the worst pair type)."""
    return max(blanket_delta(law, n, eps) for law in laws)


def blanket_round_epsilon(laws: tuple[BlanketLaw, ...], n: int, delta: float, epsilon0: float) -> float:
    """Upper bound on the round's ``eps(delta)`` from its blanket laws (the worst pair type).

    The first law's epsilon is searched; a further law whose certified ``delta`` at that epsilon is
    already at most ``delta`` cannot raise the maximum (the bound holds there for both), so it
    costs one evaluation instead of a search."""
    best = blanket_epsilon(laws[0], n, delta, epsilon0)
    for law in laws[1:]:
        if best >= epsilon0 or blanket_delta(law, n, best) <= delta:
            continue
        best = max(best, blanket_epsilon(law, n, delta, epsilon0))
    return best


def rr_floor_applies(local: LocalGuarantee) -> bool:
    """Whether shuffled binary RR's exact epsilon is a floor for this mechanism's bounds.

    It is for bounds that only use ``eps0`` (generic, laplace-mean) and for binary RR
    itself; k-ary RR and Hadamard response can genuinely be more private than binary
    RR at the same ``eps0``, and so can the Laplace report: with ``grid_levels`` its
    mechanism-specific ``blanket`` bound may go below the floor, which then only
    screens the eps0-only bounds and is not reported as the round's lower bound.
    """
    return local.mechanism in ("generic", "laplace-mean", "binary-rr")


def _cached_certificate(delta: float, n: int, epsilon0: float, target: float | None = None) -> RRCertificate:
    """:func:`rr_any_n.certify_epsilon` through the on-disk cache (keyed on n, delta, eps0, the
    refinement target and the source)."""
    question = {"n": int(n), "delta": float(delta), "epsilon0": float(epsilon0),
                "target": None if target is None else float(target)}
    return RRCertificate(**cached("rr_certificate", question,
                                  lambda: certify_epsilon(delta, n, epsilon0, target=target).as_dict()))


def binary_rr_epsilon(delta: float, n: int, epsilon0: float) -> tuple[float, int, float, bool]:
    """Certified central eps of shuffled binary RR, non-increasing in n (``rr_any_n``, Steps 1-5).

    Returns ``(epsilon, from_n, lower, exact)``: the upper bound (every dataset, numerical error
    included), the grid batch size ``<= n`` it was computed at (a batch of ``n`` users is a
    post-processing of one of ``from_n <= n``), a certified lower bound on the exact eps at
    ``n``, and whether the value is exact up to floating-point error (every dataset evaluated
    on its own: ``n <= rr_any_n.EXACT_ALL_N``).
    """
    mono = rr_monotone_epsilon(delta, n, epsilon0, certify=_cached_certificate)
    return mono.epsilon, mono.from_n, mono.lower, mono.certificate.exact


def shuffled_round(local: LocalGuarantee, n: int, delta: float) -> RoundBound:
    """Central ``(epsilon, delta)`` of one round shuffling ``n`` reports of ``local``.

    Raises :class:`InvalidParameter` on bad input (``n`` outside ``[1, 10^18]``, ``delta``
    outside ``(0, 1)``) and :class:`AmplificationNotClaimed` for approximate-DP randomizers.
    Huge ``n`` and tiny ``epsilon0`` are answered with the bounds the module doc lists for
    them, in bounded time. Answers are kept in the on-disk cache (:mod:`.cache`: keyed on the
    parameters and on the accountant's code).
    """
    n = _check_round(local, n)
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.floating)) or not 0 < delta < 1:
        raise InvalidParameter("delta", f"must be in (0, 1), got {delta!r}")
    delta = float(delta)
    question = {"local": dataclasses.asdict(local), "n": n, "delta": delta}
    return RoundBound(**cached("shuffled_round", question, lambda: _shuffled_round(local, n, delta).as_dict()))


def _closed_forms(e0: float, n: int, delta: float) -> dict[str, float | None]:
    """The closed-form bounds at ``n`` (any size: no evaluation grows with ``n``).

    Girgis et al.'s moments scale like ``eps0^2`` and underflow below ``eps0 ~ 1e-150``; there the
    bound is only used where ``eps0 / 2 <= delta``, when the round is ``(0, delta)``-DP anyway (one
    report's total variation is at most ``tanh(eps0/2)``)."""
    closed = fmt21_closed_form(e0, n, delta)
    girgis = None
    if e0 >= 1e-150 or e0 / 2.0 <= delta:
        girgis = min(e0, rdp_epsilon(EXTENDED_ORDERS, girgis_rdp(e0, n, EXTENDED_ORDERS), delta))
    return {"fmt21-closed": None if closed is None else min(e0, closed), "rdp-girgis": girgis}


def _best(cand: dict[str, float | None], e0: float) -> tuple[float, str]:
    valid = {k: v for k, v in cand.items() if v is not None and k in BOUND_NAMES}
    best = min(valid.values())
    return best, "local" if best >= e0 else next(k for k in BOUND_NAMES if valid.get(k) == best)


def _shuffled_round(local: LocalGuarantee, n: int, delta: float) -> RoundBound:
    """:func:`shuffled_round` on checked arguments, computed (huge ``n`` and tiny ``epsilon0`` as the
    module doc says)."""
    e0 = float(local.epsilon0)
    if e0 < NUMERICAL_MIN_EPSILON0:
        cand: dict[str, float | None] = {name: None for name in BOUND_NAMES}
        cand["local"] = e0
        cand.update(_closed_forms(e0, n, delta))
        best, method = _best(cand, e0)
        return RoundBound(epsilon=best, delta=delta, method=method, candidates=cand, lower_bound=None, evaluated_n=n)
    if n > EVALUATION_MAX_N:
        return _large_round(local, n, delta)
    if n == EVALUATION_MAX_N:
        return _evaluated_round_shared(local, n, delta)
    return _evaluated_round(local, n, delta)


def _large_round(local: LocalGuarantee, n: int, delta: float) -> RoundBound:
    """A round of ``n > EVALUATION_MAX_N`` reports: the numerical bounds at ``EVALUATION_MAX_N`` (valid at
    ``n`` by post-processing), the closed forms at ``n``, no lower bound (module doc)."""
    e0 = float(local.epsilon0)
    at = _evaluated_round_shared(local, EVALUATION_MAX_N, delta)
    cand = dict(at.candidates)
    if cand.get("rr-exact") is not None:  # computed at a smaller n than the round's
        cand["rr-exact-smaller-n"], cand["rr-exact"] = cand["rr-exact"], None
    for name, value in _closed_forms(e0, n, delta).items():
        # a closed form the floor at EVALUATION_MAX_N showed wrong there is not trusted further out
        if value is not None and f"{name} (dropped: below the exact floor)" not in cand:
            current = cand[name]
            cand[name] = value if current is None else min(current, value)
    best, method = _best(cand, e0)
    return RoundBound(epsilon=best, delta=delta, method=method, candidates=cand, lower_bound=None,
                      evaluated_n=EVALUATION_MAX_N)


@functools.lru_cache(maxsize=8)
def _evaluated_round_shared(local: LocalGuarantee, n: int, delta: float) -> RoundBound:
    """:func:`_evaluated_round`, once per process (every huge batch size shares the one at EVALUATION_MAX_N)."""
    return _evaluated_round(local, n, delta)


def _evaluated_round(local: LocalGuarantee, n: int, delta: float) -> RoundBound:
    """Every bound evaluated at ``n <= EVALUATION_MAX_N``."""
    e0 = float(local.epsilon0)
    cand: dict[str, float | None] = {name: None for name in BOUND_NAMES}
    cand["local"] = e0
    for name, pair in round_pairs(local, n).items():
        cand[name] = min(e0, pair.epsilon(delta))
    cand.update(_closed_forms(e0, n, delta))
    lower: float | None = None
    # The fixed-pair floor of shuffled binary RR (0-3 ones, both directions): a lower bound on every
    # bound that uses eps0 alone, for every mechanism (EPSILON0_ONLY_BOUNDS).
    rr_floor = rr_lower_epsilon(delta, n, e0)
    if local.mechanism == "binary-rr":
        eps_rr, from_n, lower, exact = binary_rr_epsilon(delta, n, e0)
        cand["rr-exact" if from_n == n else "rr-exact-smaller-n"] = eps_rr
        if exact and from_n == n and eps_rr - lower <= 1e-9 * eps_rr:
            lower = eps_rr  # exact to 1e-9: reported as the exact value (as before)
        else:  # the fixed-pair floor is a lower bound too
            lower = min(eps_rr, max(lower, rr_floor))
    elif rr_floor_applies(local):
        lower = rr_floor
    laws = blanket_laws(local)
    if laws:
        cand["blanket"] = min(e0, blanket_round_epsilon(laws, n, delta, e0))
    valid = {k: v for k, v in cand.items() if v is not None}
    # A candidate below a proven lower bound is numerically wrong, not an upper bound: it is
    # dropped (and shown as such in ``candidates``). Seen for FMT21's numerical pair at
    # eps0 >= 28.5, where the clone probability e^-eps0 is below the evaluation's precision
    # (28.4998 against an RR floor of 28.49997; at eps0 = 50, 37.38 against 50), for every
    # mechanism: the bounds that use eps0 alone are screened by the RR floor whatever the
    # mechanism, the others by the round's own lower bound where it has one. ``local`` (eps0)
    # always remains.
    for name, value in list(valid.items()):
        if name in ("local", "blanket"):
            continue
        floors = [f for f in (lower, rr_floor if name in EPSILON0_ONLY_BOUNDS else None) if f is not None]
        if floors and value < max(floors) * (1 - 1e-6) - 1e-9:
            del valid[name]
            cand[name] = None
            cand[f"{name} (dropped: below the exact floor)"] = value
    if laws and local.mechanism == "laplace-mean":
        lower = None  # the RR floor is not a lower bound for this mechanism
    best, method = _best(cand, e0)
    return RoundBound(epsilon=best, delta=delta, method=method, candidates=cand, lower_bound=lower, evaluated_n=n)


def round_delta_curve(local: LocalGuarantee, n: int, eps_grid: np.ndarray, rtol: float = 2e-2) -> np.ndarray:
    """Upper bound on the round's ``delta(eps)`` at each grid point (min over valid curves)."""
    n = _check_round(local, n)
    eps_grid = np.asarray(eps_grid, dtype=np.float64)
    laws = blanket_laws(local)
    # Where the mechanism has blanket laws, its clone pairs are not evaluated on the curve: the
    # blanket decomposition is the optimal one among all clone-type decompositions (Su, Cheng &
    # Wang 2025), so a clone pair's curve is above the blanket's in exact arithmetic and could
    # only undercut it by the blanket's lattice inflation (<= 0.25 % of one term's variance).
    # Each pair costs as much as the blanket per point (the default simulation: a fifth of its
    # accounting). A curve without them is still a valid upper bound.
    pairs = [] if laws else list(round_pairs(local, n).values())
    for p in pairs:  # every curve starts from the coarsest blocks, as on fresh pairs
        p.reset_start()
    exact_rr = local.mechanism == "binary-rr" and n <= RR_EXACT_MAX_N
    out = np.empty_like(eps_grid)
    if laws and not pairs and not exact_rr:
        # Independent points, each mostly FFTs and array arithmetic that release the GIL: two threads.
        return np.array(_parallel_map(lambda e: blanket_round_delta(laws, n, float(e)), eps_grid.tolist()))
    local_curve = local_delta_curve(eps_grid, float(local.epsilon0))
    for i, e in enumerate(eps_grid):
        vals = [p.delta(float(e), rtol=rtol) for p in pairs]
        if exact_rr:
            vals.append(rr_exact_delta(float(e), n, local.epsilon0))
        if laws:
            vals.append(blanket_round_delta(laws, n, float(e)))
        out[i] = min(vals) if vals else local_curve[i]  # no pair evaluated (module doc): the local curve
    if local.mechanism == "binary-rr" and not exact_rr:
        out = np.minimum(out, binary_rr_delta_curve(eps_grid, n, float(local.epsilon0)))
    return out


def _parallel_map(fn, items: list) -> list:
    """``[fn(x) for x in items]`` on up to two threads (the machines this runs on have at least two
    cores; the results are the same numbers in the same order)."""
    workers = min(2, os.cpu_count() or 1, len(items))
    if workers <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, items))


def binary_rr_delta_curve(eps_grid: np.ndarray, n: int, epsilon0: float) -> np.ndarray:
    """Certified ``delta(eps)`` of shuffled binary RR over every dataset (``rr_any_n``, Step 3 with
    blocks refined at the round's own epsilon at delta = 1e-6), at the grid batch size below ``n``
    (a batch of ``n`` is a post-processing of a smaller one)."""
    g = grid_floor(n)
    reference = binary_rr_epsilon(1e-6, g, epsilon0)[0]
    return certified_delta_curve(eps_grid, g, epsilon0, reference)


def round_curve_support(local: LocalGuarantee, n: int, floor_delta: float = 1e-15) -> float:
    """Epsilon beyond which the round's best curve is below ``floor_delta`` (grid end)."""
    return round_reference_epsilon(local, n, floor_delta)


def round_reference_epsilon(local: LocalGuarantee, n: int, delta: float) -> float:
    """A quick upper bound on the round's ``eps(delta)`` (best clone pair or blanket, 1e-3 relative):
    what a session uses to size its privacy-loss grid. ``epsilon0`` itself below
    :data:`NUMERICAL_MIN_EPSILON0`."""
    n = _check_round(local, n)
    if local.epsilon0 < NUMERICAL_MIN_EPSILON0:
        return float(local.epsilon0)
    laws = blanket_laws(local)
    if laws:  # the optimal decomposition: clone pairs are not evaluated (see round_delta_curve)
        return min(blanket_round_epsilon(laws, n, delta, local.epsilon0), local.epsilon0)
    best = min((p.epsilon(delta, rtol=1e-3) for p in round_pairs(local, n).values()), default=local.epsilon0)
    return min(best, local.epsilon0)
