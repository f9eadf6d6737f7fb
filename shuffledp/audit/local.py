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
  ``familywise=True`` (the default) every bound uses ``1 - (1 - confidence)/m`` for
  ``m`` bounds (Bonferroni over bounds: one per row, plus the parametric bound of
  each Gaussian row, below; 74 + 18 = 92 in the default audit), so a correct
  implementation fails the whole audit with probability at most ``1 - confidence``
  (given the Gaussian model for the parametric bounds). Every row records the
  confidence it used; both of a Gaussian row's bounds use it.
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
  ``sigma = G sqrt(2 ln(1.25/delta))/eps``, invalid only at large ``eps``). The
  Gaussian rows also get a *parametric* bound (next section), which reaches
  ``0.97-0.997 eps0`` at the default trials.
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

Parametric (Gaussian-shape) bound for the Gaussian reports
----------------------------------------------------------
The event bound assumes nothing about the randomizer; for the Gaussian reports it is
capped far below ``eps0`` by the trials (above). A second, separately reported bound
(``epsilon_param``, :func:`gaussian_parametric_bound`) assumes the *shape* of the
output law and estimates only its two parameters from the same runs -- the usual
idea of auditing a Gaussian mechanism by its shift and scale:

* **Model.** On the audited pairs both inputs project *exactly* onto grid points 0
  and ``G`` (they lie beyond the interval, so the fractional part is 0 and the
  randomized rounding is the identity; the case checks this with the randomizer's
  own ``to_grid`` and sets ``AuditCase.gaussian`` only then: off the grid a report
  would be a two-point mixture and the model would not hold). A report on side
  ``s`` is then ``clamp(c_s + N)``, ``c_s`` an integer, ``N ~ N_Z(0, sigma^2)`` the
  same law on both sides, the clamp to ``report_range`` active with probability
  ``<= 2^-40``. ``Delta = c_1 - c_0`` and ``sigma`` are unknown (for correct code
  ``G`` and the calibrated sigma; a calibration fault changes sigma).
* **Estimates.** Sample means ``m_0, m_1`` and the pooled variance ``S^2`` (``N_all
  - 2`` degrees of freedom) of every run of the row's own source: the evaluation
  runs and, for seeded rows, the selection runs too (no selection is involved here,
  so all of them count: ``2 x 10^6`` per side at the default trials); system rows use
  their ``system_trials`` runs only. With error ``a = 1 - confidence - N_all 2^-40``
  (the last term pays for the event that some run was clamped), split in two
  (Bonferroni):
  ``Delta_low = ceil(m_1 - m_0 - t_{1-a/2} S sqrt(1/n_0 + 1/n_1))`` (pooled
  two-sample t, one-sided; ``Delta`` is an integer, hence the ceiling) and
  ``sigma_high^2 = (N_all - 2) S^2 / chi2_{a/2}`` (chi-square, one-sided). Both are
  exact for normal samples; ``N_Z(0, sigma^2)`` at the shipped scales (sigma of
  ``1.1 x 10^3`` to ``3.3 x 10^4`` grid units) has the normal's moments up to
  ``e^{-2 pi^2 sigma^2}`` (Poisson summation) and the sums are over ``>= 2 x 10^3``
  runs per side, so they hold to the accuracy of the central limit theorem (checked
  by simulation: over 200 seeds at ``10^5`` runs per side each bound missed at its
  nominal rate).
* **Epsilon.** ``epsilon_param`` is the smallest ``eps`` at which the exact
  discrete-Gaussian hockey-stick divergence of a shift ``Delta_low`` under noise
  ``sigma_high`` (:func:`~shuffledp.protocol.mechanisms.gaussian_calibration.discrete_gaussian_delta`,
  CKS20 Thm 7, the profile the calibration itself uses) is at most ``delta0``, with
  that profile divided by ``1 + 1e-6`` (it is an upper bound within ~1e-11 relative
  here) and the clamp's effect ``(1 + e^eps) 2^-40`` subtracted (total variation
  ``<= 2^-40`` per side), found by a bracketing search keeping the lower end. The divergence
  grows with ``Delta`` and falls with ``sigma`` (checked numerically at small scales
  in ``tests/protocol/test_gaussian_calibration.py``; at these scales it is the continuous
  Gaussian's, a monotone function of ``Delta/sigma`` (Balle & Wang 2018), and
  ``tests/audit/test_audit_local.py`` checks the resulting epsilon around the audited
  points), so when both intervals hold,
  ``epsilon_param <= eps(Delta, sigma) <= eps0`` for a correct randomizer: a lower
  bound at the row's confidence *given the model* (the assumption-free bound needs
  no model). Because of the clamp term it never reports more than
  ``40 ln 2 = 27.7`` (far above every audited claim).
* **Checking the model.** A chi-square goodness-of-fit test of each side's runs
  against ``m_s + N_Z(0, S^2)``: 40 equiprobable bins, then tail bins of a third of
  the previous mass while 20 runs are expected (down to ``~10^-5`` per tail at
  ``2 x 10^6`` runs: the hockey stick at ``delta0 = 1e-6`` weighs tails of mass
  ``~10^-5``), edges at half-integers; the bin probabilities are
  ``Phi((edge - m_s)/S)``, the discrete Gaussian's CDF up to ``~0.01/sigma^2``
  (Euler–Maclaurin for the midpoint sums, below ``10^-8`` here, a hundredth of a
  run at ``10^6``). The statistic, summed over both sides, is referred to
  chi-square with ``sum (bins - 1)`` degrees of freedom: with the three parameters
  estimated from the raw runs it is stochastically smaller (Chernoff & Lehmann
  1954), so the test is conservative. At level :data:`FIT_LEVEL` (1e-4 per row)
  a rejection withholds the bound (``epsilon_param = None``) and ``detail`` says
  the noise is not discrete-Gaussian shaped -- itself a finding about the code. The
  level is not part of the family-wise split: a rejection only withholds a bound,
  so it cannot raise a false violation. A pass does not prove the shape, only that
  these runs cannot tell it from one; a Laplace noise of the same variance (whose
  true epsilon is far below the Gaussian one: the parametric bound would overstate
  it) is rejected at ``p ~ 1e-5`` already with 400 runs per side, at ``p = 0`` (in
  double precision) with ``2 x 10^4``.
* **Verdict.** A row fails when either bound exceeds ``eps0``; ``ratio`` is the larger
  over ``eps0`` and ``ratio_method`` names it. Figures (seed 0, default trials,
  family-wise 1 - 0.05/92): see ``docs/design.md``, the audit section. The
  parametric estimate reuses the runs: it adds ~0.3 s per Gaussian row at
  ``2 x 10^6`` runs per side.

Runs go through the shipped code paths: :func:`~shuffledp.client.mechanisms.randomize_round`
for the four protocol mechanisms, :func:`~shuffledp.client.krr.randomize_krr` and
:func:`~shuffledp.client.hadamard_response.randomize_hadamard_response` for the
frequency oracles, with :class:`SeededSource` (vectorized, ``trials`` per side) and
:class:`SystemSource` (the device path, ``system_trials`` per side: it samples the
mean noises exactly in Python at ~0.1-0.3 ms per report).

Another implementation of the round mechanisms (a device client in another language) is
audited with the same cases and statistics through :func:`run_audit`'s ``sampler`` hook:
:mod:`shuffledp.audit.external` runs a command for the reports.

Planted faults for testing the audit itself live in :mod:`shuffledp.audit.faults`.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable, Iterable
from typing import TypeVar
from dataclasses import asdict, dataclass

import numpy as np

from shuffledp.client.hadamard_response import (
    choose_hadamard_response,
    randomize_hadamard_response,
)
from shuffledp.client.krr import randomize_krr
from shuffledp.client.mean_randomizer import TAIL_BITS, PerUserGrid, to_grid
from shuffledp.client.mechanisms import randomize_round
from shuffledp.client.vector_randomizer import rotation_of
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.gaussian_calibration import discrete_gaussian_delta
from shuffledp.protocol.mechanisms.hadamard import hadamard_entry
from shuffledp.protocol.wire.messages import (
    MAX_EPSILON,
    MIN_EPSILON,
    HadamardRangeParams,
    ProjectedMeanParams,
    VectorMeanParams,
    VectorRangeParams,
)
from shuffledp.protocol.mechanisms.randomness import RandomSource, SeededSource, SystemSource

__all__ = [
    "DEFAULT_EPSILONS",
    "DEFAULT_SYSTEM_TRIALS",
    "DEFAULT_TRIALS",
    "FIT_LEVEL",
    "GAUSSIAN_DELTA0",
    "GAUSSIAN_STRESS",
    "SOURCES",
    "AuditCase",
    "Sampler",
    "AuditResult",
    "ParametricBound",
    "audit_local",
    "audit_local_runs",
    "clopper_pearson",
    "epsilon_lower_bound",
    "expected_epsilon_lower_bound",
    "format_results",
    "gaussian_parametric_bound",
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
#: Level of the goodness-of-fit test that gates each parametric (Gaussian-shape) bound.
FIT_LEVEL = 1e-4
# Fit bins: this many equiprobable central bins, then tail bins of a third of the mass of
# the previous one while at least _FIT_MIN_EXPECTED runs are expected in them.
_FIT_CENTRAL_BINS = 40
_FIT_MIN_EXPECTED = 20.0
# The binned fit uses the normal CDF at half-integers (error ~0.01/sigma^2): below this
# fitted sigma (grid units) the parametric bound is not computed.
_FIT_MIN_SIGMA = 10.0
# Relative slack on discrete_gaussian_delta, an upper bound within ~1e-11 relative here.
_PROFILE_RTOL = 1e-6
# P(a mean report's noise is clamped to report_range) <= 2^-TAIL_BITS per run.
_CLAMP_PROBABILITY = 2.0**-TAIL_BITS
# Largest epsilon the parametric search reports (a lower bound: "at least this").
_PARAMETRIC_EPS_CAP = 64.0


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
# The parametric (Gaussian-shape) bound
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ParametricBound:
    """The Gaussian-shape lower bound of one row (see the module docstring).

    ``epsilon`` is ``None`` when the bound is withheld (``detail`` says why: the fit
    test rejected the discrete-Gaussian shape, or there was nothing to fit). The
    estimates are in grid units: ``shift = m1 - m0`` with its integer lower confidence
    bound ``shift_low``, the pooled standard deviation ``sigma`` with its upper
    confidence bound ``sigma_high``; ``runs`` per side were used.
    """

    epsilon: float | None
    shift: float
    shift_low: int
    sigma: float
    sigma_high: float
    fit_pvalue: float | None
    fit_level: float
    runs: int
    confidence: float
    detail: str


def _fit_counts(y: np.ndarray, center: float, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """Observed and expected counts of integer runs ``y`` in bins of the fitted law ``center + N_Z(0, sigma^2)``.

    Edges are half-integers (no run on an edge) at the fitted quantiles: ``k``
    equiprobable central bins, then in each tail bins of a third of the mass of the
    previous one while ``_FIT_MIN_EXPECTED`` runs are expected in them. Bin
    probabilities are ``Phi((edge - center)/sigma)`` differences: the discrete
    Gaussian's CDF at ``j + 1/2`` is the normal one up to ``~0.01/sigma^2``
    (Euler–Maclaurin for the midpoint sums).
    """
    from scipy.special import ndtr, ndtri

    n = y.size
    k = int(min(_FIT_CENTRAL_BINS, max(4, n // (2 * int(_FIT_MIN_EXPECTED)))))
    levels = list(np.arange(1, k) / k)
    tail = 1.0 / k / 3.0
    while tail * n >= _FIT_MIN_EXPECTED:
        levels += [tail, 1.0 - tail]
        tail /= 3.0
    edges = np.unique(np.floor(center + sigma * ndtri(np.sort(levels))) + 0.5)
    cdf = np.concatenate(([0.0], ndtr((edges - center) / sigma), [1.0]))
    observed = np.bincount(np.searchsorted(edges, y), minlength=edges.size + 1)
    return observed, n * np.diff(cdf)


def _gaussian_fit_pvalue(sides: list[tuple[np.ndarray, float]], sigma: float) -> float:
    """Chi-square goodness of fit of every side's runs against its fitted discrete Gaussian.

    ``sum (O - E)^2 / E`` over the bins of both sides, referred to chi-square with
    ``sum (bins - 1)`` degrees of freedom. The centres and ``sigma`` are estimated from
    the raw runs, which makes the statistic stochastically smaller than that law
    (Chernoff & Lehmann 1954): the p-value is conservative.
    """
    from scipy.stats import chi2

    statistic, dof = 0.0, 0
    for y, center in sides:
        observed, expected = _fit_counts(y, center, sigma)
        statistic += float(np.sum((observed - expected) ** 2 / expected))
        dof += observed.size - 1
    return float(chi2.sf(statistic, dof))


def _gaussian_epsilon_low(sigma2: float, shift: int, delta0: float) -> float:
    """A lower bound on ``inf{eps : H_eps <= delta0}`` for ``c + N_Z(0, sigma2)`` vs its shift by ``shift``,
    both clamped as the randomizer does.

    ``discrete_gaussian_delta`` (CKS20 Thm 7, exact up to a relative ~1e-11 here,
    always from above) is divided by ``1 + _PROFILE_RTOL`` and the clamp's effect
    subtracted: clamping changes each law by total variation at most ``2^-40``, so
    the hockey-stick divergence by at most ``(1 + e^eps) 2^-40``. The result is a
    non-increasing lower bound ``d(eps)`` on the true divergence. The search keeps a
    bracket ``d(lo) > delta0 >= d(hi)`` (Illinois steps on ``log d``, bisection while
    ``d(hi) <= 0``) down to a relative width of 1e-8 and returns its lower end.
    """
    if shift < 1:
        return 0.0
    log_target = math.log(delta0)

    def f(eps: float) -> float:  # log d(eps) - log delta0, decreasing; -inf where d <= 0
        d = discrete_gaussian_delta(sigma2, eps, shift) / (1.0 + _PROFILE_RTOL) - (1.0 + math.exp(eps)) * _CLAMP_PROBABILITY
        return math.log(d) - log_target if d > 0.0 else -math.inf

    f_lo = f(0.0)
    if f_lo <= 0.0:
        return 0.0
    lo, hi = 0.0, 1.0
    f_hi = f(hi)
    while f_hi > 0.0:
        lo, f_lo = hi, f_hi
        if hi >= _PARAMETRIC_EPS_CAP:
            return lo
        hi *= 2.0
        f_hi = f(hi)
    side = 0
    while hi - lo > 1e-8 * hi:
        if math.isinf(f_hi):
            x = 0.5 * (lo + hi)
        else:
            x = hi - f_hi * (hi - lo) / (f_hi - f_lo)
            x = min(max(x, lo + 1e-3 * (hi - lo)), hi - 1e-3 * (hi - lo))
        f_x = f(x)
        if f_x > 0.0:
            lo, f_lo = x, f_x
            if side == 1:
                f_hi /= 2.0
            side = 1
        else:
            hi, f_hi = x, f_x
            if side == -1:
                f_lo /= 2.0
            side = -1
    return lo


def gaussian_parametric_bound(
    values_x: np.ndarray,
    values_x_prime: np.ndarray,
    delta0: float,
    confidence: float = 0.95,
    fit_level: float = FIT_LEVEL,
) -> ParametricBound:
    """The parametric lower bound on epsilon of a Gaussian mean report at ``delta0``.

    ``values_x`` / ``values_x_prime``: the integer reports (grid units) of runs on the
    two inputs of the pair, each assumed ``c_s + N_Z(0, sigma^2)`` (clamped) with
    integers ``c_0 <= c_1``. With ``a = 1 - confidence - N 2^-40`` (``N`` runs in all)
    and the pooled two-sample estimates,

    * ``shift_low = ceil(m1 - m0 - t_{1-a/2}(N-2) S sqrt(1/n0 + 1/n1))`` (``c1 - c0``
      is an integer),
    * ``sigma_high^2 = (N-2) S^2 / chi2_{a/2}(N-2)``,

    and ``epsilon`` is the exact discrete-Gaussian epsilon at ``delta0`` of the shift
    ``shift_low`` under noise ``sigma_high`` (:func:`_gaussian_epsilon_low`). It is a
    lower bound on the pair's epsilon with probability at least ``confidence``
    *given the model*; the model is checked by a chi-square fit at ``fit_level``, and
    when the fit rejects it, ``epsilon`` is ``None``.
    """
    from scipy.stats import chi2, t

    confidence = _check_confidence(confidence)
    delta0 = _check_delta(delta0)
    y0 = np.asarray(values_x, dtype=np.float64).ravel()
    y1 = np.asarray(values_x_prime, dtype=np.float64).ravel()
    n0, n1 = y0.size, y1.size
    if n0 < 2 or n1 < 2:
        raise InvalidParameter("values", f"need at least 2 runs per side, got {n0} and {n1}")
    n_all = n0 + n1
    alpha = 1.0 - confidence - n_all * _CLAMP_PROBABILITY
    if alpha <= 0.0:
        raise InvalidParameter("confidence", f"{confidence!r} leaves no error for {n_all} runs (clamp probability)")
    m0, m1 = float(np.mean(y0)), float(np.mean(y1))
    s2 = (float(np.sum((y0 - m0) ** 2)) + float(np.sum((y1 - m1) ** 2))) / (n_all - 2)
    sigma = math.sqrt(s2)
    shift = m1 - m0
    if sigma < _FIT_MIN_SIGMA:
        return ParametricBound(None, shift, 0, sigma, sigma, None, fit_level, min(n0, n1), confidence,
                               f"no parametric bound: fitted sigma {sigma:.3g} < {_FIT_MIN_SIGMA:g} grid units")
    half_width = float(t.ppf(1.0 - alpha / 2.0, n_all - 2)) * sigma * math.sqrt(1.0 / n0 + 1.0 / n1)
    shift_low = max(0, math.ceil(shift - half_width - 1e-9))
    sigma_high = math.sqrt((n_all - 2) * s2 / float(chi2.ppf(alpha / 2.0, n_all - 2)))
    p_value = _gaussian_fit_pvalue([(y0, m0), (y1, m1)], sigma)
    estimates = f"shift >= {shift_low} (est. {shift:.1f}), sigma <= {sigma_high:.1f} (est. {sigma:.1f})"
    if p_value < fit_level:
        detail = (f"parametric bound withheld: the noise is not discrete-Gaussian shaped "
                  f"(chi-square fit p = {p_value:.2g} < {fit_level:g}; {estimates})")
        return ParametricBound(None, shift, shift_low, sigma, sigma_high, p_value, fit_level, min(n0, n1),
                               confidence, detail)
    epsilon = _gaussian_epsilon_low(sigma_high**2, shift_low, delta0)
    return ParametricBound(epsilon, shift, shift_low, sigma, sigma_high, p_value, fit_level, min(n0, n1), confidence,
                           f"Gaussian fit p = {p_value:.2g}: {estimates}")


# --------------------------------------------------------------------------
# Audit cases: one worst-case pair and one event per randomizer
# --------------------------------------------------------------------------

Runner = Callable[[int, int, RandomSource], np.ndarray]
#: The two local means (datasets D0 and D1) of a data-driven case: scalars, or vectors.
DataPair = tuple[np.floating | np.ndarray, np.floating | np.ndarray]


@dataclass(frozen=True)
class AuditCase:
    """A worst-case input pair of one randomizer and a distinguishing event.

    ``run(side, n, source)`` runs the real randomizer ``n`` times on ``x`` (side 0) or
    ``x'`` (side 1) and returns the reports; ``statistic(reports)`` maps them to one
    value per run: the event's indicator (``threshold`` False) or the value whose
    ``{value <= t}`` is the event (``threshold`` True; ``t`` is chosen on a selection
    run). ``event`` describes the event (``{t}`` is filled in for thresholds).
    ``gaussian``: the statistic is a report ``c_s + N_Z(0, sigma^2)`` with both inputs
    exactly on grid points, so the row also gets the parametric bound
    (:func:`gaussian_parametric_bound`).
    ``params`` and ``pair``: the round parameters and the two local inputs of a case that
    runs a round mechanism (:func:`randomize_round`), so that a :data:`Sampler` can run
    another implementation of the same randomizer on them (``None`` for the frequency
    oracles, which are not round mechanisms).
    """

    mechanism: str
    epsilon0: float
    delta0: float
    inputs: str
    event: str
    run: Runner
    statistic: Callable[[np.ndarray], np.ndarray]
    threshold: bool = False
    gaussian: bool = False
    params: object | None = None
    pair: DataPair | None = None


@dataclass(frozen=True)
class AuditResult:
    """One audited row: a randomizer at one claim, with one random source.

    ``epsilon_lb`` is the assumption-free (event) bound; ``epsilon_param`` the
    parametric (Gaussian-shape) bound of the Gaussian reports, ``None`` elsewhere or
    when withheld (``detail`` says why; ``parametric`` holds its estimates). ``ratio``
    is the larger of the two over ``eps0`` and ``ratio_method`` (``"event"`` or
    ``"parametric"``) names the one that gave it. ``passed``: neither bound exceeds
    ``eps0``. Both bounds are at ``confidence``.
    """

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
    epsilon_param: float | None = None
    ratio_method: str = "event"
    detail: str = ""
    parametric: ParametricBound | None = None

    def as_dict(self) -> dict:
        """Every field, plus the power fields of :func:`shuffledp.audit.power.power_fields`:
        ``no_power`` (both bounds 0, or the parametric one withheld), and for such rows the
        runs per input with which the event bound is positive (``runs_needed`` at the
        claim's rates, ``runs_needed_observed`` at the observed ones)."""
        from shuffledp.audit.power import power_fields

        out = asdict(self)
        best = max(self.epsilon_lb, self.epsilon_param if self.epsilon_param is not None else 0.0)
        out.update(power_fields(best, self.count_x, self.count_x_prime, self.trials, self.epsilon0, self.delta0,
                                self.confidence))
        return out


def _data_runner(params, epsilon0: float, delta0: float, pair: DataPair) -> Runner:
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
        params=params,
        pair=pair,
    )


def _grid_value(reports: np.ndarray) -> np.ndarray:
    return reports[:, 0, -1]


def _on_grid(projected: np.ndarray, grid, grid_levels: int) -> bool:
    """Whether the pair's (rotated) values project exactly to grid points 0 and ``G``: randomized
    rounding is then the identity, and each side's report is one point plus the noise."""
    floor, frac = to_grid(projected, grid)
    return bool(np.all(frac == 0.0) and np.all(floor[0] == 0) and np.all(floor[1] == grid_levels))


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
        gaussian=noise == "gaussian" and _on_grid(np.array(pair), params, params.grid_levels),
        params=params,
        pair=pair,
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
        params=params,
        pair=pair,
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
    rotated = rotation_of(params).apply(np.stack(pair))
    grid = PerUserGrid(ranges[:, 0], ranges[:, 1], noise, params.grid_levels)
    return AuditCase(
        f"vector-mean-{noise}",
        eps,
        delta,
        f"D = {params.padded_dim}, all rotated coords at grid 0 vs G = {params.grid_levels}",
        "value <= {t} (any coord)",
        _data_runner(params, eps, delta, pair),
        _grid_value,
        threshold=True,
        gaussian=noise == "gaussian" and _on_grid(rotated, grid, params.grid_levels),
        params=params,
        pair=pair,
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
#: Another implementation of a case's randomizer: ``sampler(case, side, n, purpose)`` returns the
#: reports (int64 ``(n, messages, values)``, as :func:`randomize_round`) of ``n`` runs on
#: ``case.pair[side]``; ``purpose`` is 0 for threshold-selection runs and 1 for evaluation runs
#: (a sampler may keep the latter, e.g. to compare laws). The built-in randomizer with a random
#: source is ``case.run(side, n, source)``; :mod:`shuffledp.audit.external` runs a command.
Sampler = Callable[["AuditCase", int, int, int], np.ndarray]


def _stream(seed: int, case: AuditCase, purpose: int, side: int) -> SeededSource:
    """An independent PCG64 stream per (seed, case, purpose, side)."""
    key = zlib.crc32(f"{case.mechanism}|{case.epsilon0!r}|{case.delta0!r}".encode())
    return SeededSource(np.random.SeedSequence([seed, key, purpose, side]))


def _statistics(case: AuditCase, draw: Callable[[int], np.ndarray], n: int, progress: Progress | None, stage: str,
                chunk: int = _CHUNK) -> np.ndarray:
    """The case's statistic over ``n`` runs of one side (``draw(m)``: the reports of ``m`` runs), in
    chunks of ``chunk`` runs."""
    parts = []
    done = 0
    while done < n:
        m = min(chunk, n - done)
        parts.append(np.asarray(case.statistic(draw(m))))
        done += m
        if progress is not None:
            progress(stage, m)
    return np.concatenate(parts) if parts else np.zeros(0)


_Value = TypeVar("_Value")


def _memoized(memo: dict | None, key: tuple, compute: Callable[[], _Value]) -> _Value:
    """``memo[key]`` when another row of the case computed it (``key`` names everything that fixes
    the value), else ``compute()`` (kept there); always ``compute()`` without a memo."""
    if memo is None:
        return compute()
    if key not in memo:
        memo[key] = compute()
    return memo[key]


def _sorted_quantiles(sorted_values: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """``np.quantile(sorted_values, levels, method="inverted_cdf")`` of an already sorted array, by indexing.

    The inverted-CDF quantile at level ``q`` of ``n`` values is the order statistic at
    0-based index ``ceil(n q - 1)`` (at least 0), with ``n q - 1`` computed in floating
    point as NumPy does; the sorted array needs no partition (one per level otherwise).
    """
    index = sorted_values.size * np.asarray(levels, dtype=np.float64) - 1.0
    below = np.floor(index)
    position = np.where(index == below, below, below + 1.0).astype(np.intp)
    return sorted_values[np.maximum(position, 0)]


def _selection_forecast(sel_x: np.ndarray, sel_xp: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The candidate thresholds of :func:`_choose_threshold` and, for each, the pessimistic estimates
    of ``P[x in E]`` and ``P[x' in E]`` from the selection runs: what does not depend on ``n_eval``."""
    sx = np.sort(sel_x)
    sxp = np.sort(sel_xp)
    candidates = np.unique(_sorted_quantiles(sx, _THRESHOLD_LEVELS))
    k1 = np.searchsorted(sx, candidates, side="right")
    k2 = np.searchsorted(sxp, candidates, side="right")
    return candidates, _cp_low(k1, sx.size, _SELECTION_ALPHA), _cp_high(k2, sxp.size, _SELECTION_ALPHA)


def _choose_threshold(forecast: tuple[np.ndarray, np.ndarray, np.ndarray], n_eval: int, delta: float,
                      confidence: float) -> int:
    """The ``t`` maximising a pessimistic forecast of the evaluation bound, from the selection runs alone
    (``forecast``: :func:`_selection_forecast` of them).

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
    candidates, p_pess, q_pess = forecast
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
    parametric_confidence: float | None = None,
    sampler: Sampler | None = None,
    chunk: int = _CHUNK,
    selection_memo: dict | None = None,
) -> AuditResult:
    """Audit one case: ``trials`` runs per side with ``source`` (``"seeded"`` or ``"system"``).

    Threshold cases first draw ``selection_trials`` runs per side (default: ``trials``,
    at least ``10^5``) from independent seeded streams to choose ``t``, then evaluate
    on fresh runs. ``seed`` fixes the seeded streams (the system source is the OS
    CSPRNG and ignores it). ``progress(stage, runs)`` is called as runs complete.

    Gaussian cases (``case.gaussian``) also get the parametric bound at
    ``parametric_confidence`` (default ``confidence``), from every run of the row's
    own source: the evaluation runs and, for the seeded source, the selection runs
    (``trials + selection_trials`` per side); the system source's row uses its
    system runs only.

    With a ``sampler`` (:data:`Sampler`), every run -- selection and evaluation -- comes from
    it instead of the built-in randomizer, ``source`` only labels the row, and the parametric
    bound uses the selection runs too (they come from the same implementation, as for the
    seeded source). ``chunk``: the most runs asked for at once.

    ``selection_memo``: a dict, kept by the caller for *this case only*, in which the
    selection statistics (and the threshold forecast made from them) are stored under what
    fixes their draws (``seed``, side, ``selection_trials``, ``chunk``); another row of the
    case (the other source) that would draw the same seeded runs takes them from it
    instead: the same numbers, drawn once. Not used with a ``sampler``.
    """
    if sampler is None and source not in SOURCES:
        raise InvalidParameter("source", f"must be one of {SOURCES}, got {source!r}")
    if sampler is not None and (case.params is None or case.pair is None):
        raise InvalidParameter("case", f"{case.mechanism} is not a round mechanism: no other implementation can run it")
    chunk = _check_count("chunk", chunk, 1)
    trials = _check_count("trials", trials, 1)
    seed = _check_count("seed", seed, 0)
    confidence = _check_confidence(confidence)
    parametric_confidence = confidence if parametric_confidence is None else _check_confidence(parametric_confidence)
    if selection_trials is None:
        selection_trials = max(trials, 10**5)
    selection_trials = _check_count("selection_trials", selection_trials, 1)
    stage = f"{case.mechanism} eps0={case.epsilon0:g} {source}"
    start = time.perf_counter()
    event = case.event
    t = 0
    sel: list[np.ndarray] = []

    def draw(side: int, purpose: int) -> Callable[[int], np.ndarray]:
        if sampler is not None:
            return lambda m: sampler(case, side, m, purpose)
        # selection: always a seeded stream; evaluation: the row's source (one stream per side)
        src: RandomSource = SystemSource() if purpose == 1 and source == "system" else _stream(seed, case, purpose, side)
        return lambda m: case.run(side, m, src)

    if case.threshold:
        memo = None if sampler is not None else selection_memo
        def selection_runs(side: int) -> Callable[[], np.ndarray]:
            return lambda: _statistics(case, draw(side, 0), selection_trials, progress, stage + " (select)", chunk)

        sel = [_memoized(memo, ("runs", seed, side, selection_trials, chunk), selection_runs(side)) for side in (0, 1)]
        forecast = _memoized(memo, ("forecast", seed, selection_trials, chunk), lambda: _selection_forecast(*sel))
        t = _choose_threshold(forecast, trials, case.delta0, confidence)
        event = case.event.format(t=t)
    counts = []
    runs: list[list[np.ndarray]] = [[], []]
    for side in (0, 1):
        values = _statistics(case, draw(side, 1), trials, progress, stage, chunk)
        hits = values <= t if case.threshold else values.astype(bool)
        counts.append(int(np.count_nonzero(hits)))
        if case.gaussian:
            runs[side].append(values)
            if (source == "seeded" or sampler is not None) and case.threshold:
                runs[side].append(sel[side])
    lb = float(_lower_bound(counts[0], trials, counts[1], trials, case.delta0, confidence))
    param = None
    if case.gaussian:
        param = gaussian_parametric_bound(np.concatenate(runs[0]), np.concatenate(runs[1]), case.delta0,
                                          parametric_confidence)
    param_lb = None if param is None else param.epsilon
    best = max(lb, param_lb if param_lb is not None else -1.0)
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
        ratio=best / case.epsilon0,
        passed=lb <= case.epsilon0 and (param_lb is None or param_lb <= case.epsilon0),
        confidence=confidence,
        seconds=time.perf_counter() - start,
        epsilon_param=param_lb,
        ratio_method="parametric" if param_lb is not None and param_lb > lb else "event",
        detail="" if param is None else param.detail,
        parametric=param,
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
    source (0 skips it). ``familywise`` (default): each of the ``m`` bounds (one per row,
    plus the parametric bound of every Gaussian row) is at ``1 - (1 - confidence)/m``, so
    that a correct implementation fails *any* row with probability at most
    ``1 - confidence`` (the parametric bounds: given their model); otherwise every
    bound is at ``confidence``. The audit passes when every row does
    (``all(r.passed for r in rows)``). Rows come source by source, in the order of the
    cases; a threshold case's seeded selection runs come from the same streams for both
    sources, so they are drawn once when their sizes agree (``trials >= 10^5``).
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
    bounds = (len(cases) + sum(case.gaussian for case in cases)) * len(sources)
    row_confidence = 1.0 - (1.0 - confidence) / bounds if familywise else confidence
    rows: dict[tuple[str, int], AuditResult] = {}
    for index, case in enumerate(cases):
        memo: dict = {}  # this case's seeded selection runs, drawn once for both sources
        for source in sources:
            rows[source, index] = run_audit(
                case,
                source=source,
                trials=trials if source == "seeded" else system_trials,
                seed=seed,
                confidence=row_confidence,
                selection_trials=_selection_trials(source, trials),
                progress=progress,
                parametric_confidence=row_confidence,
                selection_memo=memo,
            )
    return [rows[source, index] for source in sources for index in range(len(cases))]


def _selection_trials(source: str, trials: int) -> int:
    """Selection runs per side of a threshold row in :func:`audit_local`: ``trials``, and at least
    ``10^5`` for the system source (its own trials are few)."""
    return max(trials, 10**5) if source == "system" else trials


def audit_local_runs(
    trials: int = DEFAULT_TRIALS,
    system_trials: int = DEFAULT_SYSTEM_TRIALS,
    epsilons: Iterable[float] = DEFAULT_EPSILONS,
    *,
    sources: Iterable[str] = SOURCES,
    gaussian_delta0: float = GAUSSIAN_DELTA0,
    gaussian_stress: Iterable[tuple[float, float]] = GAUSSIAN_STRESS,
    k: int = DEFAULT_K,
    **_: object,
) -> dict[str, int]:
    """The randomizer runs :func:`audit_local` makes with these arguments (the same ones; others
    are ignored): ``{"seeded": runs from seeded streams (selection runs included), "system": runs
    from the OS source}``, i.e. the sum of the counts it passes to ``progress``."""
    sources = tuple(sources)
    if system_trials == 0:
        sources = tuple(s for s in sources if s != "system")
    cases = local_cases([float(e) for e in epsilons], gaussian_delta0=gaussian_delta0,
                        gaussian_stress=[(float(e), float(d)) for e, d in gaussian_stress], k=k)
    runs = {"seeded": 0, "system": 0}
    for case in cases:
        selections = set()  # selection sizes drawn for this case (a second row of the same size reuses them)
        for source in sources:
            runs[source] += 2 * (trials if source == "seeded" else system_trials)
            if case.threshold and _selection_trials(source, trials) not in selections:
                selections.add(_selection_trials(source, trials))
                runs["seeded"] += 2 * _selection_trials(source, trials)
    return runs


def format_results(results: Iterable[AuditResult]) -> str:
    """A fixed-width table of audit rows, one line each, and a PASS/FAIL summary line.

    ``event``: the assumption-free bound; ``gauss``: the parametric bound (Gaussian
    rows; ``-`` elsewhere or withheld, with the reason on the next line)."""
    rows = list(results)
    header = (
        f"{'mechanism':<24} {'source':<6} {'eps0':>5} {'delta0':>7} {'trials':>8} "
        f"{'event':>7} {'gauss':>7} {'ratio':>6} {'from':<10} {'result':<6} {'secs':>6}  event"
    )
    lines = [header]
    for r in rows:
        param = "-" if r.epsilon_param is None else f"{r.epsilon_param:.4f}"
        lines.append(
            f"{r.mechanism:<24} {r.source:<6} {r.epsilon0:>5g} {r.delta0:>7.0e} {r.trials:>8d} "
            f"{r.epsilon_lb:>7.4f} {param:>7} {r.ratio:>6.3f} {r.ratio_method:<10} "
            f"{'pass' if r.passed else 'FAIL':<6} {r.seconds:>6.1f}  {r.event}"
        )
        if r.detail:
            lines.append(f"    {r.detail}")
    failed = [r for r in rows if not r.passed]
    lines.append(f"{'PASS' if not failed else 'FAIL'}: {len(rows) - len(failed)} of {len(rows)} rows within their claims")
    return "\n".join(lines)
