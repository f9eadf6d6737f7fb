"""The instance-optimal clipped mean in the local and shuffle models, analyzer side
(Huang, Liang & Yi, "Instance-optimal Mean Estimation Under Differential Privacy",
NeurIPS 2021, Section 5).

Three rounds, each user holding one vector (its local mean: user-level privacy):

1. **Centre** (``coordinate-tree``). A public random rotation ``U = H D / sqrt(D)``;
   each user reports, for one rotated coordinate and one level of the dyadic tree
   over ``[-radius, radius]`` (both drawn at random), Hadamard response of its node.
   For every coordinate the analyzer descends the tree from the root, going left
   when the noisy count of the left child holds the remaining rank: PrivQuant's
   binary search over noisy range counts (Sec. 3.2), run on the local counts.
   The medians ``c`` give the centre ``U^{-1} c``.
2. **Clipping threshold** (``shifted-norm``). Each user reports Hadamard response of
   the bin of ``log2 ||x - centre||`` (bins of ``1 / bins_per_octave`` octave, default an
   eighth). Scanning the bins shown to be populated from the top, the threshold ``C`` is the upper edge of
   the first where the count of larger norms exceeds ``k``, the final round's noise in l2
   per unit of ``C`` (for the central Gaussian of Sec. 3.1, ``k = sqrt(2 d / rho)``: the
   paper's ``n - sqrt(2 d / rho)``-th quantile); the detection threshold plays the part
   of the paper's rank error ``tau`` (its ``max{sqrt(2d/rho), tau}``).
3. **Clipped mean**: ``x - centre`` clipped to the ball of radius ``C``, then
   * shuffle: multi-message vector summation (``shifted-vector-sum``: Lemma 5 with
     Skellam noise, central ``(eps, delta)``);
   * local: every user adds ``Skellam(mu)`` noise to its own encoding (``local-vector``),
     the discrete counterpart of the local Gaussian reports of Theorem 7.

Budget (``split``, default 1/10, 1/10, 8/10 of the session's epsilon; the paper gives
the quantile steps rho/4 each): in the shuffle model rounds 1 and 2 get the largest
local ``eps0`` whose amplified central epsilon (``protocol/accounting``) is within
their share at ``delta / 4`` each, and the summation gets ``(8 eps / 10, delta / 2)``;
the session is their basic composition (Dwork & Roth, Thm 3.16), at most
``(eps, delta)``. In the local model the shares are the rounds' local guarantees.

Why most of the budget goes to the last round. On the data of
``benchmarks/bench_mean_models.py`` (d = 64, ``||mu|| = 40``, R = 100) the error against
the users' mean is almost all the final round's noise, ``k C / n`` in l2 (``k``:
:func:`noise_per_radius`): at n = 10^5, RMS noise 0.024 against a clipping bias of 0.0027
(``benchmarks/results/mean_models.json``, ``decomposition``). The first two rounds matter
only through ``C``, and in the shuffle model their amplified ``eps0`` stays large (at
n = 10^5, 2.98 and 4.19 at a tenth each), where Hadamard response is limited by each user
reporting one random coefficient (variance ``c^2 / n``, ``c = (e^eps0 + 1) / (e^eps0 - 1)``
near 1) more than by the budget; the summation's ``k`` is 96 at eight tenths of the budget
against 149 at half. The price is paid where the tree is barely informative: its counts come
from ``n / (D levels)`` users (59 at n = 3 x 10^4, d = 64), and there its descents wander
(centre RMS 56, mean radius 60 at n = 3 x 10^4 in the same benchmark). Moving budget from the norm
round to the tree (3/20, 1/20, 8/10) helps there, but leaves small batches with no detected
norm bin (n = 120 at eps = 4: ``tests/mqtt/test_instance_optimal_mqtt.py``), so both quantile
rounds keep a tenth. In the local model the quantile rounds are uninformative at these n either
way (the centre is the origin) and the local mean round's noise, which dominates, shrinks the
same way. Eighth-octave norm bins put ``C`` at most ``2^(1/8) = 1.09`` times above the bin the
rule picks (a quarter octave: 1.19); at n = 10^5 the radius is 24.6 (RMS clipping bias 0.0027,
a ninth of the noise).

Deviations from the paper, decided here: (i) coordinates and levels are *sampled*
per user rather than composed over, so each (coordinate, level) count comes from
``n / (D levels)`` users at the full round budget (the shuffle model then amplifies
one eps0-LDP report per user; composing ``D levels`` reports would not); (ii) the
norm quantile is read on a log2 grid (``C`` within a factor ``2^(1/bins_per_octave)``),
because shifted norms span unknown scales; (iii) the local mean round uses Skellam
rather than continuous Gaussian noise (exact sampling on devices, the same RDP
analysis as the summation); (iv) the summation round rotates with its own seed
(:attr:`InstanceOptimalConfig.sum_rotation_seed`), not the tree's: the centre's errors sit
on single axes of the tree's rotation, and the summation's modulus assumes vectors drawn
independently of its rotation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np

from shuffledp.analyzer.decoders import HadamardRowCollector, coordinate_rows, hadamard_scale
from shuffledp.analyzer.protocols import Collector, Protocol, RoundPlan, Rounds, collected
from shuffledp.analyzer.summation import VectorSumCollector
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.hadamard import fwht, next_power_of_two
from shuffledp.protocol.wire.messages import (
    CoordinateTreeParams,
    LocalVectorParams,
    ShiftedNormParams,
    ShiftedVectorSumParams,
)
from shuffledp.protocol.mechanisms.rotation import RandomRotation

MODELS = ("shuffle", "local")
#: Largest ``groups x leaves`` table the tree decoder builds (one FWHT per group).
MAX_TREE_TABLE = 1 << 26


@dataclass(frozen=True)
class InstanceOptimalConfig:
    """Public parameters of the three-round protocol.

    ``radius``: every user's vector lies in the l2 ball of this radius about the origin
    (a public a-priori bound, the paper's ``R``; the data may sit anywhere inside it).
    ``leaves``: leaves of each coordinate's tree over ``[-radius, radius]`` (a power of
    two; the centre's resolution is ``2 radius / leaves``).
    """

    dim: int
    users: int
    radius: float
    epsilon: float
    delta: float
    model: str = "shuffle"
    leaves: int = 256
    octaves: int = 40
    bins_per_octave: int = 8
    split: tuple[float, float, float] = (0.1, 0.1, 0.8)
    rotation_seed: int = 0
    #: ``None``: the instance-optimal threshold rule. A number ``q`` in (0, 1): clip at the
    #: ``q``-quantile of the shifted norms instead (the fixed-quantile baseline; Andrew et
    #: al. 2019 use the median), read off the same noisy histogram.
    fixed_quantile: float | None = None

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise InvalidParameter("model", f"must be one of {MODELS}, got {self.model!r}")
        if not (isinstance(self.dim, int) and self.dim >= 1):
            raise InvalidParameter("dim", f"must be an integer >= 1, got {self.dim!r}")
        if not (isinstance(self.users, int) and self.users >= 3):
            raise InvalidParameter("users", f"must be an integer >= 3, got {self.users!r}")
        if not (math.isfinite(self.radius) and self.radius > 0):
            raise InvalidParameter("radius", f"must be finite and > 0, got {self.radius!r}")
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise InvalidParameter("epsilon", f"must be finite and > 0, got {self.epsilon!r}")
        if not 0 < self.delta < 1:
            raise InvalidParameter("delta", f"must be in (0, 1), got {self.delta!r}")
        if not (isinstance(self.leaves, int) and self.leaves >= 2 and self.leaves == next_power_of_two(self.leaves)):
            raise InvalidParameter("leaves", f"must be a power of two >= 2, got {self.leaves!r}")
        if not (isinstance(self.octaves, int) and 1 <= self.octaves <= 200):
            raise InvalidParameter("octaves", f"must be an integer in [1, 200], got {self.octaves!r}")
        if not (isinstance(self.bins_per_octave, int) and 1 <= self.bins_per_octave <= 64):
            raise InvalidParameter("bins_per_octave", f"must be an integer in [1, 64], got {self.bins_per_octave!r}")
        if len(self.split) != 3 or any(not (s > 0) for s in self.split) or sum(self.split) > 1 + 1e-12:
            raise InvalidParameter("split", f"must be three positive shares summing to at most 1, got {self.split!r}")
        if self.fixed_quantile is not None and not 0 < self.fixed_quantile < 1:
            raise InvalidParameter("fixed_quantile", f"must be in (0, 1) or None, got {self.fixed_quantile!r}")
        if next_power_of_two(self.dim) * math.log2(self.leaves) * self.leaves > MAX_TREE_TABLE:
            raise InvalidParameter("leaves", f"{self.leaves} leaves x {next_power_of_two(self.dim)} coordinates is too large a table")

    @property
    def padded_dim(self) -> int:
        return next_power_of_two(self.dim)

    @property
    def sum_rotation_seed(self) -> int:
        """Rotation seed of the shuffle model's summation round: ``rotation_seed + 1`` (mod 2^64),
        not the tree's. The summation's modulus holds each rotated coordinate's sum only under
        *rotation flatness* (``choose_vector_sum``: Hoeffding over the public random signs, for
        vectors drawn independently of them). The centre is the tree's medians rotated back, so
        under the tree's own rotation ``U (x - centre) = U x - medians`` and the medians' errors
        sit on single rotated coordinates: one wrong turn near the root of one coordinate's
        descent puts nearly ``n C`` on it, past the modulus (measured with a centre 84 from the
        mean at n = 3 x 10^4: every coordinate of the estimate off by 20.6). Under a rotation
        drawn independently of the tree the shifted, clipped vectors are independent of the
        signs, as the bound needs. Accuracy only: the round's privacy holds for any rotation."""
        return (self.rotation_seed + 1) % (1 << 64)

    def tree_params(self) -> CoordinateTreeParams:
        tau = self.radius / self.leaves
        return CoordinateTreeParams(-self.radius, self.radius, tau, self.dim, self.rotation_seed)

    def norm_params(self, center: np.ndarray) -> ShiftedNormParams:
        """Bins of ``log2 ||x - centre||`` ending just above the largest possible distance,
        ``radius + ||centre||``, and reaching ``octaves`` octaves below it."""
        top = math.log2(self.radius + float(np.linalg.norm(center)))
        high = math.ceil(top * self.bins_per_octave) / self.bins_per_octave + 1.0 / self.bins_per_octave
        return ShiftedNormParams(tuple(float(v) for v in center), high - self.octaves, high, 0.5 / self.bins_per_octave)


# --------------------------------------------------------------------------- round 1
def tree_fractions(reports: np.ndarray, params: CoordinateTreeParams, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """``(fractions, counts)``: ``fractions[g, v]`` estimates the fraction of group ``g``'s users
    whose node (at ``g``'s level) is ``v``, unbiased; ``counts[g]`` is the group's size."""
    collector = TreeCollector(params)
    collector.add_rows(np.asarray(reports, dtype=np.int64).reshape(-1, 3))
    return collector.fractions(epsilon)


class TreeCollector(Collector):
    """Round 1's sufficient statistics: per (coordinate, level) group, its number of reports and the
    signed histogram of its Hadamard rows (int64, exact), from report rows ``(group, row, bit)``.

    :meth:`fractions` is :func:`tree_fractions` of the same reports to the last bit: that decoder
    builds the same table (as integer-valued float64) before its FWHT per group."""

    statistics = ("counts", "table")

    def __init__(self, params: CoordinateTreeParams) -> None:
        self.params = params
        self.rows_per_group = params.scalar.padded_bins
        self.counts = np.zeros(params.groups, dtype=np.int64)
        self.table = np.zeros((params.groups, self.rows_per_group), dtype=np.int64)

    def add_rows(self, rows: np.ndarray) -> None:
        """Fold in ``coordinate-tree`` report rows ``(group, row, bit)``."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1, 3)
        groups, k = self.params.groups, self.rows_per_group
        if rows.size and (rows[:, 0].min() < 0 or rows[:, 0].max() >= groups or rows[:, 1].min() < 0 or rows[:, 1].max() >= k):
            raise InvalidParameter("rows", f"groups must lie in [0, {groups}) and rows in [0, {k})")
        self.counts += np.bincount(rows[:, 0], minlength=groups)
        signed = np.bincount(rows[:, 0] * k + rows[:, 1], weights=rows[:, 2].astype(np.float64), minlength=groups * k)
        self.table += signed.astype(np.int64).reshape(groups, k)

    def __len__(self) -> int:
        return int(self.counts.sum())

    def fractions(self, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
        """``(fractions, counts)``, as :func:`tree_fractions` gives them."""
        scale = hadamard_scale(epsilon) / np.maximum(self.counts, 1)
        return fwht(self.table.astype(np.float64)) * scale[:, None], self.counts


class LocalVectorCollector(Collector):
    """The local model's last round's sufficient statistics: per rotated coordinate, its number of
    reports and the sum of their values (int64, exact), from report rows ``(coordinate, value)``.
    :meth:`decode` is :func:`local_mean_decode` of the same reports to the last bit (its float sums
    are exact too: integers far below 2^53)."""

    statistics = ("per_coordinate", "sums")

    def __init__(self, params: LocalVectorParams) -> None:
        self.params = params
        self.per_coordinate = np.zeros(params.padded_dim, dtype=np.int64)
        self.sums = np.zeros(params.padded_dim, dtype=np.int64)

    def add_rows(self, rows: np.ndarray) -> None:
        """Fold in ``local-vector`` report rows ``(coordinate, value)``."""
        dim = self.params.padded_dim
        rows, counts = coordinate_rows(rows, dim)
        self.per_coordinate += counts
        self.sums += np.bincount(rows[:, 0], weights=rows[:, 1].astype(np.float64), minlength=dim).astype(np.int64)

    def __len__(self) -> int:
        return int(self.per_coordinate.sum())

    def decode(self) -> tuple[np.ndarray, int]:
        """``(estimate, users)``, as :func:`local_mean_decode` gives them."""
        return _local_totals_decode(self.per_coordinate, self.sums.astype(np.float64), self.params)


def tree_medians(
    fractions: np.ndarray, counts: np.ndarray, params: CoordinateTreeParams, epsilon: float, rank: float = 0.5, informative: float = 0.25
) -> np.ndarray:
    """Per rotated coordinate, the leaf midpoint reached by descending the tree toward ``rank``.

    At each level the left child's estimated fraction (from that level's own users) is
    compared with the rank still to find: PrivQuant's binary search, with the range count
    ``[node start, mid]`` read off the tree. A wrong turn is cheap exactly where it is
    likely (the split lies near the median in rank, so the descent then hugs the split).
    What is not cheap is a level whose count is pure noise: a descent through such levels
    wanders to an arbitrary leaf. So the descent stops at the first level whose count's
    standard deviation ``c / sqrt(n_group)`` reaches ``informative`` (of the rank scale 1)
    and returns the current node's point nearest the origin, the centre of the public
    ball the data lie in; with no informative level at all, the origin itself (the plain
    clipped mean about 0). Post-processing of the reports: no privacy cost.
    (Measured on the benchmark's data: stopping on *ambiguous* comparisons instead, at
    1-3 standard deviations, doubled to quadrupled the centre's error at n >= 30,000.)"""
    levels, d = params.levels, params.padded_dim
    c = hadamard_scale(epsilon)
    leaves = params.scalar.padded_bins
    node = np.zeros(d, dtype=np.int64)
    remaining = np.full(d, float(rank))
    active = np.ones(d, dtype=bool)
    value = np.zeros(d)
    coords = np.arange(d)
    for level in range(1, levels + 1):
        group = coords * levels + level - 1
        sd = np.where(counts[group] > 0, c / np.sqrt(np.maximum(counts[group], 1)), np.inf)
        stopping = active & (sd >= informative)
        half = 2.0 * params.tau * (leaves >> level)  # width of a child
        start = params.low + 2.0 * half * node
        value = np.where(stopping, np.clip(0.0, start, start + 2.0 * half), value)
        active &= ~stopping
        left = 2 * node
        left_mass = fractions[group, left]
        go_right = active & (remaining > left_mass)
        remaining = np.where(go_right, remaining - left_mass, remaining)
        node = np.where(active, np.where(go_right, left + 1, left), node)
    value = np.where(active, params.low + params.tau * (2 * node + 1), value)
    return np.clip(value, params.low, params.high)


# --------------------------------------------------------------------------- round 2
@dataclass(frozen=True)
class Threshold:
    """The clipping threshold and what it was read from (counts in users)."""

    radius: float
    target_count: float
    tail_estimate: float
    detection_count: float
    bin_edge_log2: float


#: Probability that some empty norm bin is taken for a populated one (Hoeffding + union bound).
THRESHOLD_ALPHA = 0.01


def pick_threshold(
    frequencies: np.ndarray,
    params: ShiftedNormParams,
    users: int,
    epsilon: float,
    noise_per_radius: float,
    fixed_quantile: float | None = None,
    alpha: float = THRESHOLD_ALPHA,
) -> Threshold:
    """The clipping radius from the noisy histogram of ``log2 ||x - centre||``.

    Only bins whose estimate reaches the detection threshold ``t = c sqrt(2 ln(K / alpha) / n)``
    count (``analyzer/range_check.py``: Hoeffding and a union bound, so with probability at
    least ``1 - alpha`` no empty bin does). Scanning from the top, the counts of those bins
    are added up; at the first bin where the sum exceeds the target, the threshold is that
    bin's *upper* edge (``2^edge``). The target is ``noise_per_radius``, the ``k`` of the
    module docstring (clip about as many users as one radius of noise costs), or
    ``(1 - fixed_quantile)`` times the detected bins' total for a fixed quantile (the quantile
    of the users in detected bins, so the scan always crosses it; with norms spread over many
    sparsely populated bins an extreme quantile is pulled toward the bulk).

    Why not sum every bin: Hadamard response estimates a set of ``s`` bins with variance
    ``c^2 s / n``, so a tail sum over the many empty bins above the data is a random walk
    that crosses any fixed multiple of its own deviation somewhere with high probability,
    and the radius then lands far above every user. Ignoring bins not shown to be
    populated errs the other way only by the users in them (each under ``t n``), and with
    probability ``1 - alpha`` the radius is the upper edge of a populated bin.
    """
    from shuffledp.analyzer.range_check import detection_threshold

    bins = params.scalar.num_bins
    detection = detection_threshold(epsilon, bins, users, alpha) * users
    counts = users * np.asarray(frequencies[:bins], dtype=np.float64)
    detected_total = float(counts[counts >= detection].sum())
    target = (1.0 - fixed_quantile) * detected_total if fixed_quantile is not None else noise_per_radius
    above = 0.0
    for index in range(bins - 1, -1, -1):
        if counts[index] >= detection:
            above += counts[index]
            if above > target:
                break
    else:
        index = int(np.argmax(counts))  # nothing detected: the most populated bin's upper edge
    edge = params.low + 2.0 * params.tau * (index + 1)
    return Threshold(2.0**edge, target, above, detection, edge)


# --------------------------------------------------------------------------- round 3
def local_mean_decode(reports: np.ndarray, params: LocalVectorParams) -> tuple[np.ndarray, int]:
    """Mean of the local reports, unscaled, rotated back and shifted: ``(estimate, users)``.

    Each rotated coordinate is the mean of *its own* reports, and ``users`` is the fewest any
    coordinate holds. Every report is a whole local report of one coordinate, so a batch need
    not hold exactly one report per user on every coordinate: refusing such a batch let one
    client (D in-range reports on one coordinate, or a single report, with the round filling
    at ``min_batch`` and a last user cut off) fail the whole session after every honest
    device was charged. k such reports move a coordinate's mean by at most k reports' share
    (each within ``[-bound, bound]``). Only a coordinate with no report at all is refused."""
    rows = np.asarray(reports, dtype=np.int64).reshape(-1, 2)
    per_coordinate = np.bincount(rows[:, 0], minlength=params.padded_dim)
    sums = np.bincount(rows[:, 0], weights=rows[:, 1].astype(np.float64), minlength=params.padded_dim)
    return _local_totals_decode(per_coordinate, sums, params)


def _local_totals_decode(per_coordinate: np.ndarray, sums: np.ndarray, params: LocalVectorParams) -> tuple[np.ndarray, int]:
    """:func:`local_mean_decode` from its statistics: the reports per coordinate and their sums."""
    users = int(per_coordinate.min())
    if users == 0:
        raise InvalidParameter("reports", f"coordinates hold {per_coordinate.min()}..{per_coordinate.max()} reports: some hold none")
    rotated_mean = sums / per_coordinate * (params.radius / params.levels)
    estimate = RandomRotation(params.dim, params.rotation_seed).inverse(rotated_mean)
    return estimate + np.asarray(params.center), users


def noise_per_radius(params: ShiftedVectorSumParams | LocalVectorParams, users: int) -> float:
    """l2 standard deviation of the final round's noise on the *sum* of the clipped vectors, per
    unit of clipping radius: ``sqrt(dim * 2 mu) / levels`` (summation: one Skellam(mu) per
    coordinate in all; local: one per user, so ``users`` times the variance). This is the
    ``k`` of the threshold rule: clipping one more user costs ~1 radius of bias, raising the
    radius by 1 costs ``k`` of noise."""
    copies = users if isinstance(params, LocalVectorParams) else 1
    return math.sqrt(copies * params.dim * 2.0 * params.mu) / params.levels


@dataclass(frozen=True)
class InstanceOptimalOutcome:
    """The protocol's result, with every intermediate the analyzer computed."""

    estimate: np.ndarray
    center: np.ndarray
    threshold: Threshold
    rotated_medians: np.ndarray
    final_params: ShiftedVectorSumParams | LocalVectorParams
    round_epsilons: tuple[float, float, float]
    users: int
    tree_counts: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))

    def as_dict(self) -> dict[str, Any]:
        return {
            "estimate": self.estimate.tolist(),
            "center": self.center.tolist(),
            "clip_radius": self.threshold.radius,
            "threshold_target_count": self.threshold.target_count,
            "threshold_tail_estimate": self.threshold.tail_estimate,
            "round_epsilons": list(self.round_epsilons),
            "users": self.users,
            "smallest_tree_group": int(self.tree_counts.min()) if self.tree_counts.size else None,
        }


@dataclass(frozen=True)
class RoundBudgets:
    """Each round's ``(epsilon0, delta0)`` as the clients are charged, and the session it composes to."""

    tree_epsilon0: float
    norm_epsilon0: float
    mean_epsilon0: float
    mean_delta0: float
    session_epsilon: float
    session_delta: float
    method: str
    per_round: tuple[dict[str, Any], ...] = ()


class InstanceOptimalProtocol(Protocol):
    """Huang, Liang & Yi's shifted clipped mean as three rounds (see the module docstring)."""

    name = "instance-optimal"
    data_rank = 2

    def __init__(self, config: InstanceOptimalConfig, budgets: RoundBudgets | None = None) -> None:
        from shuffledp.analyzer.instance_optimal_budget import round_budgets

        self.config = config
        self.budgets = budgets if budgets is not None else round_budgets(config)

    @property
    def budget(self) -> tuple[float, float]:
        """What each client's ledger is charged over the session: the basic composition of the
        rounds' ``(epsilon0, delta0)`` as their specs state them (local for rounds 1-2 and the
        local mean round, central for the summation round). The session's central guarantee is
        :attr:`RoundBudgets.session_epsilon`."""
        b = self.budgets
        return b.tree_epsilon0 + b.norm_epsilon0 + b.mean_epsilon0, b.mean_delta0

    def final_params(self, center: np.ndarray, radius: float) -> ShiftedVectorSumParams | LocalVectorParams:
        from shuffledp.analyzer.instance_optimal_budget import final_round_params

        return final_round_params(self.config, self.budgets, center, radius)

    def rounds(self) -> Rounds:
        c, b = self.config, self.budgets
        tree = c.tree_params()
        tree_plan = RoundPlan(tree, b.tree_epsilon0, collect=partial(TreeCollector, tree))
        fractions, counts = collected(tree_plan, (yield tree_plan)).fractions(b.tree_epsilon0)
        medians = tree_medians(fractions, counts, tree, b.tree_epsilon0)
        center = RandomRotation(c.dim, c.rotation_seed).inverse(medians)
        norm = c.norm_params(center)
        norm_plan = RoundPlan(norm, b.norm_epsilon0, collect=partial(HadamardRowCollector, norm.scalar.padded_bins, b.norm_epsilon0))
        second = collected(norm_plan, (yield norm_plan))
        probe = self.final_params(center, 1.0)
        threshold = pick_threshold(second.frequencies(), norm, len(second), b.norm_epsilon0, noise_per_radius(probe, c.users), c.fixed_quantile)
        final = replace(probe, radius=threshold.radius)
        if isinstance(final, ShiftedVectorSumParams):
            final_plan = RoundPlan(final, b.mean_epsilon0, b.mean_delta0, collect=partial(VectorSumCollector, final))
            decoded = collected(final_plan, (yield final_plan)).estimate()
            estimate, users = np.asarray(decoded.mean) + center, decoded.users
        else:
            final_plan = RoundPlan(final, b.mean_epsilon0, b.mean_delta0, collect=partial(LocalVectorCollector, final))
            estimate, users = collected(final_plan, (yield final_plan)).decode()
        return InstanceOptimalOutcome(
            estimate, center, threshold, medians, final, (b.tree_epsilon0, b.norm_epsilon0, b.mean_epsilon0), users, counts
        )
