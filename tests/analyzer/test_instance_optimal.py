"""The instance-optimal clipped mean (Huang, Liang & Yi, NeurIPS 2021, Sec. 5), local and shuffle.

Every statistical tolerance below is derived in a comment next to it (a union bound over
the quantities checked, with a stated failure probability for the fixed seed); none was
widened to make a test pass. The accountant's budgets are computed once per module
(``tests/conftest.py`` points its cache at a fresh file).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats

from shuffledp.analyzer.decoders import hadamard_scale
from shuffledp.analyzer.instance_optimal import (
    InstanceOptimalConfig,
    InstanceOptimalProtocol,
    RoundBudgets,
    local_mean_decode,
    noise_per_radius,
    THRESHOLD_ALPHA,
    pick_threshold,
    tree_fractions,
    tree_medians,
)
from shuffledp.analyzer.instance_optimal_budget import final_round_params, round_budgets
from parties import Recording
from shuffledp.analyzer.summation import vector_rounding_variance, vector_sum_variance
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.client.mechanisms import check_report_values, report_ranges
from shuffledp.client.quantile_randomizer import randomize_coordinate_tree, tree_node
from shuffledp.client.range_randomizer import bin_index, keep_probability
from shuffledp.client.summation import clip_to_ball, encode_vectors, randomize_local_vector
from shuffledp.simulation.engine import draw_round, run_fast, run_messages
from shuffledp.protocol.mechanisms.distributed_noise import skellam_shares
from shuffledp.protocol.errors import BudgetExceeded, InvalidParameter, ValueOutOfRange
from shuffledp.protocol.mechanisms.hadamard import hadamard_entry, next_power_of_two
from shuffledp.protocol.wire.messages import (
    CoordinateTreeParams,
    LocalVectorParams,
    RoundSpec,
    ShiftedNormParams,
    ShiftedVectorSumParams,
)
from shuffledp.protocol.mechanisms.randomness import SeededSource
from shuffledp.protocol.mechanisms.rotation import RandomRotation
from shuffledp.protocol.mechanisms.summation_params import skellam_tail, smallest_skellam_mu

#: Chi-square tests reject at this p-value (each fixed-seed test fails by chance w.p. 1e-4).
ALPHA = 1e-4

# --------------------------------------------------------------------------- shared set-ups
SMALL_N, SMALL_D = 240, 3  # the engine comparison (real clients, sealing, shuffler)
BIG_N, BIG_D = 20_000, 8  # the accuracy tests
EPS, DELTA = 2.0, 1e-6


def _small_config(model: str) -> InstanceOptimalConfig:
    return InstanceOptimalConfig(dim=SMALL_D, users=SMALL_N, radius=10.0, epsilon=4.0, delta=DELTA, model=model, leaves=64, rotation_seed=21)


def _big_config(model: str, **kw) -> InstanceOptimalConfig:
    return InstanceOptimalConfig(dim=BIG_D, users=BIG_N, radius=100.0, epsilon=EPS, delta=DELTA, model=model, leaves=64, rotation_seed=5, **kw)


@pytest.fixture(scope="module")
def small_budgets():
    return {model: round_budgets(_small_config(model)) for model in ("shuffle", "local")}


@pytest.fixture(scope="module")
def big_budgets():
    return {model: round_budgets(_big_config(model)) for model in ("shuffle", "local")}


#: Data of the accuracy tests: N(mu, Sigma) with ||mu|| = 20 (far from the origin, inside the
#: radius-100 ball) and Sigma = diag(s^2), s from 0.5 to 3 (anisotropic).
BIG_SCALES = np.linspace(0.5, 3.0, BIG_D)
BIG_MU = np.array([1.0, -2.0, 3.0, 0.5, -1.5, 2.5, 1.0, -0.5])
BIG_MU = BIG_MU / np.linalg.norm(BIG_MU) * 20.0


@pytest.fixture(scope="module")
def big_data():
    return BIG_MU + np.random.default_rng(17).normal(size=(BIG_N, BIG_D)) * BIG_SCALES


@pytest.fixture(scope="module")
def big_runs(big_budgets, big_data):
    out = {}
    for model in ("shuffle", "local"):
        protocol = InstanceOptimalProtocol(_big_config(model), big_budgets[model])
        out[model] = run_fast(protocol, big_data, seed=23)
    return out


def _spec(plan, round_id: int) -> RoundSpec:
    """A real spec for ``plan`` (its ``__post_init__`` also runs the mechanism's ``check_budget``)."""
    return RoundSpec(
        bytes(16), round_id, plan.params, plan.epsilon0, bytes(32), bytes(32), bytes(range(32)),
        min_batch=getattr(plan.params, "min_reports", 1), deadline=1e12, delta0=plan.delta0,
        messages_per_user=plan.messages_per_user,
    )




def _assert_identical(a, b) -> None:
    """Bit-for-bit equal results: every decoder sums integers exactly (fwht of integer counts,
    modular sums, bincount of integers far below 2^53), so the order of the reports cannot matter."""
    assert type(a) is type(b)
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            _assert_identical(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_identical(x, y)
    else:
        assert a == b


# --------------------------------------------------------------------------- 1. both engines
@pytest.mark.parametrize("model", ["shuffle", "local"])
def test_both_engines_give_the_same_estimate_and_every_report_is_in_range(model, small_budgets):
    rng = np.random.default_rng(4)
    data = np.array([3.0, -2.0, 1.0]) + rng.normal(size=(SMALL_N, SMALL_D)) * np.array([0.5, 1.0, 2.0])
    protocol = InstanceOptimalProtocol(_small_config(model), small_budgets[model])
    fast, messages = Recording(protocol), Recording(protocol)
    fast_run = run_fast(fast, data, seed=11)
    message_run = run_messages(messages, data, seed=11)
    assert len(fast.seen) == len(messages.seen) == 3
    for a, b in zip(fast.seen, messages.seen):
        np.testing.assert_array_equal(a, b)  # the same multiset of reports
    _assert_identical(fast_run.result, message_run.result)
    mechanisms = ["coordinate-tree", "shifted-norm", "shifted-vector-sum" if model == "shuffle" else "local-vector"]
    assert [r.plan.params.MECHANISM for r in fast_run.rounds] == mechanisms
    for index, (f, m) in enumerate(zip(fast_run.rounds, message_run.rounds)):
        assert (f.reports, f.messages) == (m.reports, m.messages)
        assert m.rejected_at_shuffler == {} and m.rejected_at_analyzer == {}
        # Each round's reports, drawn user by user, are what the analyzer saw, and every row is
        # within what an honest randomizer of that spec can send.
        drawn = draw_round(f.plan, data, 11, index)
        assert drawn.shape == (SMALL_N, f.plan.messages_per_user, f.plan.params.VALUES_PER_REPORT)
        rows = drawn.reshape(-1, drawn.shape[-1])
        np.testing.assert_array_equal(rows[np.lexsort(rows.T[::-1])], fast.seen[index])
        ranges = report_ranges(_spec(f.plan, index))
        for row in rows:
            check_report_values(tuple(int(v) for v in row), ranges)
    # the check has teeth: a value just outside the range is refused
    with pytest.raises(ValueOutOfRange):
        check_report_values(tuple(r.high + 1 for r in ranges), ranges)


# --------------------------------------------------------------------------- 2. the tree randomizer
def test_tree_node_is_the_ancestor_at_each_level():
    levels = 6
    leaves = np.arange(1 << levels)
    for level in range(1, levels + 1):
        node = tree_node(leaves, levels, np.full(leaves.shape, level))
        np.testing.assert_array_equal(node, leaves // 2 ** (levels - level))
        assert node.min() == 0 and node.max() == 2**level - 1
        if level > 1:  # the parent of the level's node is the previous level's node
            parent = tree_node(leaves, levels, np.full(leaves.shape, level - 1))
            np.testing.assert_array_equal(node >> 1, parent)
    np.testing.assert_array_equal(tree_node(leaves, levels, np.full(leaves.shape, levels)), leaves)


def test_coordinate_tree_groups_are_uniform_and_reports_name_the_users_node():
    params = CoordinateTreeParams(-4.0, 4.0, 4.0 / 64, dim=3, rotation_seed=9)  # 64 leaves, 6 levels, D = 4
    assert (params.levels, params.padded_dim, params.groups) == (6, 4, 24)
    n = 24_000
    x = np.random.default_rng(1).normal(0.5, 1.0, (n, 3))
    # eps0 = 30: a bit is flipped w.p. 1/(1+e^30) < 1e-13, so over n reports none is (P < 3e-9).
    reports = randomize_coordinate_tree(x, params, 30.0, SeededSource(2))
    groups, rows, bits = reports.T
    assert reports.shape == (n, 3) and groups.min() >= 0 and groups.max() < params.groups
    assert rows.min() >= 0 and rows.max() < params.scalar.padded_bins and set(np.unique(bits)) <= {-1, 1}
    coords, levels = groups // params.levels, groups % params.levels + 1
    # Coordinates, levels and the pair are uniform and independent of the data (chi-square at ALPHA each).
    for values, cells in ((coords, params.padded_dim), (levels - 1, params.levels), (groups, params.groups)):
        counts = np.bincount(values, minlength=cells)
        assert stats.chisquare(counts).pvalue > ALPHA
    # Each bit is the Hadamard sign of the user's own node: the rotated coordinate drawn, at the level drawn.
    rotated = RandomRotation(3, 9).apply(x)
    leaf = np.floor((rotated[np.arange(n), coords] + 4.0) / (8.0 / 64)).astype(np.int64)
    node = leaf >> (params.levels - levels)
    np.testing.assert_array_equal(bits, hadamard_entry(rows, node))


def _tree_output_distribution(x: np.ndarray, params: CoordinateTreeParams, epsilon: float) -> np.ndarray:
    """Exact probability of every report ``(group, row, bit)`` of one user holding ``x``:
    ``1/(D levels)`` for the group, ``1/K`` for the row, ``p`` or ``1 - p`` for the sign."""
    K, L, D = params.scalar.padded_bins, params.levels, params.padded_dim
    p = keep_probability(epsilon)
    rotated = RandomRotation(params.dim, params.rotation_seed).apply(x[None])[0]
    leaf = bin_index(rotated[:D], params.scalar)
    out = np.empty((D * L, K, 2))
    j = np.arange(K)
    for coord in range(D):
        for level in range(1, L + 1):
            node = tree_node(leaf[coord], L, level)
            sign = hadamard_entry(j, node)
            g = coord * L + level - 1
            out[g, :, 0] = np.where(sign == -1, p, 1 - p) / (D * L * K)  # bit -1
            out[g, :, 1] = np.where(sign == 1, p, 1 - p) / (D * L * K)  # bit +1
    return out


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_coordinate_tree_is_pure_ldp_with_the_exact_output_distribution(epsilon):
    params = CoordinateTreeParams(-2.0, 2.0, 0.25, dim=3, rotation_seed=4)  # 8 leaves, 3 levels, D = 4: 192 outputs
    rng = np.random.default_rng(8)
    inputs = np.concatenate([rng.uniform(-2.5, 2.5, (60, 3)), np.eye(3) * 2.0, -np.eye(3) * 2.0])
    dists = np.stack([_tree_output_distribution(x, params, epsilon) for x in inputs]).reshape(len(inputs), -1)
    np.testing.assert_allclose(dists.sum(axis=1), 1.0, rtol=1e-12)
    # For every output, the largest over the smallest probability across inputs is at most e^eps
    # (and reaches it: the bound is tight, so a looser randomizer would be seen).
    ratio = (dists.max(axis=0) / dists.min(axis=0)).max()
    assert ratio <= math.exp(epsilon) * (1 + 1e-12)
    assert ratio >= math.exp(epsilon) * (1 - 1e-9)
    # The randomizer draws from exactly that distribution: 30,000 reports of one input against
    # the exact cell probabilities (chi-square, 191 degrees of freedom, at ALPHA).
    x = inputs[0]
    n = 30_000
    reports = randomize_coordinate_tree(np.tile(x, (n, 1)), params, epsilon, SeededSource(int(epsilon * 10)))
    cells = (reports[:, 0] * params.scalar.padded_bins + reports[:, 1]) * 2 + (reports[:, 2] + 1) // 2
    observed = np.bincount(cells, minlength=dists.shape[1])
    assert stats.chisquare(observed, dists[0] * n).pvalue > ALPHA
    # and not from another input's distribution (power: a different leaf on some coordinate)
    other = next(i for i in range(1, len(inputs)) if np.abs(dists[i] - dists[0]).max() > 0)
    assert stats.chisquare(observed, dists[other] * n).pvalue < ALPHA


# --------------------------------------------------------------------------- 3. tree decoding
def test_tree_fractions_are_unbiased_within_a_hoeffding_union_bound():
    params = CoordinateTreeParams(-3.0, 3.0, 3.0 / 16, dim=2, rotation_seed=3)  # 16 leaves, 4 levels, D = 2: 8 groups
    epsilon, n = 2.0, 80_000
    x = np.random.default_rng(5).normal([0.7, -0.4], [0.8, 1.3], (n, 2))
    reports = randomize_coordinate_tree(x, params, epsilon, SeededSource(6))
    fractions, counts = tree_fractions(reports, params, epsilon)
    K, L = params.scalar.padded_bins, params.levels
    np.testing.assert_array_equal(counts, np.bincount(reports[:, 0], minlength=params.groups))
    # Truth: the fraction of group g's own users (reports come in user order) whose node is v.
    groups = reports[:, 0]
    rotated = RandomRotation(2, 3).apply(x)
    coord, level = groups // L, groups % L + 1
    leaf = np.clip(np.floor((rotated[np.arange(n), coord] + 3.0) / (6.0 / 16)).astype(np.int64), 0, K - 1)
    node = leaf >> (L - level)
    truth = np.bincount(groups * K + node, minlength=params.groups * K).reshape(params.groups, K) / counts[:, None]
    # Given the groups, fractions[g, v] is the mean of n_g independent terms c b H[j, v] in [-c, c]
    # with mean 1[node = v]: Hoeffding, P(|err| >= z c / sqrt(n_g)) <= 2 exp(-z^2 / 2). Union over
    # the 8 x 16 = 128 (group, node) cells at total failure 1e-4: z = sqrt(2 ln(2 * 128 / 1e-4)) = 5.43.
    c = hadamard_scale(epsilon)
    z = math.sqrt(2.0 * math.log(2.0 * params.groups * K / 1e-4))
    error = np.abs(fractions - truth) / (c / np.sqrt(counts[:, None]))
    assert error.max() <= z, error.max()
    # Power: the decoder's scale matters (without the 1/n_g, or with c missing, this fails).
    assert np.abs(fractions * 1.2 - truth).max() / (c / math.sqrt(counts.min())) > z


def _exact_fractions(rotated: np.ndarray, params: CoordinateTreeParams) -> np.ndarray:
    """``fractions[coord * L + level - 1, v]``: the exact fraction of users whose node is ``v``."""
    K, L, D = params.scalar.padded_bins, params.levels, params.padded_dim
    width = (params.high - params.low) / params.scalar.num_bins
    leaf = np.clip(np.floor((rotated - params.low) / width).astype(np.int64), 0, K - 1)
    out = np.zeros((D * L, K))
    for coord in range(D):
        for level in range(1, L + 1):
            out[coord * L + level - 1] = np.bincount(leaf[:, coord] >> (L - level), minlength=K) / len(rotated)
    return out


@pytest.mark.parametrize("rank", [0.1, 0.5, 0.9])
def test_tree_medians_with_exact_fractions_find_the_quantile_leaf(rank):
    params = CoordinateTreeParams(-8.0, 8.0, 8.0 / 256, dim=4, rotation_seed=12)  # 256 leaves of width 1/16
    n = 2001  # rank * n is never an integer: the quantile's leaf is unique
    x = np.random.default_rng(9).normal([1.0, -2.0, 0.5, 3.0], [0.3, 1.0, 2.0, 0.7], (n, 4))
    rotated = RandomRotation(4, 12).apply(x)
    assert np.abs(rotated).max() < 8.0
    fractions = _exact_fractions(rotated, params)
    counts = np.full(params.groups, 10**15)  # sd = c / sqrt(1e15) ~ 3e-8, far below any node's mass (>= 1/n)
    medians = tree_medians(fractions, counts, params, 1.0, rank=rank)
    # Exact masses: the descent ends in the leaf holding the ceil(rank n)-th order statistic
    # (the smallest leaf whose cumulative mass reaches rank), and returns its midpoint: within
    # half a leaf (tau) of that order statistic.
    quantile = np.sort(rotated, axis=0)[math.ceil(rank * n) - 1]
    assert np.abs(medians - quantile).max() <= params.tau * (1 + 1e-9)


def test_tree_medians_stop_where_the_counts_cannot_resolve_a_node():
    params = CoordinateTreeParams(-8.0, 8.0, 8.0 / 256, dim=4, rotation_seed=12)
    x = np.random.default_rng(10).normal(2.0, 1.0, (501, 4))
    fractions = _exact_fractions(RandomRotation(4, 12).apply(x), params)
    c = hadamard_scale(1.0)
    # c / sqrt(n_g) >= 0.5 = resolve * (the root's mass 1): not even the first level is resolvable,
    # and every coordinate gets the root's midpoint, the origin.
    tiny = np.full(params.groups, int((2.0 * c) ** 2))
    assert c / math.sqrt(tiny[0]) >= 0.5
    np.testing.assert_array_equal(tree_medians(fractions, tiny, params, 1.0), np.zeros(4))
    np.testing.assert_array_equal(tree_medians(fractions, np.zeros(params.groups, dtype=np.int64), params, 1.0), np.zeros(4))


# --------------------------------------------------------------------------- 4. the threshold
def _norm_params(bins_per_octave: int = 4, octaves: int = 10, high: float = 8.0) -> ShiftedNormParams:
    return ShiftedNormParams((0.0, 0.0), high - octaves, high, 0.5 / bins_per_octave)


def _log_bins(norms: np.ndarray, params: ShiftedNormParams) -> np.ndarray:
    bins = params.scalar.num_bins
    return np.clip(np.floor((np.log2(norms) - params.low) / (2.0 * params.tau)).astype(np.int64), 0, bins - 1)


def test_pick_threshold_is_the_upper_edge_of_the_first_detected_bin_over_the_target():
    params = _norm_params()
    bins = params.scalar.num_bins
    assert bins == 40
    n = 10_000
    norms = 2.0 ** np.random.default_rng(3).normal(3.0, 1.2, n)
    exact = np.bincount(_log_bins(norms, params), minlength=params.scalar.padded_bins) / n
    epsilon = 30.0  # c = coth(15) = 1 + 2e-13
    c = hadamard_scale(epsilon)
    # Detection threshold (Hoeffding + union over the 40 bins at alpha = 0.01), in users: ~407.
    detection = c * math.sqrt(2.0 * math.log(bins / THRESHOLD_ALPHA) / n) * n
    for k in (0.0, 300.0, 1500.0):
        result = pick_threshold(exact, params, n, epsilon, k)
        above, index = 0.0, None
        for i in range(bins - 1, -1, -1):  # independent restatement of the rule
            if n * exact[i] >= detection:
                above += n * exact[i]
                if above > k:
                    index = i
                    break
        assert index is not None
        assert result.detection_count == pytest.approx(detection, rel=1e-12)
        assert result.bin_edge_log2 == pytest.approx(params.low + (index + 1) / 4.0, abs=1e-12)
        assert result.radius == pytest.approx(2.0**result.bin_edge_log2, rel=1e-12)
        assert result.target_count == k
        # What the rule means: the users above the radius are those of detected bins above it
        # (at most k of them) and of undetected bins (each under `detection`); more than k lie at or
        # above the chosen bin's lower edge.
        undetected_above = sum(1 for i in range(index + 1, bins) if 0 < n * exact[i] < detection)
        assert np.sum(norms >= result.radius) <= k + undetected_above * detection
        assert np.sum(norms >= result.radius / 2.0**0.25) > k
    # Every user in the lowest bin: the radius is bin 0's upper edge.
    low_only = np.zeros(params.scalar.padded_bins)
    low_only[0] = 1.0
    fallback = pick_threshold(low_only, params, n, epsilon, 10.0)
    assert fallback.bin_edge_log2 == pytest.approx(params.low + 0.25) and fallback.tail_estimate == n


def test_pick_threshold_ignores_noise_in_empty_bins_above_the_data():
    """The failure the detection rule fixes: summing every bin from the top, the noise of ~100 empty
    bins (a random walk of sd c sqrt(n s)) crossed 2 sd and put the radius far above every user. With
    real Hadamard-response reports (n = 20,000, eps = 1, every norm in one octave near 2^3), the radius
    must be within one bin above the largest norm, for every seed (alpha = 0.01 per run, 20 runs:
    a failure rate of 0.2 would show with probability > 0.98)."""
    from shuffledp.client.quantile_randomizer import randomize_shifted_norm
    from shuffledp.analyzer.decoders import hadamard_frequencies
    from shuffledp.protocol.mechanisms.randomness import SeededSource

    params = ShiftedNormParams((0.0, 0.0), -32.0, 8.0, 0.125)
    n = 20_000
    rng = np.random.default_rng(5)
    x = rng.normal(size=(n, 2))
    x *= (2.0 ** rng.uniform(2.6, 3.2, n) / np.linalg.norm(x, axis=1))[:, None]
    largest = np.linalg.norm(x, axis=1).max()
    for seed in range(20):
        rows = randomize_shifted_norm(x, params, 1.0, SeededSource(np.random.SeedSequence(seed)))
        freqs = hadamard_frequencies(rows[:, 0], rows[:, 1], params.scalar.padded_bins, 1.0)
        result = pick_threshold(freqs, params, n, 1.0, 50.0)
        assert result.radius <= largest * 2.0**0.25 * 2.0**0.25, (seed, result)


@pytest.mark.parametrize("q", [0.1, 0.5, 0.9])
def test_fixed_quantile_threshold_is_within_one_bin_of_the_quantile(q):
    params = _norm_params(bins_per_octave=4)
    n = 10_001  # (1 - q) n is never an integer: no ties with the target
    norms = 2.0 ** np.random.default_rng(4).normal(2.0, 1.5, n)
    exact = np.bincount(_log_bins(norms, params), minlength=params.scalar.padded_bins) / n
    result = pick_threshold(exact, params, n, 30.0, 1e9, fixed_quantile=q)  # k huge: ignored by the quantile rule
    counts = n * exact[: params.scalar.num_bins]
    detected_total = counts[counts >= result.detection_count].sum()
    assert result.target_count == pytest.approx((1 - q) * detected_total)
    # The q-quantile of the users in detected bins, to within one bin: detected bins above the chosen
    # one hold at most the target, undetected ones (under the detection count each) `skipped` more;
    # the detected bins from the chosen one up hold more than the target.
    chosen = round((result.bin_edge_log2 - params.low) * 4) - 1
    skipped = sum(c for c in counts[chosen + 1 :] if c < result.detection_count)
    target = result.target_count
    assert np.sum(norms >= result.radius) <= target + skipped
    assert np.sum(norms >= result.radius / 2.0**0.25) > target


# --------------------------------------------------------------------------- 5. accuracy
def _standardized_errors(outcome, data: np.ndarray, model: str, sd_only: bool = False) -> np.ndarray:
    """``(estimate - target) / sd`` per coordinate, given the outcome's centre C0 and radius r.

    Target: ``mean_i clip(x_i - C0, r) + C0`` (the final round's clipped, shifted mean). Error on
    rotated coordinate j of the encoded sum: the Skellam noise (variance 2 mu in the summation, one
    Skellam(mu) per user in the local model: n 2 mu) plus the randomized rounding (exactly
    R_j = sum_i f_ij (1 - f_ij) <= n/4), independent across j. Rotating back with |U_jk| = 1/sqrt(D)
    gives every original coordinate the mean of the D rotated variances; times (r / levels)^2 / n^2
    for the mean (analyzer/summation.py, vector_sum_variance, divided by dim)."""
    params = outcome.final_params
    center = np.asarray(params.center)
    n = len(data)
    target = clip_to_ball(data - center, params.radius).mean(axis=0) + center
    rounding = vector_rounding_variance(data - center, params)
    if model == "shuffle":
        per_coordinate = vector_sum_variance(params, rounding) / params.dim / n**2
    else:
        per_coordinate = (n * 2.0 * params.mu + rounding.mean()) * (params.radius / params.levels) ** 2 / n**2
    if sd_only:
        return np.full(params.dim, math.sqrt(per_coordinate))
    return (outcome.estimate - target) / math.sqrt(per_coordinate)


@pytest.mark.parametrize("model", ["shuffle", "local"])
def test_estimate_is_unbiased_for_the_clipped_shifted_mean(model, big_runs, big_data):
    outcome = big_runs[model].result
    np.testing.assert_array_equal(outcome.center, np.asarray(outcome.final_params.center))
    assert outcome.final_params.radius == outcome.threshold.radius and outcome.users == BIG_N
    z = _standardized_errors(outcome, big_data, model)
    # Tail bound: on each original coordinate the noise is a signed sum of D Skellam(mu) (or n D),
    # itself Skellam(D mu) / sqrt(D) (Skellam is symmetric), and the rounding a sum of independent
    # centred Bernoullis. Chernoff with the Skellam MGF exp(2 lam (cosh s - 1)) at s = z / sd ~ 1e-3
    # (cosh s - 1 <= (s^2 / 2)(1 + 1e-6)) and Hoeffding's lemma for the roundings (proxy n/4 against
    # the exact R_j, whose excess over the variance is < 0.1 % of 2 mu here) give
    # P(|z_k| >= 5) <= 2 exp(-12.5 * 0.999) = 7.5e-6 per coordinate: <= 6e-5 over d = 8.
    assert np.abs(z).max() <= 5.0, z
    if model == "shuffle":
        # Teeth: against clipping about the origin (what an unshifted clipped mean estimates: the
        # radius found, ~10, is below ||mu|| = 20) the same standardization is far outside the band.
        params = outcome.final_params
        assert params.radius < 15.0
        sd = _standardized_errors(outcome, big_data, model, sd_only=True)
        unshifted = clip_to_ball(big_data, params.radius).mean(axis=0)
        assert np.abs((outcome.estimate - unshifted) / sd).max() > 5.0


def _descent_node(median: float, params: CoordinateTreeParams) -> tuple[int, int]:
    """``(depth, node)`` of the node whose midpoint :func:`tree_medians` returned."""
    L, span = params.levels, params.high - params.low
    for depth in range(L, -1, -1):
        k = (median - params.low) / (span / 2**depth) - 0.5
        if abs(k - round(k)) < 1e-6:
            return depth, int(round(k))
    raise AssertionError(f"{median} is no node's midpoint")


def test_shuffle_center_is_near_the_mean_by_the_descents_rank_error(big_runs, big_data, big_budgets):
    """The centre's error, from the descent's rank error (F: the empirical CDF of a rotated coordinate).

    Every estimated node fraction has error of variance (c^2 - f^2) / n_g <= c^2 / n_g (Hadamard
    response plus the group's sampling), independent across levels (each level has its own users).
    The descent turns right iff the rank still to find exceeds the left child's estimate, so for the
    leaf [a, b) it reaches, est F(a) < 1/2 <= est F(b): est F(a) sums the left-sibling estimates at
    the right turns (variance sd_a^2), est F(b) those before the last left turn plus the last left
    turn's (sd_b^2). With z = 3.5 per event (Gaussian approximation of sums of >= 300 bounded
    terms; 2 events per coordinate, 16 in all: failure <= 16 * 4.7e-4 = 7.5e-3 for this seed):
    F(a) <= 1/2 + z sd_a and F(b) >= 1/2 - z sd_b.

    For N(mu, Sigma), every rotated coordinate is Gaussian with sd sigma = sqrt(tr Sigma / D)
    (|U_jk| = 1/sqrt(D), Sigma diagonal); within the DKW band between the empirical and the
    population CDF, a <= Q(1/2 + z sd_a) and b >= Q(1/2 - z sd_b) put the leaf's midpoint within
    sigma Phi^{-1}(1/2 + z max(sd_a, sd_b) + dkw) + tau of (U mu)_j (no bound where the argument
    reaches 1), and ||C0 - mu|| = ||medians - U mu|| (U orthogonal, D = d). Here c / sqrt(min n_g)
    <= 0.060 (the tree's tenth of the budget: eps0 = 2.72, c = 1.14, n_g >= 366), so an sd summing
    at most 5 of the 6 levels' variances is <= sqrt(5) * 0.060 = 0.134 and the bound is at most
    sqrt(D) (sigma Phi^{-1}(0.5 + 3.5 * 0.134 + 0.016) + tau) = (2.17 + 0.81) w = 2.98 w; all 6 (a
    descent that turns one way at every level but the last) would leave it unbounded. So the
    check: the bound is finite and within 3 w here, and the centre is within it (the origin is
    ||mu|| = 3.66 w away)."""
    outcome = big_runs["shuffle"].result
    config = _big_config("shuffle")
    params = config.tree_params()
    L, D = params.levels, params.padded_dim
    c = hadamard_scale(big_budgets["shuffle"].tree_epsilon0)
    counts = outcome.tree_counts
    assert c / math.sqrt(counts.min()) <= 0.060
    rotated = RandomRotation(BIG_D, config.rotation_seed).apply(big_data)
    z = 3.5
    sigma = math.sqrt(np.sum(BIG_SCALES**2) / D)
    dkw = math.sqrt(math.log(2.0 * D / 1e-3) / (2 * BIG_N))  # P(sup |F_n - F| > dkw) <= 1e-3 / D per coordinate
    bound = np.empty(D)
    for j in range(D):
        depth, node = _descent_node(outcome.rotated_medians[j], params)
        # every level resolves (c / sqrt(n_g) <= 0.054): the descent reaches a leaf and returns its midpoint
        assert depth == L
        a = params.low + node * 2.0 * params.tau
        turns = [(node >> (L - h)) & 1 for h in range(1, L + 1)]  # levels 1..L, 1 = right
        var = [c**2 / counts[j * L + h - 1] for h in range(1, L + 1)]
        sd_a = math.sqrt(sum(v for t, v in zip(turns, var) if t == 1))
        lefts = [h for h, t in enumerate(turns) if t == 0]
        sd_b = math.sqrt(sum(v for h, (t, v) in enumerate(zip(turns, var)) if (t == 1 and h < lefts[-1]) or h == lefts[-1])) if lefts else 0.0
        assert np.mean(rotated[:, j] < a) <= 0.5 + z * sd_a
        assert np.mean(rotated[:, j] < a + 2.0 * params.tau) >= 0.5 - z * sd_b
        level = 0.5 + z * max(sd_a, sd_b) + dkw
        bound[j] = sigma * stats.norm.ppf(level) + params.tau if level < 1.0 else math.inf
    w = math.sqrt(np.sum(BIG_SCALES**2))
    total = math.sqrt(np.sum(bound**2))
    assert total <= 3.0 * w, total / w
    assert np.linalg.norm(outcome.center - BIG_MU) <= total


# --------------------------------------------------------------------------- 6. budgets
def test_shuffle_budget_composes_to_at_most_the_session(big_budgets, big_runs):
    from shuffledp.protocol.accounting import generic_guarantee, hadamard_response_guarantee, shuffled_round

    config, b = _big_config("shuffle"), big_budgets["shuffle"]
    s1, s2, s3 = (share * EPS for share in config.split)
    assert b.session_epsilon <= EPS and b.session_delta == DELTA
    assert sum(r["delta"] for r in b.per_round) == pytest.approx(DELTA, rel=1e-12)
    norm_bins = next_power_of_two(config.octaves * config.bins_per_octave)
    c1 = shuffled_round(generic_guarantee(b.tree_epsilon0), BIG_N, DELTA / 4).epsilon
    c2 = shuffled_round(hadamard_response_guarantee(b.norm_epsilon0, norm_bins), BIG_N, DELTA / 4).epsilon
    assert c1 <= s1 and c2 <= s2
    assert b.session_epsilon == pytest.approx(c1 + c2 + s3, rel=1e-12)
    final = big_runs["shuffle"].result.final_params
    assert isinstance(final, ShiftedVectorSumParams)
    final.check_budget(s3, DELTA / 2)
    assert (b.mean_epsilon0, b.mean_delta0) == (s3, DELTA / 2)
    _budget_is_what_the_ledger_is_charged(InstanceOptimalProtocol(config, b), big_runs["shuffle"])


def test_local_budget_is_the_sum_of_the_local_guarantees(big_budgets, big_runs):
    config, b = _big_config("local"), big_budgets["local"]
    assert b.tree_epsilon0 + b.norm_epsilon0 + b.mean_epsilon0 == pytest.approx(EPS, rel=1e-12)
    assert (b.tree_epsilon0, b.norm_epsilon0, b.mean_epsilon0) == tuple(s * EPS for s in config.split)
    final = big_runs["local"].result.final_params
    assert isinstance(final, LocalVectorParams)
    final.check_budget(config.split[2] * EPS, DELTA)
    _budget_is_what_the_ledger_is_charged(InstanceOptimalProtocol(config, b), big_runs["local"])


def _budget_is_what_the_ledger_is_charged(protocol, run) -> None:
    epsilon, delta = protocol.budget
    plans = [r.plan for r in run.rounds]
    assert epsilon == pytest.approx(sum(p.epsilon0 for p in plans), rel=1e-12)
    assert delta == plans[-1].delta0 and plans[0].delta0 == plans[1].delta0 == 0.0
    ledger = PrivacyLedger(epsilon, delta)  # a client with exactly this budget answers all three rounds
    for index, plan in enumerate(plans):
        _spec(plan, index)  # each spec passes its mechanism's budget check
        ledger.spend(bytes(16), index, plan.epsilon0, plan.delta0)
    with pytest.raises(BudgetExceeded):
        ledger.spend(bytes(16), 3, 0.01 * epsilon, 0.0)  # and nothing more


# --------------------------------------------------------------------------- 7. bad input
@pytest.mark.parametrize(
    "changes",
    [
        {"model": "central"},
        {"leaves": 48},
        {"leaves": 1},
        {"leaves": 64.0},
        {"split": (0.5, 0.5, 0.5)},
        {"split": (0.5, 0.0, 0.5)},
        {"split": (0.5, 0.5)},
        {"split": (0.4, -0.1, 0.5)},
        {"fixed_quantile": 0.0},
        {"fixed_quantile": 1.0},
        {"fixed_quantile": 1.5},
        {"fixed_quantile": float("nan")},
        {"radius": 0.0},
        {"radius": -1.0},
        {"radius": float("inf")},
        {"radius": float("nan")},
    ],
)
def test_config_refuses_bad_parameters(changes):
    fields = dict(dim=3, users=100, radius=10.0, epsilon=1.0, delta=1e-6)
    InstanceOptimalConfig(**fields)  # the base is valid
    with pytest.raises(InvalidParameter):
        InstanceOptimalConfig(**{**fields, **changes})


def test_params_refuse_bad_centers_and_a_one_leaf_tree():
    good = LocalVectorParams(3, 1.0, 200, 0, 100.0, (0.0, 0.0, 0.0))
    for center in [(0.0, 0.0), (0.0, 0.0, 0.0, 0.0), (0.0, float("nan"), 0.0), (0.0, float("inf"), 0.0), [0.0, 0.0, 0.0]]:
        with pytest.raises(InvalidParameter):
            dataclasses.replace(good, center=center)
    vector_sum = ShiftedVectorSumParams(3, 1.0, 200, 0, 1_000_003, 4, 100, 100.0, center=(0.0, 0.0, 0.0))
    for center in [(), (0.0, 0.0), (float("nan"), 0.0, 0.0)]:
        with pytest.raises(InvalidParameter):
            dataclasses.replace(vector_sum, center=center)
    norm = ShiftedNormParams((1.0, 2.0), -10.0, 8.0, 0.125)
    for center in [(), (float("nan"), 2.0), [1.0, 2.0]]:
        with pytest.raises(InvalidParameter):
            dataclasses.replace(norm, center=center)
    CoordinateTreeParams(-1.0, 1.0, 0.5, 3, 0)  # two leaves: the smallest tree
    with pytest.raises(InvalidParameter):
        CoordinateTreeParams(-1.0, 1.0, 1.0, 3, 0)  # one leaf


def test_local_vector_params_refuse_a_mu_too_small_for_the_budget():
    levels, epsilon, delta = 200, 1.0, 1e-6
    mu = smallest_skellam_mu(levels, 4, epsilon, delta)
    LocalVectorParams(3, 1.0, levels, 0, mu, (0.0,) * 3).check_budget(epsilon, delta)
    with pytest.raises(InvalidParameter, match="mu"):
        LocalVectorParams(3, 1.0, levels, 0, mu * 0.95, (0.0,) * 3).check_budget(epsilon, delta)
    with pytest.raises(InvalidParameter):
        LocalVectorParams(3, 1.0, levels, 0, mu, (0.0,) * 3).check_budget(epsilon, 0.0)  # Skellam is not pure


def test_local_mean_decode_takes_each_coordinates_own_count_and_refuses_an_empty_one():
    """Unequal counts are decoded, each coordinate by its own reports (refusing them let one client
    fail the round: ``tests/analyzer/test_instance_optimal_hostile.py``); a coordinate with none is refused."""
    params = LocalVectorParams(3, 2.0, 200, 1, 50.0, (1.0, 2.0, 3.0))
    reports = randomize_local_vector(np.zeros((20, 3)), params, SeededSource(1)).reshape(-1, 2)
    estimate, users = local_mean_decode(reports, params)
    assert users == 20 and estimate.shape == (3,)
    for batch in (reports[1:], np.concatenate([reports, reports[:1]])):  # one report short, one too many
        unequal, fewest = local_mean_decode(batch, params)
        counts = np.bincount(batch[:, 0], minlength=4)
        sums = np.bincount(batch[:, 0], weights=batch[:, 1].astype(float), minlength=4)
        expected = RandomRotation(3, 1).inverse(sums / counts * params.radius / params.levels) + np.asarray(params.center)
        np.testing.assert_allclose(unequal, expected)
        assert fewest == counts.min()
    with pytest.raises(InvalidParameter):
        local_mean_decode(reports[reports[:, 0] != 2], params)  # a coordinate with none


# --------------------------------------------------------------------------- 8. the local clamp
def test_local_reports_never_exceed_the_bound_and_the_clamp_is_post_processing(monkeypatch):
    mu = 40.0
    params = LocalVectorParams(3, 1.0, 50, 2, mu, (0.5, 0.5, 0.5))
    assert params.bound == params.levels + 1 + skellam_tail(mu, 2.0**-64)
    # the tail is what it claims: P(|Skellam(mu)| >= t) = 2 P(X >= t) <= 2^-64
    t = skellam_tail(mu, 2.0**-64)
    assert 2.0 * stats.skellam.sf(t - 1, mu, mu) <= 2.0**-64
    # Users on the sphere of radius 3 about the centre (clipped to 1) and far outside it.
    rng = np.random.default_rng(2)
    x = rng.normal(size=(5000, 3))
    x = 0.5 + 3.0 * x / np.linalg.norm(x, axis=1, keepdims=True)
    x[:10] *= 1e6
    reports = randomize_local_vector(x, params, SeededSource(3))
    assert np.abs(reports[:, :, 1]).max() <= params.bound
    # The report is clip(encoding + noise) with the same draws: a function of the noisy value only.
    source = SeededSource(3)
    noisy = encode_vectors(x - 0.5, params, source) + skellam_shares(mu, 1, (5000, 4), source)
    np.testing.assert_array_equal(reports[:, :, 1], np.clip(noisy, -params.bound, params.bound))
    np.testing.assert_array_equal(reports[:, :, 0], np.broadcast_to(np.arange(4), (5000, 4)))
    # With noise far past the tail, the clamp binds: every value is exactly +-bound.
    import shuffledp.client.summation as summation

    monkeypatch.setattr(summation, "skellam_shares", lambda mu, users, size, source: np.full(size, 10**9, dtype=np.int64) * np.resize([1, -1], size))
    clamped = randomize_local_vector(x[:8], params, SeededSource(4))[:, :, 1]
    np.testing.assert_array_equal(np.abs(clamped), params.bound)


# --------------------------------------------------------------------------- odds and ends
def test_noise_per_radius_and_final_params(big_budgets):
    config = _big_config("local")
    local = final_round_params(config, big_budgets["local"], np.zeros(BIG_D), 1.0)
    assert noise_per_radius(local, BIG_N) == pytest.approx(math.sqrt(BIG_N * BIG_D * 2 * local.mu) / local.levels)
    shuffle = final_round_params(_big_config("shuffle"), big_budgets["shuffle"], np.ones(BIG_D), 2.0)
    assert shuffle.radius == 2.0 and shuffle.center == (1.0,) * BIG_D and shuffle.users == BIG_N
    assert noise_per_radius(shuffle, BIG_N) == pytest.approx(math.sqrt(BIG_D * 2 * shuffle.mu) / shuffle.levels)


def test_summation_rotation_is_independent_of_the_trees_so_a_centre_off_on_one_axis_cannot_wrap():
    # A wrong turn at the root of one coordinate's descent leaves the centre off by nearly the
    # radius along one axis of the tree's rotation U: here every user sits at x0 and
    # U (x0 - centre) = 0.99 C e_3. The summation's modulus holds a coordinate sum only up to the
    # flatness bound n L sqrt(2 ln(2 D / beta) / D) (choose_vector_sum, beta = 5e-10; 0.906 n L
    # at D = 64), which needs vectors independent of the rotation's signs. Under U itself the
    # honest sum on axis 3 is 0.99 n L, past half the modulus (it would wrap); under the summation
    # round's own rotation it is within the bound (w.p. >= 1 - 1e-9 over its signs; fixed seed).
    config = InstanceOptimalConfig(dim=64, users=3000, radius=100.0, epsilon=1.0, delta=1e-6, rotation_seed=7)
    budgets = RoundBudgets(1.0, 1.0, 0.8, 5e-7, 1.0, 1e-6, "test")
    tree_rotation = RandomRotation(64, config.rotation_seed)
    x0 = np.random.default_rng(3).normal(size=64) * 3.0
    radius = 40.0
    axis = np.zeros(64)
    axis[3] = 0.99 * radius
    centre = tree_rotation.inverse(tree_rotation.apply(x0[None])[0] - axis)
    params = final_round_params(config, budgets, centre, radius)
    assert params.rotation_seed == config.sum_rotation_seed != config.rotation_seed
    users, levels, half = config.users, params.levels, (params.modulus - 1) // 2
    flat = users * levels * math.sqrt(2.0 * math.log(2.0 * 64 / 5e-10) / 64)
    data = np.tile(x0, (users, 1))
    sums = encode_vectors(data - centre, params, SeededSource(8)).sum(axis=0)
    assert np.abs(sums).max() <= flat + users < half
    same_rotation = encode_vectors(data - centre, dataclasses.replace(params, rotation_seed=config.rotation_seed), SeededSource(8))
    assert np.abs(same_rotation.sum(axis=0)).max() > half
