"""Tests for shuffledp.protocol.mechanisms.hadamard against scipy's dense Sylvester matrix."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import hadamard

from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.hadamard import (
    fwht,
    hadamard_entry,
    is_power_of_two,
    next_power_of_two,
)

POWERS = [1 << e for e in range(11)]  # 1, 2, ..., 1024


@pytest.mark.parametrize("k", POWERS)
def test_fwht_matches_dense_floats_batched(k):
    rng = np.random.default_rng(1000 + k)
    h = hadamard(k).astype(np.float64)
    x = rng.standard_normal((3, 2, k))
    got = fwht(x)
    assert got.shape == x.shape
    assert got.dtype == np.float64
    # Each output is a signed sum of k terms of size O(1); rounding is at most ~k ulps.
    np.testing.assert_allclose(got, x @ h, rtol=0, atol=1e-12 * k)


@pytest.mark.parametrize("k", POWERS)
def test_fwht_matches_dense_ints_exactly(k):
    rng = np.random.default_rng(2000 + k)
    h = hadamard(k).astype(np.int64)
    x = rng.integers(-1000, 1000, size=(4, k))
    got = fwht(x)
    assert got.dtype.kind == "i"
    np.testing.assert_array_equal(got, x @ h)
    # a single 1-d vector, and int8 input (must not overflow: promoted to int64)
    np.testing.assert_array_equal(fwht(x[0]), x[0] @ h)
    small = rng.integers(-100, 100, size=k).astype(np.int8)
    np.testing.assert_array_equal(fwht(small), small.astype(np.int64) @ h)


@pytest.mark.parametrize("k", POWERS)
def test_fwht_is_its_own_inverse_up_to_k(k):
    rng = np.random.default_rng(3000 + k)
    x = rng.integers(-50, 50, size=(2, k))
    np.testing.assert_array_equal(fwht(fwht(x)), k * x)
    xf = rng.standard_normal(k)
    np.testing.assert_allclose(fwht(fwht(xf)), k * xf, rtol=0, atol=1e-11 * k)


def test_fwht_does_not_modify_input():
    x = np.arange(8, dtype=np.float64)
    before = x.copy()
    fwht(x)
    np.testing.assert_array_equal(x, before)


@pytest.mark.parametrize("k", POWERS)
def test_hadamard_entry_matches_dense(k):
    idx = np.arange(k)
    got = hadamard_entry(idx[:, None], idx[None, :])
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, hadamard(k))


def test_hadamard_entry_scalar_and_negative():
    assert int(hadamard_entry(3, 5)) == -1  # popcount(3 & 5) = popcount(1) = 1
    assert int(hadamard_entry(3, 3)) == 1  # popcount(3) = 2
    with pytest.raises(InvalidParameter):
        hadamard_entry(-1, 2)


@pytest.mark.parametrize("k", [0, 3, 5, 6, 7, 12, 100, 1023, 1025])
def test_non_power_of_two_raises(k):
    with pytest.raises(InvalidParameter):
        fwht(np.zeros((2, k)))
    with pytest.raises(InvalidParameter):
        fwht(np.zeros(k, dtype=np.int64))


def test_power_of_two_helpers():
    assert [is_power_of_two(k) for k in range(0, 9)] == [False, True, True, False, True, False, False, False, True]
    assert [next_power_of_two(k) for k in (1, 2, 3, 5, 16, 17, 1000)] == [1, 2, 4, 8, 16, 32, 1024]
    with pytest.raises(InvalidParameter):
        next_power_of_two(0)


@pytest.mark.parametrize("k", [4, 16, 1024])
def test_fwht_over_many_blocks_matches_dense_exactly(k):
    """Sizes 4..1024 go through in blocks of 2^16 elements: a batch of several blocks and a
    ragged last one gives x @ H for every row (integers: exact)."""
    rows = 3 * (1 << 16) // k + 7
    rng = np.random.default_rng(3000 + k)
    x = rng.integers(-1000, 1000, size=(rows, k))
    np.testing.assert_array_equal(fwht(x), x @ hadamard(k).astype(np.int64))
    floats = x.astype(np.float64)
    np.testing.assert_array_equal(fwht(floats), floats @ hadamard(k).astype(np.float64))  # small integers: exact in float64
