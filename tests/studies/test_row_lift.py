"""The row lift (``shuffledp/studies/row_lift.py``) is sound, and the check of it can fail.

Soundness: against the exhaustive exact search of every dataset (``shuffledp/studies/worst_dataset.py``)
for one-bit Hadamard response, the lift is never below the certified upper end of the exact
epsilon. Power: a broken lift that forgets the rows (all ``n`` users in user 1's row) falls below
the exact epsilon at cells of the same grid. Consistency: the tail form, used at large ``n``, is
never below the exact form, and the lift is never below the certified lower bound ``shuffledp account``
prints for the round.
"""

from __future__ import annotations

import pytest

from shuffledp.protocol.accounting.rr_any_n import certified_delta
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.studies.row_lift import lift_delta, lift_epsilon, lift_epsilon_exact
from shuffledp.studies.worst_dataset import hadamard_law, search

DELTAS = (0.1, 0.03, 1e-2, 1e-3, 1e-6)


def _broken_epsilon(delta: float, n: int, epsilon0: float) -> float:
    """The lift as if every user shared user 1's row: (1/2) delta_RR(eps; n), inverted by bisection."""
    lo, hi = 0.0, epsilon0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if 0.5 * certified_delta(mid, n, epsilon0) <= delta:
            hi = mid
        else:
            lo = mid
    return hi


@pytest.mark.parametrize(("K", "n", "epsilon0"), [(4, 4, 1.0), (4, 6, 0.5), (4, 6, 4.0), (4, 8, 1.0), (8, 5, 1.0),
                                                  (8, 6, 2.0)])
def test_the_lift_is_never_below_the_exact_epsilon_and_the_broken_one_is(K, n, epsilon0):
    result = search(hadamard_law(epsilon0, K), n, DELTAS)
    broken_below = 0
    for i, delta in enumerate(DELTAS):
        exact_lower, exact_upper = result.exact_epsilon(i)
        assert lift_epsilon_exact(delta, K, n, epsilon0) >= exact_upper - 1e-9, (K, n, epsilon0, delta)
        broken_below += _broken_epsilon(delta, n, epsilon0) < exact_lower - 1e-9
    # the broken variant is caught at these cells (from the exhaustive grid, where it fails 16 of 525 cells)
    if (K, n, epsilon0) in {(4, 4, 1.0), (4, 6, 0.5), (4, 8, 1.0), (8, 5, 1.0)}:
        assert broken_below >= 1


@pytest.mark.parametrize(("K", "n", "epsilon0", "delta"), [(4, 40, 1.0, 1e-3), (4, 60, 4.0, 1e-2), (8, 48, 2.0, 1e-2)])
def test_the_tail_form_is_above_the_exact_form(K, n, epsilon0, delta):
    tail, m0 = lift_epsilon(delta, K, n, epsilon0)
    exact = lift_epsilon_exact(delta, K, n, epsilon0, tol=1e-6)
    assert tail >= exact * (1 - 1e-6) and 1 <= m0 <= n
    assert lift_delta(tail, K, n, epsilon0) <= delta * (1 + 1e-9)


def test_the_lift_is_never_below_the_projects_certified_lower_bound():
    """The certified lower bound ``shuffledp account`` prints for the round (one i.i.d. dataset of the
    other users, ``iid_dataset``) is below every sound upper bound, the lift included."""
    from shuffledp.protocol.accounting import hadamard_response_guarantee, shuffled_round
    from shuffledp.protocol.accounting.iid_dataset import best_lower_epsilon, lower_bound_candidates

    for K, n, epsilon0 in ((4, 2000, 1.0), (16, 5000, 2.0), (4, 20_000, 4.0)):
        views = lower_bound_candidates("hadamard-response", epsilon0, num_bins=K)
        lower, _ = best_lower_epsilon(views, n, 1e-6, epsilon0)
        lift, _ = lift_epsilon(1e-6, K, n, epsilon0)
        bound = shuffled_round(hadamard_response_guarantee(epsilon0, K), n, 1e-6)
        assert 0 < lower <= bound.epsilon <= lift  # and the lift does not beat the accountant's blanket here


def test_bad_parameters_are_refused():
    for K, n, e0 in ((3, 10, 1.0), (4, 0, 1.0), (4, 10, float("nan"))):
        with pytest.raises(InvalidParameter):
            lift_delta(0.1, K, n, e0)
    with pytest.raises(InvalidParameter):
        lift_epsilon(0.0, 4, 10, 1.0)
