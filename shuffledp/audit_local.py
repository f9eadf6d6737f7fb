"""Empirical audit of every shipped local randomizer: statistical lower bounds on epsilon.

For a randomizer ``R`` claimed ``(eps0, delta0)``-LDP, every pair of inputs ``x, x'``
and every event ``E`` satisfy ``P[R(x) in E] <= e^eps0 P[R(x') in E] + delta0``. The
audit runs the *real* randomizer code ``T`` times on each of a worst-case pair, counts
how often a distinguishing event occurs (``k1`` of ``n1`` under ``x``, ``k2`` of ``n2``
under ``x'``) and turns the counts into a lower bound that holds with the stated
confidence,

    eps_lb = ln((p_lo - delta0) / q_hi)        (0 when p_lo <= delta0),

with ``p_lo`` a Clopper–Pearson lower bound on ``P[R(x) in E]`` and ``q_hi`` a
Clopper–Pearson upper bound on ``P[R(x') in E]``. A row *passes* when
``eps_lb <= eps0``: no violation detected. A lower bound above the claim means the
code is not ``(eps0, delta0)``-LDP (with the confidence below), unless the bad event
of the interval happened.

Statistics
----------
* :func:`clopper_pearson` is the two-sided, equal-tailed ("central") interval: each
  end fails with probability at most ``(1 - confidence)/2``.
* :func:`epsilon_lower_bound` uses one end of each of two intervals, so it splits the
  error (Bonferroni): ``p_lo`` is one-sided at ``1 - (1 - confidence)/2`` and so is
  ``q_hi`` -- which are exactly the lower end of the first and the upper end of the
  second *two-sided* interval at ``confidence``. Then
  ``P[p <= p_lo or q >= q_hi] <= 1 - confidence`` and, on the complement,
  ``eps_lb <= ln((p - delta0)/q) <= eps0`` for a correct randomizer.
* :func:`audit_local` runs many rows (mechanism x epsilon x random source). At 95 %
  per row a correct implementation trips some row with probability far above 5 %
  (a tight randomized response row alone fails with probability about 2.5 % at
  ``eps0 = 4``; measured over whole audits in the module's report). With
  ``familywise=True`` (the default) every row uses ``1 - (1 - confidence)/m`` for
  ``m`` rows (Bonferroni over rows), so a correct implementation fails the whole
  audit with probability at most ``1 - confidence``. Every row records the
  confidence it used.
* Events fixed in advance from the analysis (all randomized-response-type
  randomizers) need no selection. Threshold events ``{value <= t}`` (the mean
  reports) choose ``t`` on a separate, fresh selection run (always a
  :class:`SeededSource` stream independent of the evaluation streams) and count the
  event on the evaluation run only, so there is no selection bias: the event is
  fixed before the evaluation samples exist. The selection maximises the bound the
  selection counts would give at the evaluation sample size (the counts are scaled
  to ``n_eval``), which trades the ratio against the mass of the event. Using a
  seeded selection run for a :class:`SystemSource` evaluation is valid for the
  same reason: any event fixed independently of the evaluated samples is.

Worst-case pairs and events (all ratios below are of the code's own probabilities)
-----------------------------------------------------------------------------------
* ``hadamard-range`` (binary RR on one Hadamard bit): local means in the first and
  last bin (``v``, ``v'``). ``E = {H[row, v] != H[row, v'] and bit == H[row, v]}``:
  probability ``p/2`` under ``x`` and ``(1-p)/2`` under ``x'`` (two distinct columns
  of ``H_K`` differ on exactly ``K/2`` rows), ratio ``p/(1-p) = e^eps0`` exactly.
  Rows where the columns agree have ratio 1, so ``E`` is the optimal event.
* ``projected-mean-laplace``: means beyond ``lower`` and beyond ``upper`` (projected
  to grid values 0 and ``G``). For ``t <= 0``, ``P[N <= t] / P[N <= t - G] = q^-G =
  e^eps0`` exactly (both in the left geometric tail), so ``t = 0`` is optimal with mass
  ``1/(1+q) ~ 1/2``; the selection finds it from the data.
* ``projected-mean-gaussian``: the same pair; the privacy loss grows as ``t`` falls,
  and the events ``{value <= t}`` whose ratio nears ``e^eps0`` carry too little mass
  for ``10^6`` trials to resolve. At ``delta0 = 1e-6`` the best *expected* bound over
  all ``t`` (computed from the exact distributions with
  :func:`expected_epsilon_lower_bound`) is ``0.61-0.70 eps0`` at 95 % per row and
  ``0.53-0.65 eps0`` at the family-wise level of :func:`audit_local` (eps0 = 0.5..4);
  reaching ``0.95 eps0`` takes ~``10^9``-``10^10`` trials per side. This is a
  statistical ceiling of ``(eps0, delta0, trials)``, not a weakness of the event
  (one-sided thresholds are optimal: the privacy loss is monotone). A second Gaussian
  configuration at large ``(eps0, delta0)`` (``GAUSSIAN_STRESS``), where the mass is
  there, gives the audit power against calibration errors (e.g. the classical
  ``sigma = G sqrt(2 ln(1.25/delta))/eps``, invalid only at large ``eps``).
* ``vector-range-sampled``: one uniform coordinate per report, drawn independently of
  the data; inputs ``x = U^-1 z`` and ``x' = U^-1 z'`` whose rotated coordinates are
  *all* in the first bin and *all* in the last bin, so the event of ``hadamard-range``
  holds coordinate by coordinate with the same ``p/2`` vs ``(1-p)/2``, whichever
  coordinate is drawn: the bound is over the whole report ``(coord, row, bit)`` and is
  as tight as the scalar one.
* ``vector-range-paper``: ``D`` reports at ``eps0/D`` each; the only events with
  ratio ``e^eps0`` need *every* report informative and agreeing with ``x``, of mass
  ``(p/2)^D``. The audit uses ``D = 2`` (``PAPER_DIM``); at larger ``D`` the mass
  vanishes and no sample size of this scale resolves the claim.
* ``vector-mean-laplace`` / ``-gaussian``: rotated coordinates all beyond ``lower[l]``
  vs all beyond ``upper[l]``, event ``{value <= t}`` whatever the coordinate (every
  coordinate has the same grid size and noise).
* ``k-rr``: symbols 0 and 1, ``E = {report == 0}``: ``p`` vs ``(1-p)/(k-1)``.
* ``hadamard-response``: ``E = C_x \\ C_x'`` (outputs in ``x``'s set and not in
  ``x'``'s), each output ``p_in`` vs ``p_out``; ``x, x'`` in different blocks when
  ``B >= 2`` (disjoint sets, mass ``s p_in``), else two rows of one block (``b/4``
  outputs).

Runs go through the shipped code paths: :func:`~shuffledp.client.mechanisms.randomize_round`
for the four protocol mechanisms, :func:`~shuffledp.client.krr.randomize_krr` and
:func:`~shuffledp.client.hadamard_response.randomize_hadamard_response` for the
frequency oracles, with :class:`SeededSource` (vectorized, ``trials`` per side) and
:class:`SystemSource` (the device path, ``system_trials`` per side: it samples the
mean noises exactly in Python at ~0.1-0.3 ms per report).

Planted faults for testing the audit itself live in :mod:`shuffledp.audit_faults`.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import numpy as np

from shuffledp.client.hadamard_response import (
    choose_hadamard_response,
    randomize_hadamard_response,
)
from shuffledp.client.krr import randomize_krr
from shuffledp.client.mechanisms import randomize_round
from shuffledp.client.vector_randomizer import rotation_of
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.hadamard import hadamard_entry
from shuffledp.protocol.messages import (
    MAX_EPSILON,
    MIN_EPSILON,
    HadamardRangeParams,
    ProjectedMeanParams,
    VectorMeanParams,
    VectorRangeParams,
)
from shuffledp.protocol.randomness import RandomSource, SeededSource, SystemSource

__all__ = [
    "DEFAULT_EPSILONS",
    "DEFAULT_SYSTEM_TRIALS",
    "DEFAULT_TRIALS",
    "GAUSSIAN_DELTA0",
    "GAUSSIAN_STRESS",
    "SOURCES",
    "AuditCase",
    "AuditResult",
    "audit_local",
    "clopper_pearson",
    "epsilon_lower_bound",
    "expected_epsilon_lower_bound",
    "format_results",
    "hadamard_range_case",
    "hadamard_response_case",
    "krr_case",
    "local_cases",
    "projected_mean_case",
    "run_audit",
    "vector_mean_case",
    "vector_range_case",
]

DEFAULT_TRIALS = 10**6
DEFAULT_SYSTEM_TRIALS = 2 * 10**4
DEFAULT_EPSILONS = (0.5, 1.0, 2.0, 4.0)
#: delta0 of the Gaussian mean reports at the audited epsilons.
GAUSSIAN_DELTA0 = 1e-6
#: Extra Gaussian claims ``(eps0, delta0)`` where the tight events have mass the trials
#: resolve: the classical calibration is invalid there by more than the audit's slack.
GAUSSIAN_STRESS = ((8.0, 0.1),)
#: Symbols of the frequency oracles (``shuffledp simulate --dim`` default).
DEFAULT_K = 16
#: Dimension of the vector audits in sampled mode (``shuffledp simulate --dim`` default).
VECTOR_DIM = 16
#: Dimension of the paper-mode vector-range audit (event mass ``(p/2)^D``).
PAPER_DIM = 2
SOURCES = ("seeded", "system")
#: Trials per randomizer call: vector inputs of 2^18 x 16 doubles are 32 MiB.
_CHUNK = 1 << 18
# Candidate thresholds: quantiles of the selection sample under x at these levels
# (consecutive levels 0.4 % apart, from 1e-7 up to 1).
_THRESHOLD_LEVELS = np.geomspace(1e-7, 1.0, 4000)
# One-sided error of the pessimistic estimates used to choose a threshold.
_SELECTION_ALPHA = 0.05


# --------------------------------------------------------------------------
# Clopper–Pearson and the epsilon lower bound
# --------------------------------------------------------------------------


def _check_confidence(confidence: object) -> float:
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float, np.integer, np.floating)):
        raise InvalidParameter("confidence", f"must be a number in (0, 1), got {confidence!r}")
    c = float(confidence)
    if not 0.0 < c < 1.0:
        raise InvalidParameter("confidence", f"must be in (0, 1), got {confidence!r}")
    return c


def _check_count(name: str, value: object, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidParameter(name, f"must be an integer, got {value!r}")
    v = int(value)
    if v < low or (high is not None and v > high):
        rule = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise InvalidParameter(name, f"must be {rule}, got {v}")
    return v


def _check_delta(delta: object) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.integer, np.floating)):
        raise InvalidParameter("delta", f"must be a number in [0, 1), got {delta!r}")
    d = float(delta)
    if not 0.0 <= d < 1.0:
        raise InvalidParameter("delta", f"must be in [0, 1), got {delta!r}")
    return d


def _check_epsilon(epsilon: object) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.integer, np.floating)):
        raise InvalidParameter("epsilon0", f"must be a number, got {epsilon!r}")
    e = float(epsilon)
    if not MIN_EPSILON <= e <= MAX_EPSILON:
        raise InvalidParameter("epsilon0", f"must be in [{MIN_EPSILON}, {MAX_EPSILON}], got {epsilon!r}")
    return e


def _cp_low(k, n, alpha: float):
    """One-sided lower Clopper–Pearson bound at level ``1 - alpha`` (vectorized; real counts allowed)."""
    from scipy.stats import beta

    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    safe_k = np.where(k > 0, k, 1.0)
    return np.where(k > 0, beta.ppf(alpha, safe_k, n - safe_k + 1.0), 0.0)


def _cp_high(k, n, alpha: float):
    """One-sided upper Clopper–Pearson bound at level ``1 - alpha`` (vectorized; real counts allowed)."""
    from scipy.stats import beta

    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    safe_k = np.where(k < n, k, n - 1.0)
    return np.where(k < n, beta.ppf(1.0 - alpha, safe_k + 1.0, n - safe_k), 1.0)


def clopper_pearson(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """The two-sided, equal-tailed Clopper–Pearson interval for a binomial proportion.

    ``(low, high)`` with ``P[p < low] <= (1 - confidence)/2`` and
    ``P[p > high] <= (1 - confidence)/2``: each end is a one-sided bound at
    ``1 - (1 - confidence)/2``. ``low = 0`` when ``successes = 0`` and ``high = 1``
    when ``successes = trials`` (the exact bounds there). Otherwise
    ``low = Beta^-1(alpha/2; k, n - k + 1)`` and ``high = Beta^-1(1 - alpha/2; k + 1, n - k)``
    with ``alpha = 1 - confidence``.
    """
    n = _check_count("trials", trials, 1)
    k = _check_count("successes", successes, 0, n)
    alpha = 1.0 - _check_confidence(confidence)
    return float(_cp_low(k, n, alpha / 2.0)), float(_cp_high(k, n, alpha / 2.0))


def _lower_bound(k1, n1, k2, n2, delta: float, confidence: float):
    """:func:`epsilon_lower_bound` without validation, vectorized over (real) counts."""
    alpha = 1.0 - confidence
    p_lo = _cp_low(k1, n1, alpha / 2.0)
    q_hi = _cp_high(k2, n2, alpha / 2.0)
    num = p_lo - delta
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.where(num > 0, np.log(np.where(num > 0, num, 1.0) / q_hi), 0.0)
    return np.maximum(value, 0.0)


def epsilon_lower_bound(
    k1: int, n1: int, k2: int, n2: int, delta: float = 0.0, confidence: float = 0.95
) -> float:
    """A lower bound on epsilon, holding with probability at least ``confidence``.

    ``k1`` of ``n1`` runs on ``x`` and ``k2`` of ``n2`` runs on ``x'`` fell in an event
    ``E`` fixed independently of these runs. With ``p_lo`` the lower end of the
    two-sided Clopper–Pearson interval of ``k1/n1`` and ``q_hi`` the upper end of that
    of ``k2/n2``, both at ``confidence`` (so each is a one-sided bound at
    ``1 - (1 - confidence)/2``; Bonferroni over the two), returns
    ``ln((p_lo - delta) / q_hi)``, or 0 when that is not positive. Any mechanism that
    is ``(eps, delta)``-DP for the pair has ``eps >= `` this value except with
    probability at most ``1 - confidence``.

    ``E`` must not be chosen by looking at these counts: choose it on a separate run
    (what :func:`run_audit` does) or from the analysis.
    """
    n1 = _check_count("n1", n1, 1)
    n2 = _check_count("n2", n2, 1)
    k1 = _check_count("k1", k1, 0, n1)
    k2 = _check_count("k2", k2, 0, n2)
    return float(_lower_bound(k1, n1, k2, n2, _check_delta(delta), _check_confidence(confidence)))


def expected_epsilon_lower_bound(p: float, q: float, trials: int, delta: float = 0.0, confidence: float = 0.95) -> float:
    """The bound :func:`epsilon_lower_bound` gives when the counts land on their means.

    ``p = P[R(x) in E]``, ``q = P[R(x') in E]``, ``trials`` per side: the bound at the
    (real-valued) counts ``p trials`` and ``q trials``. For large counts the realised
    bound is about this, with a spread of ``sqrt((1-p)/(n p) + (1-q)/(n q))``. It
    predicts how tight an audit can be; it proves nothing.
    """
    n = _check_count("trials", trials, 1)
    for name, value in (("p", p), ("q", q)):
        if not (isinstance(value, (int, float, np.floating)) and 0.0 <= float(value) <= 1.0):
            raise InvalidParameter(name, f"must be a probability, got {value!r}")
    return float(_lower_bound(p * n, n, q * n, n, _check_delta(delta), _check_confidence(confidence)))


# --------------------------------------------------------------------------
# Audit cases: one worst-case pair and one event per randomizer
# --------------------------------------------------------------------------

Runner = Callable[[int, int, RandomSource], np.ndarray]


@dataclass(frozen=True)
class AuditCase:
    """A worst-case input pair of one randomizer and a distinguishing event.

    ``run(side, n, source)`` runs the real randomizer ``n`` times on ``x`` (side 0) or
    ``x'`` (side 1) and returns the reports; ``statistic(reports)`` maps them to one
    value per run: the event's indicator (``threshold`` False) or the value whose
    ``{value <= t}`` is the event (``threshold`` True; ``t`` is chosen on a selection
    run). ``event`` describes the event (``{t}`` is filled in for thresholds).
    """

    mechanism: str
    epsilon0: float
    delta0: float
    inputs: str
    event: str
    run: Runner
    statistic: Callable[[np.ndarray], np.ndarray]
    threshold: bool = False


@dataclass(frozen=True)
class AuditResult:
    """One audited row: a randomizer at one claim, with one random source."""

    mechanism: str
    source: str
    epsilon0: float
    delta0: float
    trials: int
    inputs: str
    event: str
    count_x: int
    count_x_prime: int
    epsilon_lb: float
    ratio: float
    passed: bool
    confidence: float
    seconds: float

    def as_dict(self) -> dict:
        return asdict(self)


def _data_runner(params, epsilon0: float, delta0: float, pair: tuple[np.ndarray, np.ndarray]) -> Runner:
    """Runs :func:`randomize_round` on ``n`` copies of ``pair[side]`` (a scalar or a vector)."""

    def run(side: int, n: int, source: RandomSource) -> np.ndarray:
        value = np.asarray(pair[side], dtype=np.float64)
        data = np.broadcast_to(value, (n,) + value.shape)
        return randomize_round(params, epsilon0, delta0, np.ascontiguousarray(data), source)

    return run


def _rr_event(v: int, v_prime: int) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def informative_agree(rows: np.ndarray, bits: np.ndarray) -> np.ndarray:
        h_v = hadamard_entry(rows, v)
        return (h_v != hadamard_entry(rows, v_prime)) & (bits == h_v)

    return informative_agree


def _default_range_params() -> HadamardRangeParams:
    return HadamardRangeParams(0.0, 1.0, 1.0 / 16.0)  # 8 bins


def hadamard_range_case(epsilon0: float, params: HadamardRangeParams | None = None) -> AuditCase:
    """``hadamard-range``: means in the first and the last bin; ``E`` = informative row, bit agrees with ``x``."""
    eps = _check_epsilon(epsilon0)
    params = params or _default_range_params()
    if params.num_bins < 2:
        raise InvalidParameter("params", "needs at least two bins to have distinguishable inputs")
    width = params.high - params.low
    pair = (np.float64(params.low - width), np.float64(params.high + width))  # clamped to bins 0 and last
    v, v_prime = 0, params.num_bins - 1
    event = _rr_event(v, v_prime)
    return AuditCase(
        "hadamard-range",
        eps,
        0.0,
        f"means in bins {v} and {v_prime} of {params.num_bins}",
        f"H[row,{v}] != H[row,{v_prime}] and bit == H[row,{v}]",
        _data_runner(params, eps, 0.0, pair),
        lambda reports: event(reports[:, 0, 0], reports[:, 0, 1]),
    )


def _grid_value(reports: np.ndarray) -> np.ndarray:
    return reports[:, 0, -1]


def projected_mean_case(
    epsilon0: float, noise: str = "laplace", delta0: float | None = None, params: ProjectedMeanParams | None = None
) -> AuditCase:
    """``projected-mean``: means beyond ``lower`` and beyond ``upper`` (grid values 0 and G); ``E = {value <= t}``."""
    eps = _check_epsilon(epsilon0)
    if noise not in ("laplace", "gaussian"):
        raise InvalidParameter("noise", f"must be 'laplace' or 'gaussian', got {noise!r}")
    delta = (GAUSSIAN_DELTA0 if noise == "gaussian" else 0.0) if delta0 is None else _check_delta(delta0)
    params = params or ProjectedMeanParams(0.0, 1.0, noise, 4096)
    if params.noise != noise:
        raise InvalidParameter("params", f"noise {params.noise!r} differs from {noise!r}")
    params.check_budget(eps, delta)
    width = params.upper - params.lower
    pair = (np.float64(params.lower - width), np.float64(params.upper + width))
    return AuditCase(
        f"projected-mean-{noise}",
        eps,
        delta,
        f"means projected to grid 0 and G = {params.grid_levels}",
        "value <= {t}",
        _data_runner(params, eps, delta, pair),
        _grid_value,
        threshold=True,
    )


def _rotated_pair(params, z: float, z_prime: float) -> tuple[np.ndarray, np.ndarray]:
    """Inputs whose rotated coordinates are all ``z`` (resp. all ``z_prime``): ``U^-1`` of constant vectors."""
    rotation = rotation_of(params)
    if params.dim != params.padded_dim:
        raise InvalidParameter("dim", f"must be a power of two for exact worst-case inputs, got {params.dim}")
    return (
        rotation.inverse(np.full(params.padded_dim, z, dtype=np.float64)),
        rotation.inverse(np.full(params.padded_dim, z_prime, dtype=np.float64)),
    )


def vector_range_case(epsilon0: float, mode: str = "sampled", params: VectorRangeParams | None = None) -> AuditCase:
    """``vector-range``: every rotated coordinate in the first bin vs in the last; per report as ``hadamard-range``.

    Sampled mode: one report ``(coord, row, bit)``; the event holds on whichever
    coordinate is drawn. Paper mode: ``D`` reports at ``eps0/D``; the event is that
    *every* report is informative and agrees with ``x`` (mass ``(p/2)^D``).
    """
    eps = _check_epsilon(epsilon0)
    if params is None:
        dim = VECTOR_DIM if mode == "sampled" else PAPER_DIM
        params = VectorRangeParams(0.0, 1.0, 1.0 / 16.0, dim, 7, mode)
    if params.mode != mode:
        raise InvalidParameter("params", f"mode {params.mode!r} differs from {mode!r}")
    params.check_budget(eps, 0.0)
    scalar = params.scalar
    width = scalar.high - scalar.low
    pair = _rotated_pair(params, scalar.low - width, scalar.high + width)
    v, v_prime = 0, scalar.num_bins - 1
    event = _rr_event(v, v_prime)

    def statistic(reports: np.ndarray) -> np.ndarray:
        return np.all(event(reports[:, :, 1], reports[:, :, 2]), axis=1)

    every = "every report: " if mode == "paper" else ""
    return AuditCase(
        f"vector-range-{mode}",
        eps,
        0.0,
        f"D = {params.padded_dim}, all rotated coords in bin {v} vs {v_prime}",
        f"{every}H[row,{v}] != H[row,{v_prime}] and bit == H[row,{v}]",
        _data_runner(params, eps, 0.0, pair),
        statistic,
    )


def vector_mean_case(
    epsilon0: float, noise: str = "laplace", delta0: float | None = None, params: VectorMeanParams | None = None
) -> AuditCase:
    """``vector-mean`` (sampled coordinate): every rotated coordinate beyond its ``lower`` vs beyond its ``upper``."""
    eps = _check_epsilon(epsilon0)
    if noise not in ("laplace", "gaussian"):
        raise InvalidParameter("noise", f"must be 'laplace' or 'gaussian', got {noise!r}")
    delta = (GAUSSIAN_DELTA0 if noise == "gaussian" else 0.0) if delta0 is None else _check_delta(delta0)
    if params is None:
        dim = VECTOR_DIM
        params = VectorMeanParams(dim, 11, (-1.0,) * dim, (1.0,) * dim, noise, 4096)
    if params.noise != noise:
        raise InvalidParameter("params", f"noise {params.noise!r} differs from {noise!r}")
    params.check_budget(eps, delta)
    ranges = params.ranges
    if not (np.all(ranges[:, 0] == ranges[0, 0]) and np.all(ranges[:, 1] == ranges[0, 1])):
        raise InvalidParameter("params", "the audit's inputs need one interval for every coordinate")
    width = ranges[0, 1] - ranges[0, 0]
    pair = _rotated_pair(params, ranges[0, 0] - width, ranges[0, 1] + width)
    return AuditCase(
        f"vector-mean-{noise}",
        eps,
        delta,
        f"D = {params.padded_dim}, all rotated coords at grid 0 vs G = {params.grid_levels}",
        "value <= {t} (any coord)",
        _data_runner(params, eps, delta, pair),
        _grid_value,
        threshold=True,
    )


def krr_case(epsilon0: float, k: int = DEFAULT_K) -> AuditCase:
    """``k-rr``: symbols 0 and 1, ``E = {report == 0}``."""
    eps = _check_epsilon(epsilon0)
    k = _check_count("k", k, 2)

    def run(side: int, n: int, source: RandomSource) -> np.ndarray:
        return randomize_krr(np.full(n, side, dtype=np.int64), k, eps, source)

    return AuditCase("k-rr", eps, 0.0, f"symbols 0 and 1 of k = {k}", "report == 0", run, lambda reports: reports == 0)


def hadamard_response_case(epsilon0: float, k: int = DEFAULT_K) -> AuditCase:
    """``hadamard-response`` (block HR at :func:`choose_hadamard_response`): ``E = C_x \\ C_x'``."""
    eps = _check_epsilon(epsilon0)
    k = _check_count("k", k, 2)
    params = choose_hadamard_response(k, eps)
    blocks, b = params.blocks, params.block_size
    # symbols 0 and 1: blocks 0 and 1 when B >= 2 (disjoint sets), rows 1 and 2 of block 0 when B = 1
    x, x_prime = 0, 1

    def in_set(outputs: np.ndarray, symbol: int) -> np.ndarray:
        block, row = symbol % blocks, symbol // blocks + 1
        return (outputs // b == block) & (hadamard_entry(row, outputs % b) == 1)

    def run(side: int, n: int, source: RandomSource) -> np.ndarray:
        return randomize_hadamard_response(np.full(n, (x, x_prime)[side], dtype=np.int64), params, source)

    return AuditCase(
        "hadamard-response",
        eps,
        0.0,
        f"symbols {x} and {x_prime} of k = {k} (B = {blocks}, b = {b})",
        f"report in C_{x} and not in C_{x_prime}",
        run,
        lambda outputs: in_set(outputs, x) & ~in_set(outputs, x_prime),
    )


def local_cases(
    epsilons: Iterable[float] = DEFAULT_EPSILONS,
    *,
    gaussian_delta0: float = GAUSSIAN_DELTA0,
    gaussian_stress: Iterable[tuple[float, float]] = GAUSSIAN_STRESS,
    k: int = DEFAULT_K,
) -> list[AuditCase]:
    """Every shipped local randomizer at default settings, at each epsilon (plus the Gaussian stress claims)."""
    cases: list[AuditCase] = []
    for eps in epsilons:
        cases += [
            hadamard_range_case(eps),
            projected_mean_case(eps, "laplace"),
            projected_mean_case(eps, "gaussian", gaussian_delta0),
            vector_range_case(eps, "sampled"),
            vector_range_case(eps, "paper"),
            vector_mean_case(eps, "laplace"),
            vector_mean_case(eps, "gaussian", gaussian_delta0),
            krr_case(eps, k),
            hadamard_response_case(eps, k),
        ]
    for eps, delta in gaussian_stress:
        cases.append(projected_mean_case(eps, "gaussian", delta))
    return cases


# --------------------------------------------------------------------------
# Running a case
# --------------------------------------------------------------------------

Progress = Callable[[str, int], None]


def _stream(seed: int, case: AuditCase, purpose: int, side: int) -> SeededSource:
    """An independent PCG64 stream per (seed, case, purpose, side)."""
    key = zlib.crc32(f"{case.mechanism}|{case.epsilon0!r}|{case.delta0!r}".encode())
    return SeededSource(np.random.SeedSequence([seed, key, purpose, side]))


def _statistics(case: AuditCase, side: int, n: int, source: RandomSource, progress: Progress | None, stage: str):
    """The case's statistic over ``n`` runs of one side, in chunks of :data:`_CHUNK` runs."""
    parts = []
    done = 0
    while done < n:
        m = min(_CHUNK, n - done)
        parts.append(np.asarray(case.statistic(case.run(side, m, source))))
        done += m
        if progress is not None:
            progress(stage, m)
    return np.concatenate(parts) if parts else np.zeros(0)


def _choose_threshold(sel_x: np.ndarray, sel_xp: np.ndarray, n_eval: int, delta: float, confidence: float) -> int:
    """The ``t`` maximising a pessimistic forecast of the evaluation bound, from the selection runs alone.

    For each candidate ``t`` the probabilities are estimated *pessimistically* from the
    selection counts (``P[x in E]`` by its 95 % lower, ``P[x' in E]`` by its 95 % upper
    Clopper–Pearson bound) and the bound that ``n_eval`` runs landing on those values
    would give is computed. Plain plug-in estimates suffer a winner's curse: among
    thousands of candidates, the maximum is usually a small-count tail whose
    selection counts were lucky, and the fresh evaluation counts then give a poor
    bound. The pessimistic forecast penalises small counts twice (selection noise and
    evaluation noise) and so prefers events with mass. Validity does not depend on
    this choice, only power does.
    """
    sx = np.sort(sel_x)
    sxp = np.sort(sel_xp)
    candidates = np.unique(np.quantile(sx, _THRESHOLD_LEVELS, method="inverted_cdf"))
    k1 = np.searchsorted(sx, candidates, side="right")
    k2 = np.searchsorted(sxp, candidates, side="right")
    p_pess = _cp_low(k1, sx.size, _SELECTION_ALPHA)
    q_pess = _cp_high(k2, sxp.size, _SELECTION_ALPHA)
    bounds = _lower_bound(p_pess * n_eval, n_eval, q_pess * n_eval, n_eval, delta, confidence)
    return int(candidates[int(np.argmax(bounds))])


def run_audit(
    case: AuditCase,
    *,
    source: str = "seeded",
    trials: int = DEFAULT_TRIALS,
    seed: int = 0,
    confidence: float = 0.95,
    selection_trials: int | None = None,
    progress: Progress | None = None,
) -> AuditResult:
    """Audit one case: ``trials`` runs per side with ``source`` (``"seeded"`` or ``"system"``).

    Threshold cases first draw ``selection_trials`` runs per side (default: ``trials``,
    at least ``10^5``) from independent seeded streams to choose ``t``, then evaluate
    on fresh runs. ``seed`` fixes the seeded streams (the system source is the OS
    CSPRNG and ignores it). ``progress(stage, runs)`` is called as runs complete.
    """
    if source not in SOURCES:
        raise InvalidParameter("source", f"must be one of {SOURCES}, got {source!r}")
    trials = _check_count("trials", trials, 1)
    seed = _check_count("seed", seed, 0)
    confidence = _check_confidence(confidence)
    if selection_trials is None:
        selection_trials = max(trials, 10**5)
    selection_trials = _check_count("selection_trials", selection_trials, 1)
    stage = f"{case.mechanism} eps0={case.epsilon0:g} {source}"
    start = time.perf_counter()
    event = case.event
    t = 0
    if case.threshold:
        sel = [_statistics(case, side, selection_trials, _stream(seed, case, 0, side), progress, stage + " (select)")
               for side in (0, 1)]
        t = _choose_threshold(sel[0], sel[1], trials, case.delta0, confidence)
        event = case.event.format(t=t)
    counts = []
    for side in (0, 1):
        src: RandomSource = _stream(seed, case, 1, side) if source == "seeded" else SystemSource()
        values = _statistics(case, side, trials, src, progress, stage)
        hits = values <= t if case.threshold else values.astype(bool)
        counts.append(int(np.count_nonzero(hits)))
    lb = float(_lower_bound(counts[0], trials, counts[1], trials, case.delta0, confidence))
    return AuditResult(
        mechanism=case.mechanism,
        source=source,
        epsilon0=case.epsilon0,
        delta0=case.delta0,
        trials=trials,
        inputs=case.inputs,
        event=event,
        count_x=counts[0],
        count_x_prime=counts[1],
        epsilon_lb=lb,
        ratio=lb / case.epsilon0,
        passed=lb <= case.epsilon0,
        confidence=confidence,
        seconds=time.perf_counter() - start,
    )


def audit_local(
    trials: int = DEFAULT_TRIALS,
    system_trials: int = DEFAULT_SYSTEM_TRIALS,
    epsilons: Iterable[float] = DEFAULT_EPSILONS,
    seed: int = 0,
    progress: Progress | None = None,
    *,
    confidence: float = 0.95,
    familywise: bool = True,
    sources: Iterable[str] = SOURCES,
    gaussian_delta0: float = GAUSSIAN_DELTA0,
    gaussian_stress: Iterable[tuple[float, float]] = GAUSSIAN_STRESS,
    k: int = DEFAULT_K,
) -> list[AuditResult]:
    """Audit every shipped local randomizer at each epsilon with each source; one row each.

    ``trials`` runs per side with the seeded source, ``system_trials`` with the system
    source (0 skips it). ``familywise`` (default): each of the ``m`` rows is bounded at
    ``1 - (1 - confidence)/m`` so that a correct implementation fails *any* row with
    probability at most ``1 - confidence``; otherwise every row is at ``confidence``.
    The audit passes when every row does (``all(r.passed for r in rows)``).
    """
    trials = _check_count("trials", trials, 1)
    system_trials = _check_count("system_trials", system_trials, 0)
    confidence = _check_confidence(confidence)
    eps_list = [_check_epsilon(e) for e in epsilons]
    if not eps_list:
        raise InvalidParameter("epsilons", "must name at least one epsilon")
    sources = tuple(sources)
    for s in sources:
        if s not in SOURCES:
            raise InvalidParameter("sources", f"each must be one of {SOURCES}, got {s!r}")
    if system_trials == 0:
        sources = tuple(s for s in sources if s != "system")
    if not sources:
        raise InvalidParameter("sources", "nothing to run")
    stress = [(_check_epsilon(e), _check_delta(d)) for e, d in gaussian_stress]
    cases = local_cases(eps_list, gaussian_delta0=_check_delta(gaussian_delta0), gaussian_stress=stress, k=k)
    rows = len(cases) * len(sources)
    row_confidence = 1.0 - (1.0 - confidence) / rows if familywise else confidence
    results = []
    for source in sources:
        n = trials if source == "seeded" else system_trials
        for case in cases:
            results.append(
                run_audit(
                    case,
                    source=source,
                    trials=n,
                    seed=seed,
                    confidence=row_confidence,
                    selection_trials=max(trials, 10**5) if source == "system" else trials,
                    progress=progress,
                )
            )
    return results


def format_results(results: Iterable[AuditResult]) -> str:
    """A fixed-width table of audit rows, one line each, and a PASS/FAIL summary line."""
    rows = list(results)
    header = (
        f"{'mechanism':<24} {'source':<6} {'eps0':>5} {'delta0':>7} {'trials':>8} "
        f"{'eps_lb':>7} {'ratio':>6} {'result':<6} {'secs':>6}  event"
    )
    lines = [header]
    for r in rows:
        lines.append(
            f"{r.mechanism:<24} {r.source:<6} {r.epsilon0:>5g} {r.delta0:>7.0e} {r.trials:>8d} "
            f"{r.epsilon_lb:>7.4f} {r.ratio:>6.3f} {'pass' if r.passed else 'FAIL':<6} {r.seconds:>6.1f}  {r.event}"
        )
    failed = [r for r in rows if not r.passed]
    lines.append(f"{'PASS' if not failed else 'FAIL'}: {len(rows) - len(failed)} of {len(rows)} rows within their claims")
    return "\n".join(lines)
