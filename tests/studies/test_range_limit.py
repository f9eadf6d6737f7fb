"""The Neyman–Pearson limit of the range check (``shuffledp/studies/range_limit.py``): its likelihoods
are the exact ones, its importance weights add up to the chance they estimate, and it finds nothing
to distrust where the range round cannot miss."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shuffledp.analyzer.decoders import signed_row_histogram
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.hadamard import fwht, hadamard_entry
from shuffledp.simulation import SimulationConfig
from shuffledp.simulation.population import Population
from shuffledp.studies.range_limit import _spread_log_likelihoods, neyman_pearson_limit


def test_the_spread_likelihood_is_the_product_over_reports():
    # Users uniform over bins b, b+1, b+2: a report (j, s) has probability ((1 - p) + (2p - 1) m / 3) / K'
    # with m its agreements with the three columns; the FWHT form must equal the direct product.
    rng = np.random.default_rng(3)
    n, padded, bins, keep = 57, 16, 13, 0.6
    rows, bits = rng.integers(0, padded, n), rng.choice([-1, 1], n)
    signed = fwht(signed_row_histogram(rows, bits, padded))
    unsigned = fwht(np.bincount(rows, minlength=padded).astype(np.float64))
    direct = [sum(math.log((1 - keep) + (2 * keep - 1) * sum(int(bits[i] == hadamard_entry(np.array([rows[i]]), np.array([b + g]))[0])
                                                                for g in range(3)) / 3) for i in range(n))
              for b in range(bins - 2)]
    assert _spread_log_likelihoods(signed, unsigned, n, bins, keep) == pytest.approx(direct, abs=1e-9)


def test_the_null_weights_estimate_the_chance_the_range_holds_no_one():
    # With the null users at one point, mu_0 + mu_1 is the law the runs come from, so the mean mu_0-weight
    # and the fraction of runs whose range misses the users estimate the same probability. B = 200,
    # n = 500, eps0 = 0.5 misses about half the time; over 200 runs each estimate has sd <= sqrt(0.25 / 200)
    # = 0.035, and they are positively correlated: 4 sd of their difference is at most 0.2.
    config = SimulationConfig(Population("gaussian", 1.7, 1.0, 200.0, 50), n=500, epsilon0=0.5)
    limit = neyman_pearson_limit(config, 200)
    missed = 1 - limit.held / limit.runs
    assert 0.2 < missed < 0.8 and abs(limit.null_mass - missed) < 0.2
    assert 0 <= limit.must_warn <= limit.held


def test_nothing_must_be_distrusted_where_the_range_round_cannot_miss():
    # n = 20,000, B = 20, eps0 = 1: the users' bin's count stands ~50 sd above every empty bin's, so the
    # best test trusts every run (and the range holds the users in every one).
    config = SimulationConfig(Population("gaussian", 1.7, 1.0, 20.0, 50), n=20_000, epsilon0=1.0)
    for spread in (1, 3):
        limit = neyman_pearson_limit(config, 20, spread=spread)
        assert limit.held == 20 and limit.must_warn == 0
    with pytest.raises(InvalidParameter):
        neyman_pearson_limit(config, 5, spread=2)
