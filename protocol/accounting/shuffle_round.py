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
"""

from __future__ import annotations

import dataclasses
import functools
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

    def as_dict(self) -> dict:
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "method": self.method,
            "candidates": dict(self.candidates),
            "lower_bound": self.lower_bound,
        }


def _check_round(local: LocalGuarantee, n: int) -> int:
    if not isinstance(local, LocalGuarantee):
        raise InvalidParameter("local", f"must be a LocalGuarantee, got {type(local).__name__}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InvalidParameter("n", f"must be an integer >= 1 (reports in the shuffled batch), got {n!r}")
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
    """
    pairs = dominating_pairs(local, n)
    if blanket_laws(local) and local.mechanism != "laplace-mean":
        pairs.pop("variation-ratio", None)
    return pairs


def blanket_laws(local: LocalGuarantee) -> tuple[BlanketLaw, ...]:
    """The mechanism's privacy-blanket laws, one per type of input pair (:mod:`.blanket`).

    Empty where no worst pair is known (generic, laplace-mean without ``grid_levels``) and for
    binary RR, whose exact bound (``rr_any_n``) is tighter than its blanket (= stronger clone).
    The round's ``delta(eps)`` is at most the largest of the laws' bounds.
    """
    e0 = float(local.epsilon0)
    if local.mechanism == "laplace-mean" and local.grid_levels is not None:
        return (laplace_report_law(e0, int(local.grid_levels)),)
    if local.mechanism == "k-rr":
        return (k_rr_law(e0, int(local.k)),)
    if local.mechanism == "hadamard-response":
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

    Raises :class:`InvalidParameter` on bad input and :class:`AmplificationNotClaimed`
    for approximate-DP randomizers. Answers are kept in the on-disk cache
    (:mod:`.cache`: keyed on the parameters and on the accountant's source).
    """
    n = _check_round(local, n)
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.floating)) or not 0 < delta < 1:
        raise InvalidParameter("delta", f"must be in (0, 1), got {delta!r}")
    delta = float(delta)
    question = {"local": dataclasses.asdict(local), "n": n, "delta": delta}
    return RoundBound(**cached("shuffled_round", question, lambda: _shuffled_round(local, n, delta).as_dict()))


def _shuffled_round(local: LocalGuarantee, n: int, delta: float) -> RoundBound:
    """:func:`shuffled_round` on checked arguments, computed."""
    e0 = float(local.epsilon0)
    cand: dict[str, float | None] = {name: None for name in BOUND_NAMES}
    cand["local"] = e0
    for name, pair in round_pairs(local, n).items():
        cand[name] = min(e0, pair.epsilon(delta))
    cand["fmt21-closed"] = fmt21_closed_form(e0, n, delta)
    cand["rdp-girgis"] = min(e0, rdp_epsilon(EXTENDED_ORDERS, girgis_rdp(e0, n, EXTENDED_ORDERS), delta))
    lower: float | None = None
    if local.mechanism == "binary-rr":
        eps_rr, from_n, lower, exact = binary_rr_epsilon(delta, n, e0)
        cand["rr-exact" if from_n == n else "rr-exact-smaller-n"] = eps_rr
        if exact and from_n == n and eps_rr - lower <= 1e-9 * eps_rr:
            lower = eps_rr  # exact to 1e-9: reported as the exact value (as before)
        else:  # the fixed-pair floor (0-3 ones, both directions) is a lower bound too
            lower = min(eps_rr, max(lower, rr_lower_epsilon(delta, n, e0)))
    elif rr_floor_applies(local):
        lower = rr_lower_epsilon(delta, n, e0)
    laws = blanket_laws(local)
    if laws:
        cand["blanket"] = min(e0, blanket_round_epsilon(laws, n, delta, e0))
    valid = {k: v for k, v in cand.items() if v is not None}
    if lower is not None:
        # A candidate below a proven lower bound is numerically wrong, not an upper bound: it is
        # dropped (and shown as such in ``candidates``). Seen for FMT21's numerical pair at
        # eps0 >= 28.5, where the clone probability e^-eps0 is below the evaluation's precision
        # (28.4998 against an RR floor of 28.49997); ``local`` (eps0) always remains.
        for name, value in list(valid.items()):
            if name not in ("local", "blanket") and value < lower * (1 - 1e-6) - 1e-9:
                del valid[name]
                cand[name] = None
                cand[f"{name} (dropped: below the exact floor)"] = value
    if laws and local.mechanism == "laplace-mean":
        lower = None  # the RR floor is not a lower bound for this mechanism
    best = min(valid.values())
    method = "local" if best >= e0 else next(k for k in BOUND_NAMES if valid.get(k) == best)
    return RoundBound(epsilon=best, delta=delta, method=method, candidates=cand, lower_bound=lower)


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
    for i, e in enumerate(eps_grid):
        vals = [p.delta(float(e), rtol=rtol) for p in pairs]
        if exact_rr:
            vals.append(rr_exact_delta(float(e), n, local.epsilon0))
        if laws:
            vals.append(blanket_round_delta(laws, n, float(e)))
        out[i] = min(vals)
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
    what a session uses to size its privacy-loss grid."""
    n = _check_round(local, n)
    laws = blanket_laws(local)
    if laws:  # the optimal decomposition: clone pairs are not evaluated (see round_delta_curve)
        return min(blanket_round_epsilon(laws, n, delta, local.epsilon0), local.epsilon0)
    best = min(p.epsilon(delta, rtol=1e-3) for p in round_pairs(local, n).values())
    return min(best, local.epsilon0)
