"""The JavaScript client's vector and summation randomizers against the Python reference.

The compiled package (``js/``) runs one user's randomizer of ``vector-range`` (sampled and
paper), ``vector-mean`` (Laplace and Gaussian), ``coordinate-tree``, ``shifted-norm``,
``modular-sum``, ``vector-sum``, ``shifted-vector-sum`` and ``local-vector`` many times through
``js/test/support/randomize_vector.mjs`` (a ``SeededSource`` with a fixed seed: the same exact
samplers as the device's ``SystemSource``, on reproducible bits). The tests check

* (a) every message lies in Python's ``report_ranges`` of the same round spec (the spec's
  canonical bytes decoded by the JavaScript decoder, whose budget check runs too);
* (b) the laws agree with Python's ``randomize_round`` (``SeededSource``, the simulation
  path): a two-sample chi-square test per message position on the value tuples (for
  summations on the decoded per-coordinate sums, the informative part, and on binned shares),
  categories with fewer than 10 draws in both samples together merged into one;
* (c) for ``vector-range`` (sampled), ``coordinate-tree`` and ``shifted-norm``, the empirical
  privacy loss on worst-case neighbouring inputs (the events of ``shuffledp/audit/local.py``'s
  docstring: an informative Hadamard row whose bit agrees with ``x``): the lower bound of
  :func:`shuffledp.audit.local.epsilon_lower_bound` at confidence ``1 - ALPHA`` is at most
  ``eps0``, and at least ``0.9 eps0`` (a randomizer that ignored its input would pass the first);
* (d) for ``modular-sum``: any ``messages - 1`` of a user's shares are uniform (chi-square
  against the exact bin probabilities of 8 x 8 joint bins of ``[0, q)``), one user's shares sum
  mod ``q`` to its encoding plus a Pólya share (goodness of fit to the exact pmf of
  ``enc + NB(1/n, 1 - alpha) - NB(1/n, 1 - alpha)`` from ``scipy.stats.nbinom``), and the shares of
  ``users`` users sum to the encodings plus ``DLap(alpha)`` (goodness of fit to its pmf);
* the budget rules (``checkBudget``) accept and refuse what Python's ``check_budget`` accepts and
  refuses, naming the same parameter.

Every statistical check rejects at level ``ALPHA = 1e-6`` (the chi-square quantile, or the
Clopper-Pearson confidence): a correct implementation fails one of the 18 checks (10 laws, 3
privacy bounds, 5 modular-sum fits) with probability at most ``18 ALPHA`` (Bonferroni). The "at least ``0.9 eps0``" checks fail for a
correct randomizer only if a bound is off by more than 8 standard deviations.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from scipy import stats

from shuffledp.audit.local import epsilon_lower_bound
from shuffledp.client.mechanisms import check_report_values, randomize_round, report_ranges
from shuffledp.client.vector_randomizer import rotation_of
from shuffledp.protocol.mechanisms.hadamard import hadamard_entry
from shuffledp.protocol.mechanisms.randomness import SeededSource
from shuffledp.protocol.mechanisms.summation_params import (
    choose_scalar_sum,
    choose_vector_sum,
    smallest_skellam_mu,
)
from shuffledp.protocol.wire import codec
from shuffledp.protocol.wire.messages import (
    CoordinateTreeParams,
    LocalVectorParams,
    ModularSumParams,
    RoundSpec,
    ShiftedNormParams,
    ShiftedVectorSumParams,
    VectorMeanParams,
    VectorRangeParams,
    VectorSumParams,
    messages_per_user,
)
from shuffledp.protocol.errors import InvalidParameter

from .conftest import run_node

SCRIPT = "test/support/randomize_vector.mjs"
#: Draws per input of the privacy checks.
PRIVACY_DRAWS = 200_000
#: Level of each statistical check: a correct implementation fails it with probability <= ALPHA.
ALPHA = 1e-6
#: Categories with fewer draws than this in both samples together are merged into one.
MIN_CATEGORY = 10


# --------------------------------------------------------------------------
# Running the JavaScript randomizer
# --------------------------------------------------------------------------


def params_json(params) -> dict:
    """The params as JSON: snake_case fields, tuples as lists, 64-bit integers as strings."""
    out = {}
    for field in dataclasses.fields(params):
        value = getattr(params, field.name)
        if field.name in ("rotation_seed", "modulus"):
            value = str(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[field.name] = value
    return out


def js_reports(params, epsilon0: float, delta0: float, data, count: int, seed: int) -> np.ndarray:
    """``count`` users' messages from the JS randomizer: int64 ``(count, messages, values)``."""
    request = {
        "mechanism": params.MECHANISM,
        "params": params_json(params),
        "epsilon0": epsilon0,
        "delta0": delta0,
        "data": data,
        "count": count,
        "seed": seed,
    }
    raw = run_node(SCRIPT, input=json.dumps(request).encode())
    return np.frombuffer(raw, dtype="<i8").reshape(count, messages_per_user(params), type(params).VALUES_PER_REPORT)


def py_reports(params, epsilon0: float, delta0: float, data, count: int, seed: int) -> np.ndarray:
    """``count`` users' messages from Python's ``randomize_round`` (SeededSource)."""
    local = np.tile(np.asarray(data, dtype=np.float64), (count, 1)) if isinstance(data, list) else np.full(count, float(data))
    return np.asarray(randomize_round(params, epsilon0, delta0, local, SeededSource(seed)), dtype=np.int64)


def spec_of(params, epsilon0: float, delta0: float) -> RoundSpec:
    return RoundSpec(
        session_id=bytes(16),
        round_id=1,
        params=params,
        epsilon0=epsilon0,
        analyzer_key=bytes(32),
        shuffler_key=bytes(32),
        shuffler_signing_key=bytes(range(32)),  # any usable Ed25519 key: nothing is signed here
        min_batch=getattr(params, "min_reports", 1),
        deadline=0.0,
        delta0=delta0,
        messages_per_user=messages_per_user(params),
    )


# --------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------


def two_sample_chi2(a: np.ndarray, b: np.ndarray) -> tuple[float, int]:
    """Two-sample chi-square statistic and degrees of freedom of the rows of ``a`` and ``b``
    (categories: distinct rows; those with fewer than MIN_CATEGORY draws together merged)."""
    both = np.concatenate([a, b]).reshape(len(a) + len(b), -1)
    _, inverse = np.unique(both, axis=0, return_inverse=True)
    inverse = inverse.ravel()
    count_a = np.bincount(inverse[: len(a)], minlength=inverse.max() + 1).astype(float)
    count_b = np.bincount(inverse[len(a) :], minlength=inverse.max() + 1).astype(float)
    rare = count_a + count_b < MIN_CATEGORY
    if rare.any():
        count_a = np.append(count_a[~rare], count_a[rare].sum())
        count_b = np.append(count_b[~rare], count_b[rare].sum())
        keep = count_a + count_b > 0
        count_a, count_b = count_a[keep], count_b[keep]
    n_a, n_b = count_a.sum(), count_b.sum()
    stat = np.sum((count_a * np.sqrt(n_b / n_a) - count_b * np.sqrt(n_a / n_b)) ** 2 / (count_a + count_b))
    return float(stat), len(count_a) - 1


def assert_same_law(pieces: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """The summed two-sample chi-square of independent pieces stays under the ALPHA quantile."""
    total, df = 0.0, 0
    for a, b in pieces:
        stat, d = two_sample_chi2(a, b)
        total += stat
        df += d
    threshold = stats.chi2.isf(ALPHA, df)
    assert total <= threshold, f"two-sample chi-square {total:.1f} > {threshold:.1f} (df {df})"


def assert_fits(observed: np.ndarray, pmf: dict[int, float]) -> None:
    """Chi-square goodness of fit of integers to ``pmf`` (values outside its support count as
    the nearest end; bins formed left to right, each closed once it expects 5 draws)."""
    support = sorted(pmf)
    clipped = np.clip(observed, support[0], support[-1])
    values, counts = np.unique(clipped, return_counts=True)
    counted = dict(zip(values.tolist(), counts.tolist()))
    n = len(observed)
    total_p = sum(pmf.values())
    bins: list[tuple[float, float]] = []
    exp_acc = obs_acc = 0.0
    for k in support:
        exp_acc += pmf[k] / total_p * n
        obs_acc += counted.get(k, 0)
        if exp_acc >= 5.0:
            bins.append((obs_acc, exp_acc))
            exp_acc = obs_acc = 0.0
    if exp_acc or obs_acc:
        last_obs, last_exp = bins.pop()
        bins.append((last_obs + obs_acc, last_exp + exp_acc))
    obs = np.array([o for o, _ in bins])
    exp = np.array([e for _, e in bins])
    stat = float(np.sum((obs - exp) ** 2 / exp))
    threshold = stats.chi2.isf(ALPHA, len(bins) - 1)
    assert stat <= threshold, f"goodness of fit chi-square {stat:.1f} > {threshold:.1f} (df {len(bins) - 1})"


def centered(values: np.ndarray, q: int) -> np.ndarray:
    t = np.mod(values, q)
    return np.where(t <= q // 2, t, t - q)


def summation_pieces(js: np.ndarray, py: np.ndarray, params) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per coordinate: the decoded sum of a user's shares, and its first share in 16 bins of [0, q)."""
    q, m = params.modulus, params.messages
    pieces = []
    for coord in range(js.shape[1] // m):
        sl = slice(coord * m, (coord + 1) * m)
        pieces.append((centered(js[:, sl, -1].sum(axis=1), q)[:, None], centered(py[:, sl, -1].sum(axis=1), q)[:, None]))
        pieces.append(((js[:, sl.start, -1] * 16) // q, (py[:, sl.start, -1] * 16) // q))
    return pieces


# --------------------------------------------------------------------------
# Rounds under test
# --------------------------------------------------------------------------

RANGE = VectorRangeParams(-1.0, 1.0, 0.125, 4, 11, "sampled")
PAPER = VectorRangeParams(-1.0, 1.0, 0.125, 4, 11, "paper")
MEAN_LAPLACE = VectorMeanParams(4, 11, (-1.0,) * 4, (1.0,) * 4, "laplace", 16)
MEAN_GAUSSIAN = VectorMeanParams(4, 11, (-1.0,) * 4, (1.0,) * 4, "gaussian", 16)
TREE = CoordinateTreeParams(-1.0, 1.0, 0.125, 4, 11)
NORM = ShiftedNormParams((0.5, -1.0, 2.0), -4.0, 4.0, 0.5)
SUM = ModularSumParams(0.0, 1.0, 8, 1_000_003, 3, 4)
VSUM = VectorSumParams(3, 1.0, 64, 11, 1_000_003, 3, 4, 20.0)
SHIFTED = ShiftedVectorSumParams(3, 1.0, 64, 11, 1_000_003, 3, 4, 20.0, center=(0.1, 0.2, -0.3))
LOCAL = LocalVectorParams(3, 1.0, 16, 11, 10.0, (0.1, 0.2, -0.3))

VECTOR = [0.3, -0.2, 0.5, 0.1]
VECTOR3 = [0.3, -0.2, 0.5]

#: (id, params, eps0, delta0, data, users per sample)
LAW_CASES = [
    ("vector-range-sampled", RANGE, 1.0, 0.0, VECTOR, 100_000),
    ("vector-range-paper", PAPER, 2.0, 0.0, VECTOR, 50_000),
    ("vector-mean-laplace", MEAN_LAPLACE, 2.0, 0.0, VECTOR, 100_000),
    ("vector-mean-gaussian", MEAN_GAUSSIAN, 2.0, 1e-5, VECTOR, 100_000),
    ("coordinate-tree", TREE, 1.0, 0.0, VECTOR, 100_000),
    ("shifted-norm", NORM, 1.0, 0.0, [1.0, 1.0, 1.0], 100_000),
    ("modular-sum", SUM, 1.0, 1e-6, 0.37, 100_000),
    ("vector-sum", VSUM, 1.0, 1e-6, VECTOR3, 30_000),
    ("shifted-vector-sum", SHIFTED, 1.0, 1e-6, VECTOR3, 30_000),
    ("local-vector", LOCAL, 1.0, 1e-6, VECTOR3, 30_000),
]


@pytest.mark.parametrize("case", LAW_CASES, ids=[c[0] for c in LAW_CASES])
def test_laws_agree_with_python(js_package, case) -> None:
    _, params, eps, delta, data, users = case
    js = js_reports(params, eps, delta, data, users, seed=101)
    py = py_reports(params, eps, delta, data, users, seed=202)
    assert js.shape == py.shape
    if isinstance(params, (ModularSumParams, VectorSumParams)):
        pieces = summation_pieces(js, py, params)
    else:
        pieces = [(js[:, m, :], py[:, m, :]) for m in range(js.shape[1])]
    assert_same_law(pieces)


# --------------------------------------------------------------------------
# (a) report ranges, through the JS spec decoder
# --------------------------------------------------------------------------


def chosen_sum() -> ModularSumParams:
    return choose_scalar_sum(1000, 1.0, 1e-6, 0.0, 1.0).params


def chosen_vector_sum() -> VectorSumParams:
    return choose_vector_sum(1000, 1.0, 1e-6, 3, 1.0, 5).params


def chosen_local(epsilon: float, delta: float) -> LocalVectorParams:
    mu = smallest_skellam_mu(16, 4, epsilon, delta)
    return LocalVectorParams(3, 1.0, 16, 11, mu, (0.1, 0.2, -0.3))


#: (id, params (None: chosen for the budget), eps0, delta0, data, users). The summations' noise is
#: calibrated to 1,000 users, so one user draws large Poisson means: fewer users there.
RANGE_CASES = [
    ("vector-range-sampled", RANGE, 1.0, 0.0, VECTOR, 2_000),
    ("vector-range-paper", PAPER, 2.0, 0.0, VECTOR, 2_000),
    ("vector-mean-laplace", MEAN_LAPLACE, 0.5, 0.0, [5.0, -5.0, 0.0, 1.0], 2_000),
    ("vector-mean-gaussian", MEAN_GAUSSIAN, 0.5, 1e-6, VECTOR, 2_000),
    ("coordinate-tree", TREE, 1.0, 0.0, [9.0, -9.0, 0.0, 0.2], 2_000),
    ("shifted-norm", NORM, 1.0, 0.0, [1e300, -1e300, 3.0], 2_000),
    ("modular-sum", None, 1.0, 1e-6, 0.37, 2_000),
    ("vector-sum", None, 1.0, 1e-6, [1e308, -1e308, 2.0], 100),
    ("local-vector", None, 4.0, 1e-6, [0.5, -0.7, 3.0], 100),
]


@pytest.mark.parametrize("case", RANGE_CASES, ids=[c[0] for c in RANGE_CASES])
def test_reports_within_python_ranges(js_package, case) -> None:
    name, params, eps, delta, data, count = case
    if name == "modular-sum":
        params = chosen_sum()
    elif name == "vector-sum":
        params = chosen_vector_sum()
    elif name == "local-vector":
        params = chosen_local(eps, delta)
    spec = spec_of(params, eps, delta)
    request = {"spec": codec.canonical_encode(spec).hex(), "data": data, "count": count, "seed": 7, "check": True}
    raw = run_node(SCRIPT, input=json.dumps(request).encode())
    reports = np.frombuffer(raw, dtype="<i8").reshape(count, spec.messages_per_user, -1)
    ranges = report_ranges(spec)
    for message in reports.reshape(-1, reports.shape[-1]):
        check_report_values(tuple(int(v) for v in message), ranges)
    if isinstance(params, VectorSumParams):  # every coordinate's shares, in order
        coords = reports[0, :, 0]
        assert coords.tolist() == np.repeat(np.arange(params.padded_dim), params.messages).tolist()


# --------------------------------------------------------------------------
# (c) empirical privacy loss on worst-case neighbours
# --------------------------------------------------------------------------


def rr_event(rows: np.ndarray, bits: np.ndarray, v: np.ndarray, v_prime: np.ndarray) -> np.ndarray:
    """An informative Hadamard row (``H[row, v] != H[row, v']``) whose bit agrees with ``x``'s."""
    h_v = hadamard_entry(rows, v)
    return (h_v != hadamard_entry(rows, v_prime)) & (bits == h_v)


def rotated_pair(params, z: float, z_prime: float) -> tuple[list[float], list[float]]:
    rotation = rotation_of(params)
    return (
        rotation.inverse(np.full(params.padded_dim, z)).tolist(),
        rotation.inverse(np.full(params.padded_dim, z_prime)).tolist(),
    )


def privacy_bound(params, eps: float, pair, event) -> float:
    counts = []
    for side, data in enumerate(pair):
        reports = js_reports(params, eps, 0.0, data, PRIVACY_DRAWS, seed=300 + side)
        counts.append(int(np.count_nonzero(event(reports[:, 0, :]))))
    return epsilon_lower_bound(counts[0], PRIVACY_DRAWS, counts[1], PRIVACY_DRAWS, 0.0, 1.0 - ALPHA)


def test_privacy_vector_range_sampled(js_package) -> None:
    eps = 1.0
    scalar = RANGE.scalar
    width = scalar.high - scalar.low
    pair = rotated_pair(RANGE, scalar.low - width, scalar.high + width)  # every rotated coordinate in bin 0 vs the last
    last = scalar.num_bins - 1
    bound = privacy_bound(RANGE, eps, pair, lambda r: rr_event(r[:, 1], r[:, 2], np.zeros_like(r[:, 1]), np.full_like(r[:, 1], last)))
    assert 0.9 * eps <= bound <= eps


def test_privacy_coordinate_tree(js_package) -> None:
    eps = 2.0
    scalar = TREE.scalar
    assert scalar.num_bins == scalar.padded_bins  # the last leaf's node is non-zero at every level
    width = scalar.high - scalar.low
    pair = rotated_pair(TREE, scalar.low - width, scalar.high + width)  # leaf 0 vs leaf K-1 on every coordinate
    levels = TREE.levels

    def event(r: np.ndarray) -> np.ndarray:
        level = r[:, 0] % levels + 1
        node_prime = np.right_shift(scalar.num_bins - 1, levels - level)
        return rr_event(r[:, 1], r[:, 2], np.zeros_like(level), node_prime)

    bound = privacy_bound(TREE, eps, pair, event)
    assert 0.9 * eps <= bound <= eps


def test_privacy_shifted_norm(js_package) -> None:
    eps = 1.0
    center = list(NORM.center)
    pair = (center, [center[0] + 1000.0, center[1], center[2]])  # distance 0 (bin 0) vs log2 1000 > high (last bin)
    last = NORM.scalar.num_bins - 1
    bound = privacy_bound(NORM, eps, pair, lambda r: rr_event(r[:, 0], r[:, 1], np.zeros_like(r[:, 0]), np.full_like(r[:, 0], last)))
    assert 0.9 * eps <= bound <= eps


# --------------------------------------------------------------------------
# (d) modular sum: uniform shares, the Pólya share, the discrete Laplace total
# --------------------------------------------------------------------------

SUM_USERS = 200_000
#: x = 0.28125 encodes to s = 8 x = 2.25 exactly: 2 + Bernoulli(1/4).
SUM_X = 0.28125


@pytest.fixture(scope="module")
def sum_shares(js_package) -> np.ndarray:
    """SUM_USERS users' shares of SUM_X, int64 ``(SUM_USERS, messages)``."""
    return js_reports(SUM, 1.0, 1e-6, SUM_X, SUM_USERS, seed=401)[:, :, 0]


def uniform_bin_probabilities(q: int, bins: int) -> np.ndarray:
    """Exact P(share * bins // q == i) for a uniform share mod q."""
    edges = np.array([-(-i * q // bins) for i in range(bins + 1)], dtype=np.int64)  # ceil(i q / bins)
    return np.diff(edges) / q


def polya_share_pmf(alpha: float, users: int, support: int) -> np.ndarray:
    """pmf of NB(1/users, 1 - alpha) - NB(1/users, 1 - alpha) at -support..support."""
    nb = stats.nbinom(1.0 / users, 1.0 - alpha).pmf(np.arange(support + 1))
    return np.convolve(nb, nb[::-1])


def as_pmf(weights: np.ndarray, first: int) -> dict[int, float]:
    return {first + j: float(p) for j, p in enumerate(weights)}


def test_modular_sum_any_two_shares_are_uniform(sum_shares) -> None:
    q, bins = SUM.modulus, 8
    p = uniform_bin_probabilities(q, bins)
    expected = np.outer(p, p).ravel() * SUM_USERS
    for i, j in ((0, 1), (0, 2), (1, 2)):
        cells = (sum_shares[:, i] * bins // q) * bins + sum_shares[:, j] * bins // q
        observed = np.bincount(cells, minlength=bins * bins)
        stat = float(np.sum((observed - expected) ** 2 / expected))
        assert stat <= stats.chi2.isf(ALPHA, bins * bins - 1), (i, j, stat)


def test_modular_sum_decodes_to_encoding_plus_polya_share(sum_shares) -> None:
    total = centered(sum_shares.sum(axis=1), SUM.modulus)
    alpha = np.exp(-1.0 / SUM.precision)
    support = 400
    encoding = np.array([0.75, 0.25])  # at 2 and 3
    assert_fits(total, as_pmf(np.convolve(encoding, polya_share_pmf(alpha, SUM.users, support)), 2 - support))


def test_modular_sum_users_shares_sum_to_discrete_laplace(sum_shares) -> None:
    groups = sum_shares.reshape(-1, SUM.users * SUM.messages)  # SUM.users users per group
    total = centered(groups.sum(axis=1), SUM.modulus)
    alpha = float(np.exp(-1.0 / SUM.precision))
    support = 300
    dlap = np.array([(1 - alpha) / (1 + alpha) * alpha ** abs(k) for k in range(-support, support + 1)])
    encodings = stats.binom(SUM.users, 0.25).pmf(np.arange(SUM.users + 1))  # at 2 users + 0..users
    assert_fits(total, as_pmf(np.convolve(encodings, dlap), 2 * SUM.users - support))


# --------------------------------------------------------------------------
# Budget rules: the same accept/refuse as Python, naming the same parameter
# --------------------------------------------------------------------------


def budget_cases() -> list[tuple[str, object, float, float]]:
    scalar = chosen_sum()
    vector = chosen_vector_sum()
    local = chosen_local(1.0, 1e-6)
    return [
        ("sum-chosen", scalar, 1.0, 1e-6),
        ("sum-fewer-messages", dataclasses.replace(scalar, messages=scalar.messages - 1), 1.0, 1e-6),
        ("sum-small-modulus", dataclasses.replace(scalar, modulus=2 * scalar.users * scalar.precision), 1.0, 1e-6),
        ("sum-delta-zero", scalar, 1.0, 0.0),
        ("sum-two-users", dataclasses.replace(scalar, users=2, messages=3), 1.0, 1e-6),
        ("sum-fine-precision", dataclasses.replace(scalar, precision=2**40, modulus=2**62, messages=20), 1e-6, 1e-6),
        ("vector-sum-chosen", vector, 1.0, 1e-6),
        ("vector-sum-less-noise", dataclasses.replace(vector, mu=vector.mu * 0.8), 1.0, 1e-6),
        ("vector-sum-two-messages", dataclasses.replace(vector, messages=2), 1.0, 1e-6),
        ("vector-sum-small-modulus", dataclasses.replace(vector, modulus=1000), 1.0, 1e-6),
        ("local-chosen", local, 1.0, 1e-6),
        ("local-less-noise", dataclasses.replace(local, mu=local.mu * 0.9), 1.0, 1e-6),
        ("local-delta-zero", local, 1.0, 0.0),
        ("range-paper-tiny-eps", PAPER, 2e-6, 0.0),
        ("range-delta", RANGE, 1.0, 1e-6),
        ("tree-delta", TREE, 1.0, 1e-6),
        ("norm-ok", NORM, 1.0, 0.0),
        ("mean-gaussian-no-delta", MEAN_GAUSSIAN, 1.0, 0.0),
        ("mean-laplace-ok", MEAN_LAPLACE, 1.0, 0.0),
    ]


def test_budget_rules_agree_with_python(js_package) -> None:
    cases = budget_cases()
    expected = []
    for _, params, eps, delta in cases:
        try:
            params.check_budget(eps, delta)
            expected.append(None)
        except InvalidParameter as exc:
            expected.append(exc.parameter)
    checks = [
        {"mechanism": params.MECHANISM, "params": params_json(params), "epsilon0": eps, "delta0": delta}
        for _, params, eps, delta in cases
    ]
    answers = json.loads(run_node(SCRIPT, input=json.dumps({"checks": checks}).encode()))
    assert dict(zip([c[0] for c in cases], answers)) == dict(zip([c[0] for c in cases], expected))
    assert expected.count(None) == 5  # the chosen parameters pass, every altered one is refused
