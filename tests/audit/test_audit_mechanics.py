"""The mechanics audit against a running in-process shuffler: a correct shuffler passes every
check; each planted shuffler or wire fault fails the check named for it; the statistical checks
have the false-alarm rate their derivation claims."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shuffledp.audit.faults import planted_fault
from shuffledp.audit.mechanics import (
    CHECKS,
    POSITION_BINS,
    RoundView,
    audit_mechanics,
    check_quota_and_replay,
    chi_square_positions,
    rank_correlation_z,
)
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.shuffler.permutation import secure_permutation
from parties import make_spec

QUICK = {"batches": 12, "batch_size": 32}


@pytest.fixture(scope="module")
def honest_audit():
    return audit_mechanics(**QUICK, seed=1)


def test_a_correct_shuffler_passes_every_check(honest_audit):
    assert [c.name for c in honest_audit.checks] == list(CHECKS)
    assert {c.name: c.status for c in honest_audit.checks} == {name: "passed" for name in CHECKS}
    assert honest_audit.batches == QUICK["batches"]
    assert honest_audit.passed


@pytest.mark.parametrize(
    ("fault", "check"),
    [
        ("shuffler-arrival-order", "arrival-order-kept"),
        ("small-batch-release", "min-batch"),
        ("padding-off", "constant-lengths"),
        ("analyzer-gets-credentials", "analyzer-view"),
    ],
)
def test_each_planted_fault_fails_its_check(fault, check):
    with planted_fault(fault):
        audit = audit_mechanics(**QUICK, seed=2)
    assert not audit.passed
    assert check in audit.failed, (fault, audit.failed)
    detail = next(c.detail for c in audit.checks if c.name == check)
    assert detail  # names what it saw
    if fault == "analyzer-gets-credentials":
        assert "client id" in detail


def test_bad_sizes_are_typed_errors():
    with pytest.raises(InvalidParameter):
        audit_mechanics(batches=1, batch_size=32)
    with pytest.raises(InvalidParameter):
        audit_mechanics(batches=4, batch_size=30)  # not a multiple of the bins


def _permutation_view(batch_size: int, rng: np.random.Generator, *, keep_order: bool = False) -> RoundView:
    """A synthetic round: distinct sealed reports sent in arrival order, forwarded by secure_permutation."""
    spec = make_spec()
    from shuffledp.protocol.wire.report_format import report_format

    size = report_format(spec.round_id, spec.mechanism).sealed_size
    sealed = [rng.bytes(size) for _ in range(batch_size)]
    clients = [int(c) for c in rng.permutation(batch_size)]
    order = np.arange(batch_size) if keep_order else secure_permutation(batch_size)
    view = RoundView(spec, [b""] * batch_size, sealed, clients, [])
    view.batch = [sealed[i] for i in order]
    return view


def test_chi_square_false_alarms_match_the_nominal_rate():
    # 400 pooled tables of 10 uniform batches of 32 under H0: the scaled statistic's p-values are
    # uniform, so the count below 0.1 is Binomial(400, 0.1): mean 40, sd 6. Without the (B-1)/B
    # scaling the mean statistic is 49 * 32/31 = 50.6 and the rate at 0.1 rises to about 0.12.
    batch, replicates = 32, 400
    below, statistics = 0, []
    for _ in range(replicates):
        table = np.zeros((POSITION_BINS, POSITION_BINS), dtype=np.int64)
        for _ in range(10):
            order = secure_permutation(batch)
            np.add.at(table, (np.arange(batch) * POSITION_BINS // batch, order * POSITION_BINS // batch), 1)
        statistic, p = chi_square_positions(table, batch)
        statistics.append(statistic)
        below += p < 0.1
    assert abs(below - 40) <= 4 * 6
    # the scaled statistic has mean (G-1)^2 = 49; its sd over 400 replicates is sqrt(2*49/400) = 0.49
    assert abs(np.mean(statistics) - 49) <= 4 * math.sqrt(2 * 49 / replicates)


def test_rank_correlation_is_standard_normal_under_a_uniform_shuffle_and_large_when_order_is_kept():
    rng = np.random.default_rng(8)
    zs = [rank_correlation_z([_permutation_view(16, rng) for _ in range(10)])[0] for _ in range(300)]
    # mean 0 (sd 1/sqrt(300) = 0.058) and variance 1 (sd of the sample variance about sqrt(2/300) = 0.082)
    assert abs(np.mean(zs)) <= 4 / math.sqrt(300)
    assert abs(np.var(zs) - 1.0) <= 4 * math.sqrt(2 / 300)
    kept = [_permutation_view(16, rng, keep_order=(i == 0)) for i in range(10)]
    # one of ten batches in order adds sqrt(15) / sqrt(10) = 1.22 to z on average
    z_kept = np.mean([rank_correlation_z([_permutation_view(16, rng, keep_order=(i == 0)) for i in range(10)])[0] for _ in range(200)])
    assert z_kept > 1.22 - 4 / math.sqrt(200)
    assert rank_correlation_z(kept)[1] == 10


def test_quota_check_fails_when_a_hostile_report_is_forwarded():
    rng = np.random.default_rng(9)
    view = _permutation_view(16, rng)
    hostile = rng.bytes(len(view.sealed[0]))
    view.sealed.append(hostile)
    view.clients.append(-1)
    assert check_quota_and_replay(view, {"second report": hostile}).passed
    view.batch = view.batch[:-1] + [hostile]  # admitted in place of an honest one
    result = check_quota_and_replay(view, {"second report": hostile})
    assert not result.passed and "second report" in result.detail
    view.batch = view.batch[:-1] + [view.batch[0]]  # the same report twice
    assert "duplicate" in check_quota_and_replay(view, {}).detail
