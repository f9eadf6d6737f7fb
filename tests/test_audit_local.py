"""The local audit (shuffledp/audit_local.py) and its planted faults (shuffledp/audit_faults.py).

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
  than the audit's slack at the default 10^6 trials.
"""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
from scipy import stats

import shuffledp.audit_local as audit_local_module
from shuffledp.audit_faults import FAULTS, planted_fault
from shuffledp.audit_local import (
    GAUSSIAN_STRESS,
    AuditResult,
    audit_local,
    clopper_pearson,
    epsilon_lower_bound,
    expected_epsilon_lower_bound,
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
from shuffledp.protocol.randomness import SystemSource

ALPHA = 0.05


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


def test_bounds_stay_below_the_claims_seeded():
    cases = _validity_cases()
    confidence = 1 - ALPHA / len(cases)
    for case in cases:
        row = run_audit(case, trials=20_000, seed=1, confidence=confidence, selection_trials=20_000)
        assert isinstance(row, AuditResult) and row.source == "seeded" and row.trials == 20_000
        assert row.passed and row.epsilon_lb <= case.epsilon0, row
        assert row.ratio == pytest.approx(row.epsilon_lb / case.epsilon0)


def test_bounds_stay_below_the_claims_system_source(reproducible_system_source):
    cases = [c for c in _validity_cases() if c.epsilon0 == 4.0]
    confidence = 1 - ALPHA / len(cases)
    for case in cases:
        row = run_audit(case, source="system", trials=400, confidence=confidence, selection_trials=20_000)
        assert row.source == "system" and row.passed, row


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
    assert all(r.confidence == pytest.approx(1 - 0.05 / len(rows)) for r in rows)
    assert all(r.passed for r in rows), [r for r in rows if not r.passed]
    assert all(r.trials == (3_000 if r.source == "seeded" else 100) for r in rows)
    # a progress callback sees every run
    seen = []
    audit_local(trials=1_000, system_trials=0, epsilons=(2.0,), gaussian_stress=(), progress=lambda s, n: seen.append(n))
    assert sum(seen) == 9 * 2 * 1_000 + 4 * 2 * 1_000  # four threshold cases also draw a selection run


# --------------------------------------------------------------------------
# Planted faults: detected at the default 10^6 trials
# --------------------------------------------------------------------------

DEFAULT_FAMILYWISE = 1 - 0.05 / 74  # what audit_local() uses per row: 37 cases x 2 sources


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
    with planted_fault("classical-gaussian"):
        row = run_audit(case, confidence=DEFAULT_FAMILYWISE, seed=4)
    assert not row.passed and row.epsilon_lb > eps0, row
    correct = run_audit(case, confidence=DEFAULT_FAMILYWISE, seed=4)
    assert correct.passed, correct


def test_classical_gaussian_at_eps4_delta_1e6_is_no_violation():
    """sigma_classical = 1.325 G > the exact 1.194 G there: the fault is harmless and the audit says so."""
    from shuffledp.client.mean_randomizer import gaussian_sigma2
    from shuffledp.protocol.messages import ProjectedMeanParams

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
