"""A numerical bound that falls below the exact RR floor is dropped, not trusted (and not a crash)."""

from __future__ import annotations

import pytest

from shuffledp.protocol.accounting import laplace_mean_guarantee, shuffled_round


@pytest.mark.parametrize("epsilon0", [28.5, 29.0, 30.0])
def test_a_bound_below_the_exact_floor_is_dropped(epsilon0):
    """Found by the summation benchmark: FMT21's numerical pair at eps0 >= 28.5 came out below the RR
    floor (a numerical error, e^-eps0 is below its precision), and shuffled_round raised RuntimeError."""
    bound = shuffled_round(laplace_mean_guarantee(epsilon0), 1000, 1e-6)
    assert bound.lower_bound is not None and bound.epsilon >= bound.lower_bound
    assert bound.epsilon <= epsilon0
    for name, value in bound.candidates.items():
        if value is not None and "dropped" not in name:
            assert value >= bound.lower_bound * (1 - 1e-6) - 1e-9
