"""Corrupted users on the vectorized engine: how each protocol degrades under well-formed attacks.

A fraction ``f`` of the users (a seeded random subset, ``round(f n)`` of them) is
replaced by an adversary that knows every user's data and sends **well-formed**
reports: every value lies in :func:`~shuffledp.client.mechanisms.report_ranges` for
the round (checked on every row here), so the analyzer accepts all of them and
nothing is rejected or counted. The honest users' reports are exactly those of
:func:`shuffledp.simulation.engine.run_fast` (the same :func:`~shuffledp.simulation.engine.draw_round`, so
the same :func:`~shuffledp.client.mechanisms.randomize_round` and seeds), the mixed
batch is permuted as the fast engine permutes it, and the protocol's own decoder
runs on it through :func:`~shuffledp.analyzer.protocols.drive`. With ``f = 0`` the
run *is* ``run_fast``'s (``tests/studies/test_robustness.py``).

The attacks, per mechanism (``direction`` +1 pushes up, -1 down):

* ``hadamard-range``: claim the extreme bin ``t`` and deny the honest mode ``a*``: a
  row ``j`` uniform among those with ``H[j, t] = -H[j, a*]``, bit ``H[j, t]``. Each
  such report adds ``c/n`` to ``fhat[t]`` and subtracts ``c/n`` from ``fhat[a*]``
  (``c = coth(eps/2)``), the most one report can move that gap.
* ``projected-mean``: the largest (smallest) valid grid value ``G + B`` (``-B``).
* ``vector-range`` / ``vector-mean``: the same per rotated coordinate, on the
  coordinates the attacker's honest reports would have used (``focus="spread"``) or
  all on rotated coordinate 0 (``focus="one"``: the analyzer cannot see that a user's
  coordinates were not sampled).
* ``modular-sum`` / ``vector-sum``: an honest randomizer run on the worst input in the
  clipping range (``upper``, or ``radius e_1``: input manipulation, which summation
  cannot detect); with ``residue=True`` the first attacker also adds ``q // 2`` to one
  share, which no check can refuse since a share may be any residue mod ``q``
  (summation has no input validation: ``docs/threat-model.md``). ``shifted-vector-sum``:
  the same about the announced centre.
* ``coordinate-tree``: at every level of every rotated coordinate, claim the extreme node
  and deny the honest median's node (``focus="one"``: all on rotated coordinate 0), which
  drags each descent toward an edge of ``[-R, R]``.
* ``shifted-norm``: claim the largest (smallest) norm bin and deny the honest mode: the
  clipping radius is pushed up (more noise) or down (everyone clipped).
* ``local-vector``: the value ``+bound`` (``-bound``) on the coordinates drawn (``focus="one"``:
  all on coordinate 0).

Reference for the robust decoding these attacks are measured against:
``analyzer/robust.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shuffledp.analyzer.protocols import Protocol, RoundPlan, drive
from shuffledp.client.mean_randomizer import report_range
from shuffledp.client.mechanisms import randomize_round, report_ranges
from shuffledp.client.range_randomizer import bin_index
from shuffledp.client.vector_randomizer import rotation_of
from shuffledp.simulation.engine import _check_data, draw_round
from shuffledp.protocol.errors import InvalidParameter, ValueOutOfRange
from shuffledp.protocol.mechanisms.hadamard import hadamard_entry
from shuffledp.protocol.wire.messages import (
    CoordinateTreeParams,
    HadamardRangeParams,
    LocalVectorParams,
    ModularSumParams,
    ProjectedMeanParams,
    ShiftedNormParams,
    ShiftedVectorSumParams,
    VectorMeanParams,
    VectorRangeParams,
    VectorSumParams,
)
from shuffledp.protocol.mechanisms.randomness import SeededSource

FOCUS = ("spread", "one")


@dataclass(frozen=True)
class Adversary:
    """Who is corrupted and what they send (module docstring)."""

    fraction: float
    direction: int = 1
    focus: str = "spread"
    residue: bool = False
    seed: int = 0xBAD

    def __post_init__(self) -> None:
        if not 0 <= self.fraction < 1:
            raise InvalidParameter("fraction", f"must be in [0, 1), got {self.fraction!r}")
        if self.direction not in (1, -1):
            raise InvalidParameter("direction", f"must be +1 or -1, got {self.direction!r}")
        if self.focus not in FOCUS:
            raise InvalidParameter("focus", f"must be one of {FOCUS}, got {self.focus!r}")


@dataclass
class AttackedRun:
    """A protocol's result under attack, the corrupted users (a mask over users) and each round's plan."""

    result: Any
    corrupted: np.ndarray
    plans: list[RoundPlan] = field(default_factory=list)


def corrupted_users(n: int, fraction: float, seed: int) -> np.ndarray:
    """A boolean mask of ``round(fraction n)`` users, a uniformly random subset (seeded)."""
    k = int(round(fraction * n))
    mask = np.zeros(n, dtype=bool)
    if k:
        mask[np.random.default_rng(np.random.SeedSequence([seed, 0xBAD])).choice(n, size=k, replace=False)] = True
    return mask


def _mode_bins(values: np.ndarray, params: HadamardRangeParams) -> np.ndarray:
    """The honest mode bin of each column of ``values`` (``(n,)`` or ``(n, D)``)."""
    bins = bin_index(values, params)
    if bins.ndim == 1:
        return np.array([np.bincount(bins, minlength=params.num_bins).argmax()])
    return np.array([np.bincount(bins[:, l], minlength=params.num_bins).argmax() for l in range(bins.shape[1])])


def claim_and_deny(target: int, honest: np.ndarray, count: int, padded_bins: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``count`` Hadamard-response reports ``(row, bit)`` that each add ``c/n`` to bin ``target`` and take ``c/n``
    from bin ``honest`` (per report; an array): the row is uniform among those with ``H[j, target] != H[j, honest]``
    (flipping the lowest bit of ``target ^ honest`` maps one half of the rows onto the other), the bit ``H[j, target]``.
    Where ``honest == target`` the row is uniform."""
    rows = rng.integers(padded_bins, size=count).astype(np.int64)
    differ = np.bitwise_xor(np.int64(target), np.asarray(honest, dtype=np.int64))
    lowest = np.bitwise_and(differ, -differ)
    same_sign = hadamard_entry(rows, differ) == 1  # H[j, t] H[j, a] = H[j, t ^ a]
    rows = np.where(same_sign, np.bitwise_xor(rows, lowest), rows)
    return rows, hadamard_entry(rows, np.int64(target)).astype(np.int64)


def craft_reports(plan: RoundPlan, honest_data: np.ndarray, honest_reports: np.ndarray, adversary: Adversary,
                  source: SeededSource, rng: np.random.Generator) -> np.ndarray:
    """The corrupted users' reports for one round, shaped like ``honest_reports`` (their would-be honest
    reports, ``(k, messages per user, width)``); ``honest_data`` is the honest users' data (the adversary
    knows it)."""
    params, up = plan.params, adversary.direction > 0
    out = honest_reports.copy()
    k, per_user = out.shape[:2]
    flat = out.reshape(k * per_user, -1)
    if isinstance(params, HadamardRangeParams):
        target = params.num_bins - 1 if up else 0
        rows, bits = claim_and_deny(target, _mode_bins(honest_data, params)[0], k * per_user, params.padded_bins, rng)
        flat[:, 0], flat[:, 1] = rows, bits
    elif isinstance(params, ProjectedMeanParams):
        low, high = report_range(params, plan.epsilon0, plan.delta0)
        flat[:, 0] = high if up else low
    elif isinstance(params, (VectorRangeParams, VectorMeanParams)):
        if adversary.focus == "one":
            flat[:, 0] = 0
        coords = flat[:, 0]
        if isinstance(params, VectorRangeParams):
            scalar = params.scalar
            modes = _mode_bins(rotation_of(params).apply(honest_data), scalar)
            target = scalar.num_bins - 1 if up else 0
            flat[:, 1], flat[:, 2] = claim_and_deny(target, modes[coords], coords.size, scalar.padded_bins, rng)
        else:
            proxy = ProjectedMeanParams(0.0, 1.0, params.noise, params.grid_levels)
            low, high = report_range(proxy, plan.epsilon0, plan.delta0)
            flat[:, 1] = high if up else low
    elif isinstance(params, CoordinateTreeParams):
        # every level of every coordinate: claim the extreme node, deny the honest median's node
        if adversary.focus == "one":
            flat[:, 0] = flat[:, 0] % params.levels  # coordinate 0, the level each report drew
        coords, level = flat[:, 0] // params.levels, flat[:, 0] % params.levels + 1
        scalar = params.scalar
        leaf_modes = _mode_bins(rotation_of(params).apply(honest_data), scalar)
        honest_node = np.right_shift(leaf_modes[coords], params.levels - level)
        nodes = (np.left_shift(1, level) - 1) if up else np.zeros_like(level)
        rows = np.empty(coords.size, dtype=np.int64)
        bits = np.empty(coords.size, dtype=np.int64)
        for t in np.unique(nodes):
            pick = nodes == t
            rows[pick], bits[pick] = claim_and_deny(int(t), honest_node[pick], int(pick.sum()), scalar.padded_bins, rng)
        flat[:, 1], flat[:, 2] = rows, bits
    elif isinstance(params, ShiftedNormParams):
        # the largest norm bin (raise the clipping radius: more noise) or the smallest (clip everyone)
        from shuffledp.client.quantile_randomizer import shifted_log_norms

        scalar = params.scalar
        logs = np.maximum(shifted_log_norms(honest_data, np.asarray(params.center)), params.low)
        honest_mode = int(np.bincount(bin_index(logs, scalar), minlength=scalar.num_bins).argmax())
        target = scalar.num_bins - 1 if up else 0
        flat[:, 0], flat[:, 1] = claim_and_deny(target, np.full(k * per_user, honest_mode), k * per_user, scalar.padded_bins, rng)
    elif isinstance(params, LocalVectorParams):
        if adversary.focus == "one":
            flat[:, 0] = 0
        flat[:, 1] = params.bound if up else -params.bound
    elif isinstance(params, (ModularSumParams, VectorSumParams)):
        if isinstance(params, ModularSumParams):
            worst = np.full(k, params.upper if up else params.lower)
        else:
            worst = np.zeros((k, params.dim))
            worst[:, 0] = params.radius if up else -params.radius
            if isinstance(params, ShiftedVectorSumParams):
                worst += np.asarray(params.center)[None, :]
        out = randomize_round(params, plan.epsilon0, plan.delta0, worst, source)
        if adversary.residue and k:
            out[0, 0, -1] = (out[0, 0, -1] + params.modulus // 2) % params.modulus
        return out
    else:
        raise InvalidParameter("params", f"no attack for mechanism {params.MECHANISM}")
    return out


@dataclass(frozen=True)
class _PlanSpec:
    """What :func:`report_ranges` reads of a round spec."""

    params: Any
    epsilon0: float
    delta0: float

    @property
    def mechanism(self) -> str:
        return self.params.MECHANISM


def check_well_formed(plan: RoundPlan, rows: np.ndarray) -> None:
    """Raise :class:`ValueOutOfRange` unless every value of every row lies in the round's :func:`report_ranges`."""
    ranges = report_ranges(_PlanSpec(plan.params, plan.epsilon0, plan.delta0))
    if rows.shape[1] != len(ranges):
        raise ValueOutOfRange(f"expected {len(ranges)} values per report, got {rows.shape[1]}")
    for index, allowed in enumerate(ranges):
        column = rows[:, index]
        if column.size and (column.min() < allowed.low or column.max() > allowed.high or np.any((column - allowed.low) % allowed.stride)):
            raise ValueOutOfRange(f"value {index} outside [{allowed.low}, {allowed.high}] (stride {allowed.stride})")


def run_attacked(protocol: Protocol, local_data: np.ndarray, adversary: Adversary, seed: int = 0) -> AttackedRun:
    """Run ``protocol`` on the vectorized engine with ``adversary.fraction`` of the users corrupted.

    Honest reports are :func:`~shuffledp.simulation.engine.draw_round`'s (so ``f = 0`` reproduces
    :func:`~shuffledp.simulation.engine.run_fast` exactly), the corrupted users' rows are replaced by
    :func:`craft_reports`, every row is checked well-formed, and the batch is permuted as
    the fast engine permutes it before the protocol's decoder sees it."""
    data = _check_data(protocol, local_data)
    mask = corrupted_users(data.shape[0], adversary.fraction, adversary.seed)
    plans: list[RoundPlan] = []

    def execute(plan: RoundPlan) -> np.ndarray:
        round_index = len(plans)
        plans.append(plan)
        reports = draw_round(plan, data, seed, round_index)
        if mask.any():
            source = SeededSource(np.random.SeedSequence([seed, adversary.seed, round_index]))
            rng = np.random.default_rng(np.random.SeedSequence([seed, adversary.seed, round_index, 1]))
            reports[mask] = craft_reports(plan, data[~mask], reports[mask], adversary, source, rng)
        rows = reports.reshape(-1, reports.shape[-1])
        check_well_formed(plan, rows)
        permutation = np.random.default_rng(np.random.SeedSequence([seed, 0x5F, round_index])).permutation(len(rows))
        return rows[permutation]

    return AttackedRun(drive(protocol, execute), mask, plans)


__all__ = ["FOCUS", "Adversary", "AttackedRun", "check_well_formed", "claim_and_deny", "corrupted_users", "craft_reports", "run_attacked"]
