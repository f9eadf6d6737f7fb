"""The device's scalar randomizers (``randomize_one`` and the ``*_one`` twins in
client/range_randomizer.py and client/mean_randomizer.py) against the vectorized
randomizer with a batch of one (``randomize_round(...)[0]``).

The scalar path must be the same mechanism, not merely the same distribution: for any
source it must make the same calls with the same arguments in the same order, and turn
the same draws into the same messages. Checked three ways, over hypothesis-drawn local
means (far outside the range, exact bin and grid edges, +-0.0, huge and subnormal values)
and parameters (ranges of 1 to 2^12 bins, grids of 1 to 2^12 levels, Laplace and Gaussian
noise, several budgets):

* two identical :class:`SeededSource` streams give the same messages and are left in the
  same state (the generator's state, and one more draw);
* a spy source records every call with its arguments as exact values (a float by its
  hex, -0.0 included; a Fraction as itself) and answers from its own seeded stream;
* a :class:`SystemSource` whose CSPRNG primitives are replaced by a seeded, logging
  stream (the hooks the class keeps for tests) consumes the same primitive draws
  (``randbelow(n)``, ``randbits(53)``) and computes the same Bernoulli thresholds
  ``floor(p 2^53)``: the secure source rounds the probabilities identically.

Every example is deterministic (``derandomize=True``, fixed seeds).
"""

from __future__ import annotations

import dataclasses
import math
import random
import sys
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import parties
from shuffledp.client.client import Client
from shuffledp.client.ledger import PrivacyLedger
from shuffledp.client.mean_randomizer import randomize_mean, randomize_mean_one, to_grid, to_grid_one
from shuffledp.client.mechanisms import randomize_one, randomize_reports, randomize_round
from shuffledp.client.range_randomizer import bin_index, bin_index_one, randomize_range, randomize_range_one
from shuffledp.protocol.errors import InvalidParameter
from shuffledp.protocol.mechanisms.randomness import SeededSource, SystemSource
from shuffledp.protocol.wire import codec
from shuffledp.protocol.wire.messages import (
    MAX_EPSILON,
    MIN_EPSILON,
    Envelope,
    HadamardRangeParams,
    ProjectedMeanParams,
    Report,
    VectorRangeParams,
)
from shuffledp.protocol.wire.onion import EnvelopeOpener
from shuffledp.protocol.wire.sealing import Sealer, open_sealed

SETTINGS = settings(
    max_examples=200,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
#: The secure source's exact samplers run in Python (rational arithmetic): fewer examples.
SECURE_SETTINGS = SETTINGS

# --------------------------------------------------------------------------
# strategies
# --------------------------------------------------------------------------

EPSILONS = st.one_of(
    st.sampled_from([MIN_EPSILON, 0.01, 0.1, 0.5, 1.0, 2.0, 5.0, MAX_EPSILON]),
    st.floats(0.05, 10.0),
)
GAUSSIAN_DELTAS = st.one_of(st.sampled_from([1e-12, 1e-9, 1e-6, 1e-3, 0.05]), st.floats(1e-10, 0.1))
COUNTS = st.one_of(st.sampled_from([1, 2, 3, 7, 8, 64, 1000, 4095, 4096]), st.integers(1, 4096))
LOWS = st.one_of(
    st.sampled_from([0.0, -0.0, -1.0, -4.0, -0.7, 1e6, -1e9, 0, -3, 2**53 + 1]),
    st.floats(-1e12, 1e12),
    st.integers(-10**6, 10**6),
)
WIDTHS = st.one_of(st.sampled_from([1.0, 8.0, 40.0, 4.8, 0.1, 1e6]), st.floats(1e-3, 1e9), st.integers(1, 10**6))
#: How a width is split: exactly, a hair more or less than the count, or oddly.
SPLITS = st.sampled_from([1.0, 1.0 - 2**-40, 1.0 + 2**-40, 0.999, 1.0000001, 0.75, 1.0 / 3.0, 2.5])
ANYWHERE = st.floats(allow_nan=False, allow_infinity=False)  # huge, subnormal, +-0.0 included
SPECIAL = st.sampled_from(
    [0.0, -0.0, 5e-324, -5e-324, 1e-300, -1e-300, 1e308, -1e308, sys.float_info.max, -sys.float_info.max, 1.7, float(2**53)]
)


def local_means(low: float, high: float, step: float, count: int):
    """Local means for an interval ``[low, high]`` cut into ``count`` pieces of ``step``: anywhere,
    special values, the exact edges ``low + i step`` and their neighbours, near and far outside."""
    low, high = float(low), float(high)
    width = high - low

    def edge(args):
        i, nudge = args
        x = low + step * i
        return {0: x, 1: math.nextafter(x, math.inf), -1: math.nextafter(x, -math.inf)}[nudge]

    edges = st.tuples(st.integers(0, count), st.sampled_from([0, 1, -1])).map(edge)
    bounds = st.sampled_from([low, high, math.nextafter(low, -math.inf), math.nextafter(high, math.inf),
                              math.nextafter(low, math.inf), math.nextafter(high, -math.inf)])
    near = st.floats(low - 2.0 * width, high + 2.0 * width, allow_nan=False, allow_infinity=False)
    return st.one_of(ANYWHERE, SPECIAL, edges, bounds, near)


@st.composite
def range_case(draw):
    """``(params, local mean, epsilon)`` for a Hadamard range round of 1 to 2^12 bins."""
    bins = draw(COUNTS)
    low = draw(LOWS)
    width = draw(WIDTHS)
    high = low + width
    tau = width / (2.0 * bins) * draw(SPLITS)
    try:
        params = HadamardRangeParams(low, high, tau)
    except InvalidParameter:
        draw(st.nothing())  # not a valid round: try another
    if params.num_bins > 4096:
        draw(st.nothing())
    y = draw(local_means(params.low, params.high, 2.0 * params.tau, params.num_bins))
    return params, y, draw(EPSILONS)


@st.composite
def mean_case(draw):
    """``(params, local mean, epsilon, delta)`` for a projected-mean round of 1 to 2^12 levels."""
    levels = draw(COUNTS)
    lower = draw(LOWS)
    upper = lower + draw(WIDTHS)
    noise = draw(st.sampled_from(["laplace", "gaussian"]))
    epsilon = draw(EPSILONS)
    delta = 0.0 if noise == "laplace" else draw(GAUSSIAN_DELTAS)
    try:
        params = ProjectedMeanParams(lower, upper, noise, levels)
        params.check_budget(epsilon, delta)  # as a round spec would
    except InvalidParameter:
        draw(st.nothing())
    y = draw(local_means(params.lower, params.upper, params.step, params.grid_levels))
    return params, y, epsilon, delta


def any_case():
    """``(params, epsilon0, delta0, local mean)`` of either scalar mechanism."""
    return st.one_of(
        range_case().map(lambda c: (c[0], c[2], 0.0, c[1])),
        mean_case().map(lambda c: (c[0], c[2], c[3], c[1])),
    )


# --------------------------------------------------------------------------
# sources
# --------------------------------------------------------------------------


def exact(value: object) -> tuple:
    """A value as something compared exactly: a float by its hex (-0.0 is not 0.0), a rational as itself."""
    if isinstance(value, (bool, np.bool_)):
        return ("bool", bool(value))
    if isinstance(value, (int, np.integer)):
        return ("int", int(value))
    if isinstance(value, (float, np.floating)):
        return ("float", float(value).hex())
    if isinstance(value, Fraction):
        return ("fraction", value)
    raise AssertionError(f"unexpected argument {value!r} ({type(value).__name__})")


class SpySource:
    """A RandomSource that records each call as ``(method, exact arguments)`` and answers from its
    own seeded stream: rows in ``[0, high)``, Bernoulli outcomes by a fair coin whatever the
    probability (so the rare branches, a round-up from the top of the grid, come up as often
    as the rest: a randomizer must map any draw alike on both paths), noise small or far past
    any clamp. A Bernoulli probability is recorded per user, so a float ``p`` and a 1-element
    array holding the same double are the same request (the sources' contract: "elementwise
    if p has shape (size,)")."""

    secure = False

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.calls: list[tuple] = []

    def integers(self, high, size):
        self.calls.append(("integers", exact(high), exact(size)))
        return np.array([self.rng.randrange(high) for _ in range(size)], dtype=np.int64)

    def bernoulli(self, p, size):
        ps = list(p) if isinstance(p, np.ndarray) and p.ndim == 1 else [p] * size
        self.calls.append(("bernoulli", tuple(exact(q) for q in ps), exact(size)))
        return np.array([self.rng.random() < 0.5 for _ in ps], dtype=bool)

    def _noise(self, size):
        return np.array(
            [self.rng.randint(-40, 40) if self.rng.random() < 0.7 else self.rng.randint(-(2**50), 2**50) for _ in range(size)],
            dtype=np.int64,
        )

    def discrete_laplace(self, scale, size):
        self.calls.append(("discrete_laplace", exact(scale), exact(size)))
        return self._noise(size)

    def discrete_gaussian(self, sigma2, size):
        self.calls.append(("discrete_gaussian", exact(sigma2), exact(size)))
        return self._noise(size)


def seeded_system_source(seed: int) -> tuple[SystemSource, list, random.Random]:
    """A SystemSource whose CSPRNG primitives come from ``random.Random(seed)`` and are logged,
    with its Bernoulli thresholds ``floor(p 2^53)`` logged too: ``(source, log, stream)``."""
    source = SystemSource()
    stream = random.Random(seed)
    log: list[tuple] = []

    def randbelow(n):
        log.append(("randbelow", n))
        return stream.randrange(n)

    def randbits(k):
        log.append(("randbits", k))
        return stream.getrandbits(k)

    def threshold(p):
        t = SystemSource._threshold(p)
        log.append(("threshold", t))
        return t

    source._randbelow, source._randbits, source._threshold = randbelow, randbits, threshold
    return source, log, stream


def outcome(run):
    """What ``run()`` returned, or the type and message of the error it raised."""
    try:
        return ("ok", run())
    except Exception as exc:  # noqa: BLE001 - any error must be the same on both paths
        return ("error", type(exc), str(exc))


def vector_messages(params, epsilon0, delta0, local_mean, source):
    """The batch-of-one randomizer's messages, as ``Client.begin_round`` turns them into int tuples."""
    values = randomize_round(params, epsilon0, delta0, np.array([local_mean]), source)[0]
    return [tuple(row) for row in np.asarray(values).reshape(len(values), -1).tolist()]


def assert_int_messages(messages):
    assert isinstance(messages, list)
    for message in messages:
        assert isinstance(message, tuple) and all(type(v) is int for v in message)


# --------------------------------------------------------------------------
# the arithmetic alone, bit for bit
# --------------------------------------------------------------------------


@SETTINGS
@given(range_case())
def test_bin_index_one_is_bin_index(case):
    params, y, _ = case
    assert bin_index_one(y, params) == int(bin_index(np.array([y]), params)[0])


@SETTINGS
@given(mean_case())
def test_to_grid_one_is_to_grid(case):
    params, y, _, _ = case
    floor, frac = to_grid(np.array([y]), params)
    floor_one, frac_one = to_grid_one(y, params)
    assert type(floor_one) is int and type(frac_one) is float
    assert floor_one == int(floor[0])
    assert frac_one.hex() == float(frac[0]).hex()  # the same double, the sign of a zero included


ZEROS = [0.0, -0.0, 0, 5e-324, -5e-324]


@pytest.mark.parametrize("low", ZEROS + [-1.0])
@pytest.mark.parametrize("y", ZEROS + [-1.0, 1.0, 2.0, -1e308, 1e308])
def test_signed_zeros_and_bounds_bit_for_bit(low, y):
    """Where ``np.clip`` keeps a bound-equal value, ``np.floor`` keeps -0.0, and ``y - low`` can be -0.0."""
    for params in (HadamardRangeParams(low, 2.0, 0.25), ProjectedMeanParams(low, 2.0, "laplace", 8)):
        if isinstance(params, HadamardRangeParams):
            assert bin_index_one(y, params) == int(bin_index(np.array([y]), params)[0])
        else:
            floor, frac = to_grid(np.array([y]), params)
            floor_one, frac_one = to_grid_one(y, params)
            assert (floor_one, frac_one.hex()) == (int(floor[0]), float(frac[0]).hex())
        a, b = SpySource(4), SpySource(4)
        assert randomize_one(params, 0.5, 0.0, float(y), a) == vector_messages(params, 0.5, 0.0, float(y), b)
        assert a.calls == b.calls


# --------------------------------------------------------------------------
# the same draws: seeded source, spy source, secure source
# --------------------------------------------------------------------------


def both_paths(case, scalar_source, vector_source) -> tuple:
    """The outcome of the scalar path on ``scalar_source`` and of the batch path on ``vector_source``."""
    params, epsilon0, delta0, y = case
    scalar = outcome(lambda: randomize_one(params, epsilon0, delta0, y, scalar_source))
    vector = outcome(lambda: vector_messages(params, epsilon0, delta0, y, vector_source))
    return scalar, vector


@SETTINGS
@given(any_case(), st.integers(0, 2**32 - 1))
def test_seeded_source_same_messages_same_state(case, seed):
    scalar_source, vector_source = SeededSource(seed), SeededSource(seed)
    scalar, vector = both_paths(case, scalar_source, vector_source)
    assert scalar == vector
    if scalar[0] == "ok":
        assert_int_messages(scalar[1])
    assert scalar_source.generator.bit_generator.state == vector_source.generator.bit_generator.state
    assert scalar_source.generator.random() == vector_source.generator.random()  # one more draw
    assert scalar_source.integers(1 << 40, 1)[0] == vector_source.integers(1 << 40, 1)[0]


@SETTINGS
@given(any_case(), st.integers(0, 2**32 - 1))
def test_spy_source_same_calls_same_arguments(case, seed):
    scalar_source, vector_source = SpySource(seed), SpySource(seed)
    scalar, vector = both_paths(case, scalar_source, vector_source)
    assert scalar == vector
    assert scalar_source.calls == vector_source.calls
    if scalar[0] == "ok":
        assert_int_messages(scalar[1])
        assert len(scalar_source.calls) == 2  # (integers, bernoulli) or (bernoulli, noise)
    assert scalar_source.rng.random() == vector_source.rng.random()


@SECURE_SETTINGS
@given(any_case(), st.integers(0, 2**32 - 1))
def test_secure_source_same_draws_same_rounding(case, seed):
    scalar_source, scalar_log, scalar_stream = seeded_system_source(seed)
    vector_source, vector_log, vector_stream = seeded_system_source(seed)
    scalar, vector = both_paths(case, scalar_source, vector_source)
    assert scalar == vector
    assert scalar_log == vector_log  # every primitive draw and every threshold floor(p 2^53), in order
    assert any(entry[0] == "threshold" for entry in scalar_log) or scalar[0] == "error"
    assert scalar_stream.getrandbits(64) == vector_stream.getrandbits(64)


@pytest.mark.parametrize("y", [1.3, -0.0, 0.0, 1e300, -1e300, 4.0, -4.0, 0.5, 3.999999999999999])
@pytest.mark.parametrize(
    "params, delta0",
    [
        (HadamardRangeParams(-4.0, 4.0, 0.5), 0.0),
        (HadamardRangeParams(0, 4096, 0.5), 0.0),
        (ProjectedMeanParams(-0.7, 4.1), 0.0),
        (ProjectedMeanParams(0.0, 1.0, "laplace", 1), 0.0),
        (ProjectedMeanParams(-4.0, 4.0, "gaussian", 64), 1e-6),
    ],
)
def test_real_system_source_gives_valid_messages(params, delta0, y):
    """The unseeded secure source through the scalar path: messages in the round's ranges."""
    from shuffledp.client.mechanisms import report_ranges

    spec = parties.make_spec(params, epsilon0=0.5, delta0=delta0)
    for _ in range(5):
        messages = randomize_one(params, 0.5, delta0, y, SystemSource())
        assert_int_messages(messages)
        assert len(messages) == 1
        assert all(value in allowed for value, allowed in zip(messages[0], report_ranges(spec)))


# --------------------------------------------------------------------------
# what has no scalar path, and refusals
# --------------------------------------------------------------------------


def test_no_scalar_path_returns_none():
    source = SpySource(0)
    rng = HadamardRangeParams(-4.0, 4.0, 0.5)
    for y in (1, True, np.float32(1.5), np.int64(2), [1.0], np.array([1.0]), np.array(1.0), "1.0", None):
        assert randomize_one(rng, 0.5, 0.0, y, source) is None
    vector = VectorRangeParams(-4.0, 4.0, 0.5, 4, 7)
    assert randomize_one(vector, 0.5, 0.0, 1.0, source) is None

    @dataclasses.dataclass(frozen=True)
    class Custom(HadamardRangeParams):
        pass

    assert randomize_one(Custom(-4.0, 4.0, 0.5), 0.5, 0.0, 1.0, source) is None
    assert source.calls == []
    # a numpy double is a float: it takes the scalar path, with the batch's result
    a, b = SeededSource(3), SeededSource(3)
    assert randomize_one(rng, 0.5, 0.0, np.float64(1.5), a) == vector_messages(rng, 0.5, 0.0, np.float64(1.5), b)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize(
    "params, delta0", [(HadamardRangeParams(-4.0, 4.0, 0.5), 0.0), (ProjectedMeanParams(-0.7, 4.1, "gaussian", 64), 1e-6)]
)
def test_non_finite_mean_refused_as_the_batch_refuses_it(params, delta0, bad):
    scalar_source, vector_source = SpySource(1), SpySource(1)
    scalar = outcome(lambda: randomize_one(params, 0.5, delta0, bad, scalar_source))
    vector = outcome(lambda: vector_messages(params, 0.5, delta0, bad, vector_source))
    assert scalar == vector and scalar[0] == "error" and scalar[1] is InvalidParameter
    assert scalar_source.calls == vector_source.calls == []


@pytest.mark.parametrize("y", [3, -7, np.int64(2), np.float32(0.25), True, "x", [1.0, 2.0], math.nan, None])
def test_scalar_twins_take_what_the_batch_takes(y):
    """The ``*_one`` functions on their own: anything a batch of one holds gives the batch's answer
    (ints, numpy scalars), anything it refuses is refused with the same error."""
    rng = HadamardRangeParams(-4.0, 4.0, 0.5)
    mean = ProjectedMeanParams(-4.0, 4.0, "laplace", 16)
    cases = [
        (lambda s: randomize_range_one(y, rng, 0.5, s), lambda s: randomize_range(np.array([y]), rng, 0.5, s)),
        (lambda s: randomize_mean_one(y, mean, 0.5, s), lambda s: randomize_mean(np.array([y]), mean, 0.5, s)),
    ]
    for one, batch in cases:
        a, b = SpySource(5), SpySource(5)
        got = outcome(lambda: one(a))
        want = outcome(lambda: batch(b))
        if want[0] == "ok":
            result = want[1]
            want = ("ok", (int(result[0][0]), int(result[1][0])) if isinstance(result, tuple) else int(result[0]))
        assert got == want
        assert a.calls == b.calls


# --------------------------------------------------------------------------
# the device client: same envelopes' contents through both paths
# --------------------------------------------------------------------------

DEPLOYMENT = parties.DEPLOYMENT
ANALYZER = DEPLOYMENT.analyzer()
NOW = 1_000_000.0


def open_envelope(data: bytes, spec) -> Report:
    envelope = codec.decode(data, Envelope)
    assert envelope.session_id == spec.session_id and envelope.round_id == spec.round_id
    sealed = EnvelopeOpener(DEPLOYMENT.shuffler_keys.hpke_private, spec).open(data).sealed
    opened = open_sealed(ANALYZER.keys.hpke_private, sealed, spec.session_id, spec.round_id, spec.digest)
    return codec.decode_padded(opened, Report)


def make_client(samples, source) -> Client:
    return Client(
        np.array(samples), ANALYZER.keys.signing_public, PrivacyLedger(100.0, 0.5),
        credential=DEPLOYMENT.enroll(), source=source, clock=lambda: NOW,
    )


CLIENT_ROUNDS = [
    (HadamardRangeParams(-4.0, 4.0, 0.5), 0.5, 0.0),
    (HadamardRangeParams(-20.0, 20.0, 0.8), 2.0, 0.0),
    (HadamardRangeParams(0.0, 4096.0, 0.5), 1.0, 0.0),
    (ProjectedMeanParams(-0.7, 4.1), 0.5, 0.0),
    (ProjectedMeanParams(0.0, 2.0, "laplace", 64), 3.0, 0.0),
    (ProjectedMeanParams(-4.0, 4.0, "gaussian", 256), 1.0, 1e-6),
]
CLIENT_SAMPLES = [(1.2, 1.4), (-1e300,), (1e300,), (-0.0,), (0.0, 0.0), (-4.0,), (4.0,), (1.7,), (0.3, 0.9, 2.6)]


@pytest.mark.parametrize("secure", [False, True], ids=["seeded", "system"])
@pytest.mark.parametrize("params, epsilon0, delta0", CLIENT_ROUNDS)
def test_answer_verified_same_reports_through_both_paths(params, epsilon0, delta0, secure):
    spec = parties.make_spec(params, round_id=11, epsilon0=epsilon0, delta0=delta0, min_batch=1, deadline=NOW + 60)
    sealer = Sealer(spec.analyzer_key)
    for seed, samples in enumerate(CLIENT_SAMPLES):
        if secure:
            (fast_source, fast_log, _), (slow_source, slow_log, _) = seeded_system_source(seed), seeded_system_source(seed)
        else:
            fast_source, slow_source = SeededSource(seed), SeededSource(seed)
        fast, slow = make_client(samples, fast_source), make_client(samples, slow_source)
        assert type(fast.local_mean) is float
        # the default path (scalar), and the batch randomizer forced by passing its values
        fast_out = fast.answer_verified(spec, sealer)
        values = randomize_reports(spec, np.array([slow.local_mean]), slow.source)[0]
        slow_out = slow.answer_verified(spec, sealer, values)
        assert len(fast_out) == len(slow_out) == 1
        assert fast_out != slow_out  # fresh encapsulations and nonces: the ciphertexts differ
        fast_report, slow_report = open_envelope(fast_out[0], spec), open_envelope(slow_out[0], spec)
        assert fast_report == slow_report
        assert fast.ledger.spent_epsilon == slow.ledger.spent_epsilon == epsilon0
        if secure:
            assert fast_log == slow_log
        else:
            assert fast_source.generator.random() == slow_source.generator.random()


def test_begin_round_refuses_a_non_finite_mean_as_before():
    """A local mean made non-finite after construction: the same typed refusal as the batch path,
    and nothing drawn or charged."""
    params = HadamardRangeParams(-4.0, 4.0, 0.5)
    spec = parties.make_spec(params, round_id=12, min_batch=1, deadline=NOW + 60)
    spy = SpySource(0)
    client = make_client((1.0,), spy)
    client.local_mean = math.nan
    with pytest.raises(InvalidParameter) as fast:
        client.begin_round(spec)
    with pytest.raises(InvalidParameter) as batch:
        randomize_reports(spec, np.array([math.nan]), SpySource(0))
    assert str(fast.value) == str(batch.value)
    assert spy.calls == [] and client.ledger.spent_epsilon == 0.0


def test_begin_round_many_clients_scalar_path():
    """Clients made in bulk (``Client.many``) hold Python floats and take the scalar path."""
    params = ProjectedMeanParams(-0.7, 4.1)
    spec = parties.make_spec(params, round_id=13, min_batch=1, deadline=NOW + 60)
    values = np.random.default_rng(2).normal(1.7, 3.0, 50)
    fast_source, slow_source = SeededSource(8), SeededSource(8)
    clients = Client.many(
        values, ANALYZER.keys.signing_public, [PrivacyLedger(10.0) for _ in values],
        [DEPLOYMENT.enroll() for _ in values], source=fast_source, clock=lambda: NOW,
    )
    got = [c.begin_round(spec) for c in clients]
    want = [vector_messages(params, spec.epsilon0, spec.delta0, c.local_mean, slow_source) for c in clients]
    assert got == want
    assert fast_source.generator.random() == slow_source.generator.random()


def test_begin_round_takes_pre_drawn_messages_as_int_tuples_or_as_an_array():
    """A batch caller may hand a user's drawn messages as tuples of Python ints (the simulated fleet
    converts a round's array once): the same messages as from the array; anything else goes the
    array's way, with its checks."""
    params = HadamardRangeParams(-20.0, 20.0, 0.8)
    spec = parties.make_spec(params, round_id=14, min_batch=1, deadline=NOW + 60)
    drawn = randomize_round(params, spec.epsilon0, spec.delta0, np.array([1.5, -3.0, 7.25]), SeededSource(3))
    for user, as_tuples in zip(drawn, [[tuple(m) for m in user] for user in drawn.tolist()]):
        client = DEPLOYMENT.client(np.array([0.0]), PrivacyLedger(10.0), clock=lambda: NOW)
        assert client.begin_round(spec, as_tuples) == client.begin_round(spec, user) == [tuple(int(v) for v in user[0])]
    client = DEPLOYMENT.client(np.array([0.0]), PrivacyLedger(10.0), clock=lambda: NOW)
    assert client.begin_round(spec, [(3.0, 1)]) == [(3, 1)]  # not ints: read as an array, as before
    with pytest.raises(InvalidParameter):
        client.begin_round(spec, [(3, 1), (4, -1)])  # two messages in a one-message round
