"""The JavaScript client's scalar randomizers against the Python reference.

For ``hadamard-range``, ``projected-mean`` (Laplace and Gaussian noise), k-RR and block
Hadamard response, the device randomizer of ``js/`` (``SystemSource``: the platform CSPRNG and
the exact samplers) draws 200,000 reports per input for two worst-case neighbouring inputs
(``js/test/support/randomize.mjs``). Each test checks

* (a) the law: the counts against the exact pmf the Python mechanism defines (computed here
  from the Python parameters: the keep probability, the calibrated sigma2, ...), by a
  chi-square goodness-of-fit test, every bin expecting at least 5 reports (tails merged),
  rejected at the chi-square quantile of level ``ALPHA = 1e-6``;
* (b) the privacy loss: the lower bound of :func:`shuffledp.audit.local.epsilon_lower_bound`
  on the worst-case event of ``shuffledp/audit/local.py``'s docstring, at confidence
  ``1 - ALPHA``, stays at most ``eps0``; it must also reach half of ``eps0`` where the event
  has the mass to show it (a randomizer that ignored its input would pass (b) trivially).

A correct implementation fails one of the 19 statistical checks below (13 chi-square tests,
6 audit bounds) with probability at most ``19 ALPHA`` (each fails with probability at most
``ALPHA``; Bonferroni). The
"reaches half of eps0" checks fail for a correct randomizer only if a Clopper-Pearson bound is
off by more than 10 standard deviations.

It also checks that the JavaScript report ranges and the calibrated discrete Gaussian sigma2
agree with Python's ``report_range`` and ``calibrate_discrete_gaussian``.
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from scipy import stats

from shuffledp.audit.local import epsilon_lower_bound
from shuffledp.client.hadamard_response import (
    HadamardResponseParams,
    choose_hadamard_response,
    hadamard_response_probabilities,
)
from shuffledp.client.krr import krr_keep_probability
from shuffledp.client.mean_randomizer import gaussian_sigma2, report_range
from shuffledp.client.range_randomizer import keep_probability
from shuffledp.protocol.mechanisms.gaussian_calibration import (
    calibrate_discrete_gaussian,
    discrete_gaussian_delta,
)
from shuffledp.protocol.mechanisms.hadamard import hadamard_entry
from shuffledp.protocol.wire.messages import HadamardRangeParams, ProjectedMeanParams

from .conftest import run_node

SCRIPT = "test/support/randomize.mjs"
#: Draws per input.
DRAWS = 200_000
#: Level of each statistical check: a correct implementation fails it with probability <= ALPHA.
ALPHA = 1e-6
#: SystemSource realises a probability p as floor(p 2^53) / 2^53.
TWO_53 = 2**53


def realised(p: float) -> float:
    return math.floor(p * TWO_53) / TWO_53


def draw(request: dict, width: int) -> np.ndarray:
    """JS reports, shape (inputs, DRAWS, width)."""
    raw = run_node(SCRIPT, input=json.dumps(request).encode())
    values = np.frombuffer(raw, dtype="<i8")
    return values.reshape(len(request["inputs"]), request["count"], width)


def chi_square(observed_values: np.ndarray, pmf: dict[int, float]) -> tuple[float, float, int]:
    """Chi-square goodness of fit of integer observations to ``pmf`` (a dict value -> probability).

    Values are taken in increasing order; bins are formed from the left, each closed once it
    expects at least 5 observations, the remainder merged into the last bin (so the tails are
    merged). A value outside the pmf's support fails at once (the pmfs given here carry all but
    e^-60 or less of the mass). Returns (statistic, threshold, degrees of freedom); the test
    rejects when statistic > threshold, the chi-square quantile of level ALPHA.
    """
    n = observed_values.size
    support = sorted(pmf)
    values, counts = np.unique(observed_values, return_counts=True)
    observed = dict(zip(values.tolist(), counts.tolist()))
    outside = sum(c for v, c in observed.items() if v not in pmf)
    assert outside == 0, f"{outside} reports outside the support"
    bins_expected: list[float] = []
    bins_observed: list[int] = []
    exp_acc = 0.0
    obs_acc = 0
    for value in support:
        exp_acc += pmf[value] * n
        obs_acc += observed.get(value, 0)
        if exp_acc >= 5.0:
            bins_expected.append(exp_acc)
            bins_observed.append(obs_acc)
            exp_acc, obs_acc = 0.0, 0
    if bins_expected:
        bins_expected[-1] += exp_acc
        bins_observed[-1] += obs_acc
    expected = np.array(bins_expected)
    expected *= n / expected.sum()  # the pmf's own rounding (sums to 1 within 1e-12)
    statistic = float(np.sum((np.array(bins_observed) - expected) ** 2 / expected))
    df = len(bins_expected) - 1
    return statistic, float(stats.chi2.isf(ALPHA, df)), df


def assert_law(observed: np.ndarray, pmf: dict[int, float], what: str) -> None:
    statistic, threshold, df = chi_square(observed, pmf)
    assert statistic <= threshold, f"{what}: chi-square {statistic:.1f} > {threshold:.1f} ({df} df)"


def audit(in_event_x: np.ndarray, in_event_xp: np.ndarray, eps0: float, delta0: float, *, power: bool = True) -> float:
    """The event bound of shuffledp.audit.local at confidence 1 - ALPHA; at most eps0, and at least eps0 / 2 if ``power``."""
    bound = epsilon_lower_bound(
        int(in_event_x.sum()), in_event_x.size, int(in_event_xp.sum()), in_event_xp.size, delta0, 1.0 - ALPHA
    )
    assert bound <= eps0, f"empirical privacy loss {bound:.4f} exceeds eps0 = {eps0}"
    if power:
        assert bound >= eps0 / 2, f"the audit should resolve the loss: bound {bound:.4f} at eps0 = {eps0}"
    return bound


# ------------------------------------------------------------------ hadamard-range


def test_hadamard_range_law_and_privacy(js_package):
    eps0 = 1.0
    params = HadamardRangeParams(0.0, 1.0, 1.0 / 16.0)  # 8 bins, K = 8
    k_rows = params.padded_bins
    request = {
        "op": "randomize",
        "params": {"mechanism": "hadamard-range", "low": 0.0, "high": 1.0, "tau": 1.0 / 16.0},
        "epsilon0": eps0,
        "delta0": 0.0,
        "inputs": [-1.0, 2.0],  # clamped to bins 0 and 7
        "count": DRAWS,
        "source": "system",
    }
    reports = draw(request, 2)
    p = realised(keep_probability(eps0))
    for side, nu in enumerate((0, params.num_bins - 1)):
        rows, bits = reports[side, :, 0], reports[side, :, 1]
        assert set(np.unique(bits).tolist()) <= {-1, 1}
        cell = rows * 2 + (bits > 0)  # (row, bit) -> one integer
        pmf = {}
        for row in range(k_rows):
            sign = int(hadamard_entry(row, nu))
            pmf[row * 2 + 1] = (p if sign == 1 else 1 - p) / k_rows
            pmf[row * 2] = (1 - p if sign == 1 else p) / k_rows
        assert_law(cell, pmf, f"hadamard-range bin {nu}")
    v, v_prime = 0, params.num_bins - 1

    def event(side: int) -> np.ndarray:
        rows, bits = reports[side, :, 0], reports[side, :, 1]
        h_v = hadamard_entry(rows, v)
        return (h_v != hadamard_entry(rows, v_prime)) & (bits == h_v)

    audit(event(0), event(1), eps0, 0.0)


# ------------------------------------------------------------------ projected-mean


def discrete_laplace_pmf(scale: float, center: int, radius: int) -> dict[int, float]:
    q = math.exp(-1.0 / scale)
    norm = (1 - q) / (1 + q)
    return {center + k: norm * q ** abs(k) for k in range(-radius, radius + 1)}


def discrete_gaussian_pmf(sigma2: float, center: int, radius: int) -> dict[int, float]:
    ks = np.arange(-radius, radius + 1)
    weights = np.exp(-(ks.astype(np.float64) ** 2) / (2.0 * sigma2))
    weights /= weights.sum()
    return {center + int(k): float(w) for k, w in zip(ks, weights)}


def mixture(a: dict[int, float], b: dict[int, float], weight_b: float) -> dict[int, float]:
    keys = set(a) | set(b)
    return {k: (1 - weight_b) * a.get(k, 0.0) + weight_b * b.get(k, 0.0) for k in keys}


def test_projected_mean_laplace_law_and_privacy(js_package):
    eps0, grid = 1.0, 16
    params = ProjectedMeanParams(0.0, 1.0, "laplace", grid)
    low, high = report_range(params, eps0, 0.0)
    request = {
        "op": "randomize",
        "params": {"mechanism": "projected-mean", "lower": 0.0, "upper": 1.0, "noise": "laplace", "gridLevels": grid},
        "epsilon0": eps0,
        "delta0": 0.0,
        "inputs": [-1.0, 2.0, 0.3],  # grid 0, grid G, and 4.8 grid steps (randomized rounding)
        "count": DRAWS,
        "source": "system",
    }
    reports = draw(request, 1)[:, :, 0]
    assert reports.min() >= low and reports.max() <= high
    scale = grid / eps0
    radius = int(60 * scale)  # mass beyond is below e^-60
    pmfs = [discrete_laplace_pmf(scale, 0, radius), discrete_laplace_pmf(scale, grid, radius)]
    u = 0.3 / (1.0 / grid)
    pmfs.append(mixture(discrete_laplace_pmf(scale, 4, radius), discrete_laplace_pmf(scale, 5, radius), realised(u - 4)))
    for side, pmf in enumerate(pmfs):
        assert_law(reports[side], pmf, f"projected-mean laplace input {request['inputs'][side]}")
    # P[N <= 0] / P[N <= -G] = e^eps0 exactly: the optimal event (shuffledp/audit/local.py)
    audit(reports[0] <= 0, reports[1] <= 0, eps0, 0.0)


def test_projected_mean_gaussian_law_and_privacy(js_package):
    eps0, delta0, grid = 1.0, 1e-6, 16
    params = ProjectedMeanParams(0.0, 1.0, "gaussian", grid)
    sigma2 = gaussian_sigma2(params, eps0, delta0)
    low, high = report_range(params, eps0, delta0)
    request = {
        "op": "randomize",
        "params": {"mechanism": "projected-mean", "lower": 0.0, "upper": 1.0, "noise": "gaussian", "gridLevels": grid},
        "epsilon0": eps0,
        "delta0": delta0,
        "inputs": [-1.0, 2.0],
        "count": DRAWS,
        "source": "system",
    }
    reports = draw(request, 1)[:, :, 0]
    assert reports.min() >= low and reports.max() <= high
    radius = int(40 * math.sqrt(sigma2))
    pmfs = [discrete_gaussian_pmf(sigma2, 0, radius), discrete_gaussian_pmf(sigma2, grid, radius)]
    for side, pmf in enumerate(pmfs):
        assert_law(reports[side], pmf, f"projected-mean gaussian input {request['inputs'][side]}")
    # The event {value <= t}, t fixed from the exact pmfs before looking at the reports: the
    # t of largest loss whose event still expects 2,000 reports under x'. At this (eps0, delta0)
    # no event of this mass shows much of eps0 (shuffledp/audit/local.py), so no power check.
    cdf0 = np.cumsum([pmfs[0][k] for k in range(-radius, radius + 1)])
    cdf1 = np.cumsum([pmfs[1].get(k, 0.0) for k in range(-radius, radius + 1)])
    candidates = [i for i in range(len(cdf1)) if cdf1[i] * DRAWS >= 2000]
    best = max(candidates, key=lambda i: math.log(cdf0[i] / cdf1[i]))
    t = -radius + best
    audit(reports[0] <= t, reports[1] <= t, eps0, delta0, power=False)


# ------------------------------------------------------------------ frequency oracles


def test_krr_law_and_privacy(js_package):
    eps0, k = 2.0, 8
    request = {"op": "krr", "k": k, "epsilon": eps0, "inputs": [0, 1], "count": DRAWS, "source": "system"}
    reports = draw(request, 1)[:, :, 0]
    p = krr_keep_probability(k, eps0)  # a multiple of 2^-53: realised exactly
    for side in (0, 1):
        pmf = {y: (p if y == side else (1 - p) / (k - 1)) for y in range(k)}
        assert_law(reports[side], pmf, f"k-RR symbol {side}")
    audit(reports[0] == 0, reports[1] == 0, eps0, 0.0)


@pytest.mark.parametrize("blocks", [None, 2])  # the optimal B (8 blocks of b = 2), and 2 blocks of b = 8
def test_block_hadamard_response_law_and_privacy(js_package, blocks):
    eps0, k = 3.0, 8
    params = choose_hadamard_response(k, eps0) if blocks is None else HadamardResponseParams(k, eps0, blocks)
    request = {"op": "block-hr", "k": k, "epsilon": eps0, "blocks": blocks, "inputs": [0, 1], "count": DRAWS, "source": "system"}
    reports = draw(request, 1)[:, :, 0]
    b, blocks = params.block_size, params.blocks
    p_in, p_out = hadamard_response_probabilities(params)

    def in_set(outputs: np.ndarray, symbol: int) -> np.ndarray:
        block, row = symbol % blocks, symbol // blocks + 1
        return (outputs // b == block) & (hadamard_entry(row, outputs % b) == 1)

    for side in (0, 1):
        outputs = np.arange(params.output_size)
        members = in_set(outputs, side)
        pmf = {int(y): (p_in if m else p_out) for y, m in zip(outputs, members)}
        assert_law(reports[side], pmf, f"block HR symbol {side} (B = {blocks}, b = {b})")
    audit(in_set(reports[0], 0) & ~in_set(reports[0], 1), in_set(reports[1], 0) & ~in_set(reports[1], 1), eps0, 0.0)


# ------------------------------------------------------------------ report ranges and calibration


def test_report_ranges_equal_python(js_package):
    cases = []
    for grid, eps in itertools.product((1, 2, 16, 4096, 65536, 1 << 24), (1e-6, 1e-3, 0.1, 0.7, 1.0, 3.3, 30.0)):
        cases.append((grid, "laplace", eps, 0.0))
    for grid, eps, delta in itertools.product((1, 16, 4096, 1 << 20), (0.05, 0.5, 1.0, 4.0, 30.0), (1e-9, 1e-6, 1e-3)):
        cases.append((grid, "gaussian", eps, delta))
    answer = json.loads(run_node(SCRIPT, input=json.dumps({"op": "ranges", "cases": cases}).encode()))
    for case, (low, high) in zip(cases, answer):
        grid, noise, eps, delta = case
        expected = report_range(ProjectedMeanParams(0.0, 1.0, noise, grid), eps, delta)
        assert (int(low), int(high)) == expected, case


def test_calibrated_sigma2_agrees_with_python(js_package):
    """JS and Python calibrate the discrete Gaussian to the same double, or, where a bisection
    step fell within rounding of the threshold (measured: 18 of 378 cases of a wider grid, all at
    eps <= 1e-3, by at most 7e-9 relative), the JS value still passes Python's own delta bound,
    or is larger (more noise). Never a JS sigma2 that Python's analysis refuses as too small."""
    cases = list(itertools.product((1e-6, 1e-3, 0.1, 1.0, 4.0, 30.0), (1e-12, 1e-6, 1e-3, 0.1), (1, 16, 4096, 1 << 24)))
    js = json.loads(run_node(SCRIPT, input=json.dumps({"op": "sigma2", "cases": cases}).encode()))
    equal = 0
    for (eps, delta, grid), js_sigma2 in zip(cases, js):
        js_sigma2 = float(js_sigma2)
        py_sigma2 = calibrate_discrete_gaussian(eps, delta, grid)
        if js_sigma2 == py_sigma2:
            equal += 1
            continue
        assert js_sigma2 > py_sigma2 or discrete_gaussian_delta(js_sigma2, eps, grid) <= delta, (eps, delta, grid)
        assert abs(js_sigma2 - py_sigma2) <= 1e-8 * py_sigma2, (eps, delta, grid)
        assert eps <= 1e-3, (eps, delta, grid)  # differences only where delta is a difference of near-equal tails
    assert equal >= len(cases) * 3 // 4


def test_budget_rules_equal_python(js_package):
    """checkMechanismBudget accepts and refuses (naming the same parameter) exactly what Python's
    common range check and ``check_budget`` do, for scalar rounds around every rule's boundary."""
    from shuffledp.protocol.errors import InvalidParameter
    from shuffledp.protocol.wire.messages import check_epsilon_delta

    hr = {"mechanism": "hadamard-range", "low": 0.0, "high": 1.0, "tau": 0.0625}
    cases = []
    for eps, delta in itertools.product((1e-7, 1e-6, 0.5, 30.0, 30.5), (0.0, 1e-9, 0.5, 1.0)):
        cases.append((hr, eps, delta))
    for grid, noise, lower, upper in itertools.product(
        (1, 4096, 1 << 24), ("laplace", "gaussian"), (0.0, -1e290), (1.0, 1e290)
    ):
        pm = {"mechanism": "projected-mean", "lower": lower, "upper": upper, "noise": noise, "gridLevels": grid}
        for eps, delta in itertools.product((1e-6, 2e-6, 1e-3, 1.0, 30.0), (0.0, 1e-12, 1e-6, 0.5)):
            cases.append((pm, eps, delta))
    # Gaussian at the largest noise scale (2^44 grid units; Laplace cannot reach it, G / eps <= 2^24 / 1e-6):
    # the smallest accepted epsilon0, found on Python's rule, and the double below it
    edge = {"mechanism": "projected-mean", "lower": 0.0, "upper": 1.0, "noise": "gaussian", "gridLevels": 1 << 24}
    edge_params = ProjectedMeanParams(0.0, 1.0, "gaussian", 1 << 24)

    def accepted(eps: float) -> bool:
        try:
            edge_params.check_budget(eps, 1e-6)
            return True
        except InvalidParameter:
            return False

    lo, hi = 1e-6, 1.0
    while math.nextafter(lo, hi) < hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if accepted(mid) else (mid, hi)
    cases += [(edge, hi, 1e-6), (edge, lo, 1e-6)]
    answer = json.loads(run_node(SCRIPT, input=json.dumps({"op": "budget", "cases": cases}).encode()))

    refused = 0
    for (params, eps, delta), js in zip(cases, answer):
        if params["mechanism"] == "hadamard-range":
            py_params = HadamardRangeParams(params["low"], params["high"], params["tau"])
        else:
            py_params = ProjectedMeanParams(params["lower"], params["upper"], params["noise"], params["gridLevels"])
        try:
            check_epsilon_delta(eps, delta)
            py_params.check_budget(eps, delta)
            expected = None
        except InvalidParameter as exc:
            expected = ["invalid-parameter", exc.parameter]
            refused += 1
        assert js == expected, (params, eps, delta)
    assert 0 < refused < len(cases)
