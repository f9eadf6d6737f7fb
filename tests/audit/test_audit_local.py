"""The local audit (shuffledp/audit/local.py) and its planted faults (shuffledp/audit/faults.py).

Statistical assertions use fixed seeds chosen before looking at any outcome, and
thresholds derived from the Clopper–Pearson widths (not tuned):

* validity: on correct code every bound stays at or below its claim; the rows of
  one test are bounded at family-wise level ALPHA (Bonferroni over the rows, as
  ``audit_local(familywise=True)`` does), so a random seed would fail with
  probability at most ALPHA;
* tightness: the realised bound of binary randomized response is its expectation
  (:func:`expected_epsilon_lower_bound`) up to a normal fluctuation of standard
  deviation ``sqrt((1-P)/(n P) + (1-Q)/(n Q))``; the test first checks that the
  expectation clears ``0.9 eps0`` by more than 5 of those;
* planted faults: the faulty mechanism's true epsilon exceeds the claim by more
  than the audit's slack at the default 10^6 trials;
* the parametric (Gaussian-shape) bound: its expectation is computed from the
  model (the confidence bounds at the true shift and scale) and its spread from the
  standard deviation of the estimated ``Delta/sigma``; tightness asserts that the
  expectation clears ``0.95 eps0`` by more than 5 spreads, and the realised bound
  lies within 5 spreads of it.
"""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
from scipy import stats

import shuffledp.audit.local as audit_local_module
from shuffledp.audit.faults import FAULTS, planted_fault
from shuffledp.audit.local import (
    FIT_LEVEL,
    GAUSSIAN_STRESS,
    AuditResult,
    audit_local,
    clopper_pearson,
    epsilon_lower_bound,
    expected_epsilon_lower_bound,
    gaussian_parametric_bound,
    hadamard_range_case,
    hadamard_response_case,
    krr_case,
    local_cases,
    projected_mean_case,
    run_audit,
    vector_mean_case,
    vector_range_case,
)
from shuffledp.client import range_randomizer
from shuffledp.client.range_randomizer import keep_probability
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.gaussian_calibration import discrete_gaussian_delta, discrete_laplace_variance
from shuffledp.protocol.wire.messages import ProjectedMeanParams
from shuffledp.protocol.mechanisms.randomness import SeededSource, SystemSource

ALPHA = 0.05
#: The grid of the default Gaussian cases (projected and vector: G = 4096 both).
GAUSSIAN_PARAMS = ProjectedMeanParams(0.0, 1.0, "gaussian", 4096)
G = 4096


class _ReproducibleSystemSource(SystemSource):
    """The device source's exact samplers on a seeded bit stream (the hook SystemSource offers tests),
    so that the system-source rows are deterministic."""

    _streams = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        bits = random.Random(20_000 + next(self._streams))
        self._randbelow = bits.randrange
        self._randbits = bits.getrandbits


@pytest.fixture
def reproducible_system_source(monkeypatch):
    monkeypatch.setattr(_ReproducibleSystemSource, "_streams", itertools.count())
    monkeypatch.setattr(audit_local_module, "SystemSource", _ReproducibleSystemSource)


# --------------------------------------------------------------------------
# Clopper–Pearson and the bound
# --------------------------------------------------------------------------


@pytest.mark.parametrize("k,n", [(0, 10), (1, 10), (5, 20), (19, 20), (20, 20), (480, 1000), (3, 10**6)])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.999])
def test_clopper_pearson_matches_scipy_exact_interval(k, n, confidence):
    low, high = clopper_pearson(k, n, confidence)
    ref = stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
    # binomtest finds the ends by root-finding on the binomial cdf (about 6 digits at n = 10^6)
    assert low == pytest.approx(ref.low, rel=1e-6, abs=1e-15)
    assert high == pytest.approx(ref.high, rel=1e-6, abs=1e-15)


def test_clopper_pearson_is_exact_in_the_tail():
    """The lower end for 3 of 10^6 at 90 %: the p with P[Bin(10^6, p) >= 3] = 0.05, solved in 40 digits."""
    import mpmath

    with mpmath.workdps(40):
        n, alpha = 10**6, mpmath.mpf("0.05")
        tail = lambda p: 1 - sum(mpmath.binomial(n, j) * p**j * (1 - p) ** (n - j) for j in range(3)) - alpha
        exact = mpmath.findroot(tail, (mpmath.mpf("8.1e-7"), mpmath.mpf("8.3e-7")), solver="anderson")
    assert clopper_pearson(3, n, 0.9)[0] == pytest.approx(float(exact), rel=1e-12)


def test_clopper_pearson_edges_in_closed_form():
    n, alpha = 50, 0.05
    assert clopper_pearson(0, n, 0.95) == (0.0, pytest.approx(1 - (alpha / 2) ** (1 / n)))
    assert clopper_pearson(n, n, 0.95) == (pytest.approx((alpha / 2) ** (1 / n)), 1.0)
    low, high = clopper_pearson(np.int64(7), np.int64(9))  # numpy integers accepted
    assert 0 < low < 7 / 9 < high < 1


def test_epsilon_lower_bound_is_bonferroni_of_two_intervals():
    k1, n1, k2, n2 = 7000, 10000, 2500, 10000
    p_lo = clopper_pearson(k1, n1, 0.95)[0]
    q_hi = clopper_pearson(k2, n2, 0.95)[1]
    # each end of a two-sided 95 % interval is a one-sided 97.5 % bound
    assert p_lo == pytest.approx(stats.beta.ppf(0.025, k1, n1 - k1 + 1))
    assert epsilon_lower_bound(k1, n1, k2, n2) == pytest.approx(math.log(p_lo / q_hi))
    assert epsilon_lower_bound(k1, n1, k2, n2, delta=0.01) == pytest.approx(math.log((p_lo - 0.01) / q_hi))
    assert epsilon_lower_bound(k1, n1, k2, n2, confidence=0.99) < epsilon_lower_bound(k1, n1, k2, n2)
    # no evidence: zero, never negative
    assert epsilon_lower_bound(100, 1000, 900, 1000) == 0.0
    assert epsilon_lower_bound(0, 1000, 0, 1000) == 0.0
    assert epsilon_lower_bound(500, 1000, 0, 1000, delta=0.6) == 0.0
    # all x runs in E, none of the x' runs: bounded by the sample size, ln(n / 3.7) or so
    assert 0 < epsilon_lower_bound(1000, 1000, 0, 1000) < math.log(1000)


@pytest.mark.parametrize(
    "call",
    [
        lambda: clopper_pearson(5, 0),
        lambda: clopper_pearson(11, 10),
        lambda: clopper_pearson(-1, 10),
        lambda: clopper_pearson(2.0, 10),
        lambda: clopper_pearson(True, 10),
        lambda: clopper_pearson(2, 10, 1.0),
        lambda: clopper_pearson(2, 10, 0.0),
        lambda: clopper_pearson(2, 10, float("nan")),
        lambda: epsilon_lower_bound(1, 10, 1, 10, delta=-0.1),
        lambda: epsilon_lower_bound(1, 10, 1, 10, delta=1.0),
        lambda: epsilon_lower_bound(1, 10, 11, 10),
        lambda: expected_epsilon_lower_bound(1.5, 0.1, 100),
        lambda: run_audit(hadamard_range_case(1.0), source="urandom", trials=10),
        lambda: run_audit(hadamard_range_case(1.0), trials=0),
        lambda: run_audit(hadamard_range_case(1.0), trials=10, seed=-1),
        lambda: hadamard_range_case(0.0),
        lambda: hadamard_range_case(float("inf")),
        lambda: projected_mean_case(1.0, noise="cauchy"),
        lambda: projected_mean_case(1.0, "gaussian", delta0=0.0),  # Gaussian needs delta0 > 0
        lambda: krr_case(1.0, k=1),
        lambda: audit_local(trials=10, epsilons=()),
        lambda: audit_local(trials=10, epsilons=(100.0,)),
        lambda: audit_local(trials=10, sources=("seeded", "dev-random")),
        lambda: audit_local(trials=10, confidence=1.5),
    ],
)
def test_bad_arguments_raise_invalid_parameter(call):
    with pytest.raises(InvalidParameter):
        call()


# --------------------------------------------------------------------------
# Validity and tightness on correct code
# --------------------------------------------------------------------------

VALIDITY_EPSILONS = (0.5, 4.0)


def _validity_cases():
    return local_cases(VALIDITY_EPSILONS, gaussian_stress=GAUSSIAN_STRESS)


def _bounds(cases) -> int:
    """Bounds of a set of rows: one each, plus the parametric bound of each Gaussian row (Bonferroni)."""
    return len(cases) + sum(case.gaussian for case in cases)


def test_bounds_stay_below_the_claims_seeded():
    cases = _validity_cases()
    confidence = 1 - ALPHA / _bounds(cases)
    assert sum(case.gaussian for case in cases) == 5  # projected and vector at each epsilon, and the stress claim
    for case in cases:
        row = run_audit(case, trials=20_000, seed=1, confidence=confidence, selection_trials=20_000)
        assert isinstance(row, AuditResult) and row.source == "seeded" and row.trials == 20_000
        assert row.passed and row.epsilon_lb <= case.epsilon0, row
        if case.gaussian:  # the fit passes on the real noise and the parametric bound stays below the claim too
            assert row.epsilon_param is not None and row.epsilon_param <= case.epsilon0, row
            assert row.parametric.fit_pvalue >= FIT_LEVEL and row.parametric.runs == 40_000
        else:
            assert row.epsilon_param is None and row.parametric is None and row.detail == ""
        best = max(row.epsilon_lb, row.epsilon_param or 0.0)
        assert row.ratio == pytest.approx(best / case.epsilon0)
        assert row.ratio_method == ("parametric" if best > row.epsilon_lb else "event")


def test_bounds_stay_below_the_claims_system_source(reproducible_system_source):
    cases = [c for c in _validity_cases() if c.epsilon0 == 4.0]
    confidence = 1 - ALPHA / _bounds(cases)
    for case in cases:
        row = run_audit(case, source="system", trials=400, confidence=confidence, selection_trials=20_000)
        assert row.source == "system" and row.passed, row
        if case.gaussian:  # from the 400 system runs per side only, not the seeded selection runs
            assert row.parametric.runs == 400 and row.epsilon_param is not None, row


@pytest.mark.parametrize("eps0", [1.0, 4.0])
def test_binary_rr_bound_is_tight_at_a_million_trials(eps0):
    n = 10**6
    p = keep_probability(eps0)
    big_p, big_q = p / 2, (1 - p) / 2  # P[E | x], P[E | x'] of the hadamard-range event
    expected = expected_epsilon_lower_bound(big_p, big_q, n)
    spread = math.sqrt((1 - big_p) / (n * big_p) + (1 - big_q) / (n * big_q))
    # e.g. eps0 = 4: expected 3.980 (ratio 0.995), spread 0.0105; eps0 = 1: 0.9925, spread 0.0032
    assert expected - 0.9 * eps0 > 5 * spread
    row = run_audit(hadamard_range_case(eps0), trials=n, seed=3)
    assert row.passed
    assert row.epsilon_lb >= 0.9 * eps0
    assert abs(row.epsilon_lb - expected) < 5 * spread


def test_event_frequencies_match_the_code_probabilities():
    """The events are what the docstrings say: e.g. k-RR's E = {report == 0} has p and (1-p)/(k-1)."""
    from shuffledp.client.hadamard_response import (
        choose_hadamard_response,
        hadamard_response_probabilities,
    )
    from shuffledp.client.krr import krr_keep_probability

    n, eps, k = 200_000, 1.0, 16
    p = krr_keep_probability(k, eps)
    hr = choose_hadamard_response(k, eps)
    p_in, p_out = hadamard_response_probabilities(hr)
    s = hr.set_size if hr.blocks >= 2 else hr.block_size // 4
    keep = keep_probability(eps)
    expected = {
        "k-rr": (p, (1 - p) / (k - 1)),
        "hadamard-response": (s * p_in, s * p_out),
        "hadamard-range": (keep / 2, (1 - keep) / 2),
        "vector-range-sampled": (keep / 2, (1 - keep) / 2),
    }
    cases = [krr_case(eps, k), hadamard_response_case(eps, k), hadamard_range_case(eps), vector_range_case(eps)]
    level = 1 - ALPHA / (2 * len(cases))
    for case in cases:
        row = run_audit(case, trials=n, seed=5)
        for count, prob in zip((row.count_x, row.count_x_prime), expected[case.mechanism]):
            low, high = clopper_pearson(count, n, level)
            assert low <= prob <= high, (case.mechanism, count / n, prob)


def test_laplace_threshold_is_chosen_near_its_optimum():
    case = projected_mean_case(2.0)
    a = run_audit(case, trials=5_000, seed=9, selection_trials=50_000)
    b = run_audit(case, trials=5_000, seed=9, selection_trials=50_000)
    assert a.event == b.event and a.count_x == b.count_x  # seeded: reproducible
    t = int(a.event.split("<=")[1])
    # the Laplace optimum is t <= 0 (ratio exactly e^eps there); a selection from 50k runs lands near it
    assert -4096 / 2.0 < t < 4096 / 2.0 * 0.2


def test_selection_runs_are_drawn_once_per_case_and_are_the_same_runs(reproducible_system_source):
    """A threshold case's seeded selection runs, kept in a memo by the seeded row, are the ones the
    system row would draw itself (same streams): the same threshold, and no second drawing."""
    case = projected_mean_case(2.0)
    alone = run_audit(case, source="system", trials=200, seed=3, selection_trials=20_000)
    memo, stages = {}, []
    run_audit(case, trials=20_000, seed=3, selection_trials=20_000, selection_memo=memo)
    shared = run_audit(case, source="system", trials=200, seed=3, selection_trials=20_000, selection_memo=memo,
                       progress=lambda stage, n: stages.append(stage))
    assert shared.event == alone.event and not any(stage.endswith("(select)") for stage in stages)
    levels = np.concatenate([audit_local_module._THRESHOLD_LEVELS, [0.0, 0.5, 1.0]])
    for values in (np.sort(np.random.default_rng(1).integers(-50, 50, 999)), np.arange(3.0)):
        assert np.array_equal(audit_local_module._sorted_quantiles(values, levels),
                              np.quantile(values, levels, method="inverted_cdf"))


def test_audit_local_end_to_end_small(reproducible_system_source):
    rows = audit_local(trials=3_000, system_trials=100, epsilons=(1.0,), seed=2)
    mechanisms = {r.mechanism for r in rows}
    assert mechanisms == {
        "hadamard-range",
        "projected-mean-laplace",
        "projected-mean-gaussian",
        "vector-range-sampled",
        "vector-range-paper",
        "vector-mean-laplace",
        "vector-mean-gaussian",
        "k-rr",
        "hadamard-response",
    }
    assert {r.source for r in rows} == {"seeded", "system"}
    assert len(rows) == 2 * (9 + len(GAUSSIAN_STRESS))
    gaussian_rows = [r for r in rows if r.parametric is not None]
    assert len(gaussian_rows) == 2 * (2 + len(GAUSSIAN_STRESS))
    # Bonferroni over bounds: every row, plus the parametric bound of every Gaussian row
    assert all(r.confidence == pytest.approx(1 - 0.05 / (len(rows) + len(gaussian_rows))) for r in rows)
    assert all(r.parametric.confidence == r.confidence for r in gaussian_rows)
    assert all(r.passed for r in rows), [r for r in rows if not r.passed]
    assert all(r.trials == (3_000 if r.source == "seeded" else 100) for r in rows)
    # a progress callback sees every run
    seen = []
    audit_local(trials=1_000, system_trials=0, epsilons=(2.0,), gaussian_stress=(), progress=lambda s, n: seen.append(n))
    assert sum(seen) == 9 * 2 * 1_000 + 4 * 2 * 1_000  # four threshold cases also draw a selection run


# --------------------------------------------------------------------------
# Planted faults: detected at the default 10^6 trials
# --------------------------------------------------------------------------

DEFAULT_FAMILYWISE = 1 - 0.05 / 92  # what audit_local() uses per bound: (37 cases + 9 Gaussian) x 2 sources


def test_default_familywise_level_counts_every_bound():
    cases = local_cases()
    assert 2 * _bounds(cases) == 92


@pytest.mark.parametrize("eps0", [0.5, 1.0, 2.0, 4.0])
def test_keep_too_high_is_detected(eps0):
    # true eps0 + 0.1; the bound's slack at 10^6 trials is below 0.04 at every eps0 <= 4
    with planted_fault("keep-too-high"):
        assert range_randomizer.keep_probability(eps0) == pytest.approx(1 / (1 + math.exp(-eps0 - 0.1)))
        row = run_audit(hadamard_range_case(eps0), confidence=DEFAULT_FAMILYWISE, seed=4)
    assert not row.passed and row.epsilon_lb > eps0, row
    assert range_randomizer.keep_probability is keep_probability  # restored


def test_keep_too_high_reaches_vector_range_through_the_shared_randomizer():
    with planted_fault("keep-too-high"):
        row = run_audit(vector_range_case(2.0), confidence=DEFAULT_FAMILYWISE, seed=4)
    assert not row.passed, row


def test_classical_gaussian_is_detected_where_it_is_invalid():
    (eps0, delta0), = GAUSSIAN_STRESS
    case = projected_mean_case(eps0, "gaussian", delta0)
    from shuffledp.client import mean_randomizer

    with planted_fault("classical-gaussian"):
        row = run_audit(case, confidence=DEFAULT_FAMILYWISE, seed=4)
        faulty_sigma2 = mean_randomizer.gaussian_sigma2(GAUSSIAN_PARAMS, eps0, delta0)
    assert not row.passed and row.epsilon_lb > eps0, row
    # The parametric bound sees more: the classical sigma = 0.281 G has true eps 10.05 at delta = 0.1,
    # and the model's expected bound at 2 x 10^6 runs per side clears 1.2 eps0 by far more than 5 spreads.
    true_eps = _model_epsilon(faulty_sigma2, delta0)
    expected, spread = _expected_parametric(faulty_sigma2, delta0, row.parametric.runs, DEFAULT_FAMILYWISE)
    assert true_eps == pytest.approx(10.05, abs=0.01) and expected - 1.2 * eps0 > 5 * spread
    assert row.epsilon_param > 1.2 * eps0 and row.epsilon_param > row.epsilon_lb, row
    assert row.ratio_method == "parametric" and row.epsilon_param <= true_eps
    correct = run_audit(case, confidence=DEFAULT_FAMILYWISE, seed=4)
    assert correct.passed and correct.epsilon_param <= eps0, correct


def test_classical_gaussian_at_eps4_delta_1e6_is_no_violation():
    """sigma_classical = 1.325 G > the exact 1.194 G there: the fault is harmless and the audit says so."""
    from shuffledp.client.mean_randomizer import gaussian_sigma2
    from shuffledp.protocol.wire.messages import ProjectedMeanParams

    params = ProjectedMeanParams(0.0, 1.0, "gaussian", 4096)
    exact = gaussian_sigma2(params, 4.0, 1e-6)
    with planted_fault("classical-gaussian"):
        from shuffledp.client import mean_randomizer

        classical = mean_randomizer.gaussian_sigma2(params, 4.0, 1e-6)
        row = run_audit(projected_mean_case(4.0, "gaussian", 1e-6), trials=200_000, seed=4)
    assert classical > exact
    assert row.passed


@pytest.mark.parametrize(
    "fault,case",
    [
        ("krr-keep-too-high", krr_case(1.0)),
        ("laplace-scale-too-small", projected_mean_case(4.0)),
        ("laplace-scale-too-small", vector_mean_case(0.5)),
    ],
    ids=["krr", "laplace-scalar", "laplace-vector"],
)
def test_other_faults_are_detected(fault, case):
    with planted_fault(fault):
        row = run_audit(case, confidence=DEFAULT_FAMILYWISE, seed=4)
    assert not row.passed, row


def test_planted_fault_restores_on_error_and_refuses_unknown_names():
    original = range_randomizer.keep_probability
    with pytest.raises(RuntimeError), planted_fault("keep-too-high"):
        assert range_randomizer.keep_probability is not original
        raise RuntimeError("boom")
    assert range_randomizer.keep_probability is original
    with pytest.raises(InvalidParameter), planted_fault("no-such-fault"):
        pass
    assert set(FAULTS) >= {"keep-too-high", "classical-gaussian"}


# --------------------------------------------------------------------------
# The parametric (Gaussian-shape) bound
# --------------------------------------------------------------------------


def _sigma2(case) -> float:
    """The calibrated sigma^2 (grid units) of a default Gaussian case (projected or vector: same G)."""
    from shuffledp.client.mean_randomizer import gaussian_sigma2

    return gaussian_sigma2(GAUSSIAN_PARAMS, case.epsilon0, case.delta0)


def _model_epsilon(sigma2: float, delta0: float, shift: int = G) -> float:
    """The pair's epsilon at delta0 under the model: shift G, noise N_Z(0, sigma2) (the exact profile)."""
    return audit_local_module._gaussian_epsilon_low(sigma2, shift, delta0)


def _expected_parametric(sigma2: float, delta0: float, runs: int, confidence: float) -> tuple[float, float]:
    """The parametric bound when the estimates land on the truth (m1 - m0 = G, S^2 = sigma2, ``runs`` per side),
    and its spread: the change of that bound when the estimated Delta/sigma moves by one standard deviation,
    ``sqrt(2 sigma^2 / (runs G^2) + 1 / (4 runs))`` relative (difference of means; pooled S over 2 runs)."""
    n_all = 2 * runs
    alpha = 1 - confidence - n_all * 2.0**-40
    sigma = math.sqrt(sigma2)
    shift_low = math.ceil(G - stats.t.ppf(1 - alpha / 2, n_all - 2) * sigma * math.sqrt(2 / runs))
    sigma2_high = (n_all - 2) * sigma2 / stats.chi2.ppf(alpha / 2, n_all - 2)
    expected = _model_epsilon(sigma2_high, delta0, shift_low)
    sd = math.sqrt(2 * sigma2 / (runs * G * G) + 1 / (4 * runs))
    return expected, _model_epsilon(sigma2_high, delta0, math.ceil(shift_low * (1 + sd))) - expected


def test_parametric_bound_formulas():
    src = SeededSource(np.random.SeedSequence(11))
    sigma2, n, delta0 = 5000.0**2, 20_000, 1e-6
    y0 = src.discrete_gaussian(sigma2, n)
    y1 = G + src.discrete_gaussian(sigma2, n)
    b = gaussian_parametric_bound(y0, y1, delta0, 0.9)
    m0, m1 = y0.mean(), y1.mean()
    s2 = (((y0 - m0) ** 2).sum() + ((y1 - m1) ** 2).sum()) / (2 * n - 2)
    alpha = 0.1 - 2 * n * 2.0**-40
    assert b.runs == n and b.shift == pytest.approx(m1 - m0) and b.sigma == pytest.approx(math.sqrt(s2))
    assert b.shift_low == math.ceil(m1 - m0 - stats.t.ppf(1 - alpha / 2, 2 * n - 2) * math.sqrt(s2 * 2 / n))
    assert b.sigma_high == pytest.approx(math.sqrt((2 * n - 2) * s2 / stats.chi2.ppf(alpha / 2, 2 * n - 2)))
    assert b.shift_low <= G and b.sigma_high >= 5000.0  # both intervals hold for this seed
    # epsilon inverts the exact discrete-Gaussian profile at (shift_low, sigma_high): delta0 is crossed just after it
    assert 2.0 < b.epsilon < 4.0  # sigma = 5000 is about the calibration of eps = 4 at G = 4096
    assert discrete_gaussian_delta(b.sigma_high**2, b.epsilon, b.shift_low) > delta0
    assert discrete_gaussian_delta(b.sigma_high**2, b.epsilon + 1e-4, b.shift_low) < delta0
    assert b.fit_pvalue >= FIT_LEVEL and b.detail.startswith("Gaussian fit p =")
    # nothing to fit, or too few runs
    flat = gaussian_parametric_bound(np.zeros(100), np.ones(100), delta0)
    assert flat.epsilon is None and "sigma" in flat.detail
    with pytest.raises(InvalidParameter):
        gaussian_parametric_bound(np.zeros(1), np.zeros(5), delta0)


@pytest.mark.parametrize("eps0,delta0", [(0.5, 1e-6), (4.0, 1e-6), GAUSSIAN_STRESS[0]])
def test_parametric_epsilon_is_monotone_around_the_audited_points(eps0, delta0):
    """The bound's argument needs eps(Delta, sigma) non-decreasing in Delta and non-increasing in sigma there."""
    sigma2 = _sigma2(projected_mean_case(eps0, "gaussian", delta0))
    at_claim = _model_epsilon(sigma2, delta0)
    assert _model_epsilon(sigma2, delta0, G - 100) < _model_epsilon(sigma2, delta0, G - 1) < at_claim
    assert _model_epsilon(sigma2 * 1.001, delta0) < at_claim < _model_epsilon(sigma2 * 0.999, delta0)
    # the calibration is tight: eps0 less what the clamp term (1 + e^eps) 2^-40 (5e-5 of delta0 at eps 4) costs
    assert at_claim <= eps0 and at_claim == pytest.approx(eps0, rel=1e-4)


@pytest.mark.parametrize(
    "case,trials",
    [
        # runs per side = trials + selection trials; expected / spread from _expected_parametric:
        (projected_mean_case(1.0, "gaussian"), 10**6),  # 2e6 runs: 0.983 eps0, spread 0.005 eps0 (7 spreads)
        (vector_mean_case(4.0, "gaussian"), 10**5),  # 2e5 runs: 0.981 eps0, spread 0.004 eps0 (7 spreads)
        (projected_mean_case(GAUSSIAN_STRESS[0][0], "gaussian", GAUSSIAN_STRESS[0][1]), 5 * 10**4),  # 1.5e5 runs: 0.986, 0.003 (11 spreads)
    ],
    ids=["projected-eps1", "vector-eps4", "projected-stress"],
)
def test_parametric_bound_reaches_095_eps0(case, trials):
    """At eps0 = 0.5 the same margin needs ~4 x 10^6 runs per side: at the default 2 x 10^6 the expectation is
    0.969 eps0 with a spread of 0.009 (measured 0.971 and 0.967, docs/design.md)."""
    row = run_audit(case, trials=trials, seed=3, confidence=DEFAULT_FAMILYWISE)
    runs = trials + max(trials, 10**5)
    expected, spread = _expected_parametric(_sigma2(case), case.delta0, runs, DEFAULT_FAMILYWISE)
    assert expected - 0.95 * case.epsilon0 > 5 * spread
    assert row.parametric.runs == runs and row.passed, row
    assert 0.95 * case.epsilon0 <= row.epsilon_param <= case.epsilon0, row
    assert abs(row.epsilon_param - expected) < 5 * spread
    assert row.ratio_method == "parametric" and row.ratio == pytest.approx(row.epsilon_param / case.epsilon0)


def test_sigma_too_small_is_caught_by_the_parametric_bound(monkeypatch):
    """sigma^2 / 2 at (1, 1e-6): true eps 1.45. No threshold event can show it at these trials; the fit can."""
    from shuffledp.client import mean_randomizer

    original = mean_randomizer.gaussian_sigma2
    monkeypatch.setattr(mean_randomizer, "gaussian_sigma2", lambda params, eps, delta: original(params, eps, delta) / 2)
    eps0, delta0, trials = 1.0, 1e-6, 50_000
    case = projected_mean_case(eps0, "gaussian", delta0)
    row = run_audit(case, trials=trials, seed=4, confidence=DEFAULT_FAMILYWISE)
    sigma2 = original(GAUSSIAN_PARAMS, eps0, delta0) / 2
    true_eps = _model_epsilon(sigma2, delta0)
    expected, spread = _expected_parametric(sigma2, delta0, trials + 10**5, DEFAULT_FAMILYWISE)
    assert true_eps == pytest.approx(1.455, abs=0.001) and expected - eps0 > 5 * spread  # 1.39, spread 0.017
    assert not row.passed and eps0 < row.epsilon_param <= true_eps, row
    assert row.ratio_method == "parametric" and row.parametric.fit_pvalue >= FIT_LEVEL
    # The event bound's best expectation over every threshold of the (continuous) faulty pair at these trials
    # is 0.59 (0.90 even at 10^6): the fail is the parametric bound's. Its realised value sits near that.
    from scipy.special import ndtr

    sigma = math.sqrt(sigma2)
    t = np.linspace(-8 * sigma, G, 4001)
    best_event = float(np.max(audit_local_module._lower_bound(
        ndtr(t / sigma) * trials, trials, ndtr((t - G) / sigma) * trials, trials, delta0, DEFAULT_FAMILYWISE)))
    assert best_event < 0.6 * eps0
    assert row.epsilon_lb < eps0


def test_fit_rejects_laplace_noise_and_withholds_the_parametric_bound(monkeypatch):
    """Discrete Laplace noise of the calibrated variance in place of the discrete Gaussian: its true epsilon is
    G / b = 0.335 (pure), the Gaussian model would claim ~0.9. The chi-square fit rejects the shape (measured
    p ~ 1e-5 with 400 runs per side, 1e-50 with 2,000, 0 in double precision here) and the bound is withheld."""
    from scipy.optimize import brentq

    scales = {}

    def laplace_of_the_same_variance(self, sigma2, size):
        s2 = float(sigma2)
        if s2 not in scales:
            scales[s2] = brentq(lambda b: discrete_laplace_variance(b) - s2, 1.0, 10 * math.sqrt(s2))
        return self.discrete_laplace(scales[s2], size)

    monkeypatch.setattr(SeededSource, "discrete_gaussian", laplace_of_the_same_variance)
    case = projected_mean_case(1.0, "gaussian")
    row = run_audit(case, trials=10_000, seed=4, confidence=DEFAULT_FAMILYWISE)
    (scale,) = scales.values()
    assert row.epsilon_param is None and row.parametric is not None
    assert row.parametric.fit_pvalue < FIT_LEVEL and "not discrete-Gaussian" in row.detail
    assert row.passed and row.ratio_method == "event" and row.ratio == pytest.approx(row.epsilon_lb)
    # the estimates are right (same variance) -- what the gate prevents is the wrong shape's epsilon
    assert row.parametric.sigma == pytest.approx(math.sqrt(_sigma2(case)), rel=0.02)
    would_be = _model_epsilon(row.parametric.sigma_high**2, case.delta0, row.parametric.shift_low)
    assert would_be > 2 * (G / scale)
